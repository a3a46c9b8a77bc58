# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Elementwise math in two layers.

The primitives are plain functions over tensor-level UOps: `promote` applies the operand rules (a Python scalar is a
weak literal taking the other operand's dtype, dtypes join by `least_upper_dtype`, a weak operand meeting a
concrete dtype is computed in it, a device-less operand takes the other's device, shapes broadcast as numpy's), and
the ops (`add`, `div`, `lt`, `where`, `sqrt`, ...) build the nodes, folding weak literals and running sharded
operands per shard. The device is passed where a constant must be placed (None: device-less, a tuple: sharded).
Tensor wraps them in one place (`_binary` and `_unary` in tensor.py: Tensor/scalar operands in, a Tensor with the
operands' requires_grad out); the methods over them (`+`, `add`, `<`, `where`, `sqrt`, ...) are operators.py's.

`ElementwiseMixin` holds the math composed from those Tensor methods (exp, sin, erf, pow, the activations, ...):
those compositions use the public Tensor API only, so the gradients they declare see the same graph users do."""

from __future__ import annotations

import math
import struct
import weakref
from typing import TYPE_CHECKING, Any, Union

from speck.tensor.device import default_device, two_devices_error
from speck.tensor.dims import flag, real
from speck.tensor.errors import TensorIndexError, TensorTypeError, TensorValueError
from speck.tensor.gradient import const_like, override_gradient
from speck.tensor.multi import MultiUOp, _on_device, multi_alu
from speck.tensor.nodes import _const_uop
from speck.tensor.precise import asin64, erf64, odd_abs, quarter_turns64
from speck.tensor.settings import DISALLOW_BROADCAST
from speck.tensor.weak import check_fits, fold, materialized, retype
from speck.uop import DType, Ops, UOp, dtypes, least_upper_dtype
from speck.uop.dtype import WEAK_DTYPES, cast_value, strong_dtype
from speck.uop.uop import set_shape

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

Scalar = int | float | bool
TensorOrScalar = Union["Tensor", int, float, bool]
# where a tensor lives: a device name, a tuple of them (sharded) or None (device-less: it takes the device of the
# tensors it meets, and its constants sit on the default device until then)
Device = Any


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


def _upper_float(dt: DType) -> DType:
    """The dtype float math (true division, sqrt, exp, ...) computes a dt operand in: dt if it is a float (weakfloat
    included), weakfloat for a weakint literal (it stays weak), else the default float (read live: users set
    dtypes.default_float)."""
    if dtypes.is_float(dt):
        return dt
    return dtypes.weakfloat if dt is dtypes.weakint else least_upper_dtype(dt, dtypes.weakfloat, dtypes.default_float)


_CMP = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
_LERP_BITS = 7  # fraction bits of lerp's fixed-point weight for uint8 tensors


# ---------------- operands: constants, dtypes, devices, shapes ----------------
def const(v: Scalar, dt: DType, dev: Device) -> UOp:
    """A 0-d constant of dt (a Python int must fit: a literal never wraps) on dev; a device-less or sharded dev
    places it on the default device (sharded ops rebuild it on every device)."""
    check_fits(v, dt)
    return _const_uop(v, dt, dev if type(dev) is str else default_device())


def fill(ref: UOp, v: Scalar, dev: Device, dt: DType | None = None) -> UOp:
    """v as a constant of dt (default ref's dtype) in ref's shape."""
    return broadcast_to(const(v, ref.dtype if dt is None else dt, dev), ref.shape)


def cast(u: UOp, dt: DType) -> UOp:
    """An explicit cast (Tensor.cast): a weak graph (literals) is computed in dt instead, its ints converted."""
    if dt == u.dtype:
        return u
    if u.dtype in WEAK_DTYPES and dt not in WEAK_DTYPES:
        return retype(u, dt, implicit=False)
    return u.cast(dt)


def join(u: UOp, dt: DType) -> UOp:
    """u in the dtype a join gave: a weak u meeting a concrete dtype is computed in it, its int literals checked to
    fit (an implicit conversion never wraps); otherwise a cast."""
    if u.dtype is dt:
        return u
    if u.dtype in WEAK_DTYPES and dt not in WEAK_DTYPES:
        return retype(u, dt)
    return cast(u, dt)


def to_float(u: UOp) -> UOp:
    return cast(u, _upper_float(u.dtype))


def on_device_of(u: UOp, dev: Device, other: Device) -> tuple[UOp, Device]:
    """A device-less u rebuilt on other's device (other sharded or device-less: left as it is, sharded ops
    replicate it); u with a device is itself."""
    if dev is not None or other is None or type(other) is tuple:
        return u, dev
    return _on_device(u, other), other


def broadcast_to(u: UOp, shape: tuple[Any, ...]) -> UOp:
    sh = u.shape
    if sh == shape:
        return u
    if len(sh) > len(shape):
        raise TensorValueError(f"can't broadcast shape {sh} to {tuple(shape)}: too many dims")
    if len(sh) < len(shape):
        u = u.reshape((1,) * (len(shape) - len(sh)) + sh)
    return u.expand(shape) if u.shape != shape else u


# the strong dtypes a Python float (int) literal joins into unchanged: an op of such a tensor with that literal is
# computed in the tensor's dtype, the literal a constant of it (Tensor._binary builds that case itself)
TAKES_LITERAL: dict[type, frozenset[DType]] = {
    kind: frozenset(d for d in dtypes.all if least_upper_dtype(d, weak) is d)
    for kind, weak in ((float, dtypes.weakfloat), (int, dtypes.weakint))
}


_INT_RANGE = {d: (dtypes.min(d), dtypes.max(d)) for d in dtypes.ints}


def literal(v: int | float, dt: DType, dev: str) -> UOp:
    """const(v, dt, dev) for a Python float/int v whose kind dt takes unchanged (TAKES_LITERAL): the same node, made
    in fewer steps (Tensor._binary's per-op path)."""
    if (r := _INT_RANGE.get(dt)) is not None and not r[0] <= v <= r[1]:
        check_fits(v, dt)  # (raises: the int doesn't fit)
    return UOp(Ops.CONST, dt, (UOp(Ops.DEVICE, arg=dev),), cast_value(v, dt))


# `x * 2.0` in a training loop makes the same constant, RESHAPE and EXPAND nodes every step and drops them with the
# step's graph: the latest broadcast literals are kept alive here, so hash-consing finds them. Keyed by the value (a
# float by its bits: -0.0 is not 0.0, NaN is NaN), dtype, device and shape; emptied when full (a dict's clear is one
# atomic step: no lock)
_RECENT_LITERALS: dict[tuple[Any, ...], UOp] = {}
_RECENT_MAX = 256
_f64_bits = struct.Struct("<d").pack


def broadcast_literal(v: int | float, dt: DType, dev: str, shape: tuple[Any, ...]) -> UOp:
    """expand_0d(literal(v, dt, dev), shape): the same nodes, found among the recent ones when they are there."""
    key = (v if v.__class__ is int else _f64_bits(v), dt, dev, shape)
    if (u := _RECENT_LITERALS.get(key)) is None:
        u = expand_0d(literal(v, dt, dev), shape)
        if all(d.__class__ is int for d in shape):  # (a symbolic shape's variables are not kept alive here)
            if len(_RECENT_LITERALS) >= _RECENT_MAX:
                _RECENT_LITERALS.clear()
            _RECENT_LITERALS[key] = u
    return u


def expand_0d(u: UOp, shape: tuple[Any, ...]) -> UOp:
    """The 0-d u broadcast to a valid `shape`: broadcast_to's nodes (a RESHAPE to ones, then an EXPAND unless the
    shape is all ones), made directly, their shapes recorded as the constructors' args give them."""
    if not shape:
        return u
    ones = (1,) * len(shape)
    r = UOp(Ops.RESHAPE, u.dtype, (u,), ones)
    if r._shape == 0:
        set_shape(r, ones)
    if shape == ones:
        return r
    e = UOp(Ops.EXPAND, u.dtype, (r,), shape)
    if e._shape == 0:
        set_shape(e, shape)
    return e


def promote(x: UOp, xdev: Device, y: UOp | Scalar, ydev: Device = None, reverse: bool = False,
            match_dtype: bool = True) -> tuple[UOp, UOp, Device, Device]:  # fmt: skip
    """x and y as two nodes of one shape, one device and (match_dtype) their joined dtype, with their devices
    (reverse: y first). A Python scalar y is a weak literal: it takes x's dtype (`int8_t + 3` is int8; an int that
    doesn't fit raises), and weak operands stay weak until they meet a concrete dtype. A device-less operand takes
    the other's device."""
    if not isinstance(y, UOp):
        dt = least_upper_dtype(x.dtype, dtypes.from_py(y)) if match_dtype else x.dtype
        if dt in WEAK_DTYPES and type(x) is MultiUOp:
            dt = strong_dtype(dt)  # sharded tensors are never weak: no per-shard literal graphs
        ydev = None if type(xdev) is tuple else xdev
        y = const(y, dt, ydev)
        if match_dtype and dt != x.dtype:
            x = join(x, dt)
    else:
        if DISALLOW_BROADCAST.value and x.shape != y.shape:
            raise TensorValueError(f"implicit broadcasting of shapes {x.shape} and {y.shape} is off "
                                   "(DISALLOW_BROADCAST=1); expand the operands to one shape first")  # fmt: skip
        if match_dtype and y.dtype != x.dtype:
            dt = least_upper_dtype(x.dtype, y.dtype)
            if dt in WEAK_DTYPES and (type(x) is MultiUOp or type(y) is MultiUOp):
                dt = strong_dtype(dt)
            x, y = join(x, dt), join(y, dt)
        if xdev != ydev:
            if type(xdev) is str and type(ydev) is str:  # (the scheduler checks this too, for ops made elsewhere)
                raise two_devices_error(xdev, ydev)
            (x, xdev2), (y, ydev) = on_device_of(x, xdev, ydev), on_device_of(y, ydev, xdev)
            xdev = xdev2
    if reverse:
        x, y, xdev, ydev = y, x, ydev, xdev
    if x.shape != y.shape:
        sh = broadcast_shape(x.shape, y.shape)
        x, y = broadcast_to(x, sh), broadcast_to(y, sh)
    return x, y, xdev, ydev


def joinable(ydev: Device, xdev: str | None) -> bool:
    """Whether an operand on ydev meets one on xdev (a name or None) as promote joins them without moving data: one
    device, or a device-less side (rebuilt on the other's device). Tensor._binary asks only when the two are not one
    object."""
    return ydev is None or (ydev.__class__ is str and (xdev is None or ydev == xdev))


# ---------------- the ALU ----------------
def alu(op: Ops, x: UOp, *srcs: UOp) -> UOp:
    """op over operands of one shape and dtype: a literal's graph is folded when constant (and made concrete before
    a comparison); a sharded operand runs per shard (speck.tensor.multi)."""
    if x.dtype in WEAK_DTYPES:
        if op in _CMP:
            dt = materialized(x)
            return alu(op, join(x, dt), *[join(s, dt) for s in srcs])
        if (c := fold(op, x.dtype, (x, *srcs))) is not None:
            return c
    if len(srcs) == 1 and type(srcs[0]) is not MultiUOp:  # one plain operand (no loops: the hot path)
        return x.alu(op, srcs[0])
    if any(type(s) is MultiUOp for s in srcs):
        return multi_alu(op, x, *srcs)
    return x.alu(op, *srcs)


def scalar_op(op: Ops, x: UOp, dev: Device, v: Scalar) -> UOp:
    """op between x and a Python scalar (the scalar's dtype joined with x's)."""
    a, b, _, _ = promote(x, dev, v)
    return alu(op, a, b)


def select(c: UOp, x: UOp, y: UOp) -> UOp:
    """x where c, else y: three nodes of one shape and device, x and y of one dtype."""
    if type(c) is MultiUOp or type(x) is MultiUOp or type(y) is MultiUOp:
        return multi_alu(Ops.WHERE, c, x, y)
    return UOp(Ops.WHERE, x.dtype, (c, x, y))


def where(c: UOp, cdev: Device, x: UOp | Scalar, xdev: Device, y: UOp | Scalar, ydev: Device) -> tuple[UOp, Device]:
    """x where the bool c is true, else y (broadcast; x and y promoted to one dtype; two literals stay weak), with
    the result's device (a device-less condition takes the values')."""
    if c.dtype != dtypes.bool:
        raise TensorTypeError(f"where needs a bool condition, got {c.dtype}; compare first (e.g. (t != 0).where)")
    if isinstance(x, UOp):
        xu, yu, xdev, ydev = promote(x, xdev, y, ydev)
    elif isinstance(y, UOp):
        yu, xu, ydev, xdev = promote(y, ydev, x, xdev)
    else:  # two literals: weak (`(t > 0).where(1, 0)` is weakint), on the condition's device
        dt = least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
        if dt in WEAK_DTYPES and type(c) is MultiUOp:
            dt = strong_dtype(dt)
        xdev = ydev = None if type(cdev) is tuple else cdev
        xu, yu = const(x, dt, xdev), const(y, dt, ydev)
    c, cdev = on_device_of(c, cdev, xdev)
    c, cdev = on_device_of(c, cdev, ydev)
    (xu, xdev), (yu, ydev) = on_device_of(xu, xdev, cdev), on_device_of(yu, ydev, cdev)
    if type(cdev) is str and type(xdev) is str and cdev != xdev:
        raise two_devices_error(cdev, xdev, "where")
    sh = broadcast_shape(c.shape, xu.shape, yu.shape)
    return select(broadcast_to(c, sh), broadcast_to(xu, sh), broadcast_to(yu, sh)), cdev


# ---------------- arithmetic (operands promoted: one shape, dtype and device) ----------------
def add(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.ADD, a, b)


def mul(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.MUL, a, b)


# the binary ops that are one ALU node `UOp(op, dtype, (a, b))` over two strong operands of one dtype and shape,
# whatever the dtype (Tensor._binary makes that node itself: three calls less per op)
ONE_NODE: dict[Any, Ops] = {add: Ops.ADD, mul: Ops.MUL}


def sub(a: UOp, b: UOp, dev: Device) -> UOp:
    if a.dtype == dtypes.bool:  # tinygrad's bool subtraction: a OR NOT b
        return alu(Ops.OR, a, logical_not(b, dev))
    return alu(Ops.SUB, a, b)


def div(a: UOp, b: UOp, dev: Device, rounding_mode: str | None = None) -> UOp:
    """True division (float result); rounding_mode 'trunc' or 'floor' keeps ints."""
    if rounding_mode == "trunc":
        return alu(Ops.CDIV, a, b) if dtypes.is_int(a.dtype) else trunc(div(a, b, dev), dev)
    if rounding_mode == "floor":
        return floordiv(a, b, dev)
    if rounding_mode is not None:
        raise TensorValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    ft = _upper_float(a.dtype)
    return alu(Ops.FDIV, cast(a, ft), cast(b, ft))


def idiv(a: UOp, b: UOp, dev: Device) -> UOp:
    return div(a, b, dev, "trunc")


def _sign_differs(r: UOp, b: UOp, dev: Device) -> UOp:
    """r != 0 and r's sign differs from b's: where a truncated quotient/remainder needs the floor adjustment."""
    flip = alu(Ops.CMPNE, scalar_op(Ops.CMPLT, r, dev, 0), scalar_op(Ops.CMPLT, b, dev, 0))
    return alu(Ops.AND, scalar_op(Ops.CMPNE, r, dev, 0), flip)


def floordiv(a: UOp, b: UOp, dev: Device) -> UOp:
    if dtypes.is_int(a.dtype):
        q = alu(Ops.CDIV, a, b)
        return alu(Ops.SUB, q, cast(_sign_differs(alu(Ops.CMOD, a, b), b, dev), q.dtype))
    if a.dtype == dtypes.bool:
        raise TensorTypeError("floor division of bool tensors is not supported")
    return floor(div(a, b, dev), dev)


def _fmod_float(a: UOp, b: UOp, dev: Device) -> UOp:
    # a finite dividend over an infinite divisor is the dividend itself (the quotient formula gives 0 * inf = NaN)
    keep = alu(Ops.AND, isinf(b, dev), isfinite(a, dev))
    return select(keep, a, alu(Ops.SUB, a, alu(Ops.MUL, trunc(div(a, b, dev), dev), b)))


def _no_bool_remainder(a: UOp, name: str) -> None:
    if a.dtype == dtypes.bool:  # (torch refuses it too; numpy's int8 answer is not a bool)
        raise TensorTypeError(f"{name} of bool tensors is not supported: cast them to an int dtype first")


def mod(a: UOp, b: UOp, dev: Device) -> UOp:
    """Python/numpy remainder: the sign of the divisor."""
    _no_bool_remainder(a, "the remainder (%)")
    r = alu(Ops.CMOD, a, b) if dtypes.is_int(a.dtype) else _fmod_float(a, b, dev)
    return select(_sign_differs(r, b, dev), add(r, b, dev), r)


def fmod(a: UOp, b: UOp, dev: Device) -> UOp:
    """C remainder: the sign of the dividend."""
    _no_bool_remainder(a, "fmod")
    return alu(Ops.CMOD, a, b) if dtypes.is_int(a.dtype) else _fmod_float(a, b, dev)


def maximum(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.OR if a.dtype == dtypes.bool else Ops.MAX, a, b)


def minimum(a: UOp, b: UOp, dev: Device) -> UOp:
    if a.dtype == dtypes.bool:
        return alu(Ops.AND, a, b)
    if dtypes.is_int(a.dtype):
        return select(alu(Ops.CMPLT, a, b), a, b)
    return neg(alu(Ops.MAX, neg(a, dev), neg(b, dev)), dev)


# ---------------- comparisons ----------------
def lt(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.CMPLT, a, b)


def gt(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.CMPLT, b, a)


def ge(a: UOp, b: UOp, dev: Device) -> UOp:
    if dtypes.is_float(a.dtype):  # not (a < b) would be True for NaN
        return alu(Ops.OR, alu(Ops.CMPLT, b, a), alu(Ops.CMPEQ, a, b))
    return logical_not(alu(Ops.CMPLT, a, b), dev)


def le(a: UOp, b: UOp, dev: Device) -> UOp:
    if dtypes.is_float(a.dtype):
        return alu(Ops.OR, alu(Ops.CMPLT, a, b), alu(Ops.CMPEQ, a, b))
    return logical_not(alu(Ops.CMPLT, b, a), dev)


def eq(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.CMPEQ, a, b)


def ne(a: UOp, b: UOp, dev: Device) -> UOp:
    return alu(Ops.CMPNE, a, b)


# ---------------- logic and bits ----------------
def _need_int_or_bool(u: UOp, what: str) -> None:
    if not (dtypes.is_int(u.dtype) or u.dtype == dtypes.bool):
        raise TensorTypeError(f"{what} needs an int or bool tensor, got {u.dtype}")


def bitwise_and(a: UOp, b: UOp, dev: Device) -> UOp:
    _need_int_or_bool(a, "bitwise_and")
    return alu(Ops.AND, a, b)


def bitwise_or(a: UOp, b: UOp, dev: Device) -> UOp:
    _need_int_or_bool(a, "bitwise_or")
    return alu(Ops.OR, a, b)


def bitwise_xor(a: UOp, b: UOp, dev: Device) -> UOp:
    _need_int_or_bool(a, "bitwise_xor")
    return alu(Ops.XOR, a, b)


def bitwise_not(u: UOp, dev: Device) -> UOp:
    _need_int_or_bool(u, "bitwise_not")
    if u.dtype == dtypes.bool:
        return logical_not(u, dev)
    a, b, _, _ = promote(u, dev, dtypes.max(u.dtype) if dtypes.is_unsigned(u.dtype) else -1)  # all ones
    return bitwise_xor(a, b, dev)


def logical_not(u: UOp, dev: Device) -> UOp:
    b = u if u.dtype == dtypes.bool else scalar_op(Ops.CMPNE, u, dev, 0)
    return alu(Ops.CMPNE, b, fill(b, True, None if type(dev) is tuple else dev, dtypes.bool))


def shift(op: Ops, x: UOp, xdev: Device, y: UOp | Scalar, ydev: Device) -> tuple[UOp, Device]:
    """x << y (op SHL) or x >> y (SHR) in x's int dtype, with the result's device."""
    if not dtypes.is_int(x.dtype):
        raise TensorTypeError(f"{'lshift' if op is Ops.SHL else 'rshift'} needs an int tensor, got {x.dtype}")
    ydt = y.dtype if hasattr(y, "dtype") else dtypes.from_py(y)
    if not (dtypes.is_int(ydt) or ydt == dtypes.bool):  # (a float amount was cast to int: 1.5 shifted by 1)
        raise TensorTypeError(f"{'lshift' if op is Ops.SHL else 'rshift'} needs an int shift amount, got {ydt}; "
                              "cast it to an int dtype first")  # fmt: skip
    a, b, adev, _ = promote(x, xdev, y, ydev, match_dtype=False)
    return alu(op, a, cast(b, a.dtype)), adev


# ---------------- unary primitives ----------------
_STRONG = frozenset(dtypes.all)
# the binary ops that are one ALU node `UOp(op, dtype, (a, b))` over two operands of one shape and one strong dtype of
# those listed (`dtype`: theirs, or bool for a comparison); Tensor._binary makes that node itself (ONE_NODE's, and
# subtraction and maximum but of bools, true division of floats, the one-node comparisons)
DIRECT_NODE: dict[Any, tuple[Ops, DType | None, frozenset[DType]]] = {
    **{fn: (op, None, _STRONG) for fn, op in ONE_NODE.items()},
    sub: (Ops.SUB, None, _STRONG - {dtypes.bool}),
    maximum: (Ops.MAX, None, _STRONG - {dtypes.bool}),
    div: (Ops.FDIV, None, frozenset(dtypes.floats)),
    lt: (Ops.CMPLT, dtypes.bool, _STRONG),
    eq: (Ops.CMPEQ, dtypes.bool, _STRONG),
    ne: (Ops.CMPNE, dtypes.bool, _STRONG),
}


def neg(u: UOp, dev: Device) -> UOp:
    return logical_not(u, dev) if u.dtype == dtypes.bool else alu(Ops.NEG, u)


def reciprocal(u: UOp, dev: Device) -> UOp:
    return alu(Ops.RECIPROCAL, to_float(u))


def sqrt(u: UOp, dev: Device) -> UOp:
    return alu(Ops.SQRT, to_float(u))


def exp2(u: UOp, dev: Device) -> UOp:
    return alu(Ops.EXP2, to_float(u))


def log2(u: UOp, dev: Device) -> UOp:
    return alu(Ops.LOG2, to_float(u))


def trunc(u: UOp, dev: Device) -> UOp:
    return alu(Ops.TRUNC, u) if dtypes.is_float(u.dtype) else u


def floor(u: UOp, dev: Device) -> UOp:
    if not dtypes.is_float(u.dtype):
        return u
    t = trunc(u, dev)
    return select(alu(Ops.CMPLT, u, t), scalar_op(Ops.SUB, t, dev, 1), t)


def ceil(u: UOp, dev: Device) -> UOp:
    if not dtypes.is_float(u.dtype):
        return u
    t = trunc(u, dev)
    return select(alu(Ops.CMPLT, t, u), scalar_op(Ops.ADD, t, dev, 1), t)


def isnan(u: UOp, dev: Device) -> UOp:
    return alu(Ops.CMPNE, u, u) if dtypes.is_float(u.dtype) else fill(u, False, dev, dtypes.bool)


def isinf(u: UOp, dev: Device, detect_positive: bool = True, detect_negative: bool = True) -> UOp:
    if not dtypes.is_float(u.dtype):
        return fill(u, False, dev, dtypes.bool)
    pos = scalar_op(Ops.CMPEQ, u, dev, math.inf) if detect_positive else fill(u, False, dev, dtypes.bool)
    neg_ = scalar_op(Ops.CMPEQ, u, dev, -math.inf) if detect_negative else fill(u, False, dev, dtypes.bool)
    return alu(Ops.OR, pos, neg_)


def isfinite(u: UOp, dev: Device) -> UOp:
    return logical_not(alu(Ops.OR, isinf(u, dev), isnan(u, dev)), dev)


def _tanh_gradient(out: Tensor, x: Tensor) -> None:
    """tanh differentiates as 1 - t^2: its derivative is 1 at x = 0, where walking the graph (built on |x|, whose
    derivative there is 0) would stop the gradient of a zero pre-activation, and one multiply-add is a shorter
    backward than the graph's (an LSTM's backward stays linear in its steps)."""
    node_ref = weakref.ref(out.uop)  # the override table is keyed weakly on the node: don't keep it alive

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        t = node_ref()
        assert t is not None, "the tanh node is alive while its gradient is computed"
        return (g * (const_like(t, 1) - t * t),)

    override_gradient(out.uop, (x.uop,), rule)


def _sigmoid_gradient(out: Tensor, x: Tensor) -> None:
    """sigmoid differentiates as s * (1 - s). Walking 1 / (1 + exp(-x)) instead multiplies exp(-x) = inf by a zero
    gradient (NaN) once x < -88, and tanh and the losses built on sigmoid inherit that NaN."""
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
# float64 sin: the SIN op's own (Cody-Waite) reduction is accurate up to here; beyond, precise.quarter_turns64
_SIN64_DIRECT = 6e6
# Taylor coefficients (lowest degree first, after the leading x) of asin and erf / (2 / sqrt(pi)) in x^2
_ASIN_SERIES = [1 / 6, 3 / 40, 5 / 112, 35 / 1152, 63 / 2816]
_ERF_SERIES = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(1, 9)]


def _poly(x: Tensor, coeffs: list[float]) -> Tensor:
    """sum(c_k * x^(k+1)) for k = 0, 1, ...: the series' terms after the first, by Horner."""
    out = x * coeffs[-1]
    for c in reversed(coeffs[:-1]):
        out = (out + c) * x
    return out


class ElementwiseMixin:
    """The elementwise math of Tensor composed from its primitives (see the module docstring)."""

    __slots__ = ()

    # ---------------- unary math ----------------
    def _literal_float(self: Tensor) -> Tensor:
        """self in float, as float-literal arithmetic makes it: a concrete int/bool tensor becomes weakfloat (TENSOR_API
        3.3: tinygrad's sigmoid/tanh/gelu of an int tensor are weakfloat; reads give the default float)."""
        return self if dtypes.is_float(self.dtype) else self.cast(dtypes.weakfloat)

    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    def exp(self: Tensor) -> Tensor:
        x = self._float()
        if x.dtype.itemsize < 4:  # half/bf16/fp8: x / ln2 rounded to 11 bits would cost ~|x| * 2**-11 relative error
            return x.float().exp().cast(x.dtype)
        return (x * (1 / math.log(2)))._alu(Ops.EXP2)

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
        float64: the SIN op's own reduction where it is accurate (|x| <= 6e6), else Payne-Hanek reduction first
        (`precise.quarter_turns64`: sin(1e20) is sin(1e20), not 1e31)."""
        x = self._float()
        if x.dtype != dtypes.float64:
            return x._turns_sin(0).cast(x.dtype)
        near = x.abs() <= _SIN64_DIRECT
        # (each branch fed only its own inputs, a filler elsewhere: the other's derivative may be inf there)
        direct, far = near.where(x, 0.0), near.where(_SIN64_DIRECT, x)
        return near.where(direct._alu(Ops.SIN), (quarter_turns64(far) * (math.pi / 2))._alu(Ops.SIN))

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
        # error < 2e-8, which would be all of asin(1e-8)); odd symmetry restores the sign. float64: precise.asin64
        x = self._float()
        if x.dtype == dtypes.float64:
            return asin64(x)
        a = odd_abs(x)
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
        out = (x < 0).where(-r, r)
        _tanh_gradient(out, x)
        return out

    def asinh(self: Tensor) -> Tensor:
        x = self._float()
        a = odd_abs(x)
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
        # < 1.5e-7, which would be all of erf(1e-8)). float64: precise.erf64
        x = self._float()
        if x.dtype == dtypes.float64:
            return erf64(x)
        a = odd_abs(x)
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

    def isclose(self: Tensor, other: TensorOrScalar, rtol: float = 1e-5, atol: float = 1e-8,
                equal_nan: bool = False) -> Tensor:  # fmt: skip
        equal_nan = flag("isclose", "equal_nan", equal_nan)
        a, b = self._broadcasted(other)
        if not dtypes.is_float(a.dtype):
            # ints compare in float, as numpy does: their difference would wrap (uint8 3 - 5 is 254)
            f = dtypes.float64 if a.dtype.itemsize == 8 else dtypes.float32
            a, b = a.cast(f), b.cast(f)
            return (a == b) | ((a - b).abs() <= atol + rtol * b.abs())
        close = (a == b) | ((a - b).abs() <= atol + rtol * b.abs())
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
        if dtypes.is_int(self.dtype) and not self.dtype.is_weak:
            # an int bound beyond the dtype's range clips nothing (numpy: uint8 clip(-1, 1) is [0, 1]), where
            # maximum(-1) would refuse -1 as a uint8 literal
            if type(min_) is int and min_ < dtypes.min(self.dtype):
                min_ = None
            if type(max_) is int and max_ > dtypes.max(self.dtype):
                max_ = None
        out = self
        if min_ is not None:
            out = out.maximum(min_)
        if max_ is not None:
            out = out.minimum(max_)
        return out

    def clamp(self: Tensor, min_: TensorOrScalar | None = None, max_: TensorOrScalar | None = None) -> Tensor:
        return self.clip(min_, max_)

    def lerp(self: Tensor, end: TensorOrScalar, weight: TensorOrScalar) -> Tensor:
        Tensor = type(self)
        if self.dtype == dtypes.uint8 and isinstance(weight, Tensor):
            # images: fixed point with a 7-bit weight in int16, rounded to nearest (uint8 arithmetic would wrap)
            w = (weight * (1 << _LERP_BITS) + 0.5).cast(dtypes.int16)
            a = self.cast(dtypes.int16)
            step = (Tensor(end, dtype=dtypes.int16) if not isinstance(end, Tensor) else end.cast(dtypes.int16)) - a
            return (a + ((step * w + (1 << (_LERP_BITS - 1))) >> _LERP_BITS)).cast(dtypes.uint8)
        ends_int = not (isinstance(end, float) or isinstance(end, Tensor) and dtypes.is_float(end.dtype))
        frac = isinstance(weight, float) or isinstance(weight, Tensor) and dtypes.is_float(weight.dtype)
        if frac and ends_int and not dtypes.is_float(self.dtype):
            # int ends with a fractional weight: the int difference would wrap (uint8 100 - 200 is 156, and
            # 200 + 156 * 0.5 is 278), so it is taken in float; the result's dtype is the same join as before
            start = self.cast(dtypes.weakfloat)
            return start + (end - start) * weight
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
        reverse = reverse if reverse is False or reverse is True else flag("pow", "reverse", reverse)
        if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool):
            if isinstance(y, int) and y < 0 and (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool):
                raise TensorTypeError(f"{self.dtype} ** {y}: a negative int exponent needs a float base; cast first")
            if isinstance(y, float) and (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool):
                # a float literal makes the int base weakfloat, whatever its value (int_t * 0.5 does the same)
                return self.cast(dtypes.weakfloat).pow(y)
            if isinstance(y, int) or float(y).is_integer():
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
        if type(approximate) is not str:  # (an array compared to "none" was numpy's "truth value ... ambiguous")
            raise TensorTypeError(f"gelu: approximate must be 'tanh' or 'none', got {type(approximate).__name__}")
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
        beta = real("softplus", "beta", beta)
        if beta == 0 or beta != beta:  # (was Python's bare "division by zero")
            raise TensorValueError(f"softplus: beta must be a nonzero number (it divides), got {beta!r}")
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

    # (x's node, not a tensor: a rule holding out, or x once x.grad reads out's node, would keep that node, the
    # override table's weak key, alive for good; and x may be assigned a new value before backward)
    cls, xu = type(x), x.uop

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        xt = cls(xu)
        return ((xt > 0).where(xt._new(g), 0.0).uop,)

    override_gradient(out.uop, (x.uop,), rule)


def _pow_gradient(out: Tensor, b: Tensor, e: Tensor) -> None:
    """x ** y differentiates as y * x ** (y - 1) (0 where y == 0) and x ** y * ln(x) (0 where x == 0), not through
    the exp2/log2 graph computing it, which gives NaN at x == 0."""

    node_ref = weakref.ref(out.uop)  # the override table is keyed weakly on the node: don't keep it alive
    cls, bu, eu = type(b), b.uop, e.uop  # (nodes, not tensors: see _relu_gradient)

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        node = node_ref()
        assert node is not None, "the pow node is alive while its gradient is computed"
        bt, et = cls(bu), cls(eu)
        gt, o = bt._new(g), bt._new(node)
        dx = (et == 0).where(0.0, gt * et * bt._pow_float(et - 1))
        dy = (bt == 0).where(0.0, gt * o * bt.log())
        return dx.uop, dy.uop

    override_gradient(out.uop, (b.uop, e.uop), rule)
