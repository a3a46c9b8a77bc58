"""Hostile and odd use of the USB tensor device (USB:SIM) through the public Tensor API: failures of the simulated
transport in the middle of an operation, reopening after them, allocations past VRAM. Each must end in a clear error
of the package's classes naming what failed, or in the right values - never a hang or a silent wrong result."""

from __future__ import annotations

import io
import pathlib
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from speck.hcq.errors import CorruptFileError, DeviceUnavailableError, OutOfMemoryError
from speck.hcq.signal import Signal
from speck.tensor import Device, Tensor
from speck.tensor.nn.state import safe_load, safe_save, zip_extract
from speck.tensor.usb import UsbDevice, UsbLink
from speck.usbgpu.errors import UsbNoDeviceError, UsbTimeoutError
from speck.usbgpu.sim.config import TransferFault

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"


@pytest.fixture
def dev() -> Iterator[UsbDevice]:
    d = Device[USB]
    assert isinstance(d, UsbDevice) and d.gpu.sim is not None
    yield d
    d.gpu.sim.faults.transfer_faults.clear()
    d.gpu.sim.faults.disconnect_after_out_bytes = None


def step(x: np.ndarray) -> np.ndarray:
    return (Tensor(x).to(USB) * 2 + 1).numpy()


def test_a_computation_run_before_a_reopen_runs_again_after_it(dev: UsbDevice) -> None:
    """reopen() says 'compute them again': a computation repeated often enough to be batched into a graph (its
    plan cached by structure) must run on the new session, not refuse forever with a stale graph's error (was
    HCQError '... was built before USB:SIM was reopened ... TinyJit.reset()' on every later call, no TinyJit used)."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for _ in range(4):
        np.testing.assert_array_equal(step(x), x * 2 + 1)
    dev.reopen()
    for k in range(3):
        np.testing.assert_array_equal(step(x + k), (x + k) * 2 + 1)


def test_random_draws_after_a_reopen_start_again_from_the_seed(dev: UsbDevice) -> None:
    """The device's random counter lives in its memory: a reopen loses it with every other buffer. manual_seed and
    the next draws must work on the new session (manual_seed wrote the old session's counter buffer: a
    DeviceUnavailableError) and draw what a fresh device draws for that seed."""
    Tensor.manual_seed(7)
    first = Tensor.rand(16, device=USB).numpy()
    dev.reopen()
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor.rand(16, device=USB).numpy(), first)
    assert not np.array_equal(Tensor.rand(16, device=USB).numpy(), first)  # (the new counter advances)


def test_a_disconnect_mid_copy_names_the_copy_and_reopen_after_reconnect_recovers(dev: UsbDevice) -> None:
    x = np.arange(50_000, dtype=np.float32)
    for _ in range(3):  # (cached and batched before the failure)
        np.testing.assert_array_equal(step(x), x * 2 + 1)
    sim = dev.gpu.sim
    assert sim is not None
    sim.faults.disconnect_after_out_bytes = 100
    with pytest.raises(UsbNoDeviceError, match="NO_DEVICE"):
        step(x)
    with pytest.raises(DeviceUnavailableError, match=r"copyin of 200000 bytes.*reopen\(\)"):
        step(x)  # every later use names the failed operation and the way back
    sim.reconnect()
    dev.reopen()
    np.testing.assert_array_equal(step(x), x * 2 + 1)


def test_a_copy_out_timeout_is_a_usb_timeout_then_the_device_refuses_until_reopened(dev: UsbDevice) -> None:
    x = np.arange(30_000, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(step(x), x * 2 + 1)
    t = (Tensor(x).to(USB) - 5).realize()
    sim = dev.gpu.sim
    assert sim is not None
    sim.faults.transfer_faults.append(TransferFault(endpoint=0x81, nth=1, mode="timeout"))
    with pytest.raises(UsbTimeoutError, match="LIBUSB_ERROR_TIMEOUT"):
        t.numpy()
    with pytest.raises(DeviceUnavailableError, match="LIBUSB_ERROR_TIMEOUT"):
        t.numpy()
    dev.reopen()
    with pytest.raises(DeviceUnavailableError, match="before the device was reopened"):
        t.numpy()  # its VRAM went with the old session: never old or foreign bytes
    np.testing.assert_array_equal(step(x), x * 2 + 1)


def test_a_tensor_larger_than_vram_is_out_of_memory_and_the_device_stays_usable(dev: UsbDevice) -> None:
    n = (dev.gpu.context.vram_size + (1 << 30)) // 4
    with pytest.raises(OutOfMemoryError, match=r"out of memory on USB(:SIM)?: requested \d+ bytes"):
        Tensor.full((n,), 1.0, device=USB).contiguous().realize()
    np.testing.assert_array_equal(step(np.ones(3, np.float32)), np.full(3, 3, np.float32))


def test_a_damaged_stored_zip_member_moved_to_usb_is_refused_and_an_intact_one_arrives(
    dev: UsbDevice, tmp_path: pathlib.Path
) -> None:
    # a DISK source streams to VRAM with pread, past the mapping's reads: the member's CRC-32 is checked there too
    payload = bytes(range(256)) * 8
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("good", payload[::-1])
        z.writestr("bad", payload)
    raw = bytearray(out.getvalue())
    raw[raw.index(payload) + 100] ^= 1
    p = tmp_path / "damaged.zip"
    p.write_bytes(bytes(raw))
    members = zip_extract(p)
    assert members["good"].to(USB).numpy().tobytes() == payload[::-1]
    with pytest.raises(CorruptFileError, match="zip member 'bad'"):
        members["bad"].to(USB).realize()
    np.testing.assert_array_equal(step(np.ones(3, np.float32)), np.full(3, 3, np.float32))


def test_a_lazy_disk_tensor_moved_to_usb_after_a_save_over_its_file_keeps_its_values(
    dev: UsbDevice, tmp_path: pathlib.Path
) -> None:
    # the copy to USB read the file by path with pread: after safe_save replaced the file (a new one renamed over it),
    # the lazily loaded tensor arrived with the new file's bytes at its old offset (here -7s instead of 0..63), while
    # the same tensor read on the CPU (through its mapping) gave 0..63
    p = tmp_path / "w.safetensors"
    a = np.arange(64, dtype=np.float32)
    safe_save({"w": Tensor(a)}, p)
    lazy = safe_load(p)
    safe_save({"w": Tensor(np.full(64, -7, np.float32))}, p)
    np.testing.assert_array_equal(lazy["w"].to(USB).numpy(), a)
    np.testing.assert_array_equal(lazy["w"].to("CPU").numpy(), a)
    np.testing.assert_array_equal(safe_load(p)["w"].to(USB).numpy(), np.full(64, -7, np.float32))


def test_a_copy_in_queued_behind_another_threads_copy_is_done_before_the_kernel_reading_it(
    dev: UsbDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with the copy engine busy (another thread's copy in), a copy in was queued (to(USB) returns at once) and the
    # kernel launched next read its input before the copy ran: zeros, or the bytes of an old buffer (another
    # thread's values). Made deterministic: thread B's copy in stays inside the link until this thread either
    # launched its kernel (the bug) or waits for the copy engine (the fix).
    a = np.arange(1, 65, dtype=np.float32)
    np.testing.assert_array_equal((Tensor(a).to(USB) * 2).numpy(), a * 2)  # (compiled: only the race is left)
    b_inside, a_went_on = threading.Event(), threading.Event()
    main = threading.current_thread()
    copyin, submit, wait = UsbLink.copyin, UsbLink.submit, Signal.wait

    def slow_copyin(self: UsbLink, *args: Any) -> None:
        if threading.current_thread().name == "B" and not b_inside.is_set():
            b_inside.set()
            a_went_on.wait()
        copyin(self, *args)

    def noted_submit(self: UsbLink, *args: Any) -> int:
        value = submit(self, *args)
        if threading.current_thread() is main:
            a_went_on.set()
        return value

    def noted_wait(self: Signal, *args: Any, **kwargs: Any) -> None:
        if self is dev.engines["copy"].timeline and threading.current_thread() is main:
            a_went_on.set()
        wait(self, *args, **kwargs)

    monkeypatch.setattr(UsbLink, "copyin", slow_copyin)
    monkeypatch.setattr(UsbLink, "submit", noted_submit)
    monkeypatch.setattr(Signal, "wait", noted_wait)
    other = np.full(64, -3, np.float32)
    b = threading.Thread(target=lambda: Tensor(other).to(USB).realize(), name="B")
    b.start()
    b_inside.wait()
    try:
        got = (Tensor(a).to(USB) * 2).realize()
    finally:
        a_went_on.set()
        b.join()
    np.testing.assert_array_equal(got.numpy(), a * 2)
