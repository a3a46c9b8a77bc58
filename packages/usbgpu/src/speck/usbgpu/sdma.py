"""AMD SDMA packets (sdma_6_0_0 layouts, PROTOCOL.md 3.2), the VRAM ring with its doorbell, and timeline signals.

Every ring byte, the write pointer and the doorbell reach the GPU as 0xF0 mode-1 streams through the bridge.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

from speck.usbgpu.errors import GpuFenceTimeout

OP_NOP, OP_COPY, OP_WRITE, OP_FENCE, OP_TRAP, OP_POLL_REGMEM, OP_TIMESTAMP = 0, 1, 2, 5, 6, 8, 13
SUBOP_COPY_LINEAR, SUBOP_WRITE_LINEAR, SUBOP_TIMESTAMP_GET_GLOBAL = 0, 0, 2
FUNC_ALWAYS, FUNC_LT, FUNC_LE, FUNC_EQ, FUNC_NE, FUNC_GE, FUNC_GT = range(7)
RETRY_FOREVER = 0xFFF
MAX_COPY = 1 << 30  # COPY_LINEAR count is 30 bits on SDMA 6 (bytes - 1)
FENCE_MTYPE_UC = 3

RING_SIZE = 1 << 20
DOORBELL_INDEX = 256  # SDMA0 queue 0


def _lo_hi(addr: int) -> list[int]:
    return [addr & 0xFFFFFFFF, addr >> 32 & 0xFFFFFFFF]


def nop(extra_dwords: int = 0) -> list[int]:
    """NOP: header bits 29:16 count the dwords that follow (an all-zero dword is a one-dword NOP)."""
    if not 0 <= extra_dwords < 1 << 14:
        raise ValueError(f"NOP can skip 0..16383 extra dwords, got {extra_dwords}")
    return [OP_NOP | extra_dwords << 16] + [0] * extra_dwords


def copy_linear(src: int, dst: int, nbytes: int) -> list[int]:
    """COPY_LINEAR, 7 dwords: count = bytes - 1, parameter 0, source and destination addresses."""
    if not 0 < nbytes <= MAX_COPY:
        raise ValueError(f"one COPY_LINEAR moves 1..{MAX_COPY} bytes, got {nbytes}")
    return [OP_COPY | SUBOP_COPY_LINEAR << 8, nbytes - 1, 0, *_lo_hi(src), *_lo_hi(dst)]


def write_linear(dst: int, dwords: Sequence[int]) -> list[int]:
    """WRITE_LINEAR (untiled), 4 + n dwords: destination, n - 1, then the data dwords."""
    if not 0 < len(dwords) <= 1 << 20:
        raise ValueError(f"WRITE_LINEAR writes 1..{1 << 20} dwords, got {len(dwords)}")
    return [OP_WRITE | SUBOP_WRITE_LINEAR << 8, *_lo_hi(dst), len(dwords) - 1, *(d & 0xFFFFFFFF for d in dwords)]


def write64(dst: int, value: int) -> list[int]:
    """A 64-bit WRITE_LINEAR (6 dwords), as used for the G3 fence flags."""
    return write_linear(dst, [value & 0xFFFFFFFF, value >> 32 & 0xFFFFFFFF])


def write32(dst: int, value: int) -> list[int]:
    """A 32-bit WRITE_LINEAR (5 dwords), as used for the copy-out CQ trigger."""
    return write_linear(dst, [value])


def fence(addr: int, value: int, mtype: int = FENCE_MTYPE_UC) -> list[int]:
    """FENCE, 4 dwords: writes the low 32 bits of `value` at `addr` (mtype 3 = uncached)."""
    return [OP_FENCE | (mtype & 7) << 16, *_lo_hi(addr), value & 0xFFFFFFFF]


def poll_regmem(
    addr: int,
    ref: int,
    func: int = FUNC_EQ,
    mask: int = 0xFFFFFFFF,
    interval: int = 4,
    retry: int = RETRY_FOREVER,
) -> list[int]:
    """POLL_REGMEM on memory (mem_poll = 1), 6 dwords: stall until (dword & mask) <func> ref."""
    if addr & 3:
        raise ValueError(f"POLL_REGMEM address must be dword aligned, got {addr:#x}")
    header = OP_POLL_REGMEM | (func & 7) << 28 | 1 << 31
    return [header, *_lo_hi(addr), ref & 0xFFFFFFFF, mask & 0xFFFFFFFF, (interval & 0xFFFF) | (retry & 0xFFF) << 16]


def trap(context: int = 0) -> list[int]:
    """TRAP, 2 dwords (interrupt context in DW1 bits 27:0); never emitted on USB, kept for completeness."""
    return [OP_TRAP, context & 0x0FFFFFFF]


def timestamp(addr: int) -> list[int]:
    """TIMESTAMP GET_GLOBAL, 3 dwords: write the 64-bit global counter at `addr` (profiling only)."""
    return [OP_TIMESTAMP | SUBOP_TIMESTAMP_GET_GLOBAL << 8, *_lo_hi(addr)]


def to_bytes(dwords: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(dwords)}I", *dwords)


class BarWriter(Protocol):
    """How the ring reaches VRAM and the doorbell: 0xF0 streams at absolute PCIe addresses."""

    def stream_write(self, address: int, data: bytes | bytearray | memoryview) -> None: ...

    def stream_read(self, address: int, n: int) -> bytes: ...


class SdmaRing:
    """The 1 MiB SDMA ring in VRAM: monotonic put value, NOP fill at the end, wptr word and 64-bit doorbell."""

    def __init__(
        self, bars: BarWriter, ring_va: int, wptr_va: int, vram_bar: int, doorbell_bar: int, size: int = RING_SIZE
    ) -> None:
        self.bars = bars
        self.ring_va, self.wptr_va, self.size = ring_va, wptr_va, size
        self.vram_bar, self.doorbell_bar = vram_bar, doorbell_bar
        self.put_value = 0
        self.doorbells = 0

    def stage(self, packets: Sequence[int]) -> None:
        """Write a batch into the ring (one stream; a zero-filled tail first if it would cross the ring end)."""
        data = to_bytes(packets)
        if len(data) >= self.size:
            raise ValueError(
                f"an SDMA batch of {len(data)} bytes does not fit the {self.size}-byte ring; split the copy-in"
            )
        offset = self.put_value % self.size
        if offset + len(data) > self.size:
            self.bars.stream_write(self.vram_bar + self.ring_va + offset, bytes(self.size - offset))
            self.put_value += self.size - offset
            offset = 0
        self.bars.stream_write(self.vram_bar + self.ring_va + offset, data)
        self.put_value += len(data)

    def kick(self) -> None:
        """Publish put_value: write the wptr word, then ring the doorbell (64-bit at BAR2 + index * 8)."""
        value = struct.pack("<Q", self.put_value)
        self.bars.stream_write(self.vram_bar + self.wptr_va, value)
        self.bars.stream_write(self.doorbell_bar + DOORBELL_INDEX * 8, value)
        self.doorbells += 1

    def submit(self, packets: Sequence[int]) -> None:
        """Stage a batch and ring the doorbell for it."""
        self.stage(packets)
        self.kick()


class Timeline:
    """A timeline signal: a 16-byte VRAM slot (u64 value, u64 timestamp) the GPU's FENCE writes advance."""

    def __init__(self, bars: BarWriter, va: int, vram_bar: int, poll_limit: int) -> None:
        self.bars, self.va, self.vram_bar, self.poll_limit = bars, va, vram_bar, poll_limit
        self.value = 1  # the next value to signal; value - 1 has been (or will be) signalled already

    def reset(self) -> None:
        """Zero the slot (a fresh driver session starts its timeline at 0)."""
        self.bars.stream_write(self.vram_bar + self.va, bytes(16))
        self.value = 1

    def read(self) -> int:
        """The low 32 bits the GPU last wrote (FENCE writes 32 bits)."""
        return int.from_bytes(self.bars.stream_read(self.vram_bar + self.va, 8)[:4], "little")

    def next(self) -> int:
        """Allocate the next value to signal."""
        value = self.value
        self.value += 1
        return value

    def wait(self, target: int, what: str) -> None:
        """Poll until the signal reaches `target`; the poll budget restarts whenever the value moves."""
        last, budget = -1, self.poll_limit
        while budget > 0:
            current = self.read()
            if (current - target) & 0xFFFFFFFF < 0x80000000:
                return
            if current != last:
                last, budget = current, self.poll_limit
            budget -= 1
        raise GpuFenceTimeout(what, f"Wait timeout: timeline at {last}, want {target} after {self.poll_limit} polls")
