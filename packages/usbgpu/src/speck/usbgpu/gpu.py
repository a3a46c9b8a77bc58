"""GPU bring-up: PCIe link and BARs, identification, IP discovery, then GMC/VM, interrupts and the SDMA queue.

Every card gets the same code. What runs on any card: link training, bridge and BAR setup (the function behind the
bridge is checked to be an AMD display controller before anything is written to it, and its memory decoding is off
while its BARs are resized and placed) and the read-only identification (the IP discovery table in the top of
VRAM, read through BAR0). Everything that writes the GPU's registers runs only on a board the bring-up was verified
against - speck's simulator - or with the explicit opt-in `unverified=True` (SPECK_USBGPU_UNVERIFIED=1); without
it, copies raise GpuBringUpUnverified and nothing past the BARs is ever written.
(The VRAM layout is speck.usbgpu.amd.layout.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from speck.usbgpu.amd import bringup, discovery, ucode
from speck.usbgpu.amd.compute import ComputeQueue
from speck.usbgpu.amd.ih import GpuFaultRecord, IhRing, describe
from speck.usbgpu.amd.layout import (
    CQ_PCIE,
    HEAP_VA,
    IH_RING_SIZE,
    IH_RING_VA,
    QUEUE_PAGE_VA,
    RING_VA,
    SIGNAL_PAGE_VA,
    SQ_PCIE,
    SRAM_PCIE,
    SYS_VA,
    TOP_RESERVED,
)
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.pm4 import TIMESTAMP_NS
from speck.usbgpu.amd.sdma import SdmaRing, Timeline
from speck.usbgpu.amd.tables import GC
from speck.usbgpu.amd.vm import HUGE, PageTables
from speck.usbgpu.bridge import GPU_BUS, Bridge, PcieInfo, Transport
from speck.usbgpu.errors import (
    GpuBringUpUnverified,
    GpuFault,
    GpuHang,
    PcieSetupError,
    UsbGpuTypeError,
    UsbGpuValueError,
)
from speck.usbgpu.settings import COPYIN, F4GATE, FIRMWARE, UNVERIFIED, ZEROCOPY
from speck.usbgpu.vram import VramHeap

__all__ = [
    "CQ_PCIE",
    "HEAP_VA",
    "RING_VA",
    "SQ_PCIE",
    "SRAM_PCIE",
    "SYS_VA",
    "GpuContext",
    "GpuOptions",
    "stopped_queue_error",
]

ALLOC_ALIGN = 0x1000
DEFAULT_POLL_LIMIT = 100_000

# (vendor, device, subsystem) of boards the bring-up was verified on: speck's simulated board only.
SIM_SUBSYSTEM = 0x0051 << 16 | 0x5EED
VERIFIED_BOARDS: dict[tuple[int, int, int], str] = {(0x1002, 0x744C, SIM_SUBSYSTEM): "speck's simulated Navi 31"}


def stopped_queue_error(what: str, record: GpuFaultRecord) -> GpuFault | GpuHang:
    """The named error of a queue the interrupt ring reported stopped: GpuHang for a hang, GpuFault otherwise."""
    if record.hang:
        return GpuHang(what, record.queue, record.kind + (f"; {record.detail}" if record.detail else ""))
    return GpuFault(what, record)


@dataclass(frozen=True)
class GpuOptions:
    """Driver knobs: copy-in algorithm, 0xF4 gating, fence poll budget, zero-copy wire, unverified-board opt-in."""

    mode: str = "g3"  # "g3" (pipelined, default) or "g0" (serial reference)
    f4gate: bool = True  # USB_F4GATE=0 selects the 0xF2 arm + E4 fence poll gate
    poll_limit: int = DEFAULT_POLL_LIMIT  # E4 / timeline reads before "GPU fence timeout"
    zero_copy: bool = True  # G3 payload straight from the caller's buffer (False: one staged transfer per chunk)
    unverified: bool = False  # run the register-writing bring-up on a board it was never verified on
    firmware: str | Mapping[str, bytes] | None = None  # directory or {file: bytes}; None: /lib/firmware/amdgpu

    @classmethod
    def from_env(
        cls,
        mode: str | None = None,
        f4gate: bool | None = None,
        poll_limit: int | None = None,
        zero_copy: bool | None = None,
        unverified: bool | None = None,
        firmware: str | Mapping[str, bytes] | None = None,
    ) -> GpuOptions:
        """Explicit arguments win over the environment (USB_COPYIN=g0|g3, USB_F4GATE=0|1, USB_ZEROCOPY=0|1,
        SPECK_USBGPU_UNVERIFIED=1, SPECK_AMDGPU_FIRMWARE=<directory>)."""
        mode = mode or COPYIN.value.lower()
        if mode not in ("g3", "g0"):
            raise UsbGpuValueError(f"copy-in mode must be 'g3' or 'g0', got {mode!r}")
        if f4gate is None:
            f4gate = F4GATE.value != "0"
        if zero_copy is None:
            zero_copy = ZEROCOPY.value != "0"
        if unverified is None:
            unverified = UNVERIFIED.value == "1"
        if poll_limit is not None and (isinstance(poll_limit, bool) or not isinstance(poll_limit, int)):
            raise UsbGpuTypeError(f"poll_limit must be an int, got {type(poll_limit).__name__}")
        if poll_limit is not None and poll_limit <= 0:
            raise UsbGpuValueError(f"poll_limit must be positive, got {poll_limit}")
        limit = DEFAULT_POLL_LIMIT if poll_limit is None else poll_limit
        if firmware is None:
            firmware = FIRMWARE.value or None
        return cls(mode, f4gate, limit, zero_copy, unverified, firmware)


class GpuContext:
    """The GPU behind one bridge: BARs, identity, discovery, and (once brought up) its VM, IH ring and SDMA queue."""

    def __init__(self, usb: Transport, options: GpuOptions) -> None:
        self.usb = usb
        self.options = options
        self.bridge = Bridge(usb)
        self.ltssm = self.bridge.ensure_link()
        self.pcie: PcieInfo = self.bridge.setup_pcie(bringup.check_identity)
        bars = self.pcie.bars
        for index in (0, 2, 5):
            if index not in bars:
                raise PcieSetupError("GPU BAR setup", f"the GPU has no BAR{index} (found {sorted(bars)})")
        self.vram_bar, self.doorbell_bar, self.mmio_bar = bars[0].address, bars[2].address, bars[5].address
        self.vram_visible = bars[0].size
        self.subsystem = self.bridge.cfg_read(GPU_BUS, 0x2C)
        self.board = VERIFIED_BOARDS.get((self.pcie.vendor, self.pcie.device, self.subsystem))
        boot = Mmio(self.bridge, self.mmio_bar, bars[5].size, {})
        self.vram_size, blob = bringup.read_discovery(boot, self._vram_read, self.vram_visible)
        self.discovery = discovery.parse(blob)
        bringup.check_ips(self.discovery)
        self.mmio = Mmio(self.bridge, self.mmio_bar, bars[5].size, self.discovery.bases())
        self.ring = SdmaRing(self.bridge, RING_VA, QUEUE_PAGE_VA + 8, self.vram_bar, self.doorbell_bar)
        self.timeline = Timeline(self.bridge, SIGNAL_PAGE_VA, self.vram_bar, options.poll_limit, self.check_queues)
        heap_end = min(self.vram_visible, self.vram_size - TOP_RESERVED)
        self.heap = VramHeap(HEAP_VA, heap_end, ALLOC_ALIGN)
        self.faults: list[GpuFaultRecord] = []
        # a simulated card's own account of why a queue stopped (what the emulator saw: the instruction, the kernel),
        # added to the fault records; hardware reports only what its interrupt and fault registers hold
        self.explain: Callable[[str], str] | None = None
        self.steps: list[str] = ["pcie", "discovery"]
        self.ih: IhRing | None = None
        self.tables: PageTables | None = None
        self.compute: ComputeQueue | None = None
        self._mapped: dict[int, int] = {}  # 2 MiB page index of the heap -> live allocations on it
        if self.board is not None or options.unverified:
            self._bring_up()

    # ------------------------------------------------------------------ identity
    @property
    def identity(self) -> str:
        """The GPU as PCI ids: vendor:device (subsystem vendor:id)."""
        sub = self.subsystem
        return f"{self.pcie.vendor:04x}:{self.pcie.device:04x} (subsystem {sub & 0xFFFF:04x}:{sub >> 16:04x})"

    @property
    def ready(self) -> bool:
        return self.tables is not None

    def require_ready(self, what: str) -> None:
        """GpuBringUpUnverified naming `what` when the bring-up did not run (an unverified board, no opt-in)."""
        if not self.ready:
            raise GpuBringUpUnverified(
                what,
                f"GPU {self.identity} ({self.discovery.summary()}) is not a board speck's bring-up was verified on; "
                "the driver stopped after PCIe link/BAR setup and reading the discovery table and wrote nothing else",
            )

    # ------------------------------------------------------------------ bring-up
    def _vram_read(self, offset: int, n: int) -> bytes:
        return self.bridge.stream_read(self.vram_bar + offset, n)

    def _vram_write(self, offset: int, data: bytes) -> None:
        self.bridge.stream_write(self.vram_bar + offset, data)

    def _ring_doorbell(self, index: int, value: int) -> None:
        """A 64-bit doorbell at dword `index` of BAR2 (low dword first: the high one commits it)."""
        self.bridge.stream_write(self.doorbell_bar + 4 * index, value.to_bytes(8, "little"))

    def _bring_up(self) -> None:
        firmware = ucode.load(self.options.firmware)
        io = bringup.VramIo(self._vram_write, self._vram_read)
        card = bringup.bring_up(self.mmio, io, self._ring_doorbell, firmware, self.vram_size, self.steps)
        self.tables, self.fb, self.compute = card.tables, card.fb, card.compute
        self.ih = IhRing(self.mmio, self.bridge, self.vram_bar, IH_RING_VA, IH_RING_SIZE)
        self._vram_write(SIGNAL_PAGE_VA, bytes(16))
        self.timeline.value = 1
        self.ring.put_value = 0

    # ------------------------------------------------------------------ VRAM mappings
    def map_heap(self, ranges: list[tuple[int, int]]) -> None:
        """Make the heap ranges (va, size) reachable by the GPU: their 2 MiB pages, shared by allocations, are
        mapped, then one TLB invalidation covers them all."""
        assert self.tables is not None
        new = []
        for va, size in ranges:
            for page in range(va // HUGE, (va + max(size, 1) - 1) // HUGE + 1):
                self._mapped[page] = self._mapped.get(page, 0) + 1
                if self._mapped[page] == 1:
                    new.append(page)
        for page in new:
            self.tables.map_vram(page * HUGE, page * HUGE, HUGE)
        if new:
            self.tables.flush()
            bringup.invalidate_tlb(self.mmio, bringup.VMID)

    def unmap_heap(self, va: int, size: int) -> None:
        """Drop an allocation's hold on its 2 MiB pages; pages nothing uses any more are unmapped."""
        assert self.tables is not None
        gone = []
        for page in range(va // HUGE, (va + max(size, 1) - 1) // HUGE + 1):
            self._mapped[page] -= 1
            if not self._mapped[page]:
                del self._mapped[page]
                gone.append(page)
        for page in gone:
            self.tables.unmap(page * HUGE, HUGE)
        if gone:
            self.tables.flush()
            bringup.invalidate_tlb(self.mmio, bringup.VMID)

    def gpu_time_ns(self) -> int:
        """The GPU's clock (CP_MES_MTIME, 100 MHz) in ns: what waits bounded in time measure."""
        m = self.mmio
        for _ in range(3):  # the high word must not move while the low one is read
            hi = m.read(GC.CP_MES_MTIME_HI)
            lo = m.read(GC.CP_MES_MTIME_LO)
            if m.read(GC.CP_MES_MTIME_HI) == hi:
                return (hi << 32 | lo) * TIMESTAMP_NS
        return (hi << 32 | lo) * TIMESTAMP_NS

    # ------------------------------------------------------------------ queue health
    def poll_faults(self) -> list[GpuFaultRecord]:
        """New fault and hang reports from the interrupt ring (also kept in `faults`)."""
        if self.ih is None:
            return []
        found = [r for r in (describe(e, self.mmio) for e in self.ih.poll()) if r is not None]
        found = [self.explained(r) for r in found]
        self.faults += found
        return found

    def explained(self, record: GpuFaultRecord) -> GpuFaultRecord:
        """`record` with a simulated card's own account of the stop added to its detail (hardware: unchanged)."""
        account = self.explain(record.queue) if self.explain is not None else ""
        if not account:
            return record
        return replace(record, detail="; ".join(filter(None, (record.detail, f"simulator: {account}"))))

    def check_queues(self, what: str) -> None:
        """Raise GpuHang / GpuFault for the first queue the interrupt ring reports stopped."""
        for record in self.poll_faults():
            raise stopped_queue_error(what, record)
