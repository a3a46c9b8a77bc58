"""speck.hcq: devices, buffers, hardware command queues with timeline signals, the ELF loader, and the
multi-threaded CPU device.

    from speck.hcq import Device, Buffer
    dev = Device["CPU"]
    prog = dev.runtime("add", dev.compiler.compile(llvm_ir))
    prog(out, a, b, global_size=(n, 1, 1), wait=True)
"""

from speck.hcq import cpu, disk, null, python_device  # noqa: F401  (each registers its device kind)
from speck.hcq._version import __version__
from speck.hcq.allocator import MEMORY, Allocator, BufferOptions
from speck.hcq.buffer import Buffer
from speck.hcq.device import DeviceBase
from speck.hcq.dtypes import DTypeInfo, dtype_info
from speck.hcq.errors import (
    CopySizeError,
    DefaultDeviceAssignmentError,
    DeviceNotFoundError,
    DeviceUnavailableError,
    ElfLinkError,
    HCQError,
    OutOfMemoryError,
    ProgramArgumentError,
    SignalTimeoutError,
)
from speck.hcq.program import BufferParam, Program
from speck.hcq.queue import HWQueue, ProfileEvent
from speck.hcq.registry import Device, canonicalize, kind_of, register_device
from speck.hcq.signal import Signal


def mem_used() -> int:
    """Bytes held by live buffers on every device (MEMORY.used)."""
    return MEMORY.used


__all__ = [
    "MEMORY", "Allocator", "Buffer", "BufferOptions", "BufferParam", "CopySizeError", "DTypeInfo", "Device",
    "DefaultDeviceAssignmentError", "DeviceBase", "DeviceNotFoundError", "DeviceUnavailableError", "ElfLinkError",
    "HCQError", "HWQueue",
    "OutOfMemoryError", "ProfileEvent", "Program", "ProgramArgumentError", "Signal", "SignalTimeoutError",
    "__version__", "canonicalize", "dtype_info", "kind_of", "mem_used", "register_device",
]  # fmt: skip
