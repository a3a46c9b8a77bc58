"""Kernels that read a buffer after their own stores into it (AFTER(PARAM, STORE...)), the form hand-written
kernels (speck.tensor's custom_kernel) accumulate in: accepted by the AST check, lowered by every backend to a
program the interpreter runs to numpy's result, with stores of one loop grouped next to a nested loop's END."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.backends import get_backend
from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.lower.ast_check import check_kernel_ast
from speck.uop import AxisType, UOp, dtypes

BACKENDS = ["PYTHON", "CLANG", "LLVM", "X86"]


def gemm_ast(m: int, n: int, k: int) -> UOp:
    """C[i, j] = 0; for r: C[i, j] = C[i, j] + A[i, r] * B[r, j]: the init store and the closed r loop are grouped
    under the END of (i, j)."""
    c = UOp.param(0, dtypes.float32.ptr(m * n))
    a, b = UOp.param(1, dtypes.float32.ptr(m * k)), UOp.param(2, dtypes.float32.ptr(k * n))
    i, j, r = UOp.range(m, 0, AxisType.LOOP), UOp.range(n, 1, AxisType.LOOP), UOp.range(k, 2, AxisType.REDUCE)
    init = c.index(i * n + j).store(UOp.const(dtypes.float32, 0.0))
    c1 = c.after(init)
    acc = c1.after(r).index(i * n + j).load()
    upd = c1.index(i * n + j).store(acc + a.index(i * k + r).load() * b.index(r * n + j).load()).end(r)
    return UOp.sink(UOp.group(init, upd).end(i, j), arg=KernelInfo(name="after_gemm", dont_opt=True))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(1, 5), k=st.integers(1, 6))
def test_gemm_accumulating_in_place(backend: str, m: int, n: int, k: int) -> None:
    ast = gemm_ast(m, n, k)
    check_kernel_ast(ast)
    spec = get_backend(backend).to_program(ast, compile=False)
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    an, bn = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)
    out = np.full(m * n, np.nan, np.float32)
    run_program(spec.uops, [out, an.ravel(), bn.ravel()], {})
    np.testing.assert_allclose(out.reshape(m, n), an @ bn, rtol=1e-5, atol=1e-6)
    assert [a.role for a in spec.buffers] == ["inout", "in", "in"]


def test_after_must_sit_on_a_param() -> None:
    c = UOp.param(0, dtypes.float32.ptr(4))
    i = UOp.range(4, 0)
    bad = UOp.const(dtypes.float32, 1.0).after(c.index(i).store(UOp.const(dtypes.float32, 2.0)))
    ast = UOp.sink(c.index(i).store(bad).end(i))
    with pytest.raises(RuntimeError, match="AFTER"):
        check_kernel_ast(ast)
