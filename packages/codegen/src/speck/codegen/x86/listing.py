"""Intel-syntax assembly listing in the exact spelling `objdump -d -M intel` uses.

The encoder decides the instruction form and hands the pieces here; keeping the text identical to objdump's lets the
tests round-trip every encoding through binutils, and makes the listing directly comparable with a disassembly of
LLVM's output.
"""

from __future__ import annotations

from typing import NamedTuple

from speck.codegen.x86.operands import Imm, Label, Mem, Reg, Sym

PTR_NAMES = {1: "BYTE", 2: "WORD", 4: "DWORD", 8: "QWORD", 16: "XMMWORD", 32: "YMMWORD", 64: "ZMMWORD"}

# VEX compare predicates (Intel SDM vol. 2A, CMPPS, table 3-1): objdump folds imm8 into the mnemonic.
CMP_PREDICATES = (
    "eq", "lt", "le", "unord", "neq", "nlt", "nle", "ord",
    "eq_uq", "nge", "ngt", "false", "neq_oq", "ge", "gt", "true",
    "eq_os", "lt_oq", "le_oq", "unord_s", "neq_us", "nlt_uq", "nle_uq", "ord_s",
    "eq_us", "nge_uq", "ngt_uq", "false_os", "neq_os", "ge_oq", "gt_oq", "true_us",
)  # fmt: skip


def hex_signed(value: int) -> str:
    """A displacement as objdump prints it: +0x10 / -0x10."""
    return f"-{-value:#x}" if value < 0 else f"+{value:#x}"


def format_mem(mem: Mem, size: int | None) -> str:
    """A memory operand: `DWORD PTR [rdi+rsi*4+0x10]`; size None prints the bare address (lea).

    `mod00_no_disp` forms print no displacement; the rbp/r13 and index-only forms always carry one, which objdump shows
    even when it is zero.
    """
    prefix = f"{PTR_NAMES[size]} PTR " if size is not None else ""
    if mem.symbol is not None:
        return f"{prefix}[rip{hex_signed(0)}]"
    parts = ""
    base = mem.base
    if base is not None:
        assert isinstance(base, Reg)
        parts = base.name
    if mem.index is not None:
        assert isinstance(mem.index, Reg)
        parts += ("+" if parts else "") + f"{mem.index.name}*{mem.scale}"
    needs_disp = mem.disp != 0 or base is None or (isinstance(base, Reg) and base.low3 == 5)
    if needs_disp:
        parts += hex_signed(mem.disp)
    return f"{prefix}[{parts}]"


def format_imm(value: int, bits: int) -> str:
    """An immediate as objdump prints it: the value reduced to the operand width, in hex."""
    return f"{value & ((1 << bits) - 1):#x}"


def format_operand(op: Reg | Mem | Imm | Label | Sym, mem_size: int | None, imm_bits: int) -> str:
    """Format one physical operand (registers by name, memory with its PTR size, immediates at `imm_bits`)."""
    if isinstance(op, Reg):
        return op.name
    if isinstance(op, Mem):
        return format_mem(op, mem_size)
    if isinstance(op, Imm):
        return format_imm(op.value, imm_bits)
    return op.name


def format_instruction(mnemonic: str, operands: list[str]) -> str:
    """Mnemonic padded to objdump's 6-column field, then comma-separated operands without spaces."""
    if not operands:
        return mnemonic
    return f"{mnemonic:<6} {','.join(operands)}"


class ListingLine(NamedTuple):
    """One listed instruction (or label when `raw` is empty and `text` ends in ':'). A named tuple rather than a
    dataclass: the assembler makes one per instruction, and a tuple is several times cheaper to build."""

    offset: int
    raw: bytes
    text: str
    comment: str = ""
    body: str = ""  # listing_body(raw, text, comment) when the caller has it already (an Encoded carries it)


def listing_body(raw: bytes, text: str, comment: str) -> str:
    """An instruction's listing line after its address: `bytes<TAB>text comment`."""
    return f"{raw.hex(' '):<21}\t{text}" + (f" {comment}" if comment else "")


def render_listing(lines: list[ListingLine]) -> str:
    """The listing as objdump lays it out: `  offset:\\tbytes\\ttext` with labels on their own lines."""
    out = []
    for line in lines:
        if not line.raw:
            out.append(f"{line.offset:016x} <{line.text.rstrip(':')}>:")
            continue
        out.append(f"{line.offset:8x}:\t{line.body or listing_body(line.raw, line.text, line.comment)}")
    return "\n".join(out) + "\n"
