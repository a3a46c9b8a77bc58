"""The default heuristic for renderers with workgroups (`Renderer.has_local`: GPUs).

Every output element is one work-item unless the kernel says otherwise; the heuristic chooses, in this order:
1. register blocks (UPCAST) for reductions that reuse loads: an output axis some load does not depend on (matmul's
   rows and columns, a convolution's output channels) is upcast by up to UPCAST_MAX, so each value loaded feeds
   several accumulators; the accumulators (lanes of all upcasts, times the widest value's 32-bit registers) stay
   within a quarter of the renderer's `vgpr_budget`, leaving room for the loaded values and addresses;
2. grouped reductions (GROUP) when the outputs alone can't fill the GPU (fewer than MIN_OUTPUTS) and the reduction
   is long: the work-items of a workgroup split one output's reduction, reading consecutive elements along the
   axis the loads are contiguous in, and add their parts through workgroup memory (lower/group_reduce.py);
3. workgroups (LOCAL) along the output axis the store is contiguous in, by the largest power of two dividing it,
   then along the other output axes, innermost first, up to WORKGROUP work-items in all.
The workgroup's first id (x) is the last split (LOCAL or GROUP) applied: the axis whose neighbouring work-items touch
neighbouring addresses. Opts are chosen one at a time on the kernel as the previous ones left it, so axis numbers
stay right when a split consumes an axis whole. A kernel whose output has no power-of-two factor runs workgroups of
fewer work-items along that axis (correct, but a wave is then partly idle)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.errors import OptError
from speck.codegen.opt.kernel_opts import (
    Opt,
    OptOps,
    apply_opts,
    const_size,
    output_axes,
    pow2_amount,
    reduce_axes,
    stride,
    unmasked_index,
)
from speck.uop import AxisType, Ops, UOp

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer

WORKGROUP = 128  # work-items per workgroup the heuristic aims for: 4 waves of 32
MIN_OUTPUTS = 8192  # fewer outputs than this leave the GPU idle: split long reductions across work-items
MIN_GROUPED_REDUCE = 128  # reduction length worth splitting
GROUP_MAX = 64  # work-items one reduction is split across
UPCAST_MAX = 4  # outputs per axis in a work-item's register block
ELEMENTWISE_VECTOR = 4  # outputs per work-item of a large elementwise kernel
SYMBOLIC = 32  # work-items along an output axis of symbolic size (one wave; the last workgroup's tail is gated off)


class _Planner:
    """The kernel as the opts chosen so far leave it; `add` applies one more, found by the axis id it splits."""

    def __init__(self, sink: UOp, renderer: Renderer) -> None:
        self.sink, self.renderer, self.opts = sink, renderer, []  # type: ignore[var-annotated]

    def add(self, op: OptOps, axis_id: tuple[int, ...], amt: int) -> bool:
        axes = reduce_axes(self.sink) if op in (OptOps.GROUP, OptOps.GROUPTOP) else output_axes(self.sink)
        idx = next((i for i, r in enumerate(axes) if r.arg[:-1] == axis_id), None)
        if idx is None or amt <= 1:
            return False
        opt = Opt(op, idx, amt)
        try:
            self.sink = apply_opts(self.sink, [opt], self.renderer)
        except OptError:
            return False
        self.opts.append(opt)
        return True

    def size(self, axis_id: tuple[int, ...]) -> int:
        for r in output_axes(self.sink) + reduce_axes(self.sink):
            if r.arg[:-1] == axis_id:
                return const_size(r) or 1
        return 1


def _loads(sink: UOp) -> list[UOp]:
    return [unmasked_index(u.src[0]) for u in sink.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]


def gpu_optimizations(sink: UOp, renderer: Renderer) -> list[Opt]:
    """UPCAST/GROUP/LOCAL opts for a GPU target (see the module docstring)."""
    stores = [u for u in sink.toposort() if u.op is Ops.STORE and u.src[0].op is Ops.INDEX]
    outs = [r for r in output_axes(sink) if r.arg[-1] is AxisType.GLOBAL]
    if not stores:
        return []
    plan = _Planner(sink, renderer)
    loads, reds = _loads(sink), reduce_axes(sink)
    store_idx = unmasked_index(stores[0].src[0])
    contiguous = [r for r in outs if stride(store_idx, r) == 1]
    n_out = 1
    for r in outs:
        n_out *= const_size(r) or int(r.src[0].vmax)
    n_red = 1
    for r in reds:
        n_red *= const_size(r) or 1
    # 1. register blocks: output axes some load ignores, when the reduction reuses loads
    itemsize = max(1, (stores[0].src[1].dtype.itemsize + 3) // 4)
    lanes_left = max(1, renderer.vgpr_budget // 4 // itemsize)
    if reds and n_red >= 8:
        for r in sorted(outs, key=lambda r: r not in contiguous):
            if any(r not in ix.toposort() for ix in loads) and any(r in ix.toposort() for ix in loads):
                amt = pow2_amount(const_size(r) or 1, min(UPCAST_MAX, lanes_left))
                # keep enough work-items: an upcast must not starve the grid
                if amt > 1 and n_out // amt >= 4 * WORKGROUP and plan.add(OptOps.UPCAST, r.arg[:-1], amt):
                    lanes_left //= amt
                    n_out //= amt
    # elementwise kernels with plenty of outputs: a vector of the contiguous axis per work-item (one 128-bit load and
    # store per buffer instead of four, and a quarter of the address arithmetic)
    if not reds and contiguous and n_out >= ELEMENTWISE_VECTOR * MIN_OUTPUTS:
        r = contiguous[-1]
        if pow2_amount(const_size(r) or 1, ELEMENTWISE_VECTOR) == ELEMENTWISE_VECTOR:
            if plan.add(OptOps.UPCAST, r.arg[:-1], ELEMENTWISE_VECTOR):
                n_out //= ELEMENTWISE_VECTOR
    # 2. grouped reductions when the outputs are few
    group: list[tuple[tuple[int, ...], int, OptOps]] = []
    if reds and n_out < MIN_OUTPUTS and n_red >= MIN_GROUPED_REDUCE:
        cont = [r for r in reds if any(stride(ix, r) == 1 for ix in loads)]
        todo = GROUP_MAX
        for r in cont[::-1] + [r for r in reversed(reds) if r not in cont]:
            amt = pow2_amount(const_size(r) or 1, todo)
            if amt > 1:
                group.append((r.arg[:-1], amt, OptOps.GROUP if r in cont else OptOps.GROUPTOP))
                todo //= amt
            if todo < 2:
                break
    budget = WORKGROUP
    for _, amt, _ in group:
        budget //= amt
    # 3. workgroups: the contiguous output axis first (it is x unless a grouped reduction is)
    order = contiguous[-1:] + [r for r in reversed(outs) if r not in contiguous[-1:]]
    local: dict[tuple[int, ...], int] = {}
    for r in order:
        # a symbolic size is split with gated work-items past its end (kernel_opts._split_symbolic)
        amt = pow2_amount(plan.size(r.arg[:-1]), budget) if const_size(r) is not None else min(SYMBOLIC, budget)
        if amt > 1:
            local[r.arg[:-1]] = amt
            budget //= amt
        if budget < 2:
            break
    # applied so that the axis of coalesced accesses is split last (work-item id x): a grouped reduction reading
    # strided elements (GROUPTOP) first, then the output axes, outermost first, then a grouped reduction reading
    # consecutive elements (GROUP)
    for aid, amt, op in reversed(group):
        if op is OptOps.GROUPTOP:
            plan.add(op, aid, amt)
    for aid in sorted(local):
        plan.add(OptOps.LOCAL, aid, local[aid])
    for aid, amt, op in reversed(group):
        if op is OptOps.GROUP:
            plan.add(op, aid, amt)
    return plan.opts


__all__ = ["GROUP_MAX", "MIN_OUTPUTS", "UPCAST_MAX", "WORKGROUP", "gpu_optimizations"]
