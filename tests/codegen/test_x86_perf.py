"""The x86 backend's fast paths give exactly what the plain paths give (no timing here: bench/x86_backend.py times it).

- operand_roles (hot in the peephole and the allocator) against a direct reading of the operand-role contract, on
  random instructions;
- the cached `phys` registers and the identity hash of X86Op behave like freshly built values;
- `encode`'s cache of instruction encodings hands out exactly what encoding from scratch builds (bytes, text,
  relocation, listing line), never keeps a failed encoding, and stays bounded;
- the roles an Inst remembers leave its value (equality, hash, repr) alone, and the hand-written Inst/Mem
  constructors keep the dataclass contract (validation, immutability, equality, copy, pickle);
- fold_copies against a plain quadratic reading of its rule, on random instruction lists with loops and labels;
- listing lines render the same from the body an encoding carries as from their fields.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.regalloc import VReg
from speck.codegen.x86 import encoder
from speck.codegen.x86.alloc import (
    READS_AND_WRITES,
    READS_ONLY,
    ZEROING_IDIOMS,
    Item,
    LoopBegin,
    LoopEnd,
    operand_roles,
    ra_view,
)
from speck.codegen.x86.assembler import assemble
from speck.codegen.x86.encoder import EncodingError, encode, encode_uncached
from speck.codegen.x86.listing import render_listing
from speck.codegen.x86.operands import GPR64, Imm, Inst, Label, Mem, Operand, Reg, gpr, plain_inst, rodata, ymm
from speck.codegen.x86.ops import X86Op
from speck.codegen.x86.peephole import fold_copies
from speck.codegen.x86.regs import phys
from test_x86_encoding import TEMPLATES, rand_operand


def _vregs_of(o: object) -> list[VReg]:
    if isinstance(o, VReg):
        return [o]
    if isinstance(o, Mem):
        return [r for r in (o.base, o.index) if isinstance(r, VReg)]
    return []


def _reference_roles(inst: Inst) -> tuple[tuple[VReg, ...], tuple[VReg, ...]]:
    """The contract of speck.codegen.x86.alloc, read literally: operands 1.. are read; a register operand 0 is read,
    written or both by op; a zeroing idiom on one register only writes it; a memory operand 0 only reads its
    address registers."""
    defs = [v for v in inst.implicit_defs if isinstance(v, VReg)]
    uses = [v for v in inst.implicit_uses if isinstance(v, VReg)]
    if not inst.operands:
        return tuple(defs), tuple(uses)
    first, rest = inst.operands[0], inst.operands[1:]
    rest_v = [v for o in rest for v in _vregs_of(o)]
    uses += rest_v
    if not isinstance(first, VReg):
        return tuple(defs), tuple(uses + _vregs_of(first))
    n = len(inst.operands)
    if inst.op in ZEROING_IDIOMS and n >= 2 and all(v.id == first.id for v in rest_v):
        return tuple(defs + [first]), tuple(v for v in uses if v.id != first.id)
    reads = inst.op in READS_ONLY or inst.op in READS_AND_WRITES or inst.op is X86Op.IMUL and n in (1, 2)
    writes = inst.op not in READS_ONLY and not (inst.op is X86Op.IMUL and n == 1)
    return tuple(defs + ([first] if writes else [])), tuple(uses + ([first] if reads else []))


_vreg = st.builds(VReg, st.integers(0, 3), st.just("gpr"), st.sampled_from([4, 8]))
_base = st.one_of(st.none(), _vreg, st.just(Reg("gpr", 7, 8)))
_mem = st.builds(Mem, st.one_of(_vreg, st.just(Reg("gpr", 6, 8))), _base, st.sampled_from([1, 4]), st.integers(-8, 8))
_operand = st.one_of(_vreg, _mem, st.builds(Imm, st.integers(-5, 5)), st.just(Reg("gpr", 0, 8)))
_ops = [X86Op.MOV, X86Op.ADD, X86Op.XOR, X86Op.SUB, X86Op.CMP, X86Op.IMUL, X86Op.LEA, X86Op.VXORPS, X86Op.PUSH]


@given(
    st.sampled_from(_ops),
    st.lists(_operand, max_size=3),
    st.lists(st.one_of(_vreg, st.just(Reg("gpr", 2, 8))), max_size=2),
    st.lists(_vreg, max_size=2),
)
def test_operand_roles_follow_the_contract(op: X86Op, operands: list, uses: list, defs: list) -> None:
    inst = Inst(op, tuple(operands), tuple(uses), tuple(defs))
    assert operand_roles(inst) == _reference_roles(inst)


def test_phys_registers_equal_fresh_ones() -> None:
    for num, name in enumerate(GPR64):
        for size in (1, 2, 4, 8):
            assert phys(name, size) == Reg("gpr", num, size) and phys(name, size).name == Reg("gpr", num, size).name
    for k in range(16):
        assert phys(f"xmm{k}", 16) == Reg("vec", k, 16) and phys(f"xmm{k}", 32) == Reg("vec", k, 32)


def test_x86op_identity_hash_keeps_enum_behaviour() -> None:
    members = list(X86Op)
    assert len(set(members)) == len(members) == len({m.value for m in members})
    table = {m: m.value for m in members}
    assert all(table[X86Op(m.value)] == m.value and pickle.loads(pickle.dumps(m)) is m for m in members)
    assert "__hash__" not in X86Op.__members__


@settings(max_examples=max(4, settings.default.max_examples // 5))
@given(seed=st.integers(0, 2**64 - 1))
def test_cached_encodings_equal_fresh_ones(seed: int) -> None:
    """Every encoding form with random operands: the first encode (a miss) and the encode of an equal instruction
    built separately (a hit) both give what encoding from scratch gives, byte for byte."""
    rnd = random.Random(seed)
    encoder._ENCODED.clear()
    for op, toks in TEMPLATES:
        operands = tuple(rand_operand(rnd, t) for t in toks)
        inst, twin = Inst(op, operands), Inst(op, pickle.loads(pickle.dumps(operands)))  # equal, distinct objects
        fresh = encode_uncached(inst)
        miss, hit = encode(inst), encode(twin)
        assert hit is miss, f"{inst!r}: an equal instruction did not find the cached encoding"
        for enc in (miss, hit):
            assert (enc.raw, enc.text, enc.comment, enc.reloc, enc.body) == (
                fresh.raw, fresh.text, fresh.comment, fresh.reloc, fresh.body), f"{inst!r}"  # fmt: skip


def test_failed_encodings_are_not_cached() -> None:
    bad = Inst(X86Op.ADD, (gpr("eax"), gpr("rcx")))
    for _ in range(2):  # raised again, not answered from the cache
        with pytest.raises(EncodingError, match="different sizes"):
            encode(bad)
    assert (bad.op, bad.operands) not in encoder._ENCODED
    with pytest.raises(EncodingError, match="encoded at its address"):
        encode_uncached(Inst(X86Op.JMP, (Label("L0"),)))


def test_encode_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder, "ENCODE_CACHE_LIMIT", 8)
    encoder._ENCODED.clear()
    for k in range(50):
        assert encode(Inst(X86Op.MOV, (gpr("eax"), Imm(k)))).raw == bytes([0xB8, k, 0, 0, 0])  # mov r32, imm32
        assert len(encoder._ENCODED) <= 8


@given(
    st.sampled_from(_ops),
    st.lists(_operand, max_size=3),
    st.lists(st.one_of(_vreg, st.just(Reg("gpr", 2, 8))), max_size=2),
    st.lists(_vreg, max_size=2),
)
def test_remembered_roles_leave_the_instruction_value_alone(
    op: X86Op, operands: list[Operand], uses: list[VReg | Reg], defs: list[VReg]
) -> None:
    inst, twin = (Inst(op, tuple(operands), tuple(uses), tuple(defs)) for _ in range(2))
    view = ra_view(inst)
    assert ra_view(inst) is view and operand_roles(inst) == _reference_roles(twin)  # asked again: the remembered view
    assert inst == twin and hash(inst) == hash(twin) and repr(inst) == repr(twin)
    assert pickle.loads(pickle.dumps(inst)) == inst


def test_hand_written_constructors_keep_the_dataclass_contract() -> None:
    """Inst and Mem fill their frozen slots directly (speed); they must still validate, stay immutable, and compare,
    hash, copy and pickle by value like the generated dataclass code did."""
    mem = Mem(gpr("rdi"), gpr("rsi"), 4, -8, 4)
    inst = Inst(X86Op.MOV, (gpr("eax"), mem), clobbers=frozenset({"rax"}))
    for obj, name in ((mem, "disp"), (inst, "op")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
        twins = (pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj), copy.copy(obj))
        assert all(t == obj and hash(t) == hash(obj) for t in twins)
    assert (mem.base, mem.index, mem.scale, mem.disp, mem.size, mem.symbol) == (gpr("rdi"), gpr("rsi"), 4, -8, 4, None)
    assert (inst.op, inst.operands, inst.implicit_uses, inst.implicit_defs) == (X86Op.MOV, (gpr("eax"), mem), (), ())
    assert dataclasses.replace(inst, op=X86Op.LEA) == Inst(X86Op.LEA, inst.operands, clobbers=frozenset({"rax"}))
    assert Inst(X86Op.RET) == Inst(X86Op.RET, (), (), (), frozenset()) and Mem(disp=4, symbol="s").base is None
    quick = plain_inst(X86Op.MOV, (gpr("eax"), mem))  # (selection's and allocation's constructor)
    assert quick == Inst(X86Op.MOV, (gpr("eax"), mem)) and hash(quick) == hash(Inst(X86Op.MOV, (gpr("eax"), mem)))
    assert repr(quick) == repr(Inst(X86Op.MOV, (gpr("eax"), mem))) and ra_view(quick).uses == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.op = X86Op.LEA  # type: ignore[misc]
    for bad, fragment in (({"scale": 3}, "scale"), ({"disp": 2**31}, "displacement"), ({}, "expected a base")):
        with pytest.raises(ValueError, match=fragment):
            Mem(gpr("rax") if bad else None, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RIP-relative"):
        Mem(gpr("rax"), symbol=".rodata")


def _reference_fold(items: list[Item]) -> list[Item]:
    """fold_copies' rule read plainly (quadratic scans): `op S, ..; mov D, S` -> `op D, ..` when the copy is S's last
    mention, S's first mention defines it, no label or loop marker lies in between, D is not written at S's
    definition nor mentioned strictly between it and the copy, and neither end takes part in another fold; a copy
    the renaming turns into a copy of a value onto itself is dropped."""

    def named(it: Item, vid: int) -> bool:
        return isinstance(it, Inst) and any(v.id == vid for v in operand_roles(it)[0] + operand_roles(it)[1])

    drop: set[int] = set()
    rename: dict[int, VReg] = {}
    for i, it in enumerate(items):
        if not (isinstance(it, Inst) and it.op in (X86Op.MOV, X86Op.VMOVAPS) and len(it.operands) == 2):
            continue
        dst, src = it.operands
        if not (isinstance(dst, VReg) and isinstance(src, VReg)) or dst.fixed or src.fixed:
            continue
        if it.op is X86Op.MOV and not dst.size == src.size == 8:
            continue
        where = [j for j, x in enumerate(items) if named(x, src.id)]
        if where[-1] != i or src.id in rename or dst.id in rename or where[0] in drop:
            continue
        first = items[where[0]]
        assert isinstance(first, Inst)
        between = items[where[0] + 1 : i]
        if src.id not in [v.id for v in operand_roles(first)[0]] or not all(isinstance(x, Inst) for x in between):
            continue
        if dst.id in [v.id for v in operand_roles(first)[0]] or any(named(x, dst.id) for x in between):
            continue
        rename[src.id] = dst
        drop.add(i)

    def sub(o: Operand) -> Operand:
        if isinstance(o, VReg) and o.id in rename:
            return rename[o.id].sized(o.size)
        if isinstance(o, Mem):
            b, x = (rename[r.id].sized(8) if isinstance(r, VReg) and r.id in rename else r for r in (o.base, o.index))
            return Mem(b, x, o.scale, o.disp, o.size, o.symbol)
        return o

    out: list[Item] = []
    for i, it in enumerate(items):
        if i in drop:
            continue
        if isinstance(it, Inst):
            ops = tuple(sub(o) for o in it.operands)
            # a candidate copy that renaming turned into a copy of a value onto itself goes too
            if ops != it.operands and it.op in (X86Op.MOV, X86Op.VMOVAPS) and len(ops) == 2 and ops[0] == ops[1] \
                    and not (it.op is X86Op.MOV and not ops[0].size == 8):  # type: ignore[union-attr]  # fmt: skip
                continue
            it = Inst(it.op, ops, it.implicit_uses, it.implicit_defs, it.clobbers)
        out.append(it)
    return out


_v8 = st.builds(VReg, st.integers(0, 5), st.just("gpr"), st.sampled_from([8, 8, 4]))
_item = st.one_of(
    st.builds(lambda d, s: Inst(X86Op.MOV, (d, s)), _v8, _v8),
    st.builds(lambda d, s: Inst(X86Op.VMOVAPS, (d, s)), *[st.builds(VReg, st.integers(6, 8), st.just("vec"))] * 2),
    st.builds(lambda d, s: Inst(X86Op.ADD, (d, s)), _v8, st.one_of(_v8, st.builds(Imm, st.integers(0, 3)))),
    st.builds(lambda d, s: Inst(X86Op.IMUL, (d, s, Imm(3))), _v8, _v8),
    st.builds(lambda d, b: Inst(X86Op.LEA, (d, Mem(b, disp=1))), _v8, _v8),
    st.builds(lambda d: Inst(X86Op.XOR, (d, d)), _v8),
    st.builds(lambda a, b: Inst(X86Op.CMP, (a, b)), _v8, _v8),
    st.sampled_from([Label("L"), LoopBegin(), LoopEnd()]),
)


# the shape the peephole exists for: a temporary (ids 10..12, so they collide now and then) computed and copied home
_tmp = st.builds(VReg, st.integers(10, 12), st.just("gpr"))
_home = st.builds(VReg, st.integers(0, 5), st.just("gpr"))
_compute_and_copy = st.builds(
    lambda t, a, d: [Inst(X86Op.IMUL, (t, a, Imm(3))), Inst(X86Op.MOV, (d, t))], _tmp, _v8, _home
)


@given(st.lists(st.one_of(_item.map(lambda it: [it]), _compute_and_copy), max_size=16))
def test_fold_copies_matches_its_rule(chunks: list[list[Item]]) -> None:
    items = [it for chunk in chunks for it in chunk]
    assert fold_copies(list(items)) == _reference_fold(list(items))


def test_listing_lines_render_alike_with_and_without_a_body() -> None:
    asm = assemble([
        Label("top"), Inst(X86Op.VMOVUPS, (ymm(3), rodata(0x20))), Inst(X86Op.ADD, (gpr("r9d"), Imm(1))),
        Inst(X86Op.JL, (Label("top"),)), Inst(X86Op.RET),
    ])  # fmt: skip
    assert all(line.body for line in asm.lines if line.raw)
    assert render_listing([line._replace(body="") for line in asm.lines]) == asm.listing
