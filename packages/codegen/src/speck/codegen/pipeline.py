"""`full_rewrite_to_sink`: the lowering pipeline from a kernel AST (KERNEL_CONTRACT.md section 1) to the linear
program renderers consume (section 2). It reads top to bottom: one named graph_rewrite per stage, each preceded by
why it is there. Stage names print with DEBUG>=3 (DEBUG>=5 also prints each stage's graph); SPEC=1 checks the
spec after every stage."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.linearize import linearize
from speck.codegen.lower.ast_check import check_kernel_ast
from speck.codegen.lower.casted_consts import pm_casted_consts
from speck.codegen.lower.decompositions import Decomposer, pm_decompose
from speck.codegen.lower.devectorize import Devectorizer, pm_devectorize
from speck.codegen.lower.expander import expand_vectors
from speck.codegen.lower.gated_ranges import tighten_gated_reductions
from speck.codegen.lower.gates import has_gates, pm_explicit_gates
from speck.codegen.lower.gpudims import gpu_dims
from speck.codegen.lower.group_reduce import group_reduces
from speck.codegen.lower.index import IndexLowering, pm_lower_index_dtype
from speck.codegen.lower.reduce import ReduceLowering, pm_lower_reduce
from speck.codegen.lower.simplify import pm_simplify
from speck.codegen.lower.spec_check import verify_stage
from speck.codegen.opt import optimize_kernel
from speck.uop import DEBUG, GroupOp, UOp, graph_rewrite, rewrites_anything

if TYPE_CHECKING:
    from speck.codegen.opt.search import KernelTimer
    from speck.codegen.renderer import Renderer


class _Stages:
    """Runs stages, timing them and printing their names under DEBUG, checking the spec between them."""

    def __init__(self, name: str) -> None:
        self.name, self.times, self.t = name, [], time.perf_counter()  # type: ignore[var-annotated]

    def done(self, stage: str, g: UOp) -> UOp:
        now = time.perf_counter()
        self.times.append((stage, now - self.t))
        if DEBUG >= 3:
            print(f"[{self.name}] stage {stage:18s} {1e3 * (now - self.t):7.2f} ms  {len(g.toposort())} nodes")
        if DEBUG >= 5:
            print(g)
        verify_stage(g, stage)
        self.t = time.perf_counter()
        return g


def full_rewrite_graph(ast: UOp, renderer: Renderer, optimize: bool = True, beam_timer: KernelTimer | None = None,
                       beam_tag: str = "") -> UOp:  # fmt: skip
    """All graph stages of the pipeline (everything but linearization): returns the lowered SINK. `beam_timer`
    times candidates when BEAM>=1 (see speck.codegen.opt.search); `beam_tag` names its device in the BEAM cache."""
    check_kernel_ast(ast)
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    st = _Stages(info.name)
    verify_stage(ast, "input")
    # symbolic simplification first: every later stage pattern-matches canonical index expressions
    sink = graph_rewrite(ast, pm_simplify, name="simplify")
    sink = st.done("simplify", sink)
    # the optimizer splits ranges (UPCAST/UNROLL/THREAD/...) and records what it applied on the KernelInfo
    if optimize and not info.dont_opt:
        sink = optimize_kernel(sink, renderer, beam_timer, beam_tag)
        sink = graph_rewrite(sink, pm_simplify, name="simplify_after_opts")
        sink = st.done("apply_opts", sink)
    # on a GPU (a renderer with local memory) the parallel ranges are the launch grid: workgroup and work-item ids
    # (a reduction split across work-items sums their parts through workgroup memory first)
    if renderer.has_local:
        sink = st.done("group_reduce", group_reduces(sink, renderer))
        sink = st.done("gpu_dims", gpu_dims(sink, renderer))
    # a sum over taps that read only zero padding (a transposed convolution's borders) skips them: the gate bounds
    # the reduction loop
    if (tight := tighten_gated_reductions(sink)) is not sink:
        sink = st.done("gated_ranges", graph_rewrite(tight, pm_simplify, name="simplify_gated_ranges"))
    # UPCAST/UNROLL ranges become vector lanes (STACK/GEP, vector LOAD/STORE of contiguous elements)
    sink = expand_vectors(sink, renderer.wide_shuffles)
    sink = st.done("expand", sink)
    # reductions become accumulator registers: init before the loop, update inside, read after END
    if (reducing := ReduceLowering(sink)).has_reduce:  # half of all kernels have no REDUCE: no walk for them
        sink = graph_rewrite(sink, pm_lower_reduce, ctx=reducing, name="lower_reduce")
    sink = st.done("lower_reduce", sink)
    # vectors wider than the renderer's registers (or any vector, for scalar renderers) are split (a flat scan first:
    # on a vector renderer most kernels have nothing to split or fold, and the scan is far cheaper than the walk)
    if rewrites_anything(sink, pm_devectorize, devec := Devectorizer(renderer)):
        sink = graph_rewrite(sink, pm_devectorize, ctx=devec, name="devectorize")
    sink = st.done("devectorize", sink)
    # Invalid (gated indexing) becomes an explicit bool gate on INDEX and an alternative value on LOAD (a scan for
    # Invalid is cheaper than the rewrite's walk, and most kernels have none)
    if has_gates(sink):
        sink = graph_rewrite(sink, pm_explicit_gates, name="explicit_gates")
    sink = st.done("explicit_gates", sink)
    # ops the renderer cannot express are rewritten in terms of ones it can (polynomials, 32-bit threefry, ...);
    # most kernels have none (scanned first, as for devectorize)
    if rewrites_anything(sink, pm_decompose, decomposer := Decomposer(renderer)):
        sink = graph_rewrite(sink, pm_decompose, ctx=decomposer, name="decompositions")
    sink = st.done("decompositions", sink)
    # weakint index math gets a concrete width: int32 unless bounds need int64 or the renderer prefers int64
    indexing = IndexLowering(renderer.supports_int64, renderer.name, renderer.index_int64)
    sink = graph_rewrite(sink, pm_lower_index_dtype, ctx=indexing, name="lower_index_dtype")
    sink = st.done("lower_index_dtype", sink)
    # every literal becomes CAST(dt, CONST(v, from_py(v))): renderers only ever see casted consts
    sink = graph_rewrite(sink, pm_casted_consts, name="casted_consts", walk=True)
    sink = st.done("casted_consts", sink)
    # renderer-specific last touches (machine idioms), if the renderer has any
    if renderer.extra_matcher is not None:
        sink = graph_rewrite(sink, renderer.extra_matcher, ctx=renderer.extra_context(), name="renderer_extra")
        sink = st.done("renderer_extra", sink)
    return sink


def full_rewrite_to_sink(ast: UOp, renderer: Renderer, optimize: bool = True, beam_timer: KernelTimer | None = None,
                         beam_tag: str = "") -> list[UOp]:  # fmt: skip
    """Lower a kernel AST for `renderer` to the linear program form (KERNEL_CONTRACT.md section 2), verified
    against spec_program when SPEC=1. Raises RuntimeError naming node and stage for ASTs that break the
    conventions, and UnsupportedOpError (naming op, dtype, renderer) for ops the renderer cannot express."""
    sink = full_rewrite_graph(ast, renderer, optimize, beam_timer, beam_tag)
    t = time.perf_counter()
    # linear order: RANGE before its body, END after, accumulators initialised before their loops
    uops = linearize(sink)
    if DEBUG >= 3:
        print(f"stage {'linearize':18s} {1e3 * (time.perf_counter() - t):7.2f} ms  {len(uops)} uops")
    verify_stage(uops, "linearize", program=True)
    _check_renderer_support(uops, renderer)
    return uops


def _check_renderer_support(uops: list[UOp], renderer: Renderer) -> None:
    """Every ALU op left must be one the renderer declared (decompositions removed the rest)."""
    for u in uops:
        if u.op in GroupOp.ALU:
            dt = u.src[0].dtype if u.op in GroupOp.Comparison else u.dtype
            renderer.check_supported(u.op, dt)


__all__ = ["full_rewrite_graph", "full_rewrite_to_sink"]
