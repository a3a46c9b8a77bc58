"""Faults injected into the simulated ASM2464 bridge and RDNA3 GPU while the USB tensor device (USB:SIM) dispatches
kernels and copies: each must end in a named error of the package's classes (never a hang, never a wrong value),
and the device must compute correctly afterwards - by itself after a GPU fault, after reopen() after a transport
failure."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from speck.hcq import Buffer
from speck.hcq.errors import DeviceUnavailableError, OutOfMemoryError
from speck.tensor import Device, Tensor
from speck.tensor.usb import UsbDevice
from speck.usbgpu import errors
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.sim.config import TransferFault
from speck.usbgpu.sim.kernels import OOB, SPIN

USB = "USB:SIM"
S_ENDPGM = bytes.fromhex("0000b0bf")  # s_endpgm, little-endian


@pytest.fixture(scope="module", autouse=True)
def sim_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECK_USB_SIM", "1")
        yield


@pytest.fixture
def dev() -> Iterator[UsbDevice]:
    d = Device[USB]
    assert isinstance(d, UsbDevice) and d.gpu.sim is not None
    yield d
    sim = d.gpu.sim
    assert sim is not None and sim.violations == []
    sim.faults.transfer_faults.clear()


def computes(x: np.ndarray) -> None:
    np.testing.assert_array_equal((Tensor(x).to(USB) * 2 + 1).numpy(), x * 2 + 1)


def test_an_illegal_instruction_is_a_named_gpu_fault_and_the_device_computes_after_it(dev: UsbDevice) -> None:
    kept = (Tensor(np.arange(40, dtype=np.float32)).to(USB) * 3).realize()
    image = bytearray(dev.compiler.compile(OOB))
    at = image.find(S_ENDPGM)
    assert at > 0
    image[at : at + 4] = b"\xff\xff\xff\xff"  # no RDNA3 encoding: the wave reaches it after its store
    prog = dev.runtime("oob", bytes(image))
    out, src = Buffer(USB, 64, "float32").allocate(), Buffer(USB, 64, "float32").allocate()
    src.copyin(np.arange(64, dtype=np.float32))
    prog(out, src, global_size=(1, 1, 1), vals=(0,))
    with pytest.raises(errors.GpuFault, match="illegal instruction") as e:
        dev.synchronize()
    assert "compute" in str(e.value) and "0xffffffff" in str(e.value)
    np.testing.assert_array_equal(kept.numpy(), np.arange(40, dtype=np.float32) * 3)  # computed before: intact
    computes(np.arange(1000, dtype=np.float32))


INLINE_ASM = """
define amdgpu_kernel void @ill(ptr addrspace(1) %out) {
  call void asm sideeffect ".long 0xffffffff", ""()
  store i32 1, ptr addrspace(1) %out
  ret void
}
"""


@pytest.mark.parametrize("src", [INLINE_ASM, 'module asm ".text"\n' + INLINE_ASM.replace("call void asm", "; asm")])
def test_inline_assembly_in_a_custom_kernel_is_a_compile_error_not_a_process_abort(dev: UsbDevice, src: str) -> None:
    """LLVM's AMDGPU object streamer aborts the process on inline assembly (llvmlite has no AMDGPU asm parser): the
    compiler must refuse it first, naming the line."""
    from speck.codegen.errors import CompileError

    line = 1 + next(i for i, ln in enumerate(src.splitlines()) if "asm " in ln and not ln.lstrip().startswith(";"))
    with pytest.raises(CompileError, match=rf"line {line}: inline assembly is not supported.*llvm\.amdgcn"):
        dev.compiler.compile(src)
    computes(np.arange(5, dtype=np.float32))


def test_a_kernel_that_never_finishes_raises_gpu_hang_naming_the_wait(
    dev: UsbDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speck.tensor.settings import USB_KERNEL_TIMEOUT

    sim = dev.gpu.sim
    assert sim is not None
    monkeypatch.setattr(sim.gpu, "timing", dataclasses.replace(sim.gpu.timing, dispatch_max_instructions=20_000))
    monkeypatch.setattr(USB_KERNEL_TIMEOUT, "value", 0.5)
    flag = Buffer(USB, 1, "int32").allocate()
    flag.copyin(np.zeros(1, np.int32))
    dev.runtime("spin", dev.compiler.compile(SPIN))(flag, global_size=(1, 1, 1))
    with pytest.raises(errors.GpuHang, match=r"waiting for compute signal \d+"):
        dev.synchronize()
    computes(np.arange(10, dtype=np.float32))


# a failure of the transfer that carries a kernel's dispatch (the PM4 and kernargs go over 0xF0 TLP writes and EP 0x02)
@pytest.mark.parametrize(
    ("fault", "error", "names"),
    [
        (TransferFault(endpoint=0, nth=1, mode="stall"), errors.UsbPipeError, "control OUT 0xF0"),
        (TransferFault(endpoint=0, nth=2, mode="timeout"), errors.UsbTimeoutError, "control OUT 0xF0"),
        (TransferFault(endpoint=0x02, nth=1, mode="short"), errors.TransferShortError, "bulk OUT 0x02"),
        (TransferFault(endpoint=0x02, nth=2, mode="timeout"), errors.UsbTimeoutError, "bulk OUT 0x02"),
    ],
    ids=["ctrl-stall", "ctrl-timeout", "bulk-short", "bulk-timeout"],
)
def test_a_usb_fault_during_a_kernel_dispatch_is_named_and_reopen_recovers(
    dev: UsbDevice, fault: TransferFault, error: type[Exception], names: str
) -> None:
    x = np.arange(3000, dtype=np.float32)
    a = Tensor(x).to(USB).realize()
    computes(x)  # compiled and loaded: what fails below is the dispatch itself
    sim = dev.gpu.sim
    assert sim is not None
    sim.faults.transfer_faults.append(fault)
    with pytest.raises(error, match=names):
        (a * 5 - 2).numpy()
    sim.faults.transfer_faults.clear()
    with pytest.raises(DeviceUnavailableError, match=r"an earlier operation failed \(.+\).*reopen\(\)"):
        (a + 1).numpy()  # refused, naming what failed and the way back
    dev.reopen()
    with pytest.raises(DeviceUnavailableError, match="before the device was reopened"):
        a.numpy()  # its VRAM went with the old session: never stale bytes
    computes(x)
    np.testing.assert_array_equal((Tensor(x).to(USB) * 5 - 2).numpy(), x * 5 - 2)


def test_a_stalled_read_back_names_the_compute_call_that_failed(dev: UsbDevice) -> None:
    x = np.arange(500, dtype=np.float32)
    a = (Tensor(x).to(USB) + 1).realize()
    sim = dev.gpu.sim
    assert sim is not None
    sim.faults.transfer_faults.append(TransferFault(endpoint=0x81, nth=1, mode="stall"))
    with pytest.raises(errors.UsbPipeError, match="bulk IN 0x81"):
        a.numpy()
    with pytest.raises(DeviceUnavailableError, match=r"earlier operation failed \((copyout|compute queue \w+\(\))"):
        a.numpy()  # a call name, not a bare "completed"
    dev.reopen()
    computes(x)


def test_vram_exhaustion_is_out_of_memory_and_leaves_earlier_tensors_intact(dev: UsbDevice) -> None:
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    kept = (Tensor(x).to(USB) * 2).realize()
    hogs: list[Buffer] = []
    with pytest.raises(OutOfMemoryError, match=r"requested \d+ bytes, \d+ bytes available"):
        for _ in range(10_000):  # bounded: VRAM is finite, this ends long before
            hogs.append(Buffer(USB, 256 << 20, "uint8").allocate())
    assert hogs, "not one 256 MiB buffer fitted"
    np.testing.assert_array_equal((kept + 1).numpy(), x * 2 + 1)  # what is left still computes, exactly
    np.testing.assert_array_equal(kept.numpy(), x * 2)
    del hogs  # their VRAM is handed out again
    again = Buffer(USB, 256 << 20, "uint8").allocate()
    del again
    np.testing.assert_array_equal((kept - 1).numpy(), x * 2 - 1)


def test_a_second_session_on_the_same_bridge_is_refused_and_the_first_computes_on(dev: UsbDevice) -> None:
    computes(np.ones(8, np.float32))
    with pytest.raises(errors.DeviceInUseError, match="already open in this process"):
        UsbGpu.open(0)  # the SPECK_USB_SIM bridge the tensor device holds
    computes(np.ones(8, np.float32))


def test_other_simulated_models_replacing_the_bus_are_named_in_the_open_sessions_error(dev: UsbDevice) -> None:
    """UsbGpu.open(sim=True) puts a new model on the fake bus, which unplugs the tensor device's bridge: its next
    operation must say so (not only "disconnected"), and reopen() after the other session closed recovers."""
    x = np.arange(64, dtype=np.float32)
    computes(x)
    with UsbGpu.open(sim=True) as other:
        buf = other.alloc(16)
        other.copyin(buf, b"0123456789abcdef")
        with pytest.raises(errors.UsbNoDeviceError, match="was replaced by an open of other device models"):
            computes(x)
    dev.reopen()
    computes(x)
