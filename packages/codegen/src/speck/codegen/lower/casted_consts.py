"""Casted consts (IR.md): every literal of a program is `CAST(dt, CONST(v, from_py(v)))`; vector literals are STACKs
of casted consts. Run with walk=True so the new inner CONST is never rewritten again."""

from __future__ import annotations

from speck.uop import InvalidType, Ops, PatternMatcher, UOp, UPat, dtypes


def _cast_const(c: UOp) -> UOp | None:
    if c.dtype.is_weak or isinstance(c.arg, InvalidType):
        return None
    if c.dtype.count > 1:
        return UOp.stack(*[UOp.cconst(c.arg, c.dtype.scalar())] * c.dtype.count)
    return UOp.cconst(c.arg, c.dtype)


def _is_cast_const(x: UOp) -> bool:
    return x.op is Ops.CAST and x.src[0].op is Ops.CONST and x.src[0].dtype == dtypes.from_py(x.src[0].arg)


pm_casted_consts = PatternMatcher([(UPat(Ops.CONST, name="c"), _cast_const)])
_ = _is_cast_const
