"""The operand space of the RDNA3 encodings (9-bit source fields, 7/8-bit scalar fields) and typed operand readers.

Codes 0-105 SGPRs, 106/107 VCC_LO/HI, 108-123 TTMPs, 124 NULL, 125 M0, 126/127 EXEC_LO/HI, 128 the integer 0,
129-192 the integers 1..64, 193-208 -1..-16, 235-238 the shared/private aperture base/limit, 240-248 the float
constants 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0, 1/(2*pi), 233/234 DPP8, 250 DPP16, 251 VCCZ, 252 EXECZ, 253 SCC,
255 a 32-bit literal that follows the instruction, 256-511 VGPRs (VALU sources only).

A float inline constant takes the format of the operand it feeds (f16 bits for a 16-bit operand, f64 bits for a
64-bit one); a literal feeding a 64-bit operand is padded with 32 zero bits below for f64, zero-extended for unsigned
and sign-extended for signed integers (RDNA3 ISA 7.2.2.2).
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.usbgpu.errors import EmulationError

if TYPE_CHECKING:
    from speck.usbgpu.sim.rdna3.wave import Waves

LITERAL, DPP8, DPP8FI, DPP16, VCCZ, EXECZ, SCC = 255, 233, 234, 250, 251, 252, 253
NULL_CODE = 124
SHARED_BASE, SHARED_LIMIT, PRIVATE_BASE, PRIVATE_LIMIT = 235, 236, 237, 238
# Where flat addresses reach LDS and scratch (the values src_shared_base / src_private_base return).
SHARED_APERTURE = 0x1000_0000_0000_0000
PRIVATE_APERTURE = 0x2000_0000_0000_0000
APERTURE_SIZE = 1 << 32
FLOAT_CONSTS = (0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0, 1.0 / (2.0 * math.pi))
INV_2PI_BITS = {16: 0x3118, 32: 0x3E22F983, 64: 0x3FC45F306DC9C882}  # 1/(2*pi) as each format rounds it
FLOAT_TEXT = ("0.5", "-0.5", "1.0", "-1.0", "2.0", "-2.0", "4.0", "-4.0", "0.15915494")
SPECIAL_NAMES = {106: "vcc_lo", 107: "vcc_hi", 124: "null", 125: "m0", 126: "exec_lo", 127: "exec_hi"}
SPECIAL_NAMES |= {SHARED_BASE: "src_shared_base", SHARED_LIMIT: "src_shared_limit"}
SPECIAL_NAMES |= {PRIVATE_BASE: "src_private_base", PRIVATE_LIMIT: "src_private_limit"}
SPECIAL_NAMES |= {VCCZ: "src_vccz", EXECZ: "src_execz", SCC: "src_scc"}


@dataclass(frozen=True)
class Ty:
    """An operand type: width in bits, the numpy dtype its bits are viewed as, and whether it is a float."""

    name: str
    bits: int
    dtype: np.dtype
    is_float: bool
    signed: bool


TYPES = {
    f"{kind}{bits}": Ty(f"{kind}{bits}", bits, np.dtype(f"{code}{bits // 8}"), kind == "f", kind in "fi")
    for bits in (16, 32, 64)
    for kind, code in (("f", "f"), ("i", "i"), ("u", "u"), ("b", "u"))
}
UINT: dict[int, np.dtype[Any]] = {16: np.dtype(np.uint16), 32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}


def constant_bits(code: int, bits: int, is_float: bool, signed: bool, literal: int | None) -> int | None:
    """The bit pattern an inline constant or literal gives an operand of `bits` bits; None for a register."""
    mask = (1 << bits) - 1
    if code == 128:
        return 0
    if 129 <= code <= 192:
        return code - 128
    if 193 <= code <= 208:
        return (192 - code) & mask
    if 240 <= code <= 248:
        if code == 248:
            return INV_2PI_BITS[bits]
        value = FLOAT_CONSTS[code - 240]
        fmt = {16: "<e", 32: "<f", 64: "<d"}[bits]
        return int.from_bytes(struct.pack(fmt, value), "little")
    if code == LITERAL:
        assert literal is not None
        if bits == 64:
            if is_float:
                return literal << 32
            if signed and literal & 0x80000000:
                return literal | 0xFFFFFFFF_00000000
        return literal & mask
    return None


def scalar_text(code: int, bits: int = 32, literal: int | None = None, is_float: bool = False) -> str:
    """LLVM's spelling of a scalar operand: s5, s[4:5], vcc_lo, exec_lo, m0, null, 1.0, 0x3ff, -4, ..."""
    n = bits // 32
    if code < 106:
        return f"s{code}" if n <= 1 else f"s[{code}:{code + n - 1}]"
    if 108 <= code <= 123:
        t = code - 108
        return f"ttmp{t}" if n <= 1 else f"ttmp[{t}:{t + n - 1}]"
    if code == 106 and n == 2:
        return "vcc"
    if code == 126 and n == 2:
        return "exec"
    if code in SPECIAL_NAMES:
        return SPECIAL_NAMES[code]
    if code == 128:
        return "0"
    if 129 <= code <= 192:
        return str(code - 128)
    if 193 <= code <= 208:
        return str(192 - code)
    if 240 <= code <= 248:
        return FLOAT_TEXT[code - 240]
    if code == LITERAL:
        assert literal is not None
        return f"0x{literal:x}"
    return f"<operand {code}>"


def vector_text(code: int, bits: int = 32, literal: int | None = None, hi16: bool | None = None) -> str:
    """A 9-bit VALU source: VGPRs print as v7, v[2:3] (or v7.l / v7.h for true16 halves), others as scalars."""
    if code >= 256:
        r = code - 256
        if hi16 is not None:
            return f"v{r}.{'h' if hi16 else 'l'}"
        n = max(1, bits // 32)
        return f"v{r}" if n == 1 else f"v[{r}:{r + n - 1}]"
    return scalar_text(code, bits, literal)


Reader = Callable[["Waves"], np.ndarray]


def scalar_reader(code: int, bits: int, literal: int | None, signed: bool = False) -> Reader:
    """A reader of a scalar-ALU operand: (n,) uint32 or uint64 per wave (a numpy scalar for constants)."""
    const = constant_bits(code, bits, False, signed, literal)
    if const is not None:
        value = UINT[bits].type(const)
        return _const_reader(value)
    return _sreg(code, bits)


def _sreg(code: int, bits: int) -> Reader:
    if code <= 127:
        if bits == 64:
            return lambda w: w.read_s64(code)
        return lambda w: w.s[code]
    if code == SCC:
        return lambda w: w.scc.astype(UINT[bits])
    if code == VCCZ:
        return lambda w: (w.s[106] == 0).astype(UINT[bits])
    if code == EXECZ:
        return lambda w: (w.s[126] == 0).astype(UINT[bits])
    if code in (SHARED_BASE, SHARED_LIMIT, PRIVATE_BASE, PRIVATE_LIMIT):
        base = SHARED_APERTURE if code in (SHARED_BASE, SHARED_LIMIT) else PRIVATE_APERTURE
        value = base if code in (SHARED_BASE, PRIVATE_BASE) else base + APERTURE_SIZE - 1
        const = np.uint64(value) if bits == 64 else np.uint32(value >> 32)  # a 32-bit read gives the high half
        return _const_reader(const)
    return _bad_operand(code)


def _bad_operand(code: int) -> Reader:
    """A reader for an operand code the emulator cannot read: decoding still succeeds (the disassembly shows the
    code), executing stops with EmulationError."""

    def read(w: Waves) -> np.ndarray:
        raise EmulationError(f"source operand code {code} ({scalar_text(code)}) is not implemented")

    return read


def vector_reader(
    code: int,
    ty: Ty,
    literal: int | None,
    *,
    hi: bool = False,
    absm: bool = False,
    negm: bool = False,
) -> Reader:
    """A reader of a VALU source as `ty` (shape (n, 32), (1,) or a scalar), with VOP3's abs/neg applied to floats
    by flipping bits (so NaN payloads survive). `hi` takes the high 16 bits of a 32-bit register for 16-bit types."""
    bits = ty.bits
    const = constant_bits(code, bits, ty.is_float, ty.signed, literal)
    if const is not None:
        if hi and bits == 16 and code == LITERAL:
            const = (literal or 0) >> 16
        raw: Reader = _const_reader(_apply_mods(UINT[bits].type(const), bits, absm, negm).view(ty.dtype))
        return raw
    if code >= 256:
        r = code - 256
        if bits == 32 and not (absm or negm):  # the commonest operand: one view of the register
            dtype32 = ty.dtype
            return (lambda w: w.v[r]) if dtype32 == np.uint32 else (lambda w: w.v[r].view(dtype32))
        if bits == 32:
            get: Reader = lambda w: w.v[r]
        elif bits == 64:
            get = lambda w: pair64(w.v[r], w.v[r + 1])
        elif hi:
            get = lambda w: (w.v[r] >> np.uint32(16)).astype(np.uint16)
        else:
            get = lambda w: w.v[r].astype(np.uint16)
    else:
        sget = _sreg(code, 64 if bits == 64 else 32)
        if bits == 16:
            shift = np.uint32(16 if hi else 0)
            get = lambda w: _lanes(np.asarray(sget(w) >> shift).astype(np.uint16))
        else:
            get = lambda w: _lanes(sget(w))
    dtype = ty.dtype
    if ty.is_float and (absm or negm):
        return lambda w: _apply_mods(get(w), bits, absm, negm).view(dtype)
    return lambda w: get(w).view(dtype)


def _lanes(x: Any) -> np.ndarray:
    """A scalar operand for a VALU op: per-wave values (n,) repeated into a contiguous (n, 32) array (numpy runs
    (n, 1)-against-(n, 32) broadcasts in inner loops of 32 lanes, several times slower than contiguous operands);
    a value common to every wave stays a one-element array."""
    x = np.asarray(x)
    return np.repeat(x[:, None], 32, axis=1) if x.ndim == 1 else x[..., None]


def pair64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two uint32 register arrays as one uint64 array (lo | hi << 32): two strided copies into the halves of a
    little-endian uint64 (no shifts, no temporaries)."""
    out = np.empty(lo.shape, np.uint64)
    halves = out[..., None].view(np.uint32)
    halves[..., 0] = lo
    halves[..., 1] = hi
    return out


def split64(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A uint64 array's low and high 32-bit halves, as views (the inverse of pair64)."""
    halves = np.ascontiguousarray(bits)[..., None].view(np.uint32)
    return halves[..., 0], halves[..., 1]


assert sys.byteorder == "little", "pair64/split64 view uint64 as (lo, hi) uint32 pairs"


def _const_reader(value: Any) -> Reader:
    return lambda w: value


def _apply_mods(x: Any, bits: int, absm: bool, negm: bool) -> Any:
    x = np.asarray(x, dtype=UINT[bits])
    sign = UINT[bits].type(1 << (bits - 1))
    if absm:
        x = x & ~sign
    if negm:
        x = x ^ sign
    return x
