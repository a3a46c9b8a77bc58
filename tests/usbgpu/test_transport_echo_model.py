"""EchoModel: a small UsbDeviceModel test double for the transport and helper tests (not the bridge simulator).

Behaviour: bulk OUT on 0x02 is recorded and echoed back to bulk IN 0x81; control OUT request 0x10 stores its data
in a mailbox that control IN 0x10 returns; control IN 0x11 returns a pattern derived from wValue. Transfers on the
device complete in submission order on a virtual clock (latency + bytes / bandwidth). Faults are queued per
transfer and applied to the next bulk OUT (or control) submitted. The tests at the bottom check the double itself.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from speck.usbgpu.sim.model_api import (
    DeviceDescriptors,
    ModelError,
    ModelSubmitError,
    TransferResult,
    TransferStatus,
    UsbDeviceModel,
    asm2464_descriptors,
)

_SERIALS = itertools.count(0x0123ABCD)
Fault = Literal["error", "short", "timeout", "stall", "overflow", "submit_fail", "disconnect", "raise"]
LIBUSB_ERROR_NO_DEVICE = -4


class ModelBug(RuntimeError):
    """Raised by EchoModel for the "raise" fault: stands for a protocol violation detected by a real model."""


@dataclass
class _Pending:
    tid: int
    kind: str
    endpoint: int
    done_at: float  # virtual ms; inf = only its timeout can end it
    deadline: float  # virtual ms at which it times out (inf = no timeout)
    result: TransferResult
    on_complete: list[bytes] = field(default_factory=list)  # data to append to the echo queue on success


class EchoModel:
    """A UsbDeviceModel whose device echoes bulk OUT data to bulk IN (see the module docstring)."""

    def __init__(
        self,
        vid: int = 0xADD1,
        pid: int = 0x0001,
        product: str = "custom v0.1",
        bus: int = 3,
        address: int = 7,
        kernel_driver: bool = True,
        latency_ms: float = 0.05,
        bytes_per_ms: float = 1_000_000.0,
    ) -> None:
        self.vid, self.pid, self.bus, self.address = vid, pid, bus, address
        # a serial of its own per instance: it is what the driver's device lock tells devices apart by
        self.manufacturer, self.product, self.serial = "tiny", product, f"{next(_SERIALS):08x}"
        self.latency_ms, self.bytes_per_ms = latency_ms, bytes_per_ms
        self.now = 0.0
        self._kernel_driver = kernel_driver
        self._connected = True
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self._busy_until = 0.0
        self.log: list[tuple[object, ...]] = []  # (op, args...) in call order
        self.received: list[bytes] = []  # bulk OUT payloads that completed, in order
        self.echo: deque[int] = deque()
        self.mailbox = b""
        self.faults: deque[Fault | None] = deque()  # applied to the next transfers, one per transfer
        self.disconnect_after: int | None = None  # disconnect once this many more transfers have completed
        self.configuration = 1
        self.alt_setting: int | None = None

    # ---- identity and standard requests ----
    def descriptors(self) -> DeviceDescriptors:
        return asm2464_descriptors(self.vid, self.pid)

    def kernel_driver_active(self, interface: int) -> bool:
        self._check_connected()
        return self._kernel_driver and interface == 0

    def detach_kernel_driver(self, interface: int) -> None:
        self._check_connected()
        self.log.append(("detach", interface))
        self._kernel_driver = False

    def reset(self) -> None:
        self._check_connected()
        self.log.append(("reset",))

    def set_configuration(self, value: int) -> None:
        self._check_connected()
        self.log.append(("set_configuration", value))
        self.configuration = value

    def set_interface_alt_setting(self, interface: int, alt: int) -> None:
        self._check_connected()
        self.log.append(("set_alt", interface, alt))
        self.alt_setting = alt

    def clear_halt(self, endpoint: int) -> None:
        self._check_connected()
        self.log.append(("clear_halt", endpoint))

    @property
    def connected(self) -> bool:
        return self._connected

    def disconnect(self) -> None:
        """Unplug: pending transfers complete with NO_DEVICE, every later call fails with NO_DEVICE."""
        self._connected = False

    def _check_connected(self) -> None:
        if not self._connected:
            raise ModelError(LIBUSB_ERROR_NO_DEVICE, "device disconnected")

    # ---- transfers ----
    def submit(
        self,
        kind: Literal["control", "bulk"],
        endpoint: int,
        setup: bytes | None,
        out_data: bytes,
        in_length: int,
        timeout_ms: int,
    ) -> int:
        self._check_connected()
        fault = self.faults.popleft() if self.faults else None
        if fault == "submit_fail":
            raise ModelSubmitError(-1, "injected submit failure")
        if fault == "raise":
            raise ModelBug("injected model bug: data before arm")
        tid = self._next_id
        self._next_id += 1
        self.log.append(("submit", kind, endpoint, len(out_data), in_length))
        nbytes = len(out_data) + in_length
        start = max(self.now, self._busy_until)
        done_at = start + self.latency_ms + nbytes / self.bytes_per_ms
        self._busy_until = done_at
        deadline = self.now + timeout_ms if timeout_ms else float("inf")
        result, echo = self._execute(kind, endpoint, setup, out_data, in_length)
        if fault in ("error", "stall", "overflow"):
            status = {"error": TransferStatus.ERROR, "stall": TransferStatus.STALL, "overflow": TransferStatus.OVERFLOW}
            result, echo = TransferResult(status[fault], 0), []
        elif fault == "short":
            n = result.actual_length // 2
            result = TransferResult(TransferStatus.COMPLETED, n, result.data[:n])
            echo = [out_data[: result.actual_length]]
        elif fault == "timeout":
            done_at = float("inf")
        elif fault == "disconnect":
            self.disconnect_after = 0
        self._pending[tid] = _Pending(tid, kind, endpoint, done_at, deadline, result, echo)
        return tid

    def _execute(
        self, kind: str, endpoint: int, setup: bytes | None, out_data: bytes, in_length: int
    ) -> tuple[TransferResult, list[bytes]]:
        if kind == "control":
            assert setup is not None and len(setup) == 8
            request_type, request = setup[0], setup[1]
            value = int.from_bytes(setup[2:4], "little")
            if request_type == 0x40 and request == 0x10:
                self.mailbox = out_data
                return TransferResult(TransferStatus.COMPLETED, len(out_data)), []
            if request_type == 0xC0 and request == 0x10:
                return TransferResult(
                    TransferStatus.COMPLETED, min(in_length, len(self.mailbox)), self.mailbox[:in_length]
                ), []
            if request_type == 0xC0 and request == 0x11:
                data = bytes((value + i) & 0xFF for i in range(in_length))
                return TransferResult(TransferStatus.COMPLETED, in_length, data), []
            return TransferResult(TransferStatus.STALL, 0), []  # unsupported request: EP0 stalls
        if endpoint == 0x02:
            return TransferResult(TransferStatus.COMPLETED, len(out_data)), [out_data]
        if endpoint == 0x81:
            n = min(in_length, len(self.echo))
            data = bytes(self.echo.popleft() for _ in range(n))
            return TransferResult(TransferStatus.COMPLETED, n, data), []
        return TransferResult(TransferStatus.STALL, 0), []

    def cancel(self, transfer_id: int) -> None:
        p = self._pending.get(transfer_id)
        if p is not None:
            self.log.append(("cancel", transfer_id))
            p.result = TransferResult(TransferStatus.CANCELLED, 0)
            p.on_complete = []
            p.done_at = self.now

    def _end_time(self, p: _Pending) -> float:
        """When `p` ends: its own completion or timeout, but never before an earlier transfer on its endpoint."""
        if not self._connected:
            return self.now
        end = min(p.done_at, p.deadline)
        for q in self._pending.values():
            if q.tid < p.tid and q.endpoint == p.endpoint:
                end = max(end, min(q.done_at, q.deadline))
        return end

    def wait(self, transfer_ids: Sequence[int] | None, timeout_ms: int) -> list[tuple[int, TransferResult]]:
        wanted = None if transfer_ids is None else set(transfer_ids)
        limit = self.now + timeout_ms
        completed: list[tuple[int, TransferResult]] = []
        while self._pending:
            p = min(self._pending.values(), key=lambda q: (self._end_time(q), q.tid))
            end = self._end_time(p)
            if end > limit:
                break
            self.now = max(self.now, end)
            del self._pending[p.tid]
            if not self._connected:
                result = TransferResult(TransferStatus.NO_DEVICE, 0)
            elif p.done_at > p.deadline:
                result = TransferResult(TransferStatus.TIMED_OUT, 0)
            else:
                result = p.result
                if result.status == TransferStatus.COMPLETED:
                    if p.kind == "bulk" and p.endpoint == 0x02:
                        self.received.append(p.on_complete[0][: result.actual_length] if p.on_complete else b"")
                    for chunk in p.on_complete:
                        self.echo.extend(chunk)
            completed.append((p.tid, result))
            if self.disconnect_after is not None:
                self.disconnect_after -= 1
                if self.disconnect_after < 0:
                    self._connected = False
            if wanted is None or p.tid in wanted:
                break
        if not completed:
            self.now = max(self.now, limit)
        return completed


def test_echo_model_satisfies_the_protocol() -> None:
    assert isinstance(EchoModel(), UsbDeviceModel)


def test_echo_model_completes_in_submission_order_on_its_clock() -> None:
    m = EchoModel(latency_ms=1.0, bytes_per_ms=100.0)
    a = m.submit("bulk", 0x02, None, b"x" * 100, 0, 1000)
    b = m.submit("bulk", 0x02, None, b"y" * 50, 0, 1000)
    assert m.wait(None, 0) == []
    first = m.wait(None, 1000)
    assert [tid for tid, _ in first] == [a] and m.now == 2.0
    second = m.wait([b], 1000)
    assert [tid for tid, _ in second] == [b] and m.now == 3.5
    assert m.received == [b"x" * 100, b"y" * 50]


def test_echo_model_times_out_a_transfer_that_never_completes() -> None:
    m = EchoModel()
    m.faults.append("timeout")
    tid = m.submit("bulk", 0x02, None, b"abc", 0, 25)
    assert m.wait([tid], 10) == [] and m.now == 10
    [(got, result)] = m.wait([tid], 100)
    assert got == tid and result.status == TransferStatus.TIMED_OUT and m.now == 25
