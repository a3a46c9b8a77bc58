# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Creation: empty, from_blob, full, zeros, ones, arange, linspace, eye, const and the *_like constructors. The
methods are added to Tensor as a mixin like the other op modules'; the constructors are classmethods and build
results with `cls` (methods with `type(self)`), never by importing tensor.py."""

from __future__ import annotations

import ctypes
import math
import mmap
import numbers
import pathlib
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.codegen.numeric import storage_np as np_dtype
from speck.hcq import Buffer as HcqBuffer
from speck.hcq import Device
from speck.hcq.allocator import BufferOptions, HostAllocator
from speck.hcq.memory import ExternalMemory
from speck.tensor import multi
from speck.tensor.device import canonical
from speck.tensor.dims import argfix, flag, shape_arg
from speck.tensor.dims import countable as _countable
from speck.tensor.dims import whole as _count
from speck.tensor.errors import (
    ShardingError,
    TensorOverflowError,
    TensorTypeError,
    TensorValueError,
)
from speck.tensor.multi import MultiUOp
from speck.tensor.nodes import _dt, _iota_uop
from speck.tensor.pyutils import fetch, gunzip_local
from speck.tensor.schedule import buffer_map, external_buffers, max_dim, new_buffer_uop
from speck.tensor.weak import materialized
from speck.uop import DType, UOp, dtypes
from speck.uop.helpers import prod
from speck.uop.uop import ssimplify

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

Scalar = int | float | bool
DTypeLike = DType | str
DeviceLike = str | tuple[str, ...] | list[str]


def _mapped(ptr: int, n: int) -> bool:
    """Whether every page of [ptr, ptr + n) is mapped in this process (Linux's mincore fails with ENOMEM on an
    unmapped page; checked a GiB of addresses at a time). True where the OS can't tell us."""
    if not sys.platform.startswith("linux"):
        return True
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page, chunk = mmap.PAGESIZE, 1 << 30
    vec = ctypes.create_string_buffer(chunk // page + 1)
    addr, end = ptr - ptr % page, ptr + n
    while addr < end:
        length = min(chunk, end - addr)
        if mincore(addr, length, vec) != 0:
            return False
        addr += length
    return True


def _bound(what: str, x: Any) -> int | float:
    """An arange bound as a Python int or float (numpy scalars too: np.int64(3) is an int bound, as in numpy)."""
    if isinstance(x, numbers.Integral):
        return int(x)
    if not isinstance(x, numbers.Real):
        raise TensorTypeError(f"arange: {what} must be a real number, got {x!r} ({type(x).__name__})")
    if not math.isfinite(x):
        raise TensorValueError(f"arange: {what} must be finite, got {x}: a range with an infinite or NaN end has no "
                               "size")  # fmt: skip
    return float(x)


class CreationMixin:
    """Constructors of Tensor."""

    __slots__ = ()

    @classmethod
    def empty(
        cls: type[Tensor], *shape: Any, device: DeviceLike | None = None, dtype: DTypeLike | None = None, **kw: Any
    ) -> Tensor:
        """An uninitialised tensor (a fresh buffer)."""
        sh = _countable(shape_arg("empty", argfix(*shape)))
        dt = _dt(dtype) or dtypes.default_float
        if isinstance(device, (tuple, list)):
            devs = multi.canonical_devices(device)
            return cls(multi.per_device(devs, lambda d: cls.empty(*sh, device=d, dtype=dt)))
        dev = canonical(device)
        size = prod(max_dim(s) for s in sh)
        buf = new_buffer_uop(dev, int(size), dt)
        t = cls(buf.reshape(sh) if sh != (size,) else buf, device=dev, requires_grad=kw.get("requires_grad"))
        return t

    @classmethod
    def from_url(cls: type[Tensor], url: str, gunzip: bool = False, **kw: Any) -> Tensor:
        """The content of url as a DISK tensor (uint8 unless dtype= is given; kw go to Tensor()): downloaded into
        the download cache once (speck.tensor.pyutils.fetch), `gunzip` storing the decompressed body. A file://
        url or local path is read where it is (decompressed into the cache when gunzip)."""
        path = fetch(url, gunzip=gunzip)
        if gunzip and (url.startswith(("/", ".", "file://"))):
            path = gunzip_local(path)
        return cls(pathlib.Path(path), **kw)

    @classmethod
    def from_blob(cls: type[Tensor], ptr: int, shape: tuple[int, ...], **kw: Any) -> Tensor:
        """A tensor over external host memory at address ptr (not copied until realized, not owned: the memory
        must outlive the tensor's use). Bool memory must hold bytes 0 and 1 (kernels read a bool byte as it is)."""
        dt = _dt(kw.get("dtype")) or dtypes.default_float
        if dt.fmt is None:
            raise TensorTypeError(
                f"from_blob: {dt} has no host representation; wrap the bits as an int dtype and bitcast"
            )
        sh = _countable(shape_arg("from_blob", argfix(shape)))
        n = int(prod(sh)) * dt.itemsize
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TensorTypeError(f"from_blob: ptr must be an int address, got {ptr!r} ({type(ptr).__name__})")
        if n and not 0 < ptr <= 2**64 - n:
            raise TensorValueError(f"from_blob: ptr must be a non-null address with {n} bytes after it, got {ptr}")
        if n and not _mapped(ptr, n):  # (reading an unmapped address kills the process)
            raise TensorValueError(f"from_blob: the {n} bytes at {ptr:#x} are not mapped memory of this process; pass "
                                   "the address of a live buffer (e.g. a numpy array's .ctypes.data)")  # fmt: skip
        dev = canonical(kw.get("device"))
        if dt == dtypes.bool and n:
            _check_bool_blob(ptr, n)
        if n and isinstance(Device[dev].allocator, HostAllocator):
            # kernels of a host device read the memory itself: later changes to it are seen, nothing is copied

            buf = new_buffer_uop(dev, int(prod(sh)), dt)
            buffer_map[buf] = HcqBuffer(dev, int(prod(sh)), dt, BufferOptions(lru=False)).allocate(
                ExternalMemory(ptr, n)
            )
            external_buffers.add(buf)
            out = cls(buf.reshape(sh) if sh != (int(prod(sh)),) else buf, device=dev)
            out.requires_grad = kw.get("requires_grad")
            return out
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)) if n else np.zeros(0, np.uint8)
        return cls(raw.view(np_dtype(dt)).reshape(sh), device=kw.get("device"), dtype=dt,
                      requires_grad=kw.get("requires_grad"))  # fmt: skip

    @classmethod
    def invalids(cls: type[Tensor], *shape: Any, **kw: Any) -> Tensor:
        """A tensor whose values are undefined until something writes them (a custom kernel's output): empty()."""
        return cls.empty(*shape, **kw)

    @classmethod
    def full(cls: type[Tensor], shape: Any, fill_value: Scalar, device: DeviceLike | None = None,
             dtype: DTypeLike | None = None, buffer: bool = True, **kw: Any) -> Tensor:  # fmt: skip
        """A tensor of `shape` filled with `fill_value` (a lazy broadcast constant: no buffer until realized), on
        `device`. Its dtype is the fill's made concrete (an int beyond the default int: int64). buffer=False: a
        device-less constant instead, whose literal dtype stays weak."""
        buffer = flag("full", "buffer", buffer)
        sh = shape_arg("full", tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
        if any(isinstance(s, int) and s < 0 for s in sh):
            raise TensorValueError(f"shape {sh} has a negative dimension")
        _countable(sh)
        if isinstance(device, (tuple, list)):
            if buffer:  # replicated: the constant built on every device
                devs = multi.canonical_devices(device)
                out = cls(multi.per_device(devs, lambda d: cls.full(sh, fill_value, device=d, dtype=dtype)))
                out.requires_grad = kw.get("requires_grad")
                return out
            device = None
        if isinstance(fill_value, cls):
            if fill_value.ndim:
                raise TensorValueError(f"full: fill_value must be a scalar or 0-d tensor, got shape {fill_value.shape}")
            c = fill_value if dtype is None else fill_value.cast(dtype)
            if buffer and c.device is None:
                c = c._materialized(canonical(device))
            elif buffer:
                c = c.cast(materialized(c.uop)) if c.dtype.is_weak else c
                c = c.to(device) if device is not None else c
        else:
            c = cls(fill_value, dtype=_dt(dtype, weak_ok=True))
            if c.ndim:  # (an array or a list: its buffer's device name read as the value, "convert 'CPU' to float")
                raise TensorValueError(f"full: fill_value must be a scalar or 0-d tensor, got "
                                       f"{type(fill_value).__name__} of shape {c.shape}; pass one number")  # fmt: skip
            if buffer:
                c = c.cast(materialized(c.uop)) if c.dtype.is_weak else c
                c = cls._constant(c.uop.arg, c.dtype, canonical(device))
        out = c.reshape((1,) * len(sh)).expand(sh) if sh else c
        out.requires_grad = kw.get("requires_grad")
        return out

    @classmethod
    def zeros(cls: type[Tensor], *shape: Any, **kw: Any) -> Tensor:
        dt = kw.get("dtype")  # (None: the default float; '' names no dtype, it is no default)
        return cls.full(
            shape_arg("zeros", argfix(*shape)), 0.0, **{**kw, "dtype": dtypes.default_float if dt is None else dt}
        )

    @classmethod
    def ones(cls: type[Tensor], *shape: Any, **kw: Any) -> Tensor:
        dt = kw.get("dtype")  # (None: the default float; '' names no dtype, it is no default)
        return cls.full(
            shape_arg("ones", argfix(*shape)), 1.0, **{**kw, "dtype": dtypes.default_float if dt is None else dt}
        )

    @classmethod
    def arange(cls: type[Tensor], start: Scalar | UOp, stop: Scalar | UOp | None = None, step: Scalar | UOp = 1,
               **kw: Any) -> Tensor:  # fmt: skip
        """Values from start (inclusive) to stop (exclusive) by step: the default int when all three are ints (int64
        when the range doesn't fit it), else the default float. A range dtype can't hold: OverflowError."""
        if stop is None:
            start, stop = 0, start
        if any(isinstance(x, UOp) for x in (start, stop, step)):
            if step == 0:
                raise TensorValueError("arange: step must not be 0")
            return _symbolic_arange(cls, start, stop, step, **kw)
        start, stop, step = (_bound(what, x) for what, x in (("start", start), ("stop", stop), ("step", step)))
        if step == 0:
            raise TensorValueError("arange: step must not be 0")
        devless = kw.get("device") is None  # no device given: device-less (it takes the device of what it meets)
        ints = all(isinstance(x, int) for x in (start, stop, step))
        # the count exactly for ints (a float quotient dropped elements past 2**53: arange(2**60, 0, -3) ended at 67)
        n = max(int(-((start - stop) // step)) if ints else math.ceil((stop - start) / step), 0)
        _countable((n,))  # (arange(2**64)[-1] read -1; a step of 1e-300 made a dim of 1e300 elements)
        last = start + (n - 1) * step if n else start
        dt = _dt(kw.pop("dtype", None))
        if dt is None:
            dt = dtypes.default_int if ints else dtypes.default_float
            # past int32: int64; past int64 (arange(2**62, 2**63 + 1, 2**61) ended at -2**63): uint64 as for
            # Tensor([2**63]), when all the values are >= 0; else no dtype holds them
            for wider in (dtypes.int64, dtypes.uint64):
                if not ints or all(dtypes.min(dt) <= v <= dtypes.max(dt) for v in (start, last)):
                    break
                dt = wider
            if ints and not all(dtypes.min(dt) <= v <= dtypes.max(dt) for v in (start, last)):
                raise TensorOverflowError(f"arange({start}, {stop}, {step}) runs from {start} to {last}, which no "
                                          "int dtype holds (int64 and uint64 both miss one end); split the range or "
                                          "pass float bounds")  # fmt: skip
        elif not dtypes.is_float(dt) and not all(dtypes.min(dt) <= v <= dtypes.max(dt) for v in (start, last)):
            raise TensorOverflowError(f"arange({start}, {stop}, {step}) doesn't fit {dt} "
                                      f"[{dtypes.min(dt)}, {dtypes.max(dt)}]")  # fmt: skip
        if isinstance(kw.get("device"), (tuple, list)):
            devs = multi.canonical_devices(kw.pop("device"))
            return cls(multi.per_device(devs, lambda d: cls.arange(start, stop, step, dtype=dt, device=d, **kw)))
        dev = canonical(kw.get("device"))
        if n == 0:
            return cls.full((0,), 0, dtype=dt, device=dev, buffer=not devless)
        idx = cls(_iota_uop(n, dev), device=dev)
        idx._device = None if devless else dev
        if dtypes.is_float(dt):
            return (idx.cast(dt) * step + start).cast(dt)
        if not ints:  # an int dtype over float bounds: the float values, truncated (torch; 0.5, 1.5 -> 0, 1)
            wide = dtypes.float64 if isinstance(step, float) or isinstance(start, float) else dtypes.default_float
            return (idx.cast(wide) * step + start).cast(dt)
        if step < 0 and dtypes.is_unsigned(dt):  # (a negative step is no value of an unsigned dtype: count down)
            return start - idx.cast(dt) * -step
        return (idx.cast(dt) * step + start) if (step, start) != (1, 0) else idx.cast(dt)

    @classmethod
    def const(cls: type[Tensor], value: Scalar, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        """A 0-d device-less constant (dtype from the value unless given: weak for an int or float)."""
        return cls(value, dtype=dtype)

    def const_like(self: Tensor, value: Scalar) -> Tensor:
        """value broadcast to self's shape, with self's dtype and device (no buffer)."""
        return type(self).full(self.shape, value, dtype=self.dtype, device=self.device)

    @classmethod
    def linspace(cls: type[Tensor], start: Scalar, stop: Scalar, steps: int, **kw: Any) -> Tensor:
        dt = _dt(kw.pop("dtype", None)) or dtypes.default_float
        steps = _count("linspace", "steps", steps)
        if steps < 0:
            raise TensorValueError(f"linspace: steps must be >= 0, got {steps}")
        if dt == dtypes.bool:
            raise TensorValueError("linspace can't make a bool tensor; use a numeric dtype")
        if steps == 1:
            return cls.full((1,), start, dtype=dt, device=kw.get("device"), buffer=kw.get("device") is not None)
        # in float64 for float64 and for ints wider than float32's 24-bit significand (linspace(1, 16777217, 2,
        # dtype=int32) ended at 16777216)
        wide = dt == dtypes.float64 or (dtypes.is_int(dt) and dt.itemsize >= 4)
        return (cls.arange(steps, **kw).cast(dtypes.float64 if wide else dtypes.float32) *
                ((stop - start) / max(steps - 1, 1)) + start).cast(dt)  # fmt: skip

    @classmethod
    def eye(cls: type[Tensor], n: int, m: int | None = None, **kw: Any) -> Tensor:
        dt = _dt(kw.pop("dtype", None)) or dtypes.default_float
        n = _count("eye", "n", n)
        m = n if m is None else _count("eye", "m", m)
        if n < 0 or m < 0:
            raise TensorValueError(f"eye: sizes must be >= 0, got {n}, {m}")
        _countable((n, m))  # (eye(2**32) was a 2**64-element tensor)
        r = cls.arange(n, **kw).unsqueeze(1)
        c = cls.arange(m, **kw).unsqueeze(0)
        return (r == c).cast(dt)

    def full_like(self: Tensor, fill_value: Scalar, **kw: Any) -> Tensor:
        if isinstance(self.uop, MultiUOp):
            _no_device_for_sharded(self, kw)
            return multi.shard_like(type(self).full(self.shape, fill_value, dtype=kw.pop("dtype", self.dtype),
                                                device=self.uop.device), self)  # fmt: skip
        dt, dev = kw.pop("dtype", self.dtype), kw.pop("device", self.device)
        return type(self).full(self.shape, fill_value, dtype=dt, device=dev)

    def zeros_like(self: Tensor, **kw: Any) -> Tensor:
        return self.full_like(0, **kw)

    def ones_like(self: Tensor, **kw: Any) -> Tensor:
        return self.full_like(1, **kw)

    def empty_like(self: Tensor, **kw: Any) -> Tensor:
        if isinstance(self.uop, MultiUOp):
            return self._like_shards(
                lambda s, d, i: type(self).empty(*s.shape, device=d, dtype=kw.get("dtype", self.dtype)), kw
            )
        return type(self).empty(self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device))

    def _like_shards(self: Tensor, make: Any, kw: dict[str, Any]) -> Tensor:
        """A new tensor sharded like this one, each shard made by make(shard uop, device, index) independently."""
        u = self.uop
        assert isinstance(u, MultiUOp)
        _no_device_for_sharded(self, kw)
        return type(self)(MultiUOp.leaf([make(s, d, i).uop for i, (s, d) in enumerate(zip(u.shards, u.device))], u.axis,
                                    u.device))  # fmt: skip


def _no_device_for_sharded(t: Tensor, kw: dict[str, Any]) -> None:
    if "device" in kw:
        raise ShardingError(f"*_like of a tensor sharded over {t.device} makes a tensor sharded the same way; "
                            f"device={kw['device']!r} can't be given (use .to() on the result)")  # fmt: skip


def _symbolic_arange(cls: type[Tensor], start: Any, stop: Any, step: Any, **kw: Any) -> Tensor:
    """arange with a Variable start or stop (a symbolic length): integer bounds, a concrete int step, the default
    int dtype unless given. Its length must be >= 0 for every value the Variables may take."""
    if isinstance(step, UOp) or not all(isinstance(x, (int, UOp)) for x in (start, stop, step)):
        raise TensorTypeError(
            f"arange with a Variable bound needs int start/stop and a concrete int step, got start={start!r}, "
            f"stop={stop!r}, step={step!r}"
        )
    if isinstance(kw.get("device"), (tuple, list)):
        raise TensorValueError("arange with a Variable bound can't be placed on several devices at once")
    dt = _dt(kw.pop("dtype", None)) or dtypes.default_int
    span = stop - start if step > 0 else start - stop
    n = ssimplify(span if abs(step) == 1 else (span + (abs(step) - 1)) // abs(step))
    dev = canonical(kw.get("device"))
    idx = cls(_iota_uop(n, dev), device=dev).cast(dt)
    return idx * step + start if (step, start) != (1, 0) else idx


def _check_bool_blob(ptr: int, n: int) -> None:
    """Bool memory handed to from_blob holds bytes 0 and 1 only: a host kernel reads the memory itself, and a bool
    byte of 2 would be used as it is (numpy, like a file's bool bytes, reads any nonzero byte as True)."""
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))
    if (bad := np.flatnonzero(raw > 1)).size:
        raise TensorValueError(
            f"from_blob(dtype=bool): the memory holds byte {int(raw[bad[0]])} at offset {int(bad[0])} ({bad.size} "
            "bytes other than 0/1); a bool is the byte 0 or 1. Wrap the memory as uint8 and compare: "
            "Tensor.from_blob(ptr, shape, dtype=dtypes.uint8) != 0"
        )
