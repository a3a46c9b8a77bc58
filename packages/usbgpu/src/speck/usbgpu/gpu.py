"""GPU bring-up as far as this package goes: PCIe link, bridge/BAR setup, VRAM layout and the SDMA queue.

Real hardware additionally needs GPU firmware bring-up (PSP/SMU/SDMA microcode, GMMU page tables, the real SDMA
queue registers); that is out of scope. The queue registers programmed here and the GPU address translation
(VRAM at GPU VA 0, bridge memory at GPU_SYS_APERTURE + PCIe address) are the simulator's documented stand-ins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from speck.usbgpu.bridge import Bridge, PcieInfo, Transport
from speck.usbgpu.errors import PcieSetupError, VramAllocError
from speck.usbgpu.sdma import DOORBELL_INDEX, RING_SIZE, SdmaRing, Timeline

# GPU address translation (see module docstring).
GPU_SYS_APERTURE = 1 << 47
SRAM_PCIE, SQ_PCIE, CQ_PCIE = 0x200000, 0x820000, 0x822000

# Simulator-defined SDMA queue registers in BAR5 (byte offsets).
MMIO_ID = 0x0000
MMIO_SDMA_RB_BASE_LO, MMIO_SDMA_RB_BASE_HI, MMIO_SDMA_RB_CNTL = 0x1000, 0x1004, 0x1008
MMIO_SDMA_RPTR_ADDR_LO, MMIO_SDMA_RPTR_ADDR_HI = 0x100C, 0x1010
MMIO_SDMA_WPTR_ADDR_LO, MMIO_SDMA_WPTR_ADDR_HI = 0x1014, 0x1018
MMIO_SDMA_DOORBELL, MMIO_SDMA_STATUS = 0x101C, 0x1020

# VRAM layout: ring, queue pointer page, signal page, then user buffers.
RING_VA = 0x0
QUEUE_PAGE_VA = RING_SIZE  # rptr at +0, wptr at +8
SIGNAL_PAGE_VA = RING_SIZE + 0x1000
HEAP_VA = 2 << 20
ALLOC_ALIGN = 0x1000
DEFAULT_POLL_LIMIT = 100_000


@dataclass(frozen=True)
class GpuOptions:
    """Driver knobs: copy-in algorithm, 0xF4 gating, fence poll budget, zero-copy wire."""

    mode: str = "g3"  # "g3" (pipelined, default) or "g0" (serial reference)
    f4gate: bool = True  # USB_F4GATE=0 selects the 0xF2 arm + E4 fence poll gate
    poll_limit: int = DEFAULT_POLL_LIMIT  # E4 / timeline reads before "GPU fence timeout"
    zero_copy: bool = True  # G3 payload straight from the caller's buffer (False: one staged transfer per chunk)

    @classmethod
    def from_env(
        cls,
        mode: str | None = None,
        f4gate: bool | None = None,
        poll_limit: int | None = None,
        zero_copy: bool | None = None,
    ) -> GpuOptions:
        """Explicit arguments win over the environment (USB_COPYIN=g0|g3, USB_F4GATE=0|1, USB_ZEROCOPY=0|1)."""
        mode = mode or os.environ.get("USB_COPYIN", "g3").lower()
        if mode not in ("g3", "g0"):
            raise ValueError(f"copy-in mode must be 'g3' or 'g0', got {mode!r}")
        if f4gate is None:
            f4gate = os.environ.get("USB_F4GATE", "1") != "0"
        if zero_copy is None:
            zero_copy = os.environ.get("USB_ZEROCOPY", "1") != "0"
        return cls(mode, f4gate, DEFAULT_POLL_LIMIT if poll_limit is None else poll_limit, zero_copy)


class GpuContext:
    """The GPU behind one bridge after bring-up: BARs, the SDMA ring and the timeline signal."""

    def __init__(self, usb: Transport, options: GpuOptions) -> None:
        self.usb = usb
        self.options = options
        self.bridge = Bridge(usb)
        self.ltssm = self.bridge.ensure_link()
        self.pcie: PcieInfo = self.bridge.setup_pcie()
        bars = self.pcie.bars
        for index in (0, 2, 5):
            if index not in bars:
                raise PcieSetupError("GPU BAR setup", f"the GPU has no BAR{index} (found {sorted(bars)})")
        self.vram_bar, self.doorbell_bar, self.mmio_bar = bars[0].address, bars[2].address, bars[5].address
        self.vram_visible = bars[0].size
        self.ring = SdmaRing(self.bridge, RING_VA, QUEUE_PAGE_VA + 8, self.vram_bar, self.doorbell_bar)
        self.timeline = Timeline(self.bridge, SIGNAL_PAGE_VA, self.vram_bar, options.poll_limit)
        self._heap = HEAP_VA
        self._init_queue()

    def mmio_write(self, reg: int, value: int) -> None:
        self.bridge.mem_write32(self.mmio_bar + reg, value)

    def mmio_read(self, reg: int) -> int:
        return self.bridge.mem_read32(self.mmio_bar + reg)

    def _init_queue(self) -> None:
        """Reset and program SDMA0 queue 0 (this also drops whatever an earlier session left stalled on it)."""
        self.mmio_write(MMIO_SDMA_RB_CNTL, 0)
        self.bridge.stream_write(self.vram_bar + QUEUE_PAGE_VA, bytes(16))
        self.timeline.reset()
        self.mmio_write(MMIO_SDMA_RB_BASE_LO, (RING_VA >> 8) & 0xFFFFFFFF)
        self.mmio_write(MMIO_SDMA_RB_BASE_HI, RING_VA >> 40)
        self.mmio_write(MMIO_SDMA_RPTR_ADDR_LO, QUEUE_PAGE_VA & 0xFFFFFFFF)
        self.mmio_write(MMIO_SDMA_RPTR_ADDR_HI, QUEUE_PAGE_VA >> 32)
        self.mmio_write(MMIO_SDMA_WPTR_ADDR_LO, (QUEUE_PAGE_VA + 8) & 0xFFFFFFFF)
        self.mmio_write(MMIO_SDMA_WPTR_ADDR_HI, (QUEUE_PAGE_VA + 8) >> 32)
        self.mmio_write(MMIO_SDMA_DOORBELL, DOORBELL_INDEX * 2)
        rb_size_log2 = (RING_SIZE // 4).bit_length() - 1
        self.mmio_write(MMIO_SDMA_RB_CNTL, 1 | rb_size_log2 << 1)

    def alloc(self, nbytes: int) -> int:
        """Reserve `nbytes` of VRAM (bump allocator, page aligned) and return its GPU VA (= offset in BAR0)."""
        if nbytes < 0:
            raise ValueError(f"allocation size must be >= 0, got {nbytes}")
        va = self._heap
        end = va + max(nbytes, 1)
        if end > self.vram_visible:
            raise VramAllocError(
                f"VRAM allocation of {nbytes} bytes",
                f"only {self.vram_visible - va} bytes of the {self.vram_visible}-byte BAR0 remain",
                "the allocator never frees: allocate fewer or smaller buffers, or reopen the device to start over",
            )
        self._heap = -(-end // ALLOC_ALIGN) * ALLOC_ALIGN
        return va

    def gpu_id(self) -> int:
        """MMIO identity register (device << 16 | vendor)."""
        return self.mmio_read(MMIO_ID)
