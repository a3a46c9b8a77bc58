# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Tensor's dtype conversions: `cast` (over `speck.tensor.elementwise.cast`), `bitcast` (same-size reinterpretation,
a last-dim rescale built from shifts for other sizes, a byte view for a DISK file) and the shorthands (`float`,
`half`, `int`, ...)."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from speck.tensor import elementwise as ew
from speck.tensor import multi
from speck.tensor.device import file_backed
from speck.tensor.dims import as_int
from speck.tensor.errors import TensorTypeError, TensorValueError
from speck.tensor.nodes import _UINT_OF_SIZE, _dt
from speck.tensor.schedule import base_buffer, buffer_views, new_buffer_uop, view_offset
from speck.tensor.weak import materialized
from speck.tensor.writes import RESIZED_BITCASTS
from speck.uop import DType, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import DTypeLike, Tensor


class CastMixin:
    """The dtype conversions of Tensor (see the module docstring)."""

    __slots__ = ()

    def cast(self: Tensor, dtype: DTypeLike) -> Tensor:
        dt = _dt(dtype, weak_ok=True)
        if dt is None:
            raise TensorTypeError("cast needs a dtype (a DType, its name or a numpy type), got None")
        if dt == self.dtype:
            return self
        return self._new(ew.cast(self.uop, dt))

    def _materialized(self: Tensor, device: Any) -> Tensor:
        """This tensor at a concrete dtype (weak: the default one) with a device (device-less: rebuilt on
        `device`): what storage, reads and clones of it hold."""
        t = self.cast(materialized(self.uop)) if self.dtype.is_weak else self
        if t._device is None:
            u = multi._on_device(t.uop, device) if not isinstance(device, tuple) else t.uop
            t = type(self)(u, device=device)
        return t

    def bitcast(self: Tensor, dtype: DTypeLike) -> Tensor:
        """Reinterpret the bits as dtype (equal item sizes, or a last-dim rescale for different sizes)."""
        dt = _dt(dtype, weak_ok=True)
        if dt is None:
            raise TensorTypeError("bitcast needs a dtype (a DType, its name or a numpy type), got None")
        if dt.is_weak or self.dtype.is_weak:
            raise TensorTypeError(f"can't bitcast {self.dtype} to {dt}: a Python literal's dtype has no bits; cast to "
                                  "a concrete dtype first")  # fmt: skip
        if dt == self.dtype:
            return self
        on_disk = file_backed(self.device)
        if on_disk and (dt.itemsize != self.dtype.itemsize or view_offset(self.uop) is not None):
            return self._disk_bitcast(dt)  # DISK runs no kernels: a view of the file's bytes as dt
        if dt.itemsize == self.dtype.itemsize and (dt == dtypes.bool or self.dtype == dtypes.bool):
            # bool's bytes are 0 and 1: reinterpreting them is a conversion (no backend has a 1-bit bitcast)
            out = self.cast(dt) if dt != dtypes.bool else self != 0

            RESIZED_BITCASTS[out.uop] = self.uop  # an assign through it writes self
            return out
        if dt.itemsize == self.dtype.itemsize:
            return self._new(self.uop.bitcast(dt))
        return self._bitcast_resize(dt)

    def _bitcast_resize(self: Tensor, dt: DType) -> Tensor:
        """bitcast to a dtype of another item size: the last dim is rescaled by the size ratio, bytes little-endian
        (int32[2] -> uint8[8]); built from shifts on unsigned words so it stays lazy and fuses."""
        src, isz = self.dtype.itemsize, dt.itemsize
        if not self.ndim or (src < isz and as_int(self.shape[-1]) * src % isz):
            raise TensorValueError(f"bitcast {self.dtype} {self.shape} -> {dt}: the last dim's {src}-byte items don't "
                                   f"split into whole {isz}-byte ones")  # fmt: skip
        u_src, u_dst = _UINT_OF_SIZE[src], _UINT_OF_SIZE[isz]
        x = self.bitcast(u_src) if self.dtype != u_src else self
        if src > isz:  # split each word into src // isz smaller ones, lowest bytes first
            r = src // isz
            shifts = type(self)([8 * isz * k for k in range(r)], dtype=u_src, device=self.device)
            parts = (x.unsqueeze(-1) >> shifts).cast(u_dst)
            out = parts.reshape(*self.shape[:-1], as_int(self.shape[-1]) * r)
        else:  # join isz // src consecutive words into one
            r = isz // src
            shifts = type(self)([8 * src * k for k in range(r)], dtype=u_dst, device=self.device)
            words = x.reshape(*self.shape[:-1], as_int(self.shape[-1]) // r, r).cast(u_dst) << shifts
            out = words.sum(-1, dtype=u_dst)  # the shifted words' bits don't overlap: the sum is their OR
        out = out if dt == u_dst else out.bitcast(dt)

        RESIZED_BITCASTS[out.uop] = self.uop  # an assign through it writes self
        return out

    def _disk_bitcast(self: Tensor, dt: DType) -> Tensor:
        """A contiguous view of a DISK file reinterpreted as dt, the last dim rescaled by the item-size ratio (no data
        moves: the file is the storage)."""
        bb, off = base_buffer(self.uop), view_offset(self.uop)
        if bb is None or off is None or not self.ndim:
            raise TensorValueError(f"bitcast of a DISK tensor needs a contiguous view of the file, got shape "
                                   f"{self.shape}; slice contiguous rows (or move it to a device) first")  # fmt: skip
        src, last = self.dtype.itemsize, as_int(self.shape[-1])
        nbytes, byte_off = as_int(self.numel()) * src, off * src
        if (last * src) % dt.itemsize:
            raise TensorValueError(f"bitcast {self.dtype} {self.shape} -> {dt} on {self.device}: the last dim's "
                                   f"{last * src} bytes don't split into whole {dt.itemsize}-byte items")  # fmt: skip
        view = new_buffer_uop(self.device, nbytes // dt.itemsize, dt)
        buffer_views[view] = (bb, byte_off)
        return self._new(view).reshape(*self.shape[:-1], last * src // dt.itemsize)

    def float(self: Tensor) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self: Tensor) -> Tensor:
        return self.cast(dtypes.float16)

    def double(self: Tensor) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self: Tensor) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self: Tensor) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self: Tensor) -> Tensor:
        return self.cast(dtypes.int16)

    def char(self: Tensor) -> Tensor:
        return self.cast(dtypes.int8)

    def bool(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool)

    def bfloat16(self: Tensor) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def is_floating_point(self: Tensor) -> builtins.bool:
        return dtypes.is_float(self.dtype)
