"""x86-64 encoder: every instruction form and register class round-trips through binutils objdump.

Each hypothesis example draws random operands (all 16 registers of every class, immediates at the edges of each width,
displacements of every size) for every form in the encoding tables, assembles them into one buffer and disassembles
it with a single objdump call; the listing the encoder printed must equal objdump's text instruction by instruction,
at the same offsets.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from speck.codegen.x86.assembler import assemble
from speck.codegen.x86.encoder import EVEX_TABLE, FIXED_BYTES, GPR_TABLE, VEX_TABLE, EncodingError, encode
from speck.codegen.x86.objdump import disassemble_raw, normalise
from speck.codegen.x86.operands import Imm, Inst, Label, Mem, Reg, Sym, gpr, rodata, xmm, ymm
from speck.codegen.x86.ops import CMOVCC_OPS, JCC_OPS, SETCC_OPS, X86Op

SIZES = (1, 2, 4, 8)


def _gpr_templates() -> list[tuple[X86Op, tuple[str, ...]]]:
    t: list[tuple[X86Op, tuple[str, ...]]] = []
    for op, (kind, _param, _ref) in GPR_TABLE.items():
        for s in SIZES:
            r, m, i = f"r{s}", f"m{s}", f"i{s}"
            if kind in ("alu", "mov"):
                t += [(op, (r, r)), (op, (m, r)), (op, (r, m)), (op, (r, i)), (op, ("M" + str(s), i))]
            elif kind == "test":
                t += [(op, (r, r)), (op, (m, r)), (op, (r, i)), (op, ("M" + str(s), i))]
            elif kind == "unary" or (kind == "imul" and s == 1):
                t += [(op, (r,)), (op, ("M" + str(s),))]
            elif kind == "shift":
                t += [(op, (r, "u8")), (op, ("M" + str(s), "u8")), (op, (r, "cl"))]
            elif kind == "imul":
                t += [(op, (r, r)), (op, (r, m)), (op, (r, r, i)), (op, (r, m, i)), (op, (r, "M" + str(s)))]
            elif kind in ("movzx", "movsx") and s > 1:
                t += [(op, (r, "r1")), (op, (r, "M1"))] + ([(op, (r, "r2")), (op, (r, "M2"))] if s > 2 else [])
            elif kind == "movsxd" and s == 8:
                t += [(op, ("r8", "r4")), (op, ("r8", "M4"))]
            elif kind == "lea" and s > 1:
                t += [(op, (r, "m"))]
            elif kind == "movabs" and s == 8:
                t += [(op, ("r8", "i64"))]
            elif kind in ("push", "pop") and s == 8:
                t += [(op, ("r8",))]
            elif kind == "fixed" and s == 1:
                t += [(op, ())]
    for op in SETCC_OPS:
        t += [(op, ("r1",)), (op, ("M1",))]
    for op in CMOVCC_OPS:
        for s in (2, 4, 8):
            t += [(op, (f"r{s}", f"r{s}")), (op, (f"r{s}", f"m{s}"))]
    return t


def _vex_templates() -> list[tuple[X86Op, tuple[str, ...]]]:
    t = []
    for op, forms in VEX_TABLE.items():
        for f in forms:
            widths = (16, 32) if f.vl is None and any(k in ("x", "xm") for k in f.sig) else (None,)
            gsizes = (4, 8) if f.w is None else (8 if f.w else 4,)
            for w in widths:
                for g in gsizes:
                    for mem_variant in (False, True):
                        toks = []
                        for k in f.sig:
                            if k in ("x", "X", "Y"):
                                toks.append(f"v{ {'x': w, 'X': 16, 'Y': 32}[k] }")
                            elif k in ("xm", "Xm"):
                                toks.append("m" if mem_variant else f"v{w if k == 'xm' else 16}")
                            elif k == "gm":
                                toks.append(f"M{g}" if mem_variant else f"r{g}")
                            elif k == "g":
                                toks.append(f"r{g}")
                            elif k == "m":
                                toks.append("m")
                            else:
                                toks.append("pred" if op.name.startswith("VCMP") else "u8")
                        t.append((op, tuple(toks)))
    return sorted(set(t), key=lambda x: (x[0].name, x[1]))


TEMPLATES = _gpr_templates() + _vex_templates()

DISP_EDGES = (0, 1, -1, 127, -128, 128, -129, 2**31 - 1, -(2**31))


def rand_mem(rnd: random.Random, size: int | None) -> Mem:
    if rnd.random() < 0.08:
        return rodata(rnd.randrange(4096), size)
    base = None if rnd.random() < 0.2 else rnd.randrange(16)
    index = None if rnd.random() < 0.4 else rnd.choice([n for n in range(16) if n != 4])
    if base is None and index is None:
        base = rnd.randrange(16)
    disp = rnd.choice(DISP_EDGES) if rnd.random() < 0.5 else rnd.randint(-(2**31), 2**31 - 1) >> rnd.randrange(32)
    return Mem(
        Reg("gpr", base, 8) if base is not None else None,
        Reg("gpr", index, 8) if index is not None else None,
        rnd.choice([1, 2, 4, 8]),
        disp,
        size,
    )


def rand_imm(rnd: random.Random, size: int) -> int:
    bits = 8 * min(size, 4)
    lo, hi = (-(2**31), 2**31 - 1) if size == 8 else (-(2 ** (bits - 1)), 2**bits - 1)
    if rnd.random() < 0.4:
        return rnd.choice([e for e in (lo, hi, 0, 1, -1, 127, -128, 128, -129) if lo <= e <= hi])
    return rnd.randint(lo, hi)


def rand_operand(rnd: random.Random, tok: str) -> Reg | Mem | Imm:
    """A random operand for one template token (r<size>/v<size> register, m/M memory, i<size>/u8/pred/i64 imm)."""
    kind, rest = tok[0], tok[1:]
    if tok == "cl":
        return gpr("cl")
    if tok == "u8":
        return Imm(rnd.randrange(256))
    if tok == "pred":
        return Imm(rnd.randrange(32))
    if tok == "i64":
        return Imm(rnd.choice([0, -1, 2**63, 2**64 - 1, rnd.randint(-(2**63), 2**64 - 1)]))
    if tok == "m" or kind == "m":  # memory whose size a register operand implies
        return rand_mem(rnd, None)
    if kind == "r":
        return Reg("gpr", rnd.randrange(16), int(rest))
    if kind == "v":
        return Reg("vec", rnd.randrange(16), int(rest))
    if kind == "M":  # memory that carries its own size
        return rand_mem(rnd, int(rest))
    if kind == "i":
        return Imm(rand_imm(rnd, int(rest)))
    raise AssertionError(tok)


def test_templates_cover_every_op() -> None:
    covered = {op for op, _ in TEMPLATES}
    branch = JCC_OPS | {X86Op.JMP, X86Op.CALL}
    evex_only = set(EVEX_TABLE) - set(VEX_TABLE) | {X86Op.KMOVW}  # AVX-512 forms: test_x86_evex.py checks them
    assert set(X86Op) - covered - branch - evex_only == set()
    assert set(FIXED_BYTES) <= covered


# Hypothesis supplies the seed: drawing ~2000 operands through strategies one by one costs seconds per example,
# a seeded Random is instant while keeping hypothesis' reproducibility and example database. No shrinking: a failure
# message already names the instruction, and shrinking would re-run objdump thousands of times.
@settings(max_examples=max(4, settings.default.max_examples // 5), phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(seed=st.integers(0, 2**64 - 1))
def test_every_form_matches_objdump(seed: int) -> None:
    rnd = random.Random(seed)
    insts = [Inst(op, tuple(rand_operand(rnd, t) for t in toks)) for op, toks in TEMPLATES]
    asm = assemble(insts)
    got = [(line.offset, normalise(line.text)) for line in asm.lines]
    want = disassemble_raw(asm.code)
    assert len(want) == len(got)
    for g, w, inst in zip(got, want, insts):
        assert g == w, f"{inst!r}: listing {g} but objdump decodes {w}"


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(JCC_OPS | {X86Op.JMP}, key=lambda o: o.name)), st.integers(0, 5), st.integers(0, 60)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_jumps_resolve_and_shrink(jumps: list[tuple[X86Op, int, int]]) -> None:
    """Random jumps over random amounts of padding land on their labels, in rel8 whenever the distance allows."""
    nlabels = 6
    items: list[Inst | Label] = []
    for k, (op, target, pad) in enumerate(jumps):
        if k < nlabels:
            items.append(Label(f"L{k}"))
        items.append(Inst(op, (Label(f"L{target}"),)))
        items += [Inst(X86Op.MOV, (gpr("rax"), Imm(2**20)))] * pad  # 7 bytes each
    items += [Label(f"L{k}") for k in range(min(len(jumps), nlabels), nlabels)]
    asm = assemble(items)
    decoded = dict(disassemble_raw(asm.code))
    for line in asm.lines:
        if line.raw and line.text.split()[0] in {o.value for o in JCC_OPS | {X86Op.JMP}}:
            target = int(decoded[line.offset].split()[1], 16)
            assert target == int(line.text.split()[1], 16)
            assert line.comment.strip("<>") in asm.labels and asm.labels[line.comment.strip("<>")] == target
            # rel8 exactly when the short form reaches (jumps only grow, so a widened jump never fits later)
            assert (len(line.raw) == 2) == (-128 <= target - (line.offset + 2) < 128)


def test_memory_special_cases() -> None:
    """The rsp/r12 SIB rule and the rbp/r13 displacement rule, byte for byte (Intel SDM vol. 2A, table 2-2/2-3)."""

    def raw(*ops: Reg | Mem) -> str:
        return encode(Inst(X86Op.MOV, ops)).raw.hex(" ")

    assert raw(gpr("eax"), Mem(gpr("rsp"))) == "8b 04 24"
    assert raw(gpr("eax"), Mem(gpr("r12"))) == "41 8b 04 24"
    assert raw(gpr("eax"), Mem(gpr("rbp"))) == "8b 45 00"
    assert raw(gpr("eax"), Mem(gpr("r13"))) == "41 8b 45 00"
    assert raw(gpr("eax"), Mem(gpr("rdi"), disp=127)) == "8b 47 7f"
    assert raw(gpr("eax"), Mem(gpr("rdi"), disp=128)) == "8b 87 80 00 00 00"
    assert raw(gpr("r9"), Mem(gpr("r13"), gpr("r12"), 8)) == "4f 8b 4c e5 00"
    assert raw(gpr("sil"), gpr("dil")) == "40 88 fe"  # REX needed to reach sil/dil rather than dh/bh


def test_rip_relative_relocation_addend() -> None:
    """A RIP-relative operand followed by an immediate: the addend accounts for the bytes after the field."""
    enc = encode(Inst(X86Op.VCMPPS, (ymm(1), ymm(2), rodata(0x40), Imm(1))))
    assert enc.reloc is not None and enc.reloc.kind == "PC32" and enc.reloc.symbol == ".rodata"
    # target = next_ip + disp = (P + 4 + 1) + disp  ->  disp = S + 0x40 - P - 5
    assert enc.reloc.addend == 0x40 - 5 and enc.reloc.offset == len(enc.raw) - 5
    call = assemble([Inst(X86Op.CALL, (Sym("expf"),))])
    assert call.relocations[0].kind == "PLT32" and call.relocations[0].addend == -4


@pytest.mark.parametrize(
    ("inst", "fragment"),
    [
        (Inst(X86Op.ADD, (gpr("eax"), gpr("rcx"))), "different sizes"),
        (Inst(X86Op.ADD, (gpr("rax"), Imm(2**31))), "does not fit"),
        (Inst(X86Op.ADD, (Mem(gpr("rax")), Imm(1))), "operand size"),
        (Inst(X86Op.MOV, (Mem(gpr("rax")), Mem(gpr("rcx")))), "expected operands"),
        (Inst(X86Op.MOV, (gpr("eax"), Mem(gpr("rax"), gpr("rsp")))), "rsp cannot be an index"),
        (Inst(X86Op.MOV, (gpr("eax"), Mem(gpr("eax")))), "64-bit physical register"),
        (Inst(X86Op.VADDPS, (xmm(0), ymm(1), ymm(2))), "mix xmm and ymm"),
        (Inst(X86Op.VADDSS, (ymm(0), ymm(1), ymm(2))), "expected operands"),
        (Inst(X86Op.VMOVD, (xmm(0), gpr("rax"))), "32-bit"),
        (Inst(X86Op.IMUL, (gpr("al"), gpr("cl"))), "no 8-bit form"),
        (Inst(X86Op.SHL, (gpr("eax"), gpr("edx"))), "expected operands"),
        (Inst(X86Op.JMP, (Label("nowhere"),)), "not defined"),
        (Inst(X86Op.JMP, (Sym("expf"),)), "only call"),
    ],
)
def test_bad_operands_raise(inst: Inst, fragment: str) -> None:
    with pytest.raises(EncodingError, match=fragment):
        assemble([inst])


def test_virtual_registers_rejected() -> None:
    from speck.codegen.regalloc import VReg

    with pytest.raises(EncodingError, match="register allocation"):
        encode(Inst(X86Op.ADD, (VReg(1, "gpr"), gpr("rax"))))
    with pytest.raises(EncodingError, match="register allocation"):
        encode(Inst(X86Op.VADDPS, (ymm(0), VReg(1, "vec", 32), ymm(2))))
