"""Drive the simulated GPU without USB: the driver's own bring-up (speck.usbgpu.amd.bringup) applied to the model's
BAR5 and VRAM directly, so model unit tests start from the state the driver leaves the card in."""

from __future__ import annotations

import struct

from speck.usbgpu.amd import bringup, ucode
from speck.usbgpu.amd.layout import RING_VA
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.sdma import DOORBELL_INDEX
from speck.usbgpu.sim.device import SimDevice


class DirectBus:
    """Single-dword register access straight into the model's BAR5 (what a TLP through the bridge does)."""

    def __init__(self, dev: SimDevice) -> None:
        self.dev = dev

    def mem_read32(self, address: int) -> int:
        return self.dev.gpu.mmio_read(address)

    def mem_write32(self, address: int, value: int) -> None:
        self.dev.gpu.mmio_write(address, value)


def ring_doorbell(dev: SimDevice, index: int, value: int) -> None:
    dev.gpu.doorbell_write(4 * index, value & 0xFFFFFFFF)
    dev.gpu.doorbell_write(4 * index + 4, value >> 32)


def bring_up(dev: SimDevice) -> tuple[Mmio, bringup.Card]:
    """Bus mastering on, then the driver's bring-up steps (NBIO, GMC and page tables, IH, firmware through the PSP,
    SDMA0 queue 0, MEC, compute queue)."""
    dev.fabric.gpu.set_dword(0x04, 0x7)
    mmio = Mmio(DirectBus(dev), 0, 1 << 20, dev.gpu.regs.bases)
    io = bringup.VramIo(dev.gpu.bar0_write, dev.gpu.vram.read)
    firmware = ucode.load(dev.firmware_files())
    card = bringup.bring_up(mmio, io, lambda i, v: ring_doorbell(dev, i, v), firmware, dev.gpu.vram.size, [])
    return mmio, card


def submit(dev: SimDevice, packets: list[int], run_ms: int = 10) -> None:
    """Put `packets` at the start of SDMA0's ring and ring its doorbell (wptr shadow first, as the driver does)."""
    data = struct.pack(f"<{len(packets)}I", *packets)
    dev.gpu.bar0_write(RING_VA, data)
    wptr = struct.pack("<Q", len(data))
    dev.gpu.bar0_write(RING_VA + (1 << 20) + 8, wptr)
    ring_doorbell(dev, 2 * DOORBELL_INDEX, len(data))
    dev.wait(None, run_ms)
