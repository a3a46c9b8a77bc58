"""speck's built-in x86-64 backend: machine instructions, encoder, Intel-syntax listing, ELF object writer, and the
x86 side of register allocation (operand roles, frame layout, System V register roles).

As a codegen backend (the CPU:X86 device): `X86Renderer` writes a linear program as source text (program_text.py)
and `X86Compiler().compile(src)` runs legalize (legalize.py) -> select (select.py, select_vector.py, select_zmm.py:
pattern tables keyed by op and operand class) -> allocate -> encode on it and returns the ELF object, in a CompilePool
worker process when the tensor path compiles ahead; `X86Compiler().disassemble(lib)` is the object's Intel-syntax
listing.

Pipeline for a hand-built or selected instruction list on virtual registers:
`allocate_function` (regalloc + prologue/epilogue) -> `assemble` (layout, jumps, relocations, listing) ->
`write_elf_object`; `build_object` runs all three.

Instruction set: AVX2 + FMA everywhere, AVX-512F where the CPU has it (speck.codegen.cpu_features; X86_AVX512=0
forces AVX2): 16-lane float32/bool vectors in zmm16..31 (EVEX), opmask k1 between adjacent instructions, embedded
broadcasts. A kernel the zmm rules cannot take is rendered for AVX2 instead (backend X86_AVX2).
"""

from speck.codegen.errors import EncodingError
from speck.codegen.x86.alloc import AllocatedFunction, LoopBegin, LoopEnd, allocate_function, build_object
from speck.codegen.x86.assembler import Assembled, Assembler, assemble
from speck.codegen.x86.compiler import X86Compiler
from speck.codegen.x86.elf_object import ConstPool, read_listing, write_elf_object
from speck.codegen.x86.encoder import Relocation, encode
from speck.codegen.x86.operands import (
    Imm,
    IncomingStackArg,
    Inst,
    Label,
    Mem,
    Opmask,
    Reg,
    Sym,
    gpr,
    ins,
    kreg,
    rodata,
    xmm,
    ymm,
    zmm,
)
from speck.codegen.x86.ops import X86Op
from speck.codegen.x86.renderer import X86Renderer, X86Rendering, render_x86

__all__ = [
    "AllocatedFunction", "Assembled", "Assembler", "ConstPool", "EncodingError", "Imm", "IncomingStackArg", "Inst",
    "Label", "LoopBegin", "LoopEnd", "Mem", "Reg", "Relocation", "Sym", "X86Op", "allocate_function", "assemble",
    "build_object", "encode", "X86Compiler", "X86Renderer", "X86Rendering", "render_x86",
    "gpr", "ins", "read_listing", "rodata", "write_elf_object", "xmm", "ymm", "zmm", "kreg", "Opmask",
]  # fmt: skip
