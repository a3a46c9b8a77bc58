"""The bridge's SRAM DMA engine (0xF2 / 0xF4 arms): one current arm plus a one-deep latched arm.

An OUT arm deposits exactly `sectors * 512` bytes of EP 0x02 data sequentially from its start slot; an IN arm serves
that many bytes of SRAM on EP 0x81 once a GPU write to the CQ page releases it. An arm issued while another is
active is latched and takes effect when the active one's sectors are used up.
"""

from __future__ import annotations

from dataclasses import dataclass

from speck.usbgpu.sim.config import SECTOR, SLOT_SIZE, SRAM_SIZE
from speck.usbgpu.sim.memory import BridgeMemory


@dataclass
class SramArm:
    """One programmed transfer of the SRAM DMA engine."""

    direction: str  # "out" (host -> SRAM) or "in" (SRAM -> host)
    start_slot: int
    num_slots: int
    sectors: int
    gen: int  # provenance tag stamped on the sectors this arm writes
    done: int = 0  # bytes moved so far
    released: bool = False  # IN arms: the CQ-page trigger arrived
    active_at: float = 0.0  # virtual time from which the arm accepts data (latched arms: when promoted)

    @property
    def total(self) -> int:
        return self.sectors * SECTOR

    @property
    def remaining(self) -> int:
        return self.total - self.done

    def sram_offset(self, pos: int) -> int:
        """SRAM offset of stream byte `pos`: sequential from the start slot, wrapping inside the armed slots."""
        span = self.num_slots * SLOT_SIZE
        return (self.start_slot * SLOT_SIZE + pos % span) % SRAM_SIZE


class SramDmaEngine:
    """Current + latched arm, sector accounting and the deposit/serve data paths."""

    def __init__(self, mem: BridgeMemory) -> None:
        self.mem = mem
        self.current: SramArm | None = None
        self.latched: SramArm | None = None
        self._next_gen = 1
        self.arms_issued = 0

    def reset(self) -> None:
        """Drop both arms (SET_CONFIGURATION / SET_INTERFACE / CLEAR_HALT cancel everything in flight)."""
        self.current = self.latched = None

    def new_arm(self, direction: str, sectors: int, start_slot: int, num_slots: int) -> SramArm:
        gen = self._next_gen
        self._next_gen += 1
        self.arms_issued += 1
        return SramArm(direction, start_slot, max(num_slots, 1), sectors, gen)

    def arm(self, arm: SramArm, now: float) -> bool:
        """Install `arm` as current or latch it; False if an arm is already latched (the caller decides the fault)."""
        if arm.sectors == 0:
            return True
        if self.current is None:
            arm.active_at = now
            self.current = arm
            return True
        if self.latched is None:
            self.latched = arm
            return True
        return False

    def retire(self, now: float, switch_ns: float) -> SramArm | None:
        """The current arm's sectors are used up: promote the latched arm. Returns the retired arm."""
        done = self.current
        self.current, self.latched = self.latched, None
        if self.current is not None:
            self.current.active_at = now + switch_ns
        return done

    def deposit(self, data: memoryview) -> int:
        """Write OUT data into SRAM for the current (OUT) arm; returns the bytes consumed (<= its remainder)."""
        arm = self.current
        assert arm is not None and arm.direction == "out"
        n = min(len(data), arm.remaining)
        pos = 0
        while pos < n:
            off = arm.sram_offset(arm.done + pos)
            take = min(n - pos, SLOT_SIZE - off % SLOT_SIZE)
            self.mem.sram[off : off + take] = data[pos : pos + take]
            self.mem.tag_sram(off, take, arm.gen)
            pos += take
        arm.done += n
        return n

    def serve(self, n: int) -> bytes:
        """Read the next `n` bytes of the current (IN) arm from SRAM."""
        arm = self.current
        assert arm is not None and arm.direction == "in"
        n = min(n, arm.remaining)
        out = bytearray()
        pos = 0
        while pos < n:
            off = arm.sram_offset(arm.done + pos)
            take = min(n - pos, SLOT_SIZE - off % SLOT_SIZE)
            out += self.mem.sram[off : off + take]
            pos += take
        arm.done += n
        return bytes(out)

    def pending_out_range(self) -> tuple[int, int] | None:
        """SRAM [start, end) the current OUT arm has still to fill (for "GPU read before data landed" checks)."""
        arm = self.current
        if arm is None or arm.direction != "out" or arm.remaining == 0:
            return None
        start = arm.sram_offset(arm.done)
        return start, start + arm.remaining
