"""The safetensors file format, written and read directly: an 8-byte little-endian header length, a JSON header
mapping tensor names to {dtype, shape, data_offsets} (plus an optional "__metadata__" of string pairs), then the
raw little-endian tensor bytes. Offsets are relative to the end of the header."""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speck.tensor.errors import SafetensorsDTypeError, TensorFileNotFoundError
from speck.tensor.errors import SafetensorsError as SafetensorsError
from speck.uop import DType, dtypes

# safetensors dtype names <-> speck dtypes
ST_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "U8": dtypes.uint8,
    "I8": dtypes.int8,
    "U16": dtypes.uint16,
    "I16": dtypes.int16,
    "U32": dtypes.uint32,
    "I32": dtypes.int32,
    "U64": dtypes.uint64,
    "I64": dtypes.int64,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
    "F8_E4M3": dtypes.fp8e4m3,
    "F8_E5M2": dtypes.fp8e5m2,
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in the file: absolute byte offset, byte length, dtype and shape."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def encode_header(entries: Mapping[str, tuple[DType, tuple[int, ...], int]], metadata: Mapping[str, str] | None
                  ) -> tuple[bytes, dict[str, tuple[int, int]]]:  # fmt: skip
    """The header bytes (length prefix included, JSON padded with spaces to 8-byte alignment) and the data range of
    each tensor relative to the data section. entries: name -> (dtype, shape, nbytes), laid out in the given order."""
    header: dict[str, Any] = {}
    if "__metadata__" in entries:  # (safe_load reads that key as the metadata: the tensor would be lost)
        raise SafetensorsError("safe_save: '__metadata__' is the safetensors metadata key, not a tensor name; rename "
                               "the tensor (pass metadata with metadata={...})")  # fmt: skip
    if metadata is not None and not isinstance(metadata, Mapping):
        raise SafetensorsError(f"safetensors metadata must be a dict of str to str, got {type(metadata).__name__} "
                               f"{metadata!r:.40}")  # fmt: skip
    if metadata:
        bad = {k: v for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise SafetensorsError(f"safetensors metadata must map str to str; these entries do not: {bad}")
        header["__metadata__"] = dict(metadata)
    ranges: dict[str, tuple[int, int]] = {}
    pos = 0
    for name, (dt, shape, nbytes) in entries.items():
        if dt.scalar() not in ST_NAMES:
            raise SafetensorsDTypeError(f"tensor {name!r}: dtype {dt} has no safetensors name; cast it to one that "
                                        "has (e.g. .cast(dtypes.fp8e4m3) or .float()) before saving")  # fmt: skip
        header[name] = {"dtype": ST_NAMES[dt.scalar()], "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        ranges[name] = (pos, pos + nbytes)
        pos += nbytes
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, ranges


def read_header(path: str | pathlib.Path) -> tuple[dict[str, TensorEntry], dict[str, str], int]:
    """Parse and validate the header: (entries by name with absolute offsets, metadata, file size). Everything the
    file claims is checked (types, non-negative dims, ordered offsets inside the file); anything wrong is a
    SafetensorsError. One pass over the entries: linear in their number."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise TensorFileNotFoundError(f"{p} is not a file: no safetensors file to read there; check the path")
    with open(p, "rb") as f:

        def read(offset: int, n: int) -> bytes:
            f.seek(offset)
            return f.read(n)

        return parse_header(read, p.stat().st_size, str(p))


def parse_header(read: Callable[[int, int], bytes], size: int, what: str
                 ) -> tuple[dict[str, TensorEntry], dict[str, str], int]:  # fmt: skip
    """read_header over any byte source: read(offset, n) gives n bytes of the `size`-byte file named `what`."""
    p = what
    head = read(0, 8) if size >= 8 else b""
    if len(head) < 8:
        raise SafetensorsError(f"{p}: {size} bytes is too short for a safetensors file (no header length)")
    (hlen,) = struct.unpack("<Q", head)
    if hlen > MAX_HEADER or 8 + hlen > size:
        raise SafetensorsError(f"{p}: header length {hlen} does not fit in the {size}-byte file; is it truncated?")
    try:
        header = _parse_json(read(8, hlen))
    except SafetensorsError as e:  # (raised without the path by _unique_keys)
        raise SafetensorsError(f"{p}: {e}") from None
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, or an int of more digits than Python converts
        raise SafetensorsError(f"{p}: header is not valid JSON ({type(e).__name__}: {e})") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{p}: header must be a JSON object, found {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{p}: __metadata__ must map strings to strings, found {metadata!r:.200}")
    base = 8 + hlen
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        dt, shape, offsets = _entry_fields(info)
        if dt is None or shape is None or offsets is None:
            raise SafetensorsError(f"{p}: entry {name!r} is malformed ({info!r:.200}); expected "
                                   '{"dtype": one of ' f"{sorted(ST_DTYPES)}, " '"shape": [non-negative ints], '
                                   '"data_offsets": [start, end]}')  # fmt: skip
        start, end = offsets
        numel = 1
        for s in shape:
            numel *= s
        if end - start != numel * dt.itemsize or not 0 <= start <= end or base + end > size:
            raise SafetensorsError(
                f"{p}: tensor {name!r} ({info['dtype']} {list(shape)}) claims bytes [{start}, {end}) of the data "
                f"section, which needs {numel * dt.itemsize} bytes within {size - base}; the file is corrupt or "
                "truncated"
            )
        entries[name] = TensorEntry(name, dt, shape, base + start, end - start)
    _no_overlaps(p, entries, base)
    return entries, dict(metadata), size


def _parse_json(raw: bytes) -> Any:
    """The header's JSON; a key named twice in an object is a SafetensorsError (json keeps the last silently: a tensor
    would be lost). Checking each object costs Python calls per entry, so it runs only when a cheap count can't rule
    duplicates out: every entry spells "data_offsets" once, so a lost entry shows as an extra one (escapes and
    __metadata__, whose keys the count doesn't see, take the exact check)."""
    header = json.loads(raw)
    if isinstance(header, dict):
        n = len(header) - ("__metadata__" in header)
        if b"\\" not in raw and b'"__metadata__"' not in raw and raw.count(b'"data_offsets"') == n:
            return header
    return json.loads(raw, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise SafetensorsError(f"the header names {k!r} twice (one entry would be lost); the file is corrupt")
            seen.add(k)
    return out


def _no_overlaps(p: str, entries: Mapping[str, TensorEntry], base: int) -> None:
    """No two tensors share bytes (the format lays them out one after another; a file where they overlap is
    corrupt or crafted, and writing one tensor's view would change another). O(n log n) in the entries."""
    spans = sorted([(e.offset, e.offset + e.nbytes, e.name) for e in entries.values() if e.nbytes])
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise SafetensorsError(f"{p}: tensors {a!r} and {b!r} overlap (bytes [{start - base}, {end - base}) of the "
                                   "data section belong to both); the file is corrupt")  # fmt: skip


def _entry_fields(info: Any) -> tuple[DType | None, tuple[int, ...] | None, tuple[int, int] | None]:
    """(dtype, shape, (start, end)) of one header entry; None for each field that is missing or of the wrong type
    (JSON has no int type of its own: true, 1.5 and "2" are not sizes)."""
    if not isinstance(info, dict):
        return None, None, None
    name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    dt = ST_DTYPES.get(name) if isinstance(name, str) else None
    if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
        shape = None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int for x in offsets)):
        offsets = None
    return dt, None if shape is None else tuple(shape), None if offsets is None else (offsets[0], offsets[1])
