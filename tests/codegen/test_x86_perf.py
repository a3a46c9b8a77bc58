"""The x86 backend's fast paths give exactly what the plain paths give (no timing here: bench/x86_backend.py times it).

- X86Renderer.render hands its object to X86Compiler.compile: that object must equal the one parsed back from the
  listing text, and an edited or forgotten listing must still be parsed;
- operand_roles (hot in the peephole and the allocator) against a direct reading of the operand-role contract, on
  random instructions;
- the cached `phys` registers and the identity hash of X86Op behave like freshly built values.
"""

from __future__ import annotations

import pathlib
import pickle
import sys

from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.program import to_program
from speck.codegen.regalloc import VReg
from speck.codegen.x86 import X86Compiler, X86Renderer, parse_listing, write_elf_object
from speck.codegen.x86.alloc import READS_AND_WRITES, READS_ONLY, ZEROING_IDIOMS, operand_roles
from speck.codegen.x86.compiler import _RECENT_LIMIT, recall_object, remember_object
from speck.codegen.x86.operands import GPR64, Imm, Inst, Mem, Reg
from speck.codegen.x86.ops import X86Op
from speck.codegen.x86.regs import phys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_x86_select import elementwise_add, row_sum


def _parsed_object(listing: str) -> bytes:
    name, code, relocs, rodata = parse_listing(listing)
    return write_elf_object(name, code, relocs, rodata)


def test_render_hands_compile_the_object_parsing_would_build() -> None:
    for ast in (elementwise_add(), row_sum()):
        listing = X86Renderer().render(to_program(ast, X86Renderer(), optimize=False).uops)
        assert recall_object(listing) is not None
        assert X86Compiler().compile(listing) == _parsed_object(listing)


def test_unknown_listings_are_parsed_and_the_hand_over_is_bounded() -> None:
    listing = X86Renderer().render(to_program(row_sum(), X86Renderer(), optimize=False).uops)
    expected = _parsed_object(listing)
    edited = listing.replace("\n", "\n\n", 1)  # same code, different text: not remembered, parsed
    assert recall_object(edited) is None and X86Compiler().compile(edited) == expected
    for k in range(_RECENT_LIMIT + 1):
        remember_object(f"# not a listing {k}", b"")
    assert recall_object(listing) is None  # pushed out by newer entries
    assert X86Compiler().compile(listing) == expected


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
