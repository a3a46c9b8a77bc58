"""Weak (Python-literal) dtypes in tensor graphs: `Tensor(3)` is weakint, `int_t * 0.5` weakfloat. A weak node has no
storage width; it takes the dtype of what it meets. This module turns weak graphs concrete:

* `retype(u, dt)` rebuilds the weak top of u's graph at dt: weak constants become dt constants, weak ALU and movement
  nodes compute in dt, `CAST(weak, x)` becomes `CAST(dt, x)`. A weak part of another kind than dt (int literal math
  feeding a float, `(bool_t + 1) * 0.5`; a weakfloat cast to an int) is computed in its own kind first, then cast.
  Strong nodes below are kept as they are.
* `materialized(u)` is the dtype a weak graph is read at: the default float for weakfloat; the default int for
  weakint unless one of its literals does not fit (then int64: `Tensor(2**40)` reads as int64, never wrapped).
* `check_fits(v, dt)`: a Python int joining an int tensor must fit its dtype (`int8_t + 200`, `int32_t + 2**40`
  raise OverflowError instead of wrapping; an explicit `cast()` wraps, as casts do).

Invariant the tensor frontend keeps: a strong node never has a weak source (casts, comparisons and reductions of
weak operands retype them first), so the scheduler never sees weak dtypes."""

from __future__ import annotations

from speck.tensor.errors import TensorOverflowError
from speck.uop import ConstType, DType, GroupOp, Ops, UOp, dtypes, exec_alu
from speck.uop.dtype import WEAK_DTYPES, cast_value

# nodes a weak graph is rebuilt through (the value flows through src[0..]); anything else (a bound Variable, an
# index marker) is cast instead
_REBUILD = GroupOp.ALU | GroupOp.Movement | {Ops.DETACH, Ops.CONTIGUOUS}


def is_weak(dt: DType) -> bool:
    return dt in WEAK_DTYPES


def check_fits(v: ConstType, dt: DType) -> None:
    """OverflowError unless the Python int v (a literal meeting a dt tensor) is a value of int dtype dt."""
    if dtypes.is_int(dt) and not dt.is_weak and not isinstance(v, bool) and isinstance(v, int):
        lo, hi = dtypes.min(dt), dtypes.max(dt)
        if not lo <= v <= hi:
            raise TensorOverflowError(
                f"Python int {v} doesn't fit {dt} [{lo}, {hi}]; it would wrap to a different value. Cast the tensor "
                f"to a wider dtype first (e.g. .cast(dtypes.int64)), or cast the literal explicitly"
            )


def _weak_consts(u: UOp) -> list[ConstType]:
    """The literal values in the weak top of u's graph."""
    out, stack, seen = [], [u], set()
    while stack:
        n = stack.pop()
        if n in seen or not is_weak(n.dtype):
            continue
        seen.add(n)
        if n.op is Ops.CONST:
            out.append(n.arg)
        stack.extend(n.src)
    return out


def materialized(u: UOp) -> DType:
    """The concrete dtype the weak graph u is read (or stored) at."""
    if u.dtype is dtypes.weakfloat:
        return dtypes.default_float
    dt = dtypes.default_int
    for v in _weak_consts(u):
        if isinstance(v, int) and not dtypes.min(dt) <= v <= dtypes.max(dt):
            check_fits(v, dtypes.int64)
            dt = dtypes.int64
    return dt


def retype(u: UOp, dt: DType, implicit: bool = True) -> UOp:
    """u's graph with its weak nodes computed in the concrete dtype dt (see the module docstring). `implicit`: the
    retype is a dtype join, so int literals must fit dt (an explicit cast wraps them instead)."""
    memo: dict[tuple[UOp, DType], UOp] = {}

    def go(n: UOp, to: DType) -> UOp:
        if not is_weak(n.dtype):
            return n
        if (hit := memo.get((n, to))) is not None:
            return hit
        if not (dtypes.is_float(to) if n.dtype is dtypes.weakfloat else dtypes.is_int(to)):
            # another kind (an explicit float -> int cast, or int literal math meeting a float): computed in its own
            # kind first (floor division and bit ops stay int ops, fractions stay), then cast
            out = go(n, materialized(n)).cast(to)
        elif n.op is Ops.CONST:
            if implicit:
                check_fits(n.arg, to)
            out = UOp(Ops.CONST, to, n.src, cast_value(n.arg, to))
        elif n.op is Ops.CAST:
            src = n.src[0]
            out = go(src, to) if is_weak(src.dtype) else src.cast(to)
        elif n.op in _REBUILD:
            out = UOp(n.op, to, tuple(go(s, to) for s in n.src), n.arg, n.tag)
        else:
            out = n.cast(to)
        memo[(n, to)] = out
        return out

    return go(u, dt)


def fold(op: Ops, dt: DType, srcs: tuple[UOp, ...]) -> UOp | None:
    """op on weak constants, computed exactly in Python (so `Tensor(2**31) * 4` is a literal 2**33, which then reads
    as int64); None unless every source is a 0-d CONST."""
    if not all(s.op is Ops.CONST for s in srcs):
        return None

    return UOp(Ops.CONST, dt, srcs[0].src, exec_alu(op, dt, [s.arg for s in srcs]))
