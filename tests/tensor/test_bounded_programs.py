"""Bounded memory for eager code: every new Python scalar in an eager op is a new kernel, compiled and loaded; the
loaded programs live in a bounded LRU cache (SPECK_PROGRAM_CACHE), the schedules holding them too, so a loop of
eager ops with ever new scalars reaches a steady state of mapped programs instead of growing without end."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from speck.hcq.memory import CodeMemory
from speck.tensor import Tensor
from speck.tensor import realize as R
from speck.tensor import schedule_cache as S


@pytest.fixture
def small_caches(monkeypatch: pytest.MonkeyPatch) -> int:
    size = 8
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(size))
    monkeypatch.setattr(S, "_schedule_cache", S._LRU(size))
    gc.collect()
    return size


def _mapped_after(n: int, x: Tensor, start: float) -> int:
    for i in range(n):
        s = start + i * 0.25
        np.testing.assert_allclose((x * s + 1).numpy(), x.numpy() * np.float32(s) + 1, rtol=1e-6)
    gc.collect()
    return CodeMemory.live


def test_eager_ops_with_new_scalars_reach_a_steady_state(small_caches: int) -> None:
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    first = _mapped_after(3 * small_caches, x, 1.0)
    later = [_mapped_after(3 * small_caches, x, 100.0 * (k + 1)) for k in range(3)]
    assert len(R._program_cache) <= small_caches and len(S._schedule_cache) <= small_caches
    assert max(later) <= first  # programs of evicted kernels were unmapped: no growth per new scalar


def test_the_mapping_count_sees_programs_loaded_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: with caches that never evict, every new scalar's program stays mapped."""
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1 << 20))
    monkeypatch.setattr(S, "_schedule_cache", S._LRU(1 << 20))
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    before = _mapped_after(0, x, 0.0)
    assert _mapped_after(10, x, 7000.0) >= before + 10
