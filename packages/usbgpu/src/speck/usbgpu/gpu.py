"""GPU bring-up as far as this package goes: PCIe link, bridge/BAR setup, the GPU profile, VRAM and the SDMA queue.

Link and BAR setup are the real protocol (PROTOCOL.md 1.5) and run on any device. Everything past that - the
SDMA queue registers, the GPU address translation, the VRAM layout the copy engine relies on - comes from a *GPU
profile*, looked up by the GPU's PCI ids and subsystem id. The only profile is the simulator's: its queue registers
in BAR5 and its fixed translation (VRAM at GPU VA 0, bridge memory at an aperture) are documented stand-ins for
the real firmware bring-up (PSP/SMU/SDMA microcode, GMMU page tables, the RDNA3 register map), which is out of
scope. A GPU without a profile (real hardware) gets link and BAR setup only: no register of the stand-in map is
ever written to it, and the copy paths raise GpuBringUpNotImplemented.
"""

from __future__ import annotations

from dataclasses import dataclass

from speck.usbgpu.bridge import GPU_BUS, Bridge, PcieInfo, Transport
from speck.usbgpu.errors import GpuBringUpNotImplemented, PcieSetupError
from speck.usbgpu.sdma import DOORBELL_INDEX, RING_SIZE, SdmaRing, Timeline
from speck.usbgpu.settings import COPYIN, F4GATE, ZEROCOPY
from speck.usbgpu.vram import VramHeap

SRAM_PCIE, SQ_PCIE, CQ_PCIE = 0x200000, 0x820000, 0x822000

# VRAM layout of a profiled GPU: ring, queue pointer page, signal page, then user buffers.
RING_VA = 0x0
QUEUE_PAGE_VA = RING_SIZE  # rptr at +0, wptr at +8
SIGNAL_PAGE_VA = RING_SIZE + 0x1000
HEAP_VA = 2 << 20
ALLOC_ALIGN = 0x1000
DEFAULT_POLL_LIMIT = 100_000


@dataclass(frozen=True)
class QueueRegisters:
    """Byte offsets in BAR5 of the registers that program SDMA0 queue 0."""

    gpu_id: int
    rb_base_lo: int
    rb_base_hi: int
    rb_cntl: int  # bit 0 enable, bits 6:1 log2(ring dwords); writing it resets the queue
    rptr_addr_lo: int
    rptr_addr_hi: int
    wptr_addr_lo: int
    wptr_addr_hi: int
    doorbell: int  # doorbell offset in dwords (index * 2)
    status: int


@dataclass(frozen=True)
class GpuProfile:
    """How the driver reaches one kind of GPU: its SDMA queue registers and where bridge memory sits in its VA."""

    name: str
    sys_aperture: int  # GPU VA of bridge PCIe address 0 (the bounce SRAM, the SQ and CQ pages)
    queue: QueueRegisters


# speck's simulated GPU (speck.usbgpu.sim) marks itself with this PCI subsystem id (config 0x2C: id << 16 | vendor).
SIM_SUBSYSTEM = 0x0051 << 16 | 0x5EED
SIM_PROFILE = GpuProfile(
    name="speck-sim",
    sys_aperture=1 << 47,
    queue=QueueRegisters(
        gpu_id=0x0000,
        rb_base_lo=0x1000,
        rb_base_hi=0x1004,
        rb_cntl=0x1008,
        rptr_addr_lo=0x100C,
        rptr_addr_hi=0x1010,
        wptr_addr_lo=0x1014,
        wptr_addr_hi=0x1018,
        doorbell=0x101C,
        status=0x1020,
    ),
)
# (vendor, device, subsystem) -> profile. A GPU not listed here is left alone after link and BAR setup.
GPU_PROFILES: dict[tuple[int, int, int], GpuProfile] = {(0x1002, 0x744C, SIM_SUBSYSTEM): SIM_PROFILE}

BRING_UP_MISSING = (
    "GPU bring-up not implemented for {what}: copies need the GPU's firmware (PSP/SMU/SDMA microcode) loaded, GMMU "
    "page tables mapping VRAM and the bridge's SRAM, and the real SDMA queue registers programmed, none of which "
    "speck.usbgpu does. On this device the driver stops after PCIe link and BAR setup and writes nothing else; "
    "what works is `python -m speck.usbgpu info` and UsbGpu.open/alloc/free. Use the simulator (sim=True or "
    "SPECK_USB_SIM=1) for copies"
)


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
        mode = mode or COPYIN.value.lower()
        if mode not in ("g3", "g0"):
            raise ValueError(f"copy-in mode must be 'g3' or 'g0', got {mode!r}")
        if f4gate is None:
            f4gate = F4GATE.value != "0"
        if zero_copy is None:
            zero_copy = ZEROCOPY.value != "0"
        if poll_limit is not None and (isinstance(poll_limit, bool) or not isinstance(poll_limit, int)):
            raise TypeError(f"poll_limit must be an int, got {type(poll_limit).__name__}")
        if poll_limit is not None and poll_limit <= 0:
            raise ValueError(f"poll_limit must be positive, got {poll_limit}")
        return cls(mode, f4gate, DEFAULT_POLL_LIMIT if poll_limit is None else poll_limit, zero_copy)


class GpuContext:
    """The GPU behind one bridge after bring-up: BARs, its profile, and (profiled GPUs) the SDMA ring and timeline."""

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
        self.subsystem = self.bridge.cfg_read(GPU_BUS, 0x2C)
        self.profile: GpuProfile | None = GPU_PROFILES.get((self.pcie.vendor, self.pcie.device, self.subsystem))
        self.ring = SdmaRing(self.bridge, RING_VA, QUEUE_PAGE_VA + 8, self.vram_bar, self.doorbell_bar)
        self.timeline = Timeline(self.bridge, SIGNAL_PAGE_VA, self.vram_bar, options.poll_limit)
        self.heap = VramHeap(HEAP_VA, self.vram_visible, ALLOC_ALIGN)
        if self.profile is not None:
            self._init_queue(self.profile.queue)

    @property
    def identity(self) -> str:
        """The GPU as PCI ids: vendor:device (subsystem vendor:id)."""
        sub = self.subsystem
        return f"{self.pcie.vendor:04x}:{self.pcie.device:04x} (subsystem {sub & 0xFFFF:04x}:{sub >> 16:04x})"

    def require_profile(self, what: str) -> GpuProfile:
        """The GPU's profile, or GpuBringUpNotImplemented naming `what` needed it."""
        if self.profile is None:
            raise GpuBringUpNotImplemented(what, BRING_UP_MISSING.format(what=f"GPU {self.identity}"))
        return self.profile

    def mmio_write(self, reg: int, value: int) -> None:
        self.bridge.mem_write32(self.mmio_bar + reg, value)

    def mmio_read(self, reg: int) -> int:
        return self.bridge.mem_read32(self.mmio_bar + reg)

    def _init_queue(self, regs: QueueRegisters) -> None:
        """Reset and program SDMA0 queue 0 (this also drops whatever an earlier session left stalled on it)."""
        self.mmio_write(regs.rb_cntl, 0)
        self.bridge.stream_write(self.vram_bar + QUEUE_PAGE_VA, bytes(16))
        self.timeline.reset()
        self.mmio_write(regs.rb_base_lo, (RING_VA >> 8) & 0xFFFFFFFF)
        self.mmio_write(regs.rb_base_hi, RING_VA >> 40)
        self.mmio_write(regs.rptr_addr_lo, QUEUE_PAGE_VA & 0xFFFFFFFF)
        self.mmio_write(regs.rptr_addr_hi, QUEUE_PAGE_VA >> 32)
        self.mmio_write(regs.wptr_addr_lo, (QUEUE_PAGE_VA + 8) & 0xFFFFFFFF)
        self.mmio_write(regs.wptr_addr_hi, (QUEUE_PAGE_VA + 8) >> 32)
        self.mmio_write(regs.doorbell, DOORBELL_INDEX * 2)
        rb_size_log2 = (RING_SIZE // 4).bit_length() - 1
        self.mmio_write(regs.rb_cntl, 1 | rb_size_log2 << 1)

    def gpu_id(self) -> int:
        """The profile's identity register (device << 16 | vendor)."""
        return self.mmio_read(self.require_profile("reading the GPU identity register").queue.gpu_id)
