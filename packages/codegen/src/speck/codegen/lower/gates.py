"""Explicit gates: the `Invalid` of gated indexing becomes a third INDEX source (a bool gate), and every gated LOAD
gets its alternative value as a second source, so renderers never see Invalid.

    INDEX(buf, WHERE(c, idx, Invalid))  ->  INDEX(buf, idx, c)
    LOAD(INDEX(buf, idx, c))            ->  LOAD(INDEX(buf, idx, c), 0)
    STORE(INDEX(buf, Invalid), v)       ->  nothing (an empty GROUP: a lane whose gate folded to false)
ALU ops on a gated index are pushed inside the WHERE first (Invalid poisons every ALU result)."""

from __future__ import annotations

from speck.uop import GroupOp, InvalidType, PatternMatcher, UOp, UPat, dtypes
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_INVALID_CONST = UPat(Ops.CONST, name="inv", arg=None)


def _is_invalid(u: UOp) -> bool:
    return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


def and_gate(index: UOp, cond: UOp) -> UOp:
    """An index expression valid only where `cond` also holds: `index.valid(cond)`, or the conjunction with the gate
    `index` already has."""
    if index.op is Ops.WHERE and _is_invalid(index.src[2]):
        return (index.src[0] & cond).where(index.src[1], index.src[2])
    return index.valid(cond)


def _lift_where(a: UOp) -> UOp | None:
    """op(.., WHERE(c, x, Invalid), ..) -> WHERE(c, op(.., x, ..), Invalid)."""
    if a.op is Ops.WHERE:
        c, x, y = a.src
        if _is_invalid(y) and x.op is Ops.WHERE and _is_invalid(x.src[2]):
            return (c & x.src[0]).where(x.src[1], y)
        if _is_invalid(x) and not _is_invalid(y):
            return c.logical_not().where(y, x)
        return None
    for i, s in enumerate(a.src):
        if s.op is Ops.WHERE and _is_invalid(s.src[2]) and not _is_invalid(s.src[1]):
            inner = a.replace(src=tuple(s.src[1] if j == i else t for j, t in enumerate(a.src)))
            return s.src[0].where(inner, s.src[2].replace(dtype=a.dtype) if a.dtype != s.dtype else s.src[2])
    return None


def _gate_index(idx: UOp) -> UOp | None:
    if len(idx.src) != 2:
        return None
    buf, i = idx.src
    if i.op is Ops.WHERE and _is_invalid(i.src[2]):
        return UOp(Ops.INDEX, idx.dtype, (buf, i.src[1], i.src[0]))
    return None


def _alt_for_gated_load(ld: UOp) -> UOp | None:
    if len(ld.src) == 1 and ld.src[0].op is Ops.INDEX and len(ld.src[0].src) == 3:
        return ld.replace(src=(ld.src[0], UOp.const(ld.dtype, 0)))
    return None


def _fully_invalid_load(ld: UOp) -> UOp | None:
    if ld.src[0].op is Ops.INDEX and len(ld.src[0].src) == 2 and _is_invalid(ld.src[0].src[1]):
        return ld.src[1] if len(ld.src) > 1 else UOp.const(ld.dtype, 0)
    return None


def _fully_invalid_store(st: UOp) -> UOp | None:
    if st.src[0].op is Ops.INDEX and len(st.src[0].src) == 2 and _is_invalid(st.src[0].src[1]):
        return UOp(Ops.GROUP, dtypes.void, ())
    return None


def has_gates(sink: UOp) -> bool:
    """Whether pm_explicit_gates can match anything in `sink`: every rule needs an Invalid or a gated INDEX."""
    return any((u.op is Ops.CONST and isinstance(u.arg, InvalidType)) or (u.op is Ops.INDEX and len(u.src) == 3)
               for u in sink.toposort())  # fmt: skip


pm_explicit_gates = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="a"), _lift_where),
        (UPat(Ops.INDEX, name="idx"), _gate_index),
        (UPat(Ops.LOAD, name="ld"), _fully_invalid_load),
        (UPat(Ops.LOAD, name="ld"), _alt_for_gated_load),
        (UPat(Ops.STORE, name="st"), _fully_invalid_store),
    ]
)
_ = _INVALID_CONST
