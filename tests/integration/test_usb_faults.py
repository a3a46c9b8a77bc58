"""Faults of kernels on the USB tensor device (USB:SIM): a kernel that reads outside every buffer stops the compute
queue with GpuFault (the fault record: queue, page fault, address), one that never ends with GpuHang once the
simulated GPU's watchdog gives up; both surface once, from the operation that waits for the kernel (synchronize, a
read back), and the device restarts its compute queue by itself, so the next operation runs - tensors and jitted
steps included. What the dropped kernels were to write is undefined: reading it raises BufferStateError (never
stale or foreign bytes) until it is computed, copied or replayed again."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from speck.hcq import Buffer
from speck.hcq.errors import BufferStateError
from speck.tensor import Device, Tensor, TinyJit
from speck.tensor.usb import UsbDevice
from speck.usbgpu.errors import GpuFault, GpuHang
from speck.usbgpu.sim.kernels import OOB, SPIN

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"  # under SPECK_USB_SIM (as in test_usb_tensor.py: the bridges are shared by the process) it is USB


@pytest.fixture
def dev() -> Iterator[UsbDevice]:
    d = Device[USB]
    assert isinstance(d, UsbDevice) and d.gpu.sim is not None
    yield d
    assert d.gpu.sim.violations == []


def usable(dev: UsbDevice) -> None:
    """The device computes and reads back after the fault (no reset called)."""
    np.testing.assert_array_equal((Tensor([1.0, 2.0]).to(USB) + 1).numpy(), np.array([2.0, 3.0], np.float32))
    assert dev.gpu.queue_status().idle


def test_an_out_of_bounds_read_raises_gpu_fault_once_and_the_device_recovers(dev: UsbDevice) -> None:
    prog = dev.runtime("oob", dev.compiler.compile(OOB))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    src.copyin(np.arange(64, dtype=np.float32))
    prog(out, src, global_size=(1, 1, 1), vals=(1 << 40,))  # 4 TiB past the buffer: no page maps it
    with pytest.raises(GpuFault) as e:
        dev.synchronize()
    record = e.value.record
    assert record.queue == dev.gpu.queue_status().queue and "fault" in record.kind.lower()
    assert any("restarted its compute queue" in n for n in e.value.__notes__)
    usable(dev)  # no reset: the next operation runs
    with pytest.raises(BufferStateError, match="undefined data"):  # what the faulting kernel was to write
        out.copyout(np.empty(64, np.float32))
    with pytest.raises(BufferStateError):  # OOB's IR says nothing of how it uses `in`: taken as written too
        src.copyout(np.empty(64, np.float32))
    got = np.empty(64, np.float32)
    out.copyin(np.ones(64, np.float32))  # the host rewrote all of it: defined again
    out.copyout(got)
    np.testing.assert_array_equal(got, np.ones(64, np.float32))
    dev.reset()  # an explicit reset of a healthy queue is harmless
    usable(dev)


def test_tensors_the_dropped_kernels_compute_raise_when_read_and_compute_again(dev: UsbDevice) -> None:
    """Kernels queued behind the faulting one never run: their outputs are undefined. Reading one raises (the CPU's
    value is never silently replaced by stale VRAM), a kernel that reads one raises, and computing it again works."""
    a = Tensor(np.arange(16, dtype=np.float32)).to(USB).realize()
    (a * 3 + 1).realize()  # its program is loaded now (an upload would wait for, and report, the fault first)
    prog = dev.runtime("oob", dev.compiler.compile(OOB))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    prog(out, src, global_size=(1, 1, 1), vals=(1 << 40,))
    b = a * 3 + 1
    with pytest.raises(GpuFault):
        b.realize()  # its kernel is submitted behind the fault: dropped
        dev.synchronize()
    with pytest.raises(BufferStateError, match="undefined data"):
        b.numpy()
    with pytest.raises(BufferStateError, match="which reads it"):
        (b + 1).realize()
    np.testing.assert_array_equal(a.numpy(), np.arange(16, dtype=np.float32))  # computed before the fault
    np.testing.assert_array_equal((a * 3 + 1).numpy(), np.arange(16, dtype=np.float32) * 3 + 1)
    usable(dev)


def test_a_kernel_that_never_ends_raises_gpu_hang_once_and_the_device_recovers(
    dev: UsbDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speck.tensor.settings import USB_KERNEL_TIMEOUT

    gpu = dev.gpu.sim.gpu
    monkeypatch.setattr(gpu, "timing", dataclasses.replace(gpu.timing, dispatch_max_instructions=20_000))
    monkeypatch.setattr(USB_KERNEL_TIMEOUT, "value", 0.5)  # seconds of (modeled) GPU time before GpuHang
    prog = dev.runtime("spin", dev.compiler.compile(SPIN))
    flag = Buffer(USB, 1, "int32").allocate()
    flag.copyin(np.zeros(1, np.int32))
    prog(flag, global_size=(1, 1, 1))
    with pytest.raises(GpuHang) as e:
        (Tensor([3.0]).to(USB) + 1).numpy()  # the read back waits for the compute queue, which hangs
    assert "compute" in str(e.value)
    usable(dev)


def test_a_fault_inside_a_jitted_replay_is_raised_by_the_replay_and_the_next_replay_runs(
    dev: UsbDevice,
) -> None:
    w = Tensor(np.ones(8, np.float32)).to(USB).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * w + 1).sum().realize()

    x = Tensor(np.arange(8, dtype=np.float32)).to(USB).realize()
    for _ in range(3):
        assert step(x).item() == 36.0
    prog = dev.runtime("oob", dev.compiler.compile(OOB))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    prog(out, src, global_size=(1, 1, 1), vals=(1 << 40,))
    with pytest.raises(GpuFault):
        step(x)  # the replay's single submission waits behind the faulted kernel
    assert step(x).item() == 36.0  # the replay rewrites everything the dropped one was to write
    usable(dev)


def test_a_training_step_dropped_by_a_fault_leaves_its_parameters_undefined_until_reloaded(dev: UsbDevice) -> None:
    """An in-place update queued behind a fault did not run (or half ran): the next step refuses the parameter
    instead of training on whatever VRAM holds; assigning host data to it makes the step run again."""
    w = Tensor(np.ones(8, np.float32)).to(USB).realize()

    def step(x: Tensor) -> Tensor:
        w.assign(w * 0.5 + x).realize()
        return w.sum()

    x = Tensor(np.arange(8, dtype=np.float32)).to(USB).realize()
    for _ in range(2):  # (its programs are loaded: nothing waits for the GPU before the update is queued)
        step(x).item()
    prog = dev.runtime("oob", dev.compiler.compile(OOB))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    prog(out, src, global_size=(1, 1, 1), vals=(1 << 40,))
    with pytest.raises(GpuFault):
        step(x).item()
    with pytest.raises(BufferStateError, match="undefined data"):
        step(x).item()
    with pytest.raises(BufferStateError, match="undefined data"):
        w.numpy()
    w.assign(Tensor(np.ones(8, np.float32)).to(USB)).realize()
    want = np.ones(8, np.float32) * 0.5 + np.arange(8, dtype=np.float32)
    assert step(x).item() == pytest.approx(float(want.sum()))
    np.testing.assert_allclose(w.numpy(), want)
    usable(dev)


def test_the_dropped_work_ledger_keeps_a_mark_until_its_rewrite_really_ran() -> None:
    """The bookkeeping alone (no GPU): a dropped dispatch marks what it writes; the same dispatch built again takes the
    mark away for the launches after it, but a stop before that submission ran puts it back, and only a submission
    that got through clears it for good. A read of a marked allocation names it."""
    from speck.tensor.usb import _DroppedWork
    from speck.usbgpu.api import VramBuffer

    ledger, a, b = _DroppedWork(), VramBuffer(0x1000, 0x100, 0), VramBuffer(0x2000, 0x100, 0)
    ledger.handles.update({a.va: a, b.va: b})
    key = ("prog", (0x1040, 0x2000), (1, 1, 1))
    ledger.dispatch_built(key, reads=[0x2000], writes=[0x1040], name="USB", kernel="k")
    ledger.submitted(5)
    assert ledger.drop_after(4) == 1  # signal 5 never completed: a (written at +0x40) is undefined, b is not
    with pytest.raises(BufferStateError, match="0x1000"):
        ledger.check_read(0x10FF, "USB", "reading")
    ledger.check_read(0x2000, "USB", "reading")
    with pytest.raises(BufferStateError, match="which reads it"):
        ledger.dispatch_built(("other",), reads=[0x1000], writes=[0x2000], name="USB", kernel="k2")
    ledger.dispatch_built(key, reads=[0x2000], writes=[0x1040], name="USB", kernel="k")  # the rewrite is built...
    ledger.check_read(0x1000, "USB", "reading")  # (the launches after it in its batch may read it)
    assert ledger.drop_after(5) == 1  # ...but the queue stopped before it was submitted: marked again
    ledger.dispatch_built(key, reads=[0x2000], writes=[0x1040], name="USB", kernel="k")
    ledger.submitted(7)
    ledger.retired(7)
    assert ledger.drop_after(7) == 0  # it ran: defined
    ledger.dispatch_built(key, reads=[], writes=[0x1040], name="USB", kernel="k")
    ledger.submitted(8)
    assert ledger.drop_after(7) == 1
    ledger.forget(a)  # the host copied into all of it
    ledger.check_read(0x1000, "USB", "reading")
