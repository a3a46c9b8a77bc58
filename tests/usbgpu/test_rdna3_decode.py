"""The RDNA3 decoder against llvm-objdump-16: every instruction of every kernel of the test corpus (compiled by LLVM
from IR, in both of its 16-bit register modes) disassembles to the same mnemonic and operands."""

from __future__ import annotations

import pytest
from codegen_rdna3 import objdump_mismatches

from rdna3_corpus import cases
from rdna3_llvm import compile_ir

CORPUS = {(c.ir, c.true16): c.name for c in cases()}


@pytest.mark.parametrize("key", sorted(CORPUS, key=lambda k: CORPUS[k]), ids=lambda k: CORPUS[k])
def test_disassembly_matches_llvm_objdump(key: tuple[str, bool]) -> None:
    ir, true16 = key
    problems = objdump_mismatches(compile_ir(ir, true16))
    assert not problems, "\n".join(problems[:20])
