"""The public API: UsbGpu.open / alloc / copyin / copyout / close, argument checking and lifetime."""

from __future__ import annotations

import pytest

from speck.usbgpu.api import UsbGpu, VramBuffer
from speck.usbgpu.errors import DeviceUnusableError, VramAllocError
from speck.usbgpu.sim.config import SimTiming
from speck.usbgpu.sim.device import SimDevice


def test_context_manager_roundtrip_and_close_is_final() -> None:
    with UsbGpu.open(sim=True) as gpu:
        assert gpu.sim is not None
        buf = gpu.alloc(1000)
        gpu.copyin(buf, memoryview(b"x" * 1000))
        out = bytearray(1000)
        gpu.copyout(memoryview(out), buf)
        assert out == b"x" * 1000
    gpu.close()  # idempotent
    with pytest.raises(DeviceUnusableError, match="closed"):
        gpu.alloc(1)


def test_open_accepts_a_timing_model() -> None:
    with UsbGpu.open(sim=SimTiming(link_bytes_per_s=400e6)) as gpu:
        assert gpu.sim is not None and gpu.sim.timing.link_bytes_per_s == 400e6
    from speck.usbgpu.sim.config import SimFaults

    with UsbGpu.open(sim=SimFaults(cq_clobber=True)) as gpu:
        assert gpu.sim is not None and gpu.sim.faults.cq_clobber
    with pytest.raises(TypeError, match="sim must be"):
        UsbGpu.open(sim=42)


def test_bad_arguments_name_what_was_expected() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(100)
        with pytest.raises(ValueError, match="does not fit the 100-byte buffer"):
            gpu.copyin(buf, b"y" * 60, offset=50)
        with pytest.raises(ValueError, match="copyout offset must be >= 0, got -1"):
            gpu.copyout(bytearray(10), buf, offset=-1)
        with pytest.raises(TypeError, match="writable buffer"):
            gpu.copyout(memoryview(b"abc"), buf)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="contiguous"):
            gpu.copyin(buf, memoryview(b"abcdef")[::2])
        with pytest.raises(TypeError, match="bytes-like"):
            gpu.copyin(buf, "text")  # type: ignore[arg-type]
        floats = __import__("array").array("f", [1.5, -2.0])
        gpu.copyin(buf, floats, 8)  # any contiguous buffer is copied as its raw bytes
        back = bytearray(8)
        gpu.copyout(back, buf, 8)
        assert back == floats.tobytes()
        with pytest.raises(TypeError, match="needs a VramBuffer"):
            gpu.copyin(b"not a buffer", b"y")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="another UsbGpu session"):
            gpu.copyin(VramBuffer(buf.va, 100, owner=0), b"y")
        with pytest.raises(VramAllocError, match="VRAM allocation"):
            gpu.alloc(dev.vram.size)
        with pytest.raises(ValueError, match=">= 0"):
            gpu.alloc(-1)
        with pytest.raises(ValueError, match="'g3' or 'g0'"):
            UsbGpu.open(sim=dev, mode="g9")
        assert dev.violations == []


def test_mode_and_gate_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USB_F4GATE", "0")
    monkeypatch.setenv("USB_COPYIN", "g0")
    with UsbGpu.open(sim=True) as gpu:
        assert gpu.context.options.mode == "g0" and not gpu.context.options.f4gate
    with UsbGpu.open(sim=True, mode="g3", f4gate=True) as gpu:
        assert gpu.context.options.mode == "g3" and gpu.context.options.f4gate
