"""Instruction semantics of the RDNA3 emulator, one instruction at a time, against references written here from the
ISA reference's pseudo-code (Python integers and float64/rational arithmetic per lane): IEEE rounding, NaN
propagation and quieting, signed zeros, denormals and the MODE flush controls, 24-bit and high multiplies, masked
shift counts, carries, conversions with saturation, the transcendentals (the ISA's own examples, and 1 ULP elsewhere),
EXEC masking and the scalar ALU's SCC. Instructions are assembled by llvm-mc-16 (an independent encoder)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rdna3_llvm import encode
from speck.usbgpu.sim.rdna3.decode import decode_words
from speck.usbgpu.sim.rdna3.dispatch import DispatchPacket, Launch, Stats
from speck.usbgpu.sim.rdna3.memory import FlatMemory
from speck.usbgpu.sim.rdna3.wave import EXEC, VCC, Mode, Waves

_ENCODED: dict[str, list[int]] = {}


def wave(v: dict[int, object] | None = None, s: dict[int, int] | None = None, exec_mask: int = 0xFFFFFFFF) -> Waves:
    """One wave32 with VGPRs/SGPRs preset (uint32 bit patterns) and the given EXEC."""
    launch = Launch(DispatchPacket(0, 0, 0, 0), FlatMemory(), 1, 1, 0, Stats())
    regs = np.zeros((32, 1, 32), dtype=np.uint32)
    for r, val in (v or {}).items():
        regs[r, 0] = np.asarray(val, dtype=np.uint64).astype(np.uint32)
    sregs = np.zeros((128, 1), dtype=np.uint32)
    for r, sv in (s or {}).items():
        sregs[r, 0] = sv & 0xFFFFFFFF
    sregs[EXEC, 0] = exec_mask
    return Waves(launch, sregs, regs, np.zeros(1, bool), np.zeros(1, np.int64), np.zeros(1, np.int64), 0, Mode())


def execute(w: Waves, *lines: str) -> Waves:
    for line in lines:
        if line not in _ENCODED:
            _ENCODED[line] = encode(line)
        inst = decode_words(0, tuple(_ENCODED[line]))
        assert inst.run is not None, line
        with np.errstate(all="ignore"):  # as dispatch() runs instructions: IEEE exceptions are not errors
            inst.run(w)
    return w


def bits32() -> st.SearchStrategy[list[int]]:
    """32 lanes of float32 bit patterns, rich in the special classes (NaNs with payloads, infinities, zeros,
    denormals, the extremes)."""
    special = st.sampled_from(
        [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FC12345, 0x7F800000, 0xFF800000, 0, 0x80000000, 1]
        + [0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000, 0x33800000]
    )
    return st.lists(st.one_of(special, st.integers(0, 2**32 - 1)), min_size=32, max_size=32)


def f32(b: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", b))[0])


def bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", np.float32(x)))[0])


def is_nan(b: int) -> bool:
    return (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF) != 0


def nan_rule(srcs: list[int], compute: Callable[[], int]) -> int:
    """The ISA's NaN result: the first NaN operand, quieted; otherwise the computed value (an invalid operation
    computes the default NaN 0xffc00000)."""
    for x in srcs:
        if is_nan(x):
            return x | 0x00400000
    r = compute()
    return 0xFFC00000 if is_nan(r) else r


def exact_f32(value: Fraction | float) -> int:
    """A rational rounded once to float32 (round to nearest even), as bits."""
    if isinstance(value, float):
        return bits(value)
    if value == 0:
        return 0
    with np.errstate(over="ignore"):  # beyond float32's range: infinity
        return bits(float(np.float32(_round_to_f32(value))))


def _round_to_f32(q: Fraction) -> float:
    """Correct rounding of a rational to float32: via float64 rounded to odd (enough extra bits to round once)."""
    d = float(q)
    back = Fraction(d)
    if back != q and int(struct.unpack("<Q", struct.pack("<d", d))[0]) % 2 == 0:
        d = math.nextafter(d, math.inf if q > back else -math.inf)
    return d


def lanes(w: Waves, r: int) -> list[int]:
    return [int(x) for x in w.v[r, 0]]


def run_binary(op: str, a: list[int], b: list[int]) -> list[int]:
    return lanes(execute(wave({1: a, 2: b}), f"{op} v0, v1, v2"), 0)


def fadd_ref(x: int, y: int, sub: bool = False) -> int:
    fx, fy = f32(x), f32(y)
    if not (math.isfinite(fx) and math.isfinite(fy)):
        with np.errstate(all="ignore"):
            return nan_rule(
                [x, y], lambda: bits(np.float32(fx) - np.float32(fy) if sub else np.float32(fx) + np.float32(fy))
            )
    s = Fraction(fx) - Fraction(fy) if sub else Fraction(fx) + Fraction(fy)
    if s == 0:  # exact zero: -0 only for (-0) + (-0) (or -0 - +0)
        neg = (x >> 31) & ((y >> 31) ^ sub)
        return nan_rule([x, y], lambda: 0x80000000 if neg else 0)
    return nan_rule([x, y], lambda: exact_f32(s))


@settings(max_examples=60, deadline=None)
@given(bits32(), bits32())
def test_add_sub_round_to_nearest_even_with_isa_nans(a: list[int], b: list[int]) -> None:
    assert run_binary("v_add_f32_e32", a, b) == [fadd_ref(x, y) for x, y in zip(a, b)]
    assert run_binary("v_sub_f32_e32", a, b) == [fadd_ref(x, y, sub=True) for x, y in zip(a, b)]


def fmul_ref(x: int, y: int) -> int:
    fx, fy = f32(x), f32(y)
    if not (math.isfinite(fx) and math.isfinite(fy)) or fx == 0 or fy == 0:
        return nan_rule([x, y], lambda: bits(np.float32(fx) * np.float32(fy)))
    return nan_rule([x, y], lambda: exact_f32(Fraction(fx) * Fraction(fy)))


@settings(max_examples=60, deadline=None)
@given(bits32(), bits32())
def test_mul_is_correctly_rounded(a: list[int], b: list[int]) -> None:
    with np.errstate(all="ignore"):
        assert run_binary("v_mul_f32_e32", a, b) == [fmul_ref(x, y) for x, y in zip(a, b)]


def fma_ref(x: int, y: int, z: int) -> int:
    fx, fy, fz = f32(x), f32(y), f32(z)
    if not all(math.isfinite(v) for v in (fx, fy, fz)) or fx == 0 or fy == 0:
        with np.errstate(all="ignore"):
            return nan_rule([x, y, z], lambda: bits(np.float32(np.float64(fx) * np.float64(fy) + np.float64(fz))))
    s = Fraction(fx) * Fraction(fy) + Fraction(fz)
    return nan_rule([x, y, z], lambda: 0 if s == 0 else exact_f32(s))


@settings(max_examples=60, deadline=None)
@given(bits32(), bits32(), bits32())
def test_fma_rounds_once(a: list[int], b: list[int], c: list[int]) -> None:
    got = lanes(execute(wave({1: a, 2: b, 3: c}), "v_fma_f32 v0, v1, v2, v3"), 0)
    assert got == [fma_ref(x, y, z) for x, y, z in zip(a, b, c)]


def minmax_ref(x: int, y: int, want_max: bool) -> int:
    """V_MIN_F32/V_MAX_F32 in IEEE mode: a signaling NaN operand gives itself quieted, a quiet one the other
    operand; -0 < +0."""
    for v in (x, y):
        if is_nan(v) and not v & 0x00400000:
            return v | 0x00400000
    if is_nan(y):
        return x
    if is_nan(x):
        return y
    key = lambda b: (f32(b), -1 if b >> 31 else 0)
    return (max if want_max else min)(x, y, key=key) if key(x) != key(y) else y


@settings(max_examples=60, deadline=None)
@given(bits32(), bits32())
def test_min_max_ieee_mode(a: list[int], b: list[int]) -> None:
    assert run_binary("v_min_f32_e32", a, b) == [minmax_ref(x, y, False) for x, y in zip(a, b)]
    assert run_binary("v_max_f32_e32", a, b) == [minmax_ref(x, y, True) for x, y in zip(a, b)]


def test_denormals_follow_the_mode_register() -> None:
    tiny, half_tiny = 0x00000010, 0x00000008  # denormals
    w = wave({1: [tiny] * 32, 2: [half_tiny] * 32})
    assert lanes(execute(w, "v_add_f32_e32 v0, v1, v2"), 0)[0] == 0x18  # kept (FLOAT_DENORM_MODE_32 = 3)
    execute(w, "s_denorm_mode 0")  # flush inputs and outputs
    assert lanes(execute(w, "v_add_f32_e32 v0, v1, v2"), 0)[0] == 0
    assert lanes(execute(w, "v_mul_f32_e32 v0, -1.0, v1"), 0)[0] == 0x80000000  # flushed to a signed zero


U32 = 2**32 - 1


def ints32() -> st.SearchStrategy[list[int]]:
    edge = st.sampled_from([0, 1, 2, 31, 32, 33, 0x7FFFFF, 0x800000, 0xFFFFFF, 0x7FFFFFFF, 0x80000000, U32, U32 - 1])
    return st.lists(st.one_of(edge, st.integers(0, U32)), min_size=32, max_size=32)


def s32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


def s24(x: int) -> int:
    x &= 0xFFFFFF
    return x - (1 << 24) if x & 0x800000 else x


INT_OPS: dict[str, Callable[[int, int], int]] = {
    "v_mul_u32_u24_e32": lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) & U32,
    "v_mul_hi_u32_u24_e32": lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) >> 32,
    "v_mul_i32_i24_e32": lambda a, b: (s24(a) * s24(b)) & U32,
    "v_mul_hi_i32_i24_e32": lambda a, b: ((s24(a) * s24(b)) >> 32) & U32,
    "v_mul_lo_u32": lambda a, b: (a * b) & U32,
    "v_mul_hi_u32": lambda a, b: (a * b) >> 32,
    "v_mul_hi_i32": lambda a, b: ((s32(a) * s32(b)) >> 32) & U32,
    "v_lshlrev_b32_e32": lambda a, b: (b << (a & 31)) & U32,
    "v_lshrrev_b32_e32": lambda a, b: b >> (a & 31),
    "v_ashrrev_i32_e32": lambda a, b: (s32(b) >> (a & 31)) & U32,
    "v_min_i32_e32": lambda a, b: min(s32(a), s32(b)) & U32,
    "v_max_u32_e32": lambda a, b: max(a, b),
    "v_xnor_b32_e32": lambda a, b: ~(a ^ b) & U32,
    "v_bfm_b32": lambda a, b: (((1 << (a & 31)) - 1) << (b & 31)) & U32,
    "v_bcnt_u32_b32": lambda a, b: (bin(a).count("1") + b) & U32,
    "v_sub_nc_u32_e32": lambda a, b: (a - b) & U32,
}


@settings(max_examples=25, deadline=None)
@given(ints32(), ints32())
def test_integer_ops_wrap_mask_shifts_and_multiply_24_bits(a: list[int], b: list[int]) -> None:
    for op, ref in INT_OPS.items():
        assert run_binary(op, a, b) == [ref(x, y) for x, y in zip(a, b)], op


@settings(max_examples=25, deadline=None)
@given(ints32(), ints32(), ints32())
def test_three_operand_integer_ops(a: list[int], b: list[int], c: list[int]) -> None:
    w = wave({1: a, 2: b, 3: c})
    refs: dict[str, Callable[[int, int, int], int]] = {
        "v_bfe_u32 v0, v1, v2, v3": lambda x, y, z: (x >> (y & 31)) & ((1 << (z & 31)) - 1),
        "v_bfe_i32 v0, v1, v2, v3": lambda x, y, z: _sext_field((x >> (y & 31)) & ((1 << (z & 31)) - 1), z & 31),
        "v_alignbit_b32 v0, v1, v2, v3": lambda x, y, z: (((x << 32) | y) >> (z & 31)) & U32,
        "v_add3_u32 v0, v1, v2, v3": lambda x, y, z: (x + y + z) & U32,
        "v_lshl_add_u32 v0, v1, v2, v3": lambda x, y, z: ((x << (y & 31)) + z) & U32,
        "v_bfi_b32 v0, v1, v2, v3": lambda x, y, z: (x & y) | (~x & z & U32),
        "v_mad_u32_u24 v0, v1, v2, v3": lambda x, y, z: ((x & 0xFFFFFF) * (y & 0xFFFFFF) + z) & U32,
        "v_med3_i32 v0, v1, v2, v3": lambda x, y, z: sorted([s32(x), s32(y), s32(z)])[1] & U32,
        "v_perm_b32 v0, v1, v2, v3": _perm_ref,
    }
    for line, ref in refs.items():
        assert lanes(execute(w, line), 0) == [ref(x, y, z) for x, y, z in zip(a, b, c)], line


def _sext_field(v: int, width: int) -> int:
    if width == 0:
        return 0
    return (v - (1 << width) if v >> (width - 1) & 1 else v) & U32


def _perm_ref(a: int, b: int, sel: int) -> int:
    data = (a << 32) | b
    out = 0
    for k in range(4):
        s = (sel >> (8 * k)) & 0xFF
        if s >= 13:
            byte = 0xFF
        elif s == 12:
            byte = 0
        elif s >= 8:
            byte = 0xFF if data >> (8 * (2 * (s - 8) + 1) + 7) & 1 else 0
        else:
            byte = (data >> (8 * s)) & 0xFF
        out |= byte << (8 * k)
    return out


@settings(max_examples=25, deadline=None)
@given(ints32(), ints32(), ints32(), ints32())
def test_64_bit_add_through_carries_and_mad_u64(a: list[int], b: list[int], c: list[int], d: list[int]) -> None:
    w = execute(
        wave({1: a, 2: b, 3: c, 4: d}),
        "v_add_co_u32 v5, vcc_lo, v1, v3",
        "v_add_co_ci_u32_e32 v6, vcc_lo, v2, v4, vcc_lo",
        "v_mad_u64_u32 v[8:9], s0, v1, v2, v[3:4]",
    )
    total = [((y << 32 | x) + (z2 << 32 | z1)) for x, y, z1, z2 in zip(a, b, c, d)]
    assert lanes(w, 5) == [t & U32 for t in total] and lanes(w, 6) == [(t >> 32) & U32 for t in total]
    assert int(w.s[VCC, 0]) == sum(1 << k for k, t in enumerate(total) if t >> 64)
    mad = [x * y + (z2 << 32 | z1) for x, y, z1, z2 in zip(a, b, c, d)]
    assert lanes(w, 8) == [m & U32 for m in mad] and lanes(w, 9) == [(m >> 32) & U32 for m in mad]
    assert int(w.s[0, 0]) == sum(1 << k for k, m in enumerate(mad) if m >> 64)


def cvt_int_ref(x: int, lo: int, hi: int) -> int:
    f = f32(x)
    if math.isnan(f):
        return 0
    return max(lo, min(hi, math.trunc(f) if math.isfinite(f) else (hi if f > 0 else lo))) & U32


@settings(max_examples=40, deadline=None)
@given(bits32())
def test_float_to_int_conversions_truncate_and_saturate(a: list[int]) -> None:
    w = execute(wave({1: a}), "v_cvt_i32_f32_e32 v2, v1", "v_cvt_u32_f32_e32 v3, v1", "v_cvt_f16_f32_e32 v4, v1")
    assert lanes(w, 2) == [cvt_int_ref(x, -(2**31), 2**31 - 1) for x in a]
    assert lanes(w, 3) == [cvt_int_ref(x, 0, U32) for x in a]
    with np.errstate(all="ignore"):
        half = np.array(a, np.uint32).view(np.float32).astype(np.float16).view(np.uint16).tolist()
    assert [v & 0xFFFF for v in lanes(w, 4)] == [h | 0x200 if is_nan(x) else h for h, x in zip(half, a)]


@settings(max_examples=40, deadline=None)
@given(ints32())
def test_int_to_float_rounds_to_nearest_even(a: list[int]) -> None:
    w = execute(wave({1: a}), "v_cvt_f32_i32_e32 v2, v1", "v_cvt_f32_u32_e32 v3, v1")
    assert lanes(w, 2) == [exact_f32(Fraction(s32(x))) for x in a]
    assert lanes(w, 3) == [exact_f32(Fraction(x)) for x in a]


def test_pack_round_toward_zero() -> None:
    vals = [1.0009, -3.003, 70000.0, -np.inf, 65530.0, 5e-8]  # round-to-nearest would give 3c01 c202 7c00 .. 7c00 1
    a = [bits(v) for v in vals] + [0] * (32 - len(vals))
    got = lanes(execute(wave({1: a, 2: a}), "v_cvt_pk_rtz_f16_f32_e32 v0, v1, v2"), 0)[: len(vals)]
    want = [0x3C00, 0xC201, 0x7BFF, 0xFC00, 0x7BFF, 0x0000]  # truncated toward zero; a finite overflow saturates
    assert [g & 0xFFFF for g in got] == want and [g >> 16 for g in got] == want


# the ISA reference's functional examples, input -> output bits
ISA_EXAMPLES = {
    "v_exp_f32_e32": {0xFF800000: 0x00000000, 0x80000000: 0x3F800000, 0x7F800000: 0x7F800000},
    "v_log_f32_e32": {0xFF800000: 0xFFC00000, 0xBF800000: 0xFFC00000, 0x80000000: 0xFF800000, 0: 0xFF800000}
    | {0x3F800000: 0, 0x7F800000: 0x7F800000},
    "v_rcp_f32_e32": {0xFF800000: 0x80000000, 0xC0000000: 0xBF000000, 0x80000000: 0xFF800000, 0: 0x7F800000}
    | {0x7F800000: 0},
    "v_rsq_f32_e32": {0xFF800000: 0xFFC00000, 0x80000000: 0xFF800000, 0: 0x7F800000, 0x40800000: 0x3F000000}
    | {0x7F800000: 0},
    "v_sqrt_f32_e32": {0xFF800000: 0xFFC00000, 0x80000000: 0x80000000, 0: 0, 0x40800000: 0x40000000}
    | {0x7F800000: 0x7F800000},
    "v_sin_f32_e32": {0xFF800000: 0xFFC00000, 0xFF7FFFFF: 0, 0x80000000: 0x80000000, 0x3E800000: 0x3F800000}
    | {0x7F800000: 0xFFC00000},
    "v_cos_f32_e32": {0xFF800000: 0xFFC00000, 0xFF7FFFFF: 0x3F800000, 0x80000000: 0x3F800000, 0x3E800000: 0}
    | {0x7F800000: 0xFFC00000},
    "v_rcp_f16_e32": {0xFC00: 0x8000, 0xC000: 0xB800, 0x8000: 0xFC00, 0: 0x7C00, 0x7C00: 0},
    "v_sqrt_f16_e32": {0xFC00: 0xFE00, 0x8000: 0x8000, 0: 0, 0x4400: 0x4000, 0x7C00: 0x7C00},
    "v_rsq_f16_e32": {0xFC00: 0xFE00, 0x8000: 0xFC00, 0: 0x7C00, 0x4400: 0x3800, 0x7C00: 0},
    "v_log_f16_e32": {0xFC00: 0xFE00, 0xBC00: 0xFE00, 0x8000: 0xFC00, 0: 0xFC00, 0x3C00: 0, 0x7C00: 0x7C00},
    "v_exp_f16_e32": {0xFC00: 0, 0x8000: 0x3C00, 0x7C00: 0x7C00},
    "v_sin_f16_e32": {0xFC00: 0xFE00, 0xFBFF: 0, 0x8000: 0x8000, 0x3400: 0x3C00, 0x7BFF: 0, 0x7C00: 0xFE00},
    "v_cos_f16_e32": {0xFC00: 0xFE00, 0xFBFF: 0x3C00, 0x8000: 0x3C00, 0x3400: 0, 0x7BFF: 0x3C00, 0x7C00: 0xFE00},
}


def test_transcendentals_give_the_isa_examples() -> None:
    for op, table in ISA_EXAMPLES.items():
        ins = list(table) + [0] * (32 - len(table))
        got = lanes(execute(wave({1: ins}), f"{op} v0, v1"), 0)[: len(table)]
        mask = 0xFFFF if "f16" in op else U32
        assert [g & mask for g in got] == list(table.values()), op


def test_transcendentals_flush_float32_denormals() -> None:
    tiny = [0x00000001, 0x807FFFFF] + [0x00400000] * 30
    w = execute(wave({1: tiny}), "v_rcp_f32_e32 v2, v1", "v_log_f32_e32 v3, v1", "v_exp_f32_e32 v4, v5")
    assert lanes(w, 2)[:2] == [0x7F800000, 0xFF800000]  # 1/denormal = 1/0
    assert lanes(w, 3)[0] == 0xFF800000  # log2(denormal) = log2(0)
    w = execute(wave({1: [bits(-140.0)] * 32}), "v_exp_f32_e32 v2, v1")
    assert lanes(w, 2)[0] == 0  # 2**-140 is a denormal: flushed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100, width=32), min_size=32, max_size=32))
def test_transcendentals_are_within_one_ulp(xs: list[float]) -> None:
    a = [bits(x) for x in xs]
    w = execute(wave({1: a}), "v_exp_f32_e32 v2, v1", "v_sin_f32_e32 v3, v1", "v_sqrt_f32_e64 v4, |v1|")
    normal = lambda v: abs(v) >= 2.0**-126
    exp_ref = [2.0**x if normal(2.0**x) else 0.0 for x in xs]  # denormal results flush (V_EXP_F32's notes)
    sqrt_ref = [math.sqrt(abs(x)) if normal(x) else 0.0 for x in xs]  # denormal inputs flush (V_SQRT_F32's)
    for got, want in ((lanes(w, 2), exp_ref), (lanes(w, 3), [_sin_turns(x) for x in xs]), (lanes(w, 4), sqrt_ref)):
        for g, ref in zip(got, want):
            assert abs(_ordered(g) - _ordered(bits(ref))) <= 1, (g, ref)


def _sin_turns(x: float) -> float:
    """sin(2*pi*x) with whole and half turns exact (float64 leaves 1e-16 where the answer is 0)."""
    return 0.0 if (2 * x).is_integer() else math.sin(2 * math.pi * (x - round(x)))


def _ordered(b: int) -> int:
    return -(b & 0x7FFFFFFF) if b >> 31 else b


def test_exec_masks_vector_writes_and_compares() -> None:
    w = wave({1: list(range(32)), 2: [7] * 32}, exec_mask=0x0000FFF0)
    execute(w, "v_mov_b32_e32 v2, v1", "v_cmp_lt_u32_e32 vcc_lo, 9, v1")
    assert lanes(w, 2) == [7] * 4 + list(range(4, 16)) + [7] * 16  # inactive lanes keep their value
    assert int(w.s[VCC, 0]) == 0x0000FC00  # lanes 10..15: the compare is 0 for inactive lanes
    execute(w, "v_cmpx_gt_u32_e32 12, v1")
    assert int(w.s[EXEC, 0]) == 0x00000FF0 and not w.exec_full()


def test_sixteen_bit_halves_in_vop2_and_vop3() -> None:
    one, two = 0x3C00, 0x4000
    w = wave({1: [two << 16 | one] * 32, 2: [0xDEAD0000] * 32})
    execute(w, "v_add_f16_e32 v2, v1, v1")  # low halves; the high half of v2 is kept
    assert lanes(w, 2)[0] == 0xDEAD4000
    w.v[3, 0] = 0
    w = execute(w, "v_add_f16_e64 v3, v1, v1")  # VOP3 without op_sel: low halves
    assert lanes(w, 3)[0] & 0xFFFF == two
    inst = decode_words(0, (0x64040380 | 0x00000000,))  # VOP2 v_add_f16 with src0 = v1.h (code 256 + 128 + 1)
    assert "v_add_f16" in inst.name


SCALAR = [
    ("s_add_u32 s2, s0, s1", lambda a, b: ((a + b) & U32, (a + b) >> 32)),
    ("s_sub_u32 s2, s0, s1", lambda a, b: ((a - b) & U32, int(b > a))),
    ("s_add_i32 s2, s0, s1", lambda a, b: ((a + b) & U32, int(not -(2**31) <= s32(a) + s32(b) < 2**31))),
    ("s_min_i32 s2, s0, s1", lambda a, b: (min(s32(a), s32(b)) & U32, int(s32(a) < s32(b)))),
    ("s_max_u32 s2, s0, s1", lambda a, b: (max(a, b), int(a > b))),
    ("s_lshl_b32 s2, s0, s1", lambda a, b: ((a << (b & 31)) & U32, int((a << (b & 31)) & U32 != 0))),
    ("s_ashr_i32 s2, s0, s1", lambda a, b: ((s32(a) >> (b & 31)) & U32, int(s32(a) >> (b & 31) != 0))),
    ("s_bfe_u32 s2, s0, s1", lambda a, b: _sbfe(a, b)),
    ("s_mul_hi_u32 s2, s0, s1", lambda a, b: ((a * b) >> 32, None)),
    ("s_and_not1_b32 s2, s0, s1", lambda a, b: (a & ~b & U32, int(a & ~b & U32 != 0))),
    ("s_lshl2_add_u32 s2, s0, s1", lambda a, b: ((4 * a + b) & U32, int(4 * a + b >= 2**32))),
    ("s_pack_lh_b32_b16 s2, s0, s1", lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF0000), None)),
]


def _sbfe(a: int, b: int) -> tuple[int, int]:
    width = min((b >> 16) & 0x7F, 32)
    v = (a >> (b & 31)) & ((1 << width) - 1)
    return v, int(v != 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, U32), st.integers(0, U32), st.booleans())
def test_scalar_alu_results_and_scc(a: int, b: int, scc_in: bool) -> None:
    for line, ref in SCALAR:
        w = wave(s={0: a, 1: b})
        w.scc[:] = scc_in
        execute(w, line)
        want, scc = ref(a, b)
        assert int(w.s[2, 0]) == want, line
        assert bool(w.scc[0]) == (scc_in if scc is None else bool(scc)), line
    w = wave(s={0: a, 1: b, 4: 0xFFFFFFFF, 5: 0xFFFFFFFF})
    execute(w, "s_add_u32 s6, s0, s4", "s_addc_u32 s7, s1, s5")  # a 64-bit add through SCC
    assert (int(w.s[7, 0]) << 32 | int(w.s[6, 0])) == ((b << 32 | a) + 2**64 - 1) % 2**64
    execute(w, "s_cselect_b32 s8, s0, s1")
    assert int(w.s[8, 0]) == (a if w.scc[0] else b)


def test_saveexec_and_bit_scans() -> None:
    w = wave(s={0: 0x00FF00FF, 1: 0x00010000}, exec_mask=0x0F0F0F0F)
    execute(w, "s_and_saveexec_b32 s2, s0", "s_ctz_i32_b32 s3, s1", "s_clz_i32_u32 s4, s1", "s_bcnt1_i32_b32 s5, s0")
    assert int(w.s[2, 0]) == 0x0F0F0F0F and int(w.s[EXEC, 0]) == 0x000F000F and bool(w.scc[0])
    assert [int(w.s[r, 0]) for r in (3, 4, 5)] == [16, 15, 16]


def _dot_ref(a: int, b: int, c: int, bits: int, sa: bool, sb: bool, signed_c: bool, clamp: bool) -> int:
    """RDNA3 ISA V_DOT4_*/V_DOT8_*: c plus the products of the packed fields, exact, then wrapped (or saturated)."""

    def fields(x: int, signed: bool) -> list[int]:
        fs = [(x >> (i * bits)) & ((1 << bits) - 1) for i in range(32 // bits)]
        return [f - (1 << bits) if signed and f >> (bits - 1) else f for f in fs]

    total = (s32(c) if signed_c else c) + sum(x * y for x, y in zip(fields(a, sa), fields(b, sb)))
    if clamp:
        total = max(-(2**31), min(2**31 - 1, total)) if signed_c else max(0, min(U32, total))
    return total & U32


@settings(max_examples=25, deadline=None)
@given(ints32(), ints32(), ints32())
def test_integer_dot_products_with_signedness_and_clamp(a: list[int], b: list[int], c: list[int]) -> None:
    """What LLVM emits for an int8/uint8 matmul (v_dot4_u32_u8, v_dot4_i32_iu8 with neg_lo as the sign selectors)."""
    w = wave({1: a, 2: b, 3: c})
    cases = {  # line: (bits, src0 signed, src1 signed, signed result, clamp)
        "v_dot4_u32_u8 v0, v1, v2, v3": (8, False, False, False, False),
        "v_dot4_u32_u8 v0, v1, v2, v3 clamp": (8, False, False, False, True),
        "v_dot4_i32_iu8 v0, v1, v2, v3 neg_lo:[1,1,0]": (8, True, True, True, False),
        "v_dot4_i32_iu8 v0, v1, v2, v3 neg_lo:[1,0,0]": (8, True, False, True, False),
        "v_dot4_i32_iu8 v0, v1, v2, v3 neg_lo:[0,1,0] clamp": (8, False, True, True, True),
        "v_dot4_i32_iu8 v0, v1, v2, v3": (8, False, False, True, False),
        "v_dot8_u32_u4 v0, v1, v2, v3": (4, False, False, False, False),
        "v_dot8_i32_iu4 v0, v1, v2, v3 neg_lo:[1,1,0] clamp": (4, True, True, True, True),
    }
    for line, (nb, sa, sb, sc, cl) in cases.items():
        assert lanes(execute(w, line), 0) == [_dot_ref(x, y, z, nb, sa, sb, sc, cl) for x, y, z in zip(a, b, c)], line
