"""Value bounds of a UOp (`UOp.vmin`/`UOp.vmax`): an exact interval per node, computed bottom-up over the graph once
and cached on the node. The symbolic rules decide comparisons and drop redundant arithmetic from them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from speck.uop.dtype import DType, InvalidType, PtrDType, cast_value, dtypes
from speck.uop.helpers import cdiv
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)
from speck.uop.ops import GroupOp


class Node(Protocol):
    """A node as the bounds read it (`speck.uop.uop.UOp` is one), named by its shape so that this module, which the
    node calls, does not import it back."""

    _bounds: tuple[Any, Any] | None

    @property
    def op(self) -> Ops: ...
    @property
    def dtype(self) -> DType: ...
    @property
    def arg(self) -> Any: ...
    @property
    def src(self) -> tuple[Node, ...]: ...
    @property
    def vmin(self) -> Any: ...
    @property
    def vmax(self) -> Any: ...
    def toposort(self, gate: Callable[[Node], bool] | None = None) -> Sequence[Node]: ...


_DT_BOUNDS: dict[DType, tuple[Any, Any]] = {}


def _dt_bounds(dt: DType) -> tuple[Any, Any]:
    b = _DT_BOUNDS.get(dt)
    if b is None:
        b = _DT_BOUNDS[dt] = (dtypes.min(dt), dtypes.max(dt))
    return b


def _combine(op: Ops, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any] | None:
    (a0, a1), (b0, b1) = a, b
    if op is Ops.ADD:
        return a0 + b0, a1 + b1
    if op is Ops.MUL:
        vals = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
        if any(isinstance(v, float) and math.isnan(v) for v in vals):
            return None
        return min(vals), max(vals)
    if op is Ops.MAX:
        return max(a0, b0), max(a1, b1)
    return None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, bool)) or (isinstance(x, float) and math.isfinite(x))


def _compute_bounds(u: Node) -> tuple[Any, Any]:
    """Bounds of every node below u that lacks them, bottom-up with an explicit stack."""
    for s in u.src:
        if s._bounds is None:
            # a fresh source (typically a new CONST made by a rule) whose own sources are known: compute it directly
            if s.src and any(t._bounds is None for t in s.src):
                break
            object.__setattr__(s, "_bounds", _bounds_of(s))
    else:  # the common case during rewrites: the sources already know their bounds
        b = _bounds_of(u)
        object.__setattr__(u, "_bounds", b)
        return b
    for n in u.toposort(gate=lambda x: x._bounds is None):
        if n._bounds is None:
            object.__setattr__(n, "_bounds", _bounds_of(n))
    return u._bounds  # type: ignore[return-value]


def _clamp(dt: DType, lo: Any, hi: Any) -> tuple[Any, Any]:
    """Bounds that leave the dtype's range mean the value may wrap: fall back to the dtype's full range."""
    dlo, dhi = _dt_bounds(dt)
    if dt.is_weak or dtypes.is_float(dt):
        return lo, hi
    if lo < dlo or hi > dhi:
        return dlo, dhi
    return lo, hi


# scalar int dtype -> its (min, max) for wrap detection, None for weakint (never wraps)
_INT_RANGE: dict[DType, tuple[int, int] | None] = {
    d: (None if d is dtypes.weakint else (int(dtypes.min(d)), int(dtypes.max(d))))
    for d in (dtypes.weakint, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
              dtypes.int64, dtypes.uint64)
}  # fmt: skip
_CMP = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})


def _int_bounds(u: Node, rng: tuple[int, int] | None) -> tuple[Any, Any] | None:
    """Bounds of the common scalar-int ops over int source bounds, without generic dispatch (the hot path of every
    rewrite). None falls back to the general rules."""
    op, src = u.op, u.src
    if op is Ops.CONST:
        return None
    if op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if len(src) == 2:
        a0, a1 = src[0]._bounds  # type: ignore[misc]
        b0, b1 = src[1]._bounds  # type: ignore[misc]
        if type(a0) is not int or type(a1) is not int or type(b0) is not int or type(b1) is not int:
            return None
        if op is Ops.ADD:
            lo, hi = a0 + b0, a1 + b1
        elif op is Ops.MUL:
            if a0 >= 0 and b0 >= 0:
                lo, hi = a0 * b0, a1 * b1
            else:
                v0, v1, v2, v3 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
                lo, hi = min(v0, v1, v2, v3), max(v0, v1, v2, v3)
        elif op is Ops.CDIV:
            if b0 == b1 and b0 > 0:
                lo = a0 // b0 if a0 >= 0 else -(-a0 // b0)
                hi = a1 // b0 if a1 >= 0 else -(-a1 // b0)
            else:
                return None
        elif op is Ops.CMOD:
            if b0 == b1 and b0 > 0 and a0 >= 0:
                if a1 < b0:
                    return a0, a1
                if a0 // b0 == a1 // b0:
                    return a0 % b0, a1 % b0
                return 0, min(b0 - 1, a1)
            return None
        elif op is Ops.MAX:
            lo, hi = (a0 if a0 > b0 else b0), (a1 if a1 > b1 else b1)
        elif op is Ops.SUB:
            lo, hi = a0 - b1, a1 - b0
        else:
            return None
        if rng is not None and (lo < rng[0] or hi > rng[1]):
            return rng
        return lo, hi
    if op is Ops.WHERE:
        a0, a1 = src[1]._bounds  # type: ignore[misc]
        b0, b1 = src[2]._bounds  # type: ignore[misc]
        if type(a0) is not int or type(a1) is not int or type(b0) is not int or type(b1) is not int:
            return None
        return (a0 if a0 < b0 else b0), (a1 if a1 > b1 else b1)
    return None


def _cmp_bounds(u: Node) -> tuple[Any, Any] | None:
    a0, a1 = u.src[0]._bounds  # type: ignore[misc]
    b0, b1 = u.src[1]._bounds  # type: ignore[misc]
    if type(a0) is not int or type(a1) is not int or type(b0) is not int or type(b1) is not int:
        return None
    op = u.op
    if op is Ops.CMPLT:
        if a1 < b0:
            return True, True
        if a0 >= b1:
            return False, False
    elif a1 < b0 or b1 < a0:
        return (True, True) if op is Ops.CMPNE else (False, False)
    elif a0 == a1 == b0 == b1:
        return (False, False) if op is Ops.CMPNE else (True, True)
    return False, True


def _bounds_of(u: Node) -> tuple[Any, Any]:
    dt, op = u.dtype, u.op
    if dt in _INT_RANGE:
        r = _int_bounds(u, _INT_RANGE[dt])
        if r is not None:
            return r
    elif op in _CMP and u.src[0].dtype in _INT_RANGE:
        for s in u.src:
            if s._bounds is None:
                _compute_bounds(s)
        r = _cmp_bounds(u)
        if r is not None:
            return r
    if isinstance(dt, PtrDType):
        return (-math.inf, math.inf)
    full = _dt_bounds(dt)
    if op is Ops.CONST:
        return (u.arg, u.arg) if not isinstance(u.arg, InvalidType) else full
    if op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if op is Ops.BIND:  # the variable's range: the bound value may change (TinyJit replays) and must not fold
        return u.src[0].vmin, u.src[0].vmax
    if op in (Ops.RANGE, Ops.SPECIAL):
        return 0, u.src[0].vmax - 1
    if op is Ops.STACK:
        return min(s.vmin for s in u.src), max(s.vmax for s in u.src)
    if op is Ops.GEP:
        return u.src[0].vmin, u.src[0].vmax
    if op is Ops.CAST:
        s = u.src[0]
        if dtypes.is_int(dt) or dt.scalar() == dtypes.bool:
            lo, hi = s.vmin, s.vmax
            if _finite(lo) and _finite(hi):
                lo, hi = cast_value(lo, dt), cast_value(hi, dt)
                if isinstance(lo, (int, bool)) and lo <= hi and _range_fits(s, dt):
                    return lo, hi
            return full
        if dtypes.is_float(dt) and s.dtype.scalar() != dtypes.bool and (dtypes.is_int(s.dtype)):
            return float(s.vmin), float(s.vmax)
        return full
    if len(u.src) >= 1 and any(isinstance(s.dtype, PtrDType) for s in u.src):
        return full
    if op in GroupOp.Comparison:
        (a0, a1), (b0, b1) = (u.src[0].vmin, u.src[0].vmax), (u.src[1].vmin, u.src[1].vmax)
        if op is Ops.CMPLT:
            if a1 < b0:
                return True, True
            if a0 >= b1:
                return False, False
        elif op is Ops.CMPNE:
            if a1 < b0 or b1 < a0:
                return True, True
            if a0 == a1 == b0 == b1:
                return False, False
        elif op is Ops.CMPEQ:
            if a1 < b0 or b1 < a0:
                return False, False
            if a0 == a1 == b0 == b1:
                return True, True
        return False, True
    if not (dtypes.is_int(dt) or dt.scalar() == dtypes.bool):
        if op in (Ops.ADD, Ops.MUL, Ops.MAX) and dtypes.is_float(dt):
            r = _combine(op, (u.src[0].vmin, u.src[0].vmax), (u.src[1].vmin, u.src[1].vmax))
            return r if r is not None else full
        if op is Ops.WHERE:
            return min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax)
        if op is Ops.SQRT and u.src[0].vmin >= 0:
            return 0.0, math.inf
        if op is Ops.EXP2:
            return 0.0, math.inf
        return full
    if op is Ops.WHERE:
        return _clamp(dt, min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax))
    srcb = [(s.vmin, s.vmax) for s in u.src]
    if any(not (_finite(lo) and _finite(hi)) for lo, hi in srcb):
        return full
    if op in (Ops.ADD, Ops.MUL, Ops.MAX):
        r = _combine(op, srcb[0], srcb[1])
        return _clamp(dt, *r) if r is not None else full
    if op is Ops.SUB:
        return _clamp(dt, srcb[0][0] - srcb[1][1], srcb[0][1] - srcb[1][0])
    if op is Ops.NEG:
        return _clamp(dt, -srcb[0][1], -srcb[0][0])
    if op is Ops.CDIV:
        (a0, a1), (b0, b1) = srcb
        if b0 > 0 or b1 < 0:
            vals = [cdiv(a, b) for a in (a0, a1) for b in (b0, b1)]
            return _clamp(dt, min(vals), max(vals))
        return full
    if op is Ops.CMOD:
        (a0, a1), (b0, b1) = srcb
        if b0 > 0 or b1 < 0:
            m = max(abs(b0), abs(b1)) - 1
            if a0 >= 0:
                return (a0, a1) if a1 <= m and b0 == b1 and cdiv(a0, b0) == cdiv(a1, b0) else (0, min(m, a1))
            if a1 <= 0:
                return max(-m, a0), 0
            return max(-m, a0), min(m, a1)
        return full
    if op is Ops.AND and dt.scalar() == dtypes.bool:
        return srcb[0][0] and srcb[1][0], srcb[0][1] and srcb[1][1]
    if op is Ops.OR and dt.scalar() == dtypes.bool:
        return srcb[0][0] or srcb[1][0], srcb[0][1] or srcb[1][1]
    if op is Ops.XOR and dt.scalar() == dtypes.bool:
        return full
    if op is Ops.AND and srcb[0][0] >= 0 and srcb[1][0] >= 0:
        return 0, min(srcb[0][1], srcb[1][1])
    if op is Ops.OR and srcb[0][0] >= 0 and srcb[1][0] >= 0:
        hi = max(srcb[0][1], srcb[1][1])
        return max(srcb[0][0], srcb[1][0]), _clamp(dt, 0, (1 << int(hi).bit_length()) - 1)[1]
    if op is Ops.SHL and srcb[0][0] >= 0 and srcb[1][0] >= 0 and srcb[1][1] < 64:
        return _clamp(dt, srcb[0][0] << srcb[1][0], srcb[0][1] << srcb[1][1])
    if op is Ops.SHR and srcb[0][0] >= 0 and srcb[1][0] >= 0:
        return srcb[0][0] >> srcb[1][1], srcb[0][1] >> srcb[1][0]
    return full


def _range_fits(s: Node, dt: DType) -> bool:
    """A cast of s to int dtype dt is monotonic over s's bounds (no wrap inside the range)."""
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    return bool(lo <= s.vmin and s.vmax <= hi)
