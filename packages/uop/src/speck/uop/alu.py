"""Exact evaluation of ALU ops on Python values, with each dtype's fixed-width semantics (used by constant folding,
bounds and the reference interpreters). Independent of UOp graphs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from speck.uop.dtype import DType, Invalid, InvalidType, bitcast, dtypes, truncate
from speck.uop.helpers import cdiv, cmod
from speck.uop.ops import GroupOp, Ops


def _safe_shift(a: int, b: int, left: bool, dt: DType) -> Any:
    bits = 8 * dt.itemsize if not dt.is_weak else 64
    if b < 0 or b >= bits:
        return 0 if left or a >= 0 else -1
    return a << b if left else a >> b


def _fdiv(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _log2(a: float) -> float:
    if math.isnan(a) or a < 0:
        return math.nan
    if a == 0:
        return -math.inf
    if math.isinf(a):
        return math.inf
    return math.log2(a)


def _exp2(a: float) -> float:
    try:
        return float(2.0**a)
    except OverflowError:
        return math.inf


def _sin(a: float) -> float:
    return math.nan if math.isinf(a) or math.isnan(a) else math.sin(a)


def _sqrt(a: float) -> float:
    return math.nan if math.isnan(a) or a < 0 else math.sqrt(a)


def _recip(a: float) -> float:
    return _fdiv(1.0, a)


def _pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return a**b if b >= 0 else (0 if abs(a) != 1 else a**b)
    try:
        r = float(a) ** float(b)
        return r if not isinstance(r, complex) else math.nan
    except OverflowError:
        return math.inf
    except ZeroDivisionError:
        return math.inf


def _trunc(a: Any) -> Any:
    return a if isinstance(a, int) or math.isinf(a) or math.isnan(a) else float(math.trunc(a))


def _max(a: Any, b: Any) -> Any:
    if isinstance(a, float) and math.isnan(a):
        return a
    if isinstance(b, float) and math.isnan(b):
        return b
    return max(a, b)


python_alu: dict[Ops, Callable[..., Any]] = {
    Ops.EXP2: _exp2,
    Ops.LOG2: _log2,
    Ops.SIN: _sin,
    Ops.SQRT: _sqrt,
    Ops.RECIPROCAL: _recip,
    Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
    Ops.TRUNC: _trunc,
    Ops.ADD: lambda a, b: a + b,
    Ops.SUB: lambda a, b: a - b,
    Ops.MUL: lambda a, b: a * b,
    Ops.FDIV: _fdiv,
    Ops.CDIV: lambda a, b: cdiv(int(a), int(b)) if b != 0 else 0,
    Ops.CMOD: lambda a, b: cmod(int(a), int(b)) if b != 0 else 0,
    Ops.MAX: _max,
    Ops.POW: _pow,
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.CMPEQ: lambda a, b: a == b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.OR: lambda a, b: a | b,
    Ops.AND: lambda a, b: a & b,
    Ops.WHERE: lambda c, a, b: a if c else b,
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def exec_alu(op: Ops, dtype: DType, operands: Sequence[Any]) -> Any:
    """Evaluate ALU op on Python values with dtype's exact semantics: fixed-width ints wrap, floats round once at
    their own width, Invalid poisons. Integer division/modulo by zero fold to 0 (undefined behaviour in C).

    `dtype` is the result dtype; operands are already values of the source dtype."""
    if dtype is dtypes.weakint and len(operands) == 2:
        a, b = operands
        if type(a) is int and type(b) is int:  # exact index arithmetic: no width, no rounding
            if op is Ops.ADD:
                return a + b
            if op is Ops.MUL:
                return a * b
    if any(isinstance(x, InvalidType) for x in operands):
        if op is Ops.WHERE and not isinstance(operands[0], InvalidType):
            return operands[1] if operands[0] else operands[2]
        return Invalid
    if dtype.count > 1:
        return tuple(exec_alu(op, dtype.scalar(), [x[i] if isinstance(x, tuple) else x for x in operands])
                     for i in range(dtype.count))  # fmt: skip
    src_dt = dtype
    if op in (Ops.SHL, Ops.SHR):
        return truncate[dtype.scalar()](_safe_shift(int(operands[0]), int(operands[1]), op is Ops.SHL, dtype))
    if op is Ops.THREEFRY:
        return threefry2x32(int(operands[0]), int(operands[1]))
    if dtypes.is_float(src_dt) and op not in GroupOp.Comparison:
        operands = [float(x) if not isinstance(x, bool) or op is not Ops.WHERE else x for x in operands]
        if op is Ops.WHERE:
            operands = [operands[0], float(operands[1]), float(operands[2])]
    ret = python_alu[op](*operands)
    if op in GroupOp.Comparison:
        return bool(ret)
    return truncate[dtype.scalar()](ret)


# Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): the rotation
# amounts of the two alternating groups of four rounds, and the key schedule's parity constant
THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
THREEFRY_PARITY = 0x1BD11BDA


def threefry_rounds(x0: Any, x1: Any, k0: Any, k1: Any, rotl: Callable[[Any, int], Any],
                    wrap: Callable[[Any], Any]) -> tuple[Any, Any]:  # fmt: skip
    """The one definition of Threefry-2x32-20 on 32-bit words: counter (x0, x1) and key (k0, k1) -> (y0, y1).

    Written once for every kind of word: Python ints (wrap masks to 32 bits), numpy uint32 arrays and uint32 UOps
    (their arithmetic wraps by itself: wrap is the identity). rotl(v, r) rotates a word left by r bits."""
    ks = (k0, k1, k0 ^ k1 ^ THREEFRY_PARITY)
    x0, x1 = wrap(x0 + ks[0]), wrap(x1 + ks[1])
    for i in range(5):
        for r in THREEFRY_ROTATIONS[i % 2]:
            x0 = wrap(x0 + x1)
            x1 = rotl(x1, r) ^ x0
        x0 = wrap(x0 + ks[(i + 1) % 3])
        x1 = wrap(x1 + ks[(i + 2) % 3] + (i + 1))
    return x0, x1


def threefry2x32(x: int, key: int) -> int:
    """Threefry-2x32-20 of a 64-bit counter x under a 64-bit key -> 64 random bits (low words first), the meaning of
    Ops.THREEFRY."""
    m = 0xFFFFFFFF
    y0, y1 = threefry_rounds(x & m, (x >> 32) & m, key & m, (key >> 32) & m,
                             lambda v, r: ((v << r) | (v >> (32 - r))) & m, lambda v: v & m)  # fmt: skip
    return int((y1 << 32) | y0)


def fold_bitcast(v: Any, from_dt: DType, to_dt: DType) -> Any:
    """Value of BITCAST(to_dt, CONST(v, from_dt))."""
    return bitcast(v, from_dt, to_dt)
