"""Tensor.keccak against hashlib's SHA-3/SHAKE (and a plain-Python sponge for rates hashlib has no name for)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from speck.tensor import Tensor, assert_kernel_count, dtypes

RNG = np.random.default_rng(15)

# name -> (hashlib reference of the bytes, rate in bytes)
REFS = {
    "sha3_224": (lambda b: hashlib.sha3_224(b).digest(), 144),
    "sha3_256": (lambda b: hashlib.sha3_256(b).digest(), 136),
    "sha3_384": (lambda b: hashlib.sha3_384(b).digest(), 104),
    "sha3_512": (lambda b: hashlib.sha3_512(b).digest(), 72),
    "shake_128": (lambda b: hashlib.shake_128(b).digest(16), 168),
    "shake_256": (lambda b: hashlib.shake_256(b).digest(32), 136),
}


def _lengths(rate: int) -> list[int]:
    """Empty, one byte, one short block, exactly one block, one block + 1, several blocks and a ragged tail."""
    return [0, 1, rate - 1, rate, rate + 1, 3 * rate, 2 * rate + 17]


@pytest.mark.parametrize("cfg", sorted(REFS))
def test_keccak_matches_hashlib(cfg: str) -> None:
    ref, rate = REFS[cfg]
    for n in _lengths(rate):
        msg = RNG.integers(0, 256, n, dtype=np.uint8)
        got = Tensor(msg).keccak(cfg)
        assert got.dtype == dtypes.uint8 and got.shape == (len(ref(b"")),)
        assert got.numpy().tobytes() == ref(msg.tobytes()), (cfg, n)


def test_keccak_default_is_sha3_256() -> None:
    msg = RNG.integers(0, 256, 77, dtype=np.uint8)
    assert Tensor(msg).keccak().numpy().tobytes() == hashlib.sha3_256(msg.tobytes()).digest()


def test_keccak_batched_over_leading_dims() -> None:
    msgs = RNG.integers(0, 256, (2, 3, 200), dtype=np.uint8)
    got = Tensor(msgs).keccak("sha3_384").numpy()
    assert got.shape == (2, 3, 48)
    for i in range(2):
        for j in range(3):
            assert got[i, j].tobytes() == hashlib.sha3_384(msgs[i, j].tobytes()).digest()


def test_keccak_tuple_cfg_equals_named() -> None:
    msg = RNG.integers(0, 256, 150, dtype=np.uint8)
    t = Tensor(msg)
    np.testing.assert_array_equal(t.keccak((136, 0x06)).numpy(), t.keccak("sha3_256").numpy())
    np.testing.assert_array_equal(t.keccak((168, 0x1F)).numpy(), t.keccak("shake_128").numpy())


def _py_keccak(data: bytes, rate: int, dsbyte: int) -> bytes:
    """A plain-Python sponge straight from FIPS 202 (lanes as ints, index x + 5y), squeezing as many blocks as the
    (200 - rate) // 2 byte digest needs."""
    mask = (1 << 64) - 1

    def rotl(v: int, n: int) -> int:
        return ((v << n) | (v >> (64 - n))) & mask if n else v

    rcs, r = [], 1
    for _ in range(24):
        c = 0
        for j in range(7):
            if r & 1:
                c |= 1 << ((1 << j) - 1)
            r = ((r << 1) ^ 0x171) if r & 0x80 else r << 1
        rcs.append(c)
    rot, (x, y) = [0] * 25, (1, 0)
    for t in range(24):
        rot[x + 5 * y] = (t + 1) * (t + 2) // 2 % 64
        x, y = y, (2 * x + 3 * y) % 5

    def f(a: list[int]) -> list[int]:
        for rc in rcs:
            c = [a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20] for x in range(5)]
            a = [a[i] ^ c[(i % 5 - 1) % 5] ^ rotl(c[(i % 5 + 1) % 5], 1) for i in range(25)]
            b = [0] * 25
            for x in range(5):
                for y in range(5):
                    b[y + 5 * ((2 * x + 3 * y) % 5)] = rotl(a[x + 5 * y], rot[x + 5 * y])
            a = [b[i] ^ ((~b[(i % 5 + 1) % 5 + 5 * (i // 5)]) & b[(i % 5 + 2) % 5 + 5 * (i // 5)]) for i in range(25)]
            a[0] ^= rc
        return a

    padded = bytearray(data) + bytes(rate - len(data) % rate)
    padded[len(data)] ^= dsbyte
    padded[-1] ^= 0x80
    st = [0] * 25
    for off in range(0, len(padded), rate):
        for i in range(rate // 8):
            st[i] ^= int.from_bytes(padded[off + 8 * i : off + 8 * i + 8], "little")
        st = f(st)
    out, want = b"", (200 - rate) // 2
    while True:
        out += b"".join(v.to_bytes(8, "little") for v in st)[:rate]
        if len(out) >= want:
            return out[:want]
        st = f(st)


@pytest.mark.parametrize("rate,dsbyte,n", [(40, 0x01, 0), (40, 0x01, 95), (64, 0x1F, 130), (160, 0x06, 161)])
def test_keccak_custom_rate_matches_reference_sponge(rate: int, dsbyte: int, n: int) -> None:
    """Rates below the digest size squeeze several blocks (rate 40: 80-byte digest)."""
    msg = RNG.integers(0, 256, n, dtype=np.uint8)
    assert _py_keccak(b"abc", 136, 6) == hashlib.sha3_256(b"abc").digest()  # the reference itself is right
    got = Tensor(msg).keccak((rate, dsbyte)).numpy().tobytes()
    assert got == _py_keccak(msg.tobytes(), rate, dsbyte)


def test_keccak_non_uint8_hashes_the_element_bytes() -> None:
    a = RNG.integers(-(2**31), 2**31, 50, dtype=np.int32)
    assert Tensor(a).keccak().numpy().tobytes() == hashlib.sha3_256(a.astype("<i4").tobytes()).digest()


def test_keccak_one_kernel_per_round() -> None:
    """24 round kernels plus the absorbing xor per block, and two for the padding and the zero state: the rounds
    are not unrolled into one giant graph, and the round count does not grow with the batch."""
    msg = Tensor(RNG.integers(0, 256, (4, 300), dtype=np.uint8)).realize()
    msg.keccak().realize()  # warm: the round-constant buffers exist afterwards
    nblocks = 300 // 136 + 1
    with assert_kernel_count(25 * nblocks + 2):
        msg.keccak().realize()


@pytest.mark.parametrize("cfg", ["sha3_1024", (0, 6), (137, 6), (136, 0), (136, 256), ("a", 1), (136,)])
def test_keccak_bad_cfg_is_value_error(cfg: object) -> None:
    with pytest.raises(ValueError, match="keccak"):
        Tensor(np.zeros(4, np.uint8)).keccak(cfg)  # type: ignore[arg-type]


def test_keccak_0d_is_value_error() -> None:
    with pytest.raises(ValueError, match="at least 1 dim"):
        Tensor(np.uint8(3)).keccak()


def _tree_hash(data: bytes, chunk: int = 1024) -> bytes:
    """Tensor.hash's tree with hashlib: shake_128 of zero-padded chunks, level by level, then of root and length."""
    level = data
    while True:
        k = max(1, -(-len(level) // chunk))
        level += bytes(k * chunk - len(level))
        level = b"".join(hashlib.shake_128(level[i * chunk : (i + 1) * chunk]).digest(16) for i in range(k))
        if k == 1:
            return hashlib.shake_128(level + len(data).to_bytes(8, "little")).digest(16)


@pytest.mark.parametrize("n", [0, 5, 2500])  # empty, one chunk, three chunks (two levels)
def test_hash_is_the_tree_hash_of_the_bytes(n: int) -> None:
    a = RNG.standard_normal(n).astype(np.float32)
    h = Tensor(a).hash()
    assert h.dtype == dtypes.uint8 and h.shape == (16,)
    assert h.numpy().tobytes() == _tree_hash(a.tobytes())


def test_hash_depends_on_bytes_and_length_only() -> None:
    a = RNG.integers(0, 256, 40, dtype=np.uint8)
    h = Tensor(a).hash().numpy()
    assert (Tensor(a.view(np.int32).reshape(2, 5)).hash().numpy() == h).all()  # same bytes, other dtype and shape
    b = a.copy()
    b[17] ^= 1
    assert (Tensor(b).hash().numpy() != h).any()
    assert (Tensor(np.concatenate([a, np.zeros(8, np.uint8)])).hash().numpy() != h).any()  # zero padding differs
