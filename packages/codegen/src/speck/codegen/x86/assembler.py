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
from speck.codegen.x86.listing import ListingLine
from speck.codegen.x86.operands import Inst, Label, Operand
from speck.codegen.x86.ops import JCC_OPS, X86Op


@dataclass(frozen=True)
class Assembled:
    """The output of `assemble`: machine code, relocations (offsets into `code`), label addresses, and for listing
    every item's address (`pcs`, plus the end) with its encoding or, for a label, the Label itself (`placed`)."""

    code: bytes
    relocations: tuple[Relocation, ...]
    labels: dict[str, int]
    pcs: list[int]
    placed: list[Encoded | Label]

    @property
    def lines(self) -> list[ListingLine]:
        """The listing line of every item."""
        return [ListingLine(pc, b"", e.name + ":") if isinstance(e, Label) else ListingLine(pc, e.raw, e.text,
                e.comment, e.body) for pc, e in zip(self.pcs, self.placed)]  # fmt: skip

    @property
    def listing(self) -> str:
        """The listing as text, laid out like `objdump -d -M intel` (render_listing's layout, made here straight from
        the encodings: every render lists every instruction)."""
        return "\n".join([f"{pc:016x} <{e.name}>:" if isinstance(e, Label) else f"{pc:8x}:\t{e.body}"
                          for pc, e in zip(self.pcs, self.placed)]) + "\n"  # fmt: skip


_TO_LABELS = JCC_OPS | {X86Op.JMP, X86Op.CALL}  # ops that may target a label
_LATE = Encoded(b"", "")  # the place of an item encoded once the layout is known


def assemble(items: Sequence[Inst | Label]) -> Assembled:
    """Lay out and encode a stream of instructions and label definitions.

    Branches start as rel8 and are widened to rel32 only when their target is out of reach; the layout is
    recomputed until no branch changes size.
    """
    # one pass encodes everything position-independent (nearly all items) and sizes the rest: labels (0 bytes),
    # branches to labels (sized by the layout loop) and calls, which are encoded once placed (the listing shows a
    # call's target address)
    placed: list[Encoded | Label] = []
    late: list[int] = []  # items encoded at their final address: branches and calls
    branches: list[tuple[int, str]] = []  # (item index, target label)
    sizes: list[int] = []  # bytes of each item in the current layout (labels 0)
    label_at: dict[str, int] = {}  # label -> item index
    cached = _ENCODED.get  # encode()'s cache, read inline for the common case (not a branch or call)
    for i, it in enumerate(items):
        if isinstance(it, Label):
            if it.name in label_at:
                raise EncodingError(f"assemble: label {it.name!r} is defined twice")
            label_at[it.name] = i
            placed.append(it)
            sizes.append(0)
            continue
        if it.op not in _TO_LABELS:
            enc = cached((it.op, it.operands)) or encode(it)
            placed.append(enc)
            sizes.append(len(enc.raw))
            continue
        late.append(i)
        target = it.operands[0] if it.operands else None
        if isinstance(target, Label) and it.op is not X86Op.CALL:
            branches.append((i, target.name))
            size = 2  # rel8 until proven out of reach
        elif isinstance(target, Label):
            size = 5
        else:
            enc = encode(it)
            size = len(enc.raw)
        placed.append(_LATE)  # (replaced by its encoding below)
        sizes.append(size)
    for i, name in branches:
        if name not in label_at:
            raise EncodingError(f"{items[i]!r}: label {name!r} is not defined")
    pcs, labels, long = _layout(items, sizes, branches, label_at)
    for i in late:
        item = items[i]
        assert isinstance(item, Inst)
        enc = placed[i] = encode(item, pcs[i], labels, i in long)
        assert len(enc.raw) == sizes[i], f"{item!r}: encoded in {len(enc.raw)} bytes, laid out in {sizes[i]}"
    relocs = tuple([Relocation(pcs[i] + r.offset, r.kind, r.symbol, r.addend) for i, e in enumerate(placed)
                    if type(e) is Encoded and (r := e.reloc) is not None])  # fmt: skip
    code = b"".join([e.raw for e in placed if type(e) is Encoded])
    assert len(code) == pcs[-1]
    return Assembled(code, relocs, labels, pcs, placed)


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
