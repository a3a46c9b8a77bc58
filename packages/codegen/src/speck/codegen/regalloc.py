"""Target-independent linear-scan register allocation over a linear instruction list.

The allocator sees each instruction only as an `RAInstr`: the virtual registers it defines and uses, the physical
registers it clobbers, and loop markers. Register names, classes and the callee-saved set come from a `RegTarget`
(for x86-64 see `speck.codegen.x86.regs`); nothing here knows about any ISA.

How it works (Poletto & Sarkar style, one location per value):
- positions: instruction i reads its uses at 2i and writes its defs at 2i+1, so a value whose last use is at i can
  share a register with a value defined at i; a value used before any definition is live from function entry (incoming
  arguments);
- loops: a value whose interval crosses a loop boundary, or that is read in the loop before the loop writes it (carried
  around the back edge), is kept alive over the whole loop;
- fixed (precoloured) virtual registers own their physical register over their interval, and clobbers block a register
  at one instruction; other values only get a register that is free of both over their whole interval;
- when no register is free the cheapest value (the current one or an active one) goes to a stack slot: fewest
  accesses per position occupied, an access inside a loop nest of depth d counting 10**d;
  spilled values are reloaded into a scratch register before each use and stored after each def, except that a spilled
  value that a loop only reads is reloaded once before the loop when some register is free across the whole loop;
- slots of spilled values that are never live at the same time are shared;
- a value defined by a register copy takes its source's register when that is free (the copy then disappears);
- scratch registers are reserved only when something spills: a first scan offers them like any caller-saved register.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush

from speck.codegen.errors import RegAllocError


@dataclass(frozen=True, slots=True, init=False)
class VReg:
    """A virtual register: `id` names the value, `cls` its register class, `size` the width this operand uses.

    The same id may appear with different sizes (a 64-bit value read as its low 32 bits); allocation is per id.
    `fixed` pins the value to one physical register (by the target's register name) for its whole life.
    """

    id: int
    cls: str
    size: int = 8
    fixed: str | None = None

    def __init__(self, id: int, cls: str, size: int = 8, fixed: str | None = None) -> None:
        # instruction selection builds one per value and per width it is read at: the slots' own descriptors write
        # the frozen fields at half the cost of the generated __init__ (an object.__setattr__ call per field)
        _set_id(self, id)
        _set_cls(self, cls)
        _set_size(self, size)
        _set_fixed(self, fixed)

    def sized(self, size: int) -> VReg:
        """The same virtual register used at another width."""
        return VReg(self.id, self.cls, size, self.fixed)

    def __repr__(self) -> str:
        return f"v{self.id}" + (f"@{self.fixed}" if self.fixed else "") + f":{self.cls}{self.size * 8}"


_set_id, _set_cls, _set_size, _set_fixed = (VReg.__dict__[f].__set__ for f in ("id", "cls", "size", "fixed"))


@dataclass(frozen=True)
class RegClass:
    """One register class: registers in allocation preference order, reserved reload scratch registers, slot size."""

    name: str
    allocatable: tuple[str, ...]
    scratch: tuple[str, ...]
    slot_size: int


@dataclass(frozen=True)
class RegTarget:
    """The target description the allocator needs: classes by name and the callee-saved registers."""

    classes: Mapping[str, RegClass]
    callee_saved: frozenset[str]


@dataclass(frozen=True, slots=True, init=False)
class RAInstr:
    """The allocator's view of one instruction (or of a label / loop marker, which has no registers).

    `marker` is "loop_begin" just before a loop's header (code before it runs once) or "loop_end" just after the
    loop's back-edge branch.
    """

    defs: tuple[VReg, ...] = ()
    uses: tuple[VReg, ...] = ()
    clobbers: frozenset[str] = frozenset()
    marker: str | None = None
    copy: bool = False  # a plain register-to-register copy: its def prefers its use's register (the copy vanishes)

    def __init__(
        self, defs: tuple[VReg, ...] = (), uses: tuple[VReg, ...] = (), clobbers: frozenset[str] = frozenset(),
        marker: str | None = None, copy: bool = False,
    ) -> None:  # fmt: skip
        # one per instruction: written through the slots, as VReg.__init__ does
        _set_defs(self, defs)
        _set_uses(self, uses)
        _set_clobbers(self, clobbers)
        _set_marker(self, marker)
        _set_copy(self, copy)


_set_defs, _set_uses, _set_clobbers, _set_marker, _set_copy = (
    RAInstr.__dict__[f].__set__ for f in ("defs", "uses", "clobbers", "marker", "copy")
)


def instr_view(defs: tuple[VReg, ...], uses: tuple[VReg, ...], clobbers: frozenset[str], copy: bool) -> RAInstr:
    """RAInstr(defs, uses, clobbers, None, copy), built without the call through the class (a backend describes
    every instruction it allocates)."""
    r: RAInstr = object.__new__(RAInstr)
    _set_defs(r, defs)
    _set_uses(r, uses)
    _set_clobbers(r, clobbers)
    _set_marker(r, None)
    _set_copy(r, copy)
    return r


@dataclass(frozen=True)
class Reload:
    """Load spilled `vreg` from stack slot `slot` (byte offset in the spill area) into register `reg`."""

    vreg: VReg
    reg: str
    slot: int


@dataclass(frozen=True)
class Spill:
    """Store register `reg` (holding `vreg`) to stack slot `slot`."""

    vreg: VReg
    reg: str
    slot: int


@dataclass
class Allocation:
    """Result of `allocate`.

    `home` is each value's location over its interval (a register name, or an int stack slot offset); instruction i
    names a value in its home register except where `at[i]` says otherwise (a spilled value's reload register
    there). `reloads[i]` go immediately before instruction i and `spills[i]` immediately after it (both only for the
    instructions that have some). `frame_size` is the bytes of spill slots; `callee_saved` lists the callee-saved
    registers the code writes (the prologue must save them), in the target's preference order.
    """

    home: dict[int, str | int]
    at: dict[int, dict[int, str]]
    reloads: dict[int, list[Reload]]
    spills: dict[int, list[Spill]]
    callee_saved: tuple[str, ...]
    frame_size: int
    intervals: dict[int, tuple[int, int]] = field(default_factory=dict)
    loops: list[tuple[int, int]] = field(default_factory=list)

    def reg(self, i: int, vid: int) -> str:
        """The physical register instruction i uses for value `vid` (one it names)."""
        here = self.at.get(i)
        if here is not None and vid in here:
            return here[vid]
        loc = self.home[vid]
        assert isinstance(loc, str), f"v{vid} is spilled; instruction {i} does not name it"
        return loc


def _overlaps(ranges: Sequence[tuple[int, int]], s: int, e: int) -> bool:
    for rs, re in ranges:  # (a plain loop: any() over a generator costs twice as much on these short lists)
        if rs <= e and s <= re:
            return True
    return False


def _is_free(r: str, taken: set[str], blocked: dict[str, list[tuple[int, int]]], s: int, e: int) -> bool:
    # most registers are never blocked: test the (short) blocked lists only for those that are
    return r not in taken and (r not in blocked or not _overlaps(blocked[r], s, e))


def find_loops(instrs: Sequence[RAInstr], markers: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Pair loop_begin/loop_end markers into (begin index, end index), outer loops first. `markers`: the indices of
    the instructions that carry one, when the caller knows them (all instructions are looked at otherwise)."""
    stack: list[int] = []
    loops: list[tuple[int, int]] = []
    for i in range(len(instrs)) if markers is None else markers:
        marker = instrs[i].marker
        if marker == "loop_begin":
            stack.append(i)
        elif marker == "loop_end":
            if not stack:
                raise RegAllocError(f"instruction {i}: loop_end without a matching loop_begin")
            loops.append((stack.pop(), i))
        elif marker is not None:
            raise RegAllocError(f"instruction {i}: unknown marker {marker!r}; expected loop_begin or loop_end")
    if stack:
        raise RegAllocError(f"instruction {stack[-1]}: loop_begin without a matching loop_end")
    return sorted(loops)


def live_intervals(instrs: Sequence[RAInstr], loops: Sequence[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Live interval [start, end] (in positions 2i / 2i+1) of every vreg id, extended over loops as described above."""
    # id -> the positions it is accessed at: 2i for a read by instruction i, 2i+1 for a write (odd: a write)
    occurrences: dict[int, list[int]] = {}
    for i, ins in enumerate(instrs):
        for v in ins.uses:
            if (occ := occurrences.get(v.id)) is None:
                occurrences[v.id] = [2 * i]
            else:
                occ.append(2 * i)
        for v in ins.defs:
            if (occ := occurrences.get(v.id)) is None:
                occurrences[v.id] = [2 * i + 1]
            else:
                occ.append(2 * i + 1)
    return _intervals(occurrences, loops)


def _intervals(occurrences: dict[int, list[int]], loops: Sequence[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """live_intervals from each value's access positions (ascending)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    # Only a value that is live-in, or whose interval has a loop boundary inside it, can be extended: any other one
    # lies in one stretch between boundaries, so each loop either holds it whole - first access a write, hence not
    # carried - or misses it. Those (most values: temporaries of a block) never enter the fixed point below.
    bounds = sorted(p for b, e in loops for p in (2 * b, 2 * e + 1))
    movable: dict[int, list[int]] = {}
    # (each list is in position order already: instructions in order, an instruction's reads before its writes)
    for vid, occ in occurrences.items():
        s, t = occ[0], occ[-1]
        last[vid] = t
        if s & 1:
            first[vid] = s
            if bounds and bisect_left(bounds, s) != bisect_right(bounds, t):
                movable[vid] = occ
        else:  # read before any write: live-in at function entry (incoming arguments)
            first[vid] = 0
            movable[vid] = occ
    # whether a value's first access inside a loop is a read depends only on its accesses: decide it once per loop
    carried_in: dict[tuple[int, int], bool] = {}
    changed = bool(loops)
    while changed:
        changed = False
        for b, e in loops:
            lo, hi = 2 * b, 2 * e + 1
            for vid, occ in movable.items():
                s, t = first[vid], last[vid]
                if t < lo or s > hi or (s <= lo and t >= hi):
                    continue
                crosses = s < lo or t > hi
                if not crosses:
                    carried = carried_in.get((vid, b))
                    if carried is None:
                        first_inside = next((p for p in occ if lo <= p <= hi), None)
                        carried = carried_in[(vid, b)] = first_inside is not None and not first_inside & 1
                if crosses or carried:
                    first[vid], last[vid] = min(s, lo), max(t, hi)
                    changed = True
    return {vid: (first[vid], last[vid]) for vid in occurrences}


def _linear_scan(
    intervals: dict[int, tuple[int, int]],
    info: dict[int, VReg],
    blocked: dict[str, list[tuple[int, int]]],
    copied_from: dict[int, int],
    pools: dict[str, tuple[str, ...]],
    weight: dict[int, float],
    give_up_at_spill: bool = False,
) -> tuple[dict[int, str | int], list[int]]:
    """The scan proper: a register (from `pools`, in preference order) for each unpinned interval, or a spill.
    `give_up_at_spill`: return at the first spill (the caller then scans again with scratch registers reserved)."""
    home: dict[int, str | int] = {vid: v.fixed for vid, v in info.items() if v.fixed is not None}
    spilled: list[int] = []
    # the live intervals holding a register: vid -> (end, reg), in the order they got it (which breaks cost ties
    # between victims); `ends` is a heap of (end, vid) over them, entries of spilled victims left to go stale
    active: dict[int, tuple[int, str]] = {}
    ends: list[tuple[int, int]] = []
    taken: set[str] = set()  # the registers of `active`
    order = sorted((iv[0], iv[1], vid) for vid, iv in intervals.items() if info[vid].fixed is None)
    for s, e, vid in order:
        while ends and ends[0][0] < s:  # intervals that ended free their registers
            _, old = heappop(ends)
            if (held := active.pop(old, None)) is not None:
                taken.discard(held[1])
        cls = info[vid].cls
        pool = pools[cls]
        pick: str | None = None
        hint = home.get(copied_from.get(vid, -1))
        if isinstance(hint, str) and hint in pool and _is_free(hint, taken, blocked, s, e):
            pick = hint
        else:  # the first free register in preference order (the check of _is_free, inlined: this is the hot loop)
            for r in pool:
                if r not in taken and (r not in blocked or not _overlaps(blocked[r], s, e)):
                    pick = r
                    break
        if pick is not None:
            home[vid] = pick
            active[vid] = (e, pick)
            heappush(ends, (e, vid))
            taken.add(pick)
            continue

        if give_up_at_spill:
            return home, [vid]

        # spill the cheapest value (this one, or an active one whose register it could take): fewest accesses per
        # position it occupies, loop accesses counting 10x per nesting level; ties go to the one that lives longest,
        # then to the one that got its register first (a plain loop: this runs for every active value at each spill)
        best = (weight[vid] / (e - s + 1), -e)
        victim: tuple[int, str] | None = None
        for a_vid, (a_end, a_reg) in active.items():
            if info[a_vid].cls != cls or (a_reg in blocked and _overlaps(blocked[a_reg], s, e)):
                continue
            c = (weight[a_vid] / (a_end - intervals[a_vid][0] + 1), -a_end)
            if c < best:
                best, victim = c, (a_vid, a_reg)
        if victim is not None:
            v_id, v_reg = victim
            del active[v_id]  # its register goes straight to this value: `taken` is unchanged
            spilled.append(v_id)
            home[vid] = v_reg
            active[vid] = (e, v_reg)
            heappush(ends, (e, vid))
        else:
            spilled.append(vid)
    return home, spilled


class _SpillWeights(dict[int, float]):
    """vid -> spill weight: its accesses, each counting 10 ** the loop depth it is at, summed on first request in
    position order (the order the accesses come in)."""

    def __init__(self, occurrences: dict[int, list[int]], nesting: list[float]) -> None:
        super().__init__()
        self.occurrences, self.nesting = occurrences, nesting

    def __missing__(self, vid: int) -> float:
        nesting = self.nesting
        total = 0.0
        for p in self.occurrences[vid]:
            total += nesting[p >> 1]
        self[vid] = total
        return total


def _unknown_class(v: VReg, i: int, classes: Mapping[str, RegClass]) -> RegAllocError:
    return RegAllocError(f"instruction {i}: v{v.id} has class {v.cls!r}; the target has {sorted(classes)}")


def _class_change(v: VReg, seen: VReg, i: int) -> RegAllocError:
    return RegAllocError(
        f"instruction {i}: v{v.id} appears as class {v.cls!r} fixed {v.fixed!r} but "
        f"earlier as class {seen.cls!r} fixed {seen.fixed!r}; a value has one class"
    )


def allocate(instrs: Sequence[RAInstr], target: RegTarget) -> Allocation:
    """Assign every virtual register a physical register or a stack slot, and plan the spill/reload code."""
    # one pass: each value's VReg (checked for one class), the positions it is accessed at (live_intervals), the
    # value a register copy defines it from, and where the loop markers and clobbering instructions are. Spill
    # weights (accesses, each counting 10 ** loop nesting depth) are summed from the positions only for the values
    # a spill decision looks at (few: most kernels never spill), see _SpillWeights.
    info: dict[int, VReg] = {}
    occurrences: dict[int, list[int]] = {}
    copied_from: dict[int, int] = {}
    markers: list[int] = []
    clobbering: list[int] = []
    nesting: list[float] = []  # 10 ** loop depth of each instruction
    classes = target.classes
    depth = 0
    w = 1.0
    for i, ins in enumerate(instrs):
        if ins.marker is not None:
            markers.append(i)
            depth += (ins.marker == "loop_begin") - (ins.marker == "loop_end")
            w = 10.0**depth
            nesting.append(w)
            continue
        nesting.append(w)
        if ins.clobbers:
            clobbering.append(i)
        for regs, pos in ((ins.uses, 2 * i), (ins.defs, 2 * i + 1)):  # reads first, then writes at 2i+1
            for v in regs:
                vid = v.id
                occ = occurrences.get(vid)
                if occ is None:
                    if v.cls not in classes:
                        raise _unknown_class(v, i, classes)
                    info[vid] = v
                    occurrences[vid] = [pos]
                    continue
                seen = info[vid]
                if seen is not v and (seen.cls != v.cls or seen.fixed != v.fixed):
                    raise _class_change(v, seen, i)
                occ.append(pos)
        if ins.copy and len(ins.defs) == 1 and len(ins.uses) == 1:
            copied_from.setdefault(ins.defs[0].id, ins.uses[0].id)
    weight = _SpillWeights(occurrences, nesting)
    loops = find_loops(instrs, markers)
    intervals = _intervals(occurrences, loops)

    # registers owned by fixed values, and single-instruction clobbers
    blocked: dict[str, list[tuple[int, int]]] = {}
    fixed_owner: dict[str, list[tuple[int, int, int]]] = {}
    for vid, v in info.items():
        if v.fixed is not None:
            s, e = intervals[vid]
            for os_, oe, other in fixed_owner.get(v.fixed, []):
                if os_ <= e and s <= oe:
                    raise RegAllocError(
                        f"v{vid} and v{other} are both fixed to {v.fixed} and live at the same time "
                        f"({s}..{e} vs {os_}..{oe}); copy one of them to a free virtual register"
                    )
            fixed_owner.setdefault(v.fixed, []).append((s, e, vid))
            blocked.setdefault(v.fixed, []).append((s, e))
    for i in clobbering:
        for r in instrs[i].clobbers:
            blocked.setdefault(r, []).append((2 * i + 1, 2 * i + 1))
            for s, e, other in fixed_owner.get(r, []):
                if s < 2 * i + 1 <= e:
                    raise RegAllocError(
                        f"instruction {i} clobbers {r} while v{other}, fixed to {r}, is live across "
                        "it; copy the value to an unpinned virtual register before the instruction"
                    )

    def pools(reserve_scratch: bool) -> dict[str, tuple[str, ...]]:
        # without spills nothing needs a scratch register: offer them first, ahead of the callee-saved ones
        out = {}
        for name, c in target.classes.items():
            k = next((j for j, r in enumerate(c.allocatable) if r in target.callee_saved), len(c.allocatable))
            out[name] = c.allocatable if reserve_scratch else c.allocatable[:k] + c.scratch + c.allocatable[k:]
        return out

    home, spilled = _linear_scan(intervals, info, blocked, copied_from, pools(False), weight, give_up_at_spill=True)
    if spilled:
        home, spilled = _linear_scan(intervals, info, blocked, copied_from, pools(True), weight)
    assigned: dict[str, list[tuple[int, int]]] = {}
    for vid, reg in home.items():
        if isinstance(reg, str) and vid not in spilled:
            assigned.setdefault(reg, []).append(intervals[vid])

    # stack slots, shared between spilled values whose intervals do not overlap
    slots: dict[int, int] = {}
    slot_free_at: list[tuple[int, int, int]] = []  # (offset, size, busy until)
    frame = 0
    for vid in sorted(spilled, key=lambda v: intervals[v]):
        s, e = intervals[vid]
        size = target.classes[info[vid].cls].slot_size
        for k, (off, sz, until) in enumerate(slot_free_at):
            if sz == size and until < s:
                slots[vid] = off
                slot_free_at[k] = (off, sz, e)
                break
        else:
            frame += -frame % size
            slots[vid] = frame
            slot_free_at.append((frame, size, e))
            frame += size
        home[vid] = slots[vid]

    # registers of spilled values where the code names them (reload registers), by instruction
    at: dict[int, dict[int, str]] = {}
    reloads: dict[int, list[Reload]] = {}
    spills: dict[int, list[Spill]] = {}

    # loop-invariant spilled values: one reload before the loop if a register is free across all of it. Where each
    # spilled value is read and written (instruction indices, ascending) answers "does the loop body touch it" by
    # bisection instead of a scan of the body per value and loop.
    # (read off the value's access positions: 2i a read by instruction i, 2i+1 a write, ascending)
    uses_at: dict[int, list[int]] = {}
    defs_at: dict[int, list[int]] = {}
    for vid in spilled:
        reads: list[int] = []
        writes: list[int] = []
        for p in occurrences[vid]:
            where = writes if p & 1 else reads
            if not where or where[-1] != p >> 1:
                where.append(p >> 1)
        uses_at[vid], defs_at[vid] = reads, writes
    for vid in spilled:
        s, e = intervals[vid]
        cls = target.classes[info[vid].cls]
        u_at, d_at = uses_at[vid], defs_at[vid]
        hoisted: list[tuple[int, int]] = []  # loops this value already has a register across
        for b, end in loops:
            lo, hi = 2 * b, 2 * end + 1
            if not (s <= lo and e >= hi) or any(hb <= b and end <= he for hb, he in hoisted):
                continue
            first_use, past_uses = bisect_left(u_at, b + 1), bisect_left(u_at, end)
            if first_use == past_uses or bisect_left(d_at, b + 1) != bisect_left(d_at, end):
                continue  # not read in the loop, or written there
            hold = next((r for r in cls.allocatable if not _overlaps(blocked.get(r, []), lo, hi)
                        and not _overlaps(assigned.get(r, []), lo, hi)), None)  # fmt: skip
            if hold is None:
                continue
            assigned.setdefault(hold, []).append((lo, hi))
            reloads.setdefault(b, []).append(Reload(info[vid], hold, slots[vid]))
            for j in u_at[first_use:past_uses]:
                at.setdefault(j, {})[vid] = hold
            hoisted.append((b, end))

    # remaining references to spilled values: a scratch register per operand. An instruction reads all its sources
    # before writing its results, so a value it only writes may reuse the scratch of a value it only reads.
    # Only the instructions naming a spilled value are visited (with no spill every operand has a register).
    touching = sorted({i for where in (*uses_at.values(), *defs_at.values()) for i in where})
    for i in touching:
        ins, at_i = instrs[i], at.setdefault(i, {})
        # the registers this instruction's values already have (in their homes, or hoisted reloads), and the values
        # that still need one (each once, sources first)
        held: set[str] = set()
        pending: dict[int, VReg] = {}
        for v in ins.uses + ins.defs:
            loc = at_i.get(v.id, home[v.id])
            if isinstance(loc, str):
                held.add(loc)
            elif v.id not in pending:
                pending[v.id] = v
        if not pending:
            continue  # every spilled value here has its hoisted register
        read_scratch: set[str] = set()
        written_scratch: set[str] = set()
        use_ids = {u.id for u in ins.uses}
        def_ids = {d.id for d in ins.defs}
        for v in pending.values():
            cls = target.classes[v.cls]
            avoid = held | written_scratch | (read_scratch if v.id in use_ids else set())
            tmp = None
            for r in cls.scratch:
                if r not in avoid and (r not in blocked or not _overlaps(blocked[r], 2 * i, 2 * i + 1)):
                    tmp = r
                    break
            if tmp is None:  # all reserved scratch taken: any register nothing occupies at this instruction
                point_free = [r for r in cls.allocatable if r not in avoid
                              and not _overlaps(blocked.get(r, []), 2 * i, 2 * i + 1)
                              and not _overlaps(assigned.get(r, []), 2 * i, 2 * i + 1)]  # fmt: skip
                tmp = point_free[0] if point_free else None
            if tmp is None:
                raise RegAllocError(
                    f"instruction {i}: more spilled {cls.name} operands than scratch registers "
                    f"({len(cls.scratch)}) and no free register; split the instruction"
                )
            at_i[v.id] = tmp
            if v.id in use_ids:
                read_scratch.add(tmp)
                reloads.setdefault(i, []).append(Reload(info[v.id], tmp, slots[v.id]))
            if v.id in def_ids:
                written_scratch.add(tmp)
                spills.setdefault(i, []).append(Spill(info[v.id], tmp, slots[v.id]))

    written = {loc for loc in home.values() if isinstance(loc, str)} | {r for m in at.values() for r in m.values()}
    order_all = [r for c in target.classes.values() for r in c.allocatable + c.scratch]
    callee = tuple(r for r in order_all if r in written and r in target.callee_saved)
    return Allocation(home, {i: m for i, m in at.items() if m}, reloads, spills, callee, frame, intervals, loops)
