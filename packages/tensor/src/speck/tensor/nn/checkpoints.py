"""Reading other checkpoint containers without their libraries: `tar_extract`/`zip_extract` (members as uint8
tensors), `TensorIO` (a file object over a uint8 tensor) and `torch_load` (PyTorch checkpoints: the zip format and
the legacy pickle stream).

These files may come from anyone, so nothing in them is trusted. Every pickle goes through one restricted unpickler
that resolves only the names a checkpoint of tensors needs (an allow-list like torch.load(weights_only=True)); any
other name raises UnsafePickleError as soon as it is read, before anything could call it. Every tensor view (shape,
strides, offset) is checked against its storage, every storage against the bytes in the file, and a deflated zip
member may expand to at most MAX_DECOMPRESSED_BYTES. Whatever is wrong ends in a named error: ArchiveError for the
containers, TorchLoadError (UnsafePickleError) for checkpoints; both are CheckpointErrors.

Stored (uncompressed) members are slices of the file tensor (DISK views read when used); deflated zip members are
decompressed on the host. Both are checked against the CRC-32 the zip records: a deflated one as it is inflated, a
stored one in a file when its bytes are read (CorruptFileError from the read; see _stored_member)."""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from speck.tensor.device import file_backed
from speck.tensor.dims import as_int
from speck.tensor.errors import (
    ArchiveError,
    CheckpointError,
    TensorTypeError,
    TensorValueError,
    TorchLoadError,
    UnsafePickleError,
)
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import base_buffer, view_buffer_uop, view_offset
from speck.tensor.settings import MAX_DECOMPRESSED_BYTES
from speck.tensor.tensor import Tensor
from speck.uop import DType, dtypes

FileLike = Tensor | str | os.PathLike[str]


def _file_tensor(fn: FileLike) -> Tensor:
    if not isinstance(fn, (Tensor, str, os.PathLike)):
        raise TensorTypeError(f"expected a path (str or os.PathLike) or a 1-D uint8 tensor of a file's bytes, got "
                              f"{type(fn).__name__}")  # fmt: skip
    return fn if isinstance(fn, Tensor) else Tensor(pathlib.Path(fn))


def _host_bytes(t: Tensor) -> bytes:
    return bytes(t.to("CPU").numpy().tobytes()) if file_backed(t.device) else bytes(t.numpy().tobytes())


@contextmanager
def named_errors(error: type[CheckpointError], what: str, passing: tuple[type[BaseException], ...] = ()
                 ) -> Iterator[None]:  # fmt: skip
    """Turn whatever a parser of untrusted bytes raises (zipfile, tarfile, pickle, struct, a RecursionError of a
    deeply nested structure...) into `error` naming `what`; CheckpointErrors and `passing` pass through as they
    are."""
    try:
        yield
    except CheckpointError:
        raise
    except passing:
        raise
    except Exception as e:
        raise error(f"{what}: {type(e).__name__}: {e}") from e


class TensorIO(io.RawIOBase):
    """A read-only, seekable binary file over a 1-D uint8 tensor."""

    def __init__(self, t: Tensor) -> None:
        if len(t.shape) != 1 or t.dtype != dtypes.uint8:
            raise TensorValueError(f"TensorIO needs a 1-D uint8 tensor, got shape {t.shape} {t.dtype}")
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

    def read(self, size: int | None = -1) -> bytes:
        # never more than what is left: a reader asking for 2**60 bytes (a pickle's claimed length) gets the rest
        left = max(0, as_int(self.t.shape[0]) - self.pos)
        return super().read(left if size is None or size < 0 else min(size, left)) or b""

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), as_int(self.t.shape[0]) - self.pos)
        if n <= 0:
            return 0
        buffer[:n] = _host_bytes(self.t[self.pos : self.pos + n])
        self.pos += n
        return n


def tar_extract(fn: FileLike) -> dict[str, Tensor]:
    """The regular files of a tar archive, by member name, as uint8 tensors: slices of the archive, except sparse
    files, which are expanded on the host (each at most MAX_DECOMPRESSED_BYTES)."""
    t = _file_tensor(fn)
    size, ceiling = as_int(t.shape[0]), int(MAX_DECOMPRESSED_BYTES.value)
    out: dict[str, Tensor] = {}
    with named_errors(ArchiveError, f"tar_extract({fn}): not a readable tar archive"):
        with tarfile.open(fileobj=TensorIO(t), mode="r:") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                if m.name in out:  # (tar tools keep the last copy; a dict would drop one of the two silently)
                    raise ArchiveError(f"tar_extract({fn}): member {m.name!r} appears twice; extract the archive with "
                                       "a tar tool, which keeps the last copy")  # fmt: skip
                if m.sparse is not None:  # its bytes in the archive are its data runs without the holes: expand
                    if m.size > ceiling:
                        raise ArchiveError(f"tar_extract({fn}): sparse member {m.name!r} expands to {m.size} bytes, "
                                           f"more than MAX_DECOMPRESSED_BYTES={ceiling}; if you trust the file, "
                                           "raise it or extract the archive with a tar tool")  # fmt: skip
                    f = tar.extractfile(m)
                    assert f is not None  # (a regular file always has one)
                    out[m.name] = Tensor(np.frombuffer(f.read(), dtype=np.uint8).copy())
                    continue
                if m.offset_data + m.size > size:
                    raise ArchiveError(f"tar_extract({fn}): member {m.name!r} needs bytes [{m.offset_data}, "
                                       f"{m.offset_data + m.size}) of a {size}-byte archive; it is "
                                       "truncated")  # fmt: skip
                out[m.name] = t[m.offset_data : m.offset_data + m.size]
    return out


def zip_extract(fn: FileLike) -> dict[str, Tensor]:
    """The members of a zip archive, by name, as uint8 tensors: stored members are slices of the archive, deflated
    ones are decompressed on the host (each, and all together, at most MAX_DECOMPRESSED_BYTES)."""
    t = _file_tensor(fn)
    size, ceiling, expanded = as_int(t.shape[0]), int(MAX_DECOMPRESSED_BYTES.value), 0
    out: dict[str, Tensor] = {}
    with named_errors(ArchiveError, f"zip_extract({fn}): not a readable zip archive"):
        with zipfile.ZipFile(TensorIO(t)) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if info.filename in out:  # (the dict would keep one of the two silently)
                    raise ArchiveError(f"zip_extract({fn}): member {info.filename!r} appears twice; the archive is "
                                       "corrupt or crafted")  # fmt: skip
                if info.flag_bits & 0x1:  # (a stored one would come back as its ciphertext)
                    raise ArchiveError(f"zip_extract({fn}): member {info.filename!r} is encrypted, which zip_extract "
                                       "does not read; extract it with a zip tool and its password")  # fmt: skip
                if info.compress_type == zipfile.ZIP_STORED:
                    if info.compress_size != info.file_size:  # (the slice would end inside the next member)
                        raise ArchiveError(f"zip_extract({fn}): stored member {info.filename!r} claims "
                                           f"{info.file_size} bytes but holds {info.compress_size}; the archive is "
                                           "corrupt")  # fmt: skip
                    start = _zip_data_offset(t, info, fn)
                    if start + info.file_size > size:
                        end = start + info.file_size
                        raise ArchiveError(f"zip_extract({fn}): member {info.filename!r} needs bytes [{start}, {end}) "
                                           f"of a {size}-byte archive; it is truncated")  # fmt: skip
                    out[info.filename] = _stored_member(t, start, info, fn)
                    continue
                expanded += info.file_size  # zipfile never inflates a member past the size its header gives
                if expanded > ceiling:
                    raise ArchiveError(
                        f"zip_extract({fn}): member {info.filename!r} expands to {info.file_size} bytes, and the "
                        f"archive's deflated members to {expanded} bytes so far: more than MAX_DECOMPRESSED_BYTES="
                        f"{ceiling}. If you trust the file, raise it (MAX_DECOMPRESSED_BYTES=<bytes> in the "
                        "environment, or Context(MAX_DECOMPRESSED_BYTES=...))"
                    )
                out[info.filename] = Tensor(np.frombuffer(zf.read(info), dtype=np.uint8).copy())
    return out


def _stored_member(t: Tensor, start: int, info: zipfile.ZipInfo, fn: FileLike) -> Tensor:
    """A stored member's bytes, checked against the CRC-32 the zip records. In a file (DISK) the member is a buffer of
    its own over its range of the mapping, checked when that buffer is read (loading stays lazy; a read that copies
    only part of it, such as one tensor of a storage several share, is not checked); bytes held elsewhere are checked
    now. A CRC of 0 is not checked: torch.save under set_crc32_options(False) writes 0 for every member."""
    n, crc, what = info.file_size, info.CRC, f"zip member {info.filename!r} of {fn}"
    bb, off = base_buffer(t.uop), view_offset(t.uop)
    if bb is None or off is None or not file_backed(t.device) or n == 0:
        member = t[start : start + n]
        if crc and n and (found := zlib.crc32(_host_bytes(member))) != crc:
            raise ArchiveError(f"zip_extract({fn}): {what} has CRC-32 {found:#010x}, but the archive records "
                               f"{crc:#010x}: the archive is corrupt; fetch or copy it again")  # fmt: skip
        return member
    view = view_buffer_uop(bb, off + start, n)
    if crc:
        whole = get_buffer(bb)  # (the file's mapping, or a view of it: a zip inside another archive)
        whole.dev.allocator.expect_crc32(whole.opaque, whole.offset + off + start, n, crc, what)
    return Tensor(view, device=t.device)


def _zip_data_offset(t: Tensor, info: zipfile.ZipInfo, fn: FileLike) -> int:
    """Where a stored member's bytes start: after its local header (whose name/extra lengths may differ from the
    central directory's)."""
    head = _host_bytes(t[info.header_offset : info.header_offset + 30])
    if len(head) < 30 or head[:4] != b"PK\x03\x04":  # (a central directory pointing elsewhere: bytes of something else)
        raise ArchiveError(f"zip_extract({fn}): member {info.filename!r} has no local header at byte "
                           f"{info.header_offset}; the archive is corrupt")  # fmt: skip
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    start = int(info.header_offset) + 30
    name = _host_bytes(t[start : start + name_len])
    if name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):  # (as zipfile checks)
        raise ArchiveError(f"zip_extract({fn}): member {info.filename!r} has a local header naming {name[:80]!r}; "
                           "the archive is corrupt or crafted")  # fmt: skip
    return start + int(name_len) + int(extra_len)


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


def _rebuild_tensor(storage: Any, offset: Any, shape: Any, stride: Any, *_: Any) -> Tensor:
    """A tensor from its storage (a flat tensor of the storage dtype), element offset, shape and strides, each
    checked: every element the view reaches must lie inside the storage."""
    if not isinstance(storage, Tensor) or storage.ndim != 1:
        raise TorchLoadError(f"torch_load: a tensor's storage is {type(storage).__name__}, not a storage")
    n = as_int(storage.shape[0])
    shape, stride = _ints(shape, "shape"), _ints(stride, "stride")
    offset = _ints((offset,), "storage offset")[0]
    if len(shape) != len(stride):
        raise TorchLoadError(f"torch_load: a tensor has shape {shape} but strides {stride} (one per dimension)")
    numel = 1
    for s in shape:
        numel *= s
    last = offset + sum((s - 1) * st for s, st in zip(shape, stride)) if numel else offset - 1
    if last >= n or offset > n:
        raise TorchLoadError(f"torch_load: a tensor view (shape {shape}, strides {stride}, offset {offset}) "
                             f"reaches element {max(last, offset)} of a storage of {n} elements; the file is "
                             "corrupt")  # fmt: skip
    if numel == 0:
        return Tensor.zeros(*shape, dtype=storage.dtype)
    contiguous = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    if stride == contiguous or numel == 1:
        return storage[offset : offset + numel].reshape(shape)
    # permuted or broadcast strides: gather on the host (dtypes numpy lacks as their bits), then a tensor of them.
    # A stride of 0 repeats elements: a few bytes of file may claim terabytes, so the gather is capped like inflating
    if numel * storage.dtype.itemsize > (ceiling := int(MAX_DECOMPRESSED_BYTES.value)):
        raise TorchLoadError(f"torch_load: a tensor view (shape {shape}, strides {stride}) would expand to "
                             f"{numel * storage.dtype.itemsize} bytes on the host, more than MAX_DECOMPRESSED_BYTES="
                             f"{ceiling}; if you trust the file, raise it (MAX_DECOMPRESSED_BYTES=<bytes> in the "
                             "environment, or Context(MAX_DECOMPRESSED_BYTES=...))")  # fmt: skip
    bits = storage if storage.dtype.fmt is not None else storage.bitcast(dtypes.uint16)
    flat = bits.to("CPU").numpy() if file_backed(bits.device) else bits.numpy()
    arr = np.ascontiguousarray(np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(s * flat.itemsize for s in
                                                                                             stride)))  # fmt: skip
    return Tensor(arr, dtype=storage.dtype) if storage.dtype.fmt is not None else Tensor(arr).bitcast(storage.dtype)


def _ints(v: Any, what: str) -> tuple[int, ...]:
    """v as a tuple of non-negative ints (a torch.Size, tuple or list), else TorchLoadError."""
    if not isinstance(v, (tuple, list)) or not all(type(x) is int and x >= 0 for x in v):
        raise TorchLoadError(f"torch_load: a tensor's {what} is {v!r}; expected non-negative integers")
    return tuple(v)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


class _Pending:
    """A legacy storage not read yet (its bytes follow the object pickle)."""

    def __init__(self, key: str) -> None:
        self.key = key


class _LegacyTensor:
    def __init__(self, storage: _Pending, *args: Any) -> None:
        self.storage, self.args = storage, args


def _rebuild_any(storage: Any, *args: Any) -> Any:
    """Rebuild now when the storage is loaded (zip format), later when it follows the pickle (legacy format)."""
    return _LegacyTensor(storage, *args) if isinstance(storage, _Pending) else _rebuild_tensor(storage, *args)


class _StorageType:
    def __init__(self, dtype: DType) -> None:
        self.dtype = dtype


def _encode(s: Any, encoding: Any = "utf-8") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it to spell bytes (only text encodings: no codec that expands)."""
    if not isinstance(s, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise UnsafePickleError(f"torch_load: _codecs.encode({type(s).__name__}, {encoding!r}) is not a bytes literal")
    return s.encode(encoding)


def _bytearray(*args: Any) -> bytearray:
    """`bytearray` as pickles spell a bytearray literal: from bytes, or text and its encoding. Not from a size: that
    is no literal, and bytearray(10**11) would allocate and zero 100 GB while loading."""
    if not args or (isinstance(args[0], (bytes, bytearray)) and len(args) == 1):
        return bytearray(*args)
    if isinstance(args[0], str) and len(args) == 2:
        return bytearray(_encode(*args))
    raise UnsafePickleError(f"torch_load: bytearray({', '.join(type(a).__name__ for a in args)}) is not a bytes "
                            "literal (a size would allocate that much); nothing was run")  # fmt: skip


# The names a checkpoint of tensors needs, and what each resolves to: everything else is refused
_BUILTINS = {"set": set, "frozenset": frozenset, "slice": slice, "tuple": tuple, "list": list, "dict": dict,
             "bytearray": _bytearray, "complex": complex}  # fmt: skip
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _encode,
    **{(m, k): v for m in ("builtins", "__builtin__") for k, v in _BUILTINS.items()},
}
_TORCH_NAMES: dict[str, Any] = {
    "_rebuild_tensor_v2": _rebuild_any, "_rebuild_tensor": _rebuild_any,
    "_rebuild_parameter": _rebuild_parameter, "Size": tuple,
    **{k: _StorageType(v) for k, v in _STORAGES.items()}, **_TORCH_DTYPES,
}  # fmt: skip


class _TorchUnpickler(pickle.Unpickler):
    """The one unpickler of every pickle torch_load reads: names resolve through _ALLOWED and _TORCH_NAMES (torch's
    rebuild functions, storage classes and dtypes, in any torch module), anything else is an UnsafePickleError;
    persistent ids load storages through `storage` (None: a pickle that may have none)."""

    def __init__(self, f: Any, storage: Callable[[DType, str, int], Tensor] | None) -> None:
        super().__init__(f)
        self.storage = storage

    def find_class(self, module: str, name: str) -> Any:
        if (module == "torch" or module.startswith("torch.")) and name in _TORCH_NAMES:
            return _TORCH_NAMES[name]
        if (module, name) in _ALLOWED:
            return _ALLOWED[module, name]
        raise UnsafePickleError(
            f"torch_load: the checkpoint's pickle names {module}.{name}, which torch_load does not load (it reads "
            "tensors, numbers, strings and containers, like torch.load(weights_only=True)); nothing was run. If you "
            "trust the file, load it with torch and save the tensors as safetensors"
        )

    def persistent_load(self, pid: Any) -> Any:
        if self.storage is None or not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise TorchLoadError(f"torch_load: unsupported persistent id {pid!r}")
        kind, key, numel = pid[1], pid[2], pid[4]
        if len(pid) > 5 and pid[5] is not None:  # (the tensor would read its root storage from element 0: wrong data)
            raise TorchLoadError(f"torch_load: storage {key!r} is a view of another storage ({pid[5]!r:.60}), which "
                                 "only very old PyTorch wrote and torch_load does not read; load the file with torch "
                                 "and save it again")  # fmt: skip
        dtype = kind.dtype if isinstance(kind, _StorageType) else kind if isinstance(kind, DType) else None
        if dtype is None or not isinstance(key, (str, int)) or type(numel) is not int or numel < 0:
            raise TorchLoadError(f"torch_load: malformed storage reference {pid!r}")
        return self.storage(dtype, str(key), numel)


def _unpickle(f: Any, storage: Callable[[DType, str, int], Tensor] | None, what: str) -> Any:
    with named_errors(TorchLoadError, f"torch_load: {what} is not a readable pickle"):
        return _TorchUnpickler(f, storage).load()


def _as_dtype(raw: Tensor, dtype: DType, numel: int, what: str, big_endian: bool = False) -> Tensor:
    """A uint8 file slice as numel elements of dtype (TorchLoadError when the slice holds fewer bytes); a big-endian
    checkpoint's elements are byte-swapped on the host."""
    have = as_int(raw.shape[0])
    if have < numel * dtype.itemsize:
        raise TorchLoadError(f"torch_load: {what} holds {have} bytes, but the checkpoint says it has {numel} "
                             f"{dtype} elements ({numel * dtype.itemsize} bytes); the file is truncated or "
                             "corrupt")  # fmt: skip
    if numel == 0:
        return Tensor.empty(0, dtype=dtype)
    raw = raw[: numel * dtype.itemsize]
    if big_endian and dtype.itemsize > 1:
        swapped = np.frombuffer(_host_bytes(raw), dtype=np.uint8).reshape(numel, dtype.itemsize)[:, ::-1]
        return Tensor(np.ascontiguousarray(swapped).reshape(-1)).bitcast(dtype)
    if dtype.fmt is None or file_backed(raw.device):
        host = raw.to("CPU") if file_backed(raw.device) else raw
        return host.bitcast(dtype) if dtype.itemsize == 1 else host.contiguous().bitcast(dtype)
    return raw.bitcast(dtype)


def torch_load(fn: FileLike) -> Any:
    """Load a PyTorch checkpoint (zip format or legacy pickle stream) without PyTorch: the unpickled structure with
    tensors in place of torch tensors. Only tensors, numbers, strings and containers are loaded (see the module
    docstring); anything else, or anything malformed, raises a TorchLoadError."""
    t = _file_tensor(fn)
    head = _host_bytes(t[:4]) if as_int(t.shape[0]) >= 4 else b""
    if head == b"PK\x03\x04":
        members = zip_extract(t)
        pkl = next((k for k in members if k.endswith("data.pkl")), None)
        if pkl is None:
            raise TorchLoadError(f"torch_load: {fn} is a zip file without a data.pkl; not a PyTorch checkpoint")
        prefix = pkl[: -len("data.pkl")]
        order = members.get(f"{prefix}byteorder")  # (torch writes it; files without one are little-endian)
        order_text = b"little" if order is None else _host_bytes(order).strip()
        if order_text not in (b"little", b"big"):
            raise TorchLoadError(f"torch_load: {fn}'s {prefix}byteorder says {order_text[:40]!r}; expected 'little' "
                                 "or 'big'. The file is corrupt")  # fmt: skip

        def zip_storage(dtype: DType, key: str, numel: int) -> Tensor:
            if (raw := members.get(f"{prefix}data/{key}")) is None:
                raise TorchLoadError(f"torch_load: {fn} has no member {prefix}data/{key} for the storage its pickle "
                                     "names; the file is incomplete")  # fmt: skip
            return _as_dtype(raw, dtype, numel, f"storage {key}", order_text == b"big")

        return _unpickle(io.BytesIO(_host_bytes(members[pkl])), zip_storage, f"{fn}'s {pkl}")
    return _legacy_load(t, fn)


def _legacy_load(t: Tensor, fn: FileLike) -> Any:
    """The pre-1.6 format: magic, protocol and system-info pickles, the object pickle, the list of storage keys, then
    each storage as an 8-byte element count and its bytes."""
    f = io.BufferedReader(TensorIO(t), 1 << 16)  # the unpickler reads an opcode at a time: not a tensor read each
    wanted: dict[str, tuple[DType, int]] = {}

    def legacy_storage(dtype: DType, key: str, numel: int) -> Tensor:
        wanted[key] = (dtype, numel)
        return _Pending(key)  # type: ignore[return-value]

    try:
        magic = _unpickle(f, None, str(fn))
    except UnsafePickleError:
        raise
    except TorchLoadError as e:
        raise TorchLoadError(f"torch_load: {fn} is neither a zip nor a legacy PyTorch checkpoint ({e})") from e
    if type(magic) is not int or magic != 0x1950A86A20F9469CFC6C:
        raise TorchLoadError(f"torch_load: {fn} has no PyTorch magic number; not a (legacy) PyTorch checkpoint")
    _unpickle(f, None, f"{fn}'s protocol version")
    _unpickle(f, None, f"{fn}'s system information")  # (storages are little-endian whatever machine wrote them)
    obj = _unpickle(f, legacy_storage, f"{fn}'s object")
    keys = _unpickle(f, None, f"{fn}'s storage keys")
    if not isinstance(keys, list):
        raise TorchLoadError(f"torch_load: {fn}'s storage keys are a {type(keys).__name__}, not a list")
    size = as_int(t.shape[0])
    storages: dict[str, Tensor] = {}
    for key in keys:
        if str(key) not in wanted:
            raise TorchLoadError(f"torch_load: {fn} stores storage {key!r}, which its object never names")
        dtype, numel = wanted[str(key)]
        count = f.read(8)
        (n,) = struct.unpack("<q", count) if len(count) == 8 else (-1,)
        start = f.tell()
        if n < 0 or start + n * dtype.itemsize > size:
            raise TorchLoadError(f"torch_load: {fn} is truncated: storage {key!r} ({n} {dtype} elements at byte "
                                 f"{start}) does not fit in its {size} bytes")  # fmt: skip
        storages[str(key)] = _as_dtype(t[start : start + n * dtype.itemsize], dtype, numel, f"storage {key}")
        f.seek(start + n * dtype.itemsize)
    missing = sorted(set(wanted) - set(storages))
    if missing:
        raise TorchLoadError(f"torch_load: {fn} names storages {missing} but does not hold them")
    with named_errors(TorchLoadError, f"torch_load: {fn}'s object"):  # a RecursionError of a too deeply nested object
        return _resolve(obj, storages, {})


def _resolve(obj: Any, storages: dict[str, Tensor], memo: dict[int, Any]) -> Any:
    """obj with its pending tensors rebuilt; whatever the pickle shares stays shared and is resolved once (a
    pickle of 40 nested pairs of one shared tuple, 400 bytes, is 2**40 paths), and self-containing lists and dicts
    stay self-containing."""
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, _LegacyTensor):
        memo[id(obj)] = _rebuild_tensor(storages[obj.storage.key], *obj.args)
        return memo[id(obj)]
    if isinstance(obj, dict):
        out: Any = type(obj)()
        memo[id(obj)] = out
        out.update((_resolve(k, storages, memo), _resolve(v, storages, memo)) for k, v in obj.items())
        return out
    if isinstance(obj, list):
        lst: list[Any] = []
        memo[id(obj)] = lst
        lst.extend(_resolve(v, storages, memo) for v in obj)
        return lst
    if isinstance(obj, (set, frozenset, tuple)):  # (a tensor in a set or a dict key is hashable: it must not stay
        # pending). Memoized once built: one inside itself (through a list) is built again one level down
        memo[id(obj)] = type(obj)(_resolve(v, storages, memo) for v in obj)
        return memo[id(obj)]
    return obj


__all__ = ["TensorIO", "tar_extract", "torch_load", "zip_extract"]
