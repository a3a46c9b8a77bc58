"""The CPU heuristic's register blocking for matmul-like reductions (LLVM, C and x86 renderers): the opts it picks
keep results equal to the unoptimized kernel (interpreter before/after, and the LLVM-compiled kernel), the blocked
kernel's inner loop uses full-width vector loads/stores with only per-row broadcast scalars, shapes that are not
multiples of the block fall back to smaller blocks, and renderers get the same blocks except for odd vector widths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen_helpers import assert_same, run_ast, run_prog
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.lower.expander import expand_vectors
from speck.codegen.opt import Opt, OptOps, apply_opts, hand_coded_optimizations, opt_base
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer import Renderer
from speck.codegen.renderer.cstyle import ClangRenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.codegen.x86.renderer import X86Renderer
from speck.uop import AxisType, Context, Ops, UOp, dtypes
from test_render_clang_llvm_exec import call, compile_llvm, global_extent


def matmul(n: int, k: int, m: int, transposed_b: bool = False, bias: bool = False, batch: int = 0) -> UOp:
    """out[(b,)i,j] = sum_r a[(b,)i,r] * b[(b,)r,j] (b[(b,)j,r] when transposed_b) (+ c[(b,)i,j] when bias)."""
    i, j, r = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(m, 1, AxisType.GLOBAL), UOp.range(k, 2, AxisType.REDUCE)
    bo = UOp.range(batch, 3, AxisType.GLOBAL) if batch else None
    nb = max(batch, 1)

    def off(size: int) -> UOp | int:
        return bo * size if bo is not None else 0

    a = UOp.param(1, dtypes.float32.ptr(nb * n * k)).index(off(n * k) + i * k + r).load()
    bidx = j * k + r if transposed_b else r * m + j
    b = UOp.param(2, dtypes.float32.ptr(nb * k * m)).index(off(k * m) + bidx).load()
    val = (a * b).reduce(r, op=Ops.ADD)
    out_idx = off(n * m) + i * m + j
    if bias:
        val = val + UOp.param(3, dtypes.float32.ptr(nb * n * m)).index(out_idx).load()
    out = UOp.param(0, dtypes.float32.ptr(nb * n * m))
    ends = (bo, i, j) if bo is not None else (i, j)
    return UOp.sink(out.index(out_idx).store(val).end(*ends), arg=KernelInfo(name="mm"))


def bufs(ast: UOp, seed: int = 0) -> list[np.ndarray]:
    params = sorted({u.arg: u for u in ast.toposort() if u.op is Ops.PARAM}.items())
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for slot, p in params:
        size = p.dtype.size  # type: ignore[attr-defined]
        out.append(np.zeros(size, np.float32) if slot == 0 else rng.standard_normal(size).astype(np.float32))
    return out


def heuristic(ast: UOp, renderer: Renderer) -> list[Opt]:
    return hand_coded_optimizations(opt_base(ast), renderer)


def check_preserved(ast: UOp, renderer: Renderer, seed: int = 0) -> list[UOp]:
    """The heuristic's program computes what the unoptimized AST computes (interpreter before/after)."""
    inputs = bufs(ast, seed)
    want = run_ast(ast, inputs, {})
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, renderer)
    assert_same(want, run_prog(uops, inputs, {}), dtypes.float32, exact=False)
    return uops


@pytest.mark.parametrize("renderer", [LLVMRenderer(max_vector_bytes=32), ClangRenderer()], ids=["llvm", "clang"])
def test_matmul_is_register_blocked(renderer: Renderer) -> None:
    # 4 rows x 16 columns (two 8-float vectors), column blocks outermost: 64/16 = 4 blocks is too few to swap
    assert heuristic(matmul(64, 32, 256), renderer) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16),
                                                        Opt(OptOps.SWAP, 0, 1)]  # fmt: skip
    assert heuristic(matmul(64, 32, 64), renderer) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16)]


@pytest.mark.parametrize(
    "shape,want",
    [((6, 5, 24), [Opt(OptOps.UPCAST, 0, 3), Opt(OptOps.UPCAST, 1, 8)]),  # 6 rows: threes; 24 cols: one vector
     ((10, 5, 16), [Opt(OptOps.UPCAST, 0, 5), Opt(OptOps.UPCAST, 1, 16)]),  # 10 rows: fives, not pairs
     ((12, 5, 16), [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16)]),  # a power-of-two block of 4 stays
     ((7, 5, 16), None),  # odd row count: no row block, plain vectorization
     ((8, 3, 12), None)],  # 12 columns: less than a vector, plain heuristic
)  # fmt: skip
def test_block_sizes_shrink_for_non_multiples(shape: tuple[int, int, int], want: list[Opt] | None) -> None:
    ast = matmul(*shape)
    r = LLVMRenderer(max_vector_bytes=32)
    got = heuristic(ast, r)
    if want is not None:
        assert got == want
    else:
        assert not any(o.op is OptOps.UPCAST and o.axis == 0 for o in got)
    check_preserved(ast, r)


@pytest.mark.parametrize(
    "kw",
    [{}, {"bias": True}, {"batch": 3}, {"transposed_b": True}],
    ids=["plain", "bias", "batched", "transposed_b"],
)  # fmt: skip
def test_heuristic_preserves_matmul_results(kw: dict[str, bool | int]) -> None:
    ast = matmul(8, 7, 32, **kw)  # type: ignore[arg-type]
    for r in (LLVMRenderer(max_vector_bytes=32), ClangRenderer()):
        check_preserved(ast, r)


def test_transposed_b_is_not_blocked_into_gathers() -> None:
    # b[j*K + r] is strided along the output's contiguous axis: blocking would gather it lane by lane, so the reduce
    # axis (contiguous in both loads) is unrolled by a vector instead, with 2 rows x 4 columns of outputs at a time
    # (each loaded vector of a feeds 4 dot products, each of b feeds 2)
    r = LLVMRenderer(max_vector_bytes=32)
    ast = matmul(8, 16, 32, transposed_b=True)
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 8)]
    # 10 columns (a classifier's classes) block by 5
    assert heuristic(matmul(8, 32, 10, transposed_b=True), r) == [
        Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 5), Opt(OptOps.UNROLL, 0, 8)]  # fmt: skip
    check_preserved(matmul(8, 32, 10, transposed_b=True), r)
    uops = check_preserved(ast, r)
    assert not any(u.op is Ops.LOAD and u.dtype.count == 1 and u.src[0].src[0].op is Ops.PARAM for u in uops)
    # a reduce too short for a vector keeps the plain heuristic
    assert not any(o.op is OptOps.UNROLL for o in heuristic(matmul(8, 7, 32, transposed_b=True), r))


def test_transposed_b_blocks_more_rows_with_32_registers() -> None:
    # AVX-512's 32 registers hold 4 x 4 dot products (16 accumulators) where the lanes combine by wide shuffles
    # (LLVM); x86's lane-by-lane combine and 16-register renderers keep 2 x 4
    ast = matmul(8, 32, 32, transposed_b=True)
    assert heuristic(ast, LLVMRenderer(max_vector_bytes=64)) == [
        Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 16)]  # fmt: skip
    assert heuristic(ast, X86Renderer(avx512=True)) == [
        Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 16)]  # fmt: skip
    assert heuristic(ast, LLVMRenderer(max_vector_bytes=32))[:2] == [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4)]
    check_preserved(ast, LLVMRenderer(max_vector_bytes=64))


def test_x86_avx2_dot_product_block_fits_its_13_registers() -> None:
    # x86's AVX2 code allocates 13 ymm: 2 x 4 accumulators plus 6 loads spilled three accumulators (877 us at
    # 128x784x128, 460 as 1 x 4); 2 columns still take 2 rows (2 x 2: 8.6 us where 4 x 2 took 15)
    x86 = X86Renderer(avx512=False)
    assert heuristic(matmul(8, 32, 32, transposed_b=True), x86) == [
        Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 8)]  # fmt: skip
    assert heuristic(matmul(8, 32, 10, transposed_b=True), x86) == [
        Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UNROLL, 0, 8)]  # fmt: skip
    for ast in (matmul(8, 32, 32, transposed_b=True), matmul(8, 32, 10, transposed_b=True)):
        check_preserved(ast, x86)


def rowsum(n: int, k: int, op: Ops) -> UOp:
    i, r = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(k, 1, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(n * k)).index(i * k + r).load()
    out = UOp.param(0, dtypes.float32.ptr(n))
    return UOp.sink(out.index(i).store((x * x).reduce(r, op=op)).end(i), arg=KernelInfo(name="rowsum"))


@given(n=st.integers(1, 12), k=st.sampled_from([8, 16, 24, 40]), op=st.sampled_from([Ops.ADD, Ops.MAX]),
       seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=10)
def test_row_reductions_unroll_the_contiguous_reduce(n: int, k: int, op: Ops, seed: int) -> None:
    ast = rowsum(n, k, op)
    r = LLVMRenderer(max_vector_bytes=32)
    assert Opt(OptOps.UNROLL, 0, 8) in heuristic(ast, r)
    check_preserved(ast, r, seed)


@given(n=st.integers(1, 12), k=st.integers(1, 20), m=st.integers(1, 40), seed=st.integers(0, 2**16))
@settings(max_examples=10)
def test_any_transposed_matmul_shape_keeps_its_result(n: int, k: int, m: int, seed: int) -> None:
    check_preserved(matmul(n, k, m, transposed_b=True), LLVMRenderer(max_vector_bytes=32), seed)


@given(n=st.integers(1, 12), k=st.integers(1, 6), m=st.integers(1, 40), seed=st.integers(0, 2**16))
@settings(max_examples=15)
def test_any_matmul_shape_keeps_its_result(n: int, k: int, m: int, seed: int) -> None:
    check_preserved(matmul(n, k, m), LLVMRenderer(max_vector_bytes=32), seed)


def test_blocked_inner_loop_is_vector_loads_and_broadcasts() -> None:
    uops = check_preserved(matmul(16, 8, 256), LLVMRenderer(max_vector_bytes=32))
    # the innermost loop is the reduce: between its RANGE and END only 8-wide loads of b and one scalar of a per row
    start = max(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE)
    stop = next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[-1] is uops[start])
    mem = [u for u in uops[start:stop] if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    assert sorted(u.dtype.count for u in mem) == [1, 1, 1, 1, 8, 8]
    stores = [u for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
    assert len(stores) == 8 and all(s.src[1].dtype.count == 8 for s in stores)


def test_blocked_matmul_runs_compiled_with_llvm() -> None:
    ast = matmul(32, 24, 128)
    r = LLVMRenderer(max_vector_bytes=32)
    inputs = bufs(ast, 1)
    want = run_ast(ast, inputs, {})
    uops = full_rewrite_to_sink(ast, r)
    assert uops[-1].arg.applied_opts == (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.SWAP, 0, 1))
    src = r.render(uops)
    assert "<8 x float>" in src and "load <8 x float>" in src and "store <8 x float>" in src
    addr, keep = compile_llvm(src, "mm")
    got = [b.copy() for b in inputs]
    ext = global_extent(uops, {})
    call(addr, uops, got, {}, (0, ext // 2))  # two worker slices, as the CPU runtime splits it
    call(addr, uops, got, {}, (ext // 2, ext))
    assert_same(want, got[0], dtypes.float32, exact=False)
    del keep


def test_x86_renderer_blocks_like_the_other_cpu_renderers() -> None:
    # the same register blocks as LLVM where the vector widths are powers of two (x86 declares no odd widths)
    # (AVX2 widths on every host: an AVX-512 host's defaults are 64-byte vectors for x86 and LLVM)
    llvm, x86 = LLVMRenderer(max_vector_bytes=32), X86Renderer(avx512=False)
    for ast in (matmul(64, 32, 256), rowsum(16, 16, Ops.ADD)):
        assert heuristic(ast, x86) == heuristic(ast, llvm) == heuristic(ast, ClangRenderer())
    # except x @ W.T's dot products: one row fewer where 2 rows' accumulators and loads exceed x86's 13 registers
    t = matmul(8, 16, 32, transposed_b=True)
    assert heuristic(t, llvm) == heuristic(t, ClangRenderer()) == [Opt(OptOps.UPCAST, 0, 2), *heuristic(t, x86)]
    assert heuristic(matmul(64, 32, 256), x86)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16)]


def conv_channel_last(n: int, c: int, o: int, w: int, k: int) -> UOp:
    """out[b,p,x] = sum_{ci,j} inp[b,ci,x+j] * wt[ci,j,p]: a 1-d convolution whose weights are channel-last, so the
    output channel axis p is strided in the store but contiguous in the only load that reads it."""
    b, p, x = (UOp.range(s, a, AxisType.GLOBAL) for a, s in enumerate((n, o, w)))
    ci, j = UOp.range(c, 3, AxisType.REDUCE), UOp.range(k, 4, AxisType.REDUCE)
    wi = w + k - 1
    inp = UOp.param(1, dtypes.float32.ptr(n * c * wi)).index(b * (c * wi) + ci * wi + x + j).load()
    wt = UOp.param(2, dtypes.float32.ptr(c * k * o)).index(ci * (k * o) + j * o + p).load()
    out = UOp.param(0, dtypes.float32.ptr(n * o * w))
    store = out.index(b * (o * w) + p * w + x).store((inp * wt).reduce(ci, j, op=Ops.ADD))
    return UOp.sink(store.end(b, p, x), arg=KernelInfo(name="conv"))


def test_long_reduction_vectorizes_the_axis_its_loads_read_contiguously() -> None:
    # x (the store's contiguous axis) is 20 wide: no full vector; the channel axis p is contiguous in the weight load
    # and the reduction (32 channels x 5 taps) long enough that storing p lane by lane costs little
    r = LLVMRenderer(max_vector_bytes=32)
    ast = conv_channel_last(2, 32, 32, 20, 5)
    opts = heuristic(ast, r)
    assert Opt(OptOps.UPCAST, 1, 16) in opts and Opt(OptOps.UPCAST, 2, 4) in opts
    uops = check_preserved(ast, r)
    assert any(u.op is Ops.LOAD and u.dtype.count == 8 for u in uops)
    # a short reduction (one channel, one tap) keeps the store-contiguous plain heuristic
    assert Opt(OptOps.UPCAST, 1, 16) not in heuristic(conv_channel_last(2, 1, 32, 20, 1), r)


def test_unrolled_reduction_accumulates_vectors_and_combines_once() -> None:
    # the REDUCE over the loop range carries every unrolled lane; the horizontal combine happens after the loop
    r = LLVMRenderer(max_vector_bytes=32)
    ast = rowsum(4, 64, Ops.ADD)
    opts = heuristic(ast, r)
    assert Opt(OptOps.UNROLL, 0, 8) in opts

    expanded = expand_vectors(apply_opts(opt_base(ast), opts, r))
    reds = [u for u in expanded.toposort() if u.op is Ops.REDUCE]
    # the accumulator holds 4 outputs x 8 unrolled lanes, not the 4 horizontally combined sums
    assert [u.dtype.count for u in reds] == [32]
    check_preserved(ast, r)


def _combine_depth(u: UOp, memo: dict[UOp, int]) -> int:
    """The longest chain of ALU ops from u back to the REDUCE it combines."""
    if u in memo:
        return memo[u]
    if u.op is Ops.REDUCE:
        d = 0
    else:
        d = max((_combine_depth(s, memo) for s in u.src), default=0) + (u.op is Ops.ADD or u.op is Ops.MAX)
    memo[u] = d
    return d


@pytest.mark.parametrize("unroll", [16, 8, 6, 5])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_unrolled_lanes_combine_as_a_tree_of_halves(unroll: int, op: Ops) -> None:
    # x @ W.T blocked 2 x 4 outputs and unrolled by 16: the 16 lanes of every output combine in halves (16 -> 8 ->
    # 4 -> 2 -> 1, four wide ops), not one lane after another (15 dependent ops gathering a lane from each
    # accumulator); an odd count leaves one group over, joined last. Results stay the unoptimized kernel's.
    r = LLVMRenderer(max_vector_bytes=64)
    ast = matmul(4, 16 * unroll, 8, transposed_b=True) if op is Ops.ADD else rowsum(8, 8 * unroll, Ops.MAX)
    opts = [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, unroll)]
    if op is Ops.MAX:
        opts = [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, unroll)]
    expanded = expand_vectors(apply_opts(opt_base(ast), opts, r), r.wide_shuffles)
    store = next(u for u in expanded.toposort() if u.op is Ops.STORE)
    assert _combine_depth(store.src[1], {}) == {16: 4, 8: 3, 6: 3, 5: 3}[unroll]
    # a renderer gathering lane by lane (x86) combines one group at a time: half the lanes moved
    in_order = expand_vectors(apply_opts(opt_base(ast), opts, r), wide_shuffles=False)
    store = next(u for u in in_order.toposort() if u.op is Ops.STORE)
    assert _combine_depth(store.src[1], {}) == unroll - 1
    inputs = bufs(ast, unroll)
    want = run_ast(ast, inputs, {})
    got = run_prog(full_rewrite_to_sink(ast.replace(arg=KernelInfo(name="mm", opts=tuple(opts))), r), inputs, {})
    assert_same(want, got, dtypes.float32, exact=op is Ops.MAX)


def test_fp_contract_fuses_multiply_add_and_stays_close() -> None:
    # fp_contract=True marks float add/sub/mul `contract` (LLVM may emit FMAs); the default stays exact
    ast = matmul(16, 64, 32)
    exact, fused = LLVMRenderer(max_vector_bytes=32), LLVMRenderer(max_vector_bytes=32, fp_contract=True)
    assert " contract " not in exact.render(full_rewrite_to_sink(ast, exact))
    uops = full_rewrite_to_sink(ast, fused)
    src = fused.render(uops)
    assert "fmul contract <8 x float>" in src and "fadd contract <8 x float>" in src
    inputs = bufs(ast, 2)
    want = run_ast(ast, inputs, {})
    addr, keep = compile_llvm(src, "mm")
    got = [b.copy() for b in inputs]
    call(addr, uops, got, {}, (0, global_extent(uops, {})))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    del keep


def packed_matmul(n: int, k: int, m: int, stripe: int = 16, batch: int = 0) -> UOp:
    """out[(b,)i,j] = sum_r a[(b,)i,r] * bp[(b,)j//stripe, r, j%stripe]: matmul against a column-stripe-major copy of
    its right operand (what speck.tensor builds for large matmuls); the batch axis, when there is one, is axis 0."""
    bo = UOp.range(batch, 0, AxisType.GLOBAL) if batch else None
    i, j = UOp.range(n, 1, AxisType.GLOBAL), UOp.range(m, 2, AxisType.GLOBAL)
    r = UOp.range(k, 3, AxisType.REDUCE)
    nb = max(batch, 1)

    def off(size: int) -> UOp | int:
        return bo * size if bo is not None else 0

    a = UOp.param(1, dtypes.float32.ptr(nb * n * k)).index(off(n * k) + i * k + r).load()
    bidx = off(k * m) + (j // stripe) * (stripe * k) + r * stripe + j % stripe
    b = UOp.param(2, dtypes.float32.ptr(nb * k * m)).index(bidx).load()
    out = UOp.param(0, dtypes.float32.ptr(nb * n * m))
    ends = (bo, i, j) if bo is not None else (i, j)
    store = out.index(off(n * m) + i * m + j).store((a * b).reduce(r, op=Ops.ADD))
    return UOp.sink(store.end(*ends), arg=KernelInfo(name="pmm"))


def test_packed_right_operand_is_register_blocked_with_vector_loads() -> None:
    # bp is read through j//16 and j%16: split by 16 the column axis reads each stripe row as two 8-float vectors, so
    # the kernel gets the same 4x16 block as a row-major matmul (not the gathering row-reduce fallback)
    r = LLVMRenderer(max_vector_bytes=32)
    ast = packed_matmul(16, 8, 256)
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.SWAP, 0, 1)]
    uops = check_preserved(ast, r)
    start = max(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE)
    stop = next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[-1] is uops[start])
    mem = [u for u in uops[start:stop] if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    assert sorted(u.dtype.count for u in mem) == [1, 1, 1, 1, 8, 8]


def test_packed_stripe_sets_the_column_block() -> None:
    r = LLVMRenderer(max_vector_bytes=32)
    # stripes of 8 (float64-like widths): each vector of the 2-vector block reads its own stripe
    assert heuristic(packed_matmul(8, 8, 64, stripe=8), r)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16)]
    check_preserved(packed_matmul(8, 8, 64, stripe=8), r)
    # 64-byte vectors (16 lanes) and 32 registers: 4 vectors of columns, one from each of four stripes (4 x 4
    # accumulators; one vector, 4 accumulators, left AVX-512 at half numpy's speed)
    wide = LLVMRenderer(max_vector_bytes=64)
    assert heuristic(packed_matmul(8, 8, 128), wide)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 64)]
    check_preserved(packed_matmul(8, 8, 128), wide)
    # stripes narrower than a vector cannot be read as one: no column block over them
    opts = heuristic(packed_matmul(8, 8, 64, stripe=4), r)
    assert Opt(OptOps.UPCAST, 1, 16) not in opts and Opt(OptOps.UPCAST, 1, 8) not in opts
    check_preserved(packed_matmul(8, 8, 64, stripe=4), r)


def test_column_block_follows_the_renderers_vector_registers() -> None:
    # the block holds ROW_BLOCK rows x (registers / 8) vectors: AVX2's 16 registers 2 vectors, AVX-512's 32 four,
    # x86's 14 allocatable zmm two (never fewer than two)
    ast = packed_matmul(16, 8, 256)
    assert heuristic(ast, LLVMRenderer(max_vector_bytes=32))[1] == Opt(OptOps.UPCAST, 1, 16)
    assert heuristic(ast, LLVMRenderer(max_vector_bytes=64))[1] == Opt(OptOps.UPCAST, 1, 64)
    assert heuristic(ast, X86Renderer(avx512=False))[1] == Opt(OptOps.UPCAST, 1, 16)
    assert heuristic(ast, X86Renderer(avx512=True))[1] == Opt(OptOps.UPCAST, 1, 32)


def test_avx512_packed_block_reads_one_full_vector_per_stripe() -> None:
    # 64 columns over four 16-float stripes: each reduce step loads four 16-lane vectors (not 64 scalar lanes)
    # and broadcasts one scalar per row, and the stores are whole vectors
    r = LLVMRenderer(max_vector_bytes=64)
    uops = check_preserved(packed_matmul(8, 8, 128), r)
    start = max(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE)
    stop = next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[-1] is uops[start])
    mem = [u for u in uops[start:stop] if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    assert sorted(u.dtype.count for u in mem) == [1, 1, 1, 1, 16, 16, 16, 16]
    stores = [u for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
    assert {u.src[1].dtype.count for u in stores} == {16}


@given(n=st.integers(1, 13), k=st.integers(1, 9), stripes=st.integers(1, 9), stripe=st.sampled_from([8, 16]),
       wide=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=25, deadline=None)
def test_any_packed_matmul_shape_keeps_its_result(n: int, k: int, stripes: int, stripe: int, wide: bool,
                                                  seed: int) -> None:  # fmt: skip
    # odd row counts, column counts that are odd multiples of the stripe (blocks of 1-4 vectors), AVX2 and AVX-512
    check_preserved(packed_matmul(n, k, stripes * stripe, stripe), LLVMRenderer(max_vector_bytes=64 if wide else 32),
                    seed)  # fmt: skip


def test_single_vector_column_block_gets_more_rows_with_32_registers() -> None:
    # 784 columns = 49 x 16: one AVX-512 vector of columns, so 16 rows (16 accumulators) rather than 4, or 8 where
    # 16 don't divide the rows; AVX2's two 8-lane vectors keep 4 rows, and so does a matrix whose rows don't split
    # by 8
    wide, narrow = LLVMRenderer(max_vector_bytes=64), LLVMRenderer(max_vector_bytes=32)
    assert heuristic(matmul(128, 8, 784), wide) == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 1, 16),
                                                    Opt(OptOps.SWAP, 0, 1)]  # fmt: skip
    assert heuristic(matmul(24, 8, 784), wide)[0] == Opt(OptOps.UPCAST, 0, 8)
    assert heuristic(matmul(128, 8, 784), narrow) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16),
                                                      Opt(OptOps.SWAP, 0, 1)]  # fmt: skip
    assert heuristic(matmul(12, 8, 784), wide)[0] == Opt(OptOps.UPCAST, 0, 4)
    check_preserved(matmul(16, 8, 48), wide)


def test_wide_plain_matmul_blocks_four_vectors_with_32_registers() -> None:
    # 512 columns make 8 blocks of 4 AVX-512 vectors: 4 x 4 accumulators; 256 columns keep 2 vectors (4 blocks of
    # 4 would leave the workers little to split), and AVX2 keeps its 2 x 8 lanes
    wide, narrow = LLVMRenderer(max_vector_bytes=64), LLVMRenderer(max_vector_bytes=32)
    assert heuristic(matmul(64, 8, 512), wide)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 64)]
    assert heuristic(matmul(64, 8, 256), wide)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 32)]
    assert heuristic(matmul(64, 8, 512), narrow)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16)]
    # a batched product (three output axes) keeps 2 vectors too
    assert heuristic(matmul(8, 8, 512, batch=2), wide)[:2] == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 32)]
    check_preserved(matmul(8, 8, 512), wide)


@given(n=st.integers(1, 40), k=st.integers(1, 6), m=st.sampled_from([16, 48, 80, 112, 64, 40]),
       seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=20, deadline=None)
def test_any_matmul_shape_keeps_its_result_with_avx512_widths(n: int, k: int, m: int, seed: int) -> None:
    check_preserved(matmul(n, k, m), LLVMRenderer(max_vector_bytes=64), seed)


@given(n=st.integers(1, 20), k=st.integers(1, 4), m=st.sampled_from([512, 528, 576]), seed=st.integers(0, 2**16))
@settings(max_examples=6, deadline=None)
def test_any_wide_matmul_shape_keeps_its_result_with_avx512_widths(n: int, k: int, m: int, seed: int) -> None:
    # 512 and 576 columns take 4-vector blocks, 528 = 33 x 16 one vector with up to 16 rows; odd row counts
    check_preserved(matmul(n, k, m), LLVMRenderer(max_vector_bytes=64), seed)


def test_avx512_packed_matmul_runs_compiled_with_llvm() -> None:
    # (LLVM splits 512-bit vectors into halves on a host without AVX-512: correct everywhere)
    ast = packed_matmul(12, 24, 256)
    r = LLVMRenderer(max_vector_bytes=64, fp_contract=True)
    inputs = bufs(ast, 5)
    want = run_ast(ast, inputs, {})
    uops = full_rewrite_to_sink(ast, r)
    assert uops[-1].arg.applied_opts[:2] == (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 64))
    src = r.render(uops)
    assert "load <16 x float>" in src and "srem" not in src and "sdiv" not in src
    addr, keep = compile_llvm(src, "pmm")
    got = [b.copy() for b in inputs]
    ext = global_extent(uops, {})
    call(addr, uops, got, {}, (0, ext // 2))
    call(addr, uops, got, {}, (ext // 2, ext))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    del keep


def test_batched_matmul_keeps_batches_outermost_and_column_blocks_outside_rows() -> None:
    r = LLVMRenderer(max_vector_bytes=32)
    # axes (batch, i, j): the workers split batches; within one, column blocks go outside row blocks
    assert heuristic(packed_matmul(8, 8, 128, batch=2), r) == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 16),
                                                               Opt(OptOps.SWAP, 1, 2)]  # fmt: skip
    check_preserved(packed_matmul(8, 8, 128, batch=2), r)
    # too few column blocks to be worth it: no swap
    assert not any(o.op is OptOps.SWAP for o in heuristic(packed_matmul(8, 8, 64, batch=2), r))


def test_long_odd_row_axis_gets_a_one_row_block() -> None:
    # 67 rows has no power-of-two factor: the columns are still blocked by two vectors, one row at a time
    r = LLVMRenderer(max_vector_bytes=32)
    assert heuristic(matmul(67, 4, 32), r) == [Opt(OptOps.UPCAST, 1, 16)]
    assert heuristic(packed_matmul(67, 4, 32), r) == [Opt(OptOps.UPCAST, 1, 16)]
    check_preserved(matmul(67, 4, 32), r)
    check_preserved(packed_matmul(67, 4, 32), r)


def test_packed_blocked_matmul_runs_compiled_with_llvm() -> None:
    ast = packed_matmul(32, 24, 128)
    r = LLVMRenderer(max_vector_bytes=32, fp_contract=True)
    inputs = bufs(ast, 3)
    want = run_ast(ast, inputs, {})
    uops = full_rewrite_to_sink(ast, r)
    assert uops[-1].arg.applied_opts == (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.SWAP, 0, 1))
    src = r.render(uops)
    assert "load <8 x float>" in src and "srem" not in src and "sdiv" not in src
    addr, keep = compile_llvm(src, "pmm")
    got = [b.copy() for b in inputs]
    ext = global_extent(uops, {})
    call(addr, uops, got, {}, (0, ext // 2))
    call(addr, uops, got, {}, (ext // 2, ext))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    del keep


def test_windowed_reduction_prefers_channels_even_with_an_epilogue_load() -> None:
    # x is 24 wide (three full vectors), but a convolution's window shifts the input loads along x: the output
    # channels (contiguous in the channel-last weights) are the better vector axis. A load outside the reduction
    # (a residual added once per output, strided along p) does not disqualify them.
    n, c, o, w, k = 2, 32, 32, 24, 3
    b, p, x = (UOp.range(s, a, AxisType.GLOBAL) for a, s in enumerate((n, o, w)))
    ci, j = UOp.range(c, 3, AxisType.REDUCE), UOp.range(k, 4, AxisType.REDUCE)
    wi = w + k - 1
    inp = UOp.param(1, dtypes.float32.ptr(n * c * wi)).index(b * (c * wi) + ci * wi + x + j).load()
    wt = UOp.param(2, dtypes.float32.ptr(c * k * o)).index(ci * (k * o) + j * o + p).load()
    res = UOp.param(3, dtypes.float32.ptr(n * o * w)).index(b * (o * w) + p * w + x).load()
    out = UOp.param(0, dtypes.float32.ptr(n * o * w))
    val = (inp * wt).reduce(ci, j, op=Ops.ADD) + res
    ast = UOp.sink(out.index(b * (o * w) + p * w + x).store(val).end(b, p, x), arg=KernelInfo(name="conv"))
    r = LLVMRenderer(max_vector_bytes=32)
    assert Opt(OptOps.UPCAST, 1, 16) in heuristic(ast, r)
    check_preserved(ast, r)


def channel_sum(hw: int, pooled: bool, n: int = 4, c: int = 8) -> UOp:
    """BatchNorm's per-channel sum over (N, C, hw, hw); pooled also reads a 2x2-pooled operand at (h//2, w//2)."""
    ci = UOp.range(c, 0, AxisType.GLOBAL)
    ni, h, w = UOp.range(n, 1, AxisType.REDUCE), UOp.range(hw, 2, AxisType.REDUCE), UOp.range(hw, 3, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(n * c * hw * hw)).index(ni * (c * hw * hw) + ci * (hw * hw) + h * hw + w).load()
    if pooled:
        q = hw // 2
        p = UOp.param(2, dtypes.float32.ptr(n * c * q * q)).index(
            ni * (c * q * q) + ci * (q * q) + (h // 2) * q + w // 2
        )
        x = x * p.load()
    out = UOp.param(0, dtypes.float32.ptr(c))
    return UOp.sink(out.index(ci).store(x.reduce(ni, h, w, op=Ops.ADD)).end(ci), arg=KernelInfo(f"csum{hw}{pooled}"))


@pytest.mark.parametrize(
    "hw,pooled,want",
    [(20, False, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 1, 8)]),  # rows and columns merge into runs of 400
     (20, True, [Opt(OptOps.UNROLL, 2, 4)]),  # w // 2 is read lane by lane: no column upcast to multiply it
     (6, True, [Opt(OptOps.UNROLL, 2, 6)])],  # a 6-wide row of a long reduction unrolls whole
)  # fmt: skip
def test_per_channel_sums_vectorize_along_the_image(hw: int, pooled: bool, want: list[Opt]) -> None:
    r = LLVMRenderer(max_vector_bytes=32)
    ast = channel_sum(hw, pooled)
    assert heuristic(ast, r) == want
    check_preserved(ast, r)


@pytest.mark.parametrize("hw", [20, 12])
def test_per_channel_sums_unroll_the_image_row_with_avx512_too(hw: int) -> None:
    """With 16 lanes a 20-wide pooled image row unrolls by 4 as with 8 (it used to fall back to gathering 16
    channels lane by lane: BatchNorm's backward sums ran 3x slower on AVX-512 hosts)."""
    r = LLVMRenderer(max_vector_bytes=64)
    ast = channel_sum(hw, True)
    assert heuristic(ast, r) == [Opt(OptOps.UNROLL, 2, 4)]
    uops = check_preserved(ast, r)
    assert not any(u.op is Ops.LOAD and u.dtype.count == 1 and u.src[0].src[0].arg == 1 for u in uops)


def test_upsampled_operand_is_one_short_vector_load() -> None:
    """Unrolled by 4 along w, the pooled operand's lanes read w // 2 = [0, 0, 1, 1] (+ 2*wo): one 2-wide load whose
    lanes are repeated, not four scalar loads; compiled with LLVM it sums what the interpreter sums."""
    ast = channel_sum(20, True)
    r = LLVMRenderer(max_vector_bytes=32)
    uops = check_preserved(ast, r)
    pooled = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM and u.src[0].src[0].arg == 2]
    assert [u.dtype.count for u in pooled] == [2]
    inputs = bufs(ast, 2)
    want = run_ast(ast, inputs, {})
    addr, keep = compile_llvm(r.render(uops), "csum20True")
    got = [b.copy() for b in inputs]
    call(addr, uops, got, {}, (0, global_extent(uops, {})))
    assert_same(want, got[0], dtypes.float32, exact=False)
    del keep


def single_channel_conv(n: int = 2, co: int = 8, hw: int = 8, k: int = 3) -> UOp:
    """out[b, c, y, x] = sum_{i,j} img[b, y+i, x+j] * w[c, i, j]: a first convolution layer (one input channel)."""
    b, c = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(co, 1, AxisType.GLOBAL)
    y, x = UOp.range(hw, 2, AxisType.GLOBAL), UOp.range(hw, 3, AxisType.GLOBAL)
    i, j = UOp.range(k, 4, AxisType.REDUCE), UOp.range(k, 5, AxisType.REDUCE)
    side = hw + k - 1
    img = UOp.param(1, dtypes.float32.ptr(n * side * side)).index(b * (side * side) + (y + i) * side + x + j).load()
    w = UOp.param(2, dtypes.float32.ptr(co * k * k)).index(c * (k * k) + i * k + j).load()
    out = UOp.param(0, dtypes.float32.ptr(n * co * hw * hw))
    idx = b * (co * hw * hw) + c * (hw * hw) + y * hw + x
    return UOp.sink(out.index(idx).store((img * w).reduce(i, j, op=Ops.ADD)).end(b, c, y, x), arg=KernelInfo("conv1"))


def test_single_vector_block_reuses_the_vector_load_across_channels() -> None:
    """The input row (the vector load, along x) doesn't depend on the output channel, so the block's rows are 4
    channels (each vector feeds 4 accumulators), and with one vector of columns a second row axis (2 output rows)
    uses the spare registers."""
    r = LLVMRenderer(max_vector_bytes=32)
    ast = single_channel_conv()
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 3, 8)]
    check_preserved(ast, r)


def test_half_vector_columns_still_block_with_avx512() -> None:
    """8 output columns are half of AVX-512's 16 lanes: LLVM (any vector width) blocks them as with AVX2 (they used
    to get no block at all: conv1's forward ran 2.5x slower on AVX-512)."""
    ast = single_channel_conv()
    r = LLVMRenderer(max_vector_bytes=64)
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 3, 8)]
    uops = check_preserved(ast, r)
    assert any(u.op is Ops.LOAD and u.dtype.count == 8 for u in uops)


@pytest.mark.parametrize("ast_fn", [lambda: matmul(8, 32, 10, transposed_b=True), lambda: channel_sum(6, True)],
                         ids=["ten_columns", "six_wide_rows"])  # fmt: skip
def test_c_renderer_keeps_power_of_two_vector_widths(ast_fn) -> None:  # type: ignore[no-untyped-def]
    """Blocks of 5 columns and 6-wide unrolls make 5- and 6-lane vector accesses, which LLVM takes and C vector
    types can't express: the C renderer's heuristic keeps power-of-two widths, and its program compiles and runs."""
    from test_render_llvm_ir import _corpus_case

    ast = ast_fn()
    r = ClangRenderer()
    widths = [int(o.arg or 1) for o in heuristic(ast, r) if o.op in (OptOps.UPCAST, OptOps.UNROLL)]
    assert all(w & (w - 1) == 0 for w in widths)
    llvm = [int(o.arg or 1) for o in heuristic(ast, LLVMRenderer(max_vector_bytes=32)) if o.op is not OptOps.SWAP]
    assert any(w & (w - 1) for w in llvm)  # LLVM does get the odd width
    _corpus_case((ast, bufs(ast, 5), {}), r)


def single_channel_weight_grad(n: int = 2, co: int = 4, hw: int = 16, k: int = 5) -> UOp:
    """dw[c, i, j] = sum_{b,y,x} g[b, c, y, x] * img[b, y+i, x+j]: a first layer's weight gradient, NCHW gradient."""
    c, i, j = UOp.range(co, 0, AxisType.GLOBAL), UOp.range(k, 1, AxisType.GLOBAL), UOp.range(k, 2, AxisType.GLOBAL)
    b, y, x = UOp.range(n, 3, AxisType.REDUCE), UOp.range(hw, 4, AxisType.REDUCE), UOp.range(hw, 5, AxisType.REDUCE)
    side = hw + k - 1
    g = UOp.param(1, dtypes.float32.ptr(n * co * hw * hw)).index(b * (co * hw * hw) + c * (hw * hw) + y * hw + x)
    img = UOp.param(2, dtypes.float32.ptr(n * side * side)).index(b * (side * side) + (y + i) * side + x + j)
    out = UOp.param(0, dtypes.float32.ptr(co * k * k))
    val = (g.load() * img.load()).reduce(b, y, x, op=Ops.ADD)
    return UOp.sink(out.index(c * (k * k) + i * k + j).store(val).end(c, i, j), arg=KernelInfo("wgrad1"))


def test_unvectorizable_outputs_still_block_over_shared_loads() -> None:
    """The 5-wide window can't be a vector, so the reduction unrolls along x; the gradient's vector is shared by
    the 5 window columns (upcast whole) and the image's by 2 output channels: 10 accumulators per step."""
    r = LLVMRenderer(max_vector_bytes=32)
    ast = single_channel_weight_grad()
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 2, 5), Opt(OptOps.UNROLL, 2, 8)]
    check_preserved(ast, r)
    assert not any(o.op is OptOps.UPCAST for o in heuristic(ast, ClangRenderer()))  # C: no 5-lane vectors


def test_unvectorizable_outputs_block_with_avx512_too() -> None:
    """With 16 lanes the unroll is still 8 (a full one), so the block over shared loads applies as with 8, the
    channels by 4 with 32 registers (it used to be skipped: conv1's weight gradient ran 4x slower on AVX-512)."""
    r = LLVMRenderer(max_vector_bytes=64)
    ast = single_channel_weight_grad()
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 2, 5), Opt(OptOps.UNROLL, 2, 8)]
    check_preserved(ast, r)


def test_unvectorizable_outputs_block_8_channels_with_32_registers() -> None:
    """32 output channels (the CNN's conv1): 8 of them per block with AVX-512's 32 registers (the weight gradient
    2.2 -> 1.7 ms single-core against 4), 2 with AVX2's 16; the values stay the interpreter's."""
    ast = single_channel_weight_grad(co=32)
    r = LLVMRenderer(max_vector_bytes=64)
    assert heuristic(ast, r) == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 2, 5), Opt(OptOps.UNROLL, 2, 8)]
    check_preserved(ast, r)
    narrow = LLVMRenderer(max_vector_bytes=32)
    assert heuristic(ast, narrow) == [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 2, 5), Opt(OptOps.UNROLL, 2, 8)]
