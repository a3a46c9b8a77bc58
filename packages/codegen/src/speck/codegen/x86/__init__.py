"""speck's built-in x86-64 backend: machine instructions, encoder, Intel-syntax listing, ELF object writer."""

from speck.codegen.x86.encoder import Assembled, Assembler, EncodingError, Relocation, assemble, encode
from speck.codegen.x86.operands import Imm, Inst, Label, Mem, Reg, Sym, gpr, ins, rodata, xmm, ymm
from speck.codegen.x86.ops import X86Op

__all__ = [
    "Assembled",
    "Assembler",
    "EncodingError",
    "Imm",
    "Inst",
    "Label",
    "Mem",
    "Reg",
    "Relocation",
    "Sym",
    "X86Op",
    "assemble",
    "encode",
    "gpr",
    "ins",
    "rodata",
    "xmm",
    "ymm",
]
