# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Tensor's operators and elementwise primitives: arithmetic (`+`, `add`, `div`, ...), comparisons, bitwise and
logical ops, shifts, `where`, the in-place operators and the unary primitives (`sqrt`, `exp2`, `floor`, ...).

Each is a thin method over a function of `speck.tensor.elementwise` (functions over UOps), through the wrappers
tensor.py defines in one place: `_binary` (operand promotion, the result's requires_grad), `_unary`, `_new`. The math
composed from these methods (exp, sin, pow, the activations) is `ElementwiseMixin` in elementwise.py."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from speck.tensor import elementwise as ew
from speck.tensor.base import TensorBase
from speck.tensor.dims import flag
from speck.tensor.errors import TensorTypeError
from speck.uop import DType, Ops, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

    _Tensor = Tensor
else:  # isinstance tests take the base class (this module is below tensor.py); Tensor is its one subclass
    _Tensor = TensorBase


class OperatorMixin:
    """The operators and elementwise primitives of Tensor (see the module docstring)."""

    __slots__ = ()

    def _broadcasted(self: Tensor, y: Any, reverse: builtins.bool = False,
                     match_dtype: builtins.bool = True) -> tuple[Tensor, Tensor]:  # fmt: skip
        """self and y as two tensors of one shape, one device and (match_dtype) their joined dtype: the operands
        `_binary` computes on, for ops composed of several Tensor methods."""
        y = self._operand(y)
        yt = y if isinstance(y, _Tensor) else None
        a, b, adev, bdev = ew.promote(self.uop, self._device, y.uop if yt is not None else y,
                                      yt._device if yt is not None else None, reverse, match_dtype)  # fmt: skip
        x_side, y_side = (b, bdev) if reverse else (a, adev), (a, adev) if reverse else (b, bdev)
        xt = self if x_side[0] is self.uop and x_side[1] is self._device else self._new(*x_side)
        if yt is not None and y_side[0] is yt.uop and y_side[1] is yt._device:
            ytt = yt
        else:
            ytt = self._new(*y_side)
            ytt._device = y_side[1]
            ytt.requires_grad = False if yt is None else yt.requires_grad
        return (ytt, xt) if reverse else (xt, ytt)

    def _alu(self: Tensor, op: Ops, *srcs: Tensor) -> Tensor:
        out = self._new(ew.alu(op, self.uop, *[s.uop for s in srcs]))
        if out.requires_grad is not True:  # (_new took self's flag) True if any operand's is, else None if any is
            flags = [s.requires_grad for s in srcs]
            if True in flags or (out.requires_grad is False and None in flags):
                out.requires_grad = True if True in flags else None
        return out

    def _joined(self: Tensor, dt: DType) -> Tensor:
        return self if self.dtype is dt else self._new(ew.join(self.uop, dt))

    def _broadcast_to(self: Tensor, shape: tuple[Any, ...]) -> Tensor:
        u = self.uop
        return self if u.shape == tuple(shape) else self._new(ew.broadcast_to(u, tuple(shape)))

    def _float(self: Tensor) -> Tensor:
        u = self.uop
        return self if (f := ew.to_float(u)) is u else self._new(f)

    def add(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("add", "reverse", reverse)
        return self._binary(ew.add, y, reverse)

    def sub(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("sub", "reverse", reverse)
        return self._binary(ew.sub, y, reverse)

    def mul(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("mul", "reverse", reverse)
        return self._binary(ew.mul, y, reverse)

    def div(self: Tensor, y: Any, reverse: builtins.bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (float result); rounding_mode 'trunc' or 'floor' keeps ints."""
        reverse = reverse if reverse is False or reverse is True else flag("div", "reverse", reverse)
        if rounding_mode is None:
            return self._binary(ew.div, y, reverse)
        if type(rounding_mode) is not str:  # (an array compared to 'trunc' was numpy's "truth value ... ambiguous")
            raise TensorTypeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                                  f"{type(rounding_mode).__name__} {rounding_mode!r:.40}")  # fmt: skip
        return self._binary(lambda a, b, dev: ew.div(a, b, dev, rounding_mode), y, reverse)

    def idiv(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        """Division rounding toward zero (integer division for ints): div(rounding_mode="trunc")."""
        reverse = reverse if reverse is False or reverse is True else flag("idiv", "reverse", reverse)
        return self._binary(ew.idiv, y, reverse)

    def floordiv(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("floordiv", "reverse", reverse)
        return self._binary(ew.floordiv, y, reverse)

    def mod(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        """Python/numpy remainder: the sign of the divisor."""
        reverse = reverse if reverse is False or reverse is True else flag("mod", "reverse", reverse)
        return self._binary(ew.mod, y, reverse)

    def fmod(self: Tensor, y: Any) -> Tensor:
        """C remainder: the sign of the dividend."""
        return self._binary(ew.fmod, y)

    def maximum(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.maximum, y)

    def minimum(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.minimum, y)

    def __add__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.add, y)

    def __radd__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.add, y, True)

    def __sub__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.sub, y)

    def __rsub__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.sub, y, True)

    def __mul__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.mul, y)

    def __rmul__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.mul, y, True)

    def __truediv__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.div, y)

    def __rtruediv__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.div, y, True)

    def __floordiv__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.floordiv, y)

    def __rfloordiv__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.floordiv, y, True)

    def __mod__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.mod, y)

    def __rmod__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.mod, y, True)

    def __pow__(self: Tensor, y: Any) -> Tensor:
        return self.pow(y)

    def __rpow__(self: Tensor, y: Any) -> Tensor:
        return self.pow(y, True)

    def __neg__(self: Tensor) -> Tensor:
        return self._unary(ew.neg)

    def __abs__(self: Tensor) -> Tensor:
        return self.abs()

    def __matmul__(self: Tensor, y: Tensor) -> Tensor:
        return self.matmul(y)

    def __rmatmul__(self: Tensor, y: Any) -> Tensor:
        return (y if isinstance(y, _Tensor) else type(self)(y, device=self.device)).matmul(self)

    # the in-place operators write into self (Python's fallback `x = x op y` would rebind the name only)
    def __iadd__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self + y)

    def __isub__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self - y)

    def __imul__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self * y)

    def __itruediv__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self / y)

    def __ifloordiv__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self // y)

    def __ipow__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self**y)

    def __iand__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self & y)

    def __ior__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self | y)

    def __ixor__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self ^ y)

    def __ilshift__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self << y)

    def __irshift__(self: Tensor, y: Any) -> Tensor:
        return self.assign(self >> y)

    def __imatmul__(self: Tensor, y: Tensor) -> Tensor:
        return self.assign(self.matmul(y))

    def _compare(self: Tensor, fn: Any, y: Any, below: builtins.bool, above: builtins.bool,
                 reverse: builtins.bool = False) -> Tensor:  # fmt: skip
        """A comparison; a Python int y outside self's int dtype compares the same way for every element (`below`:
        the result when y is below the dtype's range, `above`: above it), so the answer is exact without y as a
        constant of that dtype, which would not fit (`uint8_labels != -1` is all True, as in numpy)."""
        if type(y) is builtins.int and dtypes.is_int(dt := self.dtype) and not dt.is_weak:
            if not dtypes.min(dt) <= y <= dtypes.max(dt):
                false = self.zeros_like(dtype=dtypes.bool)
                return false.logical_not() if (below if y < dtypes.min(dt) else above) else false
        return self._binary(fn, y, reverse)

    def __lt__(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.lt, y, False, True)

    def __gt__(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.lt, y, True, False, True)

    def __ge__(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.ge, y, True, False)

    def __le__(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.le, y, False, True)

    def __eq__(self: Tensor, y: Any) -> Tensor:  # type: ignore[override]
        return self._compare(ew.eq, y, False, False)

    def __ne__(self: Tensor, y: Any) -> Tensor:  # type: ignore[override]
        return self._compare(ew.ne, y, True, True)

    def eq(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.eq, y, False, False)

    def ne(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.ne, y, True, True)

    def lt(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.lt, y, False, True)

    def gt(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.lt, y, True, False, True)

    def le(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.le, y, False, True)

    def ge(self: Tensor, y: Any) -> Tensor:
        return self._compare(ew.ge, y, True, False)

    def bitwise_and(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("bitwise_and", "reverse", reverse)
        return self._binary(ew.bitwise_and, y, reverse)

    def bitwise_or(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("bitwise_or", "reverse", reverse)
        return self._binary(ew.bitwise_or, y, reverse)

    def bitwise_xor(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("bitwise_xor", "reverse", reverse)
        return self._binary(ew.bitwise_xor, y, reverse)

    def xor(self: Tensor, y: Any, reverse: builtins.bool = False) -> Tensor:
        """The older name of bitwise_xor."""
        reverse = reverse if reverse is False or reverse is True else flag("xor", "reverse", reverse)
        return self._binary(ew.bitwise_xor, y, reverse)

    def bitwise_not(self: Tensor) -> Tensor:
        return self._unary(ew.bitwise_not)

    def logical_not(self: Tensor) -> Tensor:
        return self._unary(ew.logical_not)

    def logical_and(self: Tensor, y: Any) -> Tensor:
        return self.bool().bitwise_and(y if not hasattr(y, "bool") else y.bool())

    def logical_or(self: Tensor, y: Any) -> Tensor:
        return self.bool().bitwise_or(y if not hasattr(y, "bool") else y.bool())

    def logical_xor(self: Tensor, y: Any) -> Tensor:
        return self.bool().bitwise_xor(y if not hasattr(y, "bool") else y.bool())

    def __and__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_and, y)

    def __rand__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_and, y, True)

    def __or__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_or, y)

    def __ror__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_or, y, True)

    def __xor__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_xor, y)

    def __rxor__(self: Tensor, y: Any) -> Tensor:
        return self._binary(ew.bitwise_xor, y, True)

    def __invert__(self: Tensor) -> Tensor:
        return self._unary(ew.bitwise_not)

    def _shift(self: Tensor, op: Ops, y: Any) -> Tensor:
        y = self._operand(y)
        yt = y if isinstance(y, _Tensor) else None
        u, dev = ew.shift(op, self.uop, self._device, y if yt is None else yt.uop, None if yt is None else yt._device)
        out = self._new(u, dev)
        if yt is not None and out.requires_grad is not True and yt.requires_grad is not False:
            out.requires_grad = True if yt.requires_grad else None
        return out

    def lshift(self: Tensor, y: Any) -> Tensor:
        return self._shift(Ops.SHL, y)

    def rshift(self: Tensor, y: Any) -> Tensor:
        return self._shift(Ops.SHR, y)

    def __lshift__(self: Tensor, y: Any) -> Tensor:
        return self._shift(Ops.SHL, y)

    def __rshift__(self: Tensor, y: Any) -> Tensor:
        return self._shift(Ops.SHR, y)

    # `1 << t`, `256 >> t`: the Python int is the shifted value, the tensor the shift amounts (the int takes t's dtype)
    def __rlshift__(self: Tensor, y: Any) -> Tensor:
        return self._reverse_shift(Ops.SHL, y) if isinstance(y, int) else NotImplemented

    def __rrshift__(self: Tensor, y: Any) -> Tensor:
        return self._reverse_shift(Ops.SHR, y) if isinstance(y, int) else NotImplemented

    def _reverse_shift(self: Tensor, op: Ops, y: int) -> Tensor:
        return type(self)(y, dtype=self.dtype if dtypes.is_int(self.dtype) else None)._shift(op, self)

    def where(self: Tensor, x: Any, y: Any) -> Tensor:
        """x where self is true, else y (broadcast; x and y promoted to a common dtype)."""
        if isinstance(x, _Tensor):
            y = x._operand(y)
        elif isinstance(y, _Tensor):
            x = y._operand(x)
        xt, yt = x if isinstance(x, _Tensor) else None, y if isinstance(y, _Tensor) else None
        u, dev = ew.where(self.uop, self._device, x if xt is None else xt.uop, None if xt is None else xt._device,
                          y if yt is None else yt.uop, None if yt is None else yt._device)  # fmt: skip
        out = self._new(u, dev)
        if dev is not self._device:  # (a device-less condition rebuilt on the values' device is a new tensor)
            out.requires_grad = None
        return out

    def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        if not isinstance(mask, _Tensor):  # ("'int' object has no attribute 'where'")
            raise TensorTypeError(f"masked_fill: the mask must be a bool Tensor, got {type(mask).__name__}")
        # mask.where(value, self): value and self promote together (an int tensor filled with 1.5 is weakfloat, as
        # `int_t + 1.5` is; casting the value to self's dtype made it 1 silently)
        return mask.where(value, self)

    def neg(self: Tensor) -> Tensor:
        return self._unary(ew.neg)

    def reciprocal(self: Tensor) -> Tensor:
        return self._unary(ew.reciprocal)

    def sqrt(self: Tensor) -> Tensor:
        return self._unary(ew.sqrt)

    def exp2(self: Tensor) -> Tensor:
        return self._unary(ew.exp2)

    def log2(self: Tensor) -> Tensor:
        return self._unary(ew.log2)

    def trunc(self: Tensor) -> Tensor:
        return self if not dtypes.is_float(self.dtype) else self._unary(ew.trunc)

    def floor(self: Tensor) -> Tensor:
        return self if not dtypes.is_float(self.dtype) else self._unary(ew.floor)

    def ceil(self: Tensor) -> Tensor:
        return self if not dtypes.is_float(self.dtype) else self._unary(ew.ceil)

    def isnan(self: Tensor) -> Tensor:
        return self._unary(ew.isnan)

    def isinf(self: Tensor, detect_positive: builtins.bool = True, detect_negative: builtins.bool = True) -> Tensor:
        return self._unary(
            ew.isinf,
            flag("isinf", "detect_positive", detect_positive),
            flag("isinf", "detect_negative", detect_negative),
        )

    def isfinite(self: Tensor) -> Tensor:
        return self._unary(ew.isfinite)
