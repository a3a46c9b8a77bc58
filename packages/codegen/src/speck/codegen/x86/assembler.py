"""Layout of an instruction stream: label addresses, jump relaxation (rel8 vs rel32), relocations and the listing.

`assemble` starts every branch in its short rel8 form and widens only those whose target is out of reach, recomputing
the layout until nothing changes; this terminates because branches only ever grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from speck.codegen.errors import EncodingError
from speck.codegen.x86.encoder import _ENCODED, Encoded, Relocation, encode, fits_signed
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


_TO_LABELS = JCC_OPS | {X86Op.JMP, X86Op.CALL}  # ops that may target a label


def assemble(items: Sequence[Inst | Label]) -> Assembled:
    """Lay out and encode a stream of instructions and label definitions.

    Branches start as rel8 and are widened to rel32 only when their target is out of reach; the layout is
    recomputed until no branch changes size.
    """
    # one pass sorts the items: labels (0 bytes), branches to labels (sized by the layout loop), calls to labels
    # (rel32, encoded once placed) and everything else, encoded now (position-independent)
    fixed: list[Encoded | None] = [None] * len(items)
    branches: list[tuple[int, str]] = []  # (item index, target label)
    sizes: list[int] = []  # bytes of each item in the current layout (labels 0)
    label_at: dict[str, int] = {}  # label -> item index
    cached = _ENCODED.get  # encode()'s cache, read inline for the common case (not a branch or call)
    for i, it in enumerate(items):
        if isinstance(it, Label):
            if it.name in label_at:
                raise EncodingError(f"assemble: label {it.name!r} is defined twice")
            label_at[it.name] = i
            sizes.append(0)
            continue
        if it.op not in _TO_LABELS:
            enc = fixed[i] = cached((it.op, it.operands)) or encode(it)
            sizes.append(len(enc.raw))
            continue
        target = it.operands[0] if it.operands else None
        if isinstance(target, Label) and it.op is not X86Op.CALL:
            branches.append((i, target.name))
            sizes.append(2)  # rel8 until proven out of reach
        elif isinstance(target, Label):
            sizes.append(5)
        else:
            enc = fixed[i] = encode(it)
            sizes.append(len(enc.raw))
    for i, name in branches:
        if name not in label_at:
            raise EncodingError(f"{items[i]!r}: label {name!r} is not defined")
    pcs, labels, long = _layout(items, sizes, branches, label_at)
    code = bytearray()
    relocs: list[Relocation] = []
    lines: list[ListingLine] = []
    for i, item in enumerate(items):
        pc = len(code)
        assert pc == pcs[i]
        placed = fixed[i]
        if placed is not None and item.op is not X86Op.CALL:  # type: ignore[union-attr]  # (encoded above: an Inst)
            if placed.reloc is not None:
                r = placed.reloc
                relocs.append(Relocation(pc + r.offset, r.kind, r.symbol, r.addend))
            lines.append(ListingLine(pc, placed.raw, placed.text, placed.comment, placed.body))
            code += placed.raw
            continue
        if isinstance(item, Label):
            lines.append(ListingLine(pc, b"", item.name + ":"))
            continue
        # branches, and calls (whose listing shows the target address), are encoded at their final address
        enc = placed if placed is not None and item.op is not X86Op.CALL else encode(item, pc, labels, i in long)
        if enc.reloc is not None:
            r = enc.reloc
            relocs.append(Relocation(pc + r.offset, r.kind, r.symbol, r.addend))
        lines.append(ListingLine(pc, enc.raw, enc.text, enc.comment, enc.body))
        code += enc.raw
    return Assembled(bytes(code), tuple(relocs), labels, tuple(lines))


def _layout(
    items: Sequence[Inst | Label], sizes: list[int], branches: list[tuple[int, str]], label_at: dict[str, int]
) -> tuple[list[int], dict[str, int], set[int]]:
    """(address of every item, address of every label, indices of the branches that need rel32); widens `sizes`."""
    long: set[int] = set()
    while True:
        pcs = [0, *accumulate(sizes)]  # pcs[i]: address of item i (one extra entry: the end)
        labels = {name: pcs[i] for name, i in label_at.items()}
        grown = False
        for i, name in branches:
            if i not in long and not fits_signed(labels[name] - (pcs[i] + 2), 8):
                long.add(i)
                item = items[i]
                assert isinstance(item, Inst)
                sizes[i] = 6 if item.op in JCC_OPS else 5
                grown = True
        if not grown:
            return pcs, labels, long


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
