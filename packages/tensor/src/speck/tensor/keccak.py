"""`Tensor.keccak`: SHA-3 / SHAKE (FIPS 202) over the last dim of a uint8 tensor, computed by speck kernels.

The sponge state is a tensor of shape (..., 25) of uint64 lanes (lane x + 5*y), one state per message in the
leading dims. Each round of Keccak-f[1600] is written lane by lane (theta, rho, pi, chi, iota as xor, rotate and
and-not on the 25 lane tensors) and realized as one kernel over the whole batch: per round the kernel reads the
previous state and writes the next one, so the graph the scheduler sees stays one round deep whatever the message
length. Messages of one tensor share their length, so the padding is the same bytes for all of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from speck.tensor.dims import as_int
from speck.tensor.errors import TensorValueError
from speck.tensor.schedule import base_buffer
from speck.uop import UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

# name -> (rate in bytes, domain-separation byte); the digest is (200 - rate) // 2 bytes (half the capacity)
KECCAK_CONFIGS: dict[str, tuple[int, int]] = {
    "sha3_224": (144, 0x06),
    "sha3_256": (136, 0x06),
    "sha3_384": (104, 0x06),
    "sha3_512": (72, 0x06),
    "shake_128": (168, 0x1F),
    "shake_256": (136, 0x1F),
}
ROUNDS = 24


def _round_constants() -> list[int]:
    """The iota constants: bit 2^j - 1 of round i's constant is bit 7i + j of the output of the LFSR
    x^8 + x^6 + x^5 + x^4 + 1 (FIPS 202, algorithm 5)."""
    r, bits = 1, []
    for _ in range(7 * ROUNDS):
        bits.append(r & 1)
        r = ((r << 1) ^ 0x171) if r & 0x80 else r << 1
    return [sum(bits[7 * i + j] << ((1 << j) - 1) for j in range(7)) for i in range(ROUNDS)]


def _rotations() -> list[int]:
    """rho's rotation per lane x + 5y: the t-th lane on the walk (1,0) -> (y, 2x+3y) turns by (t+1)(t+2)/2."""
    rot = [0] * 25
    x, y = 1, 0
    for t in range(24):
        rot[x + 5 * y] = (t + 1) * (t + 2) // 2 % 64
        x, y = y, (2 * x + 3 * y) % 5
    return rot


RC = _round_constants()
ROT = _rotations()


def _rotl(v: Tensor, n: Tensor | int) -> Tensor:
    """v rotated left by n bits (0 <= n < 64): (v >> 1) >> (63 - n) keeps n = 0 free of a 64-bit shift."""
    return (v << n) | ((v >> 1) >> (63 - n))


def _tile2(v: Tensor) -> Tensor:
    """(..., 5) -> (..., 10): the last dim twice in a row (movement only)."""
    return v.unsqueeze(-2).expand(*v.shape[:-1], 2, 5).reshape(*v.shape[:-1], 10)


def _roll_left(v: Tensor, k: int) -> Tensor:
    """out[..., x] = v[..., (x + k) % 5] along the last dim of size 5."""
    return _tile2(v)[..., k : k + 5]


def _skew(a: Tensor) -> Tensor:
    """out[..., r, c] = a[..., r, (r + c) % 5]: row r of the tiled (5, 10) block starts at r, which is a flat
    stride of 11 (so: flatten, pad to 55, view as rows of 11, keep 5)."""
    lead = a.shape[:-2]
    flat = _tile2(a).reshape(*lead, 50)
    return flat.pad(tuple([(0, 0)] * len(lead) + [(0, 5)])).reshape(*lead, 5, 11)[..., :5]


def keccak_round(a: Tensor, rot: Tensor, rc: Tensor) -> Tensor:
    """One round of Keccak-f[1600] on a (..., 5, 5) uint64 state indexed [y, x] (lane x + 5y); rot is rho's
    rotation per lane in that layout and rc the round constant (a 1-element tensor)."""
    rows = [a[..., y, :] for y in range(5)]
    c = rows[0] ^ rows[1] ^ rows[2] ^ rows[3] ^ rows[4]
    d = _roll_left(c, 4) ^ _rotl(_roll_left(c, 1), 1)  # c[x - 1] ^ rotl(c[x + 1], 1)
    r = _rotl(a ^ d.unsqueeze(-2), rot)  # theta, then rho
    # pi: lane (x, y) moves to (y, 2x + 3y), i.e. b[Y, X] = r[X, (X + 3Y) % 5]: skew row X by X, then pick the
    # columns 3Y % 5 in Y order and swap the two dims
    sk = _skew(r)
    b = _pick_columns(sk).transpose(-1, -2)
    # chi: each row mixes with the and-not of its two right neighbours; iota: lane (0, 0) takes the round constant
    out = b ^ (~_roll_left(b, 1) & _roll_left(b, 2))
    return out ^ rc.pad(((0, 24),)).reshape(5, 5)


def _pick_columns(v: Tensor) -> Tensor:
    """The columns 0, 3, 1, 4, 2 (3Y % 5 for Y = 0..4) of the last dim, in that order."""
    return v[..., 0:1].cat(v[..., 3:4], v[..., 1:2], v[..., 4:5], v[..., 2:3], dim=-1)


def keccak_f(state: Tensor) -> Tensor:
    """Keccak-f[1600] on a (..., 25) uint64 state: 24 rounds, one realized kernel each."""
    lead = tuple(as_int(s) for s in state.shape[:-1])
    cls = type(state)
    template, state_ph, rc_ph = _round_template(cls, lead, state.device)
    a = state.reshape(*lead, 5, 5)
    if base_buffer(a.uop) is None:  # (realizing a view of a buffer again would schedule nothing)
        a = a.contiguous().realize()
    for rc in _round_constant_buffers(cls, state.device):
        a = cls(template.substitute({state_ph: a.uop, rc_ph: rc.uop}), device=state.device).realize()
    return a.reshape(*lead, 25)


# (leading shape, device) -> (one round's graph over placeholder buffers, the state's and the round constant's
# placeholder nodes): each round substitutes the real buffers into it instead of building its ~50 tensor ops again
_TEMPLATES: dict[tuple[tuple[int, ...], str], tuple[UOp, UOp, UOp]] = {}


def _round_template(cls: type[Tensor], lead: tuple[int, ...], device: str) -> tuple[UOp, UOp, UOp]:
    if (entry := _TEMPLATES.get((lead, device))) is None:
        a = cls.empty(*lead, 5, 5, dtype=dtypes.uint64, device=device)
        rc = cls.empty(1, dtype=dtypes.uint64, device=device)
        out = keccak_round(a, _rotation_buffer(cls, device), rc).contiguous()
        entry = _TEMPLATES[(lead, device)] = (out.uop, a.uop, rc.uop)
    return entry


# device -> one realized (1,) uint64 tensor per round constant: read from a buffer, every round is the same
# kernel (a constant baked into each round would compile 24 kernels)
_RC_BUFFERS: dict[str, list[Tensor]] = {}


def _round_constant_buffers(cls: type[Tensor], device: str) -> list[Tensor]:
    if (bufs := _RC_BUFFERS.get(device)) is None:
        bufs = [cls(np.array([rc], np.uint64), device=device).realize() for rc in RC]
        _RC_BUFFERS[device] = bufs
    return bufs


_ROT_BUFFERS: dict[str, Tensor] = {}


def _rotation_buffer(cls: type[Tensor], device: str) -> Tensor:
    if (rot := _ROT_BUFFERS.get(device)) is None:
        rot = _ROT_BUFFERS[device] = cls(np.array(ROT, np.uint64).reshape(5, 5), device=device).realize()
    return rot


def _config(cfg: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(cfg, str):
        if cfg not in KECCAK_CONFIGS:
            raise TensorValueError(f"keccak: unknown cfg {cfg!r}; expected one of {sorted(KECCAK_CONFIGS)} or a "
                                   "(rate, dsbyte) tuple")  # fmt: skip
        return KECCAK_CONFIGS[cfg]
    if not (isinstance(cfg, tuple) and len(cfg) == 2 and all(isinstance(v, int) for v in cfg)):
        raise TensorValueError(f"keccak: cfg must be a name or a (rate, dsbyte) tuple of ints, got {cfg!r}")
    rate, dsbyte = cfg
    if not (0 < rate < 200 and rate % 8 == 0) or not 0 < dsbyte < 256:
        raise TensorValueError(f"keccak: rate must be a multiple of 8 in (0, 200) bytes and dsbyte a byte in (0, 256), "
                               f"got rate={rate}, dsbyte={dsbyte}")  # fmt: skip
    return rate, dsbyte


def keccak(t: Tensor, cfg: str | tuple[int, int] = "sha3_256") -> Tensor:
    """The Keccak sponge over t's last dim (its bytes; every leading index is one message): a uint8 tensor of
    shape (..., (200 - rate) // 2) holding each message's digest."""
    rate, dsbyte = _config(cfg)
    if t.ndim == 0:
        raise TensorValueError("keccak hashes over the last dim: expected at least 1 dim, got a 0-d tensor")
    if t.dtype != dtypes.uint8:  # the elements' bytes, little-endian
        t = t.bitcast(dtypes.uint8)
    lead, n = tuple(as_int(s) for s in t.shape[:-1]), as_int(t.shape[-1])
    # pad10*1 with the domain bits: dsbyte right after the message, 0x80 or-ed into the last byte of the last block
    nblocks = n // rate + 1
    pad = np.zeros(nblocks * rate - n, np.uint8)
    pad[0] ^= dsbyte
    pad[-1] ^= 0x80
    tail = type(t)(pad, device=t.device).reshape(*([1] * len(lead)), len(pad)).expand(*lead, len(pad))
    msg = t.cat(tail, dim=-1) if n else tail
    # blocks of rate bytes -> rate // 8 little-endian lanes, zero-extended to the 25 lanes of the state
    blocks = msg.reshape(*lead, nblocks, rate).bitcast(dtypes.uint64)
    blocks = blocks.pad(tuple([(0, 0)] * (len(lead) + 1) + [(0, 25 - rate // 8)]))
    state = type(t).zeros(*lead, 25, dtype=dtypes.uint64, device=t.device).contiguous()
    for i in range(nblocks):
        state = keccak_f(state ^ blocks[..., i, :])
    # squeeze: rate bytes of output per permutation (one is enough unless the rate is below the digest size)
    digest, outs = (200 - rate) // 2, [state.bitcast(dtypes.uint8)[..., :rate]]
    while len(outs) * rate < digest:
        state = keccak_f(state)
        outs.append(state.bitcast(dtypes.uint8)[..., :rate])
    out = outs[0].cat(*outs[1:], dim=-1) if len(outs) > 1 else outs[0]
    return out[..., :digest]


HASH_CHUNK = 1024  # bytes per leaf of Tensor.hash's tree: 7 shake_128 blocks, so one level is 7 * 25 round kernels


def tensor_hash(t: Tensor) -> Tensor:
    """A 16-byte tree hash of t's bytes (row-major, little-endian), as uint8: the bytes, zero-padded to whole
    HASH_CHUNK-byte chunks, are hashed chunk by chunk with shake_128 (16-byte digests, every chunk of a level at once);
    the concatenated digests are the next level, until one digest is left; the result is shake_128 of that digest and
    the byte count (8 bytes, little-endian), so zero-padding never makes two lengths hash alike."""
    data = t.contiguous().flatten()
    if data.dtype != dtypes.uint8:
        data = data.bitcast(dtypes.uint8)
    nbytes = as_int(data.shape[0])
    level = data
    while True:
        n = as_int(level.shape[0])
        chunks = max(1, -(-n // HASH_CHUNK))
        if chunks * HASH_CHUNK != n:
            level = level.pad(((0, chunks * HASH_CHUNK - n),))
        level = level.reshape(chunks, HASH_CHUNK).keccak("shake_128").flatten()
        if chunks == 1:
            break
    length = type(t)(np.frombuffer(nbytes.to_bytes(8, "little"), np.uint8).copy(), device=level.device)
    return level.cat(length).keccak("shake_128")
