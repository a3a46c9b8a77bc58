"""Whole kernels compiled from hand-written LLVM IR (llvmlite, gfx1100) run in the RDNA3 emulator against numpy:
elementwise float/int/half/bfloat math, casts, integer division, transcendentals (within their ULP budget),
divergent loops and branches, LDS with barriers across several waves, scratch memory."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from rdna3_corpus import NP, Case, cases, special_floats
from rdna3_llvm import compile_ir
from speck.usbgpu.sim.rdna3 import FlatMemory, run

CASES = {c.name: c for c in cases()}


def ulp_diff(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between same-typed floats (NaN vs NaN counts as 0; +0 vs -0 as 0)."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
    top = np.iinfo(bits).max
    xi, yi = x.view(bits).astype(np.int64), y.view(bits).astype(np.int64)
    # magnitudes on one integer line, negatives mirrored: adjacent floats are adjacent integers
    xm = np.where(xi < 0, -(xi & top), xi).astype(np.float64)
    ym = np.where(yi < 0, -(yi & top), yi).astype(np.float64)
    return np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(xm - ym))


def run_case(c: Case, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    gen = c.inputs or special_floats
    a = np.asarray(gen(rng, c.n, c.a)).astype(NP[c.a])
    b = np.asarray(gen(rng, c.n, c.b)).astype(NP[c.b])
    so = compile_ir(c.ir, c.true16)
    mem = FlatMemory()
    pa, pb = mem.alloc(a, "a"), mem.alloc(b, "b")
    out_dt = np.dtype(NP[c.out])
    po = mem.alloc(c.n * out_dt.itemsize, "out")
    groups = -(-c.n // c.block)
    run(so, c.name, (groups, 1, 1), (c.block, 1, 1), struct.pack("<QQQi", po, pa, pb, c.n), mem)
    got = mem.array(po, out_dt, c.n)
    return got, np.asarray(c.ref(a, b)).astype(out_dt)


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_numpy(name: str) -> None:
    c = CASES[name]
    got, want = run_case(c)
    if np.issubdtype(got.dtype, np.floating):
        d = ulp_diff(got, want)
        bad = np.nonzero(d > c.ulp)[0]
        assert len(bad) == 0, f"{name}: {len(bad)} lanes off by more than {c.ulp} ulp, first {bad[:5]}: " + ", ".join(
            f"got {got[i]!r} want {want[i]!r}" for i in bad[:5]
        )
    else:
        bad = np.nonzero(got != want)[0]
        assert len(bad) == 0, f"{name}: lanes {bad[:8]} got {got[bad[:8]]} want {want[bad[:8]]}"
