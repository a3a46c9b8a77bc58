"""Faults of kernels on the USB tensor device (USB:SIM): a kernel that reads outside every buffer stops the compute
queue with GpuFault (the fault record: queue, page fault, address), one that never ends with GpuHang once the
simulated GPU's watchdog gives up; both surface from the operation that waits for the kernel (synchronize, a read
back), leave the bridge session usable, and after `reset()` the device computes again - tensors and jitted steps
included."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from speck.hcq import Buffer
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
    """The device computes and reads back after the fault."""
    np.testing.assert_array_equal((Tensor([1.0, 2.0]).to(USB) + 1).numpy(), np.array([2.0, 3.0], np.float32))
    assert dev.gpu.queue_status().idle


def test_an_out_of_bounds_read_raises_gpu_fault_and_reset_recovers(dev: UsbDevice) -> None:
    prog = dev.runtime("oob", dev.compiler.compile(OOB))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    prog(out, src, global_size=(1, 1, 1), vals=(1 << 40,))  # 4 TiB past the buffer: no page maps it
    with pytest.raises(GpuFault) as e:
        dev.synchronize()
    record = e.value.record
    assert record.queue == dev.gpu.queue_status().queue and "fault" in record.kind.lower()
    assert dev.gpu.queue_status().faulted
    with pytest.raises(GpuFault):  # still stopped: every wait names the fault until the queue is reset
        (Tensor([1.0]).to(USB) * 2).numpy()
    dev.reset()
    usable(dev)


def test_a_kernel_that_never_ends_raises_gpu_hang_and_reset_recovers(
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
    assert "compute" in str(e.value) and dev.gpu.queue_status().hung
    dev.reset()
    usable(dev)


def test_a_fault_inside_a_jitted_replay_is_raised_by_the_replay_and_the_jit_runs_after_reset(
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
    dev.reset()
    assert step(x).item() == 36.0
    usable(dev)
