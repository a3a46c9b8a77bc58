"""The x86 backend on register-blocked kernels (the heuristic's LLVM-grade opts): matmuls and convolutions blocked
into rows x vectors of accumulators, short-span loads broadcast lane by lane, vectors of 3/5/6/7 lanes, and fused
multiply-adds. Every kernel runs natively (whole range and two worker slices) and must match the interpreter on the
same lowered program bit for bit (fp_contract off), and the unoptimized AST within the reassociation tolerance."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen_helpers import assert_same
from speck.codegen.interpret import eval_ast
from speck.codegen.opt import Opt, OptOps
from speck.codegen.program import to_program
from speck.codegen.x86 import X86Compiler, X86Renderer
from speck.uop import AxisType, Context, DType, Ops, UOp, dtypes
from test_opt_perf import (
    bufs,
    channel_sum,
    conv_channel_last,
    heuristic,
    matmul,
    packed_matmul,
    single_channel_conv,
    single_channel_weight_grad,
)
from test_x86_kernels import _k, asm, check, pytestmark, run_x86  # noqa: F401  (pytestmark: gcc links the objects)


@pytest.fixture(autouse=True)
def _avx2() -> Iterator[None]:
    """These tests check AVX2 forms (ymm broadcasts, vblendvps masks): on an AVX-512 host too (test_x86_avx512*.py
    covers the zmm path)."""
    with Context(X86_AVX512=0):
        yield


BLOCKED = {
    "matmul_64x32x256": lambda: matmul(64, 32, 256),
    "matmul_10x16x24": lambda: matmul(10, 16, 24),
    "matmul_transposed_b": lambda: matmul(8, 32, 10, transposed_b=True),
    "matmul_bias_batch": lambda: matmul(12, 8, 32, bias=True, batch=2),
    "packed_matmul": lambda: packed_matmul(8, 16, 32),
    "conv_channel_last": lambda: conv_channel_last(2, 8, 16, 12, 3),
    "single_channel_conv": lambda: single_channel_conv(),
    "single_channel_weight_grad": lambda: single_channel_weight_grad(),
    "weight_grad_channel_last": lambda: weight_grad(),
    "channel_sum_pooled": lambda: channel_sum(6, True),
}


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_kernels_match_the_interpreter(name: str) -> None:
    ast = BLOCKED[name]()
    assert heuristic(ast, X86Renderer()), "the heuristic should block or vectorize this kernel for x86"
    spec = check(ast, bufs(ast, seed=3), {})
    assert spec.uops[-1].arg.applied_opts and re.search(r"v\w+ps [xy]mm", asm(spec))


def test_blocked_matmul_inner_loop_broadcasts_from_memory() -> None:
    """4 rows x 2 vectors: each reduce step broadcasts a[i, r] for 4 rows straight from memory (no lane shuffles)
    and multiplies them with two vector loads of b."""
    spec = to_program(matmul(64, 32, 256), X86Renderer())
    assert asm(spec).count("vbroadcastss ymm") >= 4
    assert "vinsertps" not in asm(spec) and "vpermilps" not in asm(spec)


def weight_grad(n: int = 2, co: int = 16, ci: int = 2, hw: int = 8, k: int = 5) -> UOp:
    """dw[c, i, j, o] = sum_{b,y,x} g[b, y, x, o] * img[b, c, y+i, x+j]: a convolution's weight gradient with a
    channel-last output gradient, stored channel-last (the layout speck.tensor's convolutions use)."""
    o, c, i, j = (UOp.range(s, a, AxisType.GLOBAL) for a, s in enumerate((co, ci, k, k)))
    b, y, x = (UOp.range(s, 4 + a, AxisType.REDUCE) for a, s in enumerate((n, hw, hw)))
    w_in = hw + k - 1
    g = UOp.param(1, dtypes.float32.ptr(n * co * hw * hw)).index(((b * hw + y) * hw + x) * co + o).load()
    img = UOp.param(2, dtypes.float32.ptr(n * ci * w_in * w_in)).index(((b * ci + c) * w_in + y + i) * w_in + x + j)
    dw = UOp.param(0, dtypes.float32.ptr(co * ci * k * k)).index(((c * k + i) * k + j) * co + o)
    return _k("wgrad", dw.store((g * img.load()).reduce(b, y, x, op=Ops.ADD)).end(c, i, j, o))


def test_short_span_load_of_five_lanes_is_never_read_whole() -> None:
    """A block of the 5 window columns reads 5 consecutive inputs per step (one 5-lane load in the program): each
    lane is broadcast from memory, so the 5-lane vector, which no register width holds exactly, is never loaded."""
    ast = weight_grad()
    spec = check(ast, bufs(ast, seed=1), {})
    assert any(u.op is Ops.LOAD and u.dtype.count == 5 for u in spec.uops)
    assert asm(spec).count("vbroadcastss ymm") >= 5 and "vinsertps" not in asm(spec)


def _odd_copy(lanes: int, extent: int, size: int) -> UOp:
    """out[i] = in[i] * 2 + 1 for i < extent, out and in of `size` floats, upcast by `lanes` (explicit opt)."""
    r = UOp.range(extent, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(size)).index(r).load()
    ast = _k(f"odd{lanes}", UOp.param(0, dtypes.float32.ptr(size)).index(r).store(x * 2.0 + 1.0).end(r))
    return ast.replace(arg=ast.arg.replace(opts=(Opt(OptOps.UPCAST, 0, lanes),)))


@pytest.mark.parametrize("lanes", [2, 3, 5, 6, 7])
def test_odd_width_vectors_touch_exactly_their_lanes(lanes: int) -> None:
    """Loads and stores of 3/5/6/7 lanes are put together from an xmm, a pair and a single: the elements past the
    computed range (still in the buffer) keep their values, and the input past it is never needed."""
    extent = 4 * lanes
    ast = _odd_copy(lanes, extent, extent + 8)
    g = np.random.default_rng(lanes)
    out = np.full(extent + 8, 7.25, np.float32)
    spec = check(ast, [out, g.standard_normal(extent + 8).astype(np.float32)], {})
    assert any(u.op is Ops.STORE and u.src[1].dtype.count == lanes for u in spec.uops)
    got = run_x86(spec, [out, g.standard_normal(extent + 8).astype(np.float32)], {})[0]
    np.testing.assert_array_equal(got[extent:], 7.25)


@pytest.mark.parametrize("k", range(8))
def test_broadcast_of_a_register_lane(k: int) -> None:
    """GEP(x, (k,)*8) of a computed vector (not a load): lane k moved to lane 0 and broadcast (vpermilps,
    vextractf128, vbroadcastss)."""
    from test_render_clang_llvm_exec import alu, buf, cc, end, idx, linear, load, rng, store

    f8 = dtypes.float32.vec(8)
    r = rng(cc(2, dtypes.int32), 0)
    base = alu(Ops.MUL, r, cc(8, dtypes.int32))
    v = alu(Ops.ADD, load(idx(buf(1, dtypes.float32, 16), base), f8), load(idx(buf(2, dtypes.float32, 16), base), f8))
    b = UOp(Ops.GEP, f8, (v,), (k,) * 8)
    st = store(idx(buf(0, dtypes.float32, 16), base), alu(Ops.MUL, b, v))
    from test_x86_kernels import check_program

    g = np.random.default_rng(k)
    ins = [np.zeros(16, np.float32), g.standard_normal(16).astype(np.float32), g.standard_normal(16).astype(np.float32)]
    src = check_program(linear(r, st, end(st, r), name=f"bcast{k}"), ins, 2, 3)
    assert "vbroadcastss ymm" in src and "vinsertps" not in src


def test_fp_contract_fuses_accumulator_updates_into_fma() -> None:
    """With fp_contract the blocked matmul's accumulator updates are vfmadd231ps with a memory operand or a
    broadcast, rounded once: close to the exact sum, and no separate multiply remains in the inner loop."""
    ast = matmul(32, 64, 64)
    inputs = bufs(ast, seed=2)
    spec = to_program(ast, X86Renderer(fp_contract=True), X86Compiler())
    assert "vfmadd231ps" in asm(spec) and "vmulps" not in asm(spec)
    got = run_x86(spec, inputs, {})[0]
    want = [b.copy() for b in inputs]
    eval_ast(ast, want, {})
    assert_same(want[0], got, dtypes.float32, exact=False)
    exact = to_program(ast, X86Renderer(), X86Compiler())
    assert "vfmadd" not in asm(exact)  # the default stays exact (interpreter bit for bit)


def _fma_kernel(dt: DType, n: int = 16) -> UOp:
    """out = a*b + c + (a*b)*0.5: the first sum fuses only where the product has no other use."""
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, b, c = (UOp.param(k, dt.ptr(n)).index(r).load() for k in (1, 2, 3))
    out = UOp.param(0, dt.ptr(n)).index(r)
    return _k("fma_ew", out.store(a * b + c).end(r))


@pytest.mark.parametrize(("dt", "opts"), [(dtypes.float32, ()), (dtypes.float64, ()),
                                          (dtypes.float32, (Opt(OptOps.UPCAST, 0, 8),))])  # fmt: skip
def test_fp_contract_scalar_and_vector_multiply_add(dt: DType, opts: tuple[Opt, ...]) -> None:
    ast = _fma_kernel(dt)
    info = ast.arg.replace(opts=opts) if opts else ast.arg.replace(dont_opt=True)
    spec = to_program(ast.replace(arg=info), X86Renderer(fp_contract=True), X86Compiler())
    op = "vfmadd231ps" if opts else "vfmadd231ss" if dt == dtypes.float32 else "vfmadd231sd"
    assert op in asm(spec) and "vmul" not in asm(spec)
    g = np.random.default_rng(4)
    npdt = np.float32 if dt == dtypes.float32 else np.float64
    ins = [np.zeros(16, npdt)] + [g.standard_normal(16).astype(npdt) for _ in range(3)]
    got = run_x86(spec, ins, {})[0]
    np.testing.assert_allclose(got, ins[1] * ins[2] + ins[3], rtol=1e-6 if dt == dtypes.float32 else 1e-14)


def test_fp_contract_leaves_a_shared_product_alone() -> None:
    n = 16
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, b, c = (UOp.param(k, dtypes.float32.ptr(n)).index(r).load() for k in (1, 2, 3))
    prod = a * b
    ast = _k("shared", UOp.param(0, dtypes.float32.ptr(n)).index(r).store((prod + c) * prod).end(r))
    spec = to_program(ast.replace(arg=ast.arg.replace(dont_opt=True)), X86Renderer(fp_contract=True), X86Compiler())
    assert "vfmadd" not in asm(spec) and "vmulss" in asm(spec)


@given(n=st.integers(1, 20), k=st.integers(1, 40), m=st.integers(1, 40), seed=st.integers(0, 3))
@settings(max_examples=20)
def test_any_blocked_matmul_shape_matches_the_interpreter(n: int, k: int, m: int, seed: int) -> None:
    ast = matmul(n, k, m)
    check(ast, bufs(ast, seed), {})


# ---------------------------------------------------------------------------------------------------------------------
# bool vectors as lane masks


def _mask_kernel(lanes: int, n: int = 40) -> UOp:
    """Comparisons of float32 vectors (NaN operands included), bool logic and comparisons of bools, WHERE on
    floats and on bools, bool <-> float casts, and bool buffers read and written: out_f = f(...), out_b = g(...)."""
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, b = (UOp.param(k, dtypes.float32.ptr(n)).index(r).load() for k in (2, 3))
    m = UOp.param(4, dtypes.bool.ptr(n)).index(r).load()
    lt, ne, eq = a < b, a.alu(Ops.CMPNE, b), a.alu(Ops.CMPEQ, b)
    both = (lt & m) | (ne ^ eq.alu(Ops.CMPNE, m))
    f = both.where(a, b) + lt.cast(dtypes.float32) * 2.0 + a.cast(dtypes.bool).cast(dtypes.float32)
    g = (lt.alu(Ops.CMPLT, m)).where(ne, eq & m)
    outf = UOp.param(0, dtypes.float32.ptr(n)).index(r).store(f)
    outb = UOp.param(1, dtypes.bool.ptr(n)).index(r).store(g)
    ast = _k(f"masks{lanes}", outf.end(r), outb.end(r))
    return ast.replace(arg=ast.arg.replace(opts=(Opt(OptOps.UPCAST, 0, lanes),)))


@pytest.mark.parametrize("lanes", [8, 4, 5, 2])
def test_bool_vectors_are_lane_masks(lanes: int) -> None:
    n = 40
    g = np.random.default_rng(lanes)
    a, b = g.standard_normal(n).astype(np.float32), g.standard_normal(n).astype(np.float32)
    a[::7], b[3::9], a[5::11], b[6] = np.nan, np.nan, 0.0, a[6]
    b[::5] = a[::5]
    ins = [np.zeros(n, np.float32), np.zeros(n, np.bool_), a, b, g.random(n) < 0.5]
    spec = check(_mask_kernel(lanes, n), ins, {})
    assert any(u.op is Ops.STORE and u.src[1].dtype == dtypes.bool.vec(lanes) for u in spec.uops)
    for form in ("vcmpltps", "vcmpneqps", "vblendvps", "vandps") + (("vpmovzxbd", "vpabsb") if lanes in (4, 8) else ()):
        assert form in asm(spec), form


def test_lanes_of_a_strided_store_share_one_index_register() -> None:
    """Upcast along an axis the store is strided in, the 8 lanes' indices differ only by constants: they share
    one register and the constants become displacements (no register per lane, no spills)."""
    n = 16
    i, j = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(n * n)).index(i * n + j).load()
    ast = _k("transpose", UOp.param(0, dtypes.float32.ptr(n * n)).index(j * n + i).store(x + 1.0).end(i, j))
    ast = ast.replace(arg=ast.arg.replace(opts=(Opt(OptOps.UPCAST, 1, 8),)))
    g = np.random.default_rng(0)
    spec = check(ast, [np.zeros(n * n, np.float32), g.standard_normal(n * n).astype(np.float32)], {})
    stores = re.findall(r"vmovss DWORD PTR \[(\w+\+\w+\*4)(?:\+(0x[0-9a-f]+))?\]", asm(spec))
    assert len(stores) == 8 and len({base for base, _ in stores}) == 1, stores
    assert sorted(int(d or "0", 16) for _, d in stores) == [4 * n * k for k in range(8)]
    assert "[rsp" not in asm(spec)  # nothing spilled
