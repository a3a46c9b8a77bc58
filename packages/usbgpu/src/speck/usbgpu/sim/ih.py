"""The interrupt handler (OSSSYS 6.0 IH): interrupt entries (amdgpu_ih.c's 8-dword IV format) written into the ring
the driver programmed (IH_RB_BASE/CNTL, an MC address through the MM hub's VMID 0), the write pointer in
IH_RB_WPTR and, when enabled, written back to IH_RB_WPTR_ADDR. With the ring off, interrupts are counted as
dropped, as the hardware loses them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speck.usbgpu.amd.tables import IH_ENTRY, OSSSYS
from speck.usbgpu.sim.regfile import RegisterFile

ENTRY_BYTES = 4 * IH_ENTRY.dwords


@dataclass(frozen=True)
class Interrupt:
    """One posted interrupt, as recorded for tests (the driver reads the ring)."""

    client_id: int
    src_id: int
    ring_id: int
    vmid: int
    src_data: tuple[int, int, int, int]


class InterruptHandler:
    def __init__(
        self, regs: RegisterFile, write_mc: Callable[[int, bytes], None], now_ticks: Callable[[], int]
    ) -> None:
        self.regs = regs
        self.write_mc = write_mc  # a write at an MC address (MM hub, VMID 0)
        self.now_ticks = now_ticks
        self.posted: list[Interrupt] = []
        self.dropped = 0

    def post(
        self, client_id: int, src_id: int, ring_id: int = 0, vmid: int = 0, src_data: tuple[int, ...] = ()
    ) -> None:
        data = (tuple(src_data) + (0, 0, 0, 0))[:4]
        self.posted.append(Interrupt(client_id, src_id, ring_id, vmid, data))  # type: ignore[arg-type]
        cntl = self.regs.get(OSSSYS.IH_RB_CNTL)
        if not OSSSYS.IH_RB_CNTL.get(cntl, "RB_ENABLE"):
            self.dropped += 1
            return
        size = 4 << OSSSYS.IH_RB_CNTL.get(cntl, "RB_SIZE")
        base = (self.regs.get(OSSSYS.IH_RB_BASE) | (self.regs.get(OSSSYS.IH_RB_BASE_HI) & 0xFF) << 32) << 8
        wptr_reg = self.regs.get(OSSSYS.IH_RB_WPTR)
        wptr = OSSSYS.IH_RB_WPTR.get(wptr_reg, "OFFSET") << 2
        rptr = OSSSYS.IH_RB_RPTR.get(self.regs.get(OSSSYS.IH_RB_RPTR), "OFFSET") << 2
        if (wptr + ENTRY_BYTES) % size == rptr % size:  # full: the entry is lost and the overflow bit set
            self.dropped += 1
            self.regs.set(OSSSYS.IH_RB_WPTR, OSSSYS.IH_RB_WPTR.encode(wptr_reg, RB_OVERFLOW=1))
            return
        ticks = self.now_ticks()
        entry = IH_ENTRY.encode(
            client_id=client_id,
            src_id=src_id,
            ring_id=ring_id,
            vmid=vmid,
            timestamp_lo=ticks & 0xFFFFFFFF,
            timestamp_hi=ticks >> 32 & 0xFFFF,
            src_data0=data[0],
            src_data1=data[1],
            src_data2=data[2],
            src_data3=data[3],
        )
        self.write_mc(base + wptr % size, b"".join(d.to_bytes(4, "little") for d in entry))
        wptr = (wptr + ENTRY_BYTES) % size
        self.regs.set(OSSSYS.IH_RB_WPTR, OSSSYS.IH_RB_WPTR.encode(wptr_reg, OFFSET=wptr >> 2))
        if OSSSYS.IH_RB_CNTL.get(cntl, "WPTR_WRITEBACK_ENABLE"):
            addr = self.regs.get(OSSSYS.IH_RB_WPTR_ADDR_LO) | (self.regs.get(OSSSYS.IH_RB_WPTR_ADDR_HI) & 0xFFFF) << 32
            self.write_mc(addr, wptr.to_bytes(4, "little"))
