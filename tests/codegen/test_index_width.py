"""Index math width: int32 unless bounds need int64, or the renderer prefers int64 (`Renderer.index_int64`, set by
the LLVM CPU renderer: int32 index math reaches LLVM sign-extended at every 64-bit address, and its loop analyses
spent much of a kernel's compile on it). Int32 data compared with an index (cast to int32) stays an int32 compare."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen import KernelInfo, run_program
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer import Renderer
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, GroupOp, Ops, UOp, dtypes


def gather_kernel(rows: int, cols: int) -> UOp:
    """out[r] = sum over c of m[r*cols + c] (index arithmetic: a multiply and an add of two ranges)."""
    r, c = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + c).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(rows)).index(r).store(m.reduce(c, op=Ops.ADD)).end(r),
                    arg=KernelInfo("gather", dont_opt=True))  # fmt: skip


def one_hot_kernel(n: int, classes: int) -> UOp:
    """out[i*classes + k] = labels[i] == k ? 1 : 0 (int32 data compared with a range)."""
    i, k = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(classes, 1, AxisType.LOOP)
    lab = UOp.param(1, dtypes.int32.ptr(n)).index(i).load()
    hot = lab.ne(k.cast(dtypes.int32)).where(UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, 1.0))
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n * classes)).index(i * classes + k).store(hot).end(i, k),
                    arg=KernelInfo("one_hot", dont_opt=True))  # fmt: skip


def _index_dtypes(uops: list[UOp]) -> set[str]:
    """The dtypes of the ranges and of the index arithmetic feeding INDEX nodes."""
    out = {u.dtype.name for u in uops if u.op is Ops.RANGE}
    for u in uops:
        if u.op is Ops.INDEX and len(u.src) > 1:
            out |= {x.dtype.name for x in u.src[1].toposort() if x.op in GroupOp.ALU and x.dtype.count == 1}
    return out


def test_llvm_renderer_lowers_index_math_to_int64() -> None:
    assert LLVMRenderer.index_int64 and not Renderer.index_int64 and not AMDGPURenderer.index_int64
    assert _index_dtypes(full_rewrite_to_sink(gather_kernel(3, 4), LLVMRenderer(max_vector_bytes=32))) == {"long"}


@pytest.mark.parametrize("renderer", [Renderer(), AMDGPURenderer()], ids=["base", "amdgpu"])
def test_other_renderers_keep_int32_index_math(renderer: Renderer) -> None:
    assert _index_dtypes(full_rewrite_to_sink(gather_kernel(3, 4), renderer)) == {"int"}


def test_int32_data_compared_with_an_int64_index_compares_at_int32() -> None:
    uops = full_rewrite_to_sink(one_hot_kernel(4, 3), LLVMRenderer(max_vector_bytes=32))
    cmps = [u for u in uops if u.op in GroupOp.Comparison and any(s.op is Ops.LOAD for s in u.src)]
    assert cmps and all(s.dtype.scalar() == dtypes.int32 for u in cmps for s in u.src)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_int64_index_programs_compute_what_numpy_does(rows: int, cols: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(rows * cols).astype(np.float32)
    out = np.zeros(rows, np.float32)
    run_program(full_rewrite_to_sink(gather_kernel(rows, cols), LLVMRenderer(max_vector_bytes=32)), [out, m], {})
    np.testing.assert_allclose(out, m.reshape(rows, cols).sum(axis=1), rtol=1e-5, atol=1e-5)
    labels = rng.integers(0, cols, rows).astype(np.int32)
    hot = np.zeros(rows * cols, np.float32)
    run_program(full_rewrite_to_sink(one_hot_kernel(rows, cols), LLVMRenderer(max_vector_bytes=32)), [hot, labels], {})
    np.testing.assert_array_equal(hot.reshape(rows, cols), np.eye(cols, dtype=np.float32)[labels])
