"""The DISK device: `DISK:/path` maps a file into memory as a buffer (for loading weights).

An existing file at least as large as the buffer is mapped read-only; otherwise the file is created or extended
and mapped read-write (force either with BufferOptions(writable=...)). Views select regions of the file, so a
checkpoint is loaded as one big uint8 buffer and a view per tensor; copyout and numpy views work without copies.

A file's bool entry may hold bytes other than 0 and 1 (numpy reads any nonzero byte as True). Kernels count on a
bool buffer holding 0/1 (C's _Bool and the x86 selection rules load the byte as it is), so a copy out of a file into
a bool buffer makes every nonzero byte 1: the bytes are checked (one pass over them) and rewritten only when some
are not 0/1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from speck.hcq.allocator import DiskAllocator
from speck.hcq.device import DeviceBase
from speck.hcq.errors import HCQError
from speck.hcq.registry import register_device

if TYPE_CHECKING:
    from speck.hcq.buffer import Buffer


class DiskDevice(DeviceBase):
    """A file as device memory. It runs no programs; copy its buffers to a compute device first."""

    file_backed = True

    def __init__(self, name: str) -> None:
        self.path = name.partition(":")[2]
        super().__init__(name, DiskAllocator(name, self.path))

    def runtime(self, name: str, lib: bytes, **spec: Any) -> Any:
        raise HCQError(f"{self.name} stores data and runs no programs; copy the buffers to CPU first")

    def transfer(self, dest: Buffer, src: Buffer) -> None:
        """Copy all of `src` into `dest` (one of them on this device); into a bool buffer, nonzero bytes become 1."""
        if dest.info.fmt == "?" and src.nbytes and src.dev.file_backed and _host_memory(dest):
            # (one pass, as fast as the plain copy: compare each byte with 0 straight into the destination)
            raw = np.frombuffer(src.as_memoryview(raw=True), np.uint8)
            np.not_equal(raw, 0, out=np.frombuffer(dest.as_memoryview(raw=True), np.bool_))
        elif (fixed := bool_bytes_fixed(dest, src)) is not None:
            dest.copyin(fixed)
        else:
            dest.copy_from(src)


def bool_bytes_fixed(dest: Buffer, src: Buffer) -> np.ndarray | None:
    """For a copy of a file's bytes `src` into a bool buffer `dest` where some byte is neither 0 nor 1: the bytes to
    copy instead (each nonzero byte 1). None when the copy may take the bytes as they are (devices that copy a file
    themselves, like USB's, ask this first)."""
    if dest.info.fmt != "?" or not src.nbytes or not src.dev.file_backed:
        return None
    raw = np.frombuffer(src.as_memoryview(raw=True), np.uint8)
    return np.not_equal(raw, 0).view(np.uint8) if raw.max() > 1 else None


register_device("DISK", DiskDevice, suffix=lambda rest: rest or None, forms=("DISK:<path>",), probe=False,
                file_backed=DiskDevice.file_backed)  # fmt: skip


def _host_memory(buf: Buffer) -> bool:
    """buf is writable memory the host sees (not a file: a file's mapping may be read-only)."""
    return bool(buf.dev.host_visible and not buf.dev.file_backed)
