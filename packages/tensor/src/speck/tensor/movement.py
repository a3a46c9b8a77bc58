# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Movement Tensor methods: the six primitive views (reshape, permute, expand, pad, shrink, flip) with argument
checking, and everything composed from them (transpose, squeeze, cat, roll, repeat, pad modes...)."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speck.tensor.device import two_devices_error
from speck.tensor.dims import (
    INT64_MAX,
    argfix,
    as_int,
    bad_shape,
    countable,
    real,
    show_dim,
    show_shape,
    tensor_args,
    whole,
    whole_or_symbolic,
)
from speck.tensor.dims import bound_value as _bound_value
from speck.tensor.errors import (
    TensorAssertionError,
    TensorIndexError,
    TensorNotImplementedError,
    TensorTypeError,
    TensorValueError,
    TensorZeroDivisionError,
)
from speck.uop import Ops, UOp, dtypes, least_upper_dtype, sint, validate_shape
from speck.uop.errors import UOpTypeError
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


def resolve_dim(shape: tuple[sint, ...], dim: int, extra: int = 0) -> int:
    """dim (negative: from the end) as an index into shape plus `extra` new dims; IndexError when out of range."""
    n = len(shape) + extra
    if type(dim) is not int:
        if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
            raise TensorIndexError(f"dim must be an int, got {dim!r} ({type(dim).__name__})")
        try:
            dim = dim.__index__()  # (a numpy int is an int here, as in numpy)
        except TypeError:  # (a numpy array of several values: numpy's own TypeError)
            raise TensorIndexError(f"dim must be an int, got {type(dim).__name__} {dim!r:.40}") from None
    if not -max(n, 1) <= dim < max(n, 1):
        raise TensorIndexError(f"dim {dim} is out of range for a tensor with {len(shape)} dims (shape "
                               f"{shape}); expected a value in [{-max(n, 1)}, {max(n, 1) - 1}]")  # fmt: skip
    return dim + n if dim < 0 else dim


def _sym_quotient(dims: tuple[Any, ...], others: list[Any]) -> Any:
    """prod(dims) / prod(others) as a symbolic size when it divides for every value of the Variables, else None:
    identical symbolic factors cancel ((i, 6) -> (i, -1) is 6), the rest is divided on the unbound Variables (a
    bound one would simplify to its current value) and bound again after ((i, 6) -> (-1, 3) is i*2)."""
    num, den = list(dims), []
    for d in others:
        if isinstance(d, UOp) and any(d is n for n in num):
            num.pop(next(k for k, n in enumerate(num) if n is d))
        else:
            den.append(d)
    numel, rest = prod(num), prod(den)
    binds = {n: n.src[0] for x in (numel, rest) if isinstance(x, UOp) for n in x.toposort() if n.op is Ops.BIND}

    def free(x: Any) -> Any:
        return x.substitute(binds).simplify() if isinstance(x, UOp) else x

    q = free(numel) // free(rest)
    q = q.simplify() if isinstance(q, UOp) else q
    back = q * free(rest)
    if (back.simplify() if isinstance(back, UOp) else back) is not free(numel):
        return None
    return q.substitute({v: b for b, v in binds.items()}) if isinstance(q, UOp) else q


# ---------------- primitives: functions over UOps (u itself when there is nothing to do) ----------------
def reshape(u: UOp, new: tuple[Any, ...]) -> UOp:
    """View with a new shape of the same size; one dim may be -1 (inferred), None keeps that dim."""
    shape = u.shape
    try:
        new = validate_shape(tuple(shape[i] if s is None else s for i, s in enumerate(new)))
    except UOpTypeError:
        bad_shape("reshape", new)
    if sum(1 for s in new if isinstance(s, int) and s == -1) > 1:
        raise TensorValueError(f"reshape to {new}: only one dimension can be -1")
    if any(isinstance(s, int) and s < -1 for s in new):
        raise TensorValueError(f"reshape to {new}: dimensions must be >= 0 (or one -1)")
    numel = prod(shape)
    if any(isinstance(s, int) and s == -1 for s in new):
        rest = prod(s for s in new if not (isinstance(s, int) and s == -1))
        if isinstance(rest, int) and isinstance(numel, int):
            if rest == 0:
                raise TensorZeroDivisionError(f"reshape {shape} to {new}: -1 can't be inferred next to a 0 dim")
            if numel % rest != 0:
                raise TensorValueError(f"can't reshape shape {shape} ({numel} elements) to {new}")
            new = tuple(numel // rest if (isinstance(s, int) and s == -1) else s for s in new)
        else:  # symbolic: the quotient, when it divides exactly ((6*i).reshape(-1, 3) is 2*i, (i, 6) -> (i, -1) is 6)
            inferred = _sym_quotient(shape, [s for s in new if not (isinstance(s, int) and s == -1)])
            if inferred is None:
                raise TensorValueError(f"reshape {show_shape(shape)} to {show_shape(new)}: -1 can't be inferred, "
                                       f"{show_dim(rest)} doesn't divide the symbolic size {show_dim(numel)}; give "
                                       "every dim explicitly")  # fmt: skip
            new = tuple(inferred if (isinstance(s, int) and s == -1) else s for s in new)
    nn = prod(new)
    if isinstance(nn, int) and isinstance(numel, int) and nn != numel:
        raise TensorValueError(f"can't reshape shape {shape} ({numel} elements) to {new} ({nn} elements)")
    if isinstance(nn, int) != isinstance(numel, int) and (bound := _bound_value(nn)) != _bound_value(numel):
        # (a fixed size reshaped to a symbolic one must hold as many elements at the values bound now)
        raise TensorValueError(f"can't reshape shape {show_shape(shape)} ({show_dim(numel)} elements) to "
                               f"{show_shape(new)} ({show_dim(bound)} elements at the values its Variables are bound "
                               "to)")  # fmt: skip
    return u if new == shape else u.reshape(new)


def permute(u: UOp, order: tuple[Any, ...]) -> UOp:
    shape = u.shape
    o = tuple(resolve_dim(shape, d) for d in order)
    if sorted(o) != list(range(len(shape))):
        raise TensorValueError(f"permute order {o} is not a permutation of the {len(shape)} dims of shape {shape}")
    return u if o == tuple(range(len(shape))) else u.permute(o)


def expand(u: UOp, new: tuple[Any, ...]) -> UOp:
    """Broadcast size-1 dims to `new` (new leading dims allowed; -1 keeps a dim)."""
    shape = u.shape
    if len(new) < len(shape):
        raise TensorValueError(f"expand {shape} to {new}: the target has fewer dims")
    t = reshape(u, (1,) * (len(new) - len(shape)) + shape) if len(new) > len(shape) else u
    tgt = tuple(s if (n is None or isinstance(n, int) and n == -1) else n for s, n in zip(t.shape, new))
    try:
        tgt = validate_shape(tgt)
    except UOpTypeError:
        bad_shape("expand", new)
    count = 1
    for n in tgt:
        if type(n) is int:
            if n < 0:  # (-2 failed late, in the renderer)
                raise TensorValueError(f"expand {shape} to {new}: sizes must be >= 0 (or -1 to keep a dim)")
            count *= n
    if count > INT64_MAX:  # (ones(1).expand(2**40, 2**40).sum() wrapped its int64 element count and came out 0.0)
        countable(tgt)
    for s, n in zip(t.shape, tgt):
        if not (isinstance(s, int) and s == 1) and s is not n and s != n:
            raise TensorValueError(f"can't expand shape {shape} to {new}: dim {s} is not 1 and differs from {n}")
    return t if tgt == t.shape else t.expand(tgt)


def pad(u: UOp, pads: tuple[tuple[sint, sint], ...]) -> UOp:
    """Zero padding by non-negative ((before, after), ...) per dim."""
    return u if all(isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0 for b, a in pads) else u.pad(pads)


def shrink(u: UOp, arg: Any) -> UOp:
    """Keep [begin, end) of each dim (None keeps the whole dim)."""
    shape = u.shape
    if not isinstance(arg, (tuple, list)):  # ("object of type 'NoneType' has no len()")
        raise TensorTypeError(f"shrink takes a (begin, end) pair or None per dim, got {type(arg).__name__} "
                              f"{arg!r:.40}; pass e.g. ((0, 2), None) for shape {shape}")  # fmt: skip
    if len(arg) != len(shape):
        raise TensorValueError(f"shrink needs {len(shape)} (begin, end) pairs for shape {shape}, got {arg}")
    a = tuple((0, s) if x is None else x if type(x) is tuple and len(x) == 2 and type(x[0]) is int and type(x[1]) is int
              else _shrink_pair(x, arg) for x, s in zip(arg, shape))  # fmt: skip
    for (b, e), s in zip(a, shape):
        if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
            raise TensorValueError(f"shrink {arg} out of bounds for shape {shape}")
        if isinstance(b, int) and isinstance(e, int):
            continue
        # (bound Variables at their values: small[:n.bind(6)] of 4 elements read past the end without a word)
        bb, ee, ss = (_bound_value(x) for x in (b, e, s))
        pairs = ", ".join(f"({show_dim(x)}, {show_dim(y)})" for x, y in a)
        if isinstance(bb, int) and isinstance(ee, int) and isinstance(ss, int) and not 0 <= bb <= ee <= ss:
            raise TensorValueError(f"shrink ({pairs}) out of bounds for shape {show_shape(shape)}: at the bound "
                                   f"Variables' values it keeps [{bb}, {ee}) of a dim of {ss} (a slice by a Variable "
                                   "can't be clamped to the dim as numpy clamps); bind them to values inside the "
                                   "dim")  # fmt: skip
        if (bounds := getattr(capture_bounds, "items", None)) is not None:
            # a TinyJit replay binds new values without building this graph again (so without the check above): a
            # value past the dim read past the buffer (x[:n] of 4 floats, n in [1, 4096]: 9.8e33 at n=4096). The
            # capture keeps the bounds, Variables unbound, and checks them at each replay's values
            bounds.append((*(_unbind(x) for x in (b, e, s)), f"shrink ({pairs}) of shape {show_shape(shape)}"))
    if all((isinstance(b, int) and b == 0) and (e is s) or (b == 0 and isinstance(e, int) and e == s)
           for (b, e), s in zip(a, shape)):  # fmt: skip
        return u
    return u.shrink(a)


def _unbind(x: sint) -> sint:
    """x with its bound Variables as the free Variables (evaluated later at other values)."""
    return x.substitute({n: n.src[0] for n in x.toposort() if n.op is Ops.BIND}) if isinstance(x, UOp) else x


# the symbolic shrink bounds built while this thread captures a TinyJit: (begin, end, dim, what); None when it
# captures nothing (jit.py sets and takes the list)
capture_bounds = threading.local()


def flip(u: UOp, axis: tuple[Any, ...]) -> UOp:
    shape = u.shape
    ax = [resolve_dim(shape, d) for d in axis]
    axes = set(ax)
    if len(axes) != len(ax):
        raise TensorValueError(f"flip axes {ax} repeat a dim; name each dim at most once")
    return u.flip(tuple(i in axes for i in range(len(shape)))) if axes else u


class MovementMixin:
    """The movement methods of Tensor: the primitives (reshape, permute, expand, shrink, flip: the functions above,
    through tensor.py's one wrapper `_move`) and what is composed from them."""

    __slots__ = ()

    # ---------------- the primitives, wrapped (Tensor._move: a view of self, or self) ----------------
    def _resolve_dim(self: Tensor, dim: int, extra: int = 0) -> int:
        return resolve_dim(self.shape, dim, extra)

    def reshape(self: Tensor, shape: Any, *args: Any) -> Tensor:
        """View with a new shape of the same size; one dim may be -1 (inferred), None keeps that dim."""
        return self._move(reshape, argfix(shape, *args))

    def view(self: Tensor, shape: Any, *args: Any) -> Tensor:
        return self._move(reshape, argfix(shape, *args))

    def permute(self: Tensor, order: Any, *args: Any) -> Tensor:
        return self._move(permute, argfix(order, *args))

    def expand(self: Tensor, shape: Any, *args: Any) -> Tensor:
        """Broadcast size-1 dims to `shape` (new leading dims allowed; -1 keeps a dim)."""
        return self._move(expand, argfix(shape, *args))

    def shrink(self: Tensor, arg: Any) -> Tensor:
        """Keep [begin, end) of each dim (None keeps the whole dim)."""
        return self._move(shrink, arg)

    def _slice_dim(self: Tensor, d: int, start: sint, stop: sint) -> Tensor:
        return self._move(shrink, tuple((start, stop) if i == d else None for i in range(self.ndim)))

    def flip(self: Tensor, axis: Any, *args: Any) -> Tensor:
        return self._move(flip, argfix(axis, *args))

    def pad2d(self: Tensor, padding: Any, value: float = 0.0) -> Tensor:
        """Older tinygrad's name for a constant pad with a flat torch-style list (last dim first): `pad(padding)`."""
        if isinstance(padding, (list, tuple)) and any(isinstance(p, (list, tuple)) or p is None for p in padding):
            raise TensorValueError(f"pad2d takes a flat list of ints (left, right, top, bottom, ...), got {padding!r}; "
                                   "use pad() for per-dim (before, after) pairs")  # fmt: skip
        return self.pad(padding, value=value)

    def pad(self: Tensor, padding: Any, mode: str = "constant", value: float = 0.0) -> Tensor:
        """Pad with ((before, after), ...) per dim, or a flat torch-style list (last dim first). Negative pads
        crop. Modes: constant (with value), reflect, replicate, circular."""
        pads = _normalize_pads(padding, self.ndim)
        if type(mode) is not str or mode not in ("constant", "reflect", "replicate", "circular"):
            raise TensorNotImplementedError(f"pad mode must be constant, reflect, replicate or circular, got {mode!r}")
        # negative pads crop first (a symbolic pad is a size, never negative)
        if any(isinstance(b, int) and b < 0 or isinstance(a, int) and a < 0 for b, a in pads):
            for d, ((b, a), s) in enumerate(zip(pads, self.shape)):  # (else "shrink ((10, 4),) out of bounds")
                if isinstance(s, int) and -min(b, 0) - min(a, 0) > s:
                    raise TensorValueError(f"pad {padding}: the negative amounts crop {-min(b, 0) - min(a, 0)} "
                                           f"from dim {d} of size {s}; crop at most the dim's size")  # fmt: skip
            t = self.shrink(tuple((-min(b, 0), s - (-min(a, 0))) for (b, a), s in zip(pads, self.shape)))
            return t.pad(tuple((max(b, 0), max(a, 0)) for b, a in pads), mode, value)
        if all(isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0 for b, a in pads):
            return self
        if mode != "constant" and not all(isinstance(x, int) for p in pads for x in p):
            raise TensorNotImplementedError(f"{mode} pad needs int amounts, got the symbolic pads {pads}")
        countable(tuple(s + b + a for s, (b, a) in zip(self.shape, pads)))  # (as expand: past int64 counts wrap)
        if mode == "constant":
            if not isinstance(value, numbers.Real) and getattr(value, "shape", None) != ():  # (numpy scalars pass)
                real("pad", "value", value)  # (an array failed on `value != 0`: numpy's "truth value ... is ambiguous")
            out = self._new(pad(self.uop, pads))
            if value != 0:
                mask = type(self).ones(self.shape, dtype="bool", device=self.device).pad(pads)
                out = mask.where(out, value)
            return out
        t = self
        for d, (b, a) in enumerate(pads):
            if b == 0 and a == 0:
                continue
            s = t.shape[d]
            if mode == "reflect" and (b >= s or a >= s):
                raise TensorValueError(f"reflect pad ({b}, {a}) must be smaller than dim {d} of size {s}")
            if mode == "circular" and (b > s or a > s):
                raise TensorValueError(f"circular pad ({b}, {a}) can't exceed dim {d} of size {s}")
            parts = []
            if b:
                if mode == "reflect":
                    parts.append(t._slice_dim(d, 1, b + 1).flip(d))
                elif mode == "replicate":
                    parts.append(t._slice_dim(d, 0, 1).expand(*[b if i == d else -1 for i in range(t.ndim)]))
                else:
                    parts.append(t._slice_dim(d, s - b, s))
            parts.append(t)
            if a:
                if mode == "reflect":
                    parts.append(t._slice_dim(d, s - a - 1, s - 1).flip(d))
                elif mode == "replicate":
                    parts.append(t._slice_dim(d, s - 1, s).expand(*[a if i == d else -1 for i in range(t.ndim)]))
                else:
                    parts.append(t._slice_dim(d, 0, a))
            t = parts[0].cat(*parts[1:], dim=d)
        return t

    # ---------------- composed ----------------
    def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._resolve_dim(dim0), self._resolve_dim(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self: Tensor) -> Tensor:
        """transpose(): swaps dims 0 and 1 only (a (2, 3, 4) tensor becomes (3, 2, 4), unlike numpy's .T)."""
        return self.transpose()

    def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if not (isinstance(s, int) and s == 1)))
        if self.ndim == 0:
            return self
        if not isinstance(dim, int):  # several dims: each size-1 one among them goes
            if not isinstance(dim, (tuple, list)):  # ("'float' object is not iterable"): resolve_dim names it
                bad: Any = dim
                return self.squeeze(self._resolve_dim(bad))
            ds = {self._resolve_dim(d) for d in dim}
            return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in ds and s == 1)))
        d = self._resolve_dim(dim)
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        d = self._resolve_dim(dim, extra=1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
        if s > e:  # (it inserted a dim of 1 there, as torch refuses)
            raise TensorValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} in shape "
                                   f"{self.shape}; pass start_dim <= end_dim")  # fmt: skip
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        d = self._resolve_dim(dim)
        if not isinstance(sizes, (tuple, list)):  # (None: "'NoneType' object is not iterable"; a str split in chars)
            raise TensorTypeError(f"unflatten: sizes must be a tuple or list of ints, got {type(sizes).__name__} "
                                  f"{sizes!r:.40}")  # fmt: skip
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    @staticmethod
    def cat_tensors(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
        if not isinstance(tensors, (list, tuple)) or not tensors:  # (a Tensor here was indexed as the list)
            raise TensorTypeError(f"cat_tensors: tensors must be a non-empty list or tuple of Tensors, got "
                                  f"{type(tensors).__name__} {tensors!r:.40}; pass [a, b, ...]")  # fmt: skip
        tensor_args("cat_tensors", "element", tensors)
        first: Tensor = tensors[0]
        return first.cat(*tensors[1:], dim=dim)

    def cat(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        """Concatenate along dim (dtypes promoted; all other dims must match)."""
        tensor_args("cat", "argument", args, type(self))
        if any(t.ndim == 0 for t in (self, *args)):  # (dim 0 of a 0-d tensor: a bare IndexError)
            raise TensorIndexError("cat joins tensors along an existing dim; a 0-d tensor has none: use stack, or "
                                   "reshape(1) first")  # fmt: skip
        ts = [self, *args]
        devs = [t.device for t in ts if type(t.device) is str]
        if (other := next((x for x in devs if x != devs[0]), None)) is not None:
            raise two_devices_error(devs[0], other, "cat")
        d = self._resolve_dim(dim)
        for t in ts:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise TensorAssertionError(f"cat along dim {d}: shapes {[x.shape for x in ts]} differ outside dim {d}")
        dt = dtypes.as_concrete(least_upper_dtype(*[t.dtype for t in ts]))  # (int64 with uint64: weak float)
        ts = [t.cast(dt) for t in ts if not (isinstance(t.shape[d], int) and t.shape[d] == 0)] or [ts[0].cast(dt)]
        if len(ts) == 1:
            return ts[0]
        total: sint = sum(t.shape[d] for t in ts)
        out: Tensor | None = None
        off: sint = 0
        for t in ts:
            n = t.shape[d]
            p = t.pad(tuple((off, total - off - n) if i == d else (0, 0) for i in range(t.ndim)))
            out = p if out is None else out + p if dt.name != "bool" else (out | p)
            off += n
        assert out is not None
        return out

    @staticmethod
    def stack_tensors(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise TensorTypeError(f"stack takes a non-empty list or tuple of Tensors, got {tensors!r:.40}")
        tensor_args("stack", "argument", tensors)
        first = tensors[0]
        d = first._resolve_dim(dim, extra=1)
        if any(t.shape != first.shape for t in tensors):
            raise TensorAssertionError(f"stack needs equal shapes, got {[t.shape for t in tensors]}")
        us: list[Tensor] = [t.unsqueeze(d) for t in tensors]
        return us[0].cat(*us[1:], dim=d)

    def stack(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        return self.stack_tensors([self, *args], dim)

    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        if self.ndim == 0:  # (shape[0] of a 0-d tensor: a bare IndexError)
            raise TensorIndexError("split needs a tensor of at least 1 dim; a 0-d tensor has no dim to split")
        d = self._resolve_dim(dim)
        n = as_int(self.shape[d])
        if isinstance(sizes, (list, tuple)):
            sizes = [whole("split", "each size", s) for s in sizes]
            if any(s < 0 for s in sizes):
                raise TensorValueError(f"split sizes {sizes} must all be >= 0 (and sum to dim {d} of size {n})")
        else:
            sizes = whole("split", "sizes (an int or a list of ints)", sizes)
            if sizes <= 0:
                raise TensorAssertionError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
        if sum(sizes) != n:
            raise TensorAssertionError(f"split sizes {list(sizes)} must sum to dim {d} of size {n}")
        out, off = [], 0
        for s in sizes:
            out.append(self._slice_dim(d, off, off + s))
            off += s
        return tuple(out)

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
        """Pieces of ceil(size / chunks) along dim (maybe fewer than chunks); a 0-size dim gives chunks empty ones."""
        if whole("chunk", "chunks", chunks) <= 0:
            raise TensorAssertionError(f"chunks must be positive, got {chunks}")
        d = self._resolve_dim(dim)
        n = as_int(self.shape[d])
        return list(self.split(math.ceil(n / chunks), d)) if n else [self] * chunks

    def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Rotate elements along dims; a tensor with a zero-size dim comes back unchanged."""
        sh = tuple(whole("roll", "a shift", s) for s in (shifts if isinstance(shifts, (list, tuple)) else (shifts,)))
        if dims is None:
            if len(sh) != 1:
                raise TensorValueError(f"roll with dims=None needs one shift, got {sh}")
            if any(isinstance(s, int) and s == 0 for s in self.shape):
                return self
            return self.flatten().roll(sh[0], 0).reshape(self.shape)
        ds = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)
        if len(sh) != len(ds):
            raise TensorValueError(f"roll: shifts {sh} and dims {ds} must have the same length")
        ds = tuple(self._resolve_dim(d) for d in ds)
        if any(isinstance(s, int) and s == 0 for s in self.shape):
            return self
        t = self
        for s, d in zip(sh, ds):
            n = as_int(t.shape[d])
            k = s % n
            if k == 0:
                continue
            t = t._slice_dim(d, n - k, n).cat(t._slice_dim(d, 0, n - k), dim=d)
        return t

    def repeat(self: Tensor, repeats: Any, *args: Any) -> Tensor:
        """Tile the tensor: repeats has at least ndim entries (extra ones add leading dims)."""
        reps = tuple(whole("repeat", "a repeat count", r) for r in argfix(repeats, *args))
        if any(r < 0 for r in reps):
            raise TensorValueError(f"repeat counts must be integers >= 0, got {reps}")
        if len(reps) < self.ndim:
            raise TensorValueError(
                f"repeat needs at least {self.ndim} repeat counts for shape {self.shape}, got {reps}"
            )
        t = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
        base = t.shape
        inter = t.reshape(tuple(x for s in base for x in (1, s)))
        inter = inter.expand(tuple(x for r, s in zip(reps, base) for x in (r, s)))
        # (1 * n of a symbolic n would be a MUL node, not n: a kernel then ranged over n and over 1*n with one id)
        return inter.reshape(tuple(s if r == 1 else r * s for r, s in zip(reps, base)))

    def tile(self: Tensor, reps: Any, *args: Any) -> Tensor:
        r = argfix(reps, *args)
        r = (1,) * (self.ndim - len(r)) + tuple(r)
        return self.repeat(r)

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        repeats = whole("repeat_interleave", "repeats", repeats)
        if repeats < 0:  # (it surfaced as "reshape to (-3,)", an op the caller never called)
            raise TensorValueError(f"repeat_interleave: repeats must be >= 0, got {repeats}")
        t = self.flatten() if dim is None else self
        d = 0 if dim is None else t._resolve_dim(dim)
        s = t.shape
        out = t.reshape(s[: d + 1] + (1,) + s[d + 1 :]).expand(s[: d + 1] + (repeats,) + s[d + 1 :])
        return out.reshape(s[:d] + (s[d] * repeats,) + s[d + 1 :])

    def pad_to(self: Tensor, shape: Any, *args: Any, value: float = 0.0) -> Tensor:
        """Pad at the end of each dim up to shape (None keeps a dim) with `value`."""
        new = argfix(shape, *args)
        if len(new) != self.ndim:
            raise TensorValueError(f"pad_to {new} needs {self.ndim} dims for shape {self.shape}")
        new = tuple(None if n is None else whole_or_symbolic("pad_to", "a size", n) for n in new)
        return self.pad(tuple((0, 0 if n is None else n - s) for s, n in zip(self.shape, new)), value=value)

    def shrink_to(self: Tensor, shape: Any, *args: Any) -> Tensor:
        """Keep the first `shape` elements of each dim (None keeps a dim)."""
        new = argfix(shape, *args)
        if len(new) != self.ndim:
            raise TensorValueError(f"shrink_to {new} needs {self.ndim} dims for shape {self.shape}")
        new = tuple(None if n is None else whole_or_symbolic("shrink_to", "a size", n) for n in new)
        return self.shrink(tuple(None if n is None else (0, n) for n in new))

    def _stride_dim(self: Tensor, d: int, step: int) -> Tensor:
        """Every step-th element of dim d (from the first)."""
        if step == 1:
            return self
        n = as_int(self.shape[d])
        k = -(-n // step)
        t = self.pad(tuple((0, k * step - n) if i == d else (0, 0) for i in range(self.ndim)))
        t = t.reshape(t.shape[:d] + (k, step) + t.shape[d + 1 :])
        t = t.shrink(tuple((0, 1) if i == d + 1 else None for i in range(t.ndim)))
        return t.reshape(t.shape[: d + 1] + t.shape[d + 2 :])

    def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
        """Sliding windows of `size` every `step` along dim, as a new last dim (torch semantics)."""
        size, step = whole("unfold", "size", size), whole("unfold", "step", step)
        d = self._resolve_dim(dim)
        if self.ndim == 0:  # a 0-d tensor unfolds as its one element
            return self.reshape(1).unfold(0, size, step).reshape(-1)
        if not isinstance(self.shape[d], int):
            return self._unfold_symbolic(d, size, step)
        n = as_int(self.shape[d])
        if size > n or size < 0 or step <= 0:
            raise TensorValueError(f"unfold size {size} / step {step} invalid for dim {d} of size {n}")
        nw = (n - size) // step + 1
        if n == 0 or size == 0:  # degenerate: the concatenation of (empty) slices is already cheap
            wins = [self._slice_dim(d, i * step, i * step + size).unsqueeze(d) for i in range(nw)]
            t = wins[0].cat(*wins[1:], dim=d) if len(wins) > 1 else wins[0]
            order = list(range(t.ndim))
            order.append(order.pop(d + 1))
            return t.permute(order)
        # One affine view, not a concatenation of nw slices (which costs nw masked loads per element): repeat the
        # row, flatten, and re-read it with row length n+1, so row t starts t elements later: y[t, j] = x[t + j].
        last = self.ndim - 1
        x = self.transpose(d, last) if d != last else self
        lead = tuple(x.shape[:-1])
        keep = tuple((0, s) for s in lead)  # (a lead dim may be symbolic: conv2d over a variable width)
        reps = -(-size * (n + 1) // n)
        y = x.unsqueeze(-2).expand(*lead, reps, n).reshape(*lead, reps * n)
        y = y.shrink((*keep, (0, size * (n + 1)))).reshape(*lead, size, n + 1)
        cols = nw * step  # keep columns 0, step, 2*step, ... (every column read is < n - size + 1, so valid)
        if cols > n + 1:
            y = y.pad((*[(0, 0)] * len(lead), (0, 0), (0, cols - (n + 1))))
        else:
            y = y.shrink((*keep, (0, size), (0, cols)))
        y = y.reshape(*lead, size, nw, step).shrink((*keep, (0, size), (0, nw), (0, 1))).reshape(*lead, size, nw)
        y = y.transpose(-1, -2)  # (..., nw, size)
        return y.transpose(d, last) if d != last else y

    def _unfold_symbolic(self: Tensor, d: int, size: int, step: int) -> Tensor:
        """unfold along a symbolic dim: the `size` shifted slices stacked as the last dim (the affine re-read of the
        concrete path needs the row length as a number)."""
        n = self.shape[d]
        if step != 1 or size < 1:
            raise TensorValueError(
                f"unfold along the symbolic dim {d} ({n}) supports step 1 and size >= 1, got size {size}, step {step};"
                " bind the variable to a number first"
            )
        nw = n - (size - 1)
        wins = [self._slice_dim(d, j, j + nw) for j in range(size)]
        return type(self).stack(*wins, dim=-1)

    def rearrange(self: Tensor, formula: str, **sizes: int) -> Tensor:
        """einops-style rearrange: 'b c (h w) -> b h w c' with h=... given for groups that can't be inferred.
        Supports names, (...) groups, '...' and 1; every name on the left must appear on the right. A bad formula
        or sizes raise AssertionError (tinygrad's class)."""
        if not isinstance(formula, str):  # ("'NoneType' object has no attribute 'count'")
            raise TensorTypeError(f"rearrange: formula must be a str like 'b c h w -> b (c h w)', got "
                                  f"{type(formula).__name__} {formula!r:.40}")  # fmt: skip
        for k, v in sizes.items():
            whole_or_symbolic("rearrange", f"the size {k}=", v)
        lhs, rhs = _rearrange_parse(formula)
        names_l = [n for g in lhs for n in g if n not in ("...", "(...)", "1")]
        names_r = [n for g in rhs for n in g if n not in ("...", "(...)", "1")]
        if sorted(names_l) != sorted(names_r) or len(set(names_l)) != len(names_l):
            raise TensorAssertionError(f"rearrange {formula!r}: both sides must name the same axes once each")
        has_ell = any("..." in g or "(...)" in g for g in lhs)
        n_ell = self.ndim - len(lhs) + (1 if has_ell else 0)
        if n_ell < 0 or (n_ell and not has_ell):
            raise TensorAssertionError(f"rearrange {formula!r}: {len(lhs)} groups for a tensor of shape {self.shape}")
        ell = [f"...{i}" for i in range(n_ell)]

        def expand(groups: list[list[str]]) -> list[list[str]]:
            out: list[list[str]] = []
            for g in groups:
                if g == ["..."]:
                    out.extend([e] for e in ell)
                else:
                    out.append([x for n in g for x in (ell if n == "(...)" else [n])])
            return out

        lhs, rhs = expand(lhs), expand(rhs)
        known: dict[str, sint] = dict(sizes)
        for g, dim in zip(lhs, self.shape):
            unknown = [n for n in g if n not in known and n != "1"]
            rest = prod(known[n] for n in g if n in known)
            if len(unknown) > 1:
                raise TensorAssertionError(f"rearrange {formula!r}: give the sizes of {unknown[1:]} in group {g}")
            if unknown:
                if isinstance(dim, int) and isinstance(rest, int) and (rest == 0 or dim % rest):
                    raise TensorAssertionError(f"rearrange {formula!r}: dim {dim} doesn't split by {rest}")
                known[unknown[0]] = dim // rest
            elif rest != dim:
                raise TensorAssertionError(f"rearrange {formula!r}: group {g} has size {rest}, the dim is {dim}")
        flat = [n for g in lhs for n in g if n != "1"]
        t = self.reshape(tuple(known[n] for n in flat))
        order = [flat.index(n) for g in rhs for n in g if n != "1"]
        t = t.permute(order)
        return t.reshape(tuple(prod(known[n] for n in g if n != "1") for g in rhs))

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        offset = whole("diagonal", "offset", offset)
        a, b = self._resolve_dim(dim1), self._resolve_dim(dim2)
        if a == b:
            raise TensorValueError(f"diagonal dims must differ, got {dim1} and {dim2}")
        rest = [i for i in range(self.ndim) if i not in (a, b)]
        t = self.permute(rest + [a, b])
        n, m = as_int(t.shape[-2]), as_int(t.shape[-1])
        if offset >= 0:
            t = t.shrink(tuple([None] * len(rest) + [(0, n), (min(offset, m), m)]))
        else:
            t = t.shrink(tuple([None] * len(rest) + [(min(-offset, n), n), (0, m)]))
        n, m = as_int(t.shape[-2]), as_int(t.shape[-1])
        k = min(n, m)
        if k == 0:
            return t.reshape(t.shape[:-2] + (0,)) if t.numel() == 0 else t.shrink(
                tuple([None] * len(rest) + [(0, 0), (0, 1)])).reshape(t.shape[:-2] + (0,))  # fmt: skip
        t = t.shrink(tuple([None] * len(rest) + [(0, k), (0, k)]))
        flat = t.reshape(t.shape[:-2] + (k * k,)).pad(tuple([(0, 0)] * len(rest) + [(0, k)]))
        return flat.reshape(t.shape[:-2] + (k, k + 1)).shrink(tuple([None] * len(rest) + [(0, k), (0, 1)])).reshape(
            t.shape[:-2] + (k,))  # fmt: skip

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """A square matrix with this 1-D tensor on its `diagonal`-th diagonal (diagonal() reads one instead)."""
        if self.ndim != 1:
            raise TensorValueError(f"diag needs a 1-D tensor, got shape {self.shape}; use diagonal() for the diagonal "
                                   "of a matrix")  # fmt: skip
        n = as_int(self.shape[0])
        self = self._concrete()  # (eye takes self's dtype: a weak one has no storage)
        out = self.unsqueeze(1) * type(self).eye(n, dtype=self.dtype, device=self.device)
        if diagonal > 0:
            out = out.pad(((0, diagonal), (diagonal, 0)))
        elif diagonal < 0:
            out = out.pad(((-diagonal, 0), (0, -diagonal)))
        return out

    def tril(self: Tensor, diagonal: sint = 0) -> Tensor:
        return self._tri(diagonal, lower=True)

    def triu(self: Tensor, diagonal: sint = 0) -> Tensor:
        return self._tri(diagonal, lower=False)

    def _tri(self: Tensor, diagonal: sint, lower: bool) -> Tensor:
        """The lower/upper triangle of the last two dims; they and `diagonal` may be symbolic (a KV-cache attention
        mask `full((1, 1, n, start_pos + n), -inf).triu(start_pos + 1)` with start_pos a bound Variable)."""
        diagonal = whole_or_symbolic("tril" if lower else "triu", "diagonal", diagonal)  # (tril(1.5) was accepted)
        if self.ndim < 2:
            raise TensorValueError(f"tril/triu need at least 2 dims, got shape {self.shape}")
        r = type(self).arange(self.shape[-2], device=self.device).unsqueeze(1)
        c = type(self).arange(self.shape[-1], device=self.device).unsqueeze(0)
        mask = (c - r <= diagonal) if lower else (c - r >= diagonal)
        return mask.where(self, self._const_like(0))


def _pad_amount(x: Any) -> sint:
    """An int pad amount, or a symbolic one (a bound Variable or an expression of them) kept as it is (a float is
    refused: pad(((1.5, 0), ...)) padded 1 row)."""
    return whole_or_symbolic("pad", "a pad amount", x)


def _pad_pair(x: Any, padding: Any) -> tuple[sint, sint]:
    if len(x) != 2:  # (a third amount was ignored)
        raise TensorValueError(f"pad {padding}: each dim takes a (before, after) pair, got {tuple(x)}")
    return _pad_amount(x[0]), _pad_amount(x[1])


def _shrink_pair(x: Any, arg: Any) -> tuple[sint, sint]:
    if not isinstance(x, (tuple, list)):  # ("object of type 'int' has no len()")
        raise TensorTypeError(f"shrink {arg}: each dim takes a (begin, end) pair or None, got {type(x).__name__} "
                              f"{x!r:.40}")  # fmt: skip
    if len(x) != 2:
        raise TensorValueError(f"shrink {arg}: each dim takes a (begin, end) pair or None, got {tuple(x)}")
    return whole_or_symbolic("shrink", "a bound", x[0]), whole_or_symbolic("shrink", "a bound", x[1])


def _normalize_pads(padding: Any, ndim: int) -> tuple[tuple[int, int], ...]:
    if not isinstance(padding, (tuple, list)):  # ("'int' object is not iterable")
        raise TensorTypeError(f"pad takes ((before, after), ...) per dim or a flat (before, after, ...) sequence, "
                              f"got {type(padding).__name__} {padding!r:.40}")  # fmt: skip
    p = tuple(padding)
    if p and all(isinstance(x, (tuple, list)) or x is None for x in p):
        if len(p) != ndim:
            raise TensorValueError(f"pad needs {ndim} (before, after) pairs, got {len(p)}: {padding}")
        return tuple((0, 0) if x is None else _pad_pair(x, padding) for x in p)
    if len(p) % 2 or len(p) // 2 > ndim:
        raise TensorValueError(f"flat pad {padding} needs an even length of at most {2 * ndim}")
    pairs = [(whole("pad", "a pad amount", p[i]), whole("pad", "a pad amount", p[i + 1])) for i in range(0, len(p), 2)]
    pairs = pairs[::-1]
    return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)


def _rearrange_parse(formula: str) -> tuple[list[list[str]], list[list[str]]]:
    """'a (b c) ... -> ...' into groups of names per side ('...' and '1' kept as names)."""
    if formula.count("->") != 1:
        raise TensorAssertionError(f"rearrange formula {formula!r} needs exactly one '->'")

    def side(text: str) -> list[list[str]]:
        groups: list[list[str]] = []
        cur: list[str] | None = None
        for tok in text.replace("(", " ( ").replace(")", " ) ").split():
            if tok == "(":
                if cur is not None:
                    raise TensorAssertionError(f"rearrange {formula!r}: nested parentheses")
                cur = []
            elif tok == ")":
                if cur is None:
                    raise TensorAssertionError(f"rearrange {formula!r}: unbalanced ')'")
                groups.append(cur)
                cur = None
            elif not (tok == "..." or tok == "1" or tok.isidentifier()):
                raise TensorAssertionError(f"rearrange {formula!r}: bad axis name {tok!r}")
            elif cur is not None:
                cur.append("(...)" if tok == "..." else tok)
            else:
                groups.append([tok])
        if cur is not None:
            raise TensorAssertionError(f"rearrange {formula!r}: unbalanced '('")
        return groups

    left, right = formula.split("->")
    return side(left), side(right)
