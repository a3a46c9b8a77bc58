"""Grouped reductions through workgroup memory (the GROUP/GROUPTOP opts, on renderers with `has_local`).

A GROUP opt splits a reduce range r into r' (still a loop) and g (AxisType.GROUP_REDUCE): the work-items of a
workgroup that differ in g share one output, each summing its own part. This stage makes that real:

    REDUCE(v, r', g)  ->  acc = DEFINE_LOCAL(dt.ptr(n))                                   (one per workgroup)
                          st  = STORE(INDEX(acc, slot(l, g, u)), REDUCE(v, r'))           every work-item's part
                          REDUCE(LOAD(INDEX(AFTER(acc, BARRIER(st)), slot(l, g2, u))), g2)  every work-item sums all

`slot` numbers the partial sums of one workgroup: by its other work-item ids l (LOCAL ranges), then g, then the
output's vector lanes u (UPCAST ranges, innermost, so a vector of lanes is stored and loaded at once); g2 is a fresh
reduce range over g's extent. Every work-item of a group then holds the result, and a store to a global buffer whose
address does not depend on g is gated to g == 0, so it is written once. g itself becomes a work-item id (gpudims)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.errors import ProgramFormError, UnsupportedOpError
from speck.codegen.lower.gates import and_gate
from speck.codegen.lower.ranges import RangeScope
from speck.uop import AddrSpace, AxisType, Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


class _Grouping:
    def __init__(self, sink: UOp, renderer: Renderer) -> None:
        nodes = sink.toposort()
        self.groups = {u for u in nodes if u.op is Ops.RANGE and u.arg[-1] is AxisType.GROUP_REDUCE}
        self.next_axis = 1 + max([a for u in nodes if u.op is Ops.RANGE for a in u.arg[:-1]], default=-1)
        self.next_local = 1 + max([u.arg for u in nodes if u.op is Ops.DEFINE_LOCAL], default=-1)
        self.scope = RangeScope()
        self.renderer = renderer
        self.lds_bytes = 0


def _size(r: UOp) -> int:
    e = r.src[0]
    if e.op is not Ops.CONST or not isinstance(e.arg, int):
        raise ProgramFormError(f"group_reduce: range {r.arg} needs a constant size to be a work-item id, got {e}")
    return int(e.arg)


def _linear(ranges: list[UOp]) -> UOp:
    idx = UOp.const(dtypes.weakint, 0)
    for r in ranges:
        idx = idx * _size(r) + r
    return idx


def _group(ctx: _Grouping, red: UOp) -> UOp | None:
    g = [r for r in red.src[1:] if r in ctx.groups]
    if not g:
        return None
    rest = [r for r in red.src[1:] if r not in ctx.groups]
    partial = red.src[0].reduce(*rest, op=red.arg)
    by_id = sorted(ctx.scope.open_ranges(partial), key=lambda r: r.arg)
    local = [r for r in by_id if r.arg[-1] is AxisType.LOCAL]
    lanes = [r for r in by_id if r.arg[-1] is AxisType.UPCAST]
    g2 = []
    for r in g:
        g2.append(UOp.range(_size(r), ctx.next_axis, AxisType.REDUCE, r.dtype))
        ctx.next_axis += 1
    n = 1
    for r in local + g + lanes:
        n *= _size(r)
    ctx.lds_bytes += n * red.dtype.itemsize
    if ctx.lds_bytes > ctx.renderer.shared_max:
        raise UnsupportedOpError(ctx.renderer.name, Ops.DEFINE_LOCAL, red.dtype,
                                 f"grouped reductions need {ctx.lds_bytes} bytes of workgroup memory, more than "
                                 f"{ctx.renderer.shared_max}")  # fmt: skip
    acc = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(n, AddrSpace.LOCAL), (), ctx.next_local)
    ctx.next_local += 1
    st = acc.index(_linear(local + g + lanes)).store(partial)
    done = acc.after(UOp(Ops.BARRIER, dtypes.void, (st,)))
    return done.index(_linear(local + g2 + lanes)).load().reduce(*g2, op=red.arg)


def _gate_store(ctx: _Grouping, st: UOp) -> UOp | None:
    """A global store of a grouped result, at an address the group doesn't change: only group member 0 writes."""
    idx = st.src[0]
    if idx.op is not Ops.INDEX or idx.src[0].op is not Ops.PARAM or len(idx.src) != 2:
        return None
    in_value = {u for u in st.src[1].toposort() if u in ctx.groups}
    if not in_value or in_value & set(idx.src[1].toposort()):
        return None
    cond = None
    for r in sorted(in_value, key=lambda r: r.arg):
        c = r.eq(0)
        cond = c if cond is None else cond & c
    assert cond is not None
    return st.replace(src=(idx.replace(src=(idx.src[0], and_gate(idx.src[1], cond))), *st.src[1:]))


pm_group_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _group), (UPat(Ops.STORE, name="st"), _gate_store)])


def group_reduces(sink: UOp, renderer: Renderer) -> UOp:
    """Lower every REDUCE over GROUP_REDUCE ranges through workgroup memory (module docstring); a no-op without."""
    ctx = _Grouping(sink, renderer)
    if not ctx.groups:
        return sink
    return graph_rewrite(sink, pm_group_reduce, ctx=ctx, name="group_reduce")


__all__ = ["group_reduces", "pm_group_reduce"]
