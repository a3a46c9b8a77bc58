"""Peephole clean-up of a selected instruction list (on virtual registers, before register allocation).

`fold_copies` removes the copies selection leaves behind where a value is computed into a temporary and then moved
into its long-lived home (an accumulator register, a loop-carried value): the computing instruction writes the home
directly when that is safe."""

from __future__ import annotations

from bisect import bisect_left

from speck.codegen.regalloc import VReg
from speck.codegen.x86.alloc import Item, operand_roles
from speck.codegen.x86.operands import Inst, Mem, Operand
from speck.codegen.x86.ops import X86Op as O


def fold_copies(items: list[Item]) -> list[Item]:
    """Peephole: `op S, ...; mov D, S` -> `op D, ...` when S is a temporary used only there and D is neither read nor
    written between S's first definition and the copy (accumulator updates then write the accumulator directly)."""
    occ: dict[int, list[int]] = {}
    defs_at: dict[int, frozenset[int]] = {}
    marks = [0]  # marks[i]: labels and loop markers before item i (a copy never folds across one)
    for i, it in enumerate(items):
        if isinstance(it, Inst):
            marks.append(marks[-1])
            defs, uses = operand_roles(it)
            d = defs_at[i] = frozenset([v.id for v in defs])
            for vid in d.union([v.id for v in uses]):
                occ.setdefault(vid, []).append(i)  # each list ascending: items are visited in order
        else:
            marks.append(marks[-1] + 1)
    drop: set[int] = set()
    rename: dict[int, VReg] = {}
    for i, it in enumerate(items):
        if not (isinstance(it, Inst) and it.op in (O.MOV, O.VMOVAPS) and len(it.operands) == 2):
            continue
        dst, src = it.operands
        if not (isinstance(dst, VReg) and isinstance(src, VReg)) or dst.fixed or src.fixed:
            continue
        if it.op is O.MOV and not (dst.size == src.size == 8):
            continue
        where = occ.get(src.id, [])
        if not where or where[-1] != i or src.id in rename or dst.id in rename:
            continue
        first = where[0]
        if first in drop:  # S is itself the target of a folded copy: leave chains alone
            continue
        if src.id not in defs_at.get(first, frozenset()) or marks[i] != marks[first]:
            continue
        # D may be read by S's defining instruction (it reads before it writes) but not touched in between
        if _touched(occ.get(dst.id, []), first, i, dst.id in defs_at[first]):
            continue
        rename[src.id] = dst
        drop.add(i)
    if not rename:
        return items
    out: list[Item] = []
    for i, it in enumerate(items):
        if i in drop:
            continue
        if isinstance(it, Inst):
            ops = tuple([_rename(o, rename) for o in it.operands])
            # an instruction that names no renamed value is kept as it is (an equal copy would change nothing)
            if any(a is not b for a, b in zip(ops, it.operands)):
                it = Inst(it.op, ops, it.implicit_uses, it.implicit_defs, it.clobbers)
        out.append(it)
    return out


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
        return Mem(base, index, o.scale, o.disp, o.size, o.symbol)
    return o


__all__ = ["fold_copies"]
