"""Decoding and executing the vector ALU encodings: VOP1, VOP2, VOPC, VOP3, VOP3SD, VOP3P and VOPD.

Field layouts (RDNA3 ISA chapter 15.7-15.10): VOP2 src0[8:0] vsrc1[16:9] vdst[24:17] op[30:25] [31]=0; VOP1 src0[8:0]
op[16:9] vdst[24:17] [31:25]=0111111; VOPC src0[8:0] vsrc1[16:9] op[24:17] [31:25]=0111110; VOP3 vdst[7:0] abs[10:8]
(VOP3SD: sdst[14:8]) op_sel[14:11] clamp[15] op[25:16] [31:26]=110101 / src0[40:32] src1[49:41] src2[58:50]
omod[60:59] neg[63:61]; VOP3P vdst[7:0] neg_hi[10:8] op_sel[13:11] op_sel_hi2[14] clamp[15] op[22:16]
[31:24]=11001100 / src0 src1 src2 op_sel_hi[60:59] neg[63:61]; VOPD srcx0[8:0] vsrcx1[16:9] opy[21:17] opx[25:22]
[31:26]=110010 / srcy0[40:32] vsrcy1[48:41] vdsty[55:49] vdstx[63:56].

A 16-bit operand of a VOP1/VOP2/VOPC encoding names a register half: bit 7 of the VGPR number selects the high half
("true16"); VOP3 selects halves with op_sel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speck.usbgpu.errors import EmulationError
from speck.usbgpu.sim.rdna3 import floats as fl
from speck.usbgpu.sim.rdna3.inst import Inst, unimplemented
from speck.usbgpu.sim.rdna3.operands import (
    DPP8,
    DPP8FI,
    DPP16,
    LITERAL,
    TYPES,
    Reader,
    Ty,
    scalar_reader,
    scalar_text,
    split64,
    vector_reader,
    vector_text,
)
from speck.usbgpu.sim.rdna3.valu import VOP1, VOP2, VOP3, VOP3P, VOPC, VOPD_X, VOPD_Y, VOp, dot_int
from speck.usbgpu.sim.rdna3.wave import EXEC, LANE_IDS, VCC, Waves, to_waves

Fetch = Callable[[int], int]
F16, F32 = fl.F16, fl.F32
VOP3SD_OPS = {0x120, 0x121, 0x122, 0x2FC, 0x2FD, 0x2FE, 0x2FF, 0x300, 0x301, 0x302}
NO_E32_SUFFIX = {"v_swap_b32", "v_permlane64_b32", "v_swaprel_b32", "v_dot2acc_f32_f16", "v_pk_fmac_f16"}
NO_E32_SUFFIX |= {"v_fmamk_f32", "v_fmaak_f32", "v_fmamk_f16", "v_fmaak_f16", "v_readfirstlane_b32"}
OMOD_SCALE = {1: 2.0, 2: 4.0, 3: 0.5}
OMOD_TEXT = {1: "mul:2", 2: "mul:4", 3: "div:2"}


@dataclass
class Fields:
    """The operand fields of one VALU instruction, whatever its encoding."""

    vdst: int | None
    srcs: list[int]  # operand codes, one per source of the row (VGPRs as 256 + n)
    hi: list[bool] = field(default_factory=list)  # 16-bit operand in the high half
    absm: list[bool] = field(default_factory=list)
    negm: list[bool] = field(default_factory=list)
    dst_hi: bool = False
    clamp: bool = False
    omod: int = 0
    sdst: int | None = None  # VOP3: the scalar destination of compares and carries
    mask_src: int | None = None  # where a lane-mask input (carry-in, cndmask select) comes from (None: VCC)
    literal: int | None = None
    e64: bool = False


def _flush_in(vals: list[Any], tys: list[Ty], w: Waves) -> list[Any]:
    m = w.mode
    out = []
    for v, t in zip(vals, tys):
        mode = m.denorm32 if t.bits == 32 else m.denorm16_64
        out.append(fl.flush(v) if t.is_float and mode in (0, 2) else v)
    return out


def _writer(ty: Ty | None, vdst: int | None, dst_hi: bool) -> Callable[[Waves, Any], None]:
    """How a result of type `ty` lands in VGPR vdst (the active lanes only)."""
    if ty is None or vdst is None:
        return lambda w, res: None
    dt, r = ty.dtype, vdst
    if ty.bits == 32:
        return lambda w, res: w.write_v(r, np.asarray(res).astype(dt, copy=False).view(np.uint32))
    if ty.bits == 16:
        return lambda w, res: w.write_v16(r, dst_hi, np.asarray(res).astype(dt, copy=False).view(np.uint16))

    def write64(w: Waves, res: Any) -> None:
        lo, hi = split64(np.asarray(res).astype(dt, copy=False).view(np.uint64))
        w.write_v(r, lo)
        w.write_v(r + 1, hi)

    return write64


def _post(ty: Ty | None, f: Fields, kind: str, float_mode: bool = True) -> Callable[[Waves, Any], Any]:
    """Output modifiers (omod, clamp) and, for float arithmetic, output denormal flushing per MODE."""
    if ty is None:
        return lambda w, res: res
    if f.omod and not ty.is_float:
        raise EmulationError(f"omod on a {ty.name} result is not implemented")
    scale = OMOD_SCALE.get(f.omod)
    info = np.iinfo(ty.dtype) if not ty.is_float else None
    if f.clamp and info is None:
        clamp: Callable[[Any], Any] | None = lambda x: np.where(
            x > 0, np.minimum(x, ty.dtype.type(1)), ty.dtype.type(0)
        )
    elif f.clamp and kind == "sat":
        assert info is not None
        clamp = lambda x: np.clip(np.asarray(x).astype(np.int64), info.min, info.max)
    elif f.clamp:
        raise EmulationError(f"clamp on a {ty.name} result of this instruction is not implemented")
    else:
        clamp = None

    def run(w: Waves, res: Any) -> Any:
        if ty.is_float:
            res = np.asarray(res)
            if res.dtype != ty.dtype:
                res = res.astype(ty.dtype)
            if scale is not None:
                res = fl.nan_fix(res * ty.dtype.type(scale), res)
            mode = w.mode.denorm32 if ty.bits == 32 else w.mode.denorm16_64
            if float_mode and mode in (0, 1):
                res = fl.flush(res)
        if clamp is not None:
            res = clamp(res)
        return res

    return run


def _pack_mask(w: Waves, bits: Any) -> np.ndarray:
    """(n, 32) bools (active lanes only) -> (n,) uint32 lane masks."""
    b = np.asarray(bits, dtype=bool) & w.exec_mask()  # bits: (n, 32), or one value for all lanes: (n, 32) out
    # rows of 32 bools are 4 bytes each: packing the flat array gives the same words, several times faster than axis=1
    return np.packbits(b.reshape(-1), bitorder="little").view("<u4").astype(np.uint32, copy=False)


def _mask_reader(code: int | None, literal: int | None) -> Callable[[Waves], np.ndarray]:
    if code is None or code == VCC:
        return lambda w: w.lane_mask_from(w.s[VCC])
    get = scalar_reader(code, 32, literal)
    return lambda w: w.lane_mask_from(to_waves(get(w), w.n))


def build_valu(row: VOp, f: Fields) -> Callable[[Waves], None]:
    """The executor of one VALU instruction (see VOp.kind for the wirings)."""
    if row.fn is None:
        return unimplemented(row.name)
    tys = [TYPES[t] for t in row.srcs]
    srcs = list(f.srcs)
    kind = row.kind
    readers: list[Reader] = []
    for i, t in enumerate(tys):
        hi = f.hi[i] if i < len(f.hi) else False
        absm = f.absm[i] if i < len(f.absm) else False
        negm = f.negm[i] if i < len(f.negm) else False
        if (absm or negm) and not t.is_float:
            raise EmulationError(f"abs/neg modifiers on the {t.name} operand of {row.name} are not implemented")
        readers.append(vector_reader(srcs[i], t, f.literal, hi=hi, absm=absm, negm=negm))
    dty = TYPES[row.dst] if row.dst else None
    if kind == "mac":  # the destination is the addend
        assert dty is not None and f.vdst is not None
        readers.append(vector_reader(256 + f.vdst, dty, None, hi=f.dst_hi))
        tys.append(dty)
    fn, fm = row.fn, row.float_mode and any(t.is_float for t in tys)
    if kind == "sat" and not f.clamp and row.wrap is not None:
        fn = row.wrap
    write = _writer(dty, f.vdst, f.dst_hi)
    post = _post(dty, f, kind, row.float_mode)
    shift = _shift64_const(row, f)
    if shift is not None:
        return shift
    if kind in ("plain", "mac", "fmamk", "fmaak", "trans", "sat") and _plain32(dty, f):
        assert dty is not None and f.vdst is not None
        return _plain32_run(fn, readers, tys, fm, row.float_mode, dty, f.vdst)

    def sources(w: Waves) -> list[Any]:
        vals = [r(w) for r in readers]
        if fm and (w.mode.denorm32 != 3 or w.mode.denorm16_64 != 3):
            vals = _flush_in(vals, tys, w)
        return vals

    if kind in ("plain", "mac", "fmamk", "fmaak", "trans", "sat"):

        def run(w: Waves) -> None:
            write(w, post(w, fn(w, *sources(w))))

        return run
    if kind in ("cmp", "cmpx"):
        dest = EXEC if kind == "cmpx" else (VCC if f.sdst is None else f.sdst)

        def cmp(w: Waves) -> None:
            w.write_s(dest, _pack_mask(w, fn(w, *sources(w))))

        return cmp
    if kind in ("cndmask", "carry_in", "div_fmas"):
        mask = _mask_reader(f.mask_src, f.literal)
        carry_dst = VCC if f.sdst is None else f.sdst

        def with_mask(w: Waves) -> None:
            res = fn(w, *sources(w), mask(w))
            if kind == "carry_in":
                res, carry = res
                w.write_s(carry_dst, _pack_mask(w, carry))
            write(w, post(w, res))

        return with_mask
    if kind == "carry":
        carry_dst = VCC if f.sdst is None else f.sdst

        def carry(w: Waves) -> None:
            res, c = fn(w, *sources(w))
            w.write_s(carry_dst, _pack_mask(w, c))
            write(w, post(w, res))

        return carry
    raise EmulationError(f"{row.name}: instruction kind {kind!r} has no executor")


_SHIFTS64 = {"v_lshlrev_b64": "l", "v_lshrrev_b64": "r"}


def _shift64_const(row: VOp, f: Fields) -> Callable[[Waves], None] | None:
    """V_LSHLREV_B64 / V_LSHRREV_B64 by an inline constant of a VGPR pair (address arithmetic), in 32-bit halves:
    the same bits as the uint64 path without assembling and splitting 64-bit lanes. None for any other form."""
    side = _SHIFTS64.get(row.name)
    src = f.srcs[1] if len(f.srcs) == 2 else 0
    if side is None or f.vdst is None or f.clamp or f.omod or src < 256 or not 128 <= f.srcs[0] <= 192:
        return None
    if any(f.absm) or any(f.negm):
        return None
    k, r, d = (f.srcs[0] - 128) & 63, src - 256, f.vdst  # inline integers 0..64; the ISA uses the low 6 bits

    def run(w: Waves) -> None:
        lo, hi = w.v[r], w.v[r + 1]
        if k == 0:
            new_lo, new_hi = lo.copy(), hi.copy()
        elif k < 32 and side == "l":
            new_lo, new_hi = lo << np.uint32(k), (hi << np.uint32(k)) | (lo >> np.uint32(32 - k))
        elif k < 32:
            new_lo, new_hi = (lo >> np.uint32(k)) | (hi << np.uint32(32 - k)), hi >> np.uint32(k)
        elif side == "l":
            new_lo, new_hi = np.zeros_like(lo), lo << np.uint32(k - 32)
        else:
            new_lo, new_hi = hi >> np.uint32(k - 32), np.zeros_like(hi)
        w.write_v(d, new_lo)
        w.write_v(d + 1, new_hi)

    return run


def _plain32(dty: Ty | None, f: Fields) -> bool:
    """A 32-bit result written whole with no output modifier: what _plain32_run does without _post/_writer."""
    return dty is not None and f.vdst is not None and dty.bits == 32 and not f.clamp and not f.omod


def _compute32(
    fn: Callable[..., Any],
    readers: list[Reader],
    tys: list[Ty],
    fm: bool,
    float_mode: bool,
    dty: Ty,
    mask: Callable[[Waves], np.ndarray] | None = None,
) -> Callable[[Waves], np.ndarray]:
    """The 32-bit result bits of a VALU op with no output modifier (_post and _writer inlined): MODE's input
    flushing for float sources, the result in the destination type, output flushing for float results."""
    dt, flush_out = dty.dtype, dty.is_float and float_mode

    def compute(w: Waves) -> np.ndarray:
        m = w.mode
        vals = [r(w) for r in readers]
        if fm and (m.denorm32 != 3 or m.denorm16_64 != 3):
            vals = _flush_in(vals, tys, w)
        if mask is not None:
            vals.append(mask(w))
        res = np.asarray(fn(w, *vals))
        if res.dtype != dt:
            res = res.astype(dt)
        if flush_out and m.denorm32 in (0, 1):
            res = fl.flush(res)
        return res.view(np.uint32)

    return compute


def _plain32_run(
    fn: Callable[..., Any], readers: list[Reader], tys: list[Ty], fm: bool, float_mode: bool, dty: Ty, vdst: int
) -> Callable[[Waves], None]:
    """The executor of the commonest VALU form (a 32-bit result, no clamp/omod)."""
    compute = _compute32(fn, readers, tys, fm, float_mode, dty)
    return lambda w: w.write_v(vdst, compute(w))


# ---------------------------------------------------------------- cross-lane instructions
def _readfirstlane(src: int, sdst: int, literal: int | None) -> Callable[[Waves], None]:
    get = vector_reader(src, TYPES["b32"], literal)

    def run(w: Waves) -> None:
        vals = np.broadcast_to(get(w), (w.n, 32))
        exec_ = w.s[EXEC]
        lane = np.where(exec_ == 0, 0, np.log2((exec_ & (~exec_ + np.uint32(1))).astype(np.float64))).astype(np.int64)
        w.write_s(sdst, vals[np.arange(w.n), lane])

    return run


def _readlane(src: int, lane_code: int, sdst: int, literal: int | None) -> Callable[[Waves], None]:
    get = vector_reader(src, TYPES["b32"], literal)
    lane_get = scalar_reader(lane_code, 32, literal)

    def run(w: Waves) -> None:
        vals = np.broadcast_to(get(w), (w.n, 32))
        lane = np.broadcast_to(np.asarray(lane_get(w)).astype(np.int64) & 31, (w.n,))
        w.write_s(sdst, vals[np.arange(w.n), lane])

    return run


def _writelane(src: int, lane_code: int, vdst: int, literal: int | None) -> Callable[[Waves], None]:
    get = scalar_reader(src, 32, literal)
    lane_get = scalar_reader(lane_code, 32, literal)

    def run(w: Waves) -> None:
        lane = np.broadcast_to(np.asarray(lane_get(w)).astype(np.int64) & 31, (w.n,))
        w.v[vdst, np.arange(w.n), lane] = np.broadcast_to(np.asarray(get(w)), (w.n,))

    return run


def _swap(src: int, vdst: int) -> Callable[[Waves], None]:
    r = src - 256

    def run(w: Waves) -> None:
        a, b = w.v[vdst].copy(), w.v[r].copy()
        w.write_v(vdst, b)
        w.write_v(r, a)

    return run


# ---------------------------------------------------------------- text
def _src_text(code: int, ty: Ty, f: Fields, i: int) -> str:
    t = vector_text(code, ty.bits, f.literal)
    if i < len(f.absm) and f.absm[i]:
        t = f"|{t}|"
    if i < len(f.negm) and f.negm[i]:
        t = f"-{t}"
    return t


def _vdst_text(r: int | None, ty: Ty | None) -> str:
    if r is None:
        return ""
    n = 2 if ty is not None and ty.bits == 64 else 1
    return f"v{r}" if n == 1 else f"v[{r}:{r + n - 1}]"


def _mods_text(f: Fields, nsrc: int, opsel: int = 0, opsel_used: bool = False) -> str:
    out = []
    if opsel_used and opsel:
        bits = [(opsel >> k) & 1 for k in range(nsrc)] + [(opsel >> 3) & 1]
        out.append(f"op_sel:[{','.join(map(str, bits))}]")
    if f.clamp:
        out.append("clamp")
    if f.omod:
        out.append(OMOD_TEXT[f.omod])
    return (" " + " ".join(out)) if out else ""


def _valu_text(row: VOp, f: Fields, name: str, opsel: int = 0) -> str:
    tys = [TYPES[t] for t in row.srcs]
    dty = TYPES[row.dst] if row.dst else None
    parts = [_src_text(c, t, f, i) for i, (c, t) in enumerate(zip(f.srcs, tys))]
    kind = row.kind
    vcc_text = scalar_text(VCC) if f.sdst is None else scalar_text(f.sdst)
    if kind == "cmp":
        parts.insert(0, vcc_text)
    elif kind == "cmpx":
        pass
    elif kind == "carry":
        parts.insert(0, vcc_text)
        parts.insert(0, _vdst_text(f.vdst, dty))
    elif kind == "carry_in":
        parts.insert(0, vcc_text)
        parts.insert(0, _vdst_text(f.vdst, dty))
        parts.append(scalar_text(f.mask_src if f.mask_src is not None else VCC))
    elif kind == "cndmask":
        parts.insert(0, _vdst_text(f.vdst, dty))
        parts.append(scalar_text(f.mask_src if f.mask_src is not None else VCC))
    elif row.dst is not None:
        parts.insert(0, _vdst_text(f.vdst, dty))
    return ", ".join(p for p in parts if p) + _mods_text(f, len(tys), opsel, f.e64 and _has_16(row))


def _has_16(row: VOp) -> bool:
    return any(TYPES[t].bits == 16 for t in (*row.srcs, *([row.dst] if row.dst else [])))


# ---------------------------------------------------------------- decoders
def _true16(code: int, ty: Ty) -> tuple[int, bool]:
    """A VOP1/2/C operand of a 16-bit type: VGPR bit 7 selects the high half."""
    if ty.bits == 16 and code >= 256:
        r = code - 256
        return 256 + (r & 127), bool(r & 128)
    return code, False


def _e32(
    pc: int, fetch: Fetch, enc: str, op: int, row: VOp | None, vdst: int | None, src0: int, vsrc1: int | None
) -> Inst:
    w0 = fetch(0)
    if row is None:
        name = f"<{enc} opcode {op}>"
        return Inst(pc, (w0,), enc, op, name, "", "valu", unimplemented(name, f" (encoding {w0:#010x})"))
    srcs = [src0] if vsrc1 is None else [src0, 256 + vsrc1]
    name = row.name if row.name in NO_E32_SUFFIX else row.name + "_e32"
    if src0 in (DPP16, DPP8, DPP8FI):
        return Inst(
            pc, (w0, fetch(1)), enc, op, row.name + "_dpp", "", "valu", unimplemented(row.name + "_dpp", " (DPP)")
        )
    need_literal = src0 == LITERAL or row.kind in ("fmamk", "fmaak")
    words: tuple[int, ...] = (w0, fetch(1)) if need_literal else (w0,)
    literal = words[1] if need_literal else None
    kind = row.kind
    if kind == "fmamk":
        srcs = [src0, LITERAL, srcs[1]]
    elif kind == "fmaak":
        srcs = [src0, srcs[1], LITERAL]
    tys = [TYPES[t] for t in row.srcs]
    his = []
    for i, t in enumerate(tys):
        srcs[i], h = _true16(srcs[i], t)
        his.append(h)
    dty = TYPES[row.dst] if row.dst else None
    dst_hi = False
    if vdst is not None and dty is not None and dty.bits == 16:
        dst_hi, vdst = bool(vdst & 128), vdst & 127
    f = Fields(vdst, srcs, his, dst_hi=dst_hi, literal=literal)
    text_f = Fields(vdst if not dst_hi or vdst is None else vdst | 128, [s + 128 * h for s, h in zip(srcs, his)])
    text_f.literal = literal
    kind_ = "valu" if kind != "trans" else "trans"
    inst = Inst(pc, words, enc, op, name, _valu_text(row, text_f, name), kind_)
    if row.name == "v_readfirstlane_b32":
        assert vdst is not None
        inst.operands = f"{scalar_text(vdst)}, {vector_text(src0, 32, literal)}"
        inst.run = _readfirstlane(src0, vdst, literal)
        inst.sregs = frozenset({vdst}) if vdst < 106 else frozenset()
    elif row.name == "v_swap_b32":
        assert vdst is not None
        inst.run = _swap(src0, vdst) if src0 >= 256 else unimplemented("v_swap_b32 with a non-VGPR source")
    elif row.name == "v_mov_b16" and vdst is not None:
        inst.run = build_valu(row, f)
    else:
        inst.run = build_valu(row, f)
    # a scalar destination (readfirstlane) is no VGPR
    inst.vregs = _vregs(row, f) if row.name != "v_readfirstlane_b32" else _vregs(row, Fields(None, f.srcs))
    inst.sregs |= _sregs(f.srcs, tys)
    return inst


def _vregs(row: VOp, f: Fields) -> frozenset[int]:
    out: set[int] = set()
    for c, t in zip(f.srcs, row.srcs):
        if c >= 256:
            out.update(range(c - 256, c - 256 + max(1, TYPES[t].bits // 32)))
    if f.vdst is not None and row.dst is not None:
        out.update(range(f.vdst, f.vdst + max(1, TYPES[row.dst].bits // 32)))
    return frozenset(out)


def _sregs(srcs: list[int], tys: list[Ty]) -> frozenset[int]:
    out: set[int] = set()
    for c, t in zip(srcs, tys):
        if c < 106:
            out.update(range(c, c + max(1, t.bits // 32)))
    return frozenset(out)


def decode_vop2(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, vdst, vsrc1, src0 = (w >> 25) & 0x3F, (w >> 17) & 0xFF, (w >> 9) & 0xFF, w & 0x1FF
    return _e32(pc, fetch, "VOP2", op, VOP2.get(op), vdst, src0, vsrc1)


def decode_vop1(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    vdst, op, src0 = (w >> 17) & 0xFF, (w >> 9) & 0xFF, w & 0x1FF
    row = VOP1.get(op)
    return _e32(pc, fetch, "VOP1", op, row, vdst if row is None or row.dst else None, src0, None)


def decode_vopc(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, vsrc1, src0 = (w >> 17) & 0xFF, (w >> 9) & 0xFF, w & 0x1FF
    return _e32(pc, fetch, "VOPC", op, VOPC.get(op), None, src0, vsrc1)


def _vop3_row(op: int) -> VOp | None:
    if op < 0x100:
        return VOPC.get(op)
    if op < 0x180:
        return VOP2.get(op - 0x100)
    if op < 0x200:
        return VOP1.get(op - 0x180)
    return VOP3.get(op)


def decode_vop3(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    op = (w0 >> 16) & 0x3FF
    vdst, clamp = w0 & 0xFF, bool(w0 >> 15 & 1)
    src = [w1 & 0x1FF, (w1 >> 9) & 0x1FF, (w1 >> 18) & 0x1FF]
    omod, neg = (w1 >> 27) & 3, (w1 >> 29) & 7
    sd = op in VOP3SD_OPS
    absb, opsel, sdst = (0, 0, (w0 >> 8) & 0x7F) if sd else ((w0 >> 8) & 7, (w0 >> 11) & 0xF, None)
    row = _vop3_row(op)
    enc = "VOP3SD" if sd else "VOP3"
    if row is None:
        name = f"<VOP3 opcode {op:#x}>"
        return Inst(pc, (w0, w1), enc, op, name, "", "valu", unimplemented(name, f" (encoding {w0:#010x})"))
    nsrc = len(row.srcs) + (1 if row.kind in ("cndmask", "carry_in") else 0)
    if src[0] in (DPP16, DPP8, DPP8FI):
        return Inst(
            pc, (w0, w1, fetch(2)), enc, op, row.name + "_e64_dpp", "", "valu", unimplemented(row.name, " (VOP3 DPP)")
        )
    uses_literal = LITERAL in src[:nsrc]
    words: tuple[int, ...] = (w0, w1, fetch(2)) if uses_literal else (w0, w1)
    literal = words[2] if uses_literal else None
    name = row.name + ("_e64" if op < 0x200 and not sd else "")
    if row.name in ("v_add_co_ci_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32"):
        name = row.name + "_e64"
    tys = [TYPES[t] for t in row.srcs]
    ns = len(row.srcs)
    f = Fields(
        vdst,
        src[:ns],
        [bool(opsel >> i & 1) for i in range(ns)],
        [bool(absb >> i & 1) for i in range(ns)],
        [bool(neg >> i & 1) for i in range(ns)],
        dst_hi=bool(opsel >> 3 & 1),
        clamp=clamp,
        omod=omod,
        literal=literal,
        e64=True,
    )
    if row.kind in ("cmp", "cmpx"):
        f.vdst = None
        f.sdst = vdst if row.kind == "cmp" else None
    elif row.kind in ("carry", "carry_in"):
        f.sdst = sdst
    if row.kind in ("cndmask", "carry_in"):
        f.mask_src = src[ns]
    inst = Inst(pc, words, enc, op, name, "", "trans" if row.kind == "trans" else "valu")
    inst.vregs = _vregs(row, f)
    inst.sregs = _sregs(f.srcs, tys)
    if row.name in ("v_readlane_b32", "v_readfirstlane_b32"):  # the destination is an SGPR
        inst.vregs = _vregs(row, Fields(None, f.srcs))
        inst.sregs |= frozenset({vdst}) if vdst < 106 else frozenset()
    if row.name == "v_readlane_b32":
        inst.operands = f"{scalar_text(vdst)}, {vector_text(src[0])}, {scalar_text(src[1], 32, literal)}"
        inst.run = _readlane(src[0], src[1], vdst, literal)
        return inst
    if row.name == "v_writelane_b32":
        inst.operands = f"v{vdst}, {scalar_text(src[0], 32, literal)}, {scalar_text(src[1], 32, literal)}"
        inst.run = _writelane(src[0], src[1], vdst, literal)
        return inst
    if row.name == "v_readfirstlane_b32":
        inst.operands = f"{scalar_text(vdst)}, {vector_text(src[0], 32, literal)}"
        inst.run = _readfirstlane(src[0], vdst, literal)
        return inst
    inst.operands = _valu_text(row, f, name, opsel)
    try:
        inst.run = build_valu(row, f)
    except EmulationError as e:
        inst.run = unimplemented(row.name, f" ({e.message})")
    return inst


def _bitlist(v: int, n: int) -> str:
    return "[" + ",".join(str((v >> k) & 1) for k in range(n)) + "]"


def decode_vop3p(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    op = (w0 >> 16) & 0x7F
    vdst, neg_hi, opsel, clamp = w0 & 0xFF, (w0 >> 8) & 7, (w0 >> 11) & 7, bool(w0 >> 15 & 1)
    opsel_hi = ((w1 >> 27) & 3) | (((w0 >> 14) & 1) << 2)
    src = [w1 & 0x1FF, (w1 >> 9) & 0x1FF, (w1 >> 18) & 0x1FF]
    neg = (w1 >> 29) & 7
    row = VOP3P.get(op)
    if row is None:
        name = f"<VOP3P opcode {op}>"
        return Inst(pc, (w0, w1), "VOP3P", op, name, "", "valu", unimplemented(name, f" (encoding {w0:#010x})"))
    ns = len(row.srcs)
    uses_literal = LITERAL in src[:ns]
    words: tuple[int, ...] = (w0, w1, fetch(2)) if uses_literal else (w0, w1)
    literal = words[2] if uses_literal else None
    tys = [TYPES[t] for t in row.srcs]
    parts = [_vdst_text(vdst, TYPES[row.dst] if row.dst and row.kind == "mix" else None)]
    mix = row.kind == "mix"
    for i, c in enumerate(src[:ns]):  # V_FMA_MIX* print neg (and neg_hi, which means abs there) on the operand
        t = vector_text(c, 32, literal)
        if mix and neg_hi >> i & 1:
            t = f"|{t}|"
        parts.append(f"-{t}" if mix and neg >> i & 1 else t)
    default_hi = 0 if mix else (1 << ns) - 1
    mods = []
    if opsel:
        mods.append(f"op_sel:{_bitlist(opsel, ns)}")
    if (opsel_hi & ((1 << ns) - 1)) != default_hi:
        mods.append(f"op_sel_hi:{_bitlist(opsel_hi, ns)}")
    if neg and not mix:
        mods.append(f"neg_lo:{_bitlist(neg, ns)}")
    if neg_hi and not mix:
        mods.append(f"neg_hi:{_bitlist(neg_hi, ns)}")
    if clamp:
        mods.append("clamp")
    text = ", ".join(parts) + ("" if not mods else " " + " ".join(mods))
    inst = Inst(pc, words, "VOP3P", op, row.name, text, "valu")
    inst.vregs = frozenset(c - 256 for c in src[:ns] if c >= 256) | {vdst}
    inst.sregs = _sregs(src[:ns], tys)
    if row.fn is None:
        inst.run = unimplemented(row.name)
    elif row.kind == "packed":
        inst.run = _packed(row, vdst, src[:ns], opsel, opsel_hi, neg, neg_hi, clamp, literal)
    elif row.kind == "mix":
        inst.run = _mix(row, vdst, src[:ns], opsel, opsel_hi, neg, neg_hi, clamp, literal)
    elif row.name.startswith(("v_dot4_", "v_dot8_")):
        inst.run = _dot_int(row, vdst, src[:ns], opsel, opsel_hi, neg, neg_hi, clamp, literal)
    elif opsel or opsel_hi != (1 << ns) - 1 or neg or neg_hi or clamp:
        inst.run = unimplemented(row.name, " with op_sel/neg/clamp modifiers")
    else:
        f = Fields(vdst, src[:ns], literal=literal, e64=True)
        inst.run = build_valu(row, f)
    return inst


def _packed(
    row: VOp, vdst: int, src: list[int], opsel: int, opsel_hi: int, neg: int, neg_hi: int, clamp: bool, lit: int | None
) -> Callable[[Waves], None]:
    """A packed 16-bit op: the low result from the halves op_sel picks, the high one from op_sel_hi's."""
    tys = [TYPES[t] for t in row.srcs]
    dty = TYPES[row.dst or "b16"]
    if (neg or neg_hi) and not all(t.is_float for t in tys):
        return unimplemented(row.name, " with neg modifiers on integer operands")
    lo = [
        vector_reader(c, t, lit, hi=bool(opsel >> i & 1), negm=bool(neg >> i & 1))
        for i, (c, t) in enumerate(zip(src, tys))
    ]
    hi = [
        vector_reader(c, t, lit, hi=bool(opsel_hi >> i & 1), negm=bool(neg_hi >> i & 1))
        for i, (c, t) in enumerate(zip(src, tys))
    ]
    fn = row.fn
    assert fn is not None

    def half(w: Waves, readers: list[Reader]) -> np.ndarray:
        vals = [r(w) for r in readers]
        if dty.is_float and (w.mode.denorm16_64 != 3):
            vals = _flush_in(vals, tys, w)
        res = np.asarray(fn(w, *vals)).astype(dty.dtype)
        if dty.is_float and w.mode.denorm16_64 in (0, 1):
            res = fl.flush(res)
        if clamp and dty.is_float:
            res = np.where(res > 0, np.minimum(res, dty.dtype.type(1)), dty.dtype.type(0))
        elif clamp:
            raise EmulationError(f"clamp on {row.name} is not implemented")
        return np.broadcast_to(res.view(np.uint16), (w.n, 32)).astype(np.uint32)

    def run(w: Waves) -> None:
        w.write_v(vdst, half(w, lo) | (half(w, hi) << np.uint32(16)))

    return run


def _dot_int(
    row: VOp, vdst: int, src: list[int], opsel: int, opsel_hi: int, neg: int, neg_hi: int, clamp: bool, lit: int | None
) -> Callable[[Waves], None]:
    """V_DOT4_*/V_DOT8_* integer dot products: op_sel/op_sel_hi/neg_hi must keep their defaults; NEG[0]/NEG[1] say
    whether the IU forms read S0/S1 as signed (NEG[2] must be 0), clamp saturates the result."""
    iu = row.kind == "dot_iu"
    if opsel or opsel_hi != 7 or neg_hi or (neg if not iu else neg & 4):
        return unimplemented(row.name, " with op_sel/neg modifiers other than the IU forms' signedness")
    bits = 8 if row.name.startswith("v_dot4_") else 4
    fn = dot_int(bits, bool(neg & 1), bool(neg & 2))
    return build_valu(
        VOp(row.name, row.dst, row.srcs, fn, "sat", row.float_mode, fn),
        Fields(vdst, src, clamp=clamp, literal=lit, e64=True),
    )


def _mix(
    row: VOp, vdst: int, src: list[int], opsel: int, opsel_hi: int, neg: int, neg_hi: int, clamp: bool, lit: int | None
) -> Callable[[Waves], None]:
    """V_FMA_MIX*: each source is f32 (op_sel_hi=0) or the f16 half op_sel picks; neg_hi acts as abs."""
    readers: list[Reader] = []
    for i, c in enumerate(src):
        t = TYPES["f16"] if opsel_hi >> i & 1 else TYPES["f32"]
        r = vector_reader(c, t, lit, hi=bool(opsel >> i & 1), absm=bool(neg_hi >> i & 1), negm=bool(neg >> i & 1))
        readers.append((lambda rr: lambda w: np.asarray(rr(w)).astype(F32))(r))
    fn = row.fn
    assert fn is not None
    if clamp:
        return unimplemented(row.name, " with clamp")
    name = row.name

    def run(w: Waves) -> None:
        res = fn(w, *[r(w) for r in readers])
        if name == "v_fma_mix_f32":
            w.write_v(vdst, np.asarray(res, F32).view(np.uint32))
        else:
            w.write_v16(vdst, name.endswith("hi_f16"), np.asarray(res, F16).view(np.uint16))

    return run


def decode_vopd(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    srcx0, vsrcx1, opy, opx = w0 & 0x1FF, (w0 >> 9) & 0xFF, (w0 >> 17) & 0x1F, (w0 >> 22) & 0xF
    srcy0, vsrcy1, vdsty_f, vdstx = w1 & 0x1FF, (w1 >> 9) & 0xFF, (w1 >> 17) & 0x7F, (w1 >> 24) & 0xFF
    vdsty = (vdsty_f << 1) | ((vdstx & 1) ^ 1)
    rx, ry = VOPD_X.get(opx), VOPD_Y.get(opy)
    if rx is None or ry is None:
        name = f"<VOPD opcodes {opx}/{opy}>"
        return Inst(pc, (w0, w1), "VOPD", opx, name, "", "valu", unimplemented(name, f" (encoding {w0:#010x})"))
    literal_needed = LITERAL in (srcx0, srcy0) or {rx.kind, ry.kind} & {"fmaak", "fmamk"}
    words: tuple[int, ...] = (w0, w1, fetch(2)) if literal_needed else (w0, w1)
    literal = words[2] if literal_needed else None
    halves = []
    for row, vdst, s0, s1 in ((rx, vdstx, srcx0, vsrcx1), (ry, vdsty, srcy0, vsrcy1)):
        srcs = [s0] if len(row.srcs) == 1 else [s0, 256 + s1]
        if row.kind == "fmamk":
            srcs = [s0, LITERAL, 256 + s1]
        elif row.kind == "fmaak":
            srcs = [s0, 256 + s1, LITERAL]
        halves.append((row, Fields(vdst, srcs, literal=literal)))
    texts = []
    for row, f in halves:
        ops = [f"v{f.vdst}"] + [vector_text(c, 32, literal) for c in f.srcs]
        texts.append(f"{row.name} {', '.join(ops)}")
    inst = Inst(pc, words, "VOPD", opx, halves[0][0].name, "", "valu")
    inst.operands = texts[0][len(halves[0][0].name) + 1 :] + " :: " + texts[1]
    inst.vregs = frozenset().union(*[_vregs(r, f) for r, f in halves])
    inst.sregs = frozenset().union(*[_sregs(f.srcs, [TYPES[t] for t in r.srcs]) for r, f in halves])
    inst.extra["opy"] = opy
    inst.run = _dual(halves)
    return inst


def _dual(halves: list[tuple[VOp, Fields]]) -> Callable[[Waves], None]:
    """Both halves read their sources before either writes (they issue together)."""
    staged = []
    for row, f in halves:
        if row.fn is None:
            return unimplemented(row.name)
        assert f.vdst is not None
        staged.append((f.vdst, _staged(row, f)))
    (dx, x), (dy, y) = staged

    def run(w: Waves) -> None:
        rx, ry = x(w), y(w)
        w.write_v(dx, rx)
        w.write_v(dy, ry)

    return run


def _staged(row: VOp, f: Fields) -> Callable[[Waves], np.ndarray]:
    """A VOPD half's compute: its 32-bit result bits (every VOPD opcode writes one 32-bit VGPR)."""
    tys = [TYPES[t] for t in row.srcs]
    readers = [vector_reader(c, t, f.literal) for c, t in zip(f.srcs, tys)]
    dty = TYPES[row.dst or "b32"]
    if dty.bits != 32:
        raise EmulationError(f"{row.name}: a VOPD half with a {dty.bits}-bit result is not implemented")
    if row.kind == "mac":
        assert f.vdst is not None
        readers.append(vector_reader(256 + f.vdst, dty, None))
        tys = [*tys, dty]
    fn = row.wrap if row.kind == "sat" and row.wrap is not None else row.fn
    assert fn is not None
    mask = _mask_reader(None, None) if row.kind == "cndmask" else None
    fm = row.float_mode and any(t.is_float for t in tys)
    return _compute32(fn, readers, tys, fm, row.float_mode, dty, mask)


_ = LANE_IDS
