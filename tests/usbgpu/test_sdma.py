"""SDMA packet encoders (sdma_6_0_0 layouts), the ring's put value / wrap / doorbell, and timeline signals."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.usbgpu.amd import sdma
from speck.usbgpu.errors import GpuFenceTimeout

addr64 = st.integers(0, 2**48 - 1)


def bits(word: int, hi: int, lo: int) -> int:
    return word >> lo & ((1 << (hi - lo + 1)) - 1)


@given(src=addr64, dst=addr64, n=st.integers(1, 1 << 30))
def test_copy_linear_layout(src: int, dst: int, n: int) -> None:
    p = sdma.copy_linear(src, dst, n)
    assert len(p) == 7 and bits(p[0], 7, 0) == 1 and bits(p[0], 15, 8) == 0
    assert p[1] == n - 1 and p[2] == 0
    assert p[3] | p[4] << 32 == src and p[5] | p[6] << 32 == dst


@given(dst=addr64, value=st.integers(0, 2**64 - 1))
def test_write_layouts(dst: int, value: int) -> None:
    p = sdma.write64(dst, value)
    assert len(p) == 6 and bits(p[0], 7, 0) == 2 and p[1] | p[2] << 32 == dst and bits(p[3], 19, 0) == 1
    assert p[4] | p[5] << 32 == value
    q = sdma.write32(dst, value & 0xFFFFFFFF)
    assert len(q) == 5 and q[3] == 0 and q[4] == value & 0xFFFFFFFF


@given(addr=addr64.map(lambda a: a & ~3), ref=st.integers(0, 2**32 - 1), func=st.integers(0, 6))
def test_poll_regmem_layout(addr: int, ref: int, func: int) -> None:
    p = sdma.poll_regmem(addr, ref, func)
    assert len(p) == 6 and bits(p[0], 7, 0) == 8
    assert bits(p[0], 30, 28) == func and bits(p[0], 31, 31) == 1  # func and mem_poll
    assert p[1] | p[2] << 32 == addr and p[3] == ref and p[4] == 0xFFFFFFFF
    assert bits(p[5], 15, 0) == 4 and bits(p[5], 27, 16) == 0xFFF
    with pytest.raises(ValueError, match="dword aligned"):
        sdma.poll_regmem(addr | 2, ref)


def test_fence_nop_trap_timestamp_layouts() -> None:
    f = sdma.fence(0x1234_5678_9ABC, 0x1_0000_0007)
    assert f == [5 | 3 << 16, 0x5678_9ABC, 0x1234, 7]  # low 32 bits of the value, mtype UC
    assert sdma.nop() == [0] and sdma.nop(3) == [3 << 16, 0, 0, 0]
    assert sdma.trap(0x1FFFFFFF) == [6, 0x0FFFFFFF]
    assert sdma.timestamp(0x10) == [13 | 2 << 8, 0x10, 0]
    assert len(sdma.poll_regmem(0, 0)) + len(sdma.copy_linear(0, 0, 1)) + len(sdma.write64(0, 0)) == 19


class FakeBars:
    """Records 0xF0 stream writes and serves reads from a dict (stands in for the bridge)."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, bytes]] = []
        self.mem: dict[int, bytes] = {}

    def stream_write(self, address: int, data: bytes | bytearray | memoryview) -> None:
        self.writes.append((address, bytes(data)))
        self.mem[address] = bytes(data)

    def stream_read(self, address: int, n: int) -> bytes:
        return self.mem.get(address, bytes(n))[:n]


def test_ring_wraps_with_zero_fill_and_one_doorbell_per_submit() -> None:
    bars = FakeBars()
    ring = sdma.SdmaRing(bars, ring_va=0, wptr_va=0x2008, vram_bar=0x1000_0000, doorbell_bar=0x2000_0000, size=0x100)
    ring.submit(sdma.nop(39))  # 160 bytes
    ring.submit(sdma.copy_linear(1, 2, 3) + sdma.fence(4, 5))  # 44 bytes: fits (160 + 44 <= 256)
    assert ring.put_value == 204
    bars.writes.clear()
    ring.submit(sdma.write64(8, 9) * 3)  # 72 bytes: 204 + 72 > 256 -> zero fill 52 bytes, restart at 0
    (fill_addr, fill), (batch_addr, _), (wptr_addr, wptr), (db_addr, db) = bars.writes
    assert (fill_addr, fill) == (0x1000_0000 + 204, bytes(52))
    assert batch_addr == 0x1000_0000
    assert ring.put_value == 256 + 72  # monotonic: counts the fill too
    assert (wptr_addr, db_addr) == (0x1000_0000 + 0x2008, 0x2000_0000 + 256 * 8)
    assert struct.unpack("<Q", wptr)[0] == struct.unpack("<Q", db)[0] == 328
    assert ring.doorbells == 3
    with pytest.raises(ValueError, match="does not fit"):
        ring.stage(sdma.nop(63))


def test_timeline_wait_times_out_with_the_last_value() -> None:
    bars = FakeBars()
    tl = sdma.Timeline(bars, va=0x100, vram_bar=0, poll_limit=5)
    bars.mem[0x100] = struct.pack("<Q", 3)
    tl.wait(3, "ok")
    with pytest.raises(GpuFenceTimeout, match="Wait timeout: timeline at 3, want 4"):
        tl.wait(4, "copy")
