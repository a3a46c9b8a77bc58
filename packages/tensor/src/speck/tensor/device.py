"""Devices for tensors: the registry (speck.hcq's `Device`), buffers, name canonicalisation and which dtypes a
device computes with."""

from __future__ import annotations

from speck.codegen.compiler import Compiler
from speck.codegen.errors import CompileError
from speck.hcq import Allocator, Buffer, BufferOptions, Device, DeviceBase, Program, kind_of
from speck.hcq.errors import DeviceNotFoundError
from speck.tensor.errors import TensorAssertionError, TensorError, TensorRuntimeError, UnknownDeviceError
from speck.uop import DType

# tinygrad's names for the same classes: a device object's base class, buffer options
Compiled = DeviceBase
BufferSpec = BufferOptions
# what `Device[name].runtime(fn_name, lib)` returns: a loaded program (speck.hcq.Program and its per-device kinds)
Runtime = Program
# speck's one Allocator keeps freed allocations for reuse (the LRU setting) on every device whose cache_cap > 0
# (DISK's is 0); tinygrad names that kind LRUAllocator
LRUAllocator = Allocator


def default_device() -> str:
    """The device new tensors live on (Device.DEFAULT; the DEV setting picks another)."""
    return str(Device.DEFAULT)


def canonical(device: str | None) -> str:
    """Canonical device name ('cpu' -> 'CPU'); None means the default device."""
    if device is None:
        return default_device()
    try:
        return str(Device.canonicalize(device))
    except DeviceNotFoundError as e:  # raised again as a TensorError too, so `except TensorError` sees bad input
        raise UnknownDeviceError(str(e)) from None


def file_backed(device: object) -> bool:
    """Whether `device` (a device name) keeps its buffers in a file (DISK: data to copy to a compute device, not
    memory kernels run on), as its kind declares: the device is not opened. A tuple of devices (a sharded tensor)
    is not."""
    if not isinstance(device, str):
        return False
    try:
        return kind_of(device).file_backed
    except DeviceNotFoundError as e:
        raise UnknownDeviceError(str(e)) from None


def two_devices_error(first: str, second: str, what: str = "one op") -> TensorError:
    """The error for operands of one op on two devices (`a + b` with b on CPU:1), raised where the op is built or,
    for ops built elsewhere, when its kernel is scheduled (before, hcq refused the program launch). A DISK operand
    is an AssertionError, as computing on DISK is."""
    if file_backed(first) or file_backed(second):
        disk = first if file_backed(first) else second
        return TensorAssertionError(f"can't compute on {disk}: a DISK tensor is file data and its device runs no "
                                    "kernels; move it to a compute device first (e.g. .to('CPU'))")  # fmt: skip
    return TensorRuntimeError(f"{what} reads tensors on two devices, {first} and {second}: all operands of an op must "
                              f"be on the same device; move one first (e.g. .to({first!r}))")  # fmt: skip


def is_dtype_supported(dtype: DType, device: str | None = None) -> bool:
    """Whether tensors of `dtype` can be computed on `device` (default: the default device)."""
    dev = Device[canonical(device)]
    if not dev.backend_name:  # storage-only devices (DISK) hold any dtype and compute none
        return False
    return dtype.scalar() in dev.renderer.supported_dtypes()


__all__ = [
    "Allocator", "Buffer", "BufferSpec", "CompileError", "Compiled", "Compiler", "Device", "LRUAllocator", "Runtime",
    "canonical", "default_device",
    "is_dtype_supported",
]  # fmt: skip
