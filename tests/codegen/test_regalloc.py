"""Linear-scan register allocator: properties checked by executing random programs before and after allocation.

A random structured program (straight-line instructions and nested loops that run several times) is executed twice:
once on virtual registers, once on the physical registers and stack slots the allocation chose (running its reloads
and spills, clobbering registers where instructions say so, filling dead registers with garbage). Every read must see
the same value in both runs. A small fake target (4 + 3 registers) makes spilling common.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.regalloc import (
    RAInstr,
    RegAllocError,
    RegClass,
    RegTarget,
    VReg,
    allocate,
    instr_view,
    live_intervals,
)

TINY = RegTarget(
    {
        "a": RegClass("a", ("a0", "a1", "a2", "a3"), ("s0", "s1", "s2"), 8),
        "b": RegClass("b", ("b0", "b1", "b2"), ("t0", "t1", "t2"), 32),
    },
    callee_saved=frozenset({"a2", "a3"}),
)
PINNABLE = ("a0", "a1")  # registers a value may be fixed to in generated programs
ITERATIONS = 3


def run_program(instrs: list[RAInstr], alloc=None) -> list[tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    """Execute; returns every (instruction, vreg id, value) read. With an allocation, run on physical registers."""
    loops = {}
    stack = []
    for i, ins in enumerate(instrs):
        if ins.marker == "loop_begin":
            stack.append(i)
        elif ins.marker == "loop_end":
            loops[i] = stack.pop()
    virt: dict[int, int] = {}
    phys: dict[str, int] = {}
    mem: dict[int, int] = {}
    trips: dict[int, int] = {}
    if alloc is not None:  # arguments arrive in their pinned registers
        phys.update({v.fixed: 1000 + v.id for x in instrs for v in x.uses if v.fixed is not None})
    reads = []
    garbage = iter(range(10**9, 2 * 10**9))
    i = 0
    while i < len(instrs):
        ins = instrs[i]
        if alloc is not None:
            for rl in alloc.reloads.get(i, []):
                phys[rl.reg] = mem.get(rl.slot, -2)
        args = []
        for v in ins.uses:
            if alloc is None:
                val = virt.get(v.id, 1000 + v.id)  # live-in values (arguments) are 1000 + id
            else:
                reg = alloc.reg(i, v.id)
                if v.fixed is not None:
                    assert reg == v.fixed
                val = phys.get(reg, -1)
            reads.append((i, v.id, val))
            args.append(val)
        result = args[0] if ins.copy else hash((i, tuple(args))) & 0xFFFFFFF
        if alloc is not None:
            for r in ins.clobbers:
                phys[r] = next(garbage)
        for k, d in enumerate(ins.defs):
            if alloc is None:
                virt[d.id] = result + k
            else:
                phys[alloc.reg(i, d.id)] = result + k
        if alloc is not None:
            for sp in alloc.spills.get(i, []):
                mem[sp.slot] = phys[sp.reg]
        if ins.marker == "loop_end":
            trips[i] = trips.get(i, 0) + 1
            if trips[i] < ITERATIONS:
                i = loops[i] + 1
                continue
            trips[i] = 0
        i += 1
    return reads


def random_program(seed: int) -> list[RAInstr]:
    """Random structured program: each op defines 0..2 values and reads 0..3 earlier ones; loops nest up to depth 2.

    Built from a hypothesis-drawn seed with `random.Random` (drawing each choice through hypothesis strategies costs
    far more than the allocation under test).
    """
    rnd = random.Random(seed)
    instrs: list[RAInstr] = []
    defined: list[VReg] = [VReg(100 + k, "a", 8, PINNABLE[k]) for k in range(rnd.randint(0, 2))]  # arguments
    next_id = [0]

    def new_vreg() -> VReg:
        next_id[0] += 1
        return VReg(next_id[0], rnd.choice(["a", "a", "b"]))

    def block(depth: int, length: int) -> None:
        for _ in range(length):
            if depth < 2 and rnd.randint(0, 6) == 0:
                instrs.append(RAInstr(marker="loop_begin"))
                block(depth + 1, rnd.randint(1, 6))
                instrs.append(RAInstr(marker="loop_end"))
                continue
            uses = tuple(rnd.choice(defined) for _ in range(rnd.randint(0, 3))) if defined else ()
            defs: list[VReg] = []
            for _ in range(rnd.randint(0, 2)):
                nonfixed = [v for v in defined if v.fixed is None]
                # redefining an existing value makes it loop-carried when inside a loop
                defs.append(rnd.choice(nonfixed) if nonfixed and rnd.random() < 0.5 else new_vreg())
            defs = list(dict.fromkeys(defs))
            clobbers = frozenset(
                rnd.sample(["a3", "s1", "b1", "t0"], rnd.randint(1, 2)) if rnd.randint(0, 5) == 0 else []
            )
            copy = len(defs) == 1 and len(uses) == 1 and uses[0].cls == defs[0].cls and rnd.random() < 0.5
            instrs.append(RAInstr(tuple(defs), uses, clobbers, copy=copy))
            defined.extend(d for d in defs if d not in defined)

    block(0, rnd.randint(1, 25))
    return instrs


seeds = st.integers(0, 2**64 - 1)


@settings(max_examples=3 * settings.default.max_examples)
@given(seeds)
def test_allocated_program_reads_same_values(seed: int) -> None:
    instrs = random_program(seed)
    try:
        alloc = allocate(instrs, TINY)
    except RegAllocError as e:  # rare: more spilled operands in one instruction than free registers
        assert "scratch" in str(e)
        return
    assert run_program(instrs, alloc) == run_program(instrs)


@settings(max_examples=3 * settings.default.max_examples)
@given(seeds)
def test_no_two_live_values_share_a_register(seed: int) -> None:
    instrs = random_program(seed)
    try:
        alloc = allocate(instrs, TINY)
    except RegAllocError as e:
        assert "scratch" in str(e)
        return
    homes = [(iv, alloc.home[vid], vid) for vid, iv in alloc.intervals.items()]
    for (s1, e1), h1, v1 in homes:
        for (s2, e2), h2, v2 in homes:
            if v1 < v2 and s1 <= e2 and s2 <= e1:
                assert h1 != h2, f"v{v1} and v{v2} overlap ({s1}..{e1}, {s2}..{e2}) but share {h1}"
    # every register an instruction writes that is callee-saved is reported
    written = {alloc.reg(i, v.id) for i, ins in enumerate(instrs) for v in ins.defs + ins.uses}
    assert set(alloc.callee_saved) == written & TINY.callee_saved


def a(i: int) -> VReg:
    return VReg(i, "a")


def test_loop_carried_value_lives_to_loop_end() -> None:
    # acc = 0; loop { t = f(acc); acc = t } ; use acc
    instrs = [
        RAInstr(defs=(a(1),)),
        RAInstr(marker="loop_begin"),
        RAInstr(defs=(a(2),), uses=(a(1),)),
        RAInstr(defs=(a(3),)),  # a value defined and dead inside the loop
        RAInstr(defs=(a(1),), uses=(a(2), a(3))),
        RAInstr(marker="loop_end"),
        RAInstr(uses=(a(1),)),
    ]
    iv = live_intervals(instrs, [(1, 5)])
    assert iv[1] == (1, 12)
    assert iv[3] == (7, 8)  # does not cross the back edge: not extended
    alloc = allocate(instrs, TINY)
    assert run_program(instrs, alloc) == run_program(instrs)


def test_value_defined_before_loop_and_read_inside_survives_all_iterations() -> None:
    # x defined before the loop, read at the start of the body; without the extension its register would be reused
    instrs = [RAInstr(defs=(a(1),)), RAInstr(marker="loop_begin"), RAInstr(defs=(a(2),), uses=(a(1),))]
    instrs += [RAInstr(defs=(a(3 + k),), uses=(a(2),)) for k in range(3)]
    instrs += [RAInstr(uses=tuple(a(3 + k) for k in range(3))), RAInstr(marker="loop_end")]
    alloc = allocate(instrs, TINY)
    assert alloc.intervals[1][1] >= 2 * 7
    assert alloc.home[1] not in {alloc.home[k] for k in (2, 3, 4, 5)}
    assert run_program(instrs, alloc) == run_program(instrs)


def test_pressure_spills_and_loop_invariant_reload_is_hoisted() -> None:
    # nine values live at once before the loop (7 registers, 4 once scratch is reserved): some spill. v0 is read only
    # once (inside the loop) over a long stretch, so it is the cheapest to spill; the loop only reads it and has free
    # registers, so it is reloaded once before the loop instead of at every iteration.
    n, rounds = 9, 20
    instrs = [RAInstr(defs=(a(k),)) for k in range(n)]
    instrs += [RAInstr(uses=(a(k),)) for _ in range(rounds) for k in range(1, n)]
    begin = len(instrs)
    instrs += [RAInstr(marker="loop_begin"), RAInstr(defs=(a(50),), uses=(a(0),)), RAInstr(uses=(a(50),)),
               RAInstr(marker="loop_end")]  # fmt: skip
    alloc = allocate(instrs, TINY)
    assert isinstance(alloc.home[0], int), "the value with the fewest accesses per position is spilled"
    assert [r.vreg.id for r in alloc.reloads[begin]] == [0]
    assert begin + 1 not in alloc.reloads and alloc.reg(begin + 1, 0) == alloc.reloads[begin][0].reg
    assert run_program(instrs, alloc) == run_program(instrs)


def test_values_used_in_loops_are_spilled_last() -> None:
    # eight values live across a loop (4 registers once spilling): the two the loop reads stay in registers
    outside = [a(k) for k in range(6)]
    hot = [a(10), a(11)]
    instrs = [RAInstr(defs=(v,)) for v in outside + hot]
    instrs += [RAInstr(marker="loop_begin"), RAInstr(defs=(hot[0],), uses=tuple(hot)), RAInstr(marker="loop_end")]
    instrs += [RAInstr(uses=(v,)) for v in outside + hot]
    alloc = allocate(instrs, TINY)
    assert all(isinstance(alloc.home[v.id], str) for v in hot)
    assert sum(isinstance(alloc.home[v.id], int) for v in outside) == len(outside) + len(hot) - 4
    assert run_program(instrs, alloc) == run_program(instrs)


def test_spill_slots_are_shared_when_lifetimes_do_not_overlap() -> None:
    instrs = []
    group = 9
    for g in range(2):
        vs = [a(10 * g + k) for k in range(group)]
        instrs += [RAInstr(defs=(v,)) for v in vs]
        instrs += [RAInstr(uses=(v,)) for v in vs[::-1]]
    alloc = allocate(instrs, TINY)
    # 4 registers once scratch is reserved: 5 values spilled at a time, their slots reused by the second group
    assert alloc.frame_size == 8 * (group - 4)
    assert run_program(instrs, alloc) == run_program(instrs)


def test_fixed_registers_and_clobbers() -> None:
    pinned = VReg(7, "a", 8, "a1")
    instrs = [
        RAInstr(defs=(a(1),)),
        RAInstr(defs=(pinned,), uses=(a(1),)),  # e.g. move into the division register
        RAInstr(defs=(a(2),), uses=(pinned,), clobbers=frozenset({"a0"})),  # e.g. a call clobbering a0
        RAInstr(uses=(a(1), a(2))),
    ]
    alloc = allocate(instrs, TINY)
    assert alloc.home[7] == "a1"
    assert alloc.home[1] not in ("a0", "a1")  # live across the clobber and the pinned value
    assert run_program(instrs, alloc) == run_program(instrs)


@pytest.mark.parametrize(
    ("instrs", "fragment"),
    [
        ([RAInstr(marker="loop_end")], "without a matching loop_begin"),
        ([RAInstr(marker="loop_begin")], "without a matching loop_end"),
        ([RAInstr(defs=(VReg(1, "a"),)), RAInstr(uses=(VReg(1, "b"),))], "one class"),
        ([RAInstr(defs=(VReg(1, "c"),))], "has class 'c'"),
        ([RAInstr(defs=(VReg(1, "a", 8, "a0"), VReg(2, "a", 8, "a0")))], "both fixed to a0"),
    ],
)
def test_bad_input_raises(instrs: list[RAInstr], fragment: str) -> None:
    with pytest.raises(RegAllocError, match=fragment):
        allocate(instrs, TINY)


def test_instr_view_is_the_constructors_value() -> None:
    view = instr_view((a(1),), (a(2), a(3)), frozenset({"r0"}), True)
    assert view == RAInstr((a(1),), (a(2), a(3)), frozenset({"r0"}), None, True) and view.marker is None
    with pytest.raises(AttributeError):
        view.copy = False  # type: ignore[misc]


def test_copy_takes_the_source_register() -> None:
    instrs = [RAInstr(defs=(a(1),)), RAInstr(defs=(a(2),)), RAInstr(defs=(a(3),), uses=(a(2),), copy=True),
              RAInstr(uses=(a(1), a(3)))]  # fmt: skip
    alloc = allocate(instrs, TINY)
    assert alloc.home[3] == alloc.home[2] != alloc.home[1]
    assert run_program(instrs, alloc) == run_program(instrs)


def test_scratch_registers_are_allocatable_when_nothing_spills() -> None:
    vs = [a(k) for k in range(7)]  # 4 allocatable + 3 scratch registers
    instrs = [RAInstr(defs=(v,)) for v in vs] + [RAInstr(uses=tuple(vs))]
    alloc = allocate(instrs, TINY)
    assert all(isinstance(alloc.home[v.id], str) for v in vs) and alloc.frame_size == 0
    assert {alloc.home[v.id] for v in vs} == {"a0", "a1", "a2", "a3", "s0", "s1", "s2"}
    assert alloc.callee_saved == ("a2", "a3")
