"""Half precision on the C backend with every C compiler CI installs (gcc 12 has `_Float16` on x86, Debian 12's
clang 14 has not): kernels that load, store, convert and compare halves compile with each and agree bit for bit
with the reference interpreter and with numpy's correctly rounded conversions, whichever half the compiler offers."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import test_render_clang_llvm_exec as cexec
from speck.codegen.compiler.clang import CLANG_FLAGS
from speck.codegen.renderer.common import kernel_signature
from speck.codegen.renderer.cstyle import ClangRenderer
from speck.uop import Ops, UOp, dtypes

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


@pytest.mark.parametrize(
    "case",
    [lambda: cexec.test_casts_from(dtypes.float16), lambda: cexec.test_casts_from(dtypes.float32),
     lambda: cexec.test_narrow_float_compare_and_select(dtypes.float16),
     lambda: cexec.test_vector_casts_and_loads_of_narrow_types(dtypes.float16)],
    ids=["casts_from_half", "casts_to_half", "compare_select", "vectors"],
)  # fmt: skip
def test_half_kernels_compile_and_match_the_interpreter(c_compiler: str, case: object) -> None:
    assert callable(case)
    case()


def _conversion_kernel() -> list[UOp]:
    """out16[i] = half(f32[i]); out16b[i] = half(f64[i]); back[i] = float(h[i]) (one kernel, five buffers)."""
    n = 1
    r = cexec.rng(cexec.cc(n, dtypes.int32), 0)
    f32 = cexec.load(cexec.idx(cexec.buf(1, dtypes.float32, n), r))
    f64 = cexec.load(cexec.idx(cexec.buf(3, dtypes.float64, n), r))
    h = cexec.load(cexec.idx(cexec.buf(5, dtypes.float16, n), r))
    stores = [
        cexec.store(cexec.idx(cexec.buf(0, dtypes.float16, n), r), UOp(Ops.CAST, dtypes.float16, (f32,))),
        cexec.store(cexec.idx(cexec.buf(2, dtypes.float16, n), r), UOp(Ops.CAST, dtypes.float16, (f64,))),
        cexec.store(cexec.idx(cexec.buf(4, dtypes.float32, n), r), UOp(Ops.CAST, dtypes.float32, (h,))),
    ]
    return cexec._multi_store_program("half_conv", r, stores)


def _run_c(src: str, name: str, defines: tuple[str, ...], bufs: list[np.ndarray], n: int) -> None:
    """Compile src with the production flags (as a shared object) and `-D` defines, then run it over [0, n)."""
    cc = shutil.which(os.environ["CC"])
    assert cc is not None
    flags = [f for f in CLANG_FLAGS if f not in ("-c", "-w")]
    with tempfile.TemporaryDirectory(prefix="speck-test-c-") as d:
        so = os.path.join(d, "k.so")
        proc = subprocess.run([cc, *flags, *(f"-D{x}" for x in defines), "-shared", "-", "-o", so],
                              input=src.encode(), capture_output=True)  # fmt: skip
        assert proc.returncode == 0, f"{cc} failed:\n{proc.stderr.decode()}\n{src}"
        fn = ctypes.CDLL(so)[name]
        fn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32, ctypes.c_int32]
        fn(*[b.ctypes.data for b in bufs], 0, n)


def _f32_inputs() -> np.ndarray:
    """Every half as float32, the exact midpoints between neighbouring halves (ties) and one float32 ulp either side
    of them, NaNs with assorted payloads and signs, and 200k random float32 bit patterns."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float32))
    mids = (finite[:-1].astype(np.float64) + finite[1:].astype(np.float64)) / 2  # exact in float32 (12 bits)
    mids32 = mids.astype(np.float32)
    near = np.concatenate([np.nextafter(mids32, np.float32(np.inf)), np.nextafter(mids32, np.float32(-np.inf))])
    nans = np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC12345, 0x7FA00000], np.uint32)
    nans = nans.view(np.float32)
    edges = np.array([65504, 65519.996, 65520, 65536, 1e10, np.inf, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26,
                      1e-40, 2.0**-14, 2.0**-14 * (1 - 2.0**-11)], np.float32)  # fmt: skip
    rand = np.random.default_rng(0).integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.concatenate([finite, mids32, near, nans, edges, rand])
    return np.concatenate([out, -out])


# SPECK_NO_FLOAT16 makes a compiler that has _Float16 take the storage-only path too, so both are checked everywhere
@pytest.mark.parametrize("defines", [(), ("SPECK_NO_FLOAT16",)], ids=["as_compiled", "storage_only"])
def test_half_conversions_round_like_numpy(c_compiler: str, defines: tuple[str, ...]) -> None:
    uops = _conversion_kernel()
    src = ClangRenderer().render(uops)
    x32 = _f32_inputs()
    n = len(x32)
    x64 = x32.astype(np.float64)
    x64[: n // 4] += np.random.default_rng(2).normal(0, 1e-9, n // 4) * x64[: n // 4]  # off the float32 grid
    h = np.arange(n, dtype=np.uint32).astype(np.uint16)
    bufs = [np.zeros(n, np.uint16), x32, np.zeros(n, np.uint16), x64, np.zeros(n, np.float32), h]
    _run_c(src, kernel_signature(uops, "t").name, defines, bufs, n)
    for got, x in ((bufs[0], x32), (bufs[2], x64)):
        want = x.astype(np.float16).view(np.uint16)
        nan = np.isnan(want.view(np.float16))
        assert np.array_equal(got[~nan], want[~nan]), np.flatnonzero(got[~nan] != want[~nan])[:10]
        # NaN stays NaN with its sign, quieted, keeping the payload's top bits (what F16C's vcvtps2ph does)
        assert np.all(np.isnan(got[nan].view(np.float16))) and np.array_equal(got[nan] >> 15, want[nan] >> 15)
    nan_bits = x32.view(np.uint32)[np.isnan(x32)]
    quiet = 0x7E00 | (nan_bits >> 13 & 0x3FF) | (nan_bits >> 16 & 0x8000)
    assert np.array_equal(bufs[0][np.isnan(x32)], quiet.astype(np.uint16))
    back = h.view(np.float16).astype(np.float32)
    same = (bufs[4].view(np.uint32) == back.view(np.uint32)) | (np.isnan(bufs[4]) & np.isnan(back))
    assert same.all()
