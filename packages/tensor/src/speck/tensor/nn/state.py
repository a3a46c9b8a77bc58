"""Model state: find the tensors of a model, load a state dict into it, and save/load safetensors files.

`safe_load` memory-maps the file through the DISK device: each tensor is a zero-copy view of the mapped file until
it is copied to a compute device."""

from __future__ import annotations

import json
import os
import pathlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from speck.hcq import Buffer, Device
from speck.tensor.device import canonical, file_backed
from speck.tensor.dims import as_int
from speck.tensor.errors import StateDictKeyError, StateDictShapeError, TensorFileNotFoundError, TensorTypeError
from speck.tensor.nn.checkpoints import TensorIO, tar_extract, torch_load, zip_extract
from speck.tensor.nn.gguf import ggml_data_to_tensor, gguf_load
from speck.tensor.nn.safetensors import (
    ST_DTYPES,
    SafetensorsError,
    TensorEntry,
    encode_header,
    parse_header,
    read_header,
)
from speck.tensor.pyutils import atomic_file, tqdm
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import base_buffer, buffer_map, buffer_views, new_buffer_uop
from speck.tensor.tensor import Tensor
from speck.uop import DType, dtypes


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every Tensor reachable from obj through attributes, lists, tuples (namedtuples by field name) and dicts, keyed
    by dotted path (e.g. "layers.0.weight"), in a deterministic order. Shared tensors appear under every path that
    reaches them.
    `prefix` is put in front of every key as given, as tinygrad does (`prefix="model."` -> "model.layers.0.weight");
    the dots around a whole key are stripped."""
    out: dict[str, Tensor] = {}
    stack: list[tuple[str, Any]] = [(prefix, obj)]
    seen: set[int] = set()
    while stack:
        path, o = stack.pop()
        if isinstance(o, tensor_type):
            out[path.strip(".")] = o  # type: ignore[assignment]  # tensor_type is Tensor or a subclass
            continue
        if id(o) in seen or isinstance(o, (str, bytes, int, float, bool, type(None), np.ndarray)):
            continue
        seen.add(id(o))
        if isinstance(o, Mapping):
            items = [(str(k), v) for k, v in o.items()]
        elif isinstance(o, tuple) and isinstance(fields := getattr(o, "_fields", None), tuple):  # namedtuple: by name
            items = [(str(k), v) for k, v in zip(fields, o)]
        elif isinstance(o, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(o)]
        elif hasattr(o, "__dict__"):
            items = list(vars(o).items())
        else:
            continue
        for k, v in reversed(items):
            stack.append((f"{path}{k}.", v))
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """The distinct tensors of obj (state-dict order)."""
    out: dict[int, Tensor] = {}
    for t in get_state_dict(obj).values():
        out.setdefault(id(t), t)
    return list(out.values())


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = True,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:  # fmt: skip
    """Load state_dict's tensors into the model's tensors of the same names (tinygrad's semantics): each model
    tensor keeps its identity and takes the loaded content, moved to its device, with the loaded dtype. A model key
    missing from state_dict is a KeyError when strict (skipped otherwise); extra keys are ignored; a shape mismatch is
    a ValueError (but () and (1,) are interchangeable). consume deletes loaded keys from state_dict; realize computes
    the loaded tensors. Returns the model tensors loaded."""
    if not isinstance(state_dict, Mapping):
        raise TensorTypeError(f"load_state_dict takes a mapping of names to Tensors, got a "
                              f"{type(state_dict).__name__}; pass a dict such as safe_load(path) returns")  # fmt: skip
    model_sd = get_state_dict(model)
    if bad := [k for k in model_sd if k in state_dict and not isinstance(state_dict[k], Tensor)]:
        raise TensorTypeError(f"load_state_dict: state_dict[{bad[0]!r}] is a {type(state_dict[bad[0]]).__name__}, "
                              "not a Tensor; wrap it with Tensor(...) first")  # fmt: skip
    missing = [k for k in model_sd if k not in state_dict]
    if strict and missing:
        raise StateDictKeyError(f"load_state_dict: missing keys: {missing} (pass strict=False to load what matches)")
    mismatched = [f"{k} model {tuple(t.shape)} vs state {tuple(state_dict[k].shape)}" for k, t in model_sd.items()
                  if k in state_dict and tuple(t.shape) != tuple(state_dict[k].shape)
                  and {tuple(t.shape), tuple(state_dict[k].shape)} != {(), (1,)}]  # fmt: skip
    if mismatched:
        raise StateDictShapeError("load_state_dict: shape mismatch: " + ", ".join(mismatched))
    loaded = []
    for k, t in tqdm(list(model_sd.items()), desc="load_state_dict", disable=not verbose):
        if k not in state_dict:
            continue
        src = state_dict[k]
        if tuple(src.shape) != tuple(t.shape):
            src = src.reshape(t.shape)
        # a sharded model tensor is loaded sharded like it (same devices and axis), anything else moved to its device
        t.replace(src.shard_like(t) if isinstance(t.device, tuple) else src.to(t.device))
        if realize:
            t.realize()
        if consume:
            del state_dict[k]
        loaded.append(t)
    return loaded


def safe_save(tensors: Mapping[str, Tensor], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None
              ) -> None:  # fmt: skip
    """Write tensors to a safetensors file (written directly, atomically: a crash never leaves a partial file)."""
    if not isinstance(tensors, Mapping):  # (a list of tensors has no names to store them under)
        raise TensorTypeError(f"safe_save takes a dict of name -> Tensor, got {type(tensors).__name__}; name each "
                              "tensor, e.g. get_state_dict(model) or {'w': w}")  # fmt: skip
    if bad_names := [name for name in tensors if not isinstance(name, str)]:  # (json.dumps wrote 1 as "1")
        raise TensorTypeError(f"safe_save: tensor name {bad_names[0]!r} is a {type(bad_names[0]).__name__}; "
                              "safetensors names are str: name the tensor with a string")  # fmt: skip
    if bad := [name for name, t in tensors.items() if not isinstance(t, Tensor)]:
        raise TensorTypeError(f"safe_save writes Tensors; {bad[0]!r} is a {type(tensors[bad[0]]).__name__}")
    if weak := [name for name, t in tensors.items() if t.dtype.is_weak]:
        raise SafetensorsError(f"safe_save: tensor {weak[0]!r} has the Python literal dtype {tensors[weak[0]].dtype}, "
                               "which has no storage format; cast it to a concrete dtype first")  # fmt: skip
    arrays = {name: _raw_numpy(t) for name, t in tensors.items()}
    entries = {name: (tensors[name].dtype, tuple(a.shape), a.nbytes) for name, a in arrays.items()}
    header, _ = encode_header(entries, metadata)
    p = pathlib.Path(path)
    with atomic_file(p, "safe_save") as f:
        f.write(header)
        for a in arrays.values():
            f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def _raw_numpy(t: Tensor) -> np.ndarray:
    """t's values as numpy; dtypes numpy lacks (bfloat16, fp8) come out as their raw bits (uint16/uint8)."""
    if t.dtype.fmt is None:
        return t.contiguous().bitcast(dtypes.uint16 if t.dtype.itemsize == 2 else dtypes.uint8).numpy()
    return t.contiguous().numpy()


def safe_load(path: str | os.PathLike[str] | Tensor, device: str | None = None) -> dict[str, Tensor]:
    """Load a safetensors file (a path, or a 1-D uint8 tensor of its bytes: a DISK tensor of the file, or the bytes
    on any device, e.g. Tensor(open(path, "rb").read())).

    With no `device`, each tensor is a lazy view into the file on the DISK device: nothing is read until it is used
    (`.to(device)`, `.numpy()`, `load_state_dict`); arithmetic needs a move to a compute device first. With a `device`,
    each tensor is read from a zero-copy view of the memory-mapped file straight into a buffer there; a device that
    streams files itself (`load_file`: USB) gets the file's data section in one allocation, each tensor a view of
    it."""
    if not isinstance(path, (str, os.PathLike, Tensor)):
        raise TensorTypeError(f"safe_load takes a path (str or os.PathLike) or a 1-D uint8 tensor of the file's bytes, "
                              f"got {type(path).__name__}")  # fmt: skip
    if isinstance(path, Tensor):
        if not file_backed(path.device) or _maps_a_replaced_file(path):
            return _load_from_bytes(path, device)
        path = _disk_file_of(path)
    if device is None:
        file, entries = _mapped(os.fspath(path))
        return {name: _disk_view(file, e) for name, e in entries.items()}  # a few calls per entry: linear
    entries, _, size = read_header(os.fspath(path))
    if (streamed := _load_streamed(os.fspath(path), entries, device)) is not None:
        return streamed
    disk = Buffer(f"DISK:{os.fspath(path)}", size, np.uint8)
    out = {}
    for name, e in entries.items():
        if e.dtype.fmt is None:  # bfloat16/fp8: no numpy type; read the bits and bitcast on the device
            raw = disk.view(
                e.nbytes // e.dtype.itemsize, np.uint16 if e.dtype.itemsize == 2 else np.uint8, e.offset
            ).numpy()
            bits = Tensor(raw.reshape(e.shape), device=device)
            out[name] = bits.bitcast(e.dtype)
        else:
            arr = disk.view(e.nbytes // e.dtype.itemsize, np.dtype(e.dtype.fmt), e.offset).numpy()
            out[name] = Tensor(arr.reshape(e.shape), device=device, dtype=e.dtype)
    return out


def _mapped(path: str) -> tuple[Tensor, dict[str, TensorEntry]]:
    """The file as a DISK tensor mapped now, and the header read from that mapping: the lazy views read the bytes the
    header describes even if the path is replaced later (safe_save over it). Reading the header with open() and
    mapping at the first use read a replacing file's bytes at the old offsets: another tensor's values."""
    if not pathlib.Path(path).is_file():
        raise TensorFileNotFoundError(f"{path} is not a file: no safetensors file to read there; check the path")
    file = Tensor(pathlib.Path(path)).realize()
    size = as_int(file.shape[0])
    entries, _, _ = parse_header(lambda o, n: file[o : o + n].data().tobytes(), size, path)
    return file, entries


def _check_bytes(t: Tensor) -> None:
    if t.dtype != dtypes.uint8 or t.ndim != 1:
        raise SafetensorsError(f"safe_load takes a path or a 1-D uint8 tensor of the file's bytes, got a {t.dtype} "
                               f"tensor of shape {t.shape} on {t.device}")  # fmt: skip


def _header_of_bytes(t: Tensor) -> tuple[dict[str, TensorEntry], dict[str, str], int]:
    """read_header of the safetensors file held in the 1-D uint8 tensor t (reads only the header's bytes)."""
    _check_bytes(t)
    size = as_int(t.shape[0])
    return parse_header(lambda o, n: t[o : o + n].data().tobytes(), size, f"safetensors bytes on {t.device}")


def _load_from_bytes(t: Tensor, device: str | None) -> dict[str, Tensor]:
    """safe_load of a file's bytes in a compute-device tensor: each entry a lazy slice of it, bitcast to its dtype."""
    entries, _, _ = _header_of_bytes(t)
    out = {}
    for name, e in entries.items():
        v = t[e.offset : e.offset + e.nbytes].bitcast(e.dtype).reshape(e.shape)
        out[name] = v if device is None else v.to(device)
    return out


def _disk_view(file: Tensor, e: TensorEntry) -> Tensor:
    """Entry e of a safetensors file as a view of the file's DISK buffer: a buffer naming its bytes as e.dtype (no
    data read, and no movement ops to lower: a header of 100k entries is loaded in about as many calls)."""
    if e.nbytes == 0:
        return Tensor.empty(*e.shape, dtype=e.dtype, device=file.device)
    numel = e.nbytes // e.dtype.itemsize
    view = new_buffer_uop(str(file.device), numel, e.dtype)
    buffer_views[view] = (file.uop, e.offset)
    return Tensor(view if e.shape == (numel,) else view.reshape(e.shape), device=file.device)


def _maps_a_replaced_file(t: Tensor) -> bool:
    """t (a DISK tensor) has mapped its file, and its path names another file now (a save over it since): its bytes
    are the mapped file's, which reading the path again would not give."""
    bb = base_buffer(t.uop)
    if bb is None or not (buf := get_buffer(bb)).is_allocated:
        return False
    try:
        st = os.stat(_disk_file_of(t))
    except OSError:
        return True
    return getattr(buf.opaque, "ident", None) not in (None, (st.st_dev, st.st_ino))


def _disk_file_of(t: Tensor) -> str:
    """The file path behind a whole-file 1-D uint8 DISK tensor (what safe_load accepts besides a path)."""
    dev = t.device
    if not file_backed(dev) or t.dtype != dtypes.uint8 or t.ndim != 1:
        raise SafetensorsError(f"safe_load takes a path or a 1-D uint8 DISK tensor of the file, got a {t.dtype} tensor "
                               f"of shape {t.shape} on {dev}")  # fmt: skip
    return str(dev).partition(":")[2]  # (a file-backed device is named KIND:<path>)


def _load_streamed(path: str, entries: Mapping[str, TensorEntry], device: str | None) -> dict[str, Tensor] | None:
    """For devices with `load_file(dest, path, offset)` (USB: disk -> pinned staging -> VRAM, no host copy of the
    file): one buffer for the whole data section, loaded with as few large copies as the device likes (a copy per
    tensor would pay each copy's fixed cost per tensor), each tensor a view of it. None for other devices."""
    dev_name = canonical(device)
    dev = Device[dev_name]
    if not hasattr(dev, "load_file"):
        return None
    if not entries:
        return {}
    start = min(e.offset for e in entries.values())
    block = Buffer(dev_name, max(e.offset + e.nbytes for e in entries.values()) - start, np.uint8)
    dev.load_file(block, path, start)
    out = {}
    for name, e in entries.items():
        if e.dtype == dtypes.bool and e.nbytes:  # bool bytes other than 0/1 are True, as numpy reads them: make them 1
            raw = np.fromfile(path, np.uint8, count=e.nbytes, offset=e.offset)
            if raw.max() > 1:
                block.view(e.nbytes, np.uint8, e.offset - start).copyin(np.not_equal(raw, 0).view(np.uint8))
        numel = e.nbytes // e.dtype.itemsize
        buf = new_buffer_uop(dev_name, numel, e.dtype)
        buffer_map[buf] = block.view(numel, e.dtype, e.offset - start)
        out[name] = Tensor(buf.reshape(e.shape) if e.shape != (numel,) else buf, device=dev_name)
    return out


def safe_load_metadata(path: str | os.PathLike[str] | Tensor) -> tuple[Tensor, int, dict[str, Any]]:
    """(the file as a 1-D uint8 tensor, byte offset of the data section, the JSON header as a dict with
    `__metadata__` when present); the header is validated like safe_load does. `path` may also be a 1-D uint8 tensor
    of the file's bytes (on DISK or any device)."""
    if isinstance(path, Tensor):
        if file_backed(path.device) and not _maps_a_replaced_file(path):
            path = _disk_file_of(path)
        else:
            _header_of_bytes(path)  # validation
            (hlen,) = struct.unpack("<Q", path[:8].data().tobytes())
            return path, 8 + hlen, json.loads(path[8 : 8 + hlen].data().tobytes())
    read_header(os.fspath(path))  # validation: a malformed file raises SafetensorsError here
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    return Tensor(pathlib.Path(path)), 8 + hlen, header


def dtype_of(name: str) -> DType:
    """speck dtype of a safetensors dtype name (e.g. "F32")."""
    if name not in ST_DTYPES:
        raise SafetensorsError(f"unknown safetensors dtype {name!r}; known: {sorted(ST_DTYPES)}")
    return ST_DTYPES[name]


__all__ = [
    "StateDictKeyError", "StateDictShapeError", "TensorIO", "get_parameters", "get_state_dict", "ggml_data_to_tensor",
    "gguf_load", "load_state_dict",
    "safe_load", "safe_load_metadata", "safe_save", "tar_extract", "torch_load", "zip_extract",
]  # fmt: skip
