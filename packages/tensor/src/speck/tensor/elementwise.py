# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Elementwise Tensor methods: broadcasting with dtype promotion, arithmetic and its reflected forms, comparisons,
logic and bits, and the math functions built from the IR's few transcendental primitives (EXP2, LOG2, SIN, SQRT)."""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, Union

from speck.tensor.errors import TensorIndexError, TensorTypeError, TensorValueError
from speck.tensor.multi import MultiUOp, _on_device, multi_alu
from speck.tensor.settings import DISALLOW_BROADCAST
from speck.tensor.weak import fold, materialized, retype
from speck.uop import DType, Ops, UOp, dtypes, least_upper_dtype
from speck.uop.dtype import WEAK_DTYPES, strong_dtype

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

Scalar = int | float | bool
TensorOrScalar = Union["Tensor", int, float, bool]


def broadcast_shape(*shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    """numpy broadcasting of shapes; IndexError (tinygrad's class, also a RuntimeError) naming them when they don't
    broadcast."""
    nd = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        non1 = {d for d in dims if not (isinstance(d, int) and d == 1)}
        if len(non1) > 1:
            raise TensorIndexError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} can't be broadcast together "
                                   f"(dims {dims} differ and none is 1)")  # fmt: skip
        out.append(non1.pop() if non1 else 1)
    return tuple(out)


def _py_dtype(x: Scalar) -> DType:
    return dtypes.from_py(x)


def _sigmoid_gradient(out: Tensor, x: Tensor) -> None:
    """sigmoid differentiates as s * (1 - s). Walking 1 / (1 + exp(-x)) instead multiplies exp(-x) = inf by a zero
    gradient (NaN) once x < -88, and tanh and the losses built on sigmoid inherit that NaN."""
    from speck.tensor.gradient import const_like, override_gradient

    node_ref = weakref.ref(out.uop)  # the override table is keyed weakly on the node: don't keep it alive

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        s = node_ref()
        assert s is not None, "the sigmoid node is alive while its gradient is computed"
        return (g * s * (const_like(s, 1) - s),)

    override_gradient(out.uop, (x.uop,), rule)


# 2/pi in 24-bit pieces (bits 1-24, 25-48, ... of its binary expansion, each an exact float64; their sum is 2/pi to
# 216 bits, checked by tests/tensor/test_unary_specials.py): enough for x up to float32's largest, 2**128
_TWO_OVER_PI_24 = [float.fromhex(h) for h in ("0x1.45f306p-1", "0x1.b93910p-26", "0x1.529fc0p-52", "0x1.3abe88p-75",
                                              "0x1.ea69bap-97", "0x1.81b6c4p-121", "0x1.2b3278p-145",
                                              "0x1.0e4104p-170", "0x1.fca2c6p-193")]  # fmt: skip
# Taylor coefficients (lowest degree first, after the leading x) of asin and erf / (2 / sqrt(pi)) in x^2
_ASIN_SERIES = [1 / 6, 3 / 40, 5 / 112, 35 / 1152, 63 / 2816]
_ERF_SERIES = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(1, 9)]


def _poly(x: Tensor, coeffs: list[float]) -> Tensor:
    """sum(c_k * x^(k+1)) for k = 0, 1, ...: the series' terms after the first, by Horner."""
    out = x * coeffs[-1]
    for c in reversed(coeffs[:-1]):
        out = (out + c) * x
    return out


def _upper_float(dt: DType) -> DType:
    """The dtype float math (true division, sqrt, exp, ...) computes a dt operand in: dt if it is a float (weakfloat
    included), weakfloat for a weakint literal (it stays weak), else the default float (read live: users set
    dtypes.default_float)."""
    if dtypes.is_float(dt):
        return dt
    return dtypes.weakfloat if dt is dtypes.weakint else least_upper_dtype(dt, dtypes.weakfloat, dtypes.default_float)


_CMP = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
_LERP_BITS = 7  # fraction bits of lerp's fixed-point weight for uint8 tensors


class ElementwiseMixin:
    """Elementwise methods of Tensor."""

    __slots__ = ()

    # ---------------- broadcasting ----------------
    def _broadcasted(self: Tensor, y: TensorOrScalar, reverse: bool = False,
                     match_dtype: bool = True) -> tuple[Tensor, Tensor]:  # fmt: skip
        """self and y as two tensors of one shape, one device and (match_dtype) their joined dtype. A Python scalar
        is a weak literal: it takes self's dtype (`int8_t + 3` is int8; an int that doesn't fit raises), and
        weak operands stay weak until they meet a concrete dtype. A device-less operand takes the other's device."""
        if y.__class__ is self.__class__ and not reverse:  # the per-op hot path: nothing to convert or broadcast
            xu, yu = self.uop, y.uop
            if xu.dtype is yu.dtype and xu.shape == yu.shape and self._device is not None and y._device is not None:
                return self, y  # (dtypes are interned)
        from speck.tensor.hook import Tensor

        x: Tensor = self
        if DISALLOW_BROADCAST.value and isinstance(y, Tensor) and x.shape != y.shape:
            raise TensorValueError(f"implicit broadcasting of shapes {x.shape} and {y.shape} is off "
                                   "(DISALLOW_BROADCAST=1); "
                                   "expand the operands to one shape first")  # fmt: skip
        if not isinstance(y, Tensor):
            if not isinstance(y, (int, float, bool)):
                if hasattr(y, "__len__") or hasattr(y, "dtype"):
                    y = Tensor(y, device=x.device) if not isinstance(y, UOp) else Tensor(y)
                else:
                    raise TensorTypeError(f"can't combine a Tensor with {type(y).__name__} {y!r}")
        if not isinstance(y, Tensor):
            dt = least_upper_dtype(x.dtype, _py_dtype(y)) if match_dtype else x.dtype
            if dt in WEAK_DTYPES and type(x.uop) is MultiUOp:
                dt = strong_dtype(dt)  # sharded tensors are never weak: no per-shard literal graphs
            # (a Python scalar operand never needs a gradient: it leaves the result's requires_grad to x)
            yt = x._const_like(y, dt)
            yt.requires_grad = False
            if match_dtype and dt != x.dtype:
                x = x._joined(dt)
        else:
            yt = y
            if match_dtype and yt.dtype != x.dtype:
                dt = least_upper_dtype(x.dtype, yt.dtype)
                if dt in WEAK_DTYPES and (type(x.uop) is MultiUOp or type(yt.uop) is MultiUOp):
                    dt = strong_dtype(dt)
                x, yt = x._joined(dt), yt._joined(dt)
            if x._device != yt._device:
                x, yt = x._on_device_of(yt), yt._on_device_of(x)
        if reverse:
            x, yt = yt, x
        if x.shape != yt.shape:
            sh = broadcast_shape(x.shape, yt.shape)
            x, yt = x._broadcast_to(sh), yt._broadcast_to(sh)
        return x, yt

    def _joined(self: Tensor, dt: DType) -> Tensor:
        """self in the dtype a join gave: a weak self meeting a concrete dtype is computed in it, its int literals
        checked to fit (an implicit conversion never wraps); otherwise a cast."""
        if self.dtype is dt:
            return self
        if self._uop.dtype in WEAK_DTYPES and dt not in WEAK_DTYPES:
            return self._new(retype(self.uop, dt))
        return self.cast(dt)

    def _on_device_of(self: Tensor, other: Tensor) -> Tensor:
        """A device-less self rebuilt on other's device (other sharded: left device-less, sharded ops replicate
        it); a tensor with a device is itself."""
        if self._device is not None or other._device is None or type(other._device) is tuple:
            return self
        from speck.tensor.hook import Tensor

        return Tensor(_on_device(self.uop, other._device), device=other._device)

    def _broadcast_to(self: Tensor, shape: tuple[Any, ...]) -> Tensor:
        if self.shape == tuple(shape):
            return self
        if self.ndim > len(shape):
            raise TensorValueError(f"can't broadcast shape {self.shape} to {tuple(shape)}: too many dims")
        t = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
        return t.expand(shape)

    def _alu(self: Tensor, op: Ops, *srcs: Tensor) -> Tensor:
        if self._uop.dtype in WEAK_DTYPES:  # a literal's graph: folded when constant, concrete before a comparison
            if op in _CMP:
                dt = materialized(self.uop)
                return self._joined(dt)._alu(op, *[s._joined(dt) for s in srcs])
            if (c := fold(op, self.dtype, (self.uop, *[s.uop for s in srcs]))) is not None:
                return self._new(c)
        if len(srcs) == 1 and type(yu := srcs[0].uop) is not MultiUOp:  # one plain operand (no loops: the hot path)
            out = self._new(self.uop.alu(op, yu))
        elif any(type(s.uop) is MultiUOp for s in srcs):  # a sharded operand: run per shard (speck.tensor.multi)
            out = self._new(multi_alu(op, self.uop, *[s.uop for s in srcs]))
        else:
            out = self._new(self.uop.alu(op, *[s.uop for s in srcs]))
        if out.requires_grad is not True:  # (_new took self's flag) True if any operand's is, else None if any is
            flags = [s.requires_grad for s in srcs]
            if True in flags or (out.requires_grad is False and None in flags):
                out.requires_grad = True if True in flags else None
        return out

    def _binop(self: Tensor, op: Ops, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b)

    # ---------------- arithmetic ----------------
    def add(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        return self._binop(Ops.ADD, y, reverse)

    def sub(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        if a.dtype == dtypes.bool:  # tinygrad's bool subtraction: a OR NOT b
            return a | b.logical_not()
        return a._alu(Ops.SUB, b)

    def mul(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        return self._binop(Ops.MUL, y, reverse)

    def div(self: Tensor, y: TensorOrScalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (float result); rounding_mode 'trunc' or 'floor' keeps ints."""
        a, b = self._broadcasted(y, reverse)
        if rounding_mode == "trunc":
            return a._alu(Ops.CDIV, b) if dtypes.is_int(a.dtype) else (a / b).trunc()
        if rounding_mode == "floor":
            return a._floordiv(b)
        if rounding_mode is not None:
            raise TensorValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        ft = _upper_float(a.dtype)
        a, b = a.cast(ft), b.cast(ft)
        return a._alu(Ops.FDIV, b)

    def _floordiv(self: Tensor, b: Tensor) -> Tensor:
        a = self
        if dtypes.is_int(a.dtype):
            q = a._alu(Ops.CDIV, b)
            r = a._alu(Ops.CMOD, b)
            adjust = (r != 0) & ((r < 0) != (b < 0))
            return q - adjust.cast(q.dtype)
        if a.dtype == dtypes.bool:
            raise TensorTypeError("floor division of bool tensors is not supported")
        return (a / b).floor()

    def idiv(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        """Division rounding toward zero (integer division for ints): div(rounding_mode="trunc")."""
        return self.div(y, reverse, rounding_mode="trunc")

    def floordiv(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._floordiv(b)

    def mod(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        """Python/numpy remainder: the sign of the divisor."""
        a, b = self._broadcasted(y, reverse)
        r = a._alu(Ops.CMOD, b) if dtypes.is_int(a.dtype) else a._fmod_float(b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def fmod(self: Tensor, y: TensorOrScalar) -> Tensor:
        """C remainder: the sign of the dividend."""
        a, b = self._broadcasted(y)
        if dtypes.is_int(a.dtype):
            return a._alu(Ops.CMOD, b)
        return a._fmod_float(b)

    def _fmod_float(self: Tensor, b: Tensor) -> Tensor:
        # a finite dividend over an infinite divisor is the dividend itself (the quotient formula gives 0 * inf = NaN)
        return (b.isinf() & self.isfinite()).where(self, self - (self / b).trunc() * b)

    def __add__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.add(y)

    def __radd__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.add(y, True)

    def __sub__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.sub(y)

    def __rsub__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.sub(y, True)

    def __mul__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.mul(y)

    def __rmul__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.mul(y, True)

    def __truediv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.div(y)

    def __rtruediv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.div(y, True)

    def __floordiv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.floordiv(y)

    def __rfloordiv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.floordiv(y, True)

    def __mod__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.mod(y)

    def __rmod__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.mod(y, True)

    def __pow__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.pow(y)

    def __rpow__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.pow(y, True)

    def __neg__(self: Tensor) -> Tensor:
        return self.neg()

    def __abs__(self: Tensor) -> Tensor:
        return self.abs()

    def __matmul__(self: Tensor, y: Tensor) -> Tensor:
        return self.matmul(y)

    def __rmatmul__(self: Tensor, y: Tensor) -> Tensor:
        from speck.tensor.hook import Tensor

        return (y if isinstance(y, Tensor) else Tensor(y, device=self.device)).matmul(self)

    def __iadd__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self + y)

    def __isub__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self - y)

    def __imul__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self * y)

    def __itruediv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self / y)

    # the other in-place operators also write into self (Python's fallback `x = x op y` would rebind the name only)
    def __ifloordiv__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self // y)

    def __ipow__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self**y)

    def __iand__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self & y)

    def __ior__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self | y)

    def __ixor__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self ^ y)

    def __ilshift__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self << y)

    def __irshift__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.assign(self >> y)

    def __imatmul__(self: Tensor, y: Tensor) -> Tensor:
        return self.assign(self.matmul(y))

    # ---------------- comparisons ----------------
    def _cmp_out_of_range(self: Tensor, y: object, below: bool, above: bool) -> Tensor | None:
        """self <op> y for a Python int y outside self's int dtype: every element compares the same way (`below`:
        the result when y is below the dtype's range, `above`: above it), so the answer is exact without y as a
        constant of that dtype (which would not fit: `uint8_labels != -1` is all True, as in numpy).
        None when y fits (the ordinary path)."""
        if type(y) is not int or not dtypes.is_int(self.dtype) or self.dtype.is_weak:
            return None
        dt = self.dtype
        if dtypes.min(dt) <= y <= dtypes.max(dt):
            return None
        false = self.zeros_like(dtype=dtypes.bool)
        return false.logical_not() if (below if y < dtypes.min(dt) else above) else false

    def __lt__(self: Tensor, y: TensorOrScalar) -> Tensor:
        if (r := self._cmp_out_of_range(y, False, True)) is not None:
            return r
        a, b = self._broadcasted(y)
        return a._alu(Ops.CMPLT, b)

    def __gt__(self: Tensor, y: TensorOrScalar) -> Tensor:
        if (r := self._cmp_out_of_range(y, True, False)) is not None:
            return r
        a, b = self._broadcasted(y, True)
        return a._alu(Ops.CMPLT, b)

    def __ge__(self: Tensor, y: TensorOrScalar) -> Tensor:
        if (r := self._cmp_out_of_range(y, True, False)) is not None:
            return r
        a, b = self._broadcasted(y)
        if dtypes.is_float(a.dtype):  # not (a < b) would be True for NaN
            return b._alu(Ops.CMPLT, a) | a._alu(Ops.CMPEQ, b)
        return a._alu(Ops.CMPLT, b).logical_not()

    def __le__(self: Tensor, y: TensorOrScalar) -> Tensor:
        if (r := self._cmp_out_of_range(y, False, True)) is not None:
            return r
        a, b = self._broadcasted(y)
        if dtypes.is_float(a.dtype):
            return a._alu(Ops.CMPLT, b) | a._alu(Ops.CMPEQ, b)
        return b._alu(Ops.CMPLT, a).logical_not()

    def __eq__(self: Tensor, y: TensorOrScalar) -> Tensor:  # type: ignore[override]
        if (r := self._cmp_out_of_range(y, False, False)) is not None:
            return r
        a, b = self._broadcasted(y)
        return a._alu(Ops.CMPEQ, b)

    def __ne__(self: Tensor, y: TensorOrScalar) -> Tensor:  # type: ignore[override]
        if (r := self._cmp_out_of_range(y, True, True)) is not None:
            return r
        a, b = self._broadcasted(y)
        return a._alu(Ops.CMPNE, b)

    def eq(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self == y

    def ne(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self != y

    def lt(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self < y

    def gt(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self > y

    def le(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self <= y

    def ge(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self >= y

    # ---------------- logic and bits ----------------
    def _need_int_or_bool(self: Tensor, what: str) -> None:
        if not (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool):
            raise TensorTypeError(f"{what} needs an int or bool tensor, got {self.dtype}")

    def bitwise_and(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        a._need_int_or_bool("bitwise_and")
        return a._alu(Ops.AND, b)

    def bitwise_or(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        a._need_int_or_bool("bitwise_or")
        return a._alu(Ops.OR, b)

    def bitwise_xor(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        a._need_int_or_bool("bitwise_xor")
        return a._alu(Ops.XOR, b)

    def xor(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        """The older name of bitwise_xor."""
        return self.bitwise_xor(y, reverse)

    def bitwise_not(self: Tensor) -> Tensor:
        self._need_int_or_bool("bitwise_not")
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self.bitwise_xor(dtypes.max(self.dtype) if dtypes.is_unsigned(self.dtype) else -1)  # all ones

    def logical_not(self: Tensor) -> Tensor:
        b = self if self.dtype == dtypes.bool else self != 0
        return b._alu(Ops.CMPNE, b._const_like(True, dtypes.bool)._broadcast_to(b.shape))

    def logical_and(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bool().bitwise_and(y if not hasattr(y, "bool") else y.bool())

    def logical_or(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bool().bitwise_or(y if not hasattr(y, "bool") else y.bool())

    def logical_xor(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bool().bitwise_xor(y if not hasattr(y, "bool") else y.bool())

    def __and__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_and(y)

    def __rand__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_and(y, True)

    def __or__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_or(y)

    def __ror__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_or(y, True)

    def __xor__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_xor(y)

    def __rxor__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.bitwise_xor(y, True)

    def __invert__(self: Tensor) -> Tensor:
        return self.bitwise_not()

    def lshift(self: Tensor, y: TensorOrScalar) -> Tensor:
        if not dtypes.is_int(self.dtype):
            raise TensorTypeError(f"lshift needs an int tensor, got {self.dtype}")
        a, b = self._broadcasted(y, match_dtype=False)
        return a._alu(Ops.SHL, b.cast(a.dtype))

    def rshift(self: Tensor, y: TensorOrScalar) -> Tensor:
        if not dtypes.is_int(self.dtype):
            raise TensorTypeError(f"rshift needs an int tensor, got {self.dtype}")
        a, b = self._broadcasted(y, match_dtype=False)
        return a._alu(Ops.SHR, b.cast(a.dtype))

    def __lshift__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.lshift(y)

    def __rshift__(self: Tensor, y: TensorOrScalar) -> Tensor:
        return self.rshift(y)

    def where(self: Tensor, x: TensorOrScalar, y: TensorOrScalar) -> Tensor:
        """x where self is true, else y (broadcast; x and y promoted to a common dtype)."""
        from speck.tensor.hook import Tensor

        if self.dtype != dtypes.bool:
            raise TensorTypeError(
                f"where needs a bool condition, got {self.dtype}; compare first (e.g. (t != 0).where)"
            )
        cond = self
        if isinstance(x, Tensor):
            xt, yt = x._broadcasted(y)
        elif isinstance(y, Tensor):
            yt, xt = y._broadcasted(x)
        else:  # two literals: weak (`(t > 0).where(1, 0)` is weakint), on the condition's device
            dt = least_upper_dtype(_py_dtype(x), _py_dtype(y))
            if dt in WEAK_DTYPES and type(self.uop) is MultiUOp:
                dt = strong_dtype(dt)
            xt, yt = self._const_like(x, dt), self._const_like(y, dt)
        cond = cond._on_device_of(xt)._on_device_of(yt)  # (a device-less condition takes the values' device)
        xt, yt = xt._on_device_of(cond), yt._on_device_of(cond)
        sh = broadcast_shape(cond.shape, xt.shape, yt.shape)
        cond, xt, yt = cond._broadcast_to(sh), xt._broadcast_to(sh), yt._broadcast_to(sh)
        if any(type(t.uop) is MultiUOp for t in (cond, xt, yt)):
            return cond._new(multi_alu(Ops.WHERE, cond.uop, xt.uop, yt.uop))
        return cond._new(UOp(Ops.WHERE, xt.dtype, (cond.uop, xt.uop, yt.uop)))

    def masked_fill(self: Tensor, mask: Tensor, value: TensorOrScalar) -> Tensor:
        from speck.tensor.hook import Tensor

        v = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
        return mask.where(v.cast(self.dtype), self)

    # ---------------- unary math ----------------
    def _float(self: Tensor) -> Tensor:
        return self.cast(_upper_float(self.dtype))

    def _literal_float(self: Tensor) -> Tensor:
        """self in float, as float-literal arithmetic makes it: a concrete int/bool tensor becomes weakfloat (TENSOR_API
        3.3: tinygrad's sigmoid/tanh/gelu of an int tensor are weakfloat; reads give the default float)."""
        return self if dtypes.is_float(self.dtype) else self.cast(dtypes.weakfloat)

    def neg(self: Tensor) -> Tensor:
        return self.logical_not() if self.dtype == dtypes.bool else self._alu(Ops.NEG)

    def reciprocal(self: Tensor) -> Tensor:
        return self._float()._alu(Ops.RECIPROCAL)

    def sqrt(self: Tensor) -> Tensor:
        return self._float()._alu(Ops.SQRT)

    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    def exp2(self: Tensor) -> Tensor:
        return self._float()._alu(Ops.EXP2)

    def exp(self: Tensor) -> Tensor:
        x = self._float()
        if x.dtype.itemsize < 4:  # half/bf16/fp8: x / ln2 rounded to 11 bits would cost ~|x| * 2**-11 relative error
            return x.float().exp().cast(x.dtype)
        return (x * (1 / math.log(2)))._alu(Ops.EXP2)

    def log2(self: Tensor) -> Tensor:
        return self._float()._alu(Ops.LOG2)

    def log(self: Tensor) -> Tensor:
        return self.log2() * math.log(2)

    def log10(self: Tensor) -> Tensor:
        return self.log2() * (math.log(2) / math.log(10))

    def _quadrants(self: Tensor, shift: int = 0) -> Tensor:
        """x * 2/pi + shift reduced to [-2, 2] (quarter turns), in float64, exactly enough for every float32 x (the
        largest too): Payne-Hanek reduction with 2/pi in 24-bit pieces, each product with x's 24-bit significand
        exact in float64 and reduced mod 4 exactly, so sin(1e30) is sin(1e30), not inf."""
        a = self.float().cast(dtypes.float64)
        total = a * 0 + shift
        for c in _TWO_OVER_PI_24:
            t = a * c
            total = total + (t - 4 * (t * 0.25).trunc())
        return total - 4 * (total * 0.25).round()

    def _turns_sin(self: Tensor, shift: int) -> Tensor:
        """sin(x + shift * pi/2) of a float32 (or narrower) x, reduced first: sin of an angle in [-pi, pi]."""
        return (self._quadrants(shift) * (math.pi / 2))._alu(Ops.SIN)

    def sin(self: Tensor) -> Tensor:
        """float32 and narrower: exact argument reduction (`_quadrants`), then sin of the reduced angle in float64;
        float64: the SIN op's own reduction (accurate for |x| <= 6e6)."""
        x = self._float()
        return x._alu(Ops.SIN) if x.dtype == dtypes.float64 else x._turns_sin(0).cast(x.dtype)

    def cos(self: Tensor) -> Tensor:
        """float32 and narrower: sin of the reduced angle shifted by a quarter turn, exactly (so cos is accurate
        near its zeros, where sin(pi/2 - x) would round pi/2 - x first). float64: 1 - 2 sin(x/2)^2, its absolute
        error a float64 ulp."""
        x = self._float()
        if x.dtype != dtypes.float64:
            return x._turns_sin(1).cast(x.dtype)
        s = (x * 0.5).sin()
        return 1 - 2 * s * s

    def tan(self: Tensor) -> Tensor:
        x = self._float()
        if x.dtype == dtypes.float64:
            return x.sin() / x.cos()
        return (x._turns_sin(0) / x._turns_sin(1)).cast(x.dtype)

    def asin(self: Tensor) -> Tensor:
        # |x| < 1/4: the Taylor series (relative error < 1e-9); beyond, Abramowitz & Stegun 4.4.46 on |x| (absolute
        # error < 2e-8, which would be all of asin(1e-8)); odd symmetry restores the sign
        x = self._float()
        a = x.abs()
        small = a < 0.25
        s, b = small.where(a, 0.0), small.where(0.5, a)  # each branch sees only its own inputs
        coeffs = (-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
                  -0.2145988016, 1.5707963050)  # fmt: skip
        p = b * 0 + coeffs[0]
        for c in coeffs[1:]:
            p = p * b + c
        r = small.where(s + s * _poly(s * s, _ASIN_SERIES), (math.pi / 2) - (1 - b).sqrt() * p)
        return (x < 0).where(-r, r)

    def acos(self: Tensor) -> Tensor:
        return (math.pi / 2) - self.asin()

    def atan(self: Tensor) -> Tensor:
        x = self._float()
        inner = x.abs() <= 1
        # each branch sees only the inputs it is selected for: 1/x at x = 1e-8 (or x*x at 1e20) would make the
        # other branch's gradient 0 * inf = NaN
        xs, xb = inner.where(x, 0.0), inner.where(1.0, x)
        small = (xs / (xs * xs + 1).sqrt()).asin()
        r = 1 / xb
        big = xb.sign() * (math.pi / 2) - (r / (r * r + 1).sqrt()).asin()
        return inner.where(small, big)

    def sinh(self: Tensor) -> Tensor:
        # |x| < 1: (expm1(x) - expm1(-x)) / 2, no cancellation; beyond, e^x / 2 as e^(x - ln 2): finite up to
        # x = 89.4 (e^x alone overflows float32 at 88.7)
        x = self._float()
        small = x.abs() < 1
        s, b = small.where(x, 0.0), small.where(1.0, x)  # each branch sees only its own inputs
        return small.where((s._expm1() - (-s)._expm1()) * 0.5, (b - math.log(2)).exp() - (-b - math.log(2)).exp())

    def cosh(self: Tensor) -> Tensor:
        x = self._float()
        return (x - math.log(2)).exp() + (-x - math.log(2)).exp()

    def tanh(self: Tensor) -> Tensor:
        # -u / (u + 2) with u = expm1(-2|x|) in (-1, 0]: no cancellation near 0, no overflow for large |x|
        x = self._literal_float()
        u = (x.abs() * -2.0)._expm1()
        r = -u / (u + 2.0)
        return (x < 0).where(-r, r)

    def asinh(self: Tensor) -> Tensor:
        x = self._float()
        a = x.abs()
        # beyond 2**28, sqrt(a^2 + 1) == a in float32 (and a^2 overflows from 1.8e19): log(2a); below, log1p(a +
        # a^2 / (1 + sqrt(1 + a^2))), which keeps asinh(1e-8) = 1e-8
        big = a > 2.0**28
        ab, asm = big.where(a, 1.0), big.where(1.0, a)  # each branch sees only its own inputs (finite gradients)
        r = big.where(ab.log() + math.log(2), (asm + asm * asm / ((asm * asm + 1).sqrt() + 1))._log1p())
        return (x < 0).where(-r, r)

    def acosh(self: Tensor) -> Tensor:
        x = self._float()
        big = x > 2.0**28
        xb, xs = big.where(x, 1.0), big.where(2.0, x)  # each branch sees only its own inputs (finite gradients)
        r = big.where(xb.log() + math.log(2), (xs + ((xs - 1) * (xs + 1)).sqrt()).log())
        return (x < 1).where(math.nan, r)

    def atanh(self: Tensor) -> Tensor:
        x = self._float()
        return (x._log1p() - (-x)._log1p()) * 0.5  # atanh(1e-8) = 1e-8 (not 0), and exact 1 - x near 1

    def sigmoid(self: Tensor) -> Tensor:
        x = self._literal_float()
        out = (1 + x.neg().exp()).reciprocal()
        _sigmoid_gradient(out, x)
        return out

    def erf(self: Tensor) -> Tensor:
        # |x| < 1/2: the Taylor series (relative error < 1e-10); beyond, Abramowitz & Stegun 7.1.26 (absolute error
        # < 1.5e-7, which would be all of erf(1e-8))
        x = self._float()
        a = x.abs()
        small = a < 0.5
        s, b = small.where(a, 0.0), small.where(1.0, a)  # each branch sees only its own inputs
        t = 1.0 / (1.0 + 0.3275911 * b)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        r = small.where((s + s * _poly(s * s, _ERF_SERIES)) * (2 / math.sqrt(math.pi)), 1.0 - poly * (-(b * b)).exp())
        return (x < 0).where(-r, r)

    def _expm1(self: Tensor) -> Tensor:
        """e^x - 1 without the cancellation of exp(x) - 1 near 0 (Kahan): (u - 1) * x / log(u) with u = e^x, whose
        rounding error cancels; x itself where u rounds to 1, and u - 1 where it is -1 or inf."""
        x = self._float()
        u = x.exp()
        d = u - 1
        edge = (d == 0) | (d == -1) | u.isinf()  # (-1: u is below half an ulp of 1, where log(u) is inexact)
        # the ratio's inputs are made harmless on the edges, so that its gradient there is 0, not 0 * inf = NaN
        ratio = edge.where(0.0, d) * edge.where(0.0, x) / edge.where(math.e, u).log()
        return (d == 0).where(x, edge.where(d, ratio))

    def _log1p(self: Tensor) -> Tensor:
        """log(1 + v) without the cancellation near 0: log(w) * v / (w - 1) with w = 1 + v (the rounding of w
        cancels); v itself where w rounds to 1, log(w) where w is 0, negative or inf."""
        v = self._float()
        w = v + 1
        d = w - 1
        edge = (d == 0) | (w <= 0) | w.isinf()
        ratio = edge.where(math.e, w).log() * edge.where(0.0, v) / edge.where(1.0, d)
        return (d == 0).where(v, edge.where(w.log(), ratio))

    def abs(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype):
            return self
        return (self < 0).where(-self, (self > 0).where(self, self - self))  # gradient 0 at 0; -0 -> 0, NaN stays

    def sign(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            return self
        z = self._const_like(0)
        if dtypes.is_unsigned(self.dtype):
            return (self != 0).where(self._const_like(1), z)
        # NaN gives NaN, as numpy and torch do (tinygrad gives 1: a silent wrong value); +-0 gives 0
        one = (self > 0).where(self._const_like(1), self.detach() if dtypes.is_float(self.dtype) else z)
        return (self < 0).where(self._const_like(-1), (self == 0).where(z, one))

    def trunc(self: Tensor) -> Tensor:
        return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self: Tensor) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self: Tensor) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self: Tensor) -> Tensor:
        """Round half to even (numpy's rule)."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        frac = self - t
        s = self.sign()
        odd = (t - (t / 2).trunc() * 2) != 0
        up = (frac.abs() > 0.5) | ((frac.abs() == 0.5) & odd)
        return up.where(t + s, t)

    def isnan(self: Tensor) -> Tensor:
        return self != self if dtypes.is_float(self.dtype) else self._const_like(False, dtypes.bool)._broadcast_to(
            self.shape)  # fmt: skip

    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self._const_like(False, dtypes.bool)._broadcast_to(self.shape)
        pos = (self == math.inf) if detect_positive else self._const_like(False, dtypes.bool)._broadcast_to(self.shape)
        neg = (self == -math.inf) if detect_negative else self._const_like(False, dtypes.bool)._broadcast_to(self.shape)
        return pos | neg

    def isfinite(self: Tensor) -> Tensor:
        return (self.isinf() | self.isnan()).logical_not()

    def isclose(self: Tensor, other: TensorOrScalar, rtol: float = 1e-5, atol: float = 1e-8,
                equal_nan: bool = False) -> Tensor:  # fmt: skip
        a, b = self._broadcasted(other)
        close = (a == b) | ((a - b).abs() <= atol + rtol * b.abs())
        if not dtypes.is_float(a.dtype):
            return close
        fin = a.isfinite() & b.isfinite()
        out = (a == b) | (fin & close)
        return out | (a.isnan() & b.isnan()) if equal_nan else out

    def allclose(self: Tensor, other: TensorOrScalar, rtol: float = 1e-5, atol: float = 1e-8,
                 equal_nan: bool = False) -> Tensor:  # fmt: skip
        """A 0-d bool tensor: isclose everywhere (read it with .item())."""
        return self.isclose(other, rtol, atol, equal_nan).all()

    def clip(self: Tensor, min_: TensorOrScalar | None = None, max_: TensorOrScalar | None = None) -> Tensor:
        if min_ is None and max_ is None:
            raise TensorValueError("clip needs at least one of min_ or max_")
        out = self
        if min_ is not None:
            out = out.maximum(min_)
        if max_ is not None:
            out = out.minimum(max_)
        return out

    def clamp(self: Tensor, min_: TensorOrScalar | None = None, max_: TensorOrScalar | None = None) -> Tensor:
        return self.clip(min_, max_)

    def maximum(self: Tensor, y: TensorOrScalar) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype == dtypes.bool:
            return a | b
        return a._alu(Ops.MAX, b)

    def minimum(self: Tensor, y: TensorOrScalar) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype == dtypes.bool:
            return a & b
        if dtypes.is_int(a.dtype):
            return (a < b).where(a, b)
        return -((-a)._alu(Ops.MAX, -b))

    def lerp(self: Tensor, end: TensorOrScalar, weight: TensorOrScalar) -> Tensor:
        from speck.tensor.hook import Tensor

        if self.dtype == dtypes.uint8 and isinstance(weight, Tensor):
            # images: fixed point with a 7-bit weight in int16, rounded to nearest (uint8 arithmetic would wrap)
            w = (weight * (1 << _LERP_BITS) + 0.5).cast(dtypes.int16)
            a = self.cast(dtypes.int16)
            step = (Tensor(end, dtype=dtypes.int16) if not isinstance(end, Tensor) else end.cast(dtypes.int16)) - a
            return (a + ((step * w + (1 << (_LERP_BITS - 1))) >> _LERP_BITS)).cast(dtypes.uint8)
        return self + (end - self) * weight

    def copysign(self: Tensor, other: TensorOrScalar) -> Tensor:
        a, b = self._float()._broadcasted(other)
        neg = (b < 0) | ((b == 0) & (b.reciprocal() < 0))
        return neg.where(-a.abs(), a.abs())

    def logaddexp(self: Tensor, other: TensorOrScalar) -> Tensor:
        # max + log1p(exp(min - max)): log(1 + tiny) would round the tiny term away (softplus(-20) = 0)
        a, b = self._float()._broadcasted(other)
        m, n = a.maximum(b), a.minimum(b)
        return m + m.isinf().where(0.0, n - m).exp()._log1p()

    def pow(self: Tensor, y: TensorOrScalar, reverse: bool = False) -> Tensor:
        """x ** y with numpy's dtype rules: exact for int ** int (negative exponents give 0, 1 or -1), negative
        float bases with integral exponents keep their sign, others are NaN."""

        if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool):
            if isinstance(y, int) and y < 0 and (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool):
                raise TensorTypeError(f"{self.dtype} ** {y}: a negative int exponent needs a float base; cast first")
            if isinstance(y, int) or float(y).is_integer():
                if dtypes.is_int(self.dtype) and isinstance(y, float):
                    return self._float().pow(y)
                return self._pow_int_const(int(y), float_result=isinstance(y, float))
            if y == 0.5:
                return self.sqrt()
        base, exp = self._broadcasted(y, reverse)
        if dtypes.is_int(base.dtype) or base.dtype == dtypes.bool:
            if base.dtype == dtypes.bool:
                base, exp = base.int(), exp.int()
            return base._pow_int_tensor(exp)
        return base._pow_float(exp)

    def _pow_float(self: Tensor, e: Tensor) -> Tensor:
        b = self
        mag = (e * b.abs().log2()).exp2()
        e_int = e == e.trunc()
        odd = e_int & ((e - (e / 2).trunc() * 2).abs() == 1)
        neg = b < 0
        r = neg.where(e_int.where(odd.where(-mag, mag), math.nan), mag)
        r = (e == 0).where(1.0, r)
        out = (b == 1).where(1.0, r)
        _pow_gradient(out, b, e)
        return out

    def _pow_int_const(self: Tensor, n: int, float_result: bool) -> Tensor:
        x = self if not float_result or dtypes.is_float(self.dtype) else self._float()
        if n == 0:
            return x._const_like(1)._broadcast_to(x.shape)
        if n < 0:
            if dtypes.is_int(x.dtype):
                return x._pow_int_tensor(x._const_like(n)._broadcast_to(x.shape))
            return x._pow_int_const(-n, float_result).reciprocal()
        acc: Tensor | None = None
        p = x
        while n:
            if n & 1:
                acc = p if acc is None else acc * p
            n >>= 1
            if n:
                p = p * p
        assert acc is not None
        return acc

    def _pow_int_tensor(self: Tensor, e: Tensor) -> Tensor:
        """Exact integer power by squaring over the exponent's bits (all in one fused kernel)."""
        b = self
        bits = 8 * b.dtype.itemsize
        acc = b._const_like(1)._broadcast_to(b.shape)
        p = b
        ee = e
        for i in range(bits - 1 if not dtypes.is_unsigned(e.dtype) else bits):
            acc = ((ee & 1) != 0).where(acc * p, acc)
            ee = ee >> 1
            if i < bits - 2:
                p = p * p
        if dtypes.is_unsigned(e.dtype):
            return acc
        # negative exponents: 1 ** -n = 1, (-1) ** -n = +-1, else 0 (numpy raises; tinygrad gives these values)
        odd = (e & 1) != 0
        negres = (b == 1).where(b._const_like(1), (b == -1).where(odd.where(b._const_like(-1), b._const_like(1)),
                                                                  b._const_like(0)))  # fmt: skip
        return (e < 0).where(negres, acc)

    # ---------------- activations ----------------
    def relu(self: Tensor) -> Tensor:
        out = self.maximum(0)
        _relu_gradient(out, self)
        return out

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def gelu(self: Tensor, approximate: str = "tanh") -> Tensor:
        """GELU: the tanh approximation (default, tinygrad's), or approximate="none" for the erf form."""
        if approximate == "none":
            return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
        if approximate != "tanh":
            raise TensorValueError(f"gelu approximate must be 'tanh' or 'none', got {approximate!r}")
        # 0.5 * x * (1 + tanh(z)) = x * sigmoid(2z): the same value without 1 + tanh(z) cancelling for negative x
        return self * (2 * math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).sigmoid()

    def silu(self: Tensor) -> Tensor:
        return self * self.sigmoid()

    def swish(self: Tensor) -> Tensor:
        return self.silu()

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * self._nonpositive()._expm1())

    def _nonpositive(self: Tensor) -> Tensor:
        """min(x, 0) with no gradient where x > 0: for the exp branch of elu-like functions, which must not see
        large x (exp(100) = inf: the unselected branch's gradient would be 0 * inf = NaN)."""
        return (self > 0).where(0.0, self)

    def softplus(self: Tensor, beta: float = 1.0) -> Tensor:
        return (self * beta).logaddexp(0.0) * (1 / beta)

    def hardtanh(self: Tensor, min_val: float = -1, max_val: float = 1) -> Tensor:
        return self.clip(min_val, max_val)

    def relu6(self: Tensor) -> Tensor:
        return self.relu().minimum(6)

    def square(self: Tensor) -> Tensor:
        return self * self


def _relu_gradient(out: Tensor, x: Tensor) -> None:
    """relu's gradient is 0 at 0 (maximum's rule would split a tie in half). The forward stays one MAX, which
    fuses into the kernel computing x (a select would read x twice and make it a kernel of its own)."""
    from speck.tensor.gradient import override_gradient

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        return ((x > 0).where(out._new(g), 0.0).uop,)

    override_gradient(out.uop, (x.uop,), rule)


def _pow_gradient(out: Tensor, b: Tensor, e: Tensor) -> None:
    """x ** y differentiates as y * x ** (y - 1) (0 where y == 0) and x ** y * ln(x) (0 where x == 0), not through
    the exp2/log2 graph computing it, which gives NaN at x == 0."""
    from speck.tensor.gradient import override_gradient

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        gt, o = out._new(g), out._new(out.uop)
        dx = (e == 0).where(0.0, gt * e * b._pow_float(e - 1))
        dy = (b == 0).where(0.0, gt * o * b.log())
        return dx.uop, dy.uop

    override_gradient(out.uop, (b.uop, e.uop), rule)
