"""The DISK device: `DISK:/path` maps a file into memory as a buffer (for loading weights).

An existing file at least as large as the buffer is mapped read-only; otherwise the file is created or extended
and mapped read-write (force either with BufferOptions(writable=...)). Views select regions of the file, so a
checkpoint is loaded as one big uint8 buffer and a view per tensor; copyout and numpy views work without copies."""

from __future__ import annotations

from typing import Any

from speck.hcq.allocator import DiskAllocator
from speck.hcq.device import DeviceBase
from speck.hcq.errors import HCQError
from speck.hcq.registry import register_device


class DiskDevice(DeviceBase):
    """A file as device memory. It runs no programs; copy its buffers to a compute device first."""

    file_backed = True

    def __init__(self, name: str) -> None:
        self.path = name.partition(":")[2]
        super().__init__(name, DiskAllocator(name, self.path))

    def runtime(self, name: str, lib: bytes, **spec: Any) -> Any:
        raise HCQError(f"{self.name} stores data and runs no programs; copy the buffers to CPU first")


register_device("DISK", DiskDevice, suffix=lambda rest: rest or None, forms=("DISK:<path>",), probe=False,
                file_backed=DiskDevice.file_backed)  # fmt: skip
