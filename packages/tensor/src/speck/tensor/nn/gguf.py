"""GGUF (llama.cpp's model file format, versions 2 and 3), read directly.

Layout (all little-endian): magic "GGUF", uint32 version, uint64 tensor count, uint64 key/value count; the key/value
pairs (a string key, a uint32 value type, the value; arrays carry an element type and a uint64 count); one info per
tensor (name, uint32 dim count, uint64 dims innermost first, uint32 ggml type, uint64 offset into the data section);
then the data section, starting at the next multiple of `general.alignment` (default 32).

Quantized ggml types store fixed-size blocks; each is dequantized here with tensor ops (lazy: nothing runs until a
tensor is used), on the tensor's own device or, for a DISK file, the default device."""

from __future__ import annotations

import operator
import os
import pathlib
import re
import struct
from collections.abc import Callable
from typing import Any

from speck.tensor.device import file_backed
from speck.tensor.dims import as_int
from speck.tensor.errors import GGUFError, TensorFileNotFoundError, TensorTypeError
from speck.tensor.nn.checkpoints import named_errors
from speck.tensor.tensor import Tensor
from speck.uop import DType, dtypes

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value type -> struct format of one scalar (8: string, 9: array are read by _Reader.value)
_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                            12: "<d"}  # fmt: skip


# the fewest bytes one array element of each value type takes (a string: its length; an array: type and count)
_MIN_SIZE = {**{k: struct.calcsize(f) for k, f in _SCALARS.items()}, 8: 8, 9: 12}
MAX_ARRAY_DEPTH = 4  # arrays of arrays: llama.cpp writes none; a deep nest is an attack on the parser's recursion


class _Truncated(Exception):
    """The header runs past the bytes read so far (internal: caught here, never reaches a caller; a file that is
    really truncated raises GGUFError)."""


class _Reader:
    """Sequential little-endian reads from the header bytes."""

    def __init__(self, data: bytes, size: int, what: str) -> None:
        self.data, self.pos, self.size, self.what = data, 0, size, what  # data: the first bytes of the size-byte file

    def past_end(self, n: int) -> None:
        """Raise if n more bytes are not all read yet: GGUFError when the file does not hold them (a claimed length
        of 2**40 is refused at once, not after reading the whole file to look for its end), else _Truncated."""
        if self.pos + n > self.size:
            raise GGUFError(f"{self.what}: truncated GGUF file: at byte {self.pos} the header claims {n} more bytes, "
                            f"but the file has {self.size}")  # fmt: skip
        if self.pos + n > len(self.data):
            raise _Truncated

    def take(self, n: int) -> bytes:
        self.past_end(n)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"GGUF: a string at byte {self.pos - len(raw)} is not UTF-8 ({e})") from e

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype == 9 and depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"GGUF: arrays nested more than {MAX_ARRAY_DEPTH} deep at byte {self.pos - 12}")
            self.past_end(count * _MIN_SIZE.get(etype, 1))  # (checked first: a count of 2**60 is not looped over)
            return [self.value(etype, depth + 1) for _ in range(count)]
        raise GGUFError(f"GGUF: unknown metadata value type {vtype} at byte {self.pos - 4}; expected 0..12")


# ---------------- dequantization: ggml type -> (block elements, block bytes, blocks (n, bytes) uint8 -> (n, elems))
def _f16(b: Tensor) -> Tensor:
    """(n, 2) little-endian half-precision bytes -> (n, 1) float32."""
    return b.bitcast(dtypes.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """(n, 16) bytes -> (n, 32) values: the low nibbles of all bytes, then the high ones."""
    return (qs & 0xF).cat(qs >> 4, dim=1)


def _bits32(qh: Tensor) -> Tensor:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) of its bits, lowest first."""
    word = qh.bitcast(dtypes.uint32)
    return (word >> Tensor.arange(32, device=qh.device).cast(dtypes.uint32)) & 1


def _q4_0(b: Tensor) -> Tensor:
    return _f16(b[:, 0:2]) * (_nibbles(b[:, 2:18]).cast(dtypes.int8) - 8).float()


def _q4_1(b: Tensor) -> Tensor:
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).float() + _f16(b[:, 2:4])


def _q5_0(b: Tensor) -> Tensor:
    q = _nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]).cast(dtypes.uint8) << 4)
    return _f16(b[:, 0:2]) * (q.cast(dtypes.int8) - 16).float()


def _q5_1(b: Tensor) -> Tensor:
    q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]).cast(dtypes.uint8) << 4)
    return _f16(b[:, 0:2]) * q.float() + _f16(b[:, 2:4])


def _q8_0(b: Tensor) -> Tensor:
    return _f16(b[:, 0:2]) * b[:, 2:34].bitcast(dtypes.int8).float()


def _k_scales(s: Tensor) -> tuple[Tensor, Tensor]:
    """The 12 packed scale bytes of a Q4_K/Q5_K block -> (n, 8) 6-bit scales and (n, 8) 6-bit mins: sub-blocks 0-3
    keep theirs in the low 6 bits of bytes 0-3 / 4-7, sub-blocks 4-7 in the nibbles of bytes 8-11 plus the top two
    bits of bytes 0-3 / 4-7."""
    sc = (s[:, 0:4] & 63).cat((s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4), dim=1)
    mn = (s[:, 4:8] & 63).cat((s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4), dim=1)
    return sc.float(), mn.float()


def _k_lows(qs: Tensor) -> Tensor:
    """(n, 128) bytes -> (n, 8, 32): sub-block 2j is the low nibbles of bytes 32j..32j+31, 2j+1 their high ones."""
    q = qs.reshape(-1, 4, 1, 32)
    return (q & 0xF).cat(q >> 4, dim=2).reshape(-1, 8, 32)


def _q4_k(b: Tensor) -> Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_lows(b[:, 16:144]).float()
    out = _f16(b[:, 0:2]).unsqueeze(-1) * sc.unsqueeze(-1) * q - _f16(b[:, 2:4]).unsqueeze(-1) * mn.unsqueeze(-1)
    return out.reshape(-1, 256)


def _q5_k(b: Tensor) -> Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    # the fifth bit of element l of sub-block s is bit s of qh[l]
    shifts = Tensor.arange(8, device=b.device).cast(dtypes.uint8).reshape(1, 8, 1)
    high = (b[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1
    q = (_k_lows(b[:, 48:176]) | (high << 4)).float()
    out = _f16(b[:, 0:2]).unsqueeze(-1) * sc.unsqueeze(-1) * q - _f16(b[:, 2:4]).unsqueeze(-1) * mn.unsqueeze(-1)
    return out.reshape(-1, 256)


def _q6_k(b: Tensor) -> Tensor:
    ql, qh = b[:, 0:128].reshape(-1, 2, 2, 32), b[:, 128:192].reshape(-1, 2, 1, 32)
    # per half of 128: four runs of 32, the low nibbles of ql[0:32], ql[32:64], then their high nibbles, each with
    # two more bits from qh (bits 0-1, 2-3, 4-5, 6-7 of the half's qh[0:32])
    low = (ql & 0xF).cat(ql >> 4, dim=2)  # (n, 2, 4, 32)
    shifts = Tensor([0, 2, 4, 6], device=b.device, dtype=dtypes.uint8).reshape(1, 1, 4, 1)
    q = (low | (((qh >> shifts) & 3) << 4)).cast(dtypes.int8) - 32
    scales = b[:, 192:208].bitcast(dtypes.int8).float().reshape(-1, 16, 1).expand(-1, 16, 16).reshape(-1, 256)
    return _f16(b[:, 208:210]) * scales * q.reshape(-1, 256).float()


# fp4 e2m1 (1 sign, 2 exponent, 1 mantissa bit; exponent 0 is subnormal) by nibble
_FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
# the 16 non-uniform levels of IQ4_NL / IQ4_XS nibbles
_IQ4_LEVELS: list[float] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def _lookup(q: Tensor, table: list[float]) -> Tensor:
    """table[q] for small integer codes q (a 16-entry table: a gather folded to a direct load)."""
    levels = Tensor(table, device=q.device, dtype=dtypes.float32)
    return levels.reshape(1, -1).expand(q.shape[0], -1).gather(1, q.cast(dtypes.int32))


def _mxfp4(b: Tensor) -> Tensor:
    # a shared power-of-two scale 2^(e - 127) (e8m0), then 32 fp4 values: low nibbles first
    scale = (b[:, 0:1].cast(dtypes.int32) - 127).float().exp2()
    return scale * _lookup(_nibbles(b[:, 1:17]), _FP4_E2M1)


def _iq4_xs(b: Tensor) -> Tensor:
    # 8 sub-blocks of 32 with 6-bit scales (low 4 bits in the nibbles of scales_l, high 2 bits in scales_h), offset 32
    sh = b[:, 2:4].bitcast(dtypes.uint16).cast(dtypes.int32)
    low = (b[:, 4:8].reshape(-1, 4, 1) >> Tensor([0, 4], device=b.device, dtype=dtypes.uint8).reshape(1, 1, 2)) & 0xF
    high = (sh >> (Tensor.arange(8, device=b.device, dtype=dtypes.int32) * 2)) & 3
    ls = low.reshape(-1, 8).cast(dtypes.int32) | (high << 4)
    q = _lookup(_nibbles(b[:, 8:136].reshape(-1, 16)).reshape(-1, 32), _IQ4_LEVELS).reshape(-1, 8, 32)
    return (_f16(b[:, 0:2]).unsqueeze(-1) * (ls - 32).float().unsqueeze(-1) * q).reshape(-1, 256)


# ggml type id -> (name, elements per block, bytes per block, dequantize)
QUANTIZED: dict[int, tuple[str, int, int, Callable[[Tensor], Tensor]]] = {
    2: ("Q4_0", 32, 18, _q4_0),
    3: ("Q4_1", 32, 20, _q4_1),
    6: ("Q5_0", 32, 22, _q5_0),
    7: ("Q5_1", 32, 24, _q5_1),
    8: ("Q8_0", 32, 34, _q8_0),
    12: ("Q4_K", 256, 144, _q4_k),
    13: ("Q5_K", 256, 176, _q5_k),
    14: ("Q6_K", 256, 210, _q6_k),
    23: ("IQ4_XS", 256, 136, _iq4_xs),
    39: ("MXFP4", 32, 17, _mxfp4),
}
# ggml type id -> the dtype stored as is
NATIVE: dict[int, DType] = {0: dtypes.float32, 1: dtypes.float16, 24: dtypes.int8, 25: dtypes.int16, 26: dtypes.int32,
                            27: dtypes.int64, 28: dtypes.float64, 30: dtypes.bfloat16}  # fmt: skip


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """The first `n` values stored in `t` (a 1-d uint8 tensor of raw ggml data of type `ggml_type`) as a 1-d tensor:
    native types bitcast to their dtype, quantized types dequantized to float32."""
    if t.ndim != 1 or t.dtype != dtypes.uint8:
        raise GGUFError(f"ggml_data_to_tensor needs a 1-d uint8 tensor of raw bytes, got {t.dtype} {t.shape}")
    if not hasattr(n, "__index__") or operator.index(n) < 0:  # (a negative n would slice from the end: wrong data)
        raise GGUFError(f"ggml_data_to_tensor: n is the number of values to read, a non-negative int; got {n!r}")
    n = operator.index(n)
    if ggml_type in NATIVE:
        nbytes = n * NATIVE[ggml_type].itemsize
    elif ggml_type in QUANTIZED:
        _, block, bsize, dequant = QUANTIZED[ggml_type]
        nbytes = -(-n // block) * bsize
    else:
        known = sorted([f"{v[0]}({k})" for k, v in QUANTIZED.items()] + [f"{v}({k})" for k, v in NATIVE.items()])
        raise GGUFError(f"ggml_data_to_tensor: ggml type {ggml_type} is not supported; supported: {', '.join(known)}")
    if as_int(t.shape[0]) < nbytes:
        raise GGUFError(f"ggml_data_to_tensor: {n} values of ggml type {ggml_type} need {nbytes} bytes, got "
                        f"{as_int(t.shape[0])}; pass fewer values or more data")  # fmt: skip
    if ggml_type in NATIVE:
        return t[:nbytes].bitcast(NATIVE[ggml_type])
    return dequant(t[:nbytes].reshape(nbytes // bsize, bsize)).flatten()[:n]


def _parse_header(data: bytes, size: int, what: str) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int,
                                                                                       int]], int]:  # fmt: skip
    """(metadata, [(name, ggml dims, type, offset)], data section start) from the file's first bytes."""
    r = _Reader(data, size, what)
    magic = r.take(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{what}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    version = r.unpack("<I")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = (f" (read big-endian it is version {swapped}: the file is big-endian, which gguf_load does not read; "
                "convert it to little-endian, e.g. with gguf-py)") if swapped in (2, 3) else ""  # fmt: skip
        raise GGUFError(f"{what}: GGUF version {version} is not supported; expected 2 or 3{hint}")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    if n_tensors > size or n_kv > size:
        raise GGUFError(f"{what}: header claims {n_tensors} tensors and {n_kv} metadata entries in {size} bytes")
    # the fewest bytes each count needs, checked before its loop (a count past the file would otherwise grow the read
    # until it held the whole file): a key is a length and a type, a tensor info a name length, ndim, type and offset
    r.past_end(n_kv * 12)
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        if key in kv:  # (a second value would silently replace the first)
            raise GGUFError(f"{what}: metadata key {key!r} appears twice; the file is corrupt")
        kv[key] = r.value(r.unpack("<I"))
    infos = []
    names: set[str] = set()
    r.past_end(n_tensors * 24)
    for _ in range(n_tensors):
        name = r.string()
        if name in names:  # (one of the two tensors would be lost)
            raise GGUFError(f"{what}: tensor name {name!r} appears twice; the file is corrupt")
        names.add(name)
        ndim = r.unpack("<I")
        r.past_end(ndim * 8 + 12)
        dims = tuple(r.unpack("<Q") for _ in range(ndim))
        infos.append((name, dims, r.unpack("<I"), r.unpack("<Q")))
    align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(align) is not int or align <= 0:  # (a bool is an int to Python, not an alignment)
        raise GGUFError(f"{what}: general.alignment must be a positive integer, got {align!r}")
    return kv, infos, r.pos + (-r.pos % align)


def _read_header(t: Tensor, what: str) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """Parse the header, reading the file's first bytes (growing the read until the header fits)."""
    size = as_int(t.shape[0])
    n = min(size, 1 << 20)
    while True:
        try:
            with named_errors(GGUFError, f"{what}: malformed header", (_Truncated,)):
                return _parse_header(t[:n].data().tobytes(), size, what)
        except _Truncated:
            if n >= size:
                raise GGUFError(f"{what}: truncated GGUF file: the header runs past its {size} bytes") from None
            n = min(size, 4 * n)


# llama.cpp's split files: <prefix>-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def gguf_load(tensor: Tensor | str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read a GGUF file (a 1-d uint8 tensor of its bytes, e.g. Tensor(path) or Tensor.from_url(url), or a path):
    (metadata key -> value, tensor name -> Tensor). Shapes are outermost first (ggml lists dims innermost first);
    quantized tensors come back dequantized to float32, lazily. A path to one part of a split model
    (`name-00001-of-00003.gguf`) loads every part: the metadata of the first, the tensors of all."""
    if isinstance(tensor, (str, os.PathLike)):
        path = pathlib.Path(tensor)
        if (m := _SPLIT.match(path.name)) is not None and int(m["count"]) > 1:
            count = int(m["count"])
            parts = [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
            if missing := [str(p) for p in parts if not p.is_file()]:
                raise TensorFileNotFoundError(f"gguf_load({path}): split model parts missing: {missing}")
            loaded = [_load_one(Tensor(p)) for p in parts]
            state = {k: v for _, sd in loaded for k, v in sd.items()}
            return loaded[0][0], state
        return _load_one(Tensor(path))
    if not isinstance(tensor, Tensor):
        raise TensorTypeError(f"gguf_load takes a path (str or os.PathLike) or a 1-D uint8 tensor of the file's bytes, "
                              f"got {type(tensor).__name__}")  # fmt: skip
    return _load_one(tensor)


def _load_one(t: Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]:
    what = f"gguf_load({t.device})"
    if t.ndim != 1 or t.dtype != dtypes.uint8:
        raise GGUFError(f"gguf_load needs a 1-d uint8 tensor of the file's bytes, got {t.dtype} {t.shape}")
    kv, infos, start = _read_header(t, what)
    size = as_int(t.shape[0])
    dev = None if file_backed(t.device) else t.device
    state: dict[str, Tensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, dims, gtype, off in infos:
        numel = 1
        for d in dims:
            numel *= d
        shape = tuple(reversed(dims))
        if gtype in NATIVE:
            nbytes = numel * NATIVE[gtype].itemsize
        elif gtype in QUANTIZED:
            qname, block, bsize, _ = QUANTIZED[gtype]
            if numel % block:
                raise GGUFError(f"{what}: tensor {name!r} ({qname}) has {numel} elements, not a multiple of the "
                                 f"{block}-element block")  # fmt: skip
            nbytes = numel // block * bsize
        else:
            known = sorted([f"{v[0]}({k})" for k, v in QUANTIZED.items()] + [f"{v}({k})" for k, v in NATIVE.items()])
            raise GGUFError(f"{what}: tensor {name!r} has ggml type {gtype}, which gguf_load can't dequantize; "
                             f"supported: {', '.join(known)}")  # fmt: skip
        lo = start + off
        if lo + nbytes > size:
            raise GGUFError(f"{what}: truncated GGUF file: tensor {name!r} needs bytes [{lo}, {lo + nbytes}) of a "
                             f"{size}-byte file")  # fmt: skip
        if nbytes:
            spans.append((lo, lo + nbytes, name))
        raw = t[lo : lo + nbytes].to(dev)
        if gtype in NATIVE:
            state[name] = raw.bitcast(NATIVE[gtype]).reshape(shape)
        else:
            _, block, bsize, dequant = QUANTIZED[gtype]
            state[name] = dequant(raw.reshape(numel // block, bsize)).reshape(shape)
    spans.sort()
    for (_, end, a), (lo, _, b) in zip(spans, spans[1:]):
        if lo < end:  # (the format lays tensors out one after another; shared bytes mean a corrupt or crafted file)
            raise GGUFError(f"{what}: tensors {a!r} and {b!r} overlap (file bytes [{lo}, {end}) belong to both); the "
                            "file is corrupt")  # fmt: skip
    return kv, state


__all__ = ["ggml_data_to_tensor", "gguf_load"]
