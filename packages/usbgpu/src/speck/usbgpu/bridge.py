"""The ASM2464 bridge's vendor requests (PROTOCOL.md 1.3-1.7) and the PCIe setup of the GPU behind it.

Everything here goes through the UsbTransport API only: xdata access (0xE4/0xE5), link bring-up (0xF3), TLPs
(0xF0 single and streaming), SRAM DMA arms (0xF2) and the fence-gated arm (0xF4).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from speck.usbgpu.errors import (
    PcieLinkError,
    PcieSetupError,
    TlpCompletionError,
    TlpError,
    TransferShortReadError,
    UsbError,
    UsbGpuValueError,
)

REQ_XDATA_READ, REQ_XDATA_WRITE, REQ_TLP, REQ_ARM, REQ_POWER, REQ_FENCE_ARM = 0xE4, 0xE5, 0xF0, 0xF2, 0xF3, 0xF4
EP_OUT, EP_IN = 0x02, 0x81
XDATA_LTSSM, LTSSM_L0 = 0xB450, 0x78
XDATA_FLAGS = 0xA800  # G3 fence flags: full0, full1, first0, first1 (u64 LE each)
E4_CHUNK = 0xFF  # the driver never asks 0xE4 for more than this (the fw caps replies at 512 B SS / 64 B HS)
SECTOR, SLOT = 512, 0x4000
WINDOW = 0x40000  # an OUT arm whose data ends on a 256 KiB boundary may corrupt its last sector (G1's finding)
TLP_RETRIES = 10
CPL_STATUS_NAMES = {
    1: "Unsupported Request (UR)",
    2: "Configuration Request Retry Status (CRS)",
    4: "Completer Abort (CA)",
}

# Each vendor request by name, with what to try when it fails (quoted by every error it raises).
VENDOR_REQUESTS: dict[int, tuple[str, str]] = {
    REQ_XDATA_READ: ("0xE4 xdata read", ""),
    REQ_XDATA_WRITE: ("0xE5 xdata write", ""),
    REQ_TLP: ("0xF0 PCIe TLP", ""),
    REQ_ARM: ("0xF2 SRAM DMA arm", ""),
    REQ_POWER: ("0xF3 PCIe power", ""),
    REQ_FENCE_ARM: ("0xF4 fence-gated arm", "a firmware older than 0xF4 stalls it: USB_F4GATE=0 selects the 0xF2 gate"),
}

# PCIe topology (PROTOCOL.md 1.5): bridges on buses 0..3, the GPU on bus 4.
GPU_BUS = 4
MEM_WINDOW_BASE = 0x1000_0000
PREF_WINDOW_BASE = 0x8_0000_0000
BAR_ALIGN = 2 << 20
CMD_IO_MEM_MASTER = 0x7
REBAR_CAP_ID = 0x15


class Transport(Protocol):
    """The part of speck.usbgpu.transport.UsbTransport the bridge code uses."""

    def control_in(self, request: int, value: int, index: int, length: int, timeout_ms: int = 1000) -> bytes: ...

    def control_out(self, request: int, value: int, index: int, data: bytes = b"", timeout_ms: int = 1000) -> None: ...

    def bulk_out(self, endpoint: int, data: bytes | bytearray | memoryview, timeout_ms: int = 1000) -> None: ...

    def bulk_in(self, endpoint: int, length: int, timeout_ms: int = 10000) -> bytes: ...

    def submit_bulk_out(self, endpoint: int, data: bytes | bytearray | memoryview, timeout_ms: int = 10000) -> int: ...

    def wait(self, tag: int, timeout_ms: int = 10000) -> None: ...

    def close(self) -> None: ...


def pack_f4(sectors: int, slot_start: int, num_slots: int, buffer: int, target: int) -> tuple[int, int]:
    """wValue/wIndex of a 0xF4 fence-gated arm (PROTOCOL.md 1.7).

    wValue = sectors (9 bits) | target bits 6..0 << 9; wIndex = slot_start | num_slots (6 bits) << 8 |
    target bit 7 << 14 | buffer << 15. Example: 482 sectors, 16 slots from slot 16, buffer 1, target 5 ->
    (0x0BE2, 0x9010).
    """
    if not 0 < sectors <= 0x1FF:
        raise UsbGpuValueError(f"0xF4 sector count must be 1..511 (a bounce buffer is < 256 KiB), got {sectors}")
    if not 0 < num_slots < 64 or not 0 <= slot_start < 32 or buffer not in (0, 1):
        raise UsbGpuValueError(f"0xF4 slots {slot_start}+{num_slots} / buffer {buffer} out of range")
    target &= 0xFF
    return sectors | (target & 0x7F) << 9, slot_start | num_slots << 8 | (target >> 7) << 14 | buffer << 15


def ends_on_window(slot_start: int, nbytes: int) -> bool:
    """Whether an OUT arm of `nbytes` (padded to sectors) from `slot_start` ends exactly on a 256 KiB boundary."""
    return (slot_start * SLOT + -(-nbytes // SECTOR) * SECTOR) % WINDOW == 0


def f4_reached(flags: bytes, buffer: int, target: int) -> bool:
    """The host's 0xF4 success test: buffer's full-chunk or first-part flag reached `target` (8-bit modular)."""
    full, first = flags[8 * buffer], flags[16 + 8 * buffer]
    return (full - target) & 0xFF < 0x80 or (first - target) & 0xFF < 0x80


@dataclass(frozen=True)
class Bar:
    """One GPU BAR as placed by `Bridge.setup_pcie`."""

    index: int
    address: int
    size: int
    prefetchable: bool
    is64: bool


@dataclass(frozen=True)
class Topology:
    """What `Bridge.survey` read: the link, how far config reads reach, and the GPU as it is programmed."""

    ltssm: int
    bridges_reached: int  # bridges on buses 0..3 answering config reads through the bus numbers as programmed
    gpu_ids: int | None  # config dword 0 of bus 4, None when bus 4 is not reachable
    subsystem: int | None
    command: int | None
    bars: dict[int, int]  # BAR index -> programmed address (non-zero ones only); sizes need a write probe
    rebar_size: int | None  # BAR0 size from the resizable-BAR control register
    note: str  # why the survey stopped where it did ("" if it reached the GPU)


@dataclass(frozen=True)
class PcieInfo:
    """What bridge/BAR setup found: GPU ids, the BARs, and the resizable-BAR outcome."""

    vendor: int
    device: int
    bars: dict[int, Bar]
    rebar_size: int | None


class Bridge:
    """Vendor requests of the custom bridge firmware on top of a UsbTransport."""

    def __init__(self, usb: Transport, *, tlp_retry_sleep_s: float = 0.001) -> None:
        self.usb = usb
        self.tlp_retry_sleep_s = tlp_retry_sleep_s

    # ------------------------------------------------------------------ vendor requests
    # Every control transfer goes through these two, so a failure names the vendor request and what it was for
    # (`what.format(*args)`, formatted only on failure: these are the driver's hot path).
    def _in(
        self, request: int, value: int, index: int, length: int, timeout_ms: int, what: str, *args: object
    ) -> bytes:
        try:
            return self.usb.control_in(request, value, index, length, timeout_ms)
        except UsbError as exc:
            raise _named(exc, request, what.format(*args)) from None

    def _out(
        self, request: int, value: int, index: int, data: bytes, timeout_ms: int, what: str, *args: object
    ) -> None:
        try:
            self.usb.control_out(request, value, index, data, timeout_ms)
        except UsbError as exc:
            raise _named(exc, request, what.format(*args)) from None

    # ------------------------------------------------------------------ xdata
    def xdata_read(self, addr: int, n: int, bank: int = 0) -> bytes:
        """Read `n` bytes of bridge xdata (0xE4, at most 0xFF bytes per request; a short reply is an error)."""
        if 0 < n <= E4_CHUNK:  # the common case (flags, LTSSM): one request
            reply = self._in(REQ_XDATA_READ, addr & 0xFFFF, bank << 8, n, 1000, "xdata {:#06x}", addr)
            if len(reply) != n:
                raise PcieSetupError(f"0xE4 read of xdata {addr:#06x}", f"got {len(reply)} of {n} bytes")
            return reply
        out = bytearray()
        while len(out) < n:
            k = min(E4_CHUNK, n - len(out))
            a = addr + len(out)
            reply = self._in(REQ_XDATA_READ, a & 0xFFFF, bank << 8, k, 1000, "xdata {:#06x}", a)
            if len(reply) != k:
                raise PcieSetupError(f"0xE4 read of xdata {a:#06x}", f"got {len(reply)} of {k} bytes")
            out += reply
        return bytes(out)

    def xdata_write(self, addr: int, data: bytes, bank: int = 0) -> None:
        """Write bridge xdata one byte per 0xE5 request."""
        for i, b in enumerate(data):
            self._out(REQ_XDATA_WRITE, (addr + i) & 0xFFFF, b | bank << 8, b"", 1000, "xdata {:#06x}", addr + i)

    def read_flags(self, buffer: int) -> tuple[int, int]:
        """(full-chunk, first-part) fence flags of bounce buffer `buffer`, with one 24-byte 0xE4 read."""
        raw = self.xdata_read(XDATA_FLAGS + 8 * buffer, 24)
        return int.from_bytes(raw[0:8], "little"), int.from_bytes(raw[16:24], "little")

    # ------------------------------------------------------------------ link
    def ltssm(self) -> int:
        """The PCIe LTSSM state byte (0x78 = L0, link up)."""
        return self.xdata_read(XDATA_LTSSM, 1)[0]

    def ensure_link(self) -> int:
        """Bring the downstream PCIe link up (0xF3(1) if needed); raises PcieLinkError if LTSSM stays off L0."""
        state = self.ltssm()
        if state == LTSSM_L0:
            return state
        self._out(REQ_POWER, 1, 0, b"", 10000, "link bring-up")
        state = self.ltssm()
        if state != LTSSM_L0:
            raise PcieLinkError("PCIe link bring-up (0xF3)", f"PCIe link not up (LTSSM={state:#04x}, want 0x78)")
        return state

    # ------------------------------------------------------------------ TLPs
    def tlp(self, fmt: int, address: int, value: int = 0, size: int = 4) -> int:
        """Issue one TLP through 0xF0 mode 0 and return the (shifted, masked) completion data for reads.

        Sub-dword accesses set byte enables and shift the data by the byte offset. A non-zero ret_status is retried
        after 1 ms up to 10 times; a completion with UR/CA/CRS status raises TlpCompletionError.
        """
        if not 1 <= size <= 4 or (address & 3) + size > 4:
            raise UsbGpuValueError(f"TLP of {size} bytes at {address:#x} crosses a dword")
        shift = 8 * (address & 3)
        byte_enable = ((1 << size) - 1) << (address & 3)
        aligned = address & ~3
        payload = struct.pack("<III", aligned & 0xFFFFFFFF, aligned >> 32, (value << shift) & 0xFFFFFFFF)
        posted = (fmt & 0xDF) == 0x40 or (fmt & 0xB8) == 0x30
        what = f"TLP fmt {fmt:#04x} at {address:#x}"
        for attempt in range(TLP_RETRIES + 1):
            self._out(REQ_TLP, fmt | byte_enable << 8, 0, payload, 5000, what)
            if posted:
                return 0
            reply = self._in(REQ_TLP, 0, 0, 8, 5000, "completion of {}", what)
            if len(reply) != 8:
                raise TlpError(what, f"0xF0 completion reply of {len(reply)} bytes, want 8")
            data, hdr_hi, _hdr_lo, _cpl_type, ret_status = struct.unpack("<IBBBB", reply)
            if ret_status != 0:
                if attempt < TLP_RETRIES:
                    time.sleep(self.tlp_retry_sleep_s)
                    continue
                raise TlpError(what, f"TLP error after retries (ret_status={ret_status:#04x})")
            status = hdr_hi >> 5
            if status:
                name = CPL_STATUS_NAMES.get(status, f"status {status}")
                err = TlpCompletionError(what, f"completion status {name}")
                err.status = status  # type: ignore[attr-defined]
                raise err
            return int(data >> shift) & ((1 << (8 * size)) - 1)
        raise AssertionError("unreachable")

    @staticmethod
    def cfg_address(bus: int, dev: int, fn: int, reg: int) -> int:
        return bus << 24 | dev << 19 | fn << 16 | (reg & 0xFFF)

    def cfg_read(self, bus: int, reg: int, size: int = 4, dev: int = 0, fn: int = 0) -> int:
        """Config read (type 0 on bus 0, type 1 beyond)."""
        return self.tlp(0x04 if bus == 0 else 0x05, self.cfg_address(bus, dev, fn, reg), 0, size)

    def cfg_write(self, bus: int, reg: int, value: int, size: int = 4, dev: int = 0, fn: int = 0) -> None:
        """Config write (non-posted: its completion is checked)."""
        self.tlp(0x44 if bus == 0 else 0x45, self.cfg_address(bus, dev, fn, reg), value, size)

    def mem_read32(self, address: int) -> int:
        """One dword memory read (MRd32/64)."""
        return self.tlp(0x20 if address >> 32 else 0x00, address, 0, 4)

    def mem_write32(self, address: int, value: int) -> None:
        """One dword posted memory write (MWr32/64)."""
        self.tlp(0x60 if address >> 32 else 0x40, address, value, 4)

    def stream_write(self, address: int, data: bytes | bytearray | memoryview) -> None:
        """0xF0 mode 1: write `data` (a multiple of 4 bytes) to PCIe memory through EP 0x02, one dword TLP each."""
        n = len(data)
        if n == 0:
            return
        if n % 4:
            raise UsbGpuValueError(f"0xF0 stream writes move whole dwords; {n} bytes is not a multiple of 4")
        payload = struct.pack("<III", address & 0xFFFFFFFF, address >> 32, n // 4)
        self._out(REQ_TLP, 0x60 | 0x0F << 8, 1, payload, 5000, "stream write of {} bytes at {:#x}", n, address)
        self.usb.bulk_out(EP_OUT, data, 5000)

    def stream_read(self, address: int, n: int) -> bytes:
        """0xF0 mode 2: read `n` bytes (a multiple of 4) of PCIe memory through EP 0x81."""
        if n % 4 or n <= 0:
            raise UsbGpuValueError(f"0xF0 stream reads move whole dwords; {n} bytes is not a positive multiple of 4")
        payload = struct.pack("<III", address & 0xFFFFFFFF, address >> 32, n // 4)
        what = f"stream read of {n} bytes at {address:#x}"
        self._out(REQ_TLP, 0x20 | 0x0F << 8, 2, payload, 5000, what)
        return self.bulk_in_exact(n, 30000, f"0xF0 {what}")

    def bulk_in_exact(self, n: int, timeout_ms: int, what: str) -> bytes:
        """Bulk IN of exactly `n` bytes on EP 0x81; fewer (a short packet ended the transfer) is a short read."""
        data = self.usb.bulk_in(EP_IN, n, timeout_ms)
        if len(data) != n:
            raise TransferShortReadError(f"bulk IN 0x81 for the {what}", None, f"got {len(data)} of {n} bytes")
        return data

    # ------------------------------------------------------------------ SRAM DMA arms
    def arm_write(self, nbytes: int, slot_start: int) -> None:
        """0xF2 write arm for `nbytes` (padded to sectors) of EP 0x02 data landing from `slot_start`."""
        sectors = -(-nbytes // SECTOR)
        slots = -(-nbytes // SLOT)
        if not 0 < sectors <= 0x7FFF or slot_start + slots > 32:
            raise UsbGpuValueError(f"0xF2 arm of {nbytes} bytes from slot {slot_start} does not fit the 512 KiB SRAM")
        _refuse_full_window(slot_start, nbytes)
        self._out(
            REQ_ARM, sectors, slot_start | slots << 8, b"", 1000, "write of {} bytes at slot {}", nbytes, slot_start
        )

    def arm_read(self, nbytes: int) -> None:
        """0xF2 read arm: the next CQ-page write by the GPU releases `nbytes` (padded) of SRAM slot 0.. on EP 0x81."""
        sectors = -(-nbytes // SECTOR)
        slots = -(-nbytes // SLOT)
        if not 0 < sectors <= 0x7FFF or slots > 32:
            raise UsbGpuValueError(f"0xF2 read arm of {nbytes} bytes does not fit the 512 KiB SRAM")
        self._out(REQ_ARM, sectors | 0x8000, slots << 8, b"", 1000, "read of {} bytes", nbytes)

    def arm_fenced(self, nbytes: int, slot_start: int, buffer: int, target: int) -> bytes:
        """0xF4: the device waits until `buffer`'s fence flag reaches `target`, then arms like 0xF2.

        Returns the 32-byte flag window it replied with; the caller applies `f4_reached` (a bail skips the arm and
        replies with the stale flags).
        """
        _refuse_full_window(slot_start, nbytes)
        value, index = pack_f4(-(-nbytes // SECTOR), slot_start, -(-nbytes // SLOT), buffer, target)
        what = "{} bytes into buffer {} once its fence reaches {}"
        reply = self._in(REQ_FENCE_ARM, value, index, 32, 30000, what, nbytes, buffer, target & 0xFF)
        if len(reply) != 32:
            raise TlpError("0xF4 fence-gated arm", f"reply of {len(reply)} bytes, want 32 (firmware without 0xF4?)")
        return reply

    # ------------------------------------------------------------------ PCIe setup
    def setup_pcie(self, check: Callable[[int, int, int], None] | None = None) -> PcieInfo:
        """Configure bridges on buses 0..3, find the GPU on bus 4, grow BAR0 with ReBAR and place every BAR.

        `check(vendor, device, class_code)` vets the function behind the bridge before anything is written to it;
        its memory decoding is off while its BARs are resized and placed, then memory and bus mastering go on."""
        for bus in range(GPU_BUS):
            self.cfg_write(bus, 0x18, 0 | (bus + 1) << 8 | GPU_BUS << 16)
            self.cfg_write(bus, 0x20, 0xFFFF << 16 | MEM_WINDOW_BASE >> 16)  # memory window 0x1000_0000 ..
            self.cfg_write(bus, 0x24, 0xFFFF << 16 | (PREF_WINDOW_BASE >> 16) & 0xFFFF)
            self.cfg_write(bus, 0x28, PREF_WINDOW_BASE >> 32)  # prefetchable window from 32 GiB ..
            self.cfg_write(bus, 0x2C, 0xFFFFFFFF)  # .. to the top
            self.cfg_write(bus, 0x04, CMD_IO_MEM_MASTER)
        ids = self.cfg_read(GPU_BUS, 0x00)
        vendor, device = ids & 0xFFFF, ids >> 16
        if vendor in (0xFFFF, 0x0000):
            raise PcieSetupError("PCIe enumeration", f"no device on bus {GPU_BUS} (id {ids:#010x})")
        if check is not None:
            check(vendor, device, self.cfg_read(GPU_BUS, 0x08) >> 8)
        self.cfg_write(GPU_BUS, 0x04, 0)  # no decoding while BARs move
        rebar = self._grow_rebar()
        bars = self._place_bars(self._size_bars())
        self.cfg_write(GPU_BUS, 0x04, CMD_IO_MEM_MASTER)
        return PcieInfo(vendor, device, bars, rebar)

    def _find_rebar(self) -> int | None:
        """Config offset of the GPU's resizable-BAR capability (a read-only walk of the extended capabilities)."""
        offset = 0x100
        for _ in range(64):
            header = self.cfg_read(GPU_BUS, offset)
            if header in (0, 0xFFFFFFFF):
                return None
            if header & 0xFFFF == REBAR_CAP_ID:
                return offset
            offset = header >> 20
            if offset < 0x100:
                return None
        return None

    def _grow_rebar(self) -> int | None:
        offset = self._find_rebar()
        if offset is None:
            return None
        count = self.cfg_read(GPU_BUS, offset + 8) >> 5 & 7
        size = None
        for i in range(max(count, 1)):
            cap = self.cfg_read(GPU_BUS, offset + 4 + 8 * i)
            ctrl = self.cfg_read(GPU_BUS, offset + 8 + 8 * i)
            supported = cap >> 4
            if not supported:
                continue
            largest = supported.bit_length() - 1
            self.cfg_write(GPU_BUS, offset + 8 + 8 * i, (ctrl & ~0x3F00) | largest << 8)
            if ctrl & 7 == 0:
                size = 1 << (largest + 20)
        return size

    # ------------------------------------------------------------------ read-only survey
    def survey(self) -> Topology:
        """The link and the PCIe fabric as they are programmed, by reads only: no 0xF3, no config or memory write
        (so BAR sizes, which need the all-ones write probe, are not reported; ReBAR's control register gives BAR0's)."""
        ltssm = self.ltssm()
        if ltssm != LTSSM_L0:
            return Topology(ltssm, 0, None, None, None, {}, None, "the PCIe link is down (UsbGpu.open brings it up)")
        for bus in range(GPU_BUS + 1):
            try:
                ids = self.cfg_read(bus, 0x00)
            except TlpCompletionError:
                note = f"config reads do not reach bus {bus}: the bridges are not set up (UsbGpu.open sets them up)"
                return Topology(ltssm, bus, None, None, None, {}, None, note)
        if ids & 0xFFFF in (0xFFFF, 0x0000):
            return Topology(ltssm, GPU_BUS, None, None, None, {}, None, f"no device on bus {GPU_BUS}")
        bars: dict[int, int] = {}
        index = 0
        while index < 6:
            low = self.cfg_read(GPU_BUS, 0x10 + 4 * index)
            is64 = not low & 1 and (low >> 1 & 3) == 2
            address = (low & ~0xF) | (self.cfg_read(GPU_BUS, 0x14 + 4 * index) << 32 if is64 else 0)
            if address and not low & 1:
                bars[index] = address
            index += 2 if is64 else 1
        rebar = self._find_rebar()
        rebar_size = None
        if rebar is not None:
            rebar_size = 1 << ((self.cfg_read(GPU_BUS, rebar + 8) >> 8 & 0x3F) + 20)
        command = self.cfg_read(GPU_BUS, 0x04) & 0xFFFF
        return Topology(ltssm, GPU_BUS, ids, self.cfg_read(GPU_BUS, 0x2C), command, bars, rebar_size, "")

    def _size_bars(self) -> list[tuple[int, int, bool, bool]]:
        found: list[tuple[int, int, bool, bool]] = []
        index = 0
        while index < 6:
            reg = 0x10 + 4 * index
            orig = self.cfg_read(GPU_BUS, reg)
            if orig & 1:  # I/O BAR: not used
                index += 1
                continue
            is64 = (orig >> 1 & 3) == 2
            self.cfg_write(GPU_BUS, reg, 0xFFFFFFFF)
            mask = self.cfg_read(GPU_BUS, reg) & ~0xF
            implemented = mask != 0
            if is64:
                self.cfg_write(GPU_BUS, reg + 4, 0xFFFFFFFF)
                mask |= self.cfg_read(GPU_BUS, reg + 4) << 32
                implemented = mask != 0
            else:
                mask |= 0xFFFFFFFF << 32
            if implemented:  # an unimplemented BAR reads back zero
                found.append((index, (~mask & (1 << 64) - 1) + 1, bool(orig & 8), is64))
            index += 2 if is64 else 1
        return found

    def _place_bars(self, sized: list[tuple[int, int, bool, bool]]) -> dict[int, Bar]:
        cursors = {True: PREF_WINDOW_BASE, False: MEM_WINDOW_BASE}
        bars: dict[int, Bar] = {}
        for index, size, pref, is64 in sorted(sized, key=lambda b: -b[1]):
            window = pref and is64
            align = max(size, BAR_ALIGN)
            address = -(-cursors[window] // align) * align
            cursors[window] = address + align
            if not window and address + size > 0xFFFFFFFF:
                raise PcieSetupError("BAR placement", f"BAR{index} of {size:#x} bytes does not fit below 4 GiB")
            reg = 0x10 + 4 * index
            self.cfg_write(GPU_BUS, reg, address & 0xFFFFFFFF)
            if is64:
                self.cfg_write(GPU_BUS, reg + 4, address >> 32)
            bars[index] = Bar(index, address, size, pref, is64)
        return bars


def _named(exc: UsbError, request: int, what: str) -> UsbError:
    """`exc` (a transport error) with the vendor request it belongs to in its operation and hint; same class."""
    name, hint = VENDOR_REQUESTS.get(request, (f"vendor request {request:#04x}", ""))
    exc.operation = f"{name} ({what}): {exc.operation}"
    exc.request = request  # type: ignore[attr-defined]
    if hint:
        exc.detail = f"{exc.detail}; {hint}" if exc.detail else hint
    exc.args = (exc._format(),)
    return exc


def _refuse_full_window(slot_start: int, nbytes: int) -> None:
    """Driver invariant: no OUT arm ends on a 256 KiB boundary (the data path pads or splits instead)."""
    if ends_on_window(slot_start, nbytes):
        raise UsbGpuValueError(
            f"an OUT arm of {nbytes} bytes from slot {slot_start} would end on a 256 KiB window boundary, where "
            "the bridge may corrupt the last sector; pad the transfer by one sector"
        )
