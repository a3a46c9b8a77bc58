"""Buffer: a typed region of device memory, allocated lazily, with views at byte offsets and host copies."""

from __future__ import annotations

from typing import Any

import numpy as np

from speck.hcq.allocator import DEFAULT_OPTIONS, BufferOptions, check_copy_size
from speck.hcq.dtypes import DTypeInfo, dtype_info
from speck.hcq.dtypes import _cache as _info_cache
from speck.hcq.errors import BufferStateError, HCQTypeError, HCQValueError
from speck.hcq.interfaces import DeviceLike
from speck.hcq.registry import Device

_open_devices = Device._open  # the registry's opened devices by every name they were asked for


def _as_bytes_view(data: Any) -> memoryview:
    try:
        mv = data if isinstance(data, memoryview) else memoryview(data)
    except TypeError:
        raise HCQTypeError(
            f"expected host memory (bytes, bytearray, a numpy array...), got {type(data).__name__}"
        ) from None
    if "O" in mv.format:  # (Python object pointers: copied out over, the array crashes the process at its next use)
        raise HCQTypeError(f"expected host memory of plain data, got one of Python objects (format {mv.format!r}); "
                           "convert it to a numeric array first")  # fmt: skip
    if not mv.c_contiguous:
        raise HCQValueError(
            f"expected C-contiguous host memory, got a non-contiguous {mv.format!r} view of shape {mv.shape}"
        )
    if mv.nbytes == 0:  # (cast() refuses a shape with a 0 in it)
        return memoryview(b"") if mv.readonly else memoryview(bytearray())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _size(size: Any) -> int:
    """A buffer's element count as an int (a numpy int converted), else a named error (not a later TypeError)."""
    if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise HCQTypeError(f"buffer size must be an int number of elements, got {type(size).__name__} {size!r:.40}")
    if (n := int(size.__index__())) < 0:
        raise HCQValueError(f"buffer size must be >= 0 elements, got {n}")
    return n


class Buffer:
    """`size` elements of `dtype` on `device` (a device name; canonicalised). Memory is allocated on first use
    (copyin, a kernel call, `ensure_allocated`), taken from the device allocator's LRU cache when possible, and
    given back when the buffer is collected or `deallocate`d. `view(size, dtype, offset)` makes a buffer sharing
    this one's memory at a byte offset. `dtype` is anything with .itemsize/.fmt or a numpy dtype."""

    __slots__ = (
        "__weakref__",
        "_base",
        "_opaque",
        "dev",
        "device",
        "dtype",
        "info",
        "nbytes",
        "offset",
        "options",
        "size",
        "_addr",
        "_addr_of",
    )

    # counts the times a live Buffer's memory moved (exchange_memory, deallocate): whoever keeps Buffers bound by
    # identity (a replayed plan's device graph) checks addresses again when it changed
    moves = 0

    def __init__(
        self,
        device: str,
        size: int,
        dtype: Any,
        options: BufferOptions | None = None,
        *,
        base: Buffer | None = None,
        offset: int = 0,
        preallocate: bool = False,
    ) -> None:
        if type(size) is not int or size < 0:
            size = _size(size)
        if base is not None:
            self.dev: DeviceLike = base.dev
        elif (dev := _open_devices.get(device)) is not None:  # an opened device by its name: one dict lookup
            self.dev = dev
        else:
            self.dev = Device[device]
        self.device: str = self.dev.name
        self.size, self.dtype = size, dtype
        try:
            self.info: DTypeInfo = _info_cache[dtype]  # dtype_info's cache, without the call
        except (KeyError, TypeError):
            self.info = dtype_info(dtype)
        self.nbytes = size * self.info.itemsize
        self.options: BufferOptions = (
            options if options is not None else (base.options if base is not None else DEFAULT_OPTIONS)
        )
        self._base, self.offset = base, offset
        self._opaque: Any = None
        self._addr = 0  # cached device address, valid while the base's allocation is `_addr_of`
        self._addr_of: Any = None
        if base is not None and (offset < 0 or offset + self.nbytes > base.nbytes):
            raise HCQValueError(
                f"view of {self.nbytes} bytes at offset {offset} does not fit in a {base.nbytes}-byte buffer"
            )
        if preallocate:
            self.ensure_allocated()

    # -- allocation ---------------------------------------------------------------------------------------------
    @property
    def base(self) -> Buffer:
        """The buffer owning the memory (self unless this is a view)."""
        return self._base if self._base is not None else self

    @property
    def is_allocated(self) -> bool:
        return (self._base._opaque if self._base is not None else self._opaque) is not None

    def allocate(self, opaque: Any = None) -> Buffer:
        """Allocate now (or adopt `opaque`, an allocation made by this device's allocator). Returns self."""
        if self._base is not None:
            self._base.ensure_allocated()
            return self
        if self._opaque is not None:
            raise BufferStateError(f"{self!r} is already allocated; allocate() once, or use ensure_allocated()")
        self._opaque = opaque if opaque is not None else self.dev.allocator.alloc(self.nbytes, self.options)
        return self

    def ensure_allocated(self) -> Buffer:
        """Allocate if not yet allocated. Returns self."""
        if (self._base._opaque if self._base is not None else self._opaque) is None:  # is_allocated, inlined
            self.allocate()
        return self

    def deallocate(self) -> None:
        """Return the memory to the allocator (its LRU cache). Views never own memory."""
        if self._base is None and self._opaque is not None:
            opaque, self._opaque = self._opaque, None
            self.dev.allocator.free(opaque, self.nbytes, self.options)
            Buffer.moves += 1  # (its next memory may be elsewhere)

    def __del__(self) -> None:
        try:
            if self._base is None and self._opaque is not None:  # deallocate(), inlined: every buffer ends here
                opaque, self._opaque = self._opaque, None
                self.dev.allocator.free(opaque, self.nbytes, self.options)
        except Exception:  # a buffer whose __init__ raised, or interpreter shutdown (the allocator may be gone)
            pass

    def exchange_memory(self, other: Buffer) -> None:
        """Swap the memory of two allocated base buffers of one size on one device (each object keeps its identity
        and its views; what was in one is now in the other). Accounting is unchanged: both allocations stay live."""
        if self._base is not None or other._base is not None:
            raise HCQValueError("exchange_memory: views share their base's memory; exchange the bases")
        if (self.dev, self.nbytes, self.options) != (other.dev, other.nbytes, other.options):
            raise HCQValueError(f"exchange_memory: {self!r} and {other!r} differ in device, size or options")
        self.ensure_allocated()
        other.ensure_allocated()
        self._opaque, other._opaque = other._opaque, self._opaque
        self._addr_of = other._addr_of = None
        Buffer.moves += 1

    def make_writable(self) -> None:
        """Before an explicit write into a buffer of a file-backed device mapped for reading: map its file read-write
        (extended to the buffer's size if shorter: the write makes it that long)."""
        base = self.base
        if not base.is_allocated:
            base.options = BufferOptions(writable=True)
        elif not getattr(base.opaque, "writable", True):
            base.opaque.make_writable()

    @property
    def opaque(self) -> Any:
        """The allocator's handle for the memory holding this buffer (allocating if needed)."""
        b = self._base if self._base is not None else self
        if b._opaque is None:
            b.allocate()
        return b._opaque

    @property
    def ptr(self) -> int:
        """The device address of the first element (what a kernel receives); allocates a buffer without memory."""
        base = self._base if self._base is not None else self
        opaque = base._opaque
        if opaque is None:  # (allocate(), inlined: a fresh output buffer gets its memory here)
            allocator = self.dev.allocator
            opaque = base._opaque = allocator.alloc(base.nbytes, base.options)
        elif opaque is self._addr_of:
            return self._addr
        else:
            allocator = self.dev.allocator
        self._addr, self._addr_of = int(allocator.address(opaque)) + self.offset, opaque
        return self._addr

    def view(self, size: int, dtype: Any, offset: int = 0) -> Buffer:
        """A buffer of `size` elements of `dtype` sharing this buffer's memory from byte `offset` on."""
        return Buffer(self.device, size, dtype, base=self.base, offset=self.offset + offset)

    # -- host access --------------------------------------------------------------------------------------------
    def copyin(self, src: Any) -> Buffer:
        """Copy host data (anything exposing the buffer protocol, C-contiguous, exactly `nbytes` long) in."""
        mv = _as_bytes_view(src)
        check_copy_size(f"copyin to {self!r}", self.nbytes, mv.nbytes)
        self.dev.synchronize_if_busy()
        self.dev.allocator.copyin(self.opaque, self.offset, mv)
        return self

    def copyout(self, dest: Any) -> memoryview:
        """Copy the buffer's bytes into writable host memory `dest` of exactly `nbytes`; returns dest as bytes."""
        mv = _as_bytes_view(dest)
        if mv.readonly:
            raise HCQTypeError(f"copyout from {self!r} needs writable host memory, got read-only {type(dest).__name__}")
        check_copy_size(f"copyout from {self!r}", self.nbytes, mv.nbytes)
        self.dev.synchronize_if_busy()
        self.dev.allocator.copyout(mv, self.opaque, self.offset)
        return mv

    def copy_from(self, src: Buffer) -> Buffer:
        """Copy all of `src` (any device) into this buffer; the byte sizes must match."""
        check_copy_size(f"copy from {src!r} to {self!r}", self.nbytes, src.nbytes)
        if self.dev.host_visible and src.dev.host_visible:
            self.dev.synchronize_if_busy()
            src.dev.synchronize_if_busy()
            self.dev.allocator.copyin(self.opaque, self.offset, src.as_memoryview(raw=True))
        else:
            tmp = bytearray(src.nbytes)
            src.copyout(tmp)
            self.copyin(tmp)
        return self

    def as_memoryview(self, raw: bool = False) -> memoryview:
        """A zero-copy view of the buffer's memory (bytes when `raw` or when the dtype has no format, else cast to
        the dtype's format). Pending work on the device is waited for first."""
        self.dev.synchronize_if_busy()
        mv = self.dev.allocator.as_memoryview(self.opaque, self.offset, self.nbytes)
        if raw or self.info.fmt is None:
            return mv
        try:
            typed: memoryview = mv.cast(self.info.fmt)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return mv
        return typed

    def as_buffer(self, allow_zero_copy: bool = False, force_zero_copy: bool = False) -> memoryview:
        """The buffer's bytes on the host: a zero-copy view when allowed and the device's memory is host-visible,
        else a copy (tinygrad's name)."""
        if (allow_zero_copy or force_zero_copy) and self.dev.host_visible:
            return self.as_memoryview(raw=True)
        if force_zero_copy:
            raise BufferStateError(
                f"{self!r}: the host cannot map this device's memory; a zero-copy view is impossible"
            )
        return self.copyout(bytearray(self.nbytes))

    def numpy(self) -> np.ndarray:
        """A zero-copy numpy array over the buffer's memory where the device allows it (read-only for read-only
        mappings), else a copy."""
        if self.dev.host_visible:
            return np.frombuffer(self.as_memoryview(raw=True), dtype=self.info.numpy())
        out = np.zeros(self.size, dtype=self.info.numpy())
        self.copyout(out)
        return out

    def __repr__(self) -> str:
        view = f" view@{self.offset}" if self._base is not None else ""
        return f"<Buffer {self.device} {self.size}x{self.info.name} ({self.nbytes} B){view}>"
