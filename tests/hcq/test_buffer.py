"""Buffers and allocators: lazy allocation, views, copies, numpy views, the LRU cache, accounting, OOM."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import speck.hcq as hcq
from speck.codegen.numeric import storage_np
from speck.hcq import Buffer, BufferOptions, CopySizeError, OutOfMemoryError
from speck.hcq.allocator import HostAllocator, parse_bytes
from speck.hcq.cpu import CPUDevice
from speck.uop import DType, dtypes
from speck.uop.dtype import CONCRETE_SCALARS


def test_allocation_is_lazy_and_accounted() -> None:
    dev = hcq.Device["CPU"]
    before_dev, before_all = dev.mem_used, hcq.mem_used()
    b = Buffer("cpu", 1000, np.float32)
    assert b.device == "CPU" and not b.is_allocated
    assert dev.mem_used == before_dev
    b.ensure_allocated()
    assert dev.mem_used == before_dev + 4000 and hcq.mem_used() == before_all + 4000
    b.deallocate()
    assert dev.mem_used == before_dev and hcq.mem_used() == before_all


def test_memory_is_aligned_for_vector_loads() -> None:
    for n in (1, 3, 1000, 65537):
        assert Buffer("CPU", n, np.float32).ensure_allocated().ptr % 64 == 0


@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=200))
def test_copyin_copyout_round_trip(values: list[float]) -> None:
    a = np.array(values, dtype=np.float32)
    b = Buffer("CPU", a.size, np.float32).copyin(a)
    out = np.empty_like(a)
    b.copyout(out)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(b.numpy(), a)


def test_numpy_view_is_zero_copy() -> None:
    b = Buffer("CPU", 16, np.int32).copyin(np.arange(16, dtype=np.int32))
    v = b.numpy()
    v[3] = 42
    out = np.empty(16, np.int32)
    b.copyout(out)
    assert out[3] == 42
    assert b.as_memoryview()[3] == 42 and b.as_memoryview().format == "i"


def test_views_share_memory_at_offsets() -> None:
    base = Buffer("CPU", 64, np.uint8).copyin(np.arange(64, dtype=np.uint8))
    v = base.view(4, np.float32, offset=16)
    assert v.base is base and v.nbytes == 16
    np.testing.assert_array_equal(v.numpy().view(np.uint8), np.arange(16, 32, dtype=np.uint8))
    v.copyin(np.array([1, 2, 3, 4], np.float32))
    np.testing.assert_array_equal(base.numpy()[16:32].view(np.float32), [1, 2, 3, 4])
    vv = v.view(2, np.float32, offset=8)  # a view of a view is a view of the base
    assert vv.base is base and vv.offset == 24 and list(vv.numpy()) == [3, 4]
    assert v.ptr == base.ptr + 16
    with pytest.raises(ValueError, match="does not fit in a 64-byte buffer"):
        base.view(5, np.float32, offset=48)


def test_lru_cache_reuses_freed_allocations() -> None:
    dev = hcq.Device["CPU"]
    b = Buffer("CPU", 12345, np.uint8).ensure_allocated()
    addr = b.ptr
    used = dev.mem_used
    del b
    assert dev.mem_used == used - 12345 and dev.allocator.cached >= 12345
    c = Buffer("CPU", 12345, np.uint8).ensure_allocated()
    assert c.ptr == addr  # the same memory came back from the cache
    d = Buffer("CPU", 12345, np.uint8, BufferOptions(lru=False)).ensure_allocated()
    assert d.ptr != addr


def test_addresses_follow_reallocation() -> None:
    base = Buffer("CPU", 4096, np.uint8, BufferOptions(lru=False)).ensure_allocated()
    view = base.view(16, np.uint8, offset=32)
    first = (base.ptr, view.ptr)
    keep = Buffer("CPU", 4096, np.uint8, BufferOptions(lru=False)).ensure_allocated()  # noqa: F841 - occupies memory
    base.deallocate()
    base.allocate()
    assert view.ptr == base.ptr + 32
    assert view.is_allocated and first[1] - first[0] == 32


def test_lru_cache_evicts_oldest_past_its_cap() -> None:
    alloc = HostAllocator("TEST", limit=None, cache_cap=3000)
    ops = [alloc.alloc(1000 + i) for i in range(4)]
    for i, op in enumerate(ops):
        alloc.free(op, 1000 + i)
    assert alloc.cached <= 3000 and alloc.mem_used == 0
    assert (1000, BufferOptions()) not in alloc._cache  # the oldest went first


def test_out_of_memory_names_requested_and_available_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPU_MEM_LIMIT", "1M")
    dev = CPUDevice("CPU:5")
    keep = dev.allocator.alloc(700_000)
    with pytest.raises(
        OutOfMemoryError, match=r"out of memory on CPU:5: requested 500000 bytes, 348576 bytes available"
    ):
        dev.allocator.alloc(500_000)
    dev.allocator.free(keep, 700_000)
    dev.allocator.alloc(500_000)  # the cached 700 KB is dropped to make room


def test_parse_bytes() -> None:
    assert parse_bytes("1M") == 1 << 20 and parse_bytes("2G") == 2 << 30 and parse_bytes("123") == 123
    with pytest.raises(ValueError, match="cannot read 'lots'"):
        parse_bytes("lots")


def test_copy_between_buffers_and_devices() -> None:
    a = np.arange(100, dtype=np.float32)
    src = Buffer("CPU", 100, np.float32).copyin(a)
    dst = Buffer("CPU:1", 100, np.float32).copy_from(src)
    np.testing.assert_array_equal(dst.numpy(), a)
    with pytest.raises(CopySizeError, match="holds 396 bytes but the other side has 400 bytes"):
        Buffer("CPU", 99, np.float32).copy_from(src)


def test_mismatched_copies_name_the_sizes_and_change_nothing() -> None:
    b = Buffer("CPU", 10, np.float32).copyin(np.arange(10, dtype=np.float32))
    with pytest.raises(CopySizeError, match="holds 40 bytes but the other side has 44 bytes"):
        b.copyin(np.zeros(11, np.float32))
    with pytest.raises(CopySizeError, match="holds 40 bytes but the other side has 36 bytes"):
        b.copyout(np.zeros(9, np.float32))
    np.testing.assert_array_equal(b.numpy(), np.arange(10, dtype=np.float32))


def test_dtype_like_objects_are_accepted() -> None:
    class MyDType:
        itemsize, fmt, name = 2, "e", "half"

    b = Buffer("CPU", 4, MyDType()).copyin(np.array([1, 2, 3, 4], np.float16))
    assert b.nbytes == 8 and b.numpy().dtype == np.float16
    with pytest.raises(TypeError, match="expected a dtype"):
        Buffer("CPU", 4, object())


@pytest.mark.parametrize("dt", sorted(CONCRETE_SCALARS, key=lambda d: d.name), ids=lambda d: d.name)
def test_speck_dtypes_read_as_their_codegen_storage(dt: DType) -> None:
    """A buffer of a speck dtype reads back, through .numpy(), as the numpy type speck.codegen stores it as (the
    interpreter's table): bfloat16 and fp8 as their bit patterns, everything else as itself."""
    want = np.dtype(storage_np(dt))
    bits = np.arange(1, 9, dtype=np.uint8).repeat(dt.itemsize)[: 4 * dt.itemsize]
    if dt == dtypes.bool:
        bits = bits % 2
    b = Buffer("CPU", 4, dt).copyin(bits)
    got = b.numpy()
    assert got.dtype == want and got.shape == (4,)
    assert got.tobytes() == bits.tobytes()


def test_a_free_from_a_finalizer_inside_alloc_neither_deadlocks_nor_loses_bytes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A garbage collection can run a Buffer finalizer at any allocation, also while the allocator holds its lock
    inside alloc (CI once hung there). Simulated: the accounting step of an alloc frees another allocation of the
    same allocator on the same thread. The free is done once the alloc finishes, and the books balance."""
    import threading

    alloc = HostAllocator("TEST", limit=None)
    victim = alloc.alloc(4096)
    real_account = alloc._account
    fired: list[int] = []

    def account_with_finalizer(nbytes: int) -> None:
        real_account(nbytes)
        if nbytes > 0 and not fired:
            fired.append(nbytes)
            alloc.free(victim, 4096)  # what Buffer.__del__ does

    monkeypatch.setattr(alloc, "_account", account_with_finalizer)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(alloc.alloc(8192)), daemon=True)
    t.start()
    t.join(60)  # a hang detector, not a speed limit: the alloc takes microseconds
    assert not t.is_alive(), "alloc deadlocked on a free from a finalizer"
    assert fired == [8192] and len(done) == 1
    assert alloc.mem_used == 8192 and alloc.cached == 4096  # the victim went back to the cache


def test_process_wide_memory_is_the_sum_of_the_allocators_books() -> None:
    """hcq.mem_used() (MEMORY.used) adds up every live allocator's mem_used when read: allocations and frees on two
    allocators from two threads at once leave it balanced, and an allocator that is gone no longer counts."""
    import gc

    # (no collection during the test: a finalizer of an earlier test's buffer would change the process total)
    gc.collect()
    gc.disable()
    try:
        _books_balance()
    finally:
        gc.enable()


def _books_balance() -> None:
    import gc
    import threading

    a, b = HostAllocator("TEST:A", limit=None), HostAllocator("TEST:B", limit=None)
    before = hcq.mem_used()
    held = [a.alloc(4096), b.alloc(8192)]
    assert hcq.mem_used() == before + 4096 + 8192 == hcq.mem_used()

    def churn(al: HostAllocator, n: int) -> None:
        for i in range(300):
            got = [al.alloc(n * (1 + i % 3)) for _ in range(3)]
            for g in got:
                al.free(g, n * (1 + i % 3))

    threads = [threading.Thread(target=churn, args=(al, n)) for al, n in ((a, 64), (b, 128))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert a.mem_used == 4096 and b.mem_used == 8192
    assert hcq.mem_used() == before + 4096 + 8192
    a.free(held[0], 4096)
    assert hcq.mem_used() == before + 8192
    del a
    gc.collect()
    assert hcq.mem_used() == before + 8192
    b.free(held[1], 8192)
    assert hcq.mem_used() == before


def test_parked_spare_buffers_are_not_live_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Buffer kept in a SpareBuffers list and held by nothing else is released when mem_used is read (its memory
    is not in use); one something else still holds stays, counted."""
    from speck.hcq.allocator import SpareBuffers

    dev = hcq.Device["CPU"]
    before, before_all = dev.mem_used, hcq.mem_used()
    spare = SpareBuffers()
    held = Buffer("CPU", 100, np.float32).ensure_allocated()
    spare.append(held)
    spare.append(Buffer("CPU", 200, np.float32).ensure_allocated())  # parked: only the list holds it
    assert dev.mem_used == before + 400 and hcq.mem_used() == before_all + 400
    assert list(spare) == [held] and spare != [held]  # (a pool is compared by identity: one list is one pool)
    del held
    assert dev.mem_used == before and hcq.mem_used() == before_all and not spare


def test_parked_spare_buffers_are_released_before_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.hcq.allocator import SpareBuffers

    monkeypatch.setenv("CPU_MEM_LIMIT", "1M")
    dev = hcq.Device["CPU:61"]  # (a device of its own, opened under the limit)
    spare = SpareBuffers()
    spare.append(Buffer("CPU:61", 700_000, np.uint8).ensure_allocated())
    assert dev.allocator._used == 700_000  # (the books before anyone reads mem_used)
    dev.allocator.alloc(500_000)  # the parked 700 KB is released, then dropped from the cache, to make room
    assert not spare and dev.allocator._used == 500_000
