"""The default heuristic for renderers with workgroups (`Renderer.has_local`: GPUs).

Every output element is one work-item; the question is how to group them into workgroups. Work-items of a wave
should touch neighbouring addresses (coalesced loads and stores), so the first LOCAL split is along the output axis
the store is contiguous in, by the largest power of two dividing it (up to WORKGROUP work-items), and the
remaining budget goes to the other output axes, innermost first. The opts are listed outermost axis first, so the
innermost axis's work-items become id x. A kernel whose output has no power-of-two factor
runs workgroups of one work-item along that axis (correct, slow: PADTO would pad it, at the cost of a gate on every
load)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.opt.kernel_opts import Opt, OptOps, const_size, output_axes, pow2_amount, stride, unmasked_index
from speck.uop import AxisType, Ops, UOp

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer

WORKGROUP = 128  # work-items per workgroup the heuristic aims for: 4 waves of 32


def gpu_optimizations(sink: UOp, renderer: Renderer) -> list[Opt]:
    """LOCAL opts for a GPU target (see the module docstring)."""
    stores = [u for u in sink.toposort() if u.op is Ops.STORE and u.src[0].op is Ops.INDEX]
    outs = output_axes(sink)
    glob = [i for i, r in enumerate(outs) if r.arg[-1] is AxisType.GLOBAL and const_size(r) is not None]
    if not glob:
        return []
    limit = min(WORKGROUP, renderer.max_workgroup_size or WORKGROUP)
    store_idx = unmasked_index(stores[0].src[0]) if stores else None
    contiguous = [i for i in glob if store_idx is not None and stride(store_idx, outs[i]) == 1]
    order = contiguous[-1:] + [i for i in reversed(glob) if i not in contiguous[-1:]]
    amounts: dict[int, int] = {}
    for i in order:
        amt = pow2_amount(const_size(outs[i]) or 1, limit)
        if amt > 1:
            amounts[i] = amt
            limit //= amt
        if limit < 2:
            break
    # applied outermost axis first: each split's work-item range gets the next axis id, and the last one (the
    # innermost axis's) becomes work-item id x (speck.codegen.lower.gpudims). An axis split whole leaves no outer
    # range, so the axes after it move down one place.
    opts: list[Opt] = []
    for i in sorted(amounts):
        gone = sum(1 for j in amounts if j < i and amounts[j] == const_size(outs[j]))
        opts.append(Opt(OptOps.LOCAL, i - gone, amounts[i]))
    return opts


__all__ = ["WORKGROUP", "gpu_optimizations"]
