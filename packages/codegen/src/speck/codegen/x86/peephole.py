"""Peephole clean-up of a selected instruction list (on virtual registers, before register allocation).

`fold_copies` removes the copies selection leaves behind where a value is computed into a temporary and then moved
into its long-lived home (an accumulator register, a loop-carried value): the computing instruction writes the home
directly when that is safe."""

from __future__ import annotations

from bisect import bisect_left

from speck.codegen.regalloc import VReg
from speck.codegen.x86.alloc import Item, ra_view
from speck.codegen.x86.operands import Inst, Mem, Operand
from speck.codegen.x86.ops import X86Op as O


def fold_copies(items: list[Item]) -> list[Item]:
    """Peephole: `op S, ...; mov D, S` -> `op D, ...` when S is a temporary used only there and D is neither read nor
    written between S's first definition and the copy (accumulator updates then write the accumulator directly)."""
    copies = {i: it for i, it in enumerate(items) if isinstance(it, Inst) and it.op in _COPY_OPS and _is_candidate(it)}
    if not copies:
        return items
    # where the values the candidate copies name occur (ascending item indices), and the loop/label marks; no other
    # value matters to the decisions below
    occ: dict[int, list[int]] = {o.id: [] for it in copies.values() for o in it.operands if isinstance(o, VReg)}
    fences: list[int] = []  # where the labels and loop markers are (a copy never folds across one)
    get = occ.get
    for i, it in enumerate(items):
        if type(it) is not Inst:
            fences.append(i)
            continue
        view = ra_view(it)  # (kept on the instruction: allocation asks again)
        for v in view.defs:
            where = get(v.id)
            if where is not None and (not where or where[-1] != i):  # an id named twice by one item: recorded once
                where.append(i)
        for v in view.uses:
            where = get(v.id)
            if where is not None and (not where or where[-1] != i):
                where.append(i)
    drop: set[int] = set()
    rename: dict[int, VReg] = {}
    for i, copy in copies.items():
        dst, src = copy.operands
        assert isinstance(dst, VReg) and isinstance(src, VReg)
        where = occ[src.id]
        if where[-1] != i or src.id in rename or dst.id in rename:
            continue
        first = where[0]
        if first in drop:  # S is itself the target of a folded copy: leave chains alone
            continue
        defining = items[first]
        assert isinstance(defining, Inst)
        first_defs = [v.id for v in ra_view(defining).defs]
        if src.id not in first_defs or bisect_left(fences, i) != bisect_left(fences, first):
            continue
        # D may be read by S's defining instruction (it reads before it writes) but not touched in between
        if _touched(occ[dst.id], first, i, dst.id in first_defs):
            continue
        rename[src.id] = dst
        drop.add(i)
    if not rename:
        return items
    # only the items naming a renamed value change: rewrite those in place, then cut the dropped copies out
    out = list(items)
    for j in {j for vid in rename for j in occ[vid]} - drop:
        it = out[j]
        assert isinstance(it, Inst)
        ops = tuple([_rename(o, rename) for o in it.operands])
        if any(a is not b for a, b in zip(ops, it.operands)):
            if j in copies and ops[0] == ops[1]:  # became a copy of a value onto itself
                drop.add(j)
                continue
            out[j] = Inst(it.op, ops, it.implicit_uses, it.implicit_defs, it.clobbers)
    kept: list[Item] = []
    done = 0
    for j in sorted(drop):
        kept += out[done:j]
        done = j + 1
    kept += out[done:]
    return kept


def _is_candidate(it: Inst) -> bool:
    """A whole-register copy between two unpinned virtual registers (`mov D, S` at 64 bits, `vmovaps D, S`)."""
    if len(it.operands) != 2:
        return False
    dst, src = it.operands
    if not (isinstance(dst, VReg) and isinstance(src, VReg)) or dst.fixed or src.fixed:
        return False
    return it.op is not _MOV or dst.size == src.size == 8


_COPY_OPS = frozenset({O.MOV, O.VMOVAPS})
_MOV = O.MOV  # (a global: attribute access on an enum class is slow in Python 3.11)


def _touched(where: list[int], first: int, i: int, written_at_first: bool) -> bool:
    """Whether an ascending occurrence list has an item strictly between first and i, or at first if written there."""
    for j in where[bisect_left(where, first) :]:
        if j == first:
            if written_at_first:
                return True
            continue
        return j < i  # the first occurrence after `first` decides
    return False


def _rename(o: Operand, m: dict[int, VReg]) -> Operand:
    if isinstance(o, VReg):
        return m[o.id].sized(o.size) if o.id in m else o
    if isinstance(o, Mem) and (isinstance(o.base, VReg) and o.base.id in m or isinstance(o.index, VReg)
                               and o.index.id in m):  # fmt: skip
        base = m[o.base.id].sized(8) if isinstance(o.base, VReg) and o.base.id in m else o.base
        index = m[o.index.id].sized(8) if isinstance(o.index, VReg) and o.index.id in m else o.index
        return Mem(base, index, o.scale, o.disp, o.size, o.symbol, o.broadcast)
    return o


__all__ = ["fold_copies"]
