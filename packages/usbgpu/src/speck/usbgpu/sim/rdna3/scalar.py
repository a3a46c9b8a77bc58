"""Decoding and executing the scalar encodings: SOP2, SOP1, SOPC, SOPK, SOPP and SMEM (RDNA3 ISA chapter 15.1-15.6).

Field layouts: SOP2 [31:30]=10 op[29:23] sdst[22:16] ssrc1[15:8] ssrc0[7:0]; SOPK [31:28]=1011 op[27:23] sdst[22:16]
simm16[15:0]; SOP1 [31:23]=101111101 sdst[22:16] op[15:8] ssrc0[7:0]; SOPC [31:23]=101111110 op[22:16] ssrc1[15:8]
ssrc0[7:0]; SOPP [31:23]=101111111 op[22:16] simm16[15:0]; SMEM [31:26]=111101 op[25:18] glc[14] dlc[13]
sdata[12:6] sbase[5:0] (register pairs) / offset[52:32] (signed) soffset[63:57].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from speck.usbgpu.errors import EmulationError, ShaderTrap
from speck.usbgpu.sim.rdna3.inst import Inst, unimplemented
from speck.usbgpu.sim.rdna3.operands import LITERAL, NULL_CODE, scalar_reader, scalar_text
from speck.usbgpu.sim.rdna3.salu import SOP1, SOP2, SOPC, SOPK, SOPP, SOp
from speck.usbgpu.sim.rdna3.wave import EXEC, VCC, Pending, Waves

Fetch = Callable[[int], int]


def _sreg_set(code: int, bits: int) -> frozenset[int]:
    return frozenset(range(code, code + bits // 32)) if code < 106 else frozenset()


def _salu(
    pc: int, words: tuple[int, ...], enc: str, op: int, row: SOp | None, dst: int | None, srcs: list[int]
) -> Inst:
    literal = words[1] if len(words) > 1 else None
    if row is None:
        name = f"<{enc} opcode {op}>"
        return Inst(pc, words, enc, op, name, "", "salu", unimplemented(name, f" (encoding {words[0]:#010x})"))
    texts = [scalar_text(c, b, literal) for c, b in zip(srcs, row.srcs)]
    if row.dst is not None and dst is not None:
        texts.insert(0, scalar_text(dst, row.dst))
    if row.reads_dst and dst is not None and row.dst is not None:
        srcs = [*srcs, dst]
    sregs = frozenset().union(*[_sreg_set(c, b) for c, b in zip(srcs, [*row.srcs, row.dst or 32])])
    if row.dst is not None and dst is not None:
        sregs |= _sreg_set(dst, row.dst)
    inst = Inst(pc, words, enc, op, row.name, ", ".join(texts), "salu", sregs=sregs)
    if row.fn is None:
        inst.run = unimplemented(row.name)
        return inst
    readers = [scalar_reader(c, b, literal, row.signed) for c, b in zip(srcs, [*row.srcs, row.dst or 32])]
    fn, dbits = row.fn, row.dst

    def run(w: Waves) -> None:
        value = fn(w, *[r(w) for r in readers])
        if value is not None and dst is not None:
            if dbits == 64:
                w.write_s64(dst, np.asarray(value, dtype=np.uint64))  # (a scalar broadcasts)
            else:
                w.write_s(dst, np.asarray(value).astype(np.uint32))

    inst.run = run
    return inst


def _literal_words(fetch: Fetch, codes: list[int]) -> tuple[int, ...]:
    return (fetch(0), fetch(1)) if LITERAL in codes else (fetch(0),)


def decode_sop2(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, sdst, s1, s0 = (w >> 23) & 0x7F, (w >> 16) & 0x7F, (w >> 8) & 0xFF, w & 0xFF
    return _salu(pc, _literal_words(fetch, [s0, s1]), "SOP2", op, SOP2.get(op), sdst, [s0, s1])


def decode_sop1(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    sdst, op, s0 = (w >> 16) & 0x7F, (w >> 8) & 0xFF, w & 0xFF
    row = SOP1.get(op)
    words = _literal_words(fetch, [s0])
    if row is not None and row.name == "s_getpc_b64":
        inst = Inst(pc, words, "SOP1", op, row.name, scalar_text(sdst, 64), "salu", sregs=_sreg_set(sdst, 64))
        next_pc = pc + 4
        inst.run = lambda wv: wv.write_s64(sdst, np.full(wv.n, next_pc, dtype=np.uint64))
        return inst
    if row is not None and row.name in ("s_setpc_b64", "s_swappc_b64"):
        text = scalar_text(s0, 64) if row.name == "s_setpc_b64" else f"{scalar_text(sdst, 64)}, {scalar_text(s0, 64)}"
        return Inst(pc, words, "SOP1", op, row.name, text, "branch", unimplemented(row.name, " (indirect jumps)"))
    return _salu(pc, words, "SOP1", op, row, sdst, [s0])


def decode_sopc(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, s1, s0 = (w >> 16) & 0x7F, (w >> 8) & 0xFF, w & 0xFF
    return _salu(pc, _literal_words(fetch, [s0, s1]), "SOPC", op, SOPC.get(op), None, [s0, s1])


# MODE register fields (hwreg 1): [3:0] FP_ROUND, [7:4] FP_DENORM, [8] DX10_CLAMP, [9] IEEE
HW_REG_MODE = 1


def _read_mode(w: Waves) -> int:
    m = w.mode
    return m.round_mode | (m.denorm32 << 4) | (m.denorm16_64 << 6) | (int(m.dx10_clamp) << 8) | (int(m.ieee) << 9)


def _write_mode(w: Waves, value: int) -> None:
    m = w.mode
    if value & 0xF:
        raise EmulationError(f"MODE.FP_ROUND={value & 0xF}: only round-to-nearest-even is implemented")
    m.round_mode = value & 0xF
    m.denorm32, m.denorm16_64 = (value >> 4) & 3, (value >> 6) & 3
    m.dx10_clamp, m.ieee = bool(value >> 8 & 1), bool(value >> 9 & 1)


def _hwreg_text(imm: int) -> str:
    reg, off, size = imm & 0x3F, (imm >> 6) & 0x1F, ((imm >> 11) & 0x1F) + 1
    name = "HW_REG_MODE" if reg == HW_REG_MODE else str(reg)
    return f"hwreg({name}, {off}, {size})" if (off, size) != (0, 32) else f"hwreg({name})"


def _hwreg_access(imm: int) -> tuple[int, int]:
    reg, off, size = imm & 0x3F, (imm >> 6) & 0x1F, ((imm >> 11) & 0x1F) + 1
    if reg != HW_REG_MODE:
        raise EmulationError(f"hardware register {reg} is not implemented (only HW_REG_MODE)")
    return off, (1 << size) - 1


def decode_sopk(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, sdst, imm = (w >> 23) & 0x1F, (w >> 16) & 0x7F, w & 0xFFFF
    row = SOPK.get(op)
    name = row.name if row else f"<SOPK opcode {op}>"
    words: tuple[int, ...] = (w, fetch(1)) if name == "s_setreg_imm32_b32" else (w,)
    if name.startswith("s_waitcnt_"):
        counter = {"s_waitcnt_vmcnt": "vm", "s_waitcnt_lgkmcnt": "lgkm"}.get(name)
        inst = Inst(pc, words, "SOPK", op, name, f"{scalar_text(sdst)}, {imm:#x}", "wait")
        if sdst != NULL_CODE:
            inst.run = unimplemented(name, " with a register count (only null)")
        elif counter is not None:
            inst.run = lambda wv: wv.wait(counter, imm)
        else:  # vscnt / expcnt: stores and exports complete at issue in this model
            inst.run = lambda wv: None
        return inst
    if name == "s_getreg_b32":
        inst = Inst(pc, words, "SOPK", op, name, f"{scalar_text(sdst)}, {_hwreg_text(imm)}", "salu")

        def getreg(wv: Waves) -> None:
            off, mask = _hwreg_access(imm)
            wv.write_s(sdst, np.uint32((_read_mode(wv) >> off) & mask))

        inst.run = getreg
        return inst
    if name in ("s_setreg_b32", "s_setreg_imm32_b32"):
        src = f"{words[1]:#x}" if len(words) > 1 else scalar_text(sdst)
        inst = Inst(pc, words, "SOPK", op, name, f"{_hwreg_text(imm)}, {src}", "salu")

        def setreg(wv: Waves) -> None:
            off, mask = _hwreg_access(imm)
            if len(words) > 1:
                value = words[1]
            else:
                vals = wv.s[sdst]
                if not (vals == vals[0]).all():
                    raise EmulationError("s_setreg_b32 with a different MODE value per wave")
                value = int(vals[0])
            _write_mode(wv, (_read_mode(wv) & ~(mask << off)) | ((value & mask) << off))

        inst.run = setreg
        return inst
    if row is None or row.fn is None:
        return Inst(pc, words, "SOPK", op, name, f"{scalar_text(sdst)}, {imm:#x}", "salu", unimplemented(name))
    fn, dbits = row.fn, row.dst
    sregs = frozenset({sdst}) if sdst < 106 else frozenset()
    inst = Inst(pc, words, "SOPK", op, name, f"{scalar_text(sdst)}, {imm:#x}", "salu", sregs=sregs)

    def run(wv: Waves) -> None:
        value = fn(wv, wv.s[sdst], imm)
        if value is not None and dbits is not None:
            wv.write_s(sdst, np.asarray(value).astype(np.uint32))

    inst.run = run
    return inst


# s_delay_alu's fields, spelled as LLVM prints them
_DELAY_ID = ["NO_DEP", "VALU_DEP_1", "VALU_DEP_2", "VALU_DEP_3", "VALU_DEP_4", "TRANS32_DEP_1", "TRANS32_DEP_2"]
_DELAY_ID += ["TRANS32_DEP_3", "FMA_ACCUM_CYCLE_1", "SALU_CYCLE_1", "SALU_CYCLE_2", "SALU_CYCLE_3"]
_DELAY_SKIP = ["SAME", "NEXT", "SKIP_1", "SKIP_2", "SKIP_3", "SKIP_4"]
# s_waitcnt_depctr fields: (name, low bit, width)
_DEPCTR = [("va_vdst", 12, 4), ("va_sdst", 9, 3), ("va_ssrc", 8, 1), ("hold_cnt", 7, 1), ("vm_vsrc", 2, 3)]
_DEPCTR += [("va_vcc", 1, 1), ("sa_sdst", 0, 1)]
MSG_DEALLOC_VGPRS = 3


def _sopp_text(name: str, imm: int) -> str:
    if name in ("s_endpgm", "s_barrier", "s_code_end", "s_icache_inv", "s_wakeup", "s_endpgm_saved", "s_wait_idle"):
        return "" if imm == 0 else str(imm)
    if name == "s_waitcnt":
        vm, exp, lgkm = (imm >> 10) & 0x3F, imm & 7, (imm >> 4) & 0x3F
        parts = [f"vmcnt({vm})" if vm != 63 else "", f"expcnt({exp})" if exp != 7 else ""]
        parts.append(f"lgkmcnt({lgkm})" if lgkm != 63 else "")
        return " ".join(p for p in parts if p) or f"{imm:#x}"
    if name == "s_delay_alu":
        id0, skip, id1 = imm & 0xF, (imm >> 4) & 7, (imm >> 7) & 0xF
        parts = [f"instid0({_DELAY_ID[id0]})" if id0 and id0 < len(_DELAY_ID) else ""]
        parts.append(f"instskip({_DELAY_SKIP[skip]})" if skip and skip < len(_DELAY_SKIP) else "")
        parts.append(f"instid1({_DELAY_ID[id1]})" if id1 and id1 < len(_DELAY_ID) else "")
        return " | ".join(p for p in parts if p) or "0"
    if name == "s_waitcnt_depctr":
        parts = [
            f"depctr_{n}({(imm >> lo) & ((1 << wd) - 1)})"
            for n, lo, wd in _DEPCTR
            if (imm >> lo) & ((1 << wd) - 1) != (1 << wd) - 1
        ]
        return " ".join(parts) or f"{imm:#x}"
    if name == "s_sendmsg" and imm == MSG_DEALLOC_VGPRS:
        return "sendmsg(MSG_DEALLOC_VGPRS)"
    if name in ("s_clause", "s_set_inst_prefetch_distance", "s_round_mode", "s_sendmsg", "s_sendmsghalt"):
        return f"{imm:#x}"
    return str(imm)


def decode_sopp(pc: int, fetch: Fetch) -> Inst:
    w = fetch(0)
    op, imm = (w >> 16) & 0x7F, w & 0xFFFF
    name = SOPP.get(op, f"<SOPP opcode {op}>")
    inst = Inst(pc, (w,), "SOPP", op, name, _sopp_text(name, imm), "nop")
    if name.startswith("s_branch") or name.startswith("s_cbranch"):
        inst.kind = "branch"
        inst.target = pc + 4 + 4 * (imm - 0x10000 if imm & 0x8000 else imm)
        inst.cond = _BRANCH_CONDS.get(name)
        if name != "s_branch" and inst.cond is None:
            inst.run = unimplemented(name)
    elif name == "s_endpgm":
        inst.kind = "end"
    elif name == "s_barrier":
        inst.kind = "barrier"
    elif name == "s_waitcnt":
        vm, lgkm = (imm >> 10) & 0x3F, (imm >> 4) & 0x3F
        inst.kind = "wait"
        inst.run = _waitcnt(vm, lgkm)
    elif name in _NOPS or (name == "s_sendmsg" and imm == MSG_DEALLOC_VGPRS):
        inst.run = lambda wv: None
    elif name == "s_denorm_mode":
        inst.kind = "salu"

        def denorm(wv: Waves) -> None:
            wv.mode.denorm32, wv.mode.denorm16_64 = imm & 3, (imm >> 2) & 3

        inst.run = denorm
    elif name == "s_round_mode":
        inst.kind = "salu"
        inst.run = (lambda wv: None) if imm == 0 else unimplemented(f"s_round_mode {imm:#x}", " (only round-to-even)")
    elif name == "s_trap":
        inst.run = _trap(imm)
    else:
        inst.run = unimplemented(name, f" (encoding {w:#010x})")
    return inst


def _waitcnt(vm: int, lgkm: int) -> Callable[[Waves], None]:
    def run(w: Waves) -> None:
        w.wait("vm", vm)
        w.wait("lgkm", lgkm)

    return run


_NOPS = {"s_nop", "s_clause", "s_delay_alu", "s_waitcnt_depctr", "s_set_inst_prefetch_distance", "s_sleep"}
_NOPS |= {"s_setprio", "s_icache_inv", "s_incperflevel", "s_decperflevel", "s_ttracedata", "s_ttracedata_imm"}


def _trap(imm: int) -> Callable[[Waves], None]:
    def run(w: Waves) -> None:
        raise ShaderTrap(imm)

    return run


_BRANCH_CONDS: dict[str, Callable[[Waves], Any]] = {
    "s_cbranch_scc0": lambda w: ~w.scc,
    "s_cbranch_scc1": lambda w: w.scc,
    "s_cbranch_vccz": lambda w: w.s[VCC] == 0,
    "s_cbranch_vccnz": lambda w: w.s[VCC] != 0,
    "s_cbranch_execz": lambda w: w.s[EXEC] == 0,
    "s_cbranch_execnz": lambda w: w.s[EXEC] != 0,
}

# SMEM: opcode -> (mnemonic, dwords loaded); s_buffer_load needs buffer descriptors (not implemented)
SMEM: dict[int, tuple[str, int]] = {0: ("s_load_b32", 1), 1: ("s_load_b64", 2), 2: ("s_load_b128", 4)}
SMEM |= {3: ("s_load_b256", 8), 4: ("s_load_b512", 16)}
SMEM |= {8 + k: (f"s_buffer_load_b{32 << k}", 0) for k in range(5)}
SMEM |= {32: ("s_gl1_inv", -1), 33: ("s_dcache_inv", -1)}


def decode_smem(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    op, glc, dlc = (w0 >> 18) & 0xFF, (w0 >> 14) & 1, (w0 >> 13) & 1
    sdata, sbase = (w0 >> 6) & 0x7F, (w0 & 0x3F) << 1
    offset, soffset = w1 & 0x1FFFFF, (w1 >> 25) & 0x7F
    if offset & 0x100000:
        offset -= 0x200000
    name, count = SMEM.get(op, (f"<SMEM opcode {op}>", 0))
    if count < 0:
        return Inst(pc, (w0, w1), "SMEM", op, name, "", "nop", lambda wv: None)
    sbase_bits = 128 if name.startswith("s_buffer") else 64
    parts = [scalar_text(sdata, 32 * max(count, 1)), scalar_text(sbase, sbase_bits)]
    if soffset != NULL_CODE:
        parts.append(scalar_text(soffset) + (f" offset:{offset:#x}" if offset else ""))
    else:
        parts.append(f"{offset:#x}" if offset else "null")
    text = ", ".join(parts) + (" glc" if glc else "") + (" dlc" if dlc else "")
    sregs = _sreg_set(sbase, 64) | (_sreg_set(soffset, 32) if soffset != NULL_CODE else frozenset())
    inst = Inst(pc, (w0, w1), "SMEM", op, name, text, "smem", sregs=sregs)
    if count == 0:
        inst.run = unimplemented(name, " (buffer descriptors)")
        return inst
    regs = list(range(sdata, sdata + count))

    def run(wv: Waves) -> None:
        addr = wv.read_s64(sbase) + np.uint64(offset & 0xFFFFFFFFFFFFFFFF)
        if soffset != NULL_CODE:
            addr = addr + wv.s[soffset].astype(np.uint64)
        addr &= ~np.uint64(3)  # the scalar cache ignores the low two address bits
        data = wv.launch.load(addr, 4 * count, "scalar").view(np.uint32)
        wv.issue(Pending("lgkm", False, regs, [data[:, k].copy() for k in range(count)], None))

    inst.run = run
    return inst
