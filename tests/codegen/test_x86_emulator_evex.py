"""EVEX (AVX-512) semantics of the x86-64 emulator, which this AVX2 host cannot run natively: zmm, xmm16-31,
opmasks, embedded broadcast, masked loads/stores, gathers, scatters, lane shuffles.

Objects are built with speck's encoder where it has the form, else assembled by GNU as (a test tool only); results
are compared with numpy, and lane-wise zmm forms with the CPU's own VEX ymm results on both halves.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import test_x86_kernels as tk
from codegen_x86emu import EmulationError, emulate
from test_x86_emulator import F32, fma_exact, gas_object, native, rng_f32

pytestmark = [pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None,
                                 reason="gcc links the native objects; objdump decodes for the emulator"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                         "ignore:invalid value encountered:RuntimeWarning")]  # fmt: skip


@pytest.mark.parametrize("width", [64, 32, 16])
def test_evex_arithmetic_from_speck_encoder(width: int) -> None:
    """zmm/ymm/xmm with registers 16-31, embedded broadcast and FMA, encoded by speck's EVEX encoder."""
    from speck.codegen.x86.assembler import assemble
    from speck.codegen.x86.elf_object import write_elf_object
    from speck.codegen.x86.operands import Inst, Mem, Reg, gpr
    from speck.codegen.x86.ops import X86Op as O

    v = lambda n: Reg("vec", n, width)
    rdi, rsi, rdx, rcx = (gpr(r) for r in ("rdi", "rsi", "rdx", "rcx"))
    code = [
        Inst(O.VMOVUPS, (v(1), Mem(rsi))),
        Inst(O.VMOVUPS, (v(17), Mem(rdx))),
        Inst(O.VADDPS, (v(2), v(1), v(17))),
        Inst(O.VMULPS, (v(30), v(2), Mem(rcx, broadcast=True))),
        Inst(O.VMOVUPS, (v(31), v(30))),
        Inst(O.VFMADD231PS, (v(31), v(1), v(17))),
        Inst(O.VMAXPS, (v(20), v(1), v(17))),
        Inst(O.VBROADCASTSS, (v(21), Mem(rcx))),
        Inst(O.VDIVPS, (v(21), v(1), v(21))),
        Inst(O.VMOVUPS, (Mem(rdi), v(30))),
        Inst(O.VMOVUPS, (Mem(rdi, disp=width), v(31))),
        Inst(O.VMOVUPS, (Mem(rdi, disp=2 * width), v(20))),
        Inst(O.VMOVUPS, (Mem(rdi, disp=3 * width), v(21))),
        Inst(O.RET, ()),
    ]
    asm = assemble(code)
    lib = write_elf_object("evex_arith", asm.code, asm.relocations)
    n = width // 4
    a, b, s = rng_f32(1, n), rng_f32(2, n), np.array([1.75], F32)
    out = np.zeros(4 * n, F32)
    stats = emulate(lib, "evex_arith", [out, a, b, s])
    with np.errstate(all="ignore"):
        prod = (a + b) * s[0]
        fma = np.array([fma_exact(x, y, z, F32) for x, y, z in zip(a, b, prod)], F32)
        mx = np.where(a > b, a, b)
        div = a / s[0]
    for got, want in ((out[:n], prod), (out[n : 2 * n], fma), (out[2 * n : 3 * n], mx), (out[3 * n :], div)):
        assert tk.same_bits(got, want, tk.dtypes.float32), (got, want)
    name = {64: "zmm", 32: "ymm", 16: "xmm"}[width]
    assert f"vmulps {name},{name},m32bcst" in stats.forms and f"vfmadd231ps {name},{name},{name}" in stats.forms


MASKED = """
    kmovw k1, ecx
    vmovups zmm0{k1}{z}, [rsi]
    vmovups zmm1, [rdx]
    vaddps zmm1{k1}, zmm1, zmm0
    vmovups [rdi]{k1}, zmm1
    vmulps zmm2{k1}{z}, zmm0, DWORD PTR [rdx]{1to16}
    vmovups [rdi+64], zmm2
    ret
"""


@pytest.mark.parametrize("count", [0, 1, 7, 10, 16])
def test_masked_loads_and_stores_touch_only_enabled_lanes(count: int) -> None:
    """A {k}{z} load of `count` floats from a buffer that holds exactly `count`: lanes past it would fault (the
    buffer's neighbours are unmapped), masked-off lanes neither fault nor change memory."""
    lib = gas_object(MASKED)
    k = (1 << count) - 1
    a = rng_f32(3, count)
    b = rng_f32(4, 16)
    out = np.full(32, 9.0, F32)
    stats = emulate(lib, "kern", [out, a, b, k])
    lanes = np.arange(16) < count
    a16 = np.zeros(16, F32)
    a16[:count] = a
    with np.errstate(all="ignore"):
        want_lo = np.where(lanes, b + a16, 9.0).astype(F32)
        want_hi = np.where(lanes, a16 * b[0], 0.0).astype(F32)
    assert tk.same_bits(out[:16], want_lo, tk.dtypes.float32)
    assert tk.same_bits(out[16:], want_hi, tk.dtypes.float32)
    assert {"vmovups zmm{k}{z},m512", "vmovups m512{k},zmm", "vmulps zmm{k}{z},zmm,m32bcst"} <= set(stats.forms)
    if count < 16:  # the same load without its mask reads past the buffer
        with pytest.raises(EmulationError, match=r"outside mapped memory[\s\S]*vmovups zmm0,ZMMWORD PTR \[rsi\]"):
            emulate(gas_object(MASKED.replace("zmm0{k1}{z}", "zmm0")), "kern", [out, a, b, k])


def _kbits(out: np.ndarray) -> list[int]:
    return [int(x) for x in out.view(np.uint32)]


FLOAT_PREDICATES = {"lt": lambda a, b: a < b, "unord": lambda a, b: np.isnan(a) | np.isnan(b),
                    "neq": lambda a, b: ~(a == b), "ge": lambda a, b: a >= b, "nle": lambda a, b: ~(a <= b),
                    "eq_uq": lambda a, b: (a == b) | np.isnan(a) | np.isnan(b)}  # fmt: skip


@pytest.mark.parametrize("pred", sorted(FLOAT_PREDICATES))
def test_compares_into_opmasks_and_opmask_logic(pred: str) -> None:
    """vcmpps/vpcmpd into k registers, k logic, kortestw flags, kmov to a GPR, and blend/select by mask."""
    imm = [p for p in ("eq", "lt", "le", "unord", "neq", "nlt", "nle", "ord", "eq_uq")].index(pred) if pred != "ge" \
        else 13  # fmt: skip
    lib = gas_object(f"""
    vmovups zmm0, [rsi]
    vmovups zmm1, [rdx]
    vcmpps k1, zmm0, zmm1, {imm}
    vpcmpd k2, zmm0, zmm1, 1
    kandw k3, k1, k2
    korw k4, k1, k2
    kxorw k5, k1, k2
    knotw k6, k1
    kmovw eax, k1
    mov [rdi], eax
    kmovw [rdi+4], k3
    kmovw eax, k4
    mov [rdi+8], eax
    kmovw eax, k5
    mov [rdi+12], eax
    kmovw eax, k6
    mov [rdi+16], eax
    kortestw k1, k1
    setz BYTE PTR [rdi+20]
    setc BYTE PTR [rdi+24]
    vcmpps k7{{k2}}, zmm0, zmm1, {imm}
    kmovw [rdi+28], k7
    vblendmps zmm3{{k1}}, zmm0, zmm1
    vmovups [rdi+64], zmm3
    vpblendmd zmm4{{k2}}{{z}}, zmm0, zmm1
    vmovups [rdi+128], zmm4
    ret
""")
    a, b = rng_f32(5, 16), rng_f32(6, 16)
    b[::3] = a[::3]
    out = np.zeros(48, F32)
    stats = emulate(lib, "kern", [out, a, b])

    def bits(x: np.ndarray) -> int:
        return sum(1 << i for i, t in enumerate(x) if t)

    with np.errstate(all="ignore"):
        k1, k2 = bits(FLOAT_PREDICATES[pred](a, b)), bits(a.view(np.int32) < b.view(np.int32))
    got = _kbits(out[:8])
    assert got[:5] == [k1, k1 & k2, k1 | k2, k1 ^ k2, ~k1 & 0xFFFF]
    assert got[5] == (k1 == 0) and got[6] == (k1 == 0xFFFF) and got[7] == k1 & k2
    sel = np.array([k1 >> i & 1 for i in range(16)], bool)
    assert tk.same_bits(out[16:32], np.where(sel, b, a), tk.dtypes.float32)
    sel2 = np.array([k2 >> i & 1 for i in range(16)], bool)
    np.testing.assert_array_equal(out[32:48].view(np.uint32), np.where(sel2, b.view(np.uint32), 0))
    assert {"vcmpps k,zmm,zmm,imm", "vpcmpltd k,zmm,zmm", "kortestw k,k", "vblendmps zmm{k},zmm,zmm"} <= set(
        stats.forms) or any(f.startswith("vcmp") and f.endswith("ps k,zmm,zmm") for f in stats.forms)  # fmt: skip


def test_permutes_broadcasts_and_upper_zeroing() -> None:
    lib = gas_object("""
    vmovups zmm0, [rsi]
    vmovups zmm1, [rdx]
    vmovdqu32 zmm2, [rcx]
    vpermps zmm3, zmm2, zmm0
    vmovups [rdi], zmm3
    vmovdqa64 zmm4, zmm2
    vpermt2ps zmm4, zmm2, zmm1
    vmovups zmm5, zmm2
    vpermi2ps zmm5, zmm0, zmm1
    vpermt2ps zmm0, zmm2, zmm1
    vmovups [rdi+64], zmm0
    vmovups [rdi+128], zmm5
    vpbroadcastd zmm6, r8d
    vmovups [rdi+192], zmm6
    vpternlogd zmm7, zmm7, zmm7, 0xff
    vaddps xmm7, xmm1, xmm1
    vmovups [rdi+256], zmm7
    vpternlogd zmm16, zmm16, zmm16, 0xff
    vaddps xmm16, xmm1, xmm1
    vmovups [rdi+320], zmm16
    vextractf32x8 ymm8, zmm1, 1
    vinsertf32x4 zmm9, zmm1, xmm1, 3
    vmovups [rdi+384], ymm8
    vmovups [rdi+448], zmm9
    vcvttps2dq zmm10, zmm1
    vmovdqu32 [rdi+512], zmm10
    ret
""")
    a, b = rng_f32(7, 16), rng_f32(8, 16)
    idx = np.random.default_rng(9).integers(0, 64, 16).astype(np.int32)  # bits above 4 (t2/i2: above 5) ignored
    out = np.zeros(16 * 9, F32)
    emulate(lib, "kern", [out, a, b, idx, -12345])
    u = lambda x: x.view(np.uint32)
    both = np.concatenate([a, b])
    np.testing.assert_array_equal(u(out[:16]), u(a[idx % 16]))
    np.testing.assert_array_equal(u(out[16:32]), u(both[idx % 32]))  # t2: table 1 = the old destination (a)
    np.testing.assert_array_equal(u(out[32:48]), u(both[idx % 32]))  # i2: indices in the destination
    np.testing.assert_array_equal(out[48:64].view(np.int32), np.full(16, -12345))
    for at in (64, 80):  # the VEX and the EVEX xmm write both zero bits 511:128
        assert tk.same_bits(out[at : at + 4], b[:4] + b[:4], tk.dtypes.float32) and not out[at + 4 : at + 16].any()
    np.testing.assert_array_equal(u(out[96:104]), u(b[8:]))
    np.testing.assert_array_equal(u(out[112:128]), u(np.concatenate([b[:12], b[:4]])))
    with np.errstate(all="ignore"):
        t = np.trunc(b.astype(np.float64))
        want = np.where((t >= -(2.0**31)) & (t < 2.0**31), np.nan_to_num(t), -(2.0**31)).astype(np.int64)
    np.testing.assert_array_equal(out[128:144].view(np.int32), want.astype(np.int32))


def test_evex_integer_logic_rounding_lane_moves_against_numpy() -> None:
    """The zmm forms the AVX-512 selection emits beyond plain arithmetic, with masks where it uses them."""
    lib = gas_object("""
    kmovw k1, ecx
    vmovups zmm0, [rsi]
    vmovups zmm1, [rdx]
    vptestmd k2, zmm0, zmm1
    kmovw [rdi], k2
    vptestnmd k3{k1}, zmm0, zmm0
    kmovw [rdi+4], k3
    vpcmpneqd k4, zmm0, DWORD BCST [rdx]
    kmovw [rdi+8], k4
    vpxord zmm2{k1}{z}, zmm0, zmm1
    vmovdqu32 [rdi+64], zmm2
    vpandd zmm3, zmm0, zmm1
    vpandnd zmm3{k1}, zmm0, zmm1
    vmovdqu32 [rdi+128], zmm3
    vpslld zmm4, zmm0, 3
    vpsrld zmm4{k1}, zmm4, 7
    vmovdqu32 [rdi+192], zmm4
    vrndscaleps zmm5, zmm0, 0x1
    vmovups [rdi+256], zmm5
    vrndscaleps zmm5, zmm0, 0x23
    vmovups [rdi+320], zmm5
    vextractf64x4 ymm6, zmm1, 1
    vinsertf64x4 zmm7, zmm0, ymm6, 0
    vmovups [rdi+384], zmm7
    vextractf32x4 xmm8, zmm1, 2
    vmovups [rdi+448], xmm8
    ret
""")
    a, b = rng_f32(40, 16), rng_f32(41, 16)
    a[3], b[3] = 0.0, 5.0
    b[0] = a[5]
    k = 0b1010_0110_1100_0101
    out = np.zeros(8 * 16 + 4, F32)
    stats = emulate(lib, "kern", [out, a, b, k])
    ua, ub, u = a.view(np.uint32), b.view(np.uint32), out.view(np.uint32)
    sel = np.array([k >> i & 1 for i in range(16)], bool)

    def bits(x: np.ndarray) -> int:
        return sum(1 << i for i, t in enumerate(x) if t)

    assert u[0] == bits((ua & ub) != 0) and u[1] == bits(ua == 0) & k and u[2] == bits(ua != ub[0])
    np.testing.assert_array_equal(u[16:32], np.where(sel, ua ^ ub, 0))
    np.testing.assert_array_equal(u[32:48], np.where(sel, ~ua & ub, ua & ub))
    np.testing.assert_array_equal(u[48:64], np.where(sel, (ua << 3) >> 7, ua << 3))
    with np.errstate(all="ignore"):
        floor = np.floor(a)
        quarter = np.where(np.isfinite(a) & (np.abs(a) < 2.0**21), np.trunc(a.astype(np.float64) * 4) / 4, a)
    assert tk.same_bits(out[64:80], floor, tk.dtypes.float32)
    assert tk.same_bits(out[80:96], quarter.astype(F32), tk.dtypes.float32)
    np.testing.assert_array_equal(u[96:112], np.concatenate([ub[8:], ua[8:]]))
    np.testing.assert_array_equal(u[112:116], ub[8:12])
    assert {"vptestmd k,zmm,zmm", "vptestnmd k{k},zmm,zmm", "vpcmpneqd k,zmm,m32bcst", "vpxord zmm{k}{z},zmm,zmm",
            "vrndscaleps zmm,zmm,imm", "vinsertf64x4 zmm,zmm,ymm,imm"} <= set(stats.forms)  # fmt: skip


def test_opmask_widths_shifts_and_aliased_arguments() -> None:
    lib = gas_object("""
    mov eax, 0xF0F0
    kmovw k1, eax
    kmovb k2, k1
    kmovb [rdi], k2
    kshiftrw k3, k1, 4
    kmovw [rdi+2], k3
    kshiftlw k4, k1, 12
    kmovw [rdi+4], k4
    mov rax, -2
    kmovq k5, rax
    kmovd ecx, k5
    mov [rdi+8], ecx
    kmovq [rdi+16], k5
    kxnorw k6, k1, k1
    kmovw [rdi+6], k6
    ktestw k1, k3
    setz BYTE PTR [rdi+24]
    setc BYTE PTR [rdi+25]
    mov eax, [rsi+2]
    mov [rdi+28], eax
    ret
""")
    out = np.zeros(32, np.uint8)
    emulate(lib, "kern", [out, out])  # the same array twice: one mapping, so [rsi+2] reads what [rdi+2] got
    u16 = out[:8].view(np.uint16)
    assert out[0] == 0xF0 and u16[1] == 0x0F0F and u16[2] == 0 and u16[3] == 0xFFFF
    assert out[8:12].view(np.uint32)[0] == 0xFFFF_FFFE and out[16:24].view(np.uint64)[0] == 2**64 - 2
    assert out[24] == ((0xF0F0 & 0x0F0F) == 0) and out[25] == ((~0xF0F0 & 0x0F0F & 0xFFFF) == 0)
    assert out[28:32].tolist() == [0x0F, 0x0F, 0, 0]


def test_evex_gather_with_opmask() -> None:
    lib = gas_object("""
    kmovw k1, ecx
    vmovdqu32 zmm1, [rsi]
    vmovups zmm0, [rsi+64]
    vgatherdps zmm0{k1}, [rdx+zmm1*4]
    vmovups [rdi], zmm0
    kmovw [rdi+64], k1
    ret
""")
    g = np.random.default_rng(15)
    table, init = rng_f32(16, 40), rng_f32(17, 16)
    k = 0b0110_1001_1100_0011
    sel = np.array([k >> i & 1 for i in range(16)], bool)
    idx = np.where(sel, g.integers(0, 40, 16), 1 << 29).astype(np.int32)
    out = np.zeros(17, F32)
    emulate(lib, "kern", [out, np.concatenate([idx.view(F32), init]), table, k])
    np.testing.assert_array_equal(out[:16].view(np.uint32), np.where(sel, table[idx % 40], init).view(np.uint32))
    assert out[16:].view(np.uint32)[0] == 0  # k1 cleared by the completed gather


# ---------------------------------------------------------------------------------------------------------------------
# EVEX lane-wise forms against this CPU's VEX forms: the zmm result must be the two ymm halves the CPU computes,
# write-masked ({k} merge or {k}{z} zero) lane by lane

EVEX_VS_VEX = [  # (EVEX form with zmm2{MASK} destination, the VEX sequence computing ymm2 from ymm0, ymm1, ymm2)
    ("vaddps zmm2{MASK}, zmm0, zmm1", "vaddps ymm2, ymm0, ymm1"),
    ("vsubps zmm2{MASK}, zmm1, zmm0", "vsubps ymm2, ymm1, ymm0"),
    ("vmulps zmm2{MASK}, zmm0, zmm1", "vmulps ymm2, ymm0, ymm1"),
    ("vdivps zmm2{MASK}, zmm0, zmm1", "vdivps ymm2, ymm0, ymm1"),
    ("vmaxps zmm2{MASK}, zmm0, zmm1", "vmaxps ymm2, ymm0, ymm1"),
    ("vminps zmm2{MASK}, zmm1, zmm0", "vminps ymm2, ymm1, ymm0"),
    ("vsqrtps zmm2{MASK}, zmm0", "vsqrtps ymm2, ymm0"),
    ("vfmadd231ps zmm2{MASK}, zmm0, zmm1", "vfmadd231ps ymm2, ymm0, ymm1"),
    ("vfmadd231ps zmm2{MASK}, zmm0, DWORD BCST [rdx]", "vbroadcastss ymm3, [rdx]\nvfmadd231ps ymm2, ymm0, ymm3"),
    ("vmulps zmm2{MASK}, zmm1, DWORD BCST [rdx+4]", "vbroadcastss ymm3, [rdx+4]\nvmulps ymm2, ymm1, ymm3"),
    ("vcvttps2dq zmm2{MASK}, zmm0", "vcvttps2dq ymm2, ymm0"),
    ("vcvtdq2ps zmm2{MASK}, zmm1", "vcvtdq2ps ymm2, ymm1"),
    ("vrndscaleps zmm2{MASK}, zmm0, 0x1", "vroundps ymm2, ymm0, 0x1"),
    ("vrndscaleps zmm2{MASK}, zmm0, 0x4", "vroundps ymm2, ymm0, 0x4"),
    ("vpaddd zmm2{MASK}, zmm0, zmm1", "vpaddd ymm2, ymm0, ymm1"),
    ("vpsubd zmm2{MASK}, zmm0, zmm1", "vpsubd ymm2, ymm0, ymm1"),
    ("vpmulld zmm2{MASK}, zmm0, zmm1", "vpmulld ymm2, ymm0, ymm1"),
    ("vpandd zmm2{MASK}, zmm0, zmm1", "vpand ymm2, ymm0, ymm1"),
    ("vpandnd zmm2{MASK}, zmm0, zmm1", "vpandn ymm2, ymm0, ymm1"),
    ("vpord zmm2{MASK}, zmm0, zmm1", "vpor ymm2, ymm0, ymm1"),
    ("vpxord zmm2{MASK}, zmm0, zmm1", "vpxor ymm2, ymm0, ymm1"),
    ("vxorps zmm2{MASK}, zmm0, zmm1", "vxorps ymm2, ymm0, ymm1"),
    ("vpslld zmm2{MASK}, zmm0, 0x7", "vpslld ymm2, ymm0, 0x7"),
    ("vpsrad zmm2{MASK}, zmm1, 0x21", "vpsrad ymm2, ymm1, 0x21"),
    ("vpermilps zmm2{MASK}, zmm0, 0x4e", "vpermilps ymm2, ymm0, 0x4e"),
    ("vpermilps zmm2{MASK}, zmm0, zmm1", "vpermilps ymm2, ymm0, ymm1"),
    ("vmovaps zmm2{MASK}, zmm0", "vmovaps ymm2, ymm0"),
    ("vmovups zmm2{MASK}, zmm1", "vmovups ymm2, ymm1"),
]


def _evex_vs_vex_objects() -> tuple[bytes, bytes]:
    evex, vex = [], []
    for i, (e, v) in enumerate(EVEX_VS_VEX):
        for tag, mask in (("m", "{k1}"), ("z", "{k1}{z}"), ("n", "")):
            evex.append(f"""
.globl e{i}{tag}
e{i}{tag}:
    kmovw k1, ecx
    vmovups zmm0, [rsi]
    vmovups zmm1, [rsi+64]
    vmovups zmm2, [rsi+128]
    {e.replace("{MASK}", mask)}
    vmovups [rdi], zmm2
    ret
""")
        vex.append(f"""
.globl v{i}
v{i}:
    vmovups ymm0, [rsi]
    vmovups ymm1, [rsi+32]
    vmovups ymm2, [rsi+64]
    {v.replace(chr(10), chr(10) + "    ")}
    vmovups [rdi], ymm2
    vzeroupper
    ret
""")
    return gas_object("".join(evex), name="evex_cases"), gas_object("".join(vex), name="vex_cases")


@pytest.mark.parametrize("seed", range(3))
def test_evex_lanewise_forms_match_the_cpus_vex_halves(seed: int) -> None:
    evex, vex = _evex_vs_vex_objects()
    g = np.random.default_rng(seed)
    a, b, c = (rng_f32(50 + 3 * seed + j, 16) for j in range(3))
    if seed == 2:  # integer lanes: shifts, multiplies and conversions of ints
        a, b = (g.choice(np.array([0, 1, -1, 7, 2**31 - 1, -(2**31), 1 << 24, 99], np.int64), 16).astype(np.int32)
                .view(F32) for _ in range(2))  # fmt: skip
    bcast = rng_f32(60 + seed, 2)
    k = int(g.integers(0, 1 << 16))
    sel = np.array([k >> i & 1 for i in range(16)], bool)
    bad = []
    for i, (e, _) in enumerate(EVEX_VS_VEX):
        halves = []
        for h in (slice(0, 8), slice(8, 16)):
            out = np.zeros(8, F32)
            native(vex, f"v{i}", [out, np.concatenate([a[h], b[h], c[h]]), bcast])
            halves.append(out)
        full = np.concatenate(halves).view(np.uint32)
        for tag, want in (("m", np.where(sel, full, c.view(np.uint32))), ("z", np.where(sel, full, 0)), ("n", full)):
            got = np.zeros(16, F32)
            emulate(evex, f"e{i}{tag}", [got, np.concatenate([a, b, c]), bcast, k])
            if not np.array_equal(got.view(np.uint32), want):
                bad.append(f"{e} ({tag}): lanes {np.flatnonzero(got.view(np.uint32) != want).tolist()}")
    assert not bad, "\n".join(bad)


def test_all_32_compare_predicates_match_the_cpu() -> None:
    """vcmpps imm 0..31: the VEX vector-mask form natively and emulated, and the EVEX form into k (with and
    without a write mask) emulated; all must give the CPU's lane bits."""
    vex = gas_object("".join(f"""
.globl v{p}
v{p}:
    vmovups ymm0, [rsi]
    vmovups ymm1, [rsi+32]
    vcmpps ymm2, ymm0, ymm1, {p}
    vmovmskps eax, ymm2
    mov [rdi], eax
    vzeroupper
    ret
""" for p in range(32)), name="vex_cmp")  # fmt: skip
    evex = gas_object("".join(f"""
.globl e{p}
e{p}:
    kmovw k1, edx
    vmovups zmm0, [rsi]
    vmovups zmm1, [rsi+64]
    vcmpps k2, zmm0, zmm1, {p}
    vcmpps k3{{k1}}, zmm0, zmm1, {p}
    kmovw [rdi], k2
    kmovw [rdi+4], k3
    ret
""" for p in range(32)), name="evex_cmp")  # fmt: skip
    a, b = rng_f32(70, 16), rng_f32(71, 16)
    b[::4] = a[::4]
    a[[1, 6]], b[[1, 6]] = [0.0, np.nan], [-0.0, np.nan]
    k = 0b1011_0110_0101_1110
    for p in range(32):
        halves = []
        for h in (slice(0, 8), slice(8, 16)):
            out, emu = np.zeros(1, np.uint32), np.zeros(1, np.uint32)
            native(vex, f"v{p}", [out, np.concatenate([a[h], b[h]])])
            emulate(vex, f"v{p}", [emu, np.concatenate([a[h], b[h]])])
            assert emu[0] == out[0], (p, h)
            halves.append(int(out[0]))
        want = halves[0] | halves[1] << 8
        got = np.zeros(2, np.uint32)
        emulate(evex, f"e{p}", [got, np.concatenate([a, b]), k])
        assert got.tolist() == [want, want & k], p


def test_evex_scatter_128_bit_lane_shuffles_and_align() -> None:
    lib = gas_object("""
    kmovw k1, ecx
    vmovdqu32 zmm1, [rsi]
    vmovups zmm0, [rsi+64]
    vscatterdps [rdx+zmm1*4]{k1}, zmm0
    kmovw [rdi+256], k1
    vmovups zmm2, [rsi+128]
    vshuff32x4 zmm3, zmm0, zmm2, 0x4e
    vmovups [rdi], zmm3
    vshufi64x2 ymm4, ymm0, ymm2, 0x1
    vmovups [rdi+64], ymm4
    valignd zmm5, zmm0, zmm2, 3
    vmovups [rdi+128], zmm5
    ret
""")
    g = np.random.default_rng(18)
    k = 0b1101_0010_1011_0111
    sel = np.array([k >> i & 1 for i in range(16)], bool)
    idx = np.where(sel, g.integers(0, 32, 16), 1 << 29).astype(np.int32)  # masked-off lanes would fault
    idx[1] = idx[0]  # an overlap: the higher lane's value lands
    src, other = rng_f32(19, 16), rng_f32(20, 16)
    table = np.zeros(32, F32)
    out = np.zeros(65, F32)
    emulate(lib, "kern", [out, np.concatenate([idx.view(F32), src, other]), table, k])
    want = np.zeros(32, F32)
    for i in np.flatnonzero(sel):
        want[idx[i]] = src[i]
    u = lambda x: x.view(np.uint32)
    np.testing.assert_array_equal(u(table), u(want))
    assert u(out[64:])[0] == 0
    lanes4 = lambda x: x.reshape(4, 4)
    # imm 0x4e = fields 2, 3 (from src1), 0, 1 (from src2)
    np.testing.assert_array_equal(u(out[:16]), u(np.concatenate([lanes4(src)[2], lanes4(src)[3], lanes4(other)[0],
                                                                 lanes4(other)[1]])))  # fmt: skip
    np.testing.assert_array_equal(u(out[16:24]), u(np.concatenate([src[4:8], other[0:4]])))
    np.testing.assert_array_equal(u(out[32:48]), u(np.concatenate([other, src])[3:19]))


@pytest.mark.parametrize("k", [0, 1])
def test_evex_masked_scalar_forms_and_high_registers(k: int) -> None:
    """Scalar ops act on lane 0 only: with its mask bit clear they keep (merge) or zero ({z}) that lane; bits 127:32
    come from the first source; registers 16-31 work like the others."""
    lib = gas_object("""
    kmovw k1, ecx
    vmovups xmm17, [rsi]
    vmovups xmm18, [rsi+16]
    vmovups xmm19, [rsi+32]
    vmovaps xmm20, xmm19
    vaddss xmm19{k1}, xmm17, xmm18
    vmulss xmm20{k1}{z}, xmm17, DWORD PTR [rsi+16]
    vmovups [rdi], xmm19
    vmovups [rdi+16], xmm20
    vmovss xmm21{k1}{z}, DWORD PTR [rdx]
    vmovups [rdi+32], xmm21
    vmovss DWORD PTR [rdi+48]{k1}, xmm17
    vmovaps xmm22, xmm19
    vfmadd231ss xmm22{k1}, xmm17, xmm18
    vmovups [rdi+64], xmm22
    ret
""")
    a, b, c = rng_f32(80, 4), rng_f32(81, 4), rng_f32(82, 4)
    out = np.full(20, 7.0, F32)
    emulate(lib, "kern", [out, np.concatenate([a, b, c]), np.zeros(0, F32) if not k else np.array([3.5], F32), k])
    u = lambda x: np.asarray(x, F32).view(np.uint32)
    with np.errstate(all="ignore"):
        lane0 = [a[0] + b[0], a[0] * b[0], F32(3.5), a[0], fma_exact(a[0], b[0], a[0] + b[0], F32)]
    np.testing.assert_array_equal(u(out[0:4]), u([lane0[0] if k else c[0], *a[1:]]))
    np.testing.assert_array_equal(u(out[4:8]), u([lane0[1] if k else 0.0, *a[1:]]))
    np.testing.assert_array_equal(u(out[8:12]), u([lane0[2] if k else 0.0, 0, 0, 0]))
    assert u(out[12:13])[0] == u([lane0[3] if k else 7.0])[0]  # a masked-off store leaves memory alone
    # xmm22 starts as xmm19 (lane 0: a0+b0, or c0 when masked off), the FMA adds a0*b0 to it under the same mask
    assert tk.same_bits(out[16:17], np.array([lane0[4] if k else c[0]], F32), tk.dtypes.float32)
