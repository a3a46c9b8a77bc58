"""Reading other checkpoint containers without their libraries: `tar_extract`/`zip_extract` (members as uint8
tensors), `TensorIO` (a file object over a uint8 tensor) and `torch_load` (PyTorch checkpoints: the zip format and
the legacy pickle stream, read with a restricted unpickler - no torch import, no arbitrary code).

Stored (uncompressed) members are slices of the file tensor (DISK views read when used); deflated zip members are
decompressed on the host."""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from speck.tensor.device import file_backed
from speck.tensor.dims import as_int
from speck.tensor.tensor import Tensor
from speck.uop import DType, dtypes

FileLike = Tensor | str | os.PathLike[str]


def _file_tensor(fn: FileLike) -> Tensor:
    return fn if isinstance(fn, Tensor) else Tensor(pathlib.Path(fn))


def _host_bytes(t: Tensor) -> bytes:
    return bytes(t.to("CPU").numpy().tobytes()) if file_backed(t.device) else bytes(t.numpy().tobytes())


class TensorIO(io.RawIOBase):
    """A read-only, seekable binary file over a 1-D uint8 tensor."""

    def __init__(self, t: Tensor) -> None:
        if len(t.shape) != 1 or t.dtype != dtypes.uint8:
            raise ValueError(f"TensorIO needs a 1-D uint8 tensor, got shape {t.shape} {t.dtype}")
        self.t, self.pos = t, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        n = as_int(self.t.shape[0])
        self.pos = max(0, {io.SEEK_SET: offset, io.SEEK_CUR: self.pos + offset, io.SEEK_END: n + offset}[whence])
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), as_int(self.t.shape[0]) - self.pos)
        if n <= 0:
            return 0
        buffer[:n] = _host_bytes(self.t[self.pos : self.pos + n])
        self.pos += n
        return n


def tar_extract(fn: FileLike) -> dict[str, Tensor]:
    """The regular files of a tar archive, by member name, as uint8 tensors (slices of the archive)."""
    t = _file_tensor(fn)
    with tarfile.open(fileobj=TensorIO(t), mode="r:") as tar:
        return {m.name: t[m.offset_data : m.offset_data + m.size] for m in tar if m.isfile()}


def zip_extract(fn: FileLike) -> dict[str, Tensor]:
    """The members of a zip archive, by name, as uint8 tensors: stored members are slices of the archive, deflated
    ones are decompressed on the host."""
    t = _file_tensor(fn)
    out: dict[str, Tensor] = {}
    with zipfile.ZipFile(TensorIO(t)) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            if info.compress_type == zipfile.ZIP_STORED:
                start = _zip_data_offset(t, info)
                out[info.filename] = t[start : start + info.file_size]
            else:
                out[info.filename] = Tensor(np.frombuffer(zf.read(info), dtype=np.uint8).copy())
    return out


def _zip_data_offset(t: Tensor, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header (whose name/extra lengths may differ from the
    central directory's)."""
    head = _host_bytes(t[info.header_offset : info.header_offset + 30])
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return int(info.header_offset) + 30 + int(name_len) + int(extra_len)


# ---------------- torch_load ----------------
_STORAGES: dict[str, DType] = {
    "HalfStorage": dtypes.float16, "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64,
    "BFloat16Storage": dtypes.bfloat16, "IntStorage": dtypes.int32, "LongStorage": dtypes.int64,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool,
}  # fmt: skip
_TORCH_DTYPES: dict[str, DType] = {
    "float16": dtypes.float16, "half": dtypes.float16, "float32": dtypes.float32, "float": dtypes.float32,
    "float64": dtypes.float64, "double": dtypes.float64, "bfloat16": dtypes.bfloat16, "int32": dtypes.int32,
    "int": dtypes.int32, "int64": dtypes.int64, "long": dtypes.int64, "int16": dtypes.int16, "int8": dtypes.int8,
    "uint8": dtypes.uint8, "bool": dtypes.bool,
}  # fmt: skip


class _Dummy:
    """Stands in for a class a checkpoint names that torch_load does not know (its state is kept, unused)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _rebuild_tensor(storage: Tensor, offset: int, shape: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> Tensor:
    """A tensor from its storage (a flat tensor of the storage dtype), element offset, shape and strides."""
    shape, stride = tuple(shape), tuple(stride)
    numel = 1
    for s in shape:
        numel *= s
    contiguous = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    if numel == 0:
        return Tensor.zeros(*shape, dtype=storage.dtype)
    if stride == contiguous or numel == 1:
        return storage[offset : offset + numel].reshape(shape)
    # permuted or broadcast strides: gather on the host, then a tensor of the materialized values
    if storage.dtype == dtypes.bfloat16:
        raise AssertionError("torch_load: a bfloat16 tensor with non-contiguous strides is not supported")
    flat = storage.to("CPU").numpy() if file_backed(storage.device) else storage.numpy()
    arr = np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(s * flat.itemsize for s in stride))
    return Tensor(np.ascontiguousarray(arr), dtype=storage.dtype)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


class _StorageType:
    def __init__(self, dtype: DType) -> None:
        self.dtype = dtype


class _TorchUnpickler(pickle.Unpickler):
    """Resolves the torch names a checkpoint uses to speck stand-ins; persistent ids load storages via `storage`."""

    def __init__(self, f: Any, storage: Callable[[DType, str, int], Tensor]) -> None:
        super().__init__(f)
        self.storage = storage

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch"):
            if name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
                return _rebuild_any
            if name == "_rebuild_parameter":
                return _rebuild_parameter
            if name in _STORAGES:
                return _StorageType(_STORAGES[name])
            if name in _TORCH_DTYPES:
                return _TORCH_DTYPES[name]
            return _Dummy
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module in ("builtins", "__builtin__") and name in ("set", "frozenset", "slice", "tuple", "list", "dict"):
            return getattr(__builtins__ if isinstance(__builtins__, dict) else __builtins__, name, _Dummy)
        return _Dummy

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"torch_load: unsupported persistent id {pid!r}")
        kind, key, numel = pid[1], str(pid[2]), int(pid[4])
        dtype = kind.dtype if isinstance(kind, _StorageType) else kind if isinstance(kind, DType) else None
        if dtype is None:
            raise pickle.UnpicklingError(f"torch_load: storage {key} has an unknown type {kind!r}")
        return self.storage(dtype, key, numel)


def _as_dtype(raw: Tensor, dtype: DType, numel: int) -> Tensor:
    """A uint8 file slice as numel elements of dtype."""
    if dtype.fmt is None or file_backed(raw.device):
        host = raw.to("CPU") if file_backed(raw.device) else raw
        return host.bitcast(dtype) if dtype.itemsize == 1 else host.contiguous().bitcast(dtype)[:numel]
    return raw.bitcast(dtype)[:numel]


def torch_load(fn: FileLike) -> Any:
    """Load a PyTorch checkpoint (zip format or legacy pickle stream) without PyTorch: the unpickled structure with
    tensors in place of torch tensors. Unknown classes become inert stand-ins."""
    t = _file_tensor(fn)
    head = _host_bytes(t[:4]) if as_int(t.shape[0]) >= 4 else b""
    if head == b"PK\x03\x04":
        members = zip_extract(t)
        pkl = next((k for k in members if k.endswith("data.pkl")), None)
        if pkl is None:
            raise ValueError(f"torch_load: {fn} is a zip file without a data.pkl; not a PyTorch checkpoint")
        prefix = pkl[: -len("data.pkl")]

        def zip_storage(dtype: DType, key: str, numel: int) -> Tensor:
            return _as_dtype(members[f"{prefix}data/{key}"], dtype, numel)

        return _TorchUnpickler(io.BytesIO(_host_bytes(members[pkl])), zip_storage).load()
    return _legacy_load(t, fn)


def _legacy_load(t: Tensor, fn: FileLike) -> Any:
    """The pre-1.6 format: magic, protocol and system-info pickles, the object pickle, the list of storage keys, then
    each storage as an 8-byte element count and its bytes."""
    f = TensorIO(t)
    wanted: dict[str, tuple[DType, int]] = {}

    def legacy_storage(dtype: DType, key: str, numel: int) -> Tensor:
        wanted[key] = (dtype, numel)
        return _Pending(key)  # type: ignore[return-value]

    try:
        magic = pickle.load(f)
    except Exception as e:
        raise ValueError(f"torch_load: {fn} is neither a zip nor a legacy PyTorch checkpoint ({e})") from e
    if magic != 0x1950A86A20F9469CFC6C:
        raise ValueError(f"torch_load: {fn} has no PyTorch magic number; not a (legacy) PyTorch checkpoint")
    pickle.load(f)
    pickle.load(f)
    obj = _TorchUnpickler(f, legacy_storage).load()
    keys = pickle.load(f)
    storages: dict[str, Tensor] = {}
    for key in keys:
        dtype, _ = wanted[str(key)]
        (n,) = struct.unpack("<q", f.read(8))
        start = f.tell()
        storages[str(key)] = _as_dtype(t[start : start + n * dtype.itemsize], dtype, n)
        f.seek(start + n * dtype.itemsize)
    return _resolve(obj, storages)


class _Pending:
    """A legacy storage not read yet (its bytes follow the object pickle)."""

    def __init__(self, key: str) -> None:
        self.key = key


def _resolve(obj: Any, storages: dict[str, Tensor]) -> Any:
    if isinstance(obj, _LegacyTensor):
        return _rebuild_tensor(storages[obj.storage.key], *obj.args)
    if isinstance(obj, dict):
        return type(obj)((k, _resolve(v, storages)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_resolve(v, storages) for v in obj)
    return obj


class _LegacyTensor:
    def __init__(self, storage: _Pending, *args: Any) -> None:
        self.storage, self.args = storage, args


def _rebuild_any(storage: Any, *args: Any) -> Any:
    """Rebuild now when the storage is loaded (zip format), later when it follows the pickle (legacy format)."""
    return _LegacyTensor(storage, *args) if isinstance(storage, _Pending) else _rebuild_tensor(storage, *args)


__all__ = ["TensorIO", "tar_extract", "torch_load", "zip_extract"]
