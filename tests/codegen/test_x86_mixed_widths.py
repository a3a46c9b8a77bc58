"""Vectors of several widths in one x86 kernel: 2/4/8-lane float32 values next to 16-lane ones (AVX-512) or 8-lane
ones (AVX2), as UPCAST/UNROLL opts of 2, 4 and 8 on one axis and a full vector on another make them (a row operand
broadcast over an upcast column block, an unrolled reduce axis feeding wider accumulators).

Each kernel runs for both instruction sets and is compared with numpy: the AVX-512 object natively where the host
has avx512f, else in the emulator (codegen_x86emu.py); the AVX2 object natively. check_both (the emulated AVX-512 and
native AVX2 objects, bit for bit against the interpreter on their lowered programs) runs too. Before the fix a
16-lane GEP of a narrower vector was left in a ymm (an EncodingError when an instruction mixed it with zmm operands,
a wrong upper half where it was stored), and the index constants of an unrolled reduction could be placed after the
access using them (ProgramFormError).
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from codegen_x86emu import emulate
from speck.codegen.cpu_features import host_has_avx512f
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt, OptOps
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.x86 import X86Compiler, X86Renderer
from speck.codegen.x86.legalize import legalize
from speck.uop import AxisType, Ops, UOp, dtypes
from test_opt_perf import channel_sum, heuristic, matmul, rowsum
from test_render_clang_llvm_exec import alu, buf, cc, end, idx, linear, load, rng, store
from test_x86_avx512_emulated import check_both, emulated
from test_x86_kernels import link, run_x86

pytestmark = [pytest.mark.skipif(shutil.which("objdump") is None or shutil.which("gcc") is None,
                                 reason="objdump decodes for the emulator; gcc links the native objects")]  # fmt: skip


def run_isa(spec: ProgramSpec, inputs: list[np.ndarray], avx512: bool) -> list[np.ndarray]:
    """The kernel over its whole global range: natively, or emulated when the host cannot run AVX-512."""
    n = int(spec.launch_dims({})[0]) if spec.global_size else 1
    if avx512 and not host_has_avx512f():
        return emulated(spec, inputs, [(0, n)])[0]
    return run_x86(spec, inputs, {}, [(0, n)])


def with_opts(ast: UOp, *opts: Opt) -> UOp:
    return ast.replace(arg=ast.arg.replace(opts=opts))


def against_numpy(ast: UOp, inputs: list[np.ndarray], want: np.ndarray, exact: bool) -> None:
    """Both instruction sets against numpy's result for buffer 0, and check_both against the interpreter."""
    for avx512 in (True, False):
        spec = to_program(ast, X86Renderer(avx512=avx512), X86Compiler())
        got = run_isa(spec, inputs, avx512)[0]
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=f"avx512={avx512}")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"avx512={avx512}")
    check_both(ast, inputs)


# ---------------------------------------------------------------------------------------------------------------------
# elementwise: a row vector and a column vector broadcast over a block of `rows` x `cols` outputs

ROWS, COLS = 8, 32
EW_OPS = {
    "mul_add_relu": (lambda a, w, c: (a * w + c).alu(Ops.MAX, UOp.const(dtypes.float32, 0.0)),
                     lambda a, w, c: np.maximum(a * w + c, np.float32(0))),
    "sub_div": (lambda a, w, c: (a - c) / w, lambda a, w, c: (a - c) / w),
    "where_lt": (lambda a, w, c: (a < c).where(a, w), lambda a, w, c: np.where(a < c, a, w)),
    "max_neg": (lambda a, w, c: (-a).alu(Ops.MAX, w * c), lambda a, w, c: np.maximum(-a, w * c)),
}  # fmt: skip


def broadcast_kernel(op: str) -> UOp:
    """out[i, j] = f(a[i, j], w[j], c[i])."""
    i, j = UOp.range(ROWS, 0, AxisType.GLOBAL), UOp.range(COLS, 1, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(ROWS * COLS)).index(i * COLS + j).load()
    w = UOp.param(2, dtypes.float32.ptr(COLS)).index(j).load()
    c = UOp.param(3, dtypes.float32.ptr(ROWS)).index(i).load()
    out = UOp.param(0, dtypes.float32.ptr(ROWS * COLS)).index(i * COLS + j).store(EW_OPS[op][0](a, w, c))
    return UOp.sink(out.end(i, j), arg=KernelInfo(name=f"bcast_{op}"))


@pytest.mark.parametrize("op", sorted(EW_OPS))
@pytest.mark.parametrize(("cols", "rows"), [(4, 4), (8, 2), (8, 4), (16, 2), (4, 8), (16, 4)])
def test_row_and_column_broadcasts(op: str, cols: int, rows: int) -> None:
    g = np.random.default_rng(cols * rows)
    a = g.standard_normal((ROWS, COLS)).astype(np.float32)
    w = g.standard_normal(COLS).astype(np.float32) + np.float32(3)
    c = g.standard_normal(ROWS).astype(np.float32)
    ast = with_opts(broadcast_kernel(op), Opt(OptOps.UPCAST, 1, cols), Opt(OptOps.UPCAST, 0, rows))
    want = EW_OPS[op][1](a, w[None, :], c[:, None]).astype(np.float32).reshape(-1)
    against_numpy(ast, [np.zeros(ROWS * COLS, np.float32), a.reshape(-1), w, c], want, exact=True)


# ---------------------------------------------------------------------------------------------------------------------
# reductions: matmuls (b broadcast over a column block, rows of a over the row block) and row sums, unrolled


MM_OPTS = [(1, 4, 0), (1, 8, 0), (1, 16, 0), (2, 8, 0), (4, 4, 0), (4, 8, 0), (1, 4, 4), (1, 8, 2), (1, 16, 4),
           (2, 4, 4), (4, 16, 4), (1, 8, 8)]  # fmt: skip


@pytest.mark.parametrize(("rows", "cols", "unroll"), MM_OPTS)
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_blocks(rows: int, cols: int, unroll: int, transposed: bool) -> None:
    n, k, m = 8, 32, 32
    opts = [Opt(OptOps.UPCAST, 0, rows)] if rows > 1 else []
    opts += [Opt(OptOps.UPCAST, 1, cols)] + ([Opt(OptOps.UNROLL, 0, unroll)] if unroll else [])
    ast = with_opts(matmul(n, k, m, transposed_b=transposed), *opts)
    g = np.random.default_rng(rows + cols + unroll)
    a = g.standard_normal((n, k)).astype(np.float32)
    b = g.standard_normal((m, k) if transposed else (k, m)).astype(np.float32)
    want = (a.astype(np.float64) @ (b.T if transposed else b).astype(np.float64)).astype(np.float32).reshape(-1)
    against_numpy(ast, [np.zeros(n * m, np.float32), a.reshape(-1), b.reshape(-1)], want, exact=False)


@pytest.mark.parametrize(("rows", "unroll"), [(4, 4), (4, 8), (16, 4), (8, 16), (2, 8)])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_row_reductions(rows: int, unroll: int, op: Ops) -> None:
    n, k = 16, 64
    ast = with_opts(rowsum(n, k, op), Opt(OptOps.UPCAST, 0, rows), Opt(OptOps.UNROLL, 0, unroll))
    x = np.random.default_rng(rows * unroll).standard_normal((n, k)).astype(np.float32)
    want = ((x * x).sum(axis=1) if op is Ops.ADD else (x * x).max(axis=1)).astype(np.float32)
    against_numpy(ast, [np.zeros(n, np.float32), x.reshape(-1)], want, exact=op is Ops.MAX)


def test_unrolled_index_constants_precede_their_accesses() -> None:
    """The shared part of an unrolled access's index may be an (interned) product another access builds later in
    the program: legalization moves it up, so every value is defined before its use."""
    ast = with_opts(matmul(8, 32, 32), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 0, 4))
    for avx512 in (True, False):
        uops = legalize(list(to_program(ast, X86Renderer(avx512=avx512), None).uops), "mm")
        seen: set[UOp] = set()
        for u in uops:
            late = [s for s in u.src if s not in seen and not (s.op is Ops.CAST and s.src[0].op is Ops.CONST)
                    and s.op is not Ops.CONST]  # fmt: skip
            assert not late, f"{u.op.name} reads {[s.op.name for s in late]} before it is defined"
            seen.add(u)


# ---------------------------------------------------------------------------------------------------------------------
# a 16-lane GEP of a narrower vector, stored as it is (the store reads the whole zmm)


def _patterns(lanes: int) -> dict[str, tuple[int, ...]]:
    perm = np.random.default_rng(lanes).integers(0, lanes, 16)
    return {
        "tile": tuple(i % lanes for i in range(16)),
        "spread": tuple(i * lanes // 16 for i in range(16)),
        "one_lane": (lanes - 1,) * 16,
        "reversed": tuple(lanes - 1 - i % lanes for i in range(16)),
        "random": tuple(int(x) for x in perm),
    }


@pytest.mark.parametrize("lanes", [2, 4, 5, 8])
@pytest.mark.parametrize("pattern", ["tile", "spread", "one_lane", "reversed", "random"])
def test_sixteen_lanes_of_a_narrow_vector(lanes: int, pattern: str) -> None:
    """out[16 t + i] = x[8 t + p[i]] + y[16 t + i]: the GEP's 16 lanes are read by an add with a loaded zmm, then
    the GEP alone is stored to a second buffer."""
    p = _patterns(lanes)[pattern]
    f16 = dtypes.float32.vec(16)
    tiles = 3
    r = rng(cc(tiles, dtypes.int32), 0)
    x = load(idx(buf(2, dtypes.float32, 8 * tiles), alu(Ops.MUL, r, cc(8, dtypes.int32))), dtypes.float32.vec(lanes))
    wide = alu(Ops.MUL, r, cc(16, dtypes.int32))
    gx = UOp(Ops.GEP, f16, (x,), p)
    y = load(idx(buf(3, dtypes.float32, 16 * tiles), wide), f16)
    s0 = store(idx(buf(0, dtypes.float32, 16 * tiles), wide), alu(Ops.ADD, gx, y))
    s1 = store(idx(buf(1, dtypes.float32, 16 * tiles), wide), gx)
    name = f"gep16_{lanes}_{pattern}"
    uops = linear(r, s0, s1, end(s1, r), name=name)
    g = np.random.default_rng(lanes)
    xs, ys = g.standard_normal(8 * tiles).astype(np.float32), g.standard_normal(16 * tiles).astype(np.float32)
    gathered = np.concatenate([xs[8 * t + np.array(p)] for t in range(tiles)])
    lib = X86Compiler().compile(X86Renderer(avx512=True).render(uops))
    assert "zmm" in X86Compiler().disassemble(lib)
    ins = [np.zeros(16 * tiles, np.float32), np.zeros(16 * tiles, np.float32), xs, ys]
    got = [b.copy() for b in ins]
    if host_has_avx512f():
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 4), ctypes.c_int32, ctypes.c_int32)(link(lib, name))
        fn(*[b.ctypes.data for b in got], 0, tiles)
    else:
        emulate(lib, name, [*got, 0, tiles])
    np.testing.assert_array_equal(got[1], gathered)
    np.testing.assert_array_equal(got[0], gathered + ys)


# ---------------------------------------------------------------------------------------------------------------------
# the heuristic's 4-lane unroll of a row reduction on AVX-512 (x86 declares mixed_vector_widths)


@pytest.mark.parametrize("hw", [20, 12])
def test_per_channel_sums_unroll_the_image_row_by_four(hw: int) -> None:
    """BatchNorm's backward sum over a pooled operand: with AVX-512's 16 lanes the x86 heuristic unrolls the image
    row by 4 as LLVM's does (not 16 channels gathered lane by lane), and the kernel sums what numpy sums."""
    n, c = 4, 8
    ast = channel_sum(hw, True, n, c)
    assert heuristic(ast, X86Renderer(avx512=True)) == [Opt(OptOps.UNROLL, 2, 4)]
    g = np.random.default_rng(hw)
    x = g.standard_normal((n, c, hw, hw)).astype(np.float32)
    p = g.standard_normal((n, c, hw // 2, hw // 2)).astype(np.float32)
    up = p.repeat(2, axis=2).repeat(2, axis=3)
    want = (x.astype(np.float64) * up).sum(axis=(0, 2, 3)).astype(np.float32)
    against_numpy(ast, [np.zeros(c, np.float32), x.reshape(-1), p.reshape(-1)], want, exact=False)
