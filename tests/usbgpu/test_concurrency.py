"""One UsbGpu from several threads, asynchronous copies and their handles, progress callbacks, Ctrl-C during a copy,
and the device lock between sessions and processes - all through the real transport stack and the simulator."""

from __future__ import annotations

import _thread
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.copyin import CP_SIZE, CopyEngine
from speck.usbgpu.errors import (
    CopyCancelledError,
    DeviceInUseError,
    DeviceUnusableError,
    UsbIoError,
)
from speck.usbgpu.sim import shim
from speck.usbgpu.sim.config import SimTiming, TransferFault
from speck.usbgpu.sim.device import SimDevice

N = 3 * CP_SIZE + 777


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def reopen_and_verify(dev: SimDevice) -> None:
    dev.violations.clear()
    data = payload(N, 99)
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(N)
        gpu.copyin(buf, data)
        out = bytearray(N)
        gpu.copyout(out, buf)
        assert out == data
    assert dev.violations == []


def test_two_threads_on_one_device_never_overlap_and_both_get_their_data(monkeypatch: pytest.MonkeyPatch) -> None:
    active, most = [0], [0]
    guard = threading.Lock()

    def counting(name: str) -> None:
        real = getattr(CopyEngine, name)

        def wrapper(self: CopyEngine, *args: object) -> None:
            with guard:
                active[0] += 1
                most[0] = max(most[0], active[0])
            try:
                time.sleep(0.001)  # give the other thread every chance to barge in
                real(self, *args)
            finally:
                with guard:
                    active[0] -= 1

        monkeypatch.setattr(CopyEngine, name, wrapper)

    counting("copyin_g3")
    counting("copyout")
    dev = SimDevice()
    errors: list[BaseException] = []
    with UsbGpu.open(sim=dev) as gpu:

        def worker(seed: int) -> None:
            try:
                buf = gpu.alloc(N)
                for i in range(4):
                    data = payload(N - 100 * i, seed * 10 + i)
                    gpu.copyin(buf, data)
                    out = bytearray(len(data))
                    gpu.copyout(out, buf)
                    assert out == data
                gpu.free(buf)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert most[0] == 1, "two copies ran on the device at the same time"
    assert dev.violations == []


def test_async_copies_run_in_issue_order_with_progress_and_handles() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(N)
        first, second = payload(N, 1), payload(N, 2)
        seen: list[tuple[int, int]] = []
        h1 = gpu.copyin_async(buf, first, progress=lambda done, total: seen.append((done, total)))
        h2 = gpu.copyin_async(buf, second)  # issued later: lands later
        out = bytearray(N)
        gpu.copyout(out, buf)  # a blocking call waits for everything issued before it
        assert h1.done() and h2.done()
        assert out == second
        h1.wait()
        h2.wait()
        assert h1.bytes_done == h1.nbytes == N
        dones = [d for d, _ in seen]
        assert dones == sorted(dones) and dones[-1] == N and {t for _, t in seen} == {N}
        assert len(dones) >= 4  # one per 240 KiB chunk and a final one
        back = bytearray(N)
        handle = gpu.copyout_async(back, buf)
        handle.wait(timeout=60)
        assert back == second and "copyout" in repr(handle)
        gpu.synchronize()
    assert dev.violations == []


def test_a_failed_async_copy_reports_through_its_handle_and_later_operations_refuse() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(N)
        gpu.copyin(buf, b"x" * 100)
        dev.inject(TransferFault(0x02, 5, "error"))
        failing = gpu.copyin_async(buf, payload(N, 3))
        after = gpu.copyin_async(buf, payload(N, 4))
        with pytest.raises(UsbIoError, match="bulk OUT 0x02"):
            failing.wait()
        with pytest.raises(DeviceUnusableError, match="earlier operation failed"):
            after.wait()
        with pytest.raises(DeviceUnusableError):
            gpu.synchronize()
    reopen_and_verify(dev)


def test_close_cancels_queued_async_copies_and_the_device_reopens() -> None:
    dev = SimDevice(timing=SimTiming(sdma_bytes_per_s=200e6))  # slow GPU: copies take a while
    gpu = UsbGpu.open(sim=dev)
    buf = gpu.alloc(N)
    gate = threading.Event()

    def hold(done: int, total: int) -> None:
        gate.wait(10)  # the first copy pauses at its first progress point until close() has been called

    handles = [gpu.copyin_async(buf, payload(N, 5), progress=hold)]
    handles += [gpu.copyin_async(buf, payload(N, s)) for s in (6, 7)]
    closer = threading.Thread(target=gpu.close)
    closer.start()
    while not handles[1].cancel_requested:  # close() has flagged the queue
        time.sleep(0.001)
    gate.set()
    closer.join()
    for h in handles:
        with pytest.raises(CopyCancelledError):
            h.wait()
    assert shim.counters()["inflight_transfers"] == 0
    reopen_and_verify(dev)


def test_a_synchronous_call_from_a_progress_callback_is_refused() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(N)

        def reenter(done: int, total: int) -> None:
            gpu.synchronize()

        with pytest.raises(RuntimeError, match="issued from inside another one"):
            gpu.copyin(buf, payload(N, 8), progress=reenter)
    reopen_and_verify(dev)


class InterruptingDevice(SimDevice):
    """A SimDevice whose `at`-th bulk OUT submission gets Ctrl-C (as if the user pressed it inside libusb)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.countdown: int | None = None
        self.at = at

    def submit(self, kind, endpoint, setup, out_data, in_length, timeout_ms):  # type: ignore[no-untyped-def]
        if self.countdown is not None and kind == "bulk" and endpoint == 0x02:
            self.countdown -= 1
            if self.countdown == 0:
                self.countdown = None
                raise KeyboardInterrupt
        return super().submit(kind, endpoint, setup, out_data, in_length, timeout_ms)


@pytest.mark.parametrize("where", ["progress callback", "inside libusb"])
def test_ctrl_c_during_a_copy_says_so_and_the_device_works_after_a_reopen(where: str) -> None:
    dev = InterruptingDevice(at=9)
    gpu = UsbGpu.open(sim=dev)
    buf = gpu.alloc(N)
    gpu.copyin(buf, b"w" * 100)

    def interrupt(done: int, total: int) -> None:
        if done < total:
            raise KeyboardInterrupt

    progress = interrupt if where == "progress callback" else None
    if where == "inside libusb":
        dev.countdown = dev.at
    with pytest.raises(KeyboardInterrupt) as info:
        gpu.copyin(buf, payload(N, 9), progress=progress)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert f"the copyin of {N} bytes was interrupted" in note and "fully usable after that reopen" in note
    with pytest.raises(DeviceUnusableError, match="interrupted"):
        gpu.copyin(buf, b"v")
    gpu.close()
    assert shim.counters()["inflight_transfers"] == 0
    reopen_and_verify(dev)


def test_ctrl_c_while_waiting_for_an_async_copy_leaves_it_running() -> None:
    dev = SimDevice()
    gpu = UsbGpu.open(sim=dev)
    buf = gpu.alloc(N)
    data = payload(N, 10)
    fired = [False]

    def interrupt_main(done: int, total: int) -> None:
        if not fired[0]:
            fired[0] = True
            _thread.interrupt_main()  # Ctrl-C lands in the main thread, which is waiting below

    handle = gpu.copyin_async(buf, data, progress=interrupt_main)
    with pytest.raises(KeyboardInterrupt):
        handle.wait()
        time.sleep(5)  # (not reached when the interrupt arrives during the wait)
    handle.wait()  # the copy itself carried on
    assert dev.read_vram(buf.va, N) == data
    gpu.close()
    assert dev.violations == []


def test_a_second_open_of_one_device_in_this_process_is_refused_before_touching_it() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        sent = dev.stats["control_transfers"]
        with pytest.raises(DeviceInUseError, match="already open in this process"):
            UsbGpu.open(sim=dev)
        assert dev.stats["control_transfers"] == sent
        buf = gpu.alloc(10)
        gpu.copyin(buf, b"0123456789")  # the first session is unaffected
    with UsbGpu.open(sim=dev):  # and after close the device opens again
        pass


OTHER_PROCESS = """
import sys
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import DeviceInUseError
from speck.usbgpu.sim.device import SimDevice
try:
    with UsbGpu.open(sim=SimDevice(serial=sys.argv[1])) as gpu:
        print("opened")
except DeviceInUseError as exc:
    print("refused:", exc)
"""


def test_a_second_process_opening_the_same_device_gets_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_USB_LOCK_DIR", str(tmp_path))
    serial = "cafe%04x" % (os.getpid() & 0xFFFF)
    env = {**os.environ, "SPECK_USB_LOCK_DIR": str(tmp_path)}

    def other() -> str:
        done = subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, serial], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    with UsbGpu.open(sim=SimDevice(serial=serial)):
        text = other()
        assert "refused:" in text and f"in use by another process (pid {os.getpid()}" in text
        assert str(tmp_path) in text
    assert "opened" in other()  # released on close
    assert "opened" in other()  # and by the other process on its exit


def test_ctrl_c_while_waiting_for_a_turn_gives_the_turn_up() -> None:
    from speck.usbgpu.opqueue import OpQueue

    queue = OpQueue("test")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def long_op() -> None:
        started.set()
        while queue._issued < 2:  # the main thread has taken its ticket ...
            time.sleep(0.001)
        time.sleep(0.05)  # ... and is waiting for its turn behind this operation
        _thread.interrupt_main()  # Ctrl-C lands in that wait
        release.wait(10)
        ran.append("long")

    other = threading.Thread(target=lambda: queue.run(long_op))
    other.start()
    started.wait(10)
    with pytest.raises(KeyboardInterrupt):
        queue.run(lambda: ran.append("interrupted"))
        time.sleep(5)  # (not reached when the interrupt lands during the wait)
    release.set()
    queue.run(lambda: ran.append("after"))  # would wait forever if the abandoned turn were still owed
    other.join()
    assert ran == ["long", "after"]
