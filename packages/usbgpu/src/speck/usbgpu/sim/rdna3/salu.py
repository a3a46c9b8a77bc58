"""Scalar ALU semantics and the SOP2, SOP1, SOPC and SOPK opcode tables (RDNA3 ISA chapter 16.1-16.5).

Each table maps opcode -> SOp(mnemonic, destination width, source widths, semantics). A semantics function gets the
waves and the source values, one per wave ((n,) uint32/uint64 arrays, or numpy scalars for constants), sets SCC
itself where the ISA says so, and returns the destination value (None: nothing to write). `fn=None` marks an opcode
the emulator knows by name but does not implement (EmulationError when executed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from speck.usbgpu.sim.rdna3.wave import EXEC, Waves, to_waves

U32, U64, I32, I64 = np.uint32, np.uint64, np.int32, np.int64
M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SOp:
    name: str
    dst: int | None  # destination width in bits (None: no scalar destination)
    srcs: tuple[int, ...]  # source widths in bits
    fn: Callable[..., Any] | None
    signed: bool = False  # a 64-bit literal source is sign-extended
    reads_dst: bool = False  # the current destination value is passed as a last source (s_cmov, s_bitset)


def _set_scc(w: Waves, cond: Any) -> None:
    scc = np.empty(w.n, dtype=bool)
    scc[:] = cond  # one value for all waves, or one per wave
    w.scc = scc


def _u(x: Any, bits: int = 32) -> Any:
    return np.asarray(x).astype(U64 if bits == 64 else U32)


def _i(x: Any, bits: int = 32) -> Any:
    return _u(x, bits).view(I64 if bits == 64 else I32)


def _logic(op: Callable[[Any, Any], Any], bits: int) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        d = _u(op(_u(a, bits), _u(b, bits)), bits)
        _set_scc(w, d != 0)
        return d

    return run


def _shift(kind: str, bits: int) -> Callable[..., Any]:
    mask = bits - 1

    def run(w: Waves, a: Any, b: Any) -> Any:
        n = _u(b) & U32(mask)
        if kind == "lshl":
            d = _u(a, bits) << n.astype(_u(a, bits).dtype)
        elif kind == "lshr":
            d = _u(a, bits) >> n.astype(_u(a, bits).dtype)
        else:
            d = _u(_i(a, bits) >> n.astype(_i(a, bits).dtype), bits)
        _set_scc(w, d != 0)
        return d

    return run


def _add_u32(w: Waves, a: Any, b: Any, carry: Any = 0) -> Any:
    t = _u(a, 64) + _u(b, 64) + _u(carry, 64)
    _set_scc(w, t >= U64(1 << 32))
    return _u(t)


def _sub_u32(w: Waves, a: Any, b: Any, borrow: Any = 0) -> Any:
    _set_scc(w, _u(b, 64) + _u(borrow, 64) > _u(a, 64))
    return _u(_u(a, 64) - _u(b, 64) - _u(borrow, 64))


def _add_i32(w: Waves, a: Any, b: Any) -> Any:
    d = _u(_u(a) + _u(b))
    _set_scc(w, ((_u(a) >> U32(31)) == (_u(b) >> U32(31))) & ((_u(a) >> U32(31)) != (d >> U32(31))))
    return d


def _sub_i32(w: Waves, a: Any, b: Any) -> Any:
    d = _u(_u(a) - _u(b))
    _set_scc(w, ((_u(a) >> U32(31)) != (_u(b) >> U32(31))) & ((_u(a) >> U32(31)) != (d >> U32(31))))
    return d


def _minmax(signed: bool, want_max: bool) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        x, y = (_i(a), _i(b)) if signed else (_u(a), _u(b))
        first = x > y if want_max else x < y
        _set_scc(w, first)
        return _u(np.where(first, x, y))

    return run


def _lshl_add(k: int) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        t = (_u(a, 64) << U64(k)) + _u(b, 64)
        _set_scc(w, t >= U64(1 << 32))
        return _u(t)

    return run


def _bfe(bits: int, signed: bool) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        off = _u(b) & U32(bits - 1)
        width = np.minimum((_u(b) >> U32(16)) & U32(0x7F), U32(bits))
        x = _u(a, bits) >> off.astype(_u(a, bits).dtype)
        d = _field(x, width, bits, signed)
        _set_scc(w, d != 0)
        return d

    return run


def _field(x: np.ndarray, width: np.ndarray, bits: int, signed: bool) -> Any:
    """The low `width` bits of x, zero- or sign-extended to `bits` (width 0 gives 0)."""
    ut = U64 if bits == 64 else U32
    w_: Any = width.astype(ut)
    full = w_ >= ut(bits)
    mask = np.where(full, ut((1 << bits) - 1), (ut(1) << np.where(full, ut(0), w_)) - ut(1))
    v = x & mask
    if signed:
        top = np.where(w_ == 0, ut(0), ut(1) << np.where(w_ == 0, ut(0), w_ - ut(1)))
        v = np.where(w_ == 0, ut(0), (v ^ top) - top)
    return v.astype(ut)


def _bfm(bits: int) -> Callable[..., Any]:
    ut = U64 if bits == 64 else U32

    def run(w: Waves, a: Any, b: Any) -> Any:
        width = _u(a) & U32(bits - 1)
        off = _u(b) & U32(bits - 1)
        return ((ut(1) << width.astype(ut)) - ut(1)) << off.astype(ut)

    return run


def _mul_hi(signed: bool) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        if signed:
            return _u((_i(a).astype(I64) * _i(b).astype(I64)) >> I64(32))
        return _u((_u(a, 64) * _u(b, 64)) >> U64(32))

    return run


def _cselect(bits: int) -> Callable[..., Any]:
    return lambda w, a, b: np.where(w.scc, _u(a, bits), _u(b, bits))


def _pack(lo_hi_a: int, lo_hi_b: int) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        x = (_u(a) >> U32(16 * lo_hi_a)) & U32(0xFFFF)
        y = (_u(b) >> U32(16 * lo_hi_b)) & U32(0xFFFF)
        return x | (y << U32(16))

    return run


def _absdiff(w: Waves, a: Any, b: Any) -> Any:
    d = _i(_u(a) - _u(b))
    d = _u(np.where(d < 0, -d, d))
    _set_scc(w, d != 0)
    return d


SOP2: dict[int, SOp] = {
    0: SOp("s_add_u32", 32, (32, 32), lambda w, a, b: _add_u32(w, a, b)),
    1: SOp("s_sub_u32", 32, (32, 32), lambda w, a, b: _sub_u32(w, a, b)),
    2: SOp("s_add_i32", 32, (32, 32), _add_i32),
    3: SOp("s_sub_i32", 32, (32, 32), _sub_i32),
    4: SOp("s_addc_u32", 32, (32, 32), lambda w, a, b: _add_u32(w, a, b, w.scc)),
    5: SOp("s_subb_u32", 32, (32, 32), lambda w, a, b: _sub_u32(w, a, b, w.scc)),
    6: SOp("s_absdiff_i32", 32, (32, 32), _absdiff),
    8: SOp("s_lshl_b32", 32, (32, 32), _shift("lshl", 32)),
    9: SOp("s_lshl_b64", 64, (64, 32), _shift("lshl", 64)),
    10: SOp("s_lshr_b32", 32, (32, 32), _shift("lshr", 32)),
    11: SOp("s_lshr_b64", 64, (64, 32), _shift("lshr", 64)),
    12: SOp("s_ashr_i32", 32, (32, 32), _shift("ashr", 32)),
    13: SOp("s_ashr_i64", 64, (64, 32), _shift("ashr", 64), signed=True),
    14: SOp("s_lshl1_add_u32", 32, (32, 32), _lshl_add(1)),
    15: SOp("s_lshl2_add_u32", 32, (32, 32), _lshl_add(2)),
    16: SOp("s_lshl3_add_u32", 32, (32, 32), _lshl_add(3)),
    17: SOp("s_lshl4_add_u32", 32, (32, 32), _lshl_add(4)),
    18: SOp("s_min_i32", 32, (32, 32), _minmax(True, False)),
    19: SOp("s_min_u32", 32, (32, 32), _minmax(False, False)),
    20: SOp("s_max_i32", 32, (32, 32), _minmax(True, True)),
    21: SOp("s_max_u32", 32, (32, 32), _minmax(False, True)),
    22: SOp("s_and_b32", 32, (32, 32), _logic(np.bitwise_and, 32)),
    23: SOp("s_and_b64", 64, (64, 64), _logic(np.bitwise_and, 64)),
    24: SOp("s_or_b32", 32, (32, 32), _logic(np.bitwise_or, 32)),
    25: SOp("s_or_b64", 64, (64, 64), _logic(np.bitwise_or, 64)),
    26: SOp("s_xor_b32", 32, (32, 32), _logic(np.bitwise_xor, 32)),
    27: SOp("s_xor_b64", 64, (64, 64), _logic(np.bitwise_xor, 64)),
    28: SOp("s_nand_b32", 32, (32, 32), _logic(lambda a, b: ~(a & b), 32)),
    29: SOp("s_nand_b64", 64, (64, 64), _logic(lambda a, b: ~(a & b), 64)),
    30: SOp("s_nor_b32", 32, (32, 32), _logic(lambda a, b: ~(a | b), 32)),
    31: SOp("s_nor_b64", 64, (64, 64), _logic(lambda a, b: ~(a | b), 64)),
    32: SOp("s_xnor_b32", 32, (32, 32), _logic(lambda a, b: ~(a ^ b), 32)),
    33: SOp("s_xnor_b64", 64, (64, 64), _logic(lambda a, b: ~(a ^ b), 64)),
    34: SOp("s_and_not1_b32", 32, (32, 32), _logic(lambda a, b: a & ~b, 32)),
    35: SOp("s_and_not1_b64", 64, (64, 64), _logic(lambda a, b: a & ~b, 64)),
    36: SOp("s_or_not1_b32", 32, (32, 32), _logic(lambda a, b: a | ~b, 32)),
    37: SOp("s_or_not1_b64", 64, (64, 64), _logic(lambda a, b: a | ~b, 64)),
    38: SOp("s_bfe_u32", 32, (32, 32), _bfe(32, False)),
    39: SOp("s_bfe_i32", 32, (32, 32), _bfe(32, True)),
    40: SOp("s_bfe_u64", 64, (64, 32), _bfe(64, False)),
    41: SOp("s_bfe_i64", 64, (64, 32), _bfe(64, True), signed=True),
    42: SOp("s_bfm_b32", 32, (32, 32), _bfm(32)),
    43: SOp("s_bfm_b64", 64, (32, 32), _bfm(64)),
    44: SOp("s_mul_i32", 32, (32, 32), lambda w, a, b: _u(_u(a) * _u(b))),
    45: SOp("s_mul_hi_u32", 32, (32, 32), _mul_hi(False)),
    46: SOp("s_mul_hi_i32", 32, (32, 32), _mul_hi(True)),
    48: SOp("s_cselect_b32", 32, (32, 32), _cselect(32)),
    49: SOp("s_cselect_b64", 64, (64, 64), _cselect(64)),
    50: SOp("s_pack_ll_b32_b16", 32, (32, 32), _pack(0, 0)),
    51: SOp("s_pack_lh_b32_b16", 32, (32, 32), _pack(0, 1)),
    52: SOp("s_pack_hh_b32_b16", 32, (32, 32), _pack(1, 1)),
    53: SOp("s_pack_hl_b32_b16", 32, (32, 32), _pack(1, 0)),
}


def _count(bits: int, fn: Callable[[np.ndarray, int], np.ndarray], scc: bool = True) -> Callable[..., Any]:
    def run(w: Waves, a: Any) -> Any:
        d = _u(fn(to_waves(_u(a, bits), w.n), bits))
        if scc:
            _set_scc(w, d != 0)
        return d

    return run


def _popcount(x: np.ndarray, bits: int) -> Any:
    x = np.asarray(x, dtype=U64)
    return np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(U32)


def _ctz(x: np.ndarray, bits: int) -> Any:
    """Index of the lowest 1 bit, -1 when none (S_CTZ_I32_B32/B64)."""
    x = np.asarray(x, dtype=U64)
    low = x & (~x + U64(1))  # isolates the lowest set bit (two's complement)
    idx = np.where(x == 0, -1, np.log2(np.where(low == 0, 1, low).astype(np.float64)).astype(np.int64))
    return idx.astype(I32).view(U32)


def _clz(x: np.ndarray, bits: int) -> Any:
    """Number of leading zeros before the first 1 from the MSB, -1 when none (S_CLZ_I32_U32/U64)."""
    x = np.asarray(x, dtype=U64)
    top = np.floor(np.log2(np.where(x == 0, 1, x).astype(np.float64))).astype(np.int64)
    # float64 rounds values >= 2**53 up across a power of two: correct the estimate by one where it overshot
    top = np.where((top > 0) & ((x >> np.minimum(top, 63).astype(U64)) == 0), top - 1, top)
    return np.where(x == 0, -1, bits - 1 - top).astype(I32).view(U32)


def _cls(x: np.ndarray, bits: int) -> Any:
    """Leading bits equal to the sign bit after it (S_CLS_I32 / _I64): -1 when every bit is the same."""
    it = I64 if bits == 64 else I32
    v: Any = np.asarray(x).astype(U64 if bits == 64 else U32).view(it)
    return _clz((v ^ (v >> it(bits - 1))).view(U64 if bits == 64 else U32), bits)


def _saveexec(combine: Callable[[np.ndarray, np.ndarray], np.ndarray], write_new: bool = False) -> Callable[..., Any]:
    """S_*_SAVEEXEC_B32 (D = old EXEC) and S_*_WREXEC_B32 (D = new EXEC); EXEC = combine(S0, EXEC), SCC = EXEC != 0."""

    def run(w: Waves, a: Any) -> Any:
        old = w.s[EXEC].copy()
        new = _u(combine(to_waves(_u(a), w.n), old))
        w.write_s(EXEC, new)
        _set_scc(w, new != 0)
        return new if write_new else old

    return run


def _not(bits: int) -> Callable[..., Any]:
    def run(w: Waves, a: Any) -> Any:
        d = _u(~_u(a, bits), bits)
        _set_scc(w, d != 0)
        return d

    return run


def _bitset(bits: int, value: int) -> Callable[..., Any]:
    ut = U64 if bits == 64 else U32

    def run(w: Waves, a: Any, d: Any) -> Any:
        bit = ut(1) << (_u(a) & U32(bits - 1)).astype(ut)
        return (_u(d, bits) | bit) if value else (_u(d, bits) & ~bit)

    return run


def _abs_i32(w: Waves, a: Any) -> Any:
    x = _i(a)
    d = _u(np.where(x < 0, -x, x))
    _set_scc(w, d != 0)
    return d


def _brev(bits: int) -> Callable[..., Any]:
    def run(w: Waves, a: Any) -> Any:
        x = to_waves(_u(a, bits), w.n).copy()
        rev = np.unpackbits(x.view(np.uint8).reshape(w.n, -1), axis=1, bitorder="little")[:, ::-1]
        return np.packbits(rev, axis=1, bitorder="little").reshape(-1).view(U64 if bits == 64 else U32)

    return run


SOP1: dict[int, SOp] = {
    0: SOp("s_mov_b32", 32, (32,), lambda w, a: a),
    1: SOp("s_mov_b64", 64, (64,), lambda w, a: a),
    2: SOp("s_cmov_b32", 32, (32,), lambda w, a, d: np.where(w.scc, _u(a), _u(d)), reads_dst=True),
    3: SOp("s_cmov_b64", 64, (64,), lambda w, a, d: np.where(w.scc, _u(a, 64), _u(d, 64)), reads_dst=True),
    4: SOp("s_brev_b32", 32, (32,), _brev(32)),
    5: SOp("s_brev_b64", 64, (64,), _brev(64)),
    8: SOp("s_ctz_i32_b32", 32, (32,), _count(32, _ctz, scc=False)),
    9: SOp("s_ctz_i32_b64", 32, (64,), _count(64, _ctz, scc=False)),
    10: SOp("s_clz_i32_u32", 32, (32,), _count(32, _clz, scc=False)),
    11: SOp("s_clz_i32_u64", 32, (64,), _count(64, _clz, scc=False)),
    12: SOp("s_cls_i32", 32, (32,), _count(32, _cls, scc=False)),
    13: SOp("s_cls_i32_i64", 32, (64,), _count(64, _cls, scc=False)),
    14: SOp("s_sext_i32_i8", 32, (32,), lambda w, a: _u(_u(a).astype(np.int8).astype(I32))),
    15: SOp("s_sext_i32_i16", 32, (32,), lambda w, a: _u(_u(a).astype(np.int16).astype(I32))),
    16: SOp("s_bitset0_b32", 32, (32,), _bitset(32, 0), reads_dst=True),
    17: SOp("s_bitset0_b64", 64, (32,), _bitset(64, 0), reads_dst=True),
    18: SOp("s_bitset1_b32", 32, (32,), _bitset(32, 1), reads_dst=True),
    19: SOp("s_bitset1_b64", 64, (32,), _bitset(64, 1), reads_dst=True),
    20: SOp("s_bitreplicate_b64_b32", 64, (32,), None),
    21: SOp("s_abs_i32", 32, (32,), _abs_i32),
    22: SOp("s_bcnt0_i32_b32", 32, (32,), _count(32, lambda x, b: U32(32) - _popcount(x, b))),
    23: SOp("s_bcnt0_i32_b64", 32, (64,), _count(64, lambda x, b: U32(64) - _popcount(x, b))),
    24: SOp("s_bcnt1_i32_b32", 32, (32,), _count(32, _popcount)),
    25: SOp("s_bcnt1_i32_b64", 32, (64,), _count(64, _popcount)),
    26: SOp("s_quadmask_b32", 32, (32,), None),
    27: SOp("s_quadmask_b64", 64, (64,), None),
    28: SOp("s_wqm_b32", 32, (32,), None),
    29: SOp("s_wqm_b64", 64, (64,), None),
    30: SOp("s_not_b32", 32, (32,), _not(32)),
    31: SOp("s_not_b64", 64, (64,), _not(64)),
    32: SOp("s_and_saveexec_b32", 32, (32,), _saveexec(lambda s, e: s & e)),
    34: SOp("s_or_saveexec_b32", 32, (32,), _saveexec(lambda s, e: s | e)),
    36: SOp("s_xor_saveexec_b32", 32, (32,), _saveexec(lambda s, e: s ^ e)),
    38: SOp("s_nand_saveexec_b32", 32, (32,), _saveexec(lambda s, e: ~(s & e))),
    40: SOp("s_nor_saveexec_b32", 32, (32,), _saveexec(lambda s, e: ~(s | e))),
    42: SOp("s_xnor_saveexec_b32", 32, (32,), _saveexec(lambda s, e: ~(s ^ e))),
    44: SOp("s_and_not0_saveexec_b32", 32, (32,), _saveexec(lambda s, e: ~s & e)),
    46: SOp("s_or_not0_saveexec_b32", 32, (32,), _saveexec(lambda s, e: ~s | e)),
    48: SOp("s_and_not1_saveexec_b32", 32, (32,), _saveexec(lambda s, e: s & ~e)),
    50: SOp("s_or_not1_saveexec_b32", 32, (32,), _saveexec(lambda s, e: s | ~e)),
    52: SOp("s_and_not0_wrexec_b32", 32, (32,), _saveexec(lambda s, e: ~s & e, write_new=True)),
    54: SOp("s_and_not1_wrexec_b32", 32, (32,), _saveexec(lambda s, e: s & ~e, write_new=True)),
    64: SOp("s_movrels_b32", 32, (32,), None),
    65: SOp("s_movrels_b64", 64, (64,), None),
    66: SOp("s_movreld_b32", 32, (32,), None),
    67: SOp("s_movreld_b64", 64, (64,), None),
    71: SOp("s_getpc_b64", 64, (), None),  # executed by the dispatcher (needs the pc)
    72: SOp("s_setpc_b64", None, (64,), None),
    73: SOp("s_swappc_b64", 64, (64,), None),
}
# the wave64 saveexec forms (odd opcodes) are not used by wave32 code: named for messages, not implemented
for _op in range(33, 56, 2):
    SOP1[_op] = SOp(SOP1[_op - 1].name.replace("_b32", "_b64"), 64, (64,), None)


def _cmp(op: Callable[[Any, Any], Any], kind: str) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> None:
        if kind == "i":
            x, y = _i(a), _i(b)
        elif kind == "u64":
            x, y = _u(a, 64), _u(b, 64)
        else:
            x, y = _u(a), _u(b)
        _set_scc(w, op(x, y))

    return run


def _bitcmp(bits: int, value: int) -> Callable[..., Any]:
    ut = U64 if bits == 64 else U32

    def run(w: Waves, a: Any, b: Any) -> None:
        bit = (_u(a, bits) >> (_u(b) & U32(bits - 1)).astype(ut)) & ut(1)
        _set_scc(w, bit == value)

    return run


_CMPS = [np.equal, np.not_equal, np.greater, np.greater_equal, np.less, np.less_equal]
_CMP_NAMES = ["eq", "lg", "gt", "ge", "lt", "le"]
SOPC: dict[int, SOp] = {}
for _k, (_f, _nm) in enumerate(zip(_CMPS, _CMP_NAMES)):
    SOPC[_k] = SOp(f"s_cmp_{_nm}_i32", None, (32, 32), _cmp(_f, "i"))
    SOPC[6 + _k] = SOp(f"s_cmp_{_nm}_u32", None, (32, 32), _cmp(_f, "u"))
SOPC[12] = SOp("s_bitcmp0_b32", None, (32, 32), _bitcmp(32, 0))
SOPC[13] = SOp("s_bitcmp1_b32", None, (32, 32), _bitcmp(32, 1))
SOPC[14] = SOp("s_bitcmp0_b64", None, (64, 32), _bitcmp(64, 0))
SOPC[15] = SOp("s_bitcmp1_b64", None, (64, 32), _bitcmp(64, 1))
SOPC[16] = SOp("s_cmp_eq_u64", None, (64, 64), _cmp(np.equal, "u64"))
SOPC[17] = SOp("s_cmp_lg_u64", None, (64, 64), _cmp(np.not_equal, "u64"))


def _sext16(imm: int) -> int:
    return imm - 0x10000 if imm & 0x8000 else imm


def _cmpk(op: Callable[[Any, Any], Any], signed: bool) -> Callable[..., Any]:
    def run(w: Waves, d: Any, imm: int) -> None:
        if signed:
            _set_scc(w, op(_i(d).astype(I64), _sext16(imm)))
        else:
            _set_scc(w, op(_u(d), U32(imm)))

    return run


def _addk(w: Waves, d: Any, imm: int) -> Any:
    return _add_i32(w, d, U32(_sext16(imm) & M32))


# SOPK: fn(w, current value of SDST, raw simm16) -> new SDST value or None
SOPK: dict[int, SOp] = {
    0: SOp("s_movk_i32", 32, (), lambda w, d, imm: U32(_sext16(imm) & M32)),
    1: SOp("s_version", None, (), lambda w, d, imm: None),
    2: SOp("s_cmovk_i32", 32, (), lambda w, d, imm: np.where(w.scc, U32(_sext16(imm) & M32), _u(d))),
    15: SOp("s_addk_i32", 32, (), _addk),
    16: SOp("s_mulk_i32", 32, (), lambda w, d, imm: _u(_u(d) * U32(_sext16(imm) & M32))),
    17: SOp("s_getreg_b32", 32, (), None),  # executed by the dispatcher (reads MODE)
    18: SOp("s_setreg_b32", None, (), None),
    19: SOp("s_setreg_imm32_b32", None, (), None),
    20: SOp("s_call_b64", 64, (), None),
    22: SOp("s_subvector_loop_begin", 32, (), None),
    23: SOp("s_subvector_loop_end", 32, (), None),
    24: SOp("s_waitcnt_vscnt", None, (), None),  # waits: executed by the dispatcher
    25: SOp("s_waitcnt_vmcnt", None, (), None),
    26: SOp("s_waitcnt_expcnt", None, (), None),
    27: SOp("s_waitcnt_lgkmcnt", None, (), None),
}
for _k, (_f, _nm) in enumerate(zip(_CMPS, _CMP_NAMES)):
    SOPK[3 + _k] = SOp(f"s_cmpk_{_nm}_i32", None, (), _cmpk(_f, True))
    SOPK[9 + _k] = SOp(f"s_cmpk_{_nm}_u32", None, (), _cmpk(_f, False))

# SOPP: opcode -> mnemonic; the dispatcher executes these (control flow, waits, barriers, mode changes)
SOPP: dict[int, str] = {
    0: "s_nop",
    1: "s_setkill",
    2: "s_sethalt",
    3: "s_sleep",
    4: "s_set_inst_prefetch_distance",
    5: "s_clause",
    7: "s_delay_alu",
    8: "s_waitcnt_depctr",
    9: "s_waitcnt",
    10: "s_wait_idle",
    11: "s_wait_event",
    16: "s_trap",
    17: "s_round_mode",
    18: "s_denorm_mode",
    31: "s_code_end",
    32: "s_branch",
    33: "s_cbranch_scc0",
    34: "s_cbranch_scc1",
    35: "s_cbranch_vccz",
    36: "s_cbranch_vccnz",
    37: "s_cbranch_execz",
    38: "s_cbranch_execnz",
    39: "s_cbranch_cdbgsys",
    40: "s_cbranch_cdbguser",
    41: "s_cbranch_cdbgsys_or_user",
    42: "s_cbranch_cdbgsys_and_user",
    48: "s_endpgm",
    49: "s_endpgm_saved",
    52: "s_wakeup",
    53: "s_setprio",
    54: "s_sendmsg",
    55: "s_sendmsghalt",
    56: "s_incperflevel",
    57: "s_decperflevel",
    58: "s_ttracedata",
    59: "s_ttracedata_imm",
    60: "s_icache_inv",
    61: "s_barrier",
}
