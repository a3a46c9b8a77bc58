"""The kernel optimizer: `Opt`/`OptOps` actions, `apply_opts`, the default CPU heuristic
`hand_coded_optimizations`, and `beam_search` (with BEAM=n, when the caller gives a timer).

`optimize_kernel` is what the pipeline calls: explicit KernelInfo.opts win, else BEAM when BEAM>=1 and the caller
gave a timer, else the heuristic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.errors import OptError
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt.heuristic import hand_coded_optimizations
from speck.codegen.opt.kernel_opts import Opt, OptOps, apply_opt, apply_opts, output_axes, reduce_axes
from speck.codegen.opt.merge import merge_ranges
from speck.codegen.opt.search import KernelTimer, beam_search
from speck.codegen.settings import BEAM, NOOPT
from speck.uop import DEBUG, UOp

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


def opt_base(sink: UOp) -> UOp:
    """The graph opt axes refer to: the simplified kernel with adjacent ranges merged (merge_ranges)."""
    return merge_ranges(sink)


def optimize_kernel(sink: UOp, renderer: Renderer, timer: KernelTimer | None = None, cache_tag: str = "") -> UOp:
    """Merge adjacent ranges where exact, then apply the kernel's opts: KernelInfo.opts if given, else BEAM search
    (BEAM>=1 and a `timer` to measure candidates with), else the heuristic. Opt axes are numbered after merging
    (`opt_base` shows the graph they refer to). An explicit opt that does not apply raises OptError naming it."""
    sink = opt_base(sink)
    info = sink.arg if isinstance(sink.arg, KernelInfo) else KernelInfo()
    if info.opts:
        return apply_opts(sink, info.opts, renderer)
    if BEAM >= 1 and timer is not None:
        return apply_opts(sink, beam_search(sink, renderer, int(BEAM), timer, cache_tag=cache_tag), renderer)
    if NOOPT:
        return sink
    opts = hand_coded_optimizations(sink, renderer)
    try:
        return apply_opts(sink, opts, renderer)
    except OptError as e:
        # the kernel still runs, unoptimized (often many times slower): say so, a heuristic bug shows up here
        if DEBUG >= 2:
            print(f"heuristic opts {opts} of {info.name} did not apply ({e}); the kernel runs without opts")
        return sink


__all__ = [
    "BEAM",
    "NOOPT",
    "Opt",
    "OptError",
    "OptOps",
    "apply_opt",
    "apply_opts",
    "beam_search",
    "hand_coded_optimizations",
    "merge_ranges",
    "opt_base",
    "optimize_kernel",
    "output_axes",
    "reduce_axes",
]
