"""LLVM renderer: the IR parses and verifies with llvmlite, keeps exact float semantics (no fast-math flags, no
maxnum/minnum), marks buffers noalias, and follows the CPU ABI; plus the hypothesis AST corpus lowered by the real
pipeline and executed through llvmlite's MCJIT and through gcc, both equal to the interpreter on the same program."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen_strategies import kernel_asts
from speck.codegen.cpu_features import host_vector_bytes
from speck.codegen.program import to_program
from speck.codegen.renderer.cstyle import ClangRenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, Ops, UOp, dtypes
from test_render_clang_golden import KERNELS
from test_render_clang_llvm_exec import (
    _llvm,
    alu,
    buf,
    cc,
    check_program,
    end,
    idx,
    linear,
    load,
    rng,
    store,
)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
_FAST_MATH = re.compile(
    r"\b(fadd|fsub|fmul|fdiv|frem|fneg|fcmp|call)\s+(fast|reassoc|nnan|ninf|nsz|arcp|contract|afn)\b"
)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_ir_parses_verifies_and_keeps_exact_semantics(name: str) -> None:
    uops = KERNELS[name]()
    src = LLVMRenderer().render(uops)
    llvm = _llvm()
    mod = llvm.parse_assembly(src)
    mod.verify()
    fn = mod.get_function(name)
    assert not fn.is_declaration
    assert not _FAST_MATH.search(src), "fast-math flags change results; the renderer must not emit them"
    assert "maxnum" not in src and "minnum" not in src and "maximum" not in src
    header = next(line for line in src.splitlines() if line.startswith("define "))
    nbuf = len([u for u in uops if u.op is Ops.PARAM])
    assert header.count("ptr noalias") == nbuf
    assert header.endswith("i32 %core_start, i32 %core_end) #0 {")


def test_abi_signature_order_vars_by_name() -> None:
    b = UOp.variable("b", 1, 8, dtypes.int32)
    a = UOp.variable("a", 1, 8, dtypes.int32)
    r = rng(a, 0)
    j = rng(b, 1, AxisType.LOOP)
    src = load(idx(buf(0, dtypes.float32, 1), cc(0, dtypes.int32)))
    st = store(idx(buf(1, dtypes.float32, 64), alu(Ops.ADD, alu(Ops.MUL, r, b), j)), src)
    uops = linear(r, j, st, end(st, j), end(end(st, j), r), name="sig")
    ir = LLVMRenderer().render(uops)
    assert "define void @sig(ptr noalias readonly %data0, ptr noalias %data1, i32 %var.a, i32 %var.b, i32 " \
           "%core_start, i32 %core_end)" in ir  # fmt: skip
    c = ClangRenderer().render(uops)
    assert (
        "void sig(const float* restrict data0, float* restrict data1, int a, int b, int core_start, int core_end)" in c
    )
    inp = np.array([3.5], np.float32)
    check_program(uops, [inp, np.zeros(64, np.float32)], {"a": 5, "b": 7})


def test_vector_width_follows_the_host() -> None:
    assert LLVMRenderer().max_vector_bytes == host_vector_bytes()
    assert LLVMRenderer(64).max_vec_lanes(dtypes.float32) == 16
    assert LLVMRenderer(32).max_vec_lanes(dtypes.float64) == 4
    with pytest.raises(ValueError, match="16, 32 or 64"):
        LLVMRenderer(48)


def test_wide_vectors_render_and_run() -> None:
    """A 512-bit vector (what an AVX-512 host gets) still renders and runs correctly: LLVM legalizes it elsewhere."""
    n = 4
    r = rng(n, 0)
    base = alu(Ops.MUL, r, cc(16, dtypes.int32))
    f16 = dtypes.float32.vec(16)
    v = load(idx(buf(1, dtypes.float32, 16 * n), base), f16)
    st = store(idx(buf(0, dtypes.float32, 16 * n), base), alu(Ops.MUL, v, v))
    uops = linear(r, st, end(st, r), name="wide")
    src = check_program(uops, [np.zeros(16 * n, np.float32), np.arange(16 * n, dtype=np.float32)], backends=("llvm",))
    assert "<16 x float>" in src["llvm"]


# ---------------------------------------------------------------------------------------------------------------------
# the hypothesis corpus through the real pipeline


def _corpus_case(case: tuple[UOp, list[np.ndarray], dict[str, int]], renderer: Any) -> None:
    """to_program -> the spec's own source, compiled and run over global_size[0] (whole and split across two
    workers) -> every buffer equals run_program on the spec's uops."""
    ast, inputs, var_vals = case
    spec = to_program(ast, renderer)
    assert spec.renderer == renderer.name
    extent = spec.launch_dims(var_vals)[0] if spec.global_size else 1
    check_program(spec.uops, inputs, var_vals, backends=(renderer.name,), extent=extent, src=spec.src)


@pytest.mark.slow
@given(kernel_asts())
def test_corpus_llvm_matches_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    _corpus_case(case, LLVMRenderer())


@pytest.mark.slow
@given(kernel_asts())
def test_corpus_c_matches_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    _corpus_case(case, ClangRenderer())


def test_nsw_only_where_bounds_rule_out_overflow() -> None:
    """Index math on loop counters whose bounds fit int32 gets `nsw` (LLVM's loop analysis then skips the wrap
    cases); arithmetic on loaded values may wrap and must not carry it. Both programs still run as the
    interpreter says, including a wrapping add."""
    r = rng(64, 0)
    src = buf(1, dtypes.int32, 64)
    offset = alu(Ops.ADD, alu(Ops.MUL, r, cc(3, dtypes.int32)), cc(5, dtypes.int32))  # 5..194: fits
    v = load(idx(src, alu(Ops.CMOD, offset, cc(64, dtypes.int32))))
    wrapped = alu(Ops.ADD, v, cc(2**31 - 10, dtypes.int32))  # a loaded value + a big constant: may wrap
    st = store(idx(buf(0, dtypes.int32, 64), r), wrapped)
    uops = linear(r, st, end(st, r), name="nsw")
    ir = LLVMRenderer().render(uops)
    assert re.search(r"mul nsw i32 %ridx0, 3", ir), ir
    assert re.search(r"add i32 %\w+, 2147483638", ir) and not re.search(r"add nsw i32 %\w+, 2147483638", ir), ir
    inp = np.arange(64, dtype=np.int32) * 1000
    check_program(uops, [np.zeros(64, np.int32), inp], backends=("llvm",))


def test_llvm_vector_bytes_setting_sets_the_default_width() -> None:
    # LLVM_VECTOR_BYTES=32 keeps an AVX-512 host to AVX2's vectors and 16-register blocking (to compare the two);
    # 0 is the host's widest; anything else is refused with the values it takes
    from speck.codegen.errors import CodegenValueError
    from speck.uop import Context

    with Context(LLVM_VECTOR_BYTES=32):
        r = LLVMRenderer()
        assert (r.max_vector_bytes, r.vector_registers) == (32, 16)
        assert LLVMRenderer(max_vector_bytes=64).max_vector_bytes == 64  # an explicit width wins
    with Context(LLVM_VECTOR_BYTES=0):
        assert LLVMRenderer().max_vector_bytes == host_vector_bytes()
    with Context(LLVM_VECTOR_BYTES=48), pytest.raises(CodegenValueError, match="16, 32 or 64"):
        LLVMRenderer()


def _stack_program(picks: list[tuple[int, int]], nvec: int) -> tuple[list[UOp], list[np.ndarray]]:
    """out[i*n + k] = STACK(lane l of vector v for (v, l) in picks)[k], the vectors being 4-float loads of `nvec`
    consecutive slices of input row i (v == nvec picks the row's scalar at its end, a broadcast when all lanes do)."""
    rows, n = 3, len(picks)
    width = 4 * nvec + 1
    r = rng(rows, 0)
    inp = buf(1, dtypes.float32, rows * width)
    base = alu(Ops.MUL, r, cc(width, dtypes.int32))
    vecs = [load(idx(inp, alu(Ops.ADD, base, cc(4 * v, dtypes.int32))), dtypes.float32.vec(4)) for v in range(nvec)]
    scalar = load(idx(inp, alu(Ops.ADD, base, cc(4 * nvec, dtypes.int32))))
    lanes = [scalar if v == nvec else vecs[v].gep(lane) for v, lane in picks]
    value = UOp(Ops.STACK, dtypes.float32.vec(n), tuple(lanes)) if n > 1 else lanes[0]
    out = idx(buf(0, dtypes.float32, rows * n), alu(Ops.MUL, r, cc(n, dtypes.int32)))
    st = store(out, value)
    data = np.random.default_rng(n).standard_normal(rows * width).astype(np.float32)
    return linear(r, st, end(st, r), name="stack"), [np.zeros(rows * n, np.float32), data]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.data())
def test_stacks_of_lanes_render_and_run(nvec: int, data: st.DataObject) -> None:
    """STACKs of vector lanes (one vector or two: a shufflevector; three: an insertelement chain) and broadcasts
    of a scalar run bit-identical to the interpreter and to the C renderer."""
    pick = st.tuples(st.integers(0, nvec), st.integers(0, 3))
    picks = data.draw(st.lists(pick, min_size=2, max_size=8))
    picks = [(v, 0) if v == nvec else (v, lane) for v, lane in picks]
    uops, inputs = _stack_program(picks, nvec)
    check_program(uops, inputs)


def test_two_vector_lanes_and_broadcasts_are_one_shuffle() -> None:
    """A STACK of lanes of two vectors is one shufflevector, a broadcast an insert and a splat, not a chain of one
    insertelement per lane (what InstCombine would fold into the same, parsing and folding it per module)."""
    uops, inputs = _stack_program([(0, 3), (1, 0), (0, 1), (1, 2), (0, 0)], 2)
    src = check_program(uops, inputs, backends=("llvm",))["llvm"]
    assert src.count("shufflevector") == 1 and "insertelement" not in src
    assert "<5 x i32> <i32 3, i32 4, i32 1, i32 6, i32 0>" in src
    uops, inputs = _stack_program([(1, 0)] * 8, 1)
    src = check_program(uops, inputs, backends=("llvm",))["llvm"]
    assert src.count("insertelement") == 1 and "<8 x i32> zeroinitializer" in src
