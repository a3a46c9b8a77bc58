"""SDMA 6.0 packets (layouts from sdma_v6_0_0_pkt_open.h via speck.usbgpu.amd.tables, PROTOCOL.md 3.2), the ring in
VRAM with its 64-bit doorbell, and timeline signals.

Every ring byte, the write pointer and the doorbell reach the GPU as 0xF0 mode-1 streams through the bridge.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol

from speck.usbgpu.amd.regdefs import Packet
from speck.usbgpu.amd.tables import CONST, PM4, SDMA, SDMA_PACKETS
from speck.usbgpu.errors import GpuFenceTimeout, UsbGpuValueError

_P = SDMA_PACKETS
# POLL_REGMEM compares as PM4's WAIT_REG_MEM does (the SDMA header names no values of its own)
FUNC_ALWAYS, FUNC_LT, FUNC_LE = PM4.WAIT_FUNCTION_ALWAYS, PM4.WAIT_FUNCTION_LT, PM4.WAIT_FUNCTION_LE
FUNC_EQ, FUNC_NE = PM4.WAIT_FUNCTION_EQ, PM4.WAIT_FUNCTION_NE
FUNC_GE, FUNC_GT = PM4.WAIT_FUNCTION_GE, PM4.WAIT_FUNCTION_GT
RETRY_FOREVER = (1 << _P.POLL_REGMEM.fields["retry_count"][2]) - 1
MAX_COPY = 1 << _P.COPY_LINEAR.fields["count"][2]  # COPY_LINEAR's count field holds bytes - 1
MAX_WRITE = 1 << _P.WRITE_UNTILED.fields["count"][2]
FENCE_MTYPE_UC = 3  # FENCE header mtype 3: uncached (the fence must not sit in a cache the host cannot see)

RING_SIZE = 1 << 20
DOORBELL_INDEX = CONST.AMDGPU_NAVI10_DOORBELL_sDMA_ENGINE0  # 64-bit doorbell slot of SDMA0 queue 0


def _lo_hi(addr: int) -> tuple[int, int]:
    return addr & 0xFFFFFFFF, addr >> 32 & 0xFFFFFFFF


def nop(extra_dwords: int = 0) -> list[int]:
    """NOP: the header's count counts the dwords that follow (an all-zero dword is a one-dword NOP)."""
    if not 0 <= extra_dwords < 1 << _P.NOP.fields["count"][2]:
        raise UsbGpuValueError(f"NOP can skip 0..16383 extra dwords, got {extra_dwords}")
    return _P.NOP.encode([0], op=SDMA.OP_NOP, count=extra_dwords) + [0] * extra_dwords


# The copy paths build thousands of packets per copy: each builder fills a template made once from the table, at
# the dword positions the table gives (the generic Packet.encode checks every field and is several times slower).
def _dw(packet: Packet, field: str) -> int:
    return packet.fields[field][0]


_COPY = _P.COPY_LINEAR.encode(op=SDMA.OP_COPY, sub_op=SDMA.SUBOP_COPY_LINEAR)
_COPY_AT = [
    _dw(_P.COPY_LINEAR, f) for f in ("count", "src_addr_31_0", "src_addr_63_32", "dst_addr_31_0", "dst_addr_63_32")
]
_WRITE = _P.WRITE_UNTILED.encode(op=SDMA.OP_WRITE, sub_op=SDMA.SUBOP_WRITE_LINEAR)[:-1]  # without data0
_WRITE_AT = [_dw(_P.WRITE_UNTILED, f) for f in ("dst_addr_31_0", "dst_addr_63_32", "count")]
_FENCE_AT = [_dw(_P.FENCE, f) for f in ("addr_31_0", "addr_63_32", "data")]
_POLL_AT = [_dw(_P.POLL_REGMEM, f) for f in ("addr_31_0", "addr_63_32", "value", "mask")]
assert _P.WRITE_UNTILED.fields["count"][1:] == (0, 20) and _P.COPY_LINEAR.fields["count"][1] == 0


def copy_linear(src: int, dst: int, nbytes: int) -> list[int]:
    """COPY_LINEAR, 7 dwords: count = bytes - 1, parameter 0, source and destination addresses."""
    if not 0 < nbytes <= MAX_COPY:
        raise UsbGpuValueError(f"one COPY_LINEAR moves 1..{MAX_COPY} bytes, got {nbytes}")
    out = _COPY.copy()
    c, sl, sh, dl, dh = _COPY_AT
    out[c], out[sl], out[sh], out[dl], out[dh] = (
        nbytes - 1,
        src & 0xFFFFFFFF,
        src >> 32 & 0xFFFFFFFF,
        dst & 0xFFFFFFFF,
        dst >> 32 & 0xFFFFFFFF,
    )
    return out


def write_linear(dst: int, dwords: Sequence[int]) -> list[int]:
    """WRITE_UNTILED (linear), 4 + n dwords: destination, n - 1, then the data dwords."""
    if not 0 < len(dwords) <= MAX_WRITE:
        raise UsbGpuValueError(f"WRITE_LINEAR writes 1..{MAX_WRITE} dwords, got {len(dwords)}")
    out = _WRITE.copy()
    lo, hi, count = _WRITE_AT
    out[lo], out[hi], out[count] = dst & 0xFFFFFFFF, dst >> 32 & 0xFFFFFFFF, len(dwords) - 1
    return out + [d & 0xFFFFFFFF for d in dwords]


def write64(dst: int, value: int) -> list[int]:
    """A 64-bit WRITE_LINEAR (6 dwords)."""
    return write_linear(dst, [value & 0xFFFFFFFF, value >> 32 & 0xFFFFFFFF])


def write32(dst: int, value: int) -> list[int]:
    """A 32-bit WRITE_LINEAR (5 dwords), as used for the copy-out CQ trigger."""
    return write_linear(dst, [value])


def fence(addr: int, value: int, mtype: int = FENCE_MTYPE_UC) -> list[int]:
    """FENCE, 4 dwords: writes the low 32 bits of `value` at `addr`."""
    out = _P.FENCE.encode(op=SDMA.OP_FENCE, mtype=mtype & 7) if mtype != FENCE_MTYPE_UC else _FENCE_UC.copy()
    lo, hi, data = _FENCE_AT
    out[lo], out[hi], out[data] = addr & 0xFFFFFFFF, addr >> 32 & 0xFFFFFFFF, value & 0xFFFFFFFF
    return out


_FENCE_UC = _P.FENCE.encode(op=SDMA.OP_FENCE, mtype=FENCE_MTYPE_UC)


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
        raise UsbGpuValueError(f"POLL_REGMEM address must be dword aligned, got {addr:#x}")
    key = (func & 7, interval & 0xFFFF, retry & RETRY_FOREVER)
    template = _POLLS.get(key)
    if template is None:
        template = _POLLS[key] = _P.POLL_REGMEM.encode(
            op=SDMA.OP_POLL_REGMEM, func=key[0], mem_poll=1, interval=key[1], retry_count=key[2]
        )
    out = template.copy()
    lo, hi, value, msk = _POLL_AT
    out[lo], out[hi], out[value], out[msk] = (
        addr & 0xFFFFFFFF,
        addr >> 32 & 0xFFFFFFFF,
        ref & 0xFFFFFFFF,
        mask & 0xFFFFFFFF,
    )
    return out


_POLLS: dict[tuple[int, int, int], list[int]] = {}


def trap(context: int = 0) -> list[int]:
    """TRAP, 2 dwords (interrupt context in DW1 bits 27:0); never emitted on USB, kept for completeness."""
    return _P.TRAP.encode(op=SDMA.OP_TRAP, int_context=context & 0x0FFFFFFF)


def timestamp(addr: int) -> list[int]:
    """TIMESTAMP GET_GLOBAL, 3 dwords: write the 64-bit global counter at `addr` (profiling only)."""
    lo, hi = _lo_hi(addr)
    out = _P.TIMESTAMP_GET_GLOBAL.encode(
        op=SDMA.OP_TIMESTAMP, sub_op=SDMA.SUBOP_TIMESTAMP_GET_GLOBAL, write_addr_63_32=hi
    )
    out[1] = lo & ~7  # write_addr_31_3: the address is 8-byte aligned in place
    return out


def to_bytes(dwords: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(dwords)}I", *dwords)


class BarWriter(Protocol):
    """How the ring reaches VRAM and the doorbell: 0xF0 streams at absolute PCIe addresses."""

    def stream_write(self, address: int, data: bytes | bytearray | memoryview) -> None: ...

    def stream_read(self, address: int, n: int) -> bytes: ...


class SdmaRing:
    """The 1 MiB SDMA ring in VRAM: monotonic put value, NOP fill at the end, wptr word and 64-bit doorbell."""

    def __init__(
        self,
        bars: BarWriter,
        ring_va: int,
        wptr_va: int,
        vram_bar: int,
        doorbell_bar: int,
        size: int = RING_SIZE,
        doorbell_index: int = DOORBELL_INDEX,
    ) -> None:
        self.bars = bars
        self.doorbell_index = doorbell_index
        self.ring_va, self.wptr_va, self.size = ring_va, wptr_va, size
        self.vram_bar, self.doorbell_bar = vram_bar, doorbell_bar
        self.put_value = 0
        self.doorbells = 0

    def stage(self, packets: Sequence[int]) -> None:
        """Write a batch into the ring (one stream; a zero-filled tail first if it would cross the ring end)."""
        data = to_bytes(packets)
        if len(data) >= self.size:
            raise UsbGpuValueError(
                f"an SDMA batch of {len(data)} bytes does not fit the {self.size}-byte ring; split the copy-in"
            )
        offset = self.put_value % self.size
        if offset + len(data) > self.size:
            self.bars.stream_write(self.vram_bar + self.ring_va + offset, bytes(self.size - offset))
            self.put_value += self.size - offset
            offset = 0
        self.bars.stream_write(self.vram_bar + self.ring_va + offset, data)
        self.put_value += len(data)

    def make_room(self, nbytes: int) -> int:
        """Make the next `nbytes` of the ring contiguous and return their GPU VA. If they would cross the ring end,
        the tail is skipped with NOP headers (the engine steps over a NOP's count of dwords without reading them,
        so only the headers are written: a few 0xF0 dwords instead of a zero fill)."""
        if nbytes >= self.size:
            raise UsbGpuValueError(
                f"an SDMA batch of {nbytes} bytes does not fit the {self.size}-byte ring; split the copy-in"
            )
        offset = self.put_value % self.size
        if offset + nbytes > self.size:
            limit = 1 << _P.NOP.fields["count"][2]  # dwords one NOP covers, itself included
            pos = offset
            while pos < self.size:
                n = min((self.size - pos) // 4, limit)
                header = _P.NOP.encode([0], op=SDMA.OP_NOP, count=n - 1)
                self.bars.stream_write(self.vram_bar + self.ring_va + pos, to_bytes(header))
                pos += 4 * n
            self.put_value += self.size - offset
        return self.ring_va + self.put_value % self.size

    def reserve(self, nbytes: int) -> None:
        """Count `nbytes` at the put offset as staged: packets the GPU itself copied there (not written over
        0xF0). The caller made them contiguous with `make_room` and publishes them with `kick`."""
        self.put_value += nbytes

    def kick(self) -> None:
        """Publish put_value: write the wptr word, then ring the doorbell (64-bit at BAR2 + index * 8)."""
        value = struct.pack("<Q", self.put_value)
        self.bars.stream_write(self.vram_bar + self.wptr_va, value)
        self.bars.stream_write(self.doorbell_bar + self.doorbell_index * 8, value)
        self.doorbells += 1

    def submit(self, packets: Sequence[int]) -> None:
        """Stage a batch and ring the doorbell for it."""
        self.stage(packets)
        self.kick()


CHECK_EVERY = 64  # timeline polls between looks at the queue's health while waiting


class Timeline:
    """A timeline signal: a 16-byte VRAM slot (u64 value, u64 timestamp) the GPU's FENCE / RELEASE_MEM advance.

    `check(what)`, when given, looks at the queue's health (its interrupts) and raises GpuHang/GpuFault naming the
    queue; waits call it every CHECK_EVERY polls and before giving up, so a hung queue is named, not timed out.
    `clock()` gives the GPU's time in ns, for waits bounded in time rather than in polls."""

    def __init__(
        self,
        bars: BarWriter,
        va: int,
        vram_bar: int,
        poll_limit: int,
        check: Callable[[str], None] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.bars, self.va, self.vram_bar, self.poll_limit = bars, va, vram_bar, poll_limit
        self.check, self.clock = check, clock
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

    @staticmethod
    def reached(current: int, target: int) -> bool:
        return (current - target) & 0xFFFFFFFF < 0x80000000

    def wait(self, target: int, what: str, timeout_ns: float | None = None) -> None:
        """Poll until the signal reaches `target`. Without `timeout_ns` the poll budget bounds the wait and
        restarts whenever the value moves; with it (and a clock) the wait ends after that much GPU time."""
        timed = timeout_ns is not None and self.clock is not None
        deadline = self.clock() + timeout_ns if timed and self.clock is not None and timeout_ns is not None else 0.0
        last, budget, polls = -1, self.poll_limit, 0
        while timed or budget > 0:
            current = self.read()
            if self.reached(current, target):
                return
            if current != last:
                last, budget = current, self.poll_limit
            budget -= 1
            polls += 1
            if polls % CHECK_EVERY == 0:
                if self.check is not None:
                    self.check(what)
                if timed and self.clock is not None and self.clock() > deadline:
                    break
        if self.check is not None:
            self.check(what)
        limit = (
            f"{timeout_ns / 1e9:g} s of GPU time" if timed and timeout_ns is not None else f"{self.poll_limit} polls"
        )
        raise GpuFenceTimeout(what, f"Wait timeout: timeline at {last}, want {target} after {limit}")
