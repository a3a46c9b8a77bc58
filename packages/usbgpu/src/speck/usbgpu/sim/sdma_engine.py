"""The GPU's SDMA queue as the simulator runs it: fetch real sdma_6_0_0 packets from the VRAM ring and execute them.

Executed: NOP, COPY_LINEAR, WRITE_LINEAR, FENCE, POLL_REGMEM (memory polls with all comparison functions and a
mask), TRAP, TIMESTAMP(GET_GLOBAL). A POLL that is not satisfied stalls the engine until the polled dword changes
(retry 0xFFF = wait forever), with an optional watchdog that marks the queue hung. Copies move data in quanta at the
modelled SDMA bandwidth, so a host writing the bounce SRAM at the same time genuinely races them; every SRAM read
is checked against the provenance tag of the sentinel the copy was gated on.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from speck.usbgpu.sim.clock import VirtualClock
from speck.usbgpu.sim.config import GPU_SYS_APERTURE, SECTOR, SRAM_PCIE, SRAM_SIZE, SimFaults, SimTiming
from speck.usbgpu.sim.memory import BridgeMemory

OP_NOP, OP_COPY, OP_WRITE, OP_FENCE, OP_TRAP, OP_POLL, OP_TIMESTAMP = 0, 1, 2, 5, 6, 8, 13
RETRY_FOREVER = 0xFFF
_COMPARE: dict[int, Callable[[int, int], bool]] = {
    0: lambda v, r: True,
    1: lambda v, r: v < r,
    2: lambda v, r: v <= r,
    3: lambda v, r: v == r,
    4: lambda v, r: v != r,
    5: lambda v, r: v >= r,
    6: lambda v, r: v > r,
}


class GpuSystem(Protocol):
    """What the engine needs from the rest of the simulator."""

    clock: VirtualClock
    timing: SimTiming
    faults: SimFaults
    mem: BridgeMemory

    def gpu_read(self, va: int, n: int) -> bytes: ...

    def gpu_write(self, va: int, data: bytes) -> None: ...

    def violation(self, message: str) -> None: ...

    def pending_out_range(self) -> tuple[int, int] | None: ...


@dataclass
class _Poll:
    addr: int
    ref: int
    mask: int
    func: int
    retries_left: int  # -1 = forever
    interval_ns: float
    token: int
    recheck_scheduled: bool = False


@dataclass
class _Copy:
    src: int
    dst: int
    size: int
    expect_gen: int | None  # provenance tag of the sentinel this copy was gated on
    snapshot: list[int] | None  # ungated SRAM copy: sector tags at copy start
    pos: int = 0


def _sram_span(va: int, n: int) -> tuple[int, int] | None:
    """SRAM sector range [s0, s1) read by a GPU access, or None if it does not touch the bounce SRAM."""
    pcie = va - GPU_SYS_APERTURE
    if va < GPU_SYS_APERTURE or not (SRAM_PCIE <= pcie < SRAM_PCIE + SRAM_SIZE):
        return None
    off = pcie - SRAM_PCIE
    return off // SECTOR, (off + n + SECTOR - 1) // SECTOR


class SdmaEngine:
    """SDMA0 queue 0: ring registers, read/write pointers, doorbell and the packet interpreter."""

    def __init__(self, system: GpuSystem) -> None:
        self.sys = system
        self.ring_base = 0
        self.ring_size = 0
        self.enabled = False
        self.rptr_addr: int | None = None
        self.wptr_addr: int | None = None
        self.rptr = 0
        self.wptr = 0
        self.hung = False
        self.hang_reason = ""
        self.epoch = 0  # bumped by a queue reset: events scheduled before it are stale
        self._busy = False
        self._poll: _Poll | None = None
        self._poll_token = 0
        self._copy: _Copy | None = None
        self._expect_gen: int | None = None
        self.doorbells = 0
        self.packets = 0
        self.traps = 0
        self.bytes_copied = 0
        self.poll_stalls = 0
        # SRAM offset -> dword of sentinel polls that passed; if the host later writes the same value there, the
        # GPU had matched stale data (see SimDevice._check_late_sentinels).
        self.passed_sentinels: dict[int, int] = {}

    # --- registers ---
    def configure(self, ring_base: int, ring_size: int, enabled: bool) -> None:
        """(Re)program the ring; any state of the previous queue (stalled poll, copy in progress) is dropped."""
        self.epoch += 1
        self.ring_base, self.ring_size, self.enabled = ring_base, ring_size, enabled
        self.rptr = self.wptr = 0
        self.hung, self.hang_reason = False, ""
        self._busy, self._poll, self._copy, self._expect_gen = False, None, None, None
        self.passed_sentinels.clear()
        self._writeback()

    @property
    def status(self) -> int:
        idle = self.rptr == self.wptr and not self._busy and self._poll is None and self._copy is None
        return int(idle) | int(self.hung) << 1 | int(self._poll is not None) << 2

    def doorbell(self, value: int) -> None:
        """The host rang the doorbell with the new write pointer (a monotonic byte count)."""
        self.doorbells += 1
        if self.wptr_addr is not None:
            word = struct.unpack("<Q", self.sys.gpu_read(self.wptr_addr, 8))[0]
            if word != value:
                self.sys.violation(f"doorbell value {value:#x} differs from the wptr word {word:#x} in VRAM")
        if value < self.wptr:
            self.sys.violation(f"doorbell moved the write pointer backwards ({self.wptr:#x} -> {value:#x})")
        if self.ring_size and value - self.rptr > self.ring_size:
            self.sys.violation(f"doorbell {value:#x} is more than a ring ({self.ring_size:#x}) ahead of rptr")
        self.wptr = value
        self._kick()

    # --- execution ---
    def _kick(self, delay: float = 0.0) -> None:
        if self.enabled and not self.hung and not self._busy and self._poll is None and self.rptr < self.wptr:
            self._busy = True
            epoch = self.epoch
            self.sys.clock.at(self.sys.clock.now + delay + self.sys.timing.sdma_packet_ns, lambda: self._step(epoch))

    def _ring_dwords(self, offset: int, count: int) -> tuple[int, ...]:
        off = (self.rptr + 4 * offset) % self.ring_size
        first = min(count * 4, self.ring_size - off)
        raw = self.sys.gpu_read(self.ring_base + off, first)
        if first < count * 4:  # a packet crossing the ring end wraps (the driver avoids this with NOP fill)
            raw += self.sys.gpu_read(self.ring_base, count * 4 - first)
        return struct.unpack(f"<{count}I", raw)

    def _advance(self, ndwords: int) -> None:
        self.rptr += ndwords * 4
        self._writeback()
        self._busy = False
        self._kick()

    def _writeback(self) -> None:
        if self.rptr_addr is not None:
            self.sys.gpu_write(self.rptr_addr, struct.pack("<Q", self.rptr))

    def _hang(self, reason: str) -> None:
        self.hung, self.hang_reason = True, reason
        self._busy, self._poll, self._copy = False, None, None

    def _step(self, epoch: int) -> None:
        if epoch != self.epoch or self.hung:
            return
        faults = self.sys.faults
        if faults.gpu_hang_after_packets is not None:
            if faults.gpu_hang_after_packets <= 0:
                self._hang("injected GPU hang")
                return
            faults.gpu_hang_after_packets -= 1
        self.packets += 1
        header = self._ring_dwords(0, 1)[0]
        op = header & 0xFF
        if op == OP_NOP:
            self._advance(1 + (header >> 16 & 0x3FFF))
        elif op == OP_COPY:
            self._start_copy(self._ring_dwords(0, 7))
        elif op == OP_WRITE:
            hdr = self._ring_dwords(0, 4)
            n = (hdr[3] & 0xFFFFF) + 1
            words = self._ring_dwords(4, n)
            self._later_write(hdr[1] | hdr[2] << 32, struct.pack(f"<{n}I", *words), 4 + n)
        elif op == OP_FENCE:
            pkt = self._ring_dwords(0, 4)
            self._later_write(pkt[1] | pkt[2] << 32, struct.pack("<I", pkt[3]), 4)
        elif op == OP_POLL:
            self._start_poll(self._ring_dwords(0, 6))
        elif op == OP_TRAP:
            self.traps += 1
            self._advance(2)
        elif op == OP_TIMESTAMP:
            pkt = self._ring_dwords(0, 3)
            ticks = int(self.sys.clock.now // 10)  # 100 MHz global counter
            self._later_write(pkt[1] | pkt[2] << 32, struct.pack("<Q", ticks), 3)
        else:
            self.sys.violation(f"unknown SDMA opcode {op} (header {header:#010x}) at rptr {self.rptr:#x}")
            self._hang(f"unknown SDMA opcode {op}")

    def _later_write(self, addr: int, data: bytes, ndwords: int) -> None:
        epoch = self.epoch

        def land() -> None:
            if epoch != self.epoch:
                return
            self.sys.gpu_write(addr, data)
            self._advance(ndwords)

        self.sys.clock.at(self.sys.clock.now + self.sys.timing.gpu_write_ns, land)

    # --- POLL_REGMEM ---
    def _start_poll(self, pkt: tuple[int, ...]) -> None:
        header = pkt[0]
        func, mem_poll = header >> 28 & 0x7, header >> 31 & 1
        if not mem_poll:
            self.sys.violation("POLL_REGMEM of a register (mem_poll=0) is not modelled")
            self._hang("register poll")
            return
        retry = pkt[5] >> 16 & 0xFFF
        self._poll_token += 1
        self._poll = _Poll(
            addr=pkt[1] | pkt[2] << 32,
            ref=pkt[3],
            mask=pkt[4],
            func=func,
            retries_left=-1 if retry == RETRY_FOREVER else retry,
            interval_ns=float(pkt[5] & 0xFFFF) * 1000.0,  # interval unit taken as 1 us [protocol: unit uncertain]
            token=self._poll_token,
        )
        self._busy = False
        self._check_poll(first=True)

    def _check_poll(self, first: bool = False) -> None:
        poll = self._poll
        if poll is None or self.hung:
            return
        poll.recheck_scheduled = False
        value = struct.unpack("<I", self.sys.gpu_read(poll.addr, 4))[0]
        if _COMPARE[poll.func](value & poll.mask, poll.ref & poll.mask):
            self._poll = None
            # A satisfied EQ poll on the bounce SRAM is a sentinel: the next copy out of SRAM must read data from
            # the same arm (provenance) that wrote the sentinel.
            span = _sram_span(poll.addr, 4)
            if span is not None and poll.func == 3:
                self._expect_gen = self.sys.mem.sector_gen[span[0]]
                self.passed_sentinels[poll.addr - GPU_SYS_APERTURE - SRAM_PCIE] = value
            self._busy = True
            self._advance(6)
            return
        if first:
            self.poll_stalls += 1
            watchdog = self.sys.timing.watchdog_ns
            if watchdog is not None:
                token, epoch = poll.token, self.epoch
                self.sys.clock.at(self.sys.clock.now + watchdog, lambda: self._watchdog(token, epoch))
        if poll.retries_left >= 0:
            if poll.retries_left == 0:  # finite retries exhausted: the packet completes unsatisfied
                self._poll = None
                self._busy = True
                self._advance(6)
                return
            poll.retries_left -= 1
            poll.recheck_scheduled = True
            self.sys.clock.at(self.sys.clock.now + max(poll.interval_ns, 1.0), self._check_poll)

    def _watchdog(self, token: int, epoch: int) -> None:
        if epoch == self.epoch and self._poll is not None and self._poll.token == token:
            self._hang(f"POLL_REGMEM at {self._poll.addr:#x} unsatisfied for the watchdog period")

    def memory_changed(self, va: int, n: int) -> None:
        """Something wrote [va, va+n): a stalled POLL on that dword re-checks after the recheck delay."""
        poll = self._poll
        if poll is None or poll.recheck_scheduled or not (va < poll.addr + 4 and poll.addr < va + n):
            return
        poll.recheck_scheduled = True
        self.sys.clock.at(self.sys.clock.now + self.sys.timing.poll_recheck_ns, self._check_poll)

    # --- COPY_LINEAR ---
    def _start_copy(self, pkt: tuple[int, ...]) -> None:
        size = (pkt[1] & 0x3FFFFFFF) + 1
        src, dst = pkt[3] | pkt[4] << 32, pkt[5] | pkt[6] << 32
        span = _sram_span(src, size)
        expect, snapshot = None, None
        if span is not None:
            if self._expect_gen is not None:
                expect = self._expect_gen
            else:
                snapshot = list(self.sys.mem.sector_gen[span[0] : span[1]])
                pending = self.sys.pending_out_range()
                s_off = (src - GPU_SYS_APERTURE) - SRAM_PCIE
                if pending is not None and pending[0] < s_off + size and s_off < pending[1]:
                    self.sys.violation(
                        f"GPU copy from SRAM {s_off:#x}+{size:#x} started while the armed OUT transfer still has "
                        f"to fill SRAM [{pending[0]:#x}, {pending[1]:#x})"
                    )
        self._expect_gen = None
        self._copy = _Copy(src, dst, size, expect, snapshot)
        self._copy_quantum(self.epoch)

    def _copy_quantum(self, epoch: int) -> None:
        copy = self._copy
        if epoch != self.epoch or copy is None:
            return
        n = min(self.sys.timing.quantum, copy.size - copy.pos)
        when = self.sys.clock.now + n * 1e9 / self.sys.timing.sdma_bytes_per_s

        def move() -> None:
            if epoch != self.epoch or self._copy is not copy:
                return
            self._check_sram_read(copy, copy.src + copy.pos, n)
            self.sys.gpu_write(copy.dst + copy.pos, self.sys.gpu_read(copy.src + copy.pos, n))
            copy.pos += n
            self.bytes_copied += n
            if copy.pos >= copy.size:
                self._copy = None
                self._advance(7)
            else:
                self._copy_quantum(epoch)

        self.sys.clock.at(when, move)

    def _check_sram_read(self, copy: _Copy, va: int, n: int) -> None:
        span = _sram_span(va, n)
        if span is None:
            return
        gens = self.sys.mem.sector_gen[span[0] : span[1]]
        off = va - GPU_SYS_APERTURE - SRAM_PCIE
        if copy.expect_gen is not None:
            if gens.count(copy.expect_gen) == len(gens):
                return
            bad = next(g for g in gens if g != copy.expect_gen)
            if bad > copy.expect_gen or bad < 0 < copy.expect_gen:
                what = "host overwrote SRAM data the GPU had not copied yet"
            else:
                what = "GPU read a part before its data/sentinel landed"
            self.sys.violation(
                f"{what}: SRAM {off:#x}+{n:#x} holds data of arm {bad}, the sentinel polled was from arm "
                f"{copy.expect_gen}"
            )
        elif copy.snapshot is not None:
            first = (copy.src - GPU_SYS_APERTURE - SRAM_PCIE) // SECTOR
            before = copy.snapshot[span[0] - first : span[1] - first]
            if list(gens) != before:
                self.sys.violation(f"host overwrote SRAM {off:#x}+{n:#x} while an ungated GPU copy was reading it")
