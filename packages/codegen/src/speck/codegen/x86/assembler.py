"""Layout of an instruction stream: label addresses, jump relaxation (rel8 vs rel32), relocations and the listing.

`assemble` starts every branch in its short rel8 form and widens only those whose target is out of reach, recomputing
the layout until nothing changes; this terminates because branches only ever grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speck.codegen.x86.encoder import Encoded, EncodingError, Relocation, encode, fits_signed
from speck.codegen.x86.listing import ListingLine, render_listing
from speck.codegen.x86.operands import Inst, Label, Operand
from speck.codegen.x86.ops import JCC_OPS, X86Op


@dataclass(frozen=True)
class Assembled:
    """The output of `assemble`: machine code, relocations (offsets into `code`), label addresses, listing lines."""

    code: bytes
    relocations: tuple[Relocation, ...]
    labels: dict[str, int]
    lines: tuple[ListingLine, ...]

    @property
    def listing(self) -> str:
        """The listing as text, laid out like `objdump -d -M intel`."""
        return render_listing(list(self.lines))


def _is_branch(item: Inst | Label) -> bool:
    return (
        isinstance(item, Inst)
        and (item.op in JCC_OPS or item.op is X86Op.JMP)
        and bool(item.operands)
        and isinstance(item.operands[0], Label)
    )


def assemble(items: Sequence[Inst | Label]) -> Assembled:
    """Lay out and encode a stream of instructions and label definitions.

    Branches start as rel8 and are widened to rel32 only when their target is out of reach; the layout is
    recomputed until no branch changes size.
    """
    seen: set[str] = set()
    for item in items:
        if isinstance(item, Label):
            if item.name in seen:
                raise EncodingError(f"assemble: label {item.name!r} is defined twice")
            seen.add(item.name)
    fixed: dict[int, Encoded] = {}
    branches: dict[int, Label] = {}
    sizes: list[int] = []  # bytes of each item in the current layout (labels 0)
    label_at: dict[int, str] = {}
    for i, it in enumerate(items):
        if isinstance(it, Label):
            label_at[i] = it.name
            sizes.append(0)
        elif _is_branch(it):
            assert isinstance(it.operands[0], Label)
            branches[i] = it.operands[0]
            sizes.append(2)  # rel8 until proven out of reach
        elif it.op is X86Op.CALL and isinstance(it.operands[0], Label):
            sizes.append(5)
        else:
            enc = fixed[i] = encode(it)
            sizes.append(len(enc.raw))
    long: set[int] = set()
    while True:
        pcs, labels, pc = [], {}, 0
        for size in sizes:
            pcs.append(pc)
            pc += size
        for i, name in label_at.items():
            labels[name] = pcs[i]
        grown = False
        for i, target in branches.items():
            if i not in long:
                if target.name not in labels:
                    raise EncodingError(f"{items[i]!r}: label {target.name!r} is not defined")
                if not fits_signed(labels[target.name] - (pcs[i] + 2), 8):
                    long.add(i)
                    item = items[i]
                    assert isinstance(item, Inst)
                    sizes[i] = 6 if item.op in JCC_OPS else 5
                    grown = True
        if not grown:
            break
    code = bytearray()
    relocs: list[Relocation] = []
    lines: list[ListingLine] = []
    for i, item in enumerate(items):
        if isinstance(item, Label):
            lines.append(ListingLine(len(code), b"", item.name + ":"))
            continue
        # branches, and calls (whose listing shows the target address), are encoded at their final address
        placed = i in fixed and item.op is not X86Op.CALL
        enc = fixed[i] if placed else encode(item, pcs[i], labels, i in long)
        assert len(code) == pcs[i]
        if enc.reloc is not None:
            r = enc.reloc
            relocs.append(Relocation(len(code) + r.offset, r.kind, r.symbol, r.addend))
        lines.append(ListingLine(len(code), enc.raw, enc.text, enc.comment))
        code += enc.raw
    return Assembled(bytes(code), tuple(relocs), labels, tuple(lines))


class Assembler:
    """Collects instructions and labels, then `assemble()`s them (a thin builder over the `assemble` function)."""

    def __init__(self) -> None:
        self.items: list[Inst | Label] = []

    def emit(self, op: X86Op, *operands: Operand) -> None:
        """Append one instruction."""
        self.items.append(Inst(op, tuple(operands)))

    def label(self, name: str) -> Label:
        """Define a label at the current position and return it (for use as a jump target)."""
        lbl = Label(name)
        self.items.append(lbl)
        return lbl

    def assemble(self) -> Assembled:
        """Encode everything collected so far."""
        return assemble(self.items)
