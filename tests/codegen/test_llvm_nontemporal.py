"""Non-temporal stores in the LLVM renderer: whole-vector stores into a buffer of at least the renderer's
`nontemporal_min_bytes` are `!nontemporal` behind a check of the address's alignment (a view at an odd offset takes
the cached store), the kernel ends with sfence, smaller buffers and scalar stores are plain; the compiled kernel's
results equal numpy's on aligned and misaligned outputs."""

from __future__ import annotations

import numpy as np
import pytest

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt, OptOps
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer.llvmir import NONTEMPORAL_MIN_BYTES, LLVMRenderer
from speck.uop import AxisType, UOp, dtypes
from test_render_clang_llvm_exec import call, compile_llvm, global_extent


def add_kernel(n: int, upcast: int) -> UOp:
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(n)).index(i).load()
    b = UOp.param(2, dtypes.float32.ptr(n)).index(i).load()
    out = UOp.param(0, dtypes.float32.ptr(n))
    opts = (Opt(OptOps.UPCAST, 0, upcast),) if upcast > 1 else ()
    return UOp.sink(out.index(i).store(a + b).end(i), arg=KernelInfo(name="add", opts=opts, dont_opt=not opts))


def renderer(least: int) -> LLVMRenderer:
    r = LLVMRenderer(max_vector_bytes=32, fp_contract=True)  # 8-float vectors: any AVX2 host runs them
    r.nontemporal_min_bytes = least  # type: ignore[misc]
    return r


def aligned(n: int, offset: int) -> np.ndarray:
    """n float32 starting `offset` elements past a 64-byte boundary."""
    raw = np.zeros(n + 32, np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip + offset : skip + offset + n]


def test_the_default_threshold_is_a_buffer_past_the_caches() -> None:
    assert LLVMRenderer().nontemporal_min_bytes == NONTEMPORAL_MIN_BYTES == 32 << 20


@pytest.mark.parametrize("offset", [0, 1, 8])
def test_big_outputs_store_non_temporally_and_match_numpy(offset: int) -> None:
    n = 4096
    r = renderer(n * 4)
    uops = full_rewrite_to_sink(add_kernel(n, 8), r)
    src = r.render(uops)
    assert "!nontemporal" in src and "and i64" in src and "@llvm.x86.sse.sfence()" in src
    fn, keep = compile_llvm(src, "add")
    rng = np.random.default_rng(offset)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    out = aligned(n, offset)  # offset 1: every store misaligned, the cached path
    call(fn, uops, [out, a, b], {}, (0, global_extent(uops, {})))
    np.testing.assert_array_equal(out, a + b)
    del keep


@pytest.mark.parametrize("n,upcast", [(4096, 8), (4096, 1), (40, 8)])
def test_small_buffers_and_scalar_stores_stay_cached(n: int, upcast: int) -> None:
    r = renderer(4096 * 4 if upcast == 1 else n * 4 + 4)
    src = r.render(full_rewrite_to_sink(add_kernel(n, upcast), r))
    assert "!nontemporal" not in src and "sfence" not in src


def test_renderers_without_a_threshold_never_store_non_temporally() -> None:
    r = renderer(0)
    assert "!nontemporal" not in r.render(full_rewrite_to_sink(add_kernel(4096, 8), r))
