"""The bridge firmware's vendor requests (0xE4/0xE5/0xF0/0xF2/0xF3/0xF4) and its PCIe TLP engine.

`BridgeFirmware` is a mixin of `SimDevice`: it turns one control transfer into a device action plus the extra
virtual time the firmware spends on it. The USB pipes and the clock live in `device.py`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from speck.usbgpu.sim.clock import VirtualClock
from speck.usbgpu.sim.config import (
    CQ_PCIE,
    LTSSM_DETECT,
    LTSSM_L0,
    SQ_PCIE,
    SRAM_PCIE,
    SRAM_SIZE,
    XDATA_LTSSM,
    XDATA_MISROUTE,
    SimFaults,
    SimTiming,
)
from speck.usbgpu.sim.dma import SramArm, SramDmaEngine
from speck.usbgpu.sim.gpu import GpuModel
from speck.usbgpu.sim.memory import BridgeMemory
from speck.usbgpu.sim.pcie import CPL_SC, CPL_UR, PcieFabric

REQ_XDATA_READ, REQ_XDATA_WRITE, REQ_TLP, REQ_ARM, REQ_POWER, REQ_FENCE_ARM = 0xE4, 0xE5, 0xF0, 0xF2, 0xF3, 0xF4
E4_MAX_REPLY = 512  # SuperSpeed EP0 buffer


@dataclass
class F0Stream:
    """An active 0xF0 streaming request: mode 1 writes EP 0x02 data to PCIe, mode 2 reads PCIe onto EP 0x81."""

    mode: int
    addr: int
    dwords: int


class Stall(Exception):
    """The firmware rejects the request: the control transfer completes with STALL (internal: the simulated device
    turns it into the STALL status; it never leaves the simulator)."""


class BridgeFirmware:
    """Vendor-request handlers and the TLP engine, shared state with SimDevice."""

    clock: VirtualClock
    timing: SimTiming
    faults: SimFaults
    mem: BridgeMemory
    dma: SramDmaEngine
    fabric: PcieFabric
    gpu: GpuModel
    stream: F0Stream | None
    violations: list[str]
    stats: dict[str, int]

    def _init_firmware(self) -> None:
        self.ltssm = LTSSM_DETECT
        self.mem.xdata[XDATA_LTSSM] = self.ltssm
        self.completion = bytes(8)

    def violation(self, message: str) -> None:
        """Record a protocol violation (tests assert the list stays empty)."""
        self.violations.append(f"t={self.clock.now / 1e6:.3f}ms: {message}")

    # --- vendor requests that complete immediately (returns reply data and extra firmware time) ---
    def _xdata_read(self, addr: int, bank: int, length: int) -> bytes:
        n = min(length, E4_MAX_REPLY)
        if bank:  # PHY bank: not modelled beyond reading as zero
            return bytes(n)
        return self.mem.xdata_read(addr, n)

    def _xdata_write(self, addr: int, bank: int, value: int) -> None:
        if bank:
            return
        where = self.mem.xdata_write(addr, value)
        if where == "sq":
            self._bridge_page_written()

    def _power(self, on: bool) -> float:
        if not on:
            self.ltssm = LTSSM_DETECT
            self.mem.xdata[XDATA_LTSSM] = self.ltssm
            return 0.0
        if self.faults.link_training_fails:
            self.ltssm = 0x11  # stuck in Polling
            self.mem.xdata[XDATA_LTSSM] = self.ltssm
            return 2.0e9  # the fw gives up after ~20 tries of 100 ms
        self.ltssm = LTSSM_L0
        self.mem.xdata[XDATA_LTSSM] = self.ltssm
        return self.timing.link_power_on_ns

    def _arm(self, arm: SramArm) -> None:
        if not self.dma.arm(arm, self.clock.now):
            if self.faults.second_latch == "error":
                self.violation(
                    f"0xF2/0xF4 arm (slot {arm.start_slot}, {arm.sectors} sectors) while one arm is active and "
                    "another already latched"
                )
                raise Stall()
            self.dma.latched = arm
        # Mirror the firmware's register programming (PROTOCOL.md 1.6) so E4 reads of 0xC4xx look plausible.
        x = self.mem.xdata
        x[0xC42A], x[0xC422], x[0xC423] = 0, 0x02, 0x00
        x[0xC414], x[0xC415] = 0x80 | arm.start_slot, (arm.start_slot + arm.num_slots) & 0xFF
        x[0xC426], x[0xC427] = arm.sectors >> 8 & 0xFF, arm.sectors & 0xFF
        x[0xC412], x[0xC429] = 0x03 if arm.direction == "out" else 0x02, arm.start_slot
        self._pipes_changed()

    def _handle_f2(self, value: int, index: int) -> None:
        direction = "in" if value & 0x8000 else "out"
        sectors = value & 0x7FFF
        start_slot, num_slots = index & 0xFF, index >> 8 & 0xFF
        if start_slot >= 32 or sectors * 512 > SRAM_SIZE:
            self.violation(f"0xF2 arm outside the SRAM: slot {start_slot}, {sectors} sectors")
            raise Stall()
        self._arm(self.dma.new_arm(direction, sectors, start_slot, num_slots))

    # --- 0xF4 ---
    @staticmethod
    def decode_f4(value: int, index: int) -> tuple[int, int, int, int, int]:
        """(sectors, start_slot, num_slots, buffer, target) from the 0xF4 wValue/wIndex packing (PROTOCOL.md 1.7)."""
        sectors = value & 0x1FF
        target = (value >> 9 & 0x7F) | (index >> 14 & 1) << 7
        return sectors, index & 0xFF, index >> 8 & 0x3F, index >> 15 & 1, target

    def f4_flags(self) -> bytes:
        return bytes(self.mem.sq[0x800:0x820])

    def f4_reached(self, buffer: int, target: int) -> bool:
        """Whether the flag 0xF4 compares (low byte, modulo 256) has reached `target`."""
        full, first = self.mem.sq[0x800 + 8 * buffer], self.mem.sq[0x810 + 8 * buffer]
        reached_full = (full - target) & 0xFF < 0x80
        reached_first = (first - target) & 0xFF < 0x80
        mode = self.faults.f4_compares
        return reached_full if mode == "full" else reached_first if mode == "first" else reached_full or reached_first

    # --- TLP engine ---
    def _tlp(self, fmt: int, byte_enable: int, addr: int, value: int) -> tuple[int, int, bool]:
        """Execute one single TLP: (completion data, completion status, carried data)."""
        if fmt in (0x04, 0x05, 0x44, 0x45):
            bus, dev, fn, reg = addr >> 24 & 0xFF, addr >> 19 & 0x1F, addr >> 16 & 0x7, addr & 0xFFF
            cs = self.fabric.config(bus, dev, fn, type1=bool(fmt & 1))
            if cs is None:
                return 0, CPL_UR, False
            if fmt & 0x40:
                if cs is self.fabric.gpu:
                    self.stats["gpu_config_writes"] += 1
                unsafe = self.fabric.config_write(cs, reg, value, byte_enable)
                if unsafe:
                    self.violation(unsafe)
                return 0, CPL_SC, False
            return cs.read(reg), CPL_SC, True
        if fmt & 0xDF == 0x40:  # posted memory write
            self._mem_write(addr, struct.pack("<I", value), byte_enable)
            return 0, CPL_SC, False
        if fmt & 0xDF == 0x00:
            data = self._mem_read(addr)
            return (0, CPL_UR, False) if data is None else (data, CPL_SC, True)
        if fmt & 0xB8 == 0x30:  # message: accepted, no effect
            return 0, CPL_SC, False
        return 0, CPL_UR, False

    def _mem_read(self, addr: int) -> int | None:
        hit = self.fabric.decode(addr)
        if hit is None:
            return None
        bar, off = hit
        vram = self.gpu.vram
        if bar == 0:
            return int(struct.unpack("<I", vram.read(off & ~3, 4))[0]) if off + 4 <= vram.size else 0
        if bar == 5:
            return self.gpu.mmio_read(off & ~3)
        return 0

    def _mem_write(self, addr: int, data: bytes, byte_enable: int = 0xF) -> bool:
        """Host (0xF0) write of one dword; False if it went nowhere (UR: posted writes are silently dropped)."""
        hit = self.fabric.decode(addr)
        if hit is None:
            self.violation(f"host memory write to {addr:#x} reached no GPU BAR (bridges/BARs not set up?)")
            return False
        bar, off = hit
        off &= ~3
        if bar == 0:
            if byte_enable != 0xF:
                old = bytearray(self.gpu.vram.read(off, 4))
                for i in range(4):
                    if byte_enable >> i & 1:
                        old[i] = data[i]
                data = bytes(old)
            self.gpu.bar0_write(off, data)
        elif bar == 2:
            self.stats["doorbells"] += self.gpu.doorbell_write(off, int(struct.unpack("<I", data)[0]))
        elif bar == 5:
            self.stats["mmio_writes"] += 1
            self.gpu.mmio_write(off, int(struct.unpack("<I", data)[0]))
        return True

    # --- what the GPU's DMA reaches over PCIe (GpuHost) ---
    def bus_read(self, pcie: int, n: int) -> bytes:
        """A GPU read of `n` bytes at PCIe bus address `pcie` (the bridge's memory)."""
        region = self._gpu_bridge_region(pcie, n)
        if region is None:
            return bytes(n)
        buf, off = region
        return bytes(buf[off : off + n])

    def bus_write(self, pcie: int, data: bytes) -> None:
        """A GPU write at PCIe bus address `pcie`, with the side effects of the bridge pages."""
        n = len(data)
        region = self._gpu_bridge_region(pcie, n)
        if region is None:
            return
        buf, off = region
        buf[off : off + n] = data
        if buf is self.mem.sram:
            self.mem.tag_sram(off, n, self.mem.write_gen)
            self.mem.write_gen -= 1
        elif buf is self.mem.sq:
            self._bridge_page_written()
        elif buf is self.mem.cq:
            self._cq_written()

    def _gpu_bridge_region(self, pcie: int, n: int) -> tuple[bytearray, int] | None:
        if not self.fabric.gpu_bus_master:
            self.violation(f"GPU DMA to bridge address {pcie:#x} with bus mastering disabled")
            return None
        region = self.mem.region(pcie, n)
        if region is None:
            self.violation(
                f"GPU DMA to bridge address {pcie:#x}+{n:#x} outside SRAM {SRAM_PCIE:#x} / SQ "
                f"{SQ_PCIE:#x} / CQ {CQ_PCIE:#x}"
            )
        return region

    def pending_out_range(self) -> tuple[int, int] | None:
        return self.dma.pending_out_range()

    def _misroute(self, data: memoryview) -> None:
        n = min(len(data), 1024)
        self.mem.xdata[XDATA_MISROUTE : XDATA_MISROUTE + n] = data[:n]
        self.stats["misrouted_packets"] += 1

    # Hooks implemented by SimDevice.
    def _pipes_changed(self) -> None:
        raise NotImplementedError

    def _bridge_page_written(self) -> None:
        raise NotImplementedError

    def _cq_written(self) -> None:
        raise NotImplementedError
