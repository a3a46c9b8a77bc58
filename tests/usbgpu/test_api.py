"""The public API: UsbGpu.open / alloc / copyin / copyout / close, argument checking and lifetime."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
            gpu.copyout(memoryview(b"abc"), buf)
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


def _device_state(dev: SimDevice) -> tuple[int, int, bytes]:
    """What any request reaching the device would change: its transfer counters and the SDMA ring in VRAM."""
    from speck.usbgpu.gpu import RING_VA

    sent = dev.stats["control_transfers"] + dev.stats["bulk_out_transfers"] + dev.stats["bulk_in_transfers"]
    return sent, dev.stats["doorbells"], dev.read_vram(RING_VA, 4096)


def test_misuse_is_rejected_before_anything_is_sent() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(8192)
        gpu.copyin(buf, b"z" * 8192)
        state = _device_state(dev)
        with pytest.raises(TypeError, match="copyin offset must be an int, got float 1.0"):
            gpu.copyin(buf, b"y", 1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="copyout offset must be an int, got a bool"):
            gpu.copyout(bytearray(1), buf, True)
        with pytest.raises(TypeError, match="copyin offset must be an int"):
            gpu.copyin_async(buf, b"y", 2.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="allocation size must be an int, got float"):
            gpu.alloc(10.0)  # type: ignore[arg-type]
        ring = VramBuffer(0, 4096, owner=gpu.session)  # hand-made, pointing at the SDMA ring
        with pytest.raises(ValueError, match="not a live allocation.*driver's own VRAM .SDMA ring"):
            gpu.copyin(ring, b"\0" * 4096)
        with pytest.raises(ValueError, match="driver's own VRAM"):
            gpu.copyout_async(bytearray(16), ring)
        with pytest.raises(ValueError, match="was not made by UsbGpu.alloc"):
            gpu.copyin(VramBuffer(buf.va, buf.size, owner=gpu.session), b"y")  # equal to a live one, but forged
        with pytest.raises(TypeError, match="sim must be None .* got 'yes'"):
            UsbGpu.open(sim="yes")
        with pytest.raises(TypeError, match="sim=.*must hold device models.*str"):
            UsbGpu.open(sim=["a"])
        with pytest.raises(TypeError, match="device index must be an int, got float"):
            UsbGpu.open(0.0, sim=dev)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="f4gate must be True, False or None"):
            UsbGpu.open(sim=dev, f4gate="no")  # type: ignore[arg-type]
        assert _device_state(dev) == state
        from speck.usbgpu.sim import shim

        assert shim.installed_models() == [dev]  # a rejected open did not even replace the simulated bus
        out = bytearray(8192)
        gpu.copyout(out, buf)  # and the session is still fine
        assert out == b"z" * 8192
    assert dev.violations == []


def test_freed_vram_is_reused_and_a_freed_buffer_is_refused() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        a, b = gpu.alloc(100_000), gpu.alloc(5000)
        gpu.copyin(b, b"b" * 5000)
        gpu.free(a)
        c = gpu.alloc(90_000)  # fits the hole a left
        assert c.va == a.va
        gpu.copyin(c, b"c" * 90_000)
        out = bytearray(5000)
        gpu.copyout(out, b)
        assert out == b"b" * 5000
        with pytest.raises(ValueError, match="it was freed and its VRAM handed out again"):
            gpu.copyin(a, b"a")  # a stale handle to memory that is c's now
        with pytest.raises(ValueError, match="it was freed"):
            gpu.free(a)
        d = gpu.alloc(100)
        gpu.free(d)
        with pytest.raises(ValueError, match="it was freed, or"):
            gpu.copyout(bytearray(1), d)
        # fill VRAM, fail, free, and the space is there again
        heap = gpu.context.heap
        fillers = [gpu.alloc(size) for _, size in heap.blocks()]
        with pytest.raises(VramAllocError, match="free buffers you no longer need"):
            gpu.alloc(1)
        for buffer in [*fillers, c, b]:
            gpu.free(buffer)
        assert heap.blocks() == [(heap.start, heap.end - heap.start)]
    assert dev.violations == []


@settings(max_examples=60)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40_000)), max_size=60))
def test_vram_heap_never_overlaps_and_coalesces(ops: list[tuple[bool, int]]) -> None:
    from speck.usbgpu.vram import VramHeap

    heap = VramHeap(0x10000, 0x10000 + 64 * 4096, 4096)
    live: dict[int, int] = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            try:
                va = heap.alloc(n)
            except VramAllocError:
                # refused only when no free block is large enough
                assert max((size for _, size in heap.blocks()), default=0) < heap.reserved(n)
                continue
            live[va] = heap.reserved(n)
        else:
            va = sorted(live)[n % len(live)]
            heap.free(va)
            del live[va]
        spans = sorted([(va, va + size) for va, size in live.items()] + [(s, s + z) for s, z in heap.blocks()])
        assert spans[0][0] == heap.start and spans[-1][1] == heap.end  # used + free tile the heap exactly
        assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        free = heap.blocks()
        assert all(a + s < b for (a, s), (b, _) in zip(free, free[1:]))  # neighbours are always merged
    for va in list(live):
        heap.free(va)
    assert heap.blocks() == [(heap.start, heap.end - heap.start)]


def test_speck_usb_sim_puts_n_default_devices_on_the_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.usbgpu.sim import default_devices

    monkeypatch.setenv("SPECK_USB_SIM", "2")
    with UsbGpu.open(0) as first, UsbGpu.open(1) as second:  # both open at once, on two simulated bridges
        assert first.sim is default_devices(2)[0] and second.sim is default_devices(2)[1]
        a, b = first.alloc(3000), second.alloc(3000)
        first.copyin(a, b"1" * 3000)
        second.copyin(b, b"2" * 3000)
        va = a.va
    with UsbGpu.open(0) as again:  # the same device again: its VRAM kept the data
        assert again.sim is default_devices(1)[0]
        assert again.sim.read_vram(va, 3000) == b"1" * 3000
