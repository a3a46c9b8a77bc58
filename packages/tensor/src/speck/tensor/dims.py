"""Dimension helpers shared by the Tensor modules."""

from __future__ import annotations

import numbers
import operator
from typing import Any, NoReturn

from speck.tensor.base import TensorBase
from speck.tensor.errors import TensorOverflowError, TensorTypeError, TensorValueError
from speck.uop import Ops, UOp
from speck.uop.errors import UOpTypeError
from speck.uop.uop import ssimplify, validate_shape


def argfix(*x: Any) -> tuple[Any, ...]:
    """Accept f(1, 2), f((1, 2)) and f([1, 2]) alike -> (1, 2)."""
    if x and isinstance(x[0], (tuple, list)):
        if len(x) != 1:
            raise TensorValueError(f"bad arguments {x}: pass either one sequence or separate values")
        return tuple(x[0])
    return tuple(x)


def as_int(x: Any) -> int:
    """A dim as a Python int; a clear error for a symbolic dim where the operation needs a concrete size."""
    if isinstance(x, UOp):
        raise TensorValueError(
            f"this operation needs a concrete size, got the symbolic dim {x.render()}; bind it first"
        )
    return int(x)


INT64_MAX = 2**63 - 1


def countable(sh: tuple[Any, ...]) -> tuple[Any, ...]:
    """sh, if no dim is negative (else a TensorValueError) and its element count fits int64 (kernels count elements
    in int64: a larger count wraps, and a sum over 2**80 ones came out 0.0; else a TensorOverflowError). Symbolic
    dims are bounded where they are bound."""
    n = 1
    for d in sh:
        if isinstance(d, int):
            if d < 0:  # (empty(-2, -3) made a 6-element tensor of shape (-2, -3))
                raise TensorValueError(f"shape {sh} has a negative dimension; sizes are >= 0")
            n *= d
        elif isinstance(v := bound_value(d), int) and v < 0:  # (ones(Variable('q', -3, 4).bind(-2)) summed to 0)
            raise TensorValueError(f"shape {show_shape(sh)} has a negative dimension (a Variable bound to make it "
                                   f"{v}); sizes are >= 0: bind the Variable to a value that makes it one")  # fmt: skip
    if n > INT64_MAX and all(isinstance(d, int) for d in sh):
        raise TensorOverflowError(f"shape {sh} has {n} elements, more than int64 can count ({INT64_MAX}); no tensor "
                                  "can be that large: check the sizes")  # fmt: skip
    return sh


def whole(fn: str, what: str, v: Any) -> int:
    """v as an int argument (Python or numpy int; a bool, float - even 3.0 - or string is a TensorTypeError: 2.5
    rows is no number of rows, and rounding it would be a silent guess)."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise TensorTypeError(f"{fn}: {what} must be an int, got {v!r} ({type(v).__name__}); pass a whole number")
    try:
        return operator.index(v)
    except TypeError:  # (a numpy array of several ints has __index__ and refuses it: numpy's own message)
        raise TensorTypeError(f"{fn}: {what} must be an int, got {type(v).__name__} {v!r:.40}") from None


def flag(fn: str, what: str, v: Any) -> bool:
    """v as a yes/no argument: a bool, a Python or numpy int or bool, or None (no). Anything else is a TensorTypeError:
    a numpy array of several values failed deep inside with numpy's "truth value ... is ambiguous", and a str
    ("False") or a list would silently count as yes."""
    if v is True or v is False:
        return v
    if v is None or isinstance(v, numbers.Integral) or (getattr(v, "shape", None) == () and hasattr(v, "dtype")
                                                        and v.dtype.kind in "biu"):  # fmt: skip
        return bool(v)
    raise TensorTypeError(f"{fn}: {what} must be a bool, got {type(v).__name__} {v!r:.40}; pass True or False")


def shape_arg(fn: str, shape: Any) -> tuple[Any, ...]:
    """shape (a sequence) with each dim an int or an integer UOp, as validate_shape makes it; a dim of another kind
    (None, a str, a float, a list, an array) is a TensorTypeError naming fn (validate_shape's own error is the uop
    package's)."""
    try:
        return validate_shape(shape)
    except UOpTypeError:
        bad_shape(fn, shape)


def bad_shape(fn: str, shape: Any) -> NoReturn:
    """Raise the TensorTypeError for the first dim of shape that validate_shape refused (callers on a hot path
    catch its UOpTypeError themselves and call this, so a good shape costs nothing more)."""
    for d in shape:
        try:
            validate_shape((d,))
        except UOpTypeError:
            got = repr(d).replace("\n", "")[:40]
            raise TensorTypeError(f"{fn}: shape must be int, got {type(d).__name__} {got} in {_short(shape)}; pass a "
                                  "whole number for every dim, e.g. (2, 3)") from None  # fmt: skip
    raise TensorTypeError(f"{fn}: the shape must be a sequence of ints, got {_short(shape)}")


def _short(shape: Any) -> str:
    r = repr(tuple(shape)).replace("\n", "")
    return r if len(r) <= 60 else r[:57] + "..."


def tensor_args(fn: str, what: str, items: Any, tensor_type: type | None = None) -> None:
    """Each of items is a tensor_type (default: any Tensor, seen as TensorBase, below tensor.py): a Python number,
    tuple or dtype where a Tensor belongs failed deep inside as an AttributeError ("'int' object has no attribute
    'ndim'")."""
    for i, t in enumerate(items):
        if not isinstance(t, tensor_type or TensorBase):
            raise TensorTypeError(f"{fn}: {what} {i} must be a Tensor, got {type(t).__name__} {t!r:.40}; wrap data "
                                  "with Tensor(...)")  # fmt: skip


def real(fn: str, what: str, v: Any) -> Any:
    """v, if it is a real number (int, float, numpy scalar); a TensorTypeError otherwise (None, a str, a dtype or an
    array failed deep inside on a comparison or an operator)."""
    if not isinstance(v, numbers.Real):
        raise TensorTypeError(f"{fn}: {what} must be a real number, got {type(v).__name__} {v!r:.40}; pass an int "
                              "or a float")  # fmt: skip
    return v


def init_shape(fn: str, shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """The shape an initializer got (f(2, 3) or f((2, 3))), each dim an int or a symbolic size, none negative."""
    return countable(tuple(whole_or_symbolic(fn, "a dim", d) for d in argfix(*shape)))


def whole_or_symbolic(fn: str, what: str, v: Any) -> int | UOp:
    """v as an int (see whole), or a symbolic size (a UOp) kept as it is."""
    return v if type(v) is int or isinstance(v, UOp) else whole(fn, what, v)


def raw_bytes(data: Any) -> bool:
    """data is bytes for Tensor(data) to reinterpret (bytes, bytearray, a flat memoryview of unsigned bytes or
    chars). A memoryview of another format or of several dims holds values of that format and shape, as numpy reads
    it (a float32 one of shape (2, 2) was read as 16 uint8 bytes)."""
    if isinstance(data, (bytes, bytearray)):
        return True
    return isinstance(data, memoryview) and data.format.lstrip("@=<>!") in ("B", "c") and data.ndim < 2


def bound_value(x: Any) -> Any:
    """x with every bound Variable at its bound value (an int when that decides it)."""
    if not isinstance(x, UOp):
        return x
    binds = {b: b.src[1] for b in x.toposort() if b.op is Ops.BIND}
    return ssimplify(x.substitute(binds)) if binds else x


def show_dim(d: Any) -> str:
    """A dim for a message: a symbolic one as its expression with the bound values (`n [n=3]`), not its graph."""
    if not isinstance(d, UOp):
        return repr(d)
    nodes = d.toposort()
    binds = sorted({(b.src[0].arg[0], b.src[1].arg) for b in nodes if b.op is Ops.BIND})
    plain = d.substitute({b: b.src[0] for b in nodes if b.op is Ops.BIND})
    return plain.render() + (f" [{', '.join(f'{n}={v}' for n, v in binds)}]" if binds else "")


def show_shape(sh: tuple[Any, ...]) -> str:
    """A shape for a message (see show_dim)."""
    return f"({', '.join(show_dim(d) for d in sh)}{',' if len(sh) == 1 else ''})"
