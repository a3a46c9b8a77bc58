"""The CPU heuristic's choices for the training step's Winograd kernels (issue 30): layout copies block the axis
their input reads contiguously (a register transpose), long reductions with two vectors of columns take 8 rows on
targets with 32 vector registers, the small window axis of an input transform gives way to the images, and the
second transform pass walks its column blocks outside its row blocks. Every choice is checked against the
unoptimized kernel (interpreter), odd sizes by hypothesis, and one kernel of each kind compiled with LLVM."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen_helpers import run_ast
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt, OptOps
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.codegen.x86.renderer import X86Renderer
from speck.uop import AxisType, Ops, UOp, dtypes
from test_opt_perf import bufs, check_preserved, heuristic
from test_render_clang_llvm_exec import call, compile_llvm, global_extent

WIDE, NARROW = LLVMRenderer(max_vector_bytes=64), LLVMRenderer(max_vector_bytes=32)


def layout_copy(n: int, c: int, h: int, w: int) -> UOp:
    """out[n, c, y, x] = inp[n, y, x, c]: a channel-last buffer copied back to (N, C, H, W)."""
    rn, rc = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(c, 1, AxisType.GLOBAL)
    ry, rx = UOp.range(h, 2, AxisType.GLOBAL), UOp.range(w, 3, AxisType.GLOBAL)
    size = n * c * h * w
    val = UOp.param(1, dtypes.float32.ptr(size)).index(((rn * h + ry) * w + rx) * c + rc).load()
    out = UOp.param(0, dtypes.float32.ptr(size)).index(((rn * c + rc) * h + ry) * w + rx)
    return UOp.sink(out.store(val).end(rn, rc, ry, rx), arg=KernelInfo(name="copy"))


def weight_gradient(p: int, m: int, n: int, k: int) -> UOp:
    """out[p, i, j] = sum_r a[p, r, i] * b[p, r, j]: a batched A^T B over a long reduction (Winograd's weight
    gradient: tile positions, input channels, output channels, images x tiles)."""
    rp, ri = UOp.range(p, 0, AxisType.GLOBAL), UOp.range(m, 1, AxisType.GLOBAL)
    rj, rr = UOp.range(n, 2, AxisType.GLOBAL), UOp.range(k, 3, AxisType.REDUCE)
    a = UOp.param(1, dtypes.float32.ptr(p * k * m)).index((rp * k + rr) * m + ri).load()
    b = UOp.param(2, dtypes.float32.ptr(p * k * n)).index((rp * k + rr) * n + rj).load()
    out = UOp.param(0, dtypes.float32.ptr(p * m * n)).index((rp * m + ri) * n + rj)
    return UOp.sink(out.store((a * b).reduce(rr, op=Ops.ADD)).end(rp, ri, rj), arg=KernelInfo(name="wg"))


def input_transform(a: int, n: int, t: int, c: int) -> UOp:
    """out[q, p, n, t, ch] = sum_r mat[p, r] * x[n, t + r, q, ch]: one pass of Winograd's input transform over an
    image's windows, the other window axis q (not yet transformed) outermost, as speck.tensor builds it."""
    rq, rp = UOp.range(a, 0, AxisType.GLOBAL), UOp.range(a, 1, AxisType.GLOBAL)
    rn, rt = UOp.range(n, 2, AxisType.GLOBAL), UOp.range(t, 3, AxisType.GLOBAL)
    rc, rr = UOp.range(c, 4, AxisType.GLOBAL), UOp.range(a, 5, AxisType.REDUCE)
    rows = t + a - 1
    mat = UOp.param(1, dtypes.float32.ptr(a * a)).index(rp * a + rr).load()
    x = UOp.param(2, dtypes.float32.ptr(n * rows * a * c)).index(((rn * rows + rt + rr) * a + rq) * c + rc).load()
    out = UOp.param(0, dtypes.float32.ptr(a * a * n * t * c)).index((((rq * a + rp) * n + rn) * t + rt) * c + rc)
    return UOp.sink(out.store((mat * x).reduce(rr, op=Ops.ADD)).end(rq, rp, rn, rt, rc), arg=KernelInfo(name="bt"))


def second_pass(a: int, cols: int) -> UOp:
    """out[p0, p1, col] = sum_q mat[p1, q] * t[q, p0, col]: the transform along the second window axis, its input
    (the first pass's output) read once per row block."""
    r0, r1 = UOp.range(a, 0, AxisType.GLOBAL), UOp.range(a, 1, AxisType.GLOBAL)
    rc, rq = UOp.range(cols, 2, AxisType.GLOBAL), UOp.range(a, 3, AxisType.REDUCE)
    mat = UOp.param(1, dtypes.float32.ptr(a * a)).index(r1 * a + rq).load()
    t = UOp.param(2, dtypes.float32.ptr(a * a * cols)).index((rq * a + r0) * cols + rc).load()
    out = UOp.param(0, dtypes.float32.ptr(a * a * cols)).index((r0 * a + r1) * cols + rc)
    return UOp.sink(out.store((mat * t).reduce(rq, op=Ops.ADD)).end(r0, r1, rc), arg=KernelInfo(name="bt2"))


def run_llvm(ast: UOp, renderer: LLVMRenderer, seed: int = 0, exact: bool = False) -> tuple[tuple[Opt, ...], str]:
    """Compile the heuristic's kernel with LLVM, run it in two worker slices and compare with the interpreter's
    run of the unoptimized AST (bit for bit when `exact`); returns (the applied opts, the LLVM source)."""
    inputs = bufs(ast, seed)
    want = run_ast(ast, inputs, {})
    uops = full_rewrite_to_sink(ast, renderer)
    src = renderer.render(uops)
    addr, keep = compile_llvm(src, uops[-1].arg.name)
    got = [b.copy() for b in inputs]
    ext = global_extent(uops, {})
    call(addr, uops, got, {}, (0, ext // 2))
    call(addr, uops, got, {}, (ext // 2, ext))
    if exact:
        np.testing.assert_array_equal(got[0], want)
    else:
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    del keep
    return uops[-1].arg.applied_opts, src


def test_layout_copy_upcasts_the_contiguously_read_axis_first() -> None:
    # channels (read contiguously) by a vector first, then the stored row: vector loads and stores, a transpose in
    # registers between them, instead of one scalar load per stored lane
    # (H and W merge into one axis of H * W: axis 2)
    assert heuristic(layout_copy(2, 32, 3, 24), WIDE) == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 2, 8)]
    assert heuristic(layout_copy(2, 32, 3, 24), NARROW) == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 2, 8)]
    # the channels upcast whole (16 of them) leave one axis fewer: the row's upcast still names the row
    assert heuristic(layout_copy(2, 16, 3, 16), WIDE) == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 1, 16)]
    # a 2-lane store (a 6x3 map) and x86's lane-by-lane shuffles keep the plain upcast
    for ast, r, want in (
        (layout_copy(2, 32, 3, 6), WIDE, [Opt(OptOps.UPCAST, 2, 2)]),
        (layout_copy(2, 32, 3, 24), X86Renderer(avx512=True), [Opt(OptOps.UPCAST, 2, 8)]),
    ):
        assert [o for o in heuristic(ast, r) if o.op is OptOps.UPCAST] == want
    for ast in (layout_copy(2, 32, 3, 24), layout_copy(2, 16, 3, 16), layout_copy(1, 64, 2, 20)):
        for r in (WIDE, NARROW):
            check_preserved(ast, r)


def test_layout_copy_compiles_to_vector_stores() -> None:
    # (a copy moves values: bit-identical to the unoptimized kernel)
    opts, src = run_llvm(layout_copy(2, 32, 4, 24), WIDE, seed=3, exact=True)
    assert opts == (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 2, 16))
    # each stored vector is whole; its lanes come from 16 channel runs, each one cache line
    assert "store <16 x float>" in src and "store float" not in src


@given(n=st.integers(1, 3), c=st.sampled_from([3, 8, 16, 24, 32, 48, 64]), h=st.integers(1, 4),
       w=st.integers(1, 33), wide=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=25, deadline=None)
def test_any_layout_copy_keeps_its_values(n: int, c: int, h: int, w: int, wide: bool, seed: int) -> None:
    check_preserved(layout_copy(n, c, h, w), WIDE if wide else NARROW, seed)


def test_long_reduction_two_vector_block_takes_8_rows_with_32_registers() -> None:
    # 3200 reduce steps: each pass over b's rows feeds 8 rows of a (16 accumulators of 32); a short reduction
    # (32 channels) and AVX2's 16 registers keep 4 rows
    assert heuristic(weight_gradient(4, 32, 32, 3200), WIDE)[:2] == [Opt(OptOps.UPCAST, 1, 8),
                                                                     Opt(OptOps.UPCAST, 2, 32)]  # fmt: skip
    assert heuristic(weight_gradient(4, 32, 32, 32), WIDE)[:2] == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 32)]
    assert heuristic(weight_gradient(4, 32, 32, 3200), NARROW)[:2] == [Opt(OptOps.UPCAST, 1, 4),
                                                                       Opt(OptOps.UPCAST, 2, 16)]  # fmt: skip
    # rows that 8 does not divide keep 4
    assert heuristic(weight_gradient(2, 12, 32, 512), WIDE)[0] == Opt(OptOps.UPCAST, 1, 4)
    opts, src = run_llvm(weight_gradient(2, 16, 32, 300), WIDE, seed=1)
    assert opts[:2] == (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 2, 32))


@given(p=st.integers(1, 3), m=st.sampled_from([4, 8, 12, 16, 24, 32]), n=st.sampled_from([16, 32, 48]),
       k=st.integers(250, 300), wide=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=12, deadline=None)
def test_any_long_reduction_block_keeps_its_result(p: int, m: int, n: int, k: int, wide: bool, seed: int) -> None:
    check_preserved(weight_gradient(p, m, n, k), WIDE if wide else NARROW, seed)


def test_input_transform_walks_the_images_outermost() -> None:
    # (q, p, N, T, C): p blocks rows, C columns; the window axis q outermost swept the whole input once per (q, p
    # block): the images go outermost instead, for AVX2 widths too
    for r in (WIDE, NARROW):
        opts = heuristic(input_transform(8, 64, 5, 32), r)
        assert opts[-1] == Opt(OptOps.SWAP, 0, 2) and opts[0] == Opt(OptOps.UPCAST, 1, 4)
        check_preserved(input_transform(8, 64, 2, 32), r)
    # too few images to be worth moving
    assert not any(o.op is OptOps.SWAP for o in heuristic(input_transform(8, 16, 5, 32), WIDE))
    opts, _ = run_llvm(input_transform(6, 64, 2, 32), WIDE, seed=2)
    assert Opt(OptOps.SWAP, 0, 2) in opts


def test_second_transform_pass_puts_column_blocks_outside_row_blocks() -> None:
    # (p0, p1, cols) over q: p1 blocks rows and the input ignores it; with the row blocks inside the column blocks
    # each slab of the input is read once
    opts = heuristic(second_pass(8, 1024), WIDE)
    assert opts == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 32), Opt(OptOps.SWAP, 1, 2)]
    check_preserved(second_pass(8, 1024), WIDE)
    check_preserved(second_pass(6, 512), NARROW)
    opts2, _ = run_llvm(second_pass(8, 512), WIDE, seed=4)
    assert Opt(OptOps.SWAP, 1, 2) in opts2


@given(a=st.sampled_from([4, 6, 8]), n=st.integers(60, 70), t=st.integers(1, 3), c=st.sampled_from([16, 32, 48]),
       wide=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
@settings(max_examples=10, deadline=None)
def test_any_transform_shape_keeps_its_result(a: int, n: int, t: int, c: int, wide: bool, seed: int) -> None:
    r = WIDE if wide else NARROW
    check_preserved(input_transform(a, n, t, c), r, seed)
    check_preserved(second_pass(a, n * c), r, seed)
