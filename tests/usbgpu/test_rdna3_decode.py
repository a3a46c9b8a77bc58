"""The RDNA3 decoder against llvm-objdump-16: every instruction of every kernel of the test corpus (compiled by LLVM
from IR, in both of its 16-bit register modes) disassembles to the same mnemonic and operands."""

from __future__ import annotations

import re

import pytest

from rdna3_corpus import cases
from rdna3_llvm import compile_ir, objdump
from speck.usbgpu.sim.rdna3 import disassemble
from speck.usbgpu.sim.rdna3.codeobject import parse_code_object

CORPUS = {(c.ir, c.true16): c.name for c in cases()}
_COMMENT = re.compile(r"\s*(;.*|/\*.*?\*/)")


def normalize(text: str) -> str:
    """One spelling per instruction: comments LLVM 16 appends to registers it cannot name are dropped."""
    return " ".join(_COMMENT.sub("", text).replace(",", ", ").split()).replace(" ,", ",")


def compare(so: bytes) -> list[str]:
    image = parse_code_object(so).image
    want = objdump(so)
    first, last = want[0][0], want[-1][0]
    mine = {i.pc: i for i in disassemble(image[first : last + 16], first)}
    problems = []
    for addr, text in want:
        inst = mine.get(addr)
        if inst is None:
            problems.append(f"{addr:#x}: objdump has {text!r}, the decoder has no instruction starting here")
        elif text.startswith(".long"):  # LLVM 16 predates some gfx11 (true16) encodings LLVM 22 emits
            if inst.name.startswith("<"):
                problems.append(f"{addr:#x}: {text!r} is unknown to both")
        elif normalize(text) != normalize(inst.text):
            problems.append(f"{addr:#x}: objdump {normalize(text)!r} decoder {normalize(inst.text)!r}")
    return problems


@pytest.mark.parametrize("key", sorted(CORPUS, key=lambda k: CORPUS[k]), ids=lambda k: CORPUS[k])
def test_disassembly_matches_llvm_objdump(key: tuple[str, bool]) -> None:
    ir, true16 = key
    problems = compare(compile_ir(ir, true16))
    assert not problems, "\n".join(problems[:20])
