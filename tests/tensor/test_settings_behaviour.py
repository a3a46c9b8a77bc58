"""The settings of TENSOR_API §2.2 that used to be declared and unread now do what they say: MAX_BUFFER_SIZE,
DISALLOW_BROADCAST, SCACHE (the in-process schedule cache) and LRU (allocators keep freed memory)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from speck.hcq import Device
from speck.tensor import Context, GlobalCounters, Tensor
from speck.tensor import schedule_cache as S


def test_max_buffer_size_refuses_larger_buffers() -> None:
    a = Tensor(np.ones(64, np.float32)).realize()
    with Context(MAX_BUFFER_SIZE=32), pytest.raises(RuntimeError, match="larger than MAX_BUFFER_SIZE=32"):
        (a + 1).realize()
    with Context(MAX_BUFFER_SIZE=64):
        np.testing.assert_array_equal((a + 1).numpy(), np.full(64, 2, np.float32))


def test_max_buffer_size_holds_on_the_warm_path() -> None:
    a = Tensor(np.ones(64, np.float32)).realize()
    for _ in range(3):
        (a * 3).realize()  # the structure is cached: later realizes take the warm path
    with Context(MAX_BUFFER_SIZE=16), pytest.raises(RuntimeError, match="MAX_BUFFER_SIZE=16"):
        (a * 3).realize()


def test_disallow_broadcast() -> None:
    a, b = Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones(3, np.float32))
    with Context(DISALLOW_BROADCAST=1):
        with pytest.raises(RuntimeError, match="DISALLOW_BROADCAST"):
            (a + b).realize()
        np.testing.assert_array_equal((a + a).numpy(), np.full((2, 3), 2, np.float32))
    np.testing.assert_array_equal((a + b).numpy(), np.full((2, 3), 2, np.float32))


def test_scache_0_schedules_every_time() -> None:
    a = Tensor(np.arange(8, dtype=np.float32)).realize()
    (a - 5).realize()
    with Context(SCACHE=0):
        before = len(S._schedule_cache)
        for _ in range(3):
            np.testing.assert_array_equal((a - 7).numpy(), np.arange(8, dtype=np.float32) - 7)
        assert len(S._schedule_cache) == before  # nothing cached while off
        assert S.cached_plan((a - 5).uop, "CPU") is None  # and nothing looked up
    assert S.cached_plan((a - 5).uop, "CPU") is not None


def test_lru_0_frees_instead_of_caching() -> None:
    alloc = Device["CPU"].allocator
    a = Tensor(np.ones(4 * 4096 + 13, np.float32)).realize()  # (above what a warm plan keeps for its next run)
    with Context(LRU=0):
        cached = alloc.cached
        (a + 1).realize()  # its buffer dies at once
        assert alloc.cached == cached
    GlobalCounters.reset()
    (a + 1).realize()
    assert alloc.cached > cached  # on again: the freed buffer is kept for reuse


def test_lru_0_keeps_no_warm_output_for_the_next_run() -> None:
    """A warm plan keeps its small output's Buffer for its next run only while LRU is on: with LRU=0 the Buffer
    dies with its tensor."""
    a = Tensor(np.ones(5, np.float32)).realize()
    for _ in range(3):
        (a * 3).realize()  # warm
    with Context(LRU=0):
        (a * 3).realize()  # (takes back what an earlier run kept)
        out = (a * 3).realize()
        gone = weakref.ref(out.uop.buffer)
        del out
        assert gone() is None
    out = (a * 3).realize()
    kept = weakref.ref(out.uop.buffer)
    del out
    assert kept() is not None  # on again: kept for the next run
