"""nn.state.gguf_load against GGUF files written here (a small struct-based writer) and numpy dequantization written
element by element from the ggml block layouts."""

from __future__ import annotations

import pathlib
import struct
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from speck.tensor.nn.state import gguf_load

RNG = np.random.default_rng(10)


# ---------------- a GGUF writer ----------------
def _s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _value(vtype: int, v: Any) -> bytes:
    if vtype == 8:
        return _s(v)
    if vtype == 9:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, i) for i in items)
    return struct.pack(_FMT[vtype], v)


def write_gguf(path: pathlib.Path, kv: list[tuple[str, int, Any]], tensors: list[tuple[str, tuple[int, ...], int,
               bytes]], version: int = 3, align: int = 32) -> None:  # fmt: skip
    """kv: (key, value type, value); tensors: (name, ggml dims innermost first, ggml type, raw bytes)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vt, v in kv:
        out += _s(key) + struct.pack("<I", vt) + _value(vt, v)
    off, blobs = 0, b""
    for name, dims, gtype, raw in tensors:
        out += _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, off)
        pad = b"\0" * (-len(raw) % align)
        blobs += raw + pad
        off += len(raw) + len(pad)
    out += b"\0" * (-len(out) % align)
    path.write_bytes(out + blobs)


# ---------------- reference dequantization, element by element ----------------
def _h(b: bytes) -> float:
    return float(np.frombuffer(b, "<f2")[0])


def ref_block(gtype: int, blk: bytes) -> list[float]:
    if gtype == 2:  # Q4_0: d, 16 bytes of nibbles (low nibbles are elements 0-15, high ones 16-31), offset 8
        d = _h(blk[0:2])
        return [d * ((blk[2 + j % 16] >> (4 * (j // 16))) & 15) - 8 * d for j in range(32)]
    if gtype == 3:  # Q4_1: d, m, nibbles
        d, m = _h(blk[0:2]), _h(blk[2:4])
        return [d * ((blk[4 + j % 16] >> (4 * (j // 16))) & 15) + m for j in range(32)]
    if gtype in (6, 7):  # Q5_0 (d, qh, qs; offset 16) / Q5_1 (d, m, qh, qs)
        d = _h(blk[0:2])
        m = _h(blk[2:4]) if gtype == 7 else 0.0
        p = 4 if gtype == 7 else 2
        qh = int.from_bytes(blk[p : p + 4], "little")
        out = []
        for j in range(32):
            q = ((blk[p + 4 + j % 16] >> (4 * (j // 16))) & 15) | (((qh >> j) & 1) << 4)
            out.append(d * (q - 16) if gtype == 6 else d * q + m)
        return out
    if gtype == 8:  # Q8_0: d, 32 int8
        d = _h(blk[0:2])
        return [d * v for v in np.frombuffer(blk[2:34], np.int8).tolist()]
    if gtype in (12, 13):  # Q4_K / Q5_K: d, dmin, 12 scale bytes, (Q5_K: 32 qh bytes), 128 qs bytes
        d, dmin, sc = _h(blk[0:2]), _h(blk[2:4]), blk[4:16]
        qh = blk[16:48] if gtype == 13 else None
        qs = blk[48:176] if gtype == 13 else blk[16:144]

        def scale_min(j: int) -> tuple[int, int]:
            if j < 4:
                return sc[j] & 63, sc[j + 4] & 63
            return (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)

        out = []
        for s in range(8):
            a, mn = scale_min(s)
            for lane in range(32):
                q = (qs[32 * (s // 2) + lane] >> (4 * (s % 2))) & 15
                if qh is not None:
                    q += 16 * ((qh[lane] >> s) & 1)
                out.append(d * a * q - dmin * mn)
        return out
    if gtype == 14:  # Q6_K: ql[128], qh[64], int8 scales[16], d
        ql, qh = blk[0:128], blk[128:192]
        scales = np.frombuffer(blk[192:208], np.int8).tolist()
        d = _h(blk[208:210])
        y = [0.0] * 256
        for half in range(2):
            for lane in range(32):
                a, b, h = ql[64 * half + lane], ql[64 * half + lane + 32], qh[32 * half + lane]
                qs = [(a & 15) | (h & 3) << 4, (b & 15) | ((h >> 2) & 3) << 4, (a >> 4) | ((h >> 4) & 3) << 4,
                      (b >> 4) | ((h >> 6) & 3) << 4]  # fmt: skip
                for k in range(4):
                    pos = 128 * half + 32 * k + lane
                    y[pos] = d * scales[pos // 16] * (qs[k] - 32)
        return y
    if gtype == 23:  # IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32 with 6-bit scales - 32
        d, sh, sl, qs = _h(blk[0:2]), int.from_bytes(blk[2:4], "little"), blk[4:8], blk[8:136]
        levels = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
        out = []
        for ib in range(8):
            ls = ((sl[ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            out += [d * (ls - 32) * levels[(qs[16 * ib + j % 16] >> (4 * (j // 16))) & 15] for j in range(32)]
        return out
    if gtype == 39:  # MXFP4: e8m0 exponent byte, 16 bytes of fp4 e2m1 nibbles (low nibbles first)
        scale = 2.0 ** (blk[0] - 127)

        def fp4(v: int) -> float:
            e, m = (v >> 1) & 3, v & 1
            mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
            return -mag if v & 8 else mag

        return [scale * fp4((blk[1 + j % 16] >> (4 * (j // 16))) & 15) for j in range(32)]
    raise AssertionError(gtype)


# type -> (block elements, block bytes, byte offsets of the f16 fields)
BLOCKS = {2: (32, 18, [0]), 3: (32, 20, [0, 2]), 6: (32, 22, [0]), 7: (32, 24, [0, 2]), 8: (32, 34, [0]),
          12: (256, 144, [0, 2]), 13: (256, 176, [0, 2]), 14: (256, 210, [208]), 23: (256, 136, [0]),
          39: (32, 17, [])}  # fmt: skip


def random_blocks(gtype: int, nblocks: int) -> bytes:
    """Random block bytes with finite, moderate f16 scale fields (any bit pattern of the rest is valid)."""
    _, bsize, f16s = BLOCKS[gtype]
    out = bytearray()
    for _ in range(nblocks):
        blk = bytearray(RNG.integers(0, 256, bsize, dtype=np.uint8).tobytes())
        for o in f16s:
            blk[o : o + 2] = np.float16(RNG.uniform(-2, 2)).tobytes()
        if gtype == 39:  # an exponent byte whose power of two stays finite in float32
            blk[0] = int(RNG.integers(100, 150))
        out += blk
    return bytes(out)


def ref_dequant(gtype: int, raw: bytes) -> np.ndarray:
    bsize = BLOCKS[gtype][1]
    return np.array([v for i in range(0, len(raw), bsize) for v in ref_block(gtype, raw[i : i + bsize])], np.float32)


# ---------------- tests ----------------
ALL_KV: list[tuple[str, int, Any]] = [
    ("general.architecture", 8, "llama"),
    ("u8", 0, 200), ("i8", 1, -100), ("u16", 2, 60000), ("i16", 3, -30000), ("u32", 4, 4_000_000_000),
    ("i32", 5, -2_000_000_000), ("f32", 6, 1.5), ("bool", 7, True), ("u64", 10, 2**63 + 5), ("i64", 11, -(2**62)),
    ("f64", 12, 2.25), ("tokens", 9, (8, ["a", "bé", ""])), ("scores", 9, (6, [0.5, -1.0])),
    ("nested", 9, (9, [(5, [1, 2]), (5, [])])),
]  # fmt: skip


@pytest.mark.parametrize("version", [2, 3])
def test_metadata_of_every_value_type(tmp_path: pathlib.Path, version: int) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, ALL_KV, [], version=version)
    kv, sd = gguf_load(Tensor(p))
    assert sd == {}
    want = {k: (list(v[1]) if vt == 9 and v[0] != 9 else v) for k, vt, v in ALL_KV}
    want["nested"] = [[1, 2], []]
    assert kv == want


def test_native_types_and_shapes(tmp_path: pathlib.Path) -> None:
    f32 = RNG.standard_normal((3, 5)).astype(np.float32)
    f16 = RNG.standard_normal((2, 4, 3)).astype(np.float16)
    i32 = RNG.integers(-1000, 1000, 7, dtype=np.int32)
    p = tmp_path / "n.gguf"
    tensors = [("a", (5, 3), 0, f32.tobytes()), ("b", (3, 4, 2), 1, f16.tobytes()), ("c", (7,), 26, i32.tobytes())]
    write_gguf(p, [("general.alignment", 4, 64)], tensors, align=64)
    kv, sd = gguf_load(str(p))
    assert kv == {"general.alignment": 64}
    assert sd["a"].shape == (3, 5) and sd["a"].dtype == dtypes.float32
    assert sd["b"].dtype == dtypes.float16 and sd["c"].dtype == dtypes.int32
    np.testing.assert_array_equal(sd["a"].numpy(), f32)
    np.testing.assert_array_equal(sd["b"].numpy(), f16)
    np.testing.assert_array_equal(sd["c"].numpy(), i32)


@pytest.mark.parametrize("gtype", sorted(BLOCKS))
def test_quantized_types_match_reference(tmp_path: pathlib.Path, gtype: int) -> None:
    block = BLOCKS[gtype][0]
    nblocks = 6
    raw = random_blocks(gtype, nblocks)
    other = RNG.standard_normal(3).astype(np.float32)  # a tensor before it: offsets and alignment count
    p = tmp_path / "q.gguf"
    write_gguf(p, [("k", 8, "v")], [("pre", (3,), 0, other.tobytes()), ("w", (block * 2, nblocks // 2), gtype, raw)])
    _, sd = gguf_load(Tensor(p))
    w = sd["w"]
    assert w.shape == (nblocks // 2, block * 2) and w.dtype == dtypes.float32
    ref = ref_dequant(gtype, raw).reshape(nblocks // 2, block * 2)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sd["pre"].numpy(), other)


def test_load_from_a_compute_device_tensor(tmp_path: pathlib.Path) -> None:
    raw = random_blocks(8, 2)
    p = tmp_path / "c.gguf"
    write_gguf(p, [], [("w", (64,), 8, raw)])
    t = Tensor(np.frombuffer(p.read_bytes(), np.uint8))
    _, sd = gguf_load(t)
    np.testing.assert_allclose(sd["w"].numpy(), ref_dequant(8, raw), rtol=1e-6)


def test_bad_files(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_load(Tensor(p))
    write_gguf(p, [], [], version=1)
    with pytest.raises(ValueError, match="version 1"):
        gguf_load(Tensor(p))
    write_gguf(p, ALL_KV, [("w", (64,), 8, random_blocks(8, 2))])
    whole = p.read_bytes()
    p.write_bytes(whole[:100])  # cut inside the metadata
    with pytest.raises(ValueError, match="truncated"):
        gguf_load(Tensor(p))
    p.write_bytes(whole[:-40])  # cut inside the tensor data (the last 28 bytes are alignment padding)
    with pytest.raises(ValueError, match="truncated.*'w'"):
        gguf_load(Tensor(p))
    write_gguf(p, [], [("w", (256,), 10, bytes(84))])  # Q2_K: not dequantized here
    with pytest.raises(ValueError, match="ggml type 10"):
        gguf_load(Tensor(p))
    write_gguf(p, [], [("w", (40,), 2, bytes(30))])  # 40 elements of a 32-element block type
    with pytest.raises(ValueError, match="multiple"):
        gguf_load(Tensor(p))
    with pytest.raises(ValueError, match="1-d uint8"):
        gguf_load(Tensor(np.zeros((2, 2), np.float32)))


def test_header_larger_than_the_first_read(tmp_path: pathlib.Path) -> None:
    """A vocabulary of a few MB in the metadata: the header is read in growing pieces until it fits."""
    vocab = [f"token_{i:06d}" for i in range(120_000)]  # ~2 MB of strings
    vals = RNG.standard_normal(8).astype(np.float32)
    p = tmp_path / "big.gguf"
    write_gguf(p, [("tokenizer.ggml.tokens", 9, (8, vocab))], [("w", (8,), 0, vals.tobytes())])
    kv, sd = gguf_load(Tensor(p))
    assert kv["tokenizer.ggml.tokens"] == vocab
    np.testing.assert_array_equal(sd["w"].numpy(), vals)


def test_llm_module_path(tmp_path: pathlib.Path) -> None:
    from speck.tensor.llm.gguf import gguf_load as llm_gguf_load

    p = tmp_path / "l.gguf"
    write_gguf(p, [("a", 4, 7)], [])
    assert llm_gguf_load(p) == ({"a": 7}, {})


def test_split_model_parts_merge_when_loaded_by_path(tmp_path: pathlib.Path) -> None:
    a, b = RNG.standard_normal(4).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    kv0 = [("split.no", 2, 0), ("split.count", 2, 2), ("general.name", 8, "m")]
    write_gguf(tmp_path / "m-00001-of-00002.gguf", kv0, [("a", (4,), 0, a.tobytes())])
    write_gguf(tmp_path / "m-00002-of-00002.gguf", [("split.no", 2, 1)], [("b", (3, 2), 0, b.tobytes())])
    kv, sd = gguf_load(tmp_path / "m-00002-of-00002.gguf")
    assert kv["general.name"] == "m" and sorted(sd) == ["a", "b"]
    np.testing.assert_array_equal(sd["a"].numpy(), a)
    np.testing.assert_array_equal(sd["b"].numpy(), b)
    _, one = gguf_load(Tensor(tmp_path / "m-00002-of-00002.gguf"))  # a tensor is one file: no merging
    assert sorted(one) == ["b"]
    (tmp_path / "m-00001-of-00002.gguf").unlink()
    with pytest.raises(FileNotFoundError, match="00001-of-00002"):
        gguf_load(str(tmp_path / "m-00002-of-00002.gguf"))


@pytest.mark.parametrize("gtype", [2, 8, 14])
def test_ggml_data_to_tensor_dequantizes_the_first_n_values(gtype: int) -> None:
    from speck.tensor.nn.state import ggml_data_to_tensor  # the public name tinygrad's llama examples import

    block, nblocks = BLOCKS[gtype][0], 3
    raw = random_blocks(gtype, nblocks)
    n = block * 2 + 5  # a count that ends mid-block
    got = ggml_data_to_tensor(Tensor(np.frombuffer(raw, np.uint8)), n, gtype)
    assert got.shape == (n,) and got.dtype == dtypes.float32
    np.testing.assert_allclose(got.numpy(), ref_dequant(gtype, raw)[:n], rtol=1e-5, atol=1e-5)


def test_ggml_data_to_tensor_native_and_bad_input() -> None:
    from speck.tensor.errors import GGUFError
    from speck.tensor.nn.state import ggml_data_to_tensor

    f16 = RNG.standard_normal(9).astype(np.float16)
    got = ggml_data_to_tensor(Tensor(np.frombuffer(f16.tobytes(), np.uint8)), 7, 1)
    assert got.dtype == dtypes.float16
    np.testing.assert_array_equal(got.numpy(), f16[:7])
    with pytest.raises(GGUFError, match="ggml type 99"):
        ggml_data_to_tensor(Tensor(np.zeros(8, np.uint8)), 2, 99)
    with pytest.raises(GGUFError, match="need 40 bytes"):
        ggml_data_to_tensor(Tensor(np.zeros(8, np.uint8)), 10, 0)
