"""Test helpers for speck.codegen: compare buffers the way kernels may legitimately differ, run ASTs/programs."""

from __future__ import annotations

from typing import Any

import numpy as np

from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.numeric import from_storage
from speck.uop import DType, Ops, PtrDType, UOp, dtypes

_RTOL = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2, dtypes.float32: 2e-5, dtypes.float64: 1e-12}


def out_dtype(ast: UOp) -> DType:
    p = [u for u in ast.toposort() if u.op is Ops.PARAM and u.arg == 0][0]
    assert isinstance(p.dtype, PtrDType)
    return p.dtype.base


def run_ast(ast: UOp, inputs: list[np.ndarray], var_vals: dict[str, int]) -> np.ndarray:
    bufs = [b.copy() for b in inputs]
    eval_ast(ast, bufs, var_vals)
    return bufs[0]


def run_prog(uops: Any, inputs: list[np.ndarray], var_vals: dict[str, int], **kw: Any) -> np.ndarray:
    bufs = [b.copy() for b in inputs]
    run_program(uops, bufs, var_vals, **kw)
    return bufs[0]


def assert_same(expected: np.ndarray, got: np.ndarray, dt: DType, exact: bool) -> None:
    """ints/bools bit-exact; floats exact when `exact` (same operation order), else within a tolerance scaled to the
    output's magnitude (reassociated reductions round differently). NaN matches NaN, inf must match inf."""
    if not dtypes.is_float(dt):
        np.testing.assert_array_equal(expected, got)
        return
    e = from_storage(expected, dt).astype(np.float64)
    g = from_storage(got, dt).astype(np.float64)
    if exact:
        np.testing.assert_array_equal(e, g)
        return
    finite = np.isfinite(e) & np.isfinite(g)
    np.testing.assert_array_equal(np.isnan(e), np.isnan(g))
    np.testing.assert_array_equal(e[~finite & ~np.isnan(e)], g[~finite & ~np.isnan(e)])
    scale = max(1.0, float(np.max(np.abs(e[finite])))) if finite.any() else 1.0
    np.testing.assert_allclose(g[finite], e[finite], rtol=_RTOL[dt.scalar()], atol=_RTOL[dt.scalar()] * scale)


def has_op(uops: list[UOp], op: Ops) -> bool:
    return any(u.op is op for u in uops)
