"""SimDevice: the bridge + GPU model behind the fake libusb (implements sim.model_api.UsbDeviceModel).

Three USB pipes run concurrently in virtual time: EP0 (vendor requests, one at a time, each a control round trip
plus firmware time; 0xF4 blocks inside it), EP 0x02 (bulk OUT routed to the active SRAM arm, else the 0xF0 mode-1
stream, else misrouted) and EP 0x81 (0xF0 mode-2 stream data, or a read-armed SRAM stream once the GPU wrote the
CQ page). The GPU's SDMA engine runs alongside. `wait` advances the clock event by event.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from speck.usbgpu.sim.clock import VirtualClock
from speck.usbgpu.sim.config import (
    SECTOR,
    SIM_GPU_SUBSYSTEM,
    SRAM_PCIE,
    SimFaults,
    SimTiming,
    TransferFault,
)
from speck.usbgpu.sim.dma import SramDmaEngine
from speck.usbgpu.sim.firmware import (
    REQ_ARM,
    REQ_FENCE_ARM,
    REQ_POWER,
    REQ_TLP,
    REQ_XDATA_READ,
    REQ_XDATA_WRITE,
    BridgeFirmware,
    F0Stream,
    Stall,
)
from speck.usbgpu.sim.gpu import GpuModel
from speck.usbgpu.sim.memory import BridgeMemory, SparseMemory
from speck.usbgpu.sim.model_api import (
    DeviceDescriptors,
    ModelError,
    ModelSubmitError,
    TransferKind,
    TransferResult,
    TransferStatus,
    asm2464_descriptors,
)
from speck.usbgpu.sim.pcie import PcieFabric
from speck.usbgpu.sim.sdma_engine import SdmaEngine
from speck.usbgpu.sim.vm import SYSTEM

LIBUSB_ERROR_NO_DEVICE = -4
LIBUSB_ERROR_INVALID_PARAM = -2
GIB = 1 << 30


@dataclass
class _Transfer:
    tid: int
    kind: TransferKind
    endpoint: int
    setup: bytes
    out: memoryview
    in_length: int
    submitted: float
    fault: TransferFault | None = None
    pos: int = 0
    data: bytearray = field(default_factory=bytearray)
    result: TransferResult | None = None
    naking: bool = False  # misrouted once: the device NAKs this transfer until something is armed
    stuck: bool = False  # injected timeout: the device NAKs this transfer until its own timeout
    moved: int = -1  # control OUT: data-stage bytes the device took (-1 = all)

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def fault_at(self) -> int | None:
        if self.fault is None:
            return None
        if self.fault.after_bytes is not None:
            return self.fault.after_bytes
        total = len(self.out) if self.endpoint & 0x80 == 0 else self.in_length
        return total // 2 // SECTOR * SECTOR


_DEFAULT_DEVICES: list[SimDevice] = []


def default_devices(count: int = 1) -> list[SimDevice]:
    """The process's default simulated bridges (what SPECK_USB_SIM=<count> puts on the bus): made on first use, then
    the same objects for the life of the process, so every session opened through the environment sees the same
    devices (and their VRAM). Device i sits at usb:1-(7+i)."""
    while len(_DEFAULT_DEVICES) < count:
        _DEFAULT_DEVICES.append(SimDevice(address=7 + len(_DEFAULT_DEVICES)))
    return _DEFAULT_DEVICES[:count]


class SimDevice(BridgeFirmware):
    """An ASM2464 bridge with the custom firmware and an RDNA3-class GPU behind it, in virtual time.

    `violations` collects protocol violations (data before arm, GPU reading a part before its sentinel landed,
    host overwriting data the GPU has not copied yet, ...); `stats` counts doorbells, transfers, faults and every
    request that changes device state (xdata/TLP/stream writes, arms, power, MMIO writes); `model_cpu_s` is the
    host CPU time spent inside this model (for benchmarks that report driver-only cost).

    `serial` (8 hex digits) identifies the device, as a bridge's OTP serial does: the driver's device lock is keyed
    on it, so two processes opening simulated devices with the same serial model two openers of one bridge. By
    default every SimDevice gets a fresh random serial. `gpu_subsystem` is the GPU's PCI subsystem id: the
    default marks the simulated GPU (the driver then uses its simulator profile); HARDWARE_LIKE_SUBSYSTEM makes it
    look like a real board, for which the driver must do nothing past link and BAR setup and reading the discovery
    table (unless opened with the unverified-board opt-in). `gpu_ips` replaces the IP blocks (name -> version) the
    card lists in its discovery table. `firmware` is the set of firmware files the card's PSP accepts (default: a
    synthetic set with valid headers, speck.usbgpu.amd.ucode.synthetic_files); `firmware_files()` hands it to a
    driver opening the card.
    """

    def __init__(
        self,
        timing: SimTiming | None = None,
        faults: SimFaults | None = None,
        *,
        vid: int = 0xADD1,
        pid: int = 0x0001,
        bus: int = 1,
        address: int = 7,
        serial: str | None = None,
        product: str = "custom v0.1",
        vram_size: int = 8 * GIB,
        gpu_subsystem: int = SIM_GPU_SUBSYSTEM,
        gpu_ips: dict[str, tuple[int, int, int]] | None = None,
        firmware: dict[str, bytes] | None = None,
    ) -> None:
        self.vid, self.pid, self.bus, self.address = vid, pid, bus, address
        self.manufacturer, self.product = "tiny", product
        self.serial = secrets.token_hex(4) if serial is None else serial
        self.timing = timing or SimTiming()
        self.faults = faults or SimFaults()
        self.clock = VirtualClock()
        self.mem = BridgeMemory()
        self.dma = SramDmaEngine(self.mem)
        self.fabric = PcieFabric(vram_size, gpu_subsystem)
        self.gpu = GpuModel(self, vram_size, gpu_ips, firmware)
        self.stream: F0Stream | None = None
        self.violations: list[str] = []
        self.stats: dict[str, int] = {
            k: 0
            for k in (
                "doorbells",
                "control_transfers",
                "bulk_out_transfers",
                "bulk_in_transfers",
                "bulk_out_bytes",
                "bulk_in_bytes",
                "misrouted_packets",
                "f4_requests",
                "f4_bails",
                "f4_waits",
                "arms_retired",
                "cqes_written",
                "xdata_writes",
                "tlp_writes",
                "stream_writes",
                "arms",
                "power_requests",
                "mmio_writes",
                "gpu_config_writes",
                "full_window_corruptions",
            )
        }
        self.model_cpu_s = 0.0
        self._connected = True
        self._kernel_driver = True
        self._configuration = 0
        self._halted: set[int] = set()
        self._next_tid = 1
        self._transfers: dict[int, _Transfer] = {}
        self._completed: list[tuple[int, TransferResult]] = []
        self._ctrl: deque[_Transfer] = deque()
        self._out: deque[_Transfer] = deque()
        self._in: deque[_Transfer] = deque()
        self._ctrl_serving: _Transfer | None = None  # the control transfer EP0 is busy with
        self._out_busy = self._in_busy = False
        self._pipe_epoch = 0
        self._f4_waiter: tuple[_Transfer, int, int, int, int, int] | None = None
        self._f4_bailed_once = False
        self._out_bytes_moved = 0
        self._cqe_index = 0
        self._init_firmware()

    # ------------------------------------------------------------------ UsbDeviceModel: device level
    def descriptors(self) -> DeviceDescriptors:
        return asm2464_descriptors(self.vid, self.pid)

    def kernel_driver_active(self, interface: int) -> bool:
        self._require_connected()
        return self._kernel_driver and interface == 0

    def detach_kernel_driver(self, interface: int) -> None:
        self._require_connected()
        self._kernel_driver = False

    def reset(self) -> None:
        self._require_connected()
        self._usb_reset_state()

    def set_configuration(self, value: int) -> None:
        self._require_connected()
        self._configuration = value
        self._usb_reset_state()

    def set_interface_alt_setting(self, interface: int, alt: int) -> None:
        self._require_connected()
        if interface != 0 or alt not in (0, 1):
            raise ModelError(LIBUSB_ERROR_INVALID_PARAM, f"no interface {interface} alt setting {alt}")
        self._usb_reset_state()

    def clear_halt(self, endpoint: int) -> None:
        self._require_connected()
        self._halted.discard(endpoint)
        self.stream = None

    @property
    def connected(self) -> bool:
        return self._connected

    # ------------------------------------------------------------------ test / fault helpers
    def inject(self, fault: TransferFault) -> None:
        """Arm a one-shot transfer fault (see SimFaults.transfer_faults)."""
        self.faults.transfer_faults.append(fault)

    def disconnect(self) -> None:
        """Unplug: every pending transfer completes with NO_DEVICE and later calls fail with NO_DEVICE."""
        if not self._connected:
            return
        self._connected = False
        for t in list(self._ctrl) + list(self._out) + list(self._in):
            self._complete(t, TransferStatus.NO_DEVICE)
        self._ctrl.clear()
        self._out.clear()
        self._in.clear()
        self._restart_pipes()

    def reconnect(self) -> None:
        """Plug back in. Bridge memories and the GPU keep their state; the USB side starts clean."""
        self._connected = True
        self._kernel_driver = True
        self._usb_reset_state()

    @property
    def now_ns(self) -> float:
        """Current virtual time in nanoseconds."""
        return self.clock.now

    def firmware_files(self) -> dict[str, bytes]:
        """The firmware files this card's PSP accepts (what a driver opening it loads)."""
        return dict(self.gpu.firmware_files)

    @property
    def vram(self) -> SparseMemory:
        """The GPU's VRAM (offsets are VRAM addresses; speck's driver maps VRAM offset x at GPU virtual address x)."""
        return self.gpu.vram

    @property
    def sdma(self) -> SdmaEngine:
        return self.gpu.sdma

    def read_vram(self, addr: int, n: int) -> bytes:
        """Backdoor VRAM read for tests (no virtual time)."""
        return self.vram.read(addr, n)

    # ------------------------------------------------------------------ transfers
    def submit(
        self,
        kind: TransferKind,
        endpoint: int,
        setup: bytes | None,
        out_data: bytes,
        in_length: int,
        timeout_ms: int,
    ) -> int:
        t0 = time.thread_time()
        try:
            return self._submit(kind, endpoint, setup, out_data, in_length, timeout_ms)
        finally:
            self.model_cpu_s += time.thread_time() - t0

    def _submit(
        self, kind: TransferKind, endpoint: int, setup: bytes | None, out_data: bytes, in_length: int, timeout_ms: int
    ) -> int:
        if not self._connected:
            raise ModelSubmitError(LIBUSB_ERROR_NO_DEVICE, "device disconnected")
        tid = self._next_tid
        self._next_tid += 1
        t = _Transfer(tid, kind, endpoint, setup or b"", memoryview(out_data).cast("B"), in_length, self.clock.now)
        request = setup[1] if kind == "control" and setup else None
        for fault in list(self.faults.transfer_faults):
            if fault.endpoint == endpoint and fault.request in (None, request):
                fault.nth -= 1
                if fault.nth <= 0:
                    t.fault = fault
                    self.faults.transfer_faults.remove(fault)
                    break
        self._transfers[tid] = t
        if timeout_ms > 0:
            self.clock.at(self.clock.now + timeout_ms * 1e6, lambda: self._timeout(t))  # per transfer: no epoch
        if kind == "control":
            self.stats["control_transfers"] += 1
            self._ctrl.append(t)
            self._pump_ctrl()
        elif endpoint in self._halted:
            self._complete(t, TransferStatus.STALL)
        elif endpoint & 0x80:
            self.stats["bulk_in_transfers"] += 1
            self._in.append(t)
            self._pump_in()
        else:
            self.stats["bulk_out_transfers"] += 1
            self._out.append(t)
            self._pump_out()
        return tid

    def cancel(self, transfer_id: int) -> None:
        t = self._transfers.get(transfer_id)
        if t is not None and not t.done:
            self._complete(t, TransferStatus.CANCELLED)

    def wait(self, transfer_ids: Sequence[int] | None, timeout_ms: int) -> list[tuple[int, TransferResult]]:
        t0 = time.thread_time()
        try:
            return self._wait(transfer_ids, timeout_ms)
        finally:
            self.model_cpu_s += time.thread_time() - t0

    def _wait(self, transfer_ids: Sequence[int] | None, timeout_ms: int) -> list[tuple[int, TransferResult]]:
        deadline = self.clock.now + max(timeout_ms, 0) * 1e6
        wanted = None if transfer_ids is None else set(transfer_ids)
        clock = self.clock
        while True:
            if self._completed and (wanted is None or any(tid in wanted for tid, _ in self._completed)):
                break
            if timeout_ms <= 0:
                break
            nxt = clock.peek()
            if nxt is None or nxt > deadline:
                clock.advance_to(deadline)
                break
            clock.run_next()
        done, self._completed = self._completed, []
        return done

    def _complete(self, t: _Transfer, status: TransferStatus) -> None:
        if t.done:
            return
        if t.kind == "control" and t.setup[:1] and not t.setup[0] & 0x80:
            moved = len(t.out) if t.moved < 0 else t.moved
            t.result = TransferResult(status, moved if status == TransferStatus.COMPLETED else 0)
        elif t.endpoint & 0x80 or t.kind == "control":
            data = bytes(t.data)
            t.result = TransferResult(status, len(data), data)
        else:
            t.result = TransferResult(status, t.pos)
        self._completed.append((t.tid, t.result))
        del self._transfers[t.tid]
        t.out = memoryview(b"")  # its timeout event (seconds of virtual time ahead) still holds t: free the payload
        if self._f4_waiter is not None and self._f4_waiter[0] is t:
            self._f4_waiter = None
        if self._ctrl_serving is t:  # however it ended (reply, timeout, cancel), EP0 moves on to the next request
            self._ctrl_serving = None
            self._at(self.clock.now, self._pump_ctrl)

    def _timeout(self, t: _Transfer) -> None:
        if not t.done:
            self._complete(t, TransferStatus.TIMED_OUT)
            self._pipes_changed()

    def _at(self, when: float, fn: Callable[[], None]) -> None:
        """Schedule a pipe event; a disconnect or USB reset in between (new pipe epoch) turns it into a no-op."""
        epoch = self._pipe_epoch

        def run() -> None:
            if epoch == self._pipe_epoch:
                fn()

        self.clock.at(when, run)

    def _restart_pipes(self) -> None:
        """A new pipe epoch: every pipe event scheduled before now is dropped when it fires."""
        self._pipe_epoch += 1
        self._ctrl_serving = None
        self._out_busy = self._in_busy = False
        self._f4_waiter = None

    def _require_connected(self) -> None:
        if not self._connected:
            raise ModelError(LIBUSB_ERROR_NO_DEVICE, "device disconnected")

    def _usb_reset_state(self) -> None:
        """SET_CONFIGURATION / SET_INTERFACE / reset: clear both bulk endpoints and cancel streaming and arms."""
        for t in list(self._ctrl) + list(self._out) + list(self._in):
            self._complete(t, TransferStatus.CANCELLED)
        self._ctrl.clear()
        self._out.clear()
        self._in.clear()
        self._restart_pipes()
        self._halted.clear()
        self.stream = None
        self.dma.reset()

    def _fault_now(self, t: _Transfer) -> bool:
        """Apply `t`'s injected fault if it is due; True if the transfer ended (or NAKs forever)."""
        at = t.fault_at
        progress = len(t.data) if t.endpoint & 0x80 else t.pos
        if at is None or progress < at or t.fault is None:
            return False
        mode = t.fault.mode
        if mode == "error":
            self._complete(t, TransferStatus.ERROR)
        elif mode == "short":
            self._complete(t, TransferStatus.COMPLETED)
        elif mode == "stall":
            self._halted.add(t.endpoint)
            self._complete(t, TransferStatus.STALL)
        else:  # timeout: the device stops accepting, the transfer's own timeout ends it
            t.stuck = True
        return True

    # ------------------------------------------------------------------ EP0
    def _pump_ctrl(self) -> None:
        while self._ctrl and self._ctrl[0].done:
            self._ctrl.popleft()
        if self._ctrl_serving is not None or not self._ctrl or not self._connected:
            return
        t = self._ctrl[0]
        self._ctrl_serving = t
        self._at(self.clock.now + self.timing.control_rtt_ns / 2, lambda: self._ctrl_arrive(t))

    def _ctrl_finish(self, t: _Transfer, status: TransferStatus, data: bytes, extra_ns: float, moved: int = -1) -> None:
        """Reply to control transfer `t` after `extra_ns` of firmware time (`moved`: OUT bytes taken, -1 = all)."""

        def reply() -> None:
            if not t.done:  # else it timed out or was cancelled meanwhile (which already freed EP0)
                t.data[:] = data
                t.moved = moved
                self._complete(t, status)

        self._at(self.clock.now + extra_ns + self.timing.control_rtt_ns / 2, reply)

    def _ctrl_arrive(self, t: _Transfer) -> None:
        if t.done:  # timed out or cancelled before the device saw it (EP0 was freed then)
            return
        if len(t.setup) != 8:
            self._ctrl_finish(t, TransferStatus.STALL, b"", 0.0)
            return
        req_type, req, value, index, length = struct.unpack("<BBHHH", t.setup)
        if t.fault is not None:
            self._ctrl_fault(t, req_type, length)
            return
        try:
            if req_type & 0x60 != 0x40:
                raise Stall()
            if req == REQ_FENCE_ARM and req_type == 0xC0:
                self._f4_arrive(t, value, index)
                return
            data, extra = self._vendor(req_type, req, value, index, length, bytes(t.out))
        except Stall:
            self._ctrl_finish(t, TransferStatus.STALL, b"", 0.0)
            return
        self._ctrl_finish(t, TransferStatus.COMPLETED, data, extra)

    def _ctrl_fault(self, t: _Transfer, req_type: int, length: int) -> None:
        """An injected fault on a control transfer: the request is not executed."""
        assert t.fault is not None
        mode = t.fault.mode
        if mode == "stall":
            self._ctrl_finish(t, TransferStatus.STALL, b"", 0.0)
        elif mode == "error":
            self._ctrl_finish(t, TransferStatus.ERROR, b"", 0.0)
        elif mode == "timeout":  # no reply: EP0 stays busy with it until the host's timeout ends the transfer
            t.stuck = True
        elif req_type & 0x80 and length:  # short IN: half the requested bytes (zeros: the request did not run)
            self._ctrl_finish(t, TransferStatus.COMPLETED, bytes(length // 2), 0.0)
        elif len(t.out):  # short OUT data stage
            self._ctrl_finish(t, TransferStatus.COMPLETED, b"", 0.0, moved=len(t.out) // 2)
        else:  # nothing to cut short: the device refuses the request instead
            self._ctrl_finish(t, TransferStatus.STALL, b"", 0.0)

    def _vendor(self, req_type: int, req: int, value: int, index: int, length: int, out: bytes) -> tuple[bytes, float]:
        device_to_host = bool(req_type & 0x80)
        if req == REQ_XDATA_READ and device_to_host:
            return self._xdata_read(value, index >> 8, length), 0.0
        if req == REQ_XDATA_WRITE and not device_to_host:
            self.stats["xdata_writes"] += 1
            self._xdata_write(value, index >> 8, index & 0xFF)
            return b"", 0.0
        if req == REQ_TLP and not device_to_host:
            return b"", self._f0_out(value, index, out)
        if req == REQ_TLP and device_to_host:
            return self.completion[:length], 0.0
        if req == REQ_ARM and not device_to_host:
            self.stats["arms"] += 1
            self._handle_f2(value, index)
            return b"", 0.0
        if req == REQ_POWER and not device_to_host:
            self.stats["power_requests"] += 1
            return b"", self._power(bool(value))
        raise Stall()

    def _f0_out(self, value: int, index: int, out: bytes) -> float:
        if len(out) != 12:
            raise Stall()
        lo, hi, word = struct.unpack("<III", out)
        fmt, byte_enable, mode = value & 0xFF, value >> 8 & 0xFF, index & 3
        addr = lo | hi << 32
        if mode in (1, 2):
            if word == 0:
                raise Stall()
            if mode == 1:
                self.stats["stream_writes"] += 1
            self.stream = F0Stream(mode, addr, word)
            self._pipes_changed()
            return 0.0
        if mode != 0:
            raise Stall()
        if self.faults.tlp_engine_errors > 0:
            self.faults.tlp_engine_errors -= 1
            self.completion = bytes(7) + b"\x01"
            return self.timing.f0_write_ns_per_dword
        if fmt & 0x40:  # memory or config write
            self.stats["tlp_writes"] += 1
        data, status, carried = self._tlp(fmt, byte_enable, addr, word)
        self.completion = struct.pack(
            "<IBBBB", data if carried else 0, status << 5, 4 if carried else 0, int(carried), 0
        )
        reads = fmt & 0x40 == 0
        return self.timing.f0_read_ns_per_dword if reads else self.timing.f0_write_ns_per_dword

    def _f4_arrive(self, t: _Transfer, value: int, index: int) -> None:
        self.stats["f4_requests"] += 1
        sectors, slot, nslots, buffer, target = self.decode_f4(value, index)
        if self.f4_reached(buffer, target):
            self._f4_arm(t, sectors, slot, nslots)
            return
        bail = self.faults.f4_bail
        if bail == "always" or (bail == "once" and not self._f4_bailed_once):
            self._f4_bailed_once = True
            self._f4_bail(t)
            return
        self.stats["f4_waits"] += 1
        token = self.stats["f4_requests"]
        self._f4_waiter = (t, sectors, slot, nslots, buffer, target)
        self._at(self.clock.now + self.timing.f4_wait_limit_ns, lambda: self._f4_timer(t, token))

    def _f4_arm(self, t: _Transfer, sectors: int, slot: int, nslots: int) -> None:
        self.stats["arms"] += 1
        try:
            self._arm(self.dma.new_arm("out", sectors, slot, nslots))
        except Stall:
            self._ctrl_finish(t, TransferStatus.STALL, b"", 0.0)
            return
        self._ctrl_finish(t, TransferStatus.COMPLETED, self.f4_flags(), 0.0)

    def _f4_bail(self, t: _Transfer) -> None:
        self.stats["f4_bails"] += 1
        self._ctrl_finish(t, TransferStatus.COMPLETED, self.f4_flags(), 0.0)

    def _f4_timer(self, t: _Transfer, token: int) -> None:
        if self._f4_waiter is not None and self._f4_waiter[0] is t and self.stats["f4_requests"] == token:
            self._f4_waiter = None
            self._f4_bail(t)

    def _bridge_page_written(self) -> None:
        w = self._f4_waiter
        if w is not None and self.f4_reached(w[4], w[5]):
            self._f4_waiter = None
            self._f4_arm(w[0], w[1], w[2], w[3])

    def _cq_written(self) -> None:
        arm = self.dma.current
        if arm is not None and arm.direction == "in" and not arm.released:
            arm.released = True
            self._pump_in()

    def _pipes_changed(self) -> None:
        self._pump_out()
        self._pump_in()
        self._pump_ctrl()

    # ------------------------------------------------------------------ EP 0x02
    def _pump_out(self) -> None:
        while self._out and self._out[0].done:
            self._out.popleft()
        if self._out_busy or not self._out or not self._connected:
            return
        t = self._out[0]
        now = self.clock.now
        ready = t.submitted + self.timing.bulk_latency_ns
        if ready > now:
            self._out_busy = True
            self._at(ready, self._out_resume)
            return
        if t.stuck or self._fault_now(t):
            if t.done:
                self._pump_out()
            return
        remaining = len(t.out) - t.pos
        limit = self.timing.quantum
        at = t.fault_at
        if at is not None:
            limit = min(limit, max(at - t.pos, 0))
        if self.faults.disconnect_after_out_bytes is not None:
            budget = self.faults.disconnect_after_out_bytes - self._out_bytes_moved
            if budget <= 0:
                self.faults.disconnect_after_out_bytes = None
                self.disconnect()
                return
            limit = min(limit, budget)
        arm = self.dma.current
        if arm is not None and arm.direction == "out":
            if arm.active_at > now:
                self._out_busy = True
                self._at(arm.active_at, self._out_resume)
                return
            t.naking = False
            n = min(limit, remaining, arm.remaining)
            self._out_step(t, n, n * 1e9 / self.timing.link_bytes_per_s, "arm")
        elif self.stream is not None and self.stream.mode == 1:
            t.naking = False
            n = min(limit, remaining, self.stream.dwords * 4)
            n4 = (n + 3) // 4
            cost = max(n * 1e9 / self.timing.link_bytes_per_s, n4 * self.timing.f0_write_ns_per_dword)
            self._out_step(t, n, cost, "stream")
        elif remaining:
            if t.naking:
                return
            n = min(1024, remaining)
            self.violation(
                f"bulk OUT data arrived on EP 0x02 with nothing armed ({n} bytes at byte {t.pos} of a "
                f"{len(t.out)}-byte transfer): misrouted to xdata 0x7000"
            )
            self._misroute(t.out[t.pos : t.pos + n])
            t.pos += n
            if t.pos >= len(t.out):
                self._complete(t, TransferStatus.COMPLETED)
                self._pump_out()
            elif self.faults.misroute_nak:
                t.naking = True
            else:  # keep misrouting packet by packet at link speed
                self._out_busy = True
                self._at(now + n * 1e9 / self.timing.link_bytes_per_s, self._out_resume)
        else:
            self._complete(t, TransferStatus.COMPLETED)

    def _out_resume(self) -> None:
        self._out_busy = False
        self._pump_out()

    def _out_step(self, t: _Transfer, n: int, cost_ns: float, route: str) -> None:
        self._out_busy = True

        def land() -> None:
            self._out_busy = False
            if t.done or not self._connected:
                self._pump_out()
                return
            chunk = t.out[t.pos : t.pos + n]
            if route == "arm" and self.dma.current is not None and self.dma.current.direction == "out":
                start = self.dma.current.sram_offset(self.dma.current.done)
                self.dma.deposit(chunk)
                if self.sdma.passed_sentinels:
                    self._check_late_sentinels(start, n)
                self.gpu.memory_changed(SYSTEM, SRAM_PCIE + start, n)
                if self.dma.current.remaining == 0:
                    self._retire_out_arm()
            elif route == "stream" and self.stream is not None:
                self._stream_write(chunk)
            else:  # the route vanished mid-step (reset): treat the data as misrouted
                self._misroute(chunk)
            t.pos += n
            self._out_bytes_moved += n
            self.stats["bulk_out_bytes"] += n
            if t.pos >= len(t.out):
                self._complete(t, TransferStatus.COMPLETED)
            self._pump_out()

        self._at(self.clock.now + cost_ns, land)

    def _check_late_sentinels(self, start: int, n: int) -> None:
        """The host just wrote SRAM [start, start+n): if it wrote a sentinel value the GPU had already matched at the
        same offset, the GPU passed that poll on stale data and copied the part before it landed."""
        passed = self.sdma.passed_sentinels
        for off in [o for o in passed if start <= o < start + n]:
            value = passed.pop(off)
            if int.from_bytes(self.mem.sram[off : off + 4], "little") == value:
                self.violation(
                    f"GPU read a part before its sentinel landed: the poll at SRAM {off:#x} matched {value:#010x} on "
                    "stale data, and the host's sentinel with that value arrived only now"
                )

    def _retire_out_arm(self) -> None:
        done = self.dma.retire(self.clock.now, self.timing.arm_switch_ns)
        self.stats["arms_retired"] += 1
        if done is None:
            return
        if self.faults.full_window_corruption and (done.start_slot * 0x4000 + done.total) % 0x40000 == 0:
            end = done.sram_offset(done.total - 1) + 1
            for i in range(end - SECTOR, end):
                self.mem.sram[i] ^= 0xA5
            self.stats["full_window_corruptions"] += 1
            self.violation(
                f"an OUT arm (slot {done.start_slot}, {done.sectors} sectors) ended on a 256 KiB window boundary: "
                f"full_window_corruption corrupted its last sector (SRAM {end - SECTOR:#x}); the host must keep arms "
                "off window boundaries"
            )
        if self.faults.cq_clobber:
            cqe = struct.pack("<IIHHHH", done.gen, 0, 0, 0, done.gen & 0xFFFF, 1)
            off = self._cqe_index % 256 * 16
            self.mem.cq[off : off + 16] = cqe
            self._cqe_index += 1
            self.stats["cqes_written"] += 1
        if self.faults.sq_scribble:
            off = self._cqe_index * 64 % 0x800
            self.mem.sq[off : off + 64] = bytes([done.gen & 0xFF]) * 64

    def _stream_write(self, chunk: memoryview) -> None:
        stream = self.stream
        assert stream is not None
        data = bytes(chunk) + bytes(-len(chunk) % 4)
        hit = self.fabric.decode(stream.addr, len(data))
        if hit is not None and hit[0] == 0 and hit[1] % 4 == 0:  # whole run inside VRAM: one bulk write
            self.gpu.bar0_write(hit[1], data)
        else:
            for i in range(0, len(data), 4):
                self._mem_write(stream.addr + i, data[i : i + 4])
        stream.addr += len(data)
        stream.dwords -= len(data) // 4
        if stream.dwords <= 0:
            self.stream = None

    # ------------------------------------------------------------------ EP 0x81
    def _pump_in(self) -> None:
        while self._in and self._in[0].done:
            self._in.popleft()
        if self._in_busy or not self._in or not self._connected:
            return
        t = self._in[0]
        now = self.clock.now
        ready = t.submitted + self.timing.bulk_latency_ns
        if ready > now:
            self._in_busy = True
            self._at(ready, self._in_resume)
            return
        if t.stuck or self._fault_now(t):
            if t.done:
                self._pump_in()
            return
        want = t.in_length - len(t.data)
        if want <= 0:
            self._complete(t, TransferStatus.COMPLETED)
            self._pump_in()
            return
        limit = self.timing.quantum
        at = t.fault_at
        if at is not None:
            limit = min(limit, max(at - len(t.data), 0))
        arm = self.dma.current
        if arm is not None and arm.direction == "in" and arm.released:
            n = min(limit, want, arm.remaining)
            self._in_step(t, n, n * 1e9 / self.timing.link_bytes_per_s, "arm")
        elif self.stream is not None and self.stream.mode == 2:
            n = min(limit, want, self.stream.dwords * 4)
            cost = max(n * 1e9 / self.timing.link_bytes_per_s, (n + 3) // 4 * self.timing.f0_read_ns_per_dword)
            self._in_step(t, n, cost, "stream")
        # else: nothing to send, the endpoint NAKs until an arm/stream appears or the transfer times out

    def _in_resume(self) -> None:
        self._in_busy = False
        self._pump_in()

    def _in_step(self, t: _Transfer, n: int, cost_ns: float, route: str) -> None:
        self._in_busy = True

        def land() -> None:
            self._in_busy = False
            if t.done or not self._connected:
                self._pump_in()
                return
            short = False
            if route == "arm" and self.dma.current is not None and self.dma.current.direction == "in":
                t.data += self.dma.serve(n)
                if self.dma.current.remaining == 0:
                    self.dma.retire(self.clock.now, self.timing.arm_switch_ns)
                    self.stats["arms_retired"] += 1
            elif route == "stream" and self.stream is not None:
                t.data += self._stream_read(n)
                short = self.stream is None and len(t.data) % 1024 != 0  # a short packet ends the transfer
            self.stats["bulk_in_bytes"] += n
            if len(t.data) >= t.in_length or short:
                self._complete(t, TransferStatus.COMPLETED)
            self._pump_in()

        self._at(self.clock.now + cost_ns, land)

    def _stream_read(self, n: int) -> bytes:
        stream = self.stream
        assert stream is not None
        count = (n + 3) // 4
        hit = self.fabric.decode(stream.addr, count * 4)
        if hit is not None and hit[0] == 0 and hit[1] % 4 == 0 and hit[1] + count * 4 <= self.vram.size:
            out = self.vram.read(hit[1], count * 4)
        else:
            words = [self._mem_read(stream.addr + 4 * i) for i in range(count)]
            out = struct.pack(f"<{count}I", *(0 if w is None else w for w in words))
        stream.addr += count * 4
        stream.dwords -= count
        if stream.dwords <= 0:
            self.stream = None
        return out[:n]
