"""The default CPU heuristic: vectorize the contiguous inner output dimension to fill a vector register (or, when
the output has none, unroll the contiguous inner reduce dimension), and make sure the outermost GLOBAL range the
CPU ABI slices across workers is not a tiny one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.lower.expander import index_offset
from speck.codegen.opt.kernel_opts import Opt, OptOps, const_size, output_axes, reduce_axes
from speck.uop import AxisType, Ops, PtrDType, UOp, dtypes

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


def _stride(idx: UOp, r: UOp) -> int | None:
    """d idx / d r as a constant, or None when it isn't one."""
    return index_offset(idx, idx.substitute({r: r + 1}))


def _pow2_amount(n: int, limit: int) -> int:
    amt = 1
    while amt * 2 <= limit and n % (amt * 2) == 0:
        amt *= 2
    return amt


def _index_of(ix: UOp) -> UOp:
    i = ix.src[1]
    return i.src[1] if i.op is Ops.WHERE else i


def hand_coded_optimizations(sink: UOp, renderer: Renderer) -> list[Opt]:
    """Opts for a CPU target: UPCAST the innermost contiguous output axis to the vector width of the output dtype,
    else UNROLL the innermost contiguous reduce axis; SWAP a tiny outermost GLOBAL axis with a large one so the
    worker split has something to divide."""
    opts: list[Opt] = []
    stores = [u for u in sink.toposort() if u.op is Ops.STORE]
    if not stores:
        return opts
    st = stores[0]
    buf_dt = st.src[0].src[0].dtype
    assert isinstance(buf_dt, PtrDType)
    lanes = renderer.max_vec_lanes(buf_dt.base)
    outs = output_axes(sink)
    store_idx = _index_of(st.src[0])
    if lanes > 1:
        done = False
        for i in reversed(range(len(outs))):
            r, n = outs[i], const_size(outs[i])
            if n is None or r.arg[-1] is not AxisType.GLOBAL or _stride(store_idx, r) != 1:
                continue
            amt = _pow2_amount(n, lanes)
            if amt > 1:
                opts.append(Opt(OptOps.UPCAST, i, amt))
                done = True
            break
        if not done:
            reds = reduce_axes(sink)
            loads = [u.src[0] for u in sink.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
            for j in reversed(range(len(reds))):
                r, n = reds[j], const_size(reds[j])
                if n is None or not any(_stride(_index_of(ix), r) == 1 for ix in loads):
                    continue
                amt = _pow2_amount(n, min(lanes, 8))
                if amt > 1:
                    opts.append(Opt(OptOps.UNROLL, j, amt))
                break
    globals_ = [(i, r) for i, r in enumerate(outs) if r.arg[-1] is AxisType.GLOBAL]
    if len(globals_) >= 2:
        (i0, r0), rest = globals_[0], globals_[1:]
        n0 = const_size(r0)
        big = [(i, r) for i, r in rest if (const_size(r) or 0) >= 32]
        upcast_axes = {o.axis for o in opts if o.op is OptOps.UPCAST}
        if n0 is not None and n0 < 4 and big and big[0][0] not in upcast_axes:
            opts.insert(0, Opt(OptOps.SWAP, i0, big[0][0]))
    _ = dtypes
    return opts
