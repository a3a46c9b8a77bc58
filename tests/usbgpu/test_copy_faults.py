"""Injected faults surface at the documented place with a clear error, in bounded virtual time, never a hang; after
reopening, the next copy-in is correct."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from rdna3_llvm import asm_kernel, assemble, compile_ir
from speck.usbgpu.api import KernelCode, UsbGpu, VramBuffer
from speck.usbgpu.bridge import VENDOR_REQUESTS
from speck.usbgpu.copyin import CP_SIZE
from speck.usbgpu.errors import (
    DeviceUnusableError,
    F4BailError,
    GpuFault,
    GpuFenceTimeout,
    GpuHang,
    PcieLinkError,
    TlpError,
    TransferShortError,
    TransferShortReadError,
    UsbError,
    UsbIoError,
    UsbNoDeviceError,
    UsbPipeError,
    UsbTimeoutError,
)
from speck.usbgpu.sim.config import SimFaults, SimTiming, TransferFault
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.kernels import OOB, SPIN
from speck.usbgpu.sim.loader import load_kernel

N = 4 * CP_SIZE + 1234
DATA = random.Random(9).randbytes(N)
BOUND_NS = 40e9  # every failure must surface within 40 s of virtual time (host timeouts are 10-30 s)


def reopen_and_verify(dev: SimDevice, **kw: object) -> None:
    """The next session on the same (possibly reconnected) device copies correctly with no violations."""
    dev.violations.clear()
    with UsbGpu.open(sim=dev, **kw) as gpu:  # type: ignore[arg-type]
        buf = gpu.alloc(N)
        gpu.copyin(buf, DATA)
        assert dev.read_vram(buf.va, N) == DATA
        out = bytearray(N)
        gpu.copyout(out, buf)
        assert out == DATA
    assert dev.violations == []


def warm(dev: SimDevice, **kw: object) -> tuple[UsbGpu, object]:
    gpu = UsbGpu.open(sim=dev, poll_limit=3000, **kw)  # type: ignore[arg-type]
    buf = gpu.alloc(N)
    gpu.copyin(buf, DATA[:100])  # one-time init done; EP 0x02 transfers of the next copy-in are counted below
    return gpu, buf


# In a warm copy-in, EP 0x02 carries: 1 ring stream, 2 wptr, 3 doorbell, then the chunks' data transfers.
@pytest.mark.parametrize(
    ("mode", "nth", "error"),
    [
        ("error", 1, UsbIoError),
        ("error", 6, UsbIoError),
        ("short", 7, TransferShortError),
        ("timeout", 6, UsbTimeoutError),
        ("stall", 9, UsbPipeError),
        ("stall", 3, UsbPipeError),
    ],
)
def test_bulk_out_fault_surfaces_and_reopen_recovers(mode: str, nth: int, error: type[UsbError]) -> None:
    dev = SimDevice()
    gpu, buf = warm(dev)
    dev.inject(TransferFault(0x02, nth, mode))  # type: ignore[arg-type]
    start = dev.now_ns
    with pytest.raises(error) as info:
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    assert "bulk OUT 0x02" in str(info.value)
    assert dev.now_ns - start < BOUND_NS
    with pytest.raises(DeviceUnusableError, match="earlier operation failed"):
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    gpu.close()
    reopen_and_verify(dev)


def test_disconnect_mid_copy_surfaces_no_device_and_reconnect_recovers() -> None:
    dev = SimDevice()
    gpu, buf = warm(dev)
    dev.faults.disconnect_after_out_bytes = 300_000
    start = dev.now_ns
    with pytest.raises(UsbNoDeviceError, match="NO_DEVICE"):
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    assert dev.now_ns - start < BOUND_NS and not dev.connected
    gpu.close()
    with pytest.raises(UsbError):
        UsbGpu.open(sim=dev)
    dev.reconnect()
    reopen_and_verify(dev)


def test_f4_bail_then_succeed() -> None:
    # A GPU slower than the link makes the gate wait; the first 0xF4 bails at once, the retry succeeds.
    dev = SimDevice(timing=SimTiming(sdma_bytes_per_s=100e6), faults=SimFaults(f4_bail="once"))
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(N)
        gpu.copyin(buf, DATA)
        assert dev.read_vram(buf.va, N) == DATA
        assert dev.stats["f4_bails"] == 1 and gpu.copy_stats.f4_bails == 1
    assert dev.violations == []


def test_f4_bail_always_raises_after_three_attempts() -> None:
    dev = SimDevice(timing=SimTiming(sdma_bytes_per_s=100e6), faults=SimFaults(f4_bail="always"))
    gpu, buf = warm(dev)
    start = dev.now_ns
    with pytest.raises(F4BailError, match=r"0xF4 arm bailed waiting for GPU fence .*3 attempts"):
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    assert dev.now_ns - start < BOUND_NS
    assert gpu.copy_stats.f4_attempts == 3 and dev.violations == []
    gpu.close()
    dev.faults.f4_bail = None
    reopen_and_verify(dev)


@pytest.mark.parametrize("f4gate", [True, False])
def test_hung_gpu_fence_surfaces_in_bounded_time(f4gate: bool) -> None:
    dev = SimDevice(timing=SimTiming(f4_wait_limit_ns=2e9))
    gpu, buf = warm(dev, f4gate=f4gate)
    dev.faults.gpu_hang_after_packets = 8  # stops mid-way through the copy-in's ring
    start = dev.now_ns
    expected: type[UsbError] = F4BailError if f4gate else GpuFenceTimeout
    with pytest.raises(expected) as info:
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    assert "reopen" in str(info.value)
    assert dev.now_ns - start < BOUND_NS and not dev.sdma.idle  # the engine stopped with work left
    gpu.close()
    dev.faults.gpu_hang_after_packets = None
    reopen_and_verify(dev, f4gate=f4gate)


@pytest.mark.parametrize(("mode", "zero_copy"), [("g3", True), ("g3", False), ("g0", True)])
def test_full_window_corruption_never_corrupts_a_copy(mode: str, zero_copy: bool) -> None:
    # G0 used to arm whole 512 KiB chunks: each ended on a 256 KiB window, and its last sector arrived corrupted
    # with nothing reported. Now no arm of any mode ends on a window boundary (G3's init included).
    dev = SimDevice(faults=SimFaults(full_window_corruption=True))
    data = random.Random(5).randbytes(3 * 0x80000 + 0x40000)  # whole 512 KiB chunks and a 256 KiB tail
    with UsbGpu.open(sim=dev, mode=mode, zero_copy=zero_copy) as gpu:
        buf = gpu.alloc(len(data))
        gpu.copyin(buf, data)
        assert dev.read_vram(buf.va, len(data)) == data
        out = bytearray(len(data))
        gpu.copyout(out, buf)
        assert out == data
    assert dev.stats["full_window_corruptions"] == 0 and dev.violations == []


def test_an_arm_ending_on_a_window_is_refused_by_the_driver_and_flagged_by_the_simulator() -> None:
    dev = SimDevice(faults=SimFaults(full_window_corruption=True))
    with UsbGpu.open(sim=dev) as gpu:
        bridge = gpu.context.bridge
        with pytest.raises(ValueError, match="256 KiB window boundary"):
            bridge.arm_write(0x40000, 0)
        with pytest.raises(ValueError, match="256 KiB window boundary"):
            bridge.arm_fenced(0x3C000, 16 + 1, 1, 0)  # slot 17 + 240 KiB ends at 512 KiB
        # forced through the transport anyway: the simulator corrupts and says so
        usb = gpu.transport
        usb.control_out(0xF2, 0x40000 // 512, 16 << 8)
        usb.bulk_out(0x02, bytes(0x40000), 1000)
    assert dev.stats["full_window_corruptions"] == 1
    assert any("ended on a 256 KiB window boundary" in v for v in dev.violations)


def test_cq_clobber_and_sq_scribble_do_not_disturb_copies() -> None:
    dev = SimDevice(faults=SimFaults(cq_clobber=True, sq_scribble=True))
    reopen_and_verify(dev)
    assert dev.stats["cqes_written"] > 0


def test_tlp_engine_errors_are_retried_then_reported() -> None:
    dev = SimDevice(faults=SimFaults(tlp_engine_errors=4))
    with UsbGpu.open(sim=dev):
        pass
    dev = SimDevice(faults=SimFaults(tlp_engine_errors=11))
    with pytest.raises(TlpError, match="TLP error after retries"):
        UsbGpu.open(sim=dev)


def test_link_that_never_trains_fails_open_with_the_ltssm_state() -> None:
    dev = SimDevice(faults=SimFaults(link_training_fails=True))
    with pytest.raises(PcieLinkError, match=r"PCIe link not up \(LTSSM=0x11"):
        UsbGpu.open(sim=dev)


def test_data_before_arm_is_detected_through_the_real_stack() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        with pytest.raises(UsbTimeoutError):
            gpu.transport.bulk_out(0x02, bytes(4096), 50)
    assert any("nothing armed" in v for v in dev.violations)


@pytest.mark.parametrize(("mode", "error"), [("stall", UsbPipeError), ("timeout", UsbTimeoutError)])
def test_copyout_bulk_in_fault_surfaces_and_reopen_recovers(mode: str, error: type[UsbError]) -> None:
    dev = SimDevice()
    gpu, buf = warm(dev)
    gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    dev.inject(TransferFault(0x81, 2, mode))  # type: ignore[arg-type]
    start = dev.now_ns
    with pytest.raises(error, match="bulk IN 0x81"):
        gpu.copyout(bytearray(N), buf)  # type: ignore[arg-type]
    assert dev.now_ns - start < BOUND_NS
    gpu.close()
    reopen_and_verify(dev)


# ---- control-transfer faults: each vendor request, each failure, surfaced as a named error that says which request
# Where each request first runs on a fresh device: open (0xE4 LTSSM read, 0xF3 power-on, 0xF0 TLPs), the first
# copy-in (0xE5 flag clear, 0xF2 arms) and from its third chunk on (0xF4).
CONTROL_FAULTS = [(req, mode) for req in (0xE4, 0xE5, 0xF0, 0xF2, 0xF3, 0xF4) for mode in ("stall", "timeout", "error")]
MODE_ERRORS: dict[str, type[UsbError]] = {"stall": UsbPipeError, "timeout": UsbTimeoutError, "error": UsbIoError}


@pytest.mark.parametrize(("request_code", "mode"), CONTROL_FAULTS)
def test_control_transfer_fault_is_injected_and_surfaces_named(request_code: int, mode: str) -> None:
    dev = SimDevice()
    dev.inject(TransferFault(0, 1, mode, request=request_code))  # type: ignore[arg-type]
    start = dev.now_ns
    with pytest.raises(MODE_ERRORS[mode]) as info:
        with UsbGpu.open(sim=dev) as gpu:
            buf = gpu.alloc(N)
            gpu.copyin(buf, DATA)
    err = info.value
    name = VENDOR_REQUESTS[request_code][0]
    assert getattr(err, "request", None) == request_code and str(err).startswith(name), str(err)
    assert dev.faults.transfer_faults == []  # the fault was used, on the request it names
    assert dev.now_ns - start < BOUND_NS
    if request_code == 0xF4:
        assert "USB_F4GATE=0" in str(err)
    reopen_and_verify(dev)


@pytest.mark.parametrize(("request_code", "direction"), [(0xE4, "IN"), (0xF0, "OUT")])
def test_short_control_transfer_is_a_short_transfer_error(request_code: int, direction: str) -> None:
    dev = SimDevice()
    dev.inject(TransferFault(0, 1, "short", request=request_code))
    with pytest.raises(TransferShortError, match=f"control {direction} 0x{request_code:02X}") as info:
        UsbGpu.open(sim=dev)
    assert str(info.value).startswith(VENDOR_REQUESTS[request_code][0])
    reopen_and_verify(dev)


def test_a_control_fault_on_one_request_leaves_the_others_alone() -> None:
    dev = SimDevice()
    dev.inject(TransferFault(0, 4, "stall", request=0xF2))  # the fourth 0xF2 only
    gpu, buf = warm(dev)  # three 0xF2 arms: two to zero the bounce buffers, one for the small copy
    with pytest.raises(UsbPipeError, match="0xF2 SRAM DMA arm"):
        gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    gpu.close()
    reopen_and_verify(dev)


def test_short_bulk_in_during_copyout_is_reported_as_a_short_read() -> None:
    dev = SimDevice()
    gpu, buf = warm(dev)
    gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    dev.inject(TransferFault(0x81, 2, "short"))
    with pytest.raises(TransferShortReadError) as info:
        gpu.copyout(bytearray(N), buf)  # type: ignore[arg-type]
    text = str(info.value)
    assert "bulk IN 0x81 for the copy-out" in text and "short" in text and "link" not in text.lower()
    assert not isinstance(info.value, TlpError)
    gpu.close()
    reopen_and_verify(dev)


@pytest.mark.parametrize("how", ["reset", "disconnect"])
def test_events_scheduled_before_a_pipe_reset_are_dropped(how: str) -> None:
    # A bulk OUT is mid-flight (its next 16 KiB step is scheduled) when the USB side restarts. Had the old events
    # survived, the stale step would free EP 0x02 while the next transfer's own step is in flight, and that
    # transfer would move faster than the link can.
    from speck.usbgpu.transport import UsbTransport

    link = 50e6
    dev = SimDevice(timing=SimTiming(link_bytes_per_s=link, bulk_latency_ns=0.0))
    usb = UsbTransport.open(sim=[dev])
    usb.control_out(0xF2, 480, 15 << 8)  # arm 240 KiB at slot 0
    tag = usb.submit_bulk_out(0x02, bytes(480 * 512), 10000)
    for _ in range(10):  # ten 0.1 ms control round trips: 1 ms into the 4.9 ms transfer
        usb.control_in(0xE4, 0xB450, 0, 1)
    assert not usb.is_done(tag)
    if how == "reset":
        usb._handle.resetDevice()
        usb.close()
    else:
        dev.disconnect()
        usb.close()
        dev.reconnect()
    usb = UsbTransport.open(sim=[dev])
    nbytes = 64 * 1024
    usb.control_out(0xF2, nbytes // 512, 4 << 8)
    start = dev.now_ns
    usb.bulk_out(0x02, bytes(nbytes), 10000)
    assert dev.now_ns - start >= nbytes / link * 1e9
    usb.close()
    assert not [v for v in dev.violations if "nothing armed" not in v]


def test_a_gpu_hang_during_copyout_is_named_not_a_bare_usb_timeout() -> None:
    """The SDMA engine stops mid-copy-out: its hang watchdog (10 s) raises SDMA_QUEUE_HANG, and the copy-out - whose
    IN stream never starts - reports GpuHang naming the queue instead of the bulk IN's UsbTimeoutError."""
    dev = SimDevice()
    gpu, buf = warm(dev)
    gpu.copyin(buf, DATA)  # type: ignore[arg-type]
    dev.faults.gpu_hang_after_packets = 1  # the copy-out batch's POLL runs, its COPY never does
    start = dev.now_ns
    with pytest.raises(GpuHang, match=r"SDMA0 queue 0 hung: queue hang") as info:
        gpu.copyout(bytearray(N), buf)  # type: ignore[arg-type]
    assert info.value.queue == "SDMA0 queue 0" and isinstance(info.value.__cause__, UsbTimeoutError)
    assert dev.now_ns - start < 12e9  # the watchdog period plus the bulk IN's timeout running alongside
    gpu.close()
    dev.faults.gpu_hang_after_packets = None
    reopen_and_verify(dev)


# Kernels that go wrong on the GPU: each stops the compute queue; the error is named whether the dispatch is waited
# for or the next copy-out (which waits on the GPU for the compute work before it) runs into it. After a waited
# dispatch a queue reset recovers the session; a failed copy leaves it unusable (its SDMA work is stuck behind the
# compute queue) and reopening recovers.
def _oob(gpu: UsbGpu, buf: VramBuffer) -> tuple[KernelCode, bytes]:
    return load_kernel(gpu, compile_ir(OOB), "oob"), struct.pack("<QQQ", buf.va, buf.va, 1 << 36)


def _asm(body: str) -> Callable[[UsbGpu, VramBuffer], tuple[KernelCode, bytes]]:
    return lambda gpu, buf: (load_kernel(gpu, assemble(asm_kernel(body)), "k"), struct.pack("<Q", buf.va))


def _spin(gpu: UsbGpu, buf: VramBuffer) -> tuple[KernelCode, bytes]:
    return load_kernel(gpu, compile_ir(SPIN), "spin"), struct.pack("<Q", buf.va)


KERNEL_FAULTS = {
    "out-of-bounds read": (_oob, GpuFault, r"compute me1 pipe0 queue0: page fault at GPU address 0x\w+ \(read\)"),
    "illegal instruction": (_asm("  v_cubeid_f32 v0, v1, v2, v3"), GpuFault, "shader illegal instruction"),
    "s_trap": (_asm("  s_trap 2"), GpuFault, "shader trap"),
    "hang": (_spin, GpuHang, r"compute me1 pipe0 queue0 hung: .*simulator: dispatch hung"),
}


@pytest.mark.parametrize("then", ["wait", "copyout", "copyin"])
@pytest.mark.parametrize("case", list(KERNEL_FAULTS))
def test_a_kernel_fault_is_named_in_bounded_time_and_a_queue_reset_recovers(case: str, then: str) -> None:
    make, error, match = KERNEL_FAULTS[case]
    dev = SimDevice(timing=SimTiming(dispatch_max_instructions=20_000))
    gpu, buf = warm(dev)
    code, args = make(gpu, buf)  # type: ignore[operator]
    start = dev.now_ns
    with pytest.raises(error, match=match):  # type: ignore[call-overload]
        gpu.dispatch(code, (1,), (32,), args, wait=then == "wait", timeout=1.0)  # type: ignore[attr-defined]
        if then == "copyout":
            gpu.copyout(bytearray(N), buf)  # type: ignore[attr-defined]
        elif then == "copyin":
            gpu.copyin(buf, DATA)  # type: ignore[attr-defined]
    assert dev.now_ns - start < BOUND_NS
    if then == "wait":
        status = gpu.queue_status()  # type: ignore[attr-defined]
        assert status.hung if error is GpuHang else status.faulted
        gpu.reset_queue()  # type: ignore[attr-defined]
        gpu.copyin(buf, DATA)  # type: ignore[attr-defined]
        out = bytearray(N)
        gpu.copyout(out, buf)  # type: ignore[attr-defined]
        assert out == DATA
    else:
        with pytest.raises(DeviceUnusableError, match="earlier operation failed"):
            gpu.queue_status()  # type: ignore[attr-defined]
    gpu.close()  # type: ignore[attr-defined]
    reopen_and_verify(dev)
