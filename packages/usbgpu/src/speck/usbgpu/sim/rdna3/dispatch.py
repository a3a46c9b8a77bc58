"""Launching a grid: the command processor's view of a dispatch, initial wave state, scheduling, and statistics.

`dispatch(packet, memory)` starts what the hardware starts after SET_SH_REG + DISPATCH_DIRECT: code at
COMPUTE_PGM_LO/HI, registers from COMPUTE_PGM_RSRC1/2/3 and COMPUTE_USER_DATA_*, workgroups of
COMPUTE_NUM_THREAD_X/Y/Z threads.
`run(code_object, kernel, grid, block, kernargs, memory)` does what a runtime does first: loads the code object,
lays out the kernarg segment and a dispatch packet, and fills the user SGPRs the kernel descriptor asks for.

Waves run in lockstep groups (see wave.py): all waves of up to `max_group_waves` waves start together; a scalar branch
that different waves take differently splits a group; the scheduler always advances the group with the lowest pc and
merges groups that meet at one pc, so structured control flow reconverges; s_barrier parks a group until no group can
run, which is when every wave of its workgroup has arrived or ended.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from speck.usbgpu.errors import EmulationError, ShaderError, ShaderHang, ShaderMemoryFault
from speck.usbgpu.sim.rdna3.codeobject import CodeObject, parse_code_object
from speck.usbgpu.sim.rdna3.decode import decode_at
from speck.usbgpu.sim.rdna3.inst import Inst
from speck.usbgpu.sim.rdna3.memory import FlatMemory, ShaderMemory
from speck.usbgpu.sim.rdna3.operands import APERTURE_SIZE, PRIVATE_APERTURE, SHARED_APERTURE
from speck.usbgpu.sim.rdna3.wave import EXEC, LANES, Mode, Pending, Waves, to_waves

# COMPUTE_DISPATCH_INITIATOR bits (gc_11_0_0_sh_mask.h)
COMPUTE_SHADER_EN, FORCE_START_AT_000 = 1 << 0, 1 << 2
USE_THREAD_DIMENSIONS, CS_W32_EN = 1 << 5, 1 << 15
LDS_GRANULE = 512  # COMPUTE_PGM_RSRC2.LDS_SIZE counts 128-dword blocks on gfx11
MAX_LDS = 64 * 1024


@dataclass(frozen=True)
class DispatchPacket:
    """The compute registers the command processor holds when DISPATCH_DIRECT arrives.

    pgm_lo/pgm_hi: COMPUTE_PGM_LO/HI (the code address >> 8, and its bits 47:40); rsrc1/2/3: COMPUTE_PGM_RSRC1/2/3;
    user_data: COMPUTE_USER_DATA_0..15; num_thread: COMPUTE_NUM_THREAD_X/Y/Z; dim: DISPATCH_DIRECT's dim_x/y/z
    (workgroups, or threads with USE_THREAD_DIMENSIONS); initiator: COMPUTE_DISPATCH_INITIATOR; start:
    COMPUTE_START_X/Y/Z (the first workgroup id); scratch_per_lane: private bytes per work-item (what
    COMPUTE_TMPRING_SIZE reserves); kernel: a name for messages."""

    pgm_lo: int
    pgm_hi: int
    rsrc1: int
    rsrc2: int
    rsrc3: int = 0
    user_data: Sequence[int] = ()
    num_thread: tuple[int, int, int] = (1, 1, 1)
    dim: tuple[int, int, int] = (1, 1, 1)
    initiator: int = COMPUTE_SHADER_EN | CS_W32_EN
    start: tuple[int, int, int] = (0, 0, 0)
    scratch_per_lane: int = 0
    kernel: str = "<kernel>"

    @property
    def code_address(self) -> int:
        return ((self.pgm_hi & 0xFF) << 40) | ((self.pgm_lo & 0xFFFFFFFF) << 8)


@dataclass
class Stats:
    """What a dispatch executed. Counts are per wave (an instruction run by 8 waves counts 8): `by_mnemonic` and
    `by_kind` (salu, valu, trans, smem, vmem, lds, branch, wait, barrier, end, nop) are what a cycle model needs."""

    kernel: str = ""
    workgroups: int = 0
    waves: int = 0
    instructions: int = 0
    by_mnemonic: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_written: int = 0
    lds_bytes: int = 0

    def cycles(self, cost: Mapping[str, float], default: float = 1.0) -> float:
        """A cycle estimate: the sum over instruction kinds (or mnemonics, which win) of count x cost."""
        total = 0.0
        for name, n in self.by_mnemonic.items():
            if name in cost:
                total += n * cost[name]
        for kind, n in self.by_kind.items():
            named = sum(c for m, c in self.by_mnemonic.items() if m in cost and _KIND_OF.get(m) == kind)
            total += (n - named) * cost.get(kind, default)
        return total

    def add(self, other: Stats) -> None:
        self.workgroups += other.workgroups
        self.waves += other.waves
        self.instructions += other.instructions
        self.by_mnemonic.update(other.by_mnemonic)
        self.by_kind.update(other.by_kind)
        self.bytes_read += other.bytes_read
        self.bytes_written += other.bytes_written
        self.lds_bytes += other.lds_bytes


_KIND_OF: dict[str, str] = {}  # mnemonic -> kind, filled as instructions execute


FETCH_BLOCK = 256  # instruction fetch reads code in aligned blocks this size (inside one 4 KiB page)


class Code:
    """A dispatch's instruction fetch: the decoded program by pc (shared by its batches of workgroups) and the code
    blocks read so far. The first fetch of each block reads its word alone (so a fault names that address, as a
    word-by-word fetch would), then the whole block in one read (the same page, so mapped too)."""

    def __init__(self, memory: ShaderMemory) -> None:
        self.memory = memory
        self.program: dict[int, Inst] = {}
        self._blocks: dict[int, bytes] = {}

    def inst(self, pc: int) -> Inst:
        inst = self.program.get(pc)
        if inst is None:
            inst = decode_at(pc, self._read_word)
            self.program[pc] = inst
        return inst

    def _read_word(self, address: int) -> int:
        base = address & ~(FETCH_BLOCK - 1)
        block = self._blocks.get(base)
        if block is None:
            word = self._read(address, 4)
            try:
                block = self.memory.read(base, FETCH_BLOCK)
            except ShaderMemoryFault:  # the mapping ends inside the block: fetch word by word here
                return int.from_bytes(word, "little")
            self._blocks[base] = block
        off = address - base
        if off + 4 > FETCH_BLOCK:  # an unaligned word straddling two blocks
            return int.from_bytes(self._read(address, 4), "little")
        return int.from_bytes(block[off : off + 4], "little")

    def _read(self, address: int, size: int) -> bytes:
        try:
            return self.memory.read(address, size)
        except ShaderMemoryFault as e:
            raise ShaderMemoryFault(
                "(instruction fetch)", address=address, size=4, space="code", region=e.region
            ) from None


class Launch:
    """One batch of workgroups in flight: memory, their LDS and scratch, and the decoded program."""

    def __init__(
        self,
        packet: DispatchPacket,
        memory: ShaderMemory,
        n_wg: int,
        waves: int,
        lds_bytes: int,
        stats: Stats,
        code: Code | None = None,
    ) -> None:
        self.packet, self.memory, self.stats = packet, memory, stats
        self.kernel = packet.kernel
        self.lds_bytes = lds_bytes
        self.lds = np.zeros((n_wg, max(lds_bytes, 4)), dtype=np.uint8)
        self._lds_views: dict[tuple[int, int], np.ndarray] = {}
        self.scratch_per_lane = packet.scratch_per_lane
        self._scratch: np.ndarray | None = None
        self.total_waves = waves
        self.code = Code(memory) if code is None else code
        self.program = self.code.program

    # ---- instruction fetch ----
    def inst(self, pc: int) -> Inst:
        inst = self.program.get(pc)
        return self.code.inst(pc) if inst is None else inst

    # ---- global / flat / scalar memory ----
    def load(self, addresses: np.ndarray, size: int, space: str, lanes: int | None = None) -> np.ndarray:
        """`size` bytes at each address; `lanes`: how many of them the instruction reads (the others repeat an
        active lane's address to keep the result lane-shaped), for Stats.bytes_read."""
        try:
            data = self.memory.gather(addresses, size)
        except ShaderMemoryFault as e:
            raise ShaderMemoryFault("(read)", address=e.address, size=size, space=space, region=e.region) from None
        self.stats.bytes_read += data.size if lanes is None else lanes * size
        return data

    def store(self, addresses: np.ndarray, data: np.ndarray, space: str) -> None:
        try:
            self.memory.scatter(addresses, data)
        except ShaderMemoryFault as e:
            raise ShaderMemoryFault("(write)", address=e.address, size=e.size, space=space, region=e.region) from None
        self.stats.bytes_written += data.size

    def flat_load(self, w: Waves, mask: np.ndarray, addresses: np.ndarray, size: int, space: str) -> np.ndarray:
        if space != "flat":
            return self.load(addresses, size, space)
        routes = self._apertures(w, mask, addresses)
        if routes is None:
            return self.load(addresses, size, space)
        out = np.empty((len(addresses), size), dtype=np.uint8)
        for sel, where, arg in routes:
            if where == "lds":
                out[sel] = self.lds_load(arg, addresses[sel].astype(np.int64) - 0, size)
            elif where == "scratch":
                out[sel] = self.scratch_load(arg, addresses[sel], size)
            else:
                out[sel] = self.load(addresses[sel], size, space)
        return out

    def flat_store(self, w: Waves, mask: np.ndarray, addresses: np.ndarray, data: np.ndarray, space: str) -> None:
        routes = self._apertures(w, mask, addresses) if space == "flat" else None
        if routes is None:
            self.store(addresses, data, space)
            return
        for sel, where, arg in routes:
            if where == "lds":
                self.lds_store(arg, addresses[sel].astype(np.int64), data[sel])
            elif where == "scratch":
                self.scratch_store(arg, addresses[sel], data[sel])
            else:
                self.store(addresses[sel], data[sel], space)

    def _apertures(
        self, w: Waves, mask: np.ndarray, addresses: np.ndarray
    ) -> list[tuple[np.ndarray, str, np.ndarray]] | None:
        """Split flat addresses between LDS (shared aperture), scratch (private aperture) and memory."""
        shared = (addresses >= np.uint64(SHARED_APERTURE)) & (addresses < np.uint64(SHARED_APERTURE + APERTURE_SIZE))
        private = (addresses >= np.uint64(PRIVATE_APERTURE)) & (addresses < np.uint64(PRIVATE_APERTURE + APERTURE_SIZE))
        if not (shared.any() or private.any()):
            return None
        addresses -= np.where(shared, np.uint64(SHARED_APERTURE), np.uint64(0))
        addresses -= np.where(private, np.uint64(PRIVATE_APERTURE), np.uint64(0))
        wgs = np.broadcast_to(w.wg[:, None], mask.shape)[mask]
        rows = np.broadcast_to(w.wave_ids[:, None] * LANES + np.arange(LANES), mask.shape)[mask]
        return [
            (shared, "lds", wgs[shared]),
            (private, "scratch", rows[private]),
            (~(shared | private), "memory", np.zeros(0)),
        ]

    # ---- LDS ----
    def _lds_check(self, addresses: np.ndarray, size: int) -> None:
        bad = (addresses < 0) | (addresses + size > self.lds_bytes)
        if bad.any():
            a = int(addresses[np.argmax(bad)])
            raise ShaderMemoryFault(
                "is outside the workgroup's LDS allocation",
                address=a & 0xFFFFFFFF,
                size=size,
                space="lds",
                region=f"{self.lds_bytes} bytes allocated (COMPUTE_PGM_RSRC2.LDS_SIZE)",
            )

    def _lds_items(self, size: int, stride: int) -> np.ndarray:
        """The LDS of every workgroup as overlapping `size`-byte void items starting every `stride` bytes (see
        FlatMemory's windows): one fancy index moves a whole access per lane."""
        view = self._lds_views.get((size, stride))
        if view is None:
            count = max((self.lds.size - size) // stride + 1, 0)
            view = np.ndarray((count,), np.dtype(f"V{size}"), buffer=self.lds, strides=(stride,))
            self._lds_views[(size, stride)] = view
        return view

    def _lds_at(self, wgs: np.ndarray, addresses: np.ndarray, size: int) -> tuple[np.ndarray, Any]:
        flat = wgs * self.lds.shape[1] + addresses
        if not (flat & 3).any():  # the row length is a multiple of 4 bytes, so dword alignment carries over
            return self._lds_items(size, 4), flat >> 2
        return self._lds_items(size, 1), flat

    def lds_load(self, wgs: np.ndarray, addresses: np.ndarray, size: int) -> Any:
        self._lds_check(addresses, size)
        self.stats.lds_bytes += len(addresses) * size
        items, index = self._lds_at(wgs, addresses, size)
        return items[index].view(np.uint8).reshape(-1, size)

    def lds_store(self, wgs: np.ndarray, addresses: np.ndarray, data: np.ndarray) -> None:
        size = data.shape[1]
        self._lds_check(addresses, size)
        self.stats.lds_bytes += len(addresses) * size
        items, index = self._lds_at(wgs, addresses, size)
        items[index] = np.ascontiguousarray(data).view(f"V{size}").reshape(-1)  # a later lane wins an overlap

    # ---- scratch (private memory, per lane) ----
    def _scratch_index(self, rows: np.ndarray, addresses: np.ndarray, size: int) -> np.ndarray:
        a = addresses.astype(np.int64)
        bad = (a < 0) | (a + size > self.scratch_per_lane)
        if bad.any():
            raise ShaderMemoryFault(
                "is outside the lane's private segment",
                address=int(addresses[np.argmax(bad)]),
                size=size,
                space="scratch",
                region=f"{self.scratch_per_lane} bytes per lane",
            )
        if self._scratch is None:
            self._scratch = np.zeros((self.total_waves * LANES, self.scratch_per_lane), dtype=np.uint8)
        return (rows.astype(np.int64) * self.scratch_per_lane + a)[:, None] + np.arange(size)

    def scratch_load(self, rows: np.ndarray, addresses: np.ndarray, size: int) -> Any:
        idx = self._scratch_index(rows, addresses, size)
        assert self._scratch is not None
        return self._scratch.reshape(-1)[idx]

    def scratch_store(self, rows: np.ndarray, addresses: np.ndarray, data: np.ndarray) -> None:
        idx = self._scratch_index(rows, addresses, data.shape[1])
        assert self._scratch is not None
        self._scratch.reshape(-1)[idx] = data


# ---------------------------------------------------------------- initial state
def _bits(value: int, lo: int, width: int) -> int:
    return (value >> lo) & ((1 << width) - 1)


def _initial_waves(
    launch: Launch, packet: DispatchPacket, wg_ids: np.ndarray, threads: np.ndarray, block: tuple[int, int, int]
) -> Waves:
    """The first state of every wave of the workgroups `wg_ids` ((k, 3) ids; threads[k] = threads launched)."""
    rsrc1, rsrc2 = packet.rsrc1, packet.rsrc2
    nvgpr = (_bits(rsrc1, 0, 6) + 1) * 8
    user = _bits(rsrc2, 1, 5)
    per_wg = -(-int(np.prod(block)) // LANES)
    n = len(wg_ids) * per_wg
    s = np.zeros((128, n), dtype=np.uint32)
    v = np.zeros((nvgpr, n, LANES), dtype=np.uint32)
    data = list(packet.user_data) + [0] * 16
    for k in range(user):
        s[k] = data[k] & 0xFFFFFFFF
    wg_of = np.repeat(np.arange(len(wg_ids)), per_wg)
    ids = wg_ids[wg_of]
    r = user
    for axis, bit in enumerate((7, 8, 9)):
        if rsrc2 >> bit & 1:
            s[r] = ids[:, axis]
            r += 1
    if rsrc2 >> 10 & 1:  # TG_SIZE_EN: workgroup info = waves in the workgroup
        s[r] = per_wg
        r += 1
    if rsrc2 & 1:  # SCRATCH_EN: the private segment wave byte offset (scratch is per lane here: 0)
        s[r] = 0
        r += 1
    wave_in_wg = np.tile(np.arange(per_wg), len(wg_ids))
    tid = wave_in_wg[:, None] * LANES + np.arange(LANES)  # (n, 32) flat thread index in the workgroup
    bx, by, _ = block
    x, y, z = tid % bx, (tid // bx) % by, tid // (bx * by)
    comps = _bits(rsrc2, 11, 2)
    v[0] = x | ((y << 10) if comps >= 1 else 0) | ((z << 20) if comps >= 2 else 0)
    live = tid < threads[wg_of][:, None]
    s[EXEC] = np.packbits(live, axis=1, bitorder="little").view("<u4").reshape(n)
    mode = Mode(
        denorm32=_bits(rsrc1, 16, 2),
        denorm16_64=_bits(rsrc1, 18, 2),
        round_mode=_bits(rsrc1, 12, 4),
        ieee=bool(rsrc1 >> 23 & 1),
        dx10_clamp=bool(rsrc1 >> 21 & 1),
    )
    if mode.round_mode:
        raise EmulationError(f"FLOAT_ROUND_MODE {mode.round_mode:#x}: only round-to-nearest-even is implemented")
    return Waves(launch, s, v, np.zeros(n, dtype=bool), wg_of, np.arange(n), packet.code_address, mode)


# ---------------------------------------------------------------- scheduling
def _compatible(a: Waves, b: Waves) -> bool:
    if a.pc != b.pc or a.mode != b.mode or len(a.pending) != len(b.pending):
        return False
    return all(
        (p.counter, p.vector, p.regs, p.half) == (q.counter, q.vector, q.regs, q.half)
        for p, q in zip(a.pending, b.pending)
    )


def _merge(a: Waves, b: Waves) -> Waves:
    pending = [
        Pending(
            p.counter,
            p.vector,
            p.regs,
            [np.concatenate([x, y]) for x, y in zip(p.values, q.values)],
            None if p.mask is None or q.mask is None else np.concatenate([p.mask, q.mask]),
            p.half,
            p.full and q.full,
        )
        for p, q in zip(a.pending, b.pending)
    ]
    return Waves(
        a.launch,
        np.concatenate([a.s, b.s], axis=1),
        np.concatenate([a.v, b.v], axis=1),
        np.concatenate([a.scc, b.scc]),
        np.concatenate([a.wg, b.wg]),
        np.concatenate([a.wave_ids, b.wave_ids]),
        a.pc,
        a.mode.copy(),
        pending,
        set(a.pending_v),
        set(a.pending_s),
    )


Trace = Callable[[Inst, Waves], None]


class _Scheduler:
    def __init__(self, launch: Launch, budget: int | None, trace: Trace | None = None) -> None:
        self.launch, self.budget, self.trace = launch, budget, trace
        self.runnable: list[Waves] = []
        self.parked: list[Waves] = []
        self.executed = 0
        self.counts: dict[int, int] = {}  # wave-instructions per pc, folded into Stats by run()

    def add(self, w: Waves) -> None:
        for k, other in enumerate(self.runnable):
            if _compatible(other, w):
                self.runnable[k] = _merge(other, w)
                return
        self.runnable.append(w)

    def run(self) -> None:
        try:
            while self.runnable or self.parked:
                if not self.runnable:  # every wave has reached a barrier or ended: release them all
                    parked, self.parked = self.parked, []
                    for w in parked:
                        self.add(w)
                self.runnable.sort(key=lambda g: g.pc)
                w = self.runnable.pop(0)
                self._advance(w)
        finally:
            self._fold_counts()

    def _fold_counts(self) -> None:
        """Wave-instructions per pc (what the loop counts) into Stats.by_mnemonic / by_kind."""
        stats, program = self.launch.stats, self.launch.code.program
        for pc, count in self.counts.items():
            inst = program[pc]
            stats.by_mnemonic[inst.name] += count
            stats.by_kind[inst.kind] += count
            _KIND_OF.setdefault(inst.name, inst.kind)
        self.counts.clear()

    def _advance(self, w: Waves) -> None:
        """Run group w until it ends, parks, or passes the pc of another runnable group (then it yields)."""
        launch, code, counts, budget, trace = self.launch, self.launch.code, self.counts, self.budget, self.trace
        program = code.program
        others = {g.pc for g in self.runnable}
        n = len(w.wg)
        while True:
            pc = w.pc
            if pc in others and any(_compatible(g, w) for g in self.runnable):
                self.add(w)
                return
            inst = program.get(pc)
            if inst is None:
                inst = code.inst(pc)
            counts[pc] = counts.get(pc, 0) + n
            self.executed += n
            if budget is not None and self.executed > budget:
                raise ShaderHang(
                    f"more than {budget} wave-instructions executed (max_instructions)",
                    kernel=launch.kernel,
                    pc=pc,
                    mnemonic=inst.name,
                )
            kind = inst.kind
            try:
                if (w.pending_v or w.pending_s) and kind != "wait":
                    w.check_hazard(inst.vregs, inst.sregs)
                if kind == "branch":
                    if inst.run is not None:
                        inst.run(w)
                    assert inst.target is not None
                    if inst.cond is None:
                        taken = None
                    else:
                        taken = to_waves(np.asarray(inst.cond(w), dtype=bool), n)
                    if taken is None or taken.all():
                        w.pc = inst.target
                    elif not taken.any():
                        w.pc += inst.size
                    else:
                        fall = w.take(np.nonzero(~taken)[0], w.pc + inst.size)
                        w = w.take(np.nonzero(taken)[0], inst.target)
                        n = len(w.wg)
                        self.add(fall)
                    others = {g.pc for g in self.runnable}
                    if others and w.pc > min(others):
                        self.add(w)
                        return
                    continue
                if kind == "end":
                    return
                if kind == "barrier":
                    w.pc += inst.size
                    self.parked.append(w)
                    return
                assert inst.run is not None
                inst.run(w)
                if trace is not None:
                    trace(inst, w)
                w.pc = pc + 4 * len(inst.words)
            except ShaderError as e:
                e.add_context(launch.kernel, w.pc, inst.name)
                raise
            except IndexError as e:
                raise ShaderError(
                    f"register index out of the allocation ({e}); COMPUTE_PGM_RSRC1 allocates {w.v.shape[0]} VGPRs",
                    kernel=launch.kernel,
                    pc=w.pc,
                    mnemonic=inst.name,
                ) from e


# ---------------------------------------------------------------- entry points
def dispatch(
    packet: DispatchPacket,
    memory: ShaderMemory,
    *,
    max_instructions: int | None = None,
    max_group_waves: int = 1024,
    trace: Trace | None = None,
) -> Stats:
    """Run a dispatch the way the command processor launches it (see DispatchPacket); returns its Stats.

    Errors (EmulationError, ShaderMemoryFault, ShaderHazardError, ShaderError) stop the dispatch, as a fault stops
    the hardware queue; memory written before the fault stays written."""
    if not packet.initiator & COMPUTE_SHADER_EN:
        raise ShaderError("COMPUTE_DISPATCH_INITIATOR.COMPUTE_SHADER_EN is clear", kernel=packet.kernel)
    if not packet.initiator & CS_W32_EN:
        raise EmulationError("wave64 dispatches (CS_W32_EN clear) are not implemented", kernel=packet.kernel)
    block = tuple(max(1, int(t)) for t in packet.num_thread)
    assert len(block) == 3
    block3: tuple[int, int, int] = (block[0], block[1], block[2])
    if packet.initiator & USE_THREAD_DIMENSIONS:
        if any(int(d) % b for d, b in zip(packet.dim, block3)):
            raise EmulationError(
                f"grid {packet.dim} (threads) is not a multiple of the workgroup {block3}: partial workgroups are "
                "not implemented",
                kernel=packet.kernel,
            )
        groups = [int(d) // b for d, b in zip(packet.dim, block3)]
    else:
        groups = [int(d) for d in packet.dim]
    start = (0, 0, 0) if packet.initiator & FORCE_START_AT_000 else packet.start
    gx, gy, gz = np.meshgrid(*[np.arange(g) for g in groups], indexing="ij")
    ids = np.stack([gx.T.reshape(-1), gy.T.reshape(-1), gz.T.reshape(-1)], axis=1)  # x fastest
    dims = np.array(block3)
    threads = np.full(len(ids), int(dims.prod()))
    lds_bytes = _bits(packet.rsrc2, 15, 9) * LDS_GRANULE
    if lds_bytes > MAX_LDS:
        raise ShaderError(f"LDS_SIZE asks for {lds_bytes} bytes; a workgroup has at most {MAX_LDS}")
    stats = Stats(kernel=packet.kernel)
    per_wg = -(-int(dims.prod()) // LANES)
    chunk = max(1, max_group_waves // per_wg)
    code = Code(memory)
    with np.errstate(all="ignore"):
        for first in range(0, len(ids), chunk):
            sel = slice(first, first + chunk)
            k = len(ids[sel])
            launch = Launch(packet, memory, k, k * per_wg, lds_bytes, stats, code)
            waves = _initial_waves(launch, packet, ids[sel] + np.array(start), threads[sel], block3)
            stats.workgroups += k
            stats.waves += waves.n
            budget = None if max_instructions is None else max_instructions - stats.instructions
            sched = _Scheduler(launch, budget, trace)
            sched.runnable.append(waves)
            sched.run()
            stats.instructions += sched.executed
    return stats


# ---------------------------------------------------------------- run(): what a runtime does before dispatching
OVERLAY_BASE = 0x7FF0_0000_0000  # where run() puts the code object, kernargs and the dispatch packet
DYNAMIC_STACK = 1024  # private bytes per lane run() adds for kernels with dynamic allocas (as a runtime would)


class _Overlay:
    """The caller's memory plus a private FlatMemory above OVERLAY_BASE (code, kernarg segment, AQL packet)."""

    def __init__(self, base: ShaderMemory, private: FlatMemory) -> None:
        self.base, self.private = base, private

    def _mine(self, addresses: np.ndarray) -> np.ndarray:
        return np.asarray(addresses, dtype=np.uint64) >= np.uint64(OVERLAY_BASE)

    def gather(self, addresses: np.ndarray, size: int) -> np.ndarray:
        mine = self._mine(addresses)
        if not mine.any():
            return self.base.gather(addresses, size)
        if mine.all():
            return self.private.gather(addresses, size)
        out = np.empty((len(addresses), size), dtype=np.uint8)
        out[mine] = self.private.gather(addresses[mine], size)
        out[~mine] = self.base.gather(addresses[~mine], size)
        return out

    def scatter(self, addresses: np.ndarray, data: np.ndarray) -> None:
        mine = self._mine(addresses)
        if mine.any():
            self.private.scatter(addresses[mine], data[mine])
        if not mine.all():
            self.base.scatter(addresses[~mine], data[~mine])

    def read(self, address: int, size: int) -> bytes:
        return self.private.read(address, size) if address >= OVERLAY_BASE else self.base.read(address, size)

    def write(self, address: int, data: bytes) -> None:
        (self.private if address >= OVERLAY_BASE else self.base).write(address, data)


@lru_cache(maxsize=64)
def _parsed(code_object: bytes) -> CodeObject:
    return parse_code_object(code_object)


def user_sgprs(flags: Mapping[str, bool], *, dispatch_ptr: int, kernarg_ptr: int, private_size: int) -> list[int]:
    """The user SGPR values, in the order LLVM's AMDGPUUsage gives ("Initial Kernel Execution State")."""
    out: list[int] = []
    if flags["private_segment_buffer"]:
        out += [0, 0, 0, 0]  # a buffer descriptor for scratch: unused on gfx11 (architected flat scratch)
    if flags["dispatch_ptr"]:
        out += [dispatch_ptr & 0xFFFFFFFF, dispatch_ptr >> 32]
    if flags["queue_ptr"]:
        out += [0, 0]  # no AQL queue behind run(): a kernel that reads through it faults at address 0
    if flags["kernarg_segment_ptr"]:
        out += [kernarg_ptr & 0xFFFFFFFF, kernarg_ptr >> 32]
    if flags["dispatch_id"]:
        out += [0, 0]
    if flags["flat_scratch_init"]:
        out += [0, 0]
    if flags["private_segment_size"]:
        out += [private_size]
    return out


def aql_packet(
    grid: tuple[int, int, int], block: tuple[int, int, int], kernarg: int, kd: int, private: int, group: int
) -> bytes:
    """An hsa_kernel_dispatch_packet_t (64 bytes) for kernels that read their dispatch pointer."""
    dims = 3 if grid[2] > 1 or block[2] > 1 else 2 if grid[1] > 1 or block[1] > 1 else 1
    threads = [g * b for g, b in zip(grid, block)]
    return struct.pack("<HHHHHHIIIIIQQQQ", 2, dims, *block, 0, *threads, private, group, kd, kernarg, 0, 0)


def run(
    code_object: bytes,
    kernel: str,
    grid: Sequence[int],
    block: Sequence[int],
    kernargs: bytes,
    memory: ShaderMemory,
    *,
    max_instructions: int | None = None,
    trace: Trace | None = None,
) -> Stats:
    """Run `kernel` of an HSA code object over `grid` workgroups (x, y, z) of `block` threads each.

    The code, the kernarg segment (kernargs, zero-padded to the descriptor's kernarg_size) and a dispatch packet live
    in a private region above OVERLAY_BASE; every other address goes to `memory`."""
    co = _parsed(bytes(code_object))
    entry, kd = co.kernel(kernel)
    if not kd.wave32:
        raise EmulationError(f"{kernel} is compiled for wave64; only wave32 is implemented", kernel=kernel)
    gl, bl = [*(int(x) for x in grid), 1, 1, 1], [*(int(x) for x in block), 1, 1, 1]
    g, b = (gl[0], gl[1], gl[2]), (bl[0], bl[1], bl[2])
    private = FlatMemory(base=OVERLAY_BASE, guard=0x1000)
    image_base = private.alloc(co.image, "code object", align=0x1000)
    kernarg_ptr = private.alloc(bytes(kernargs).ljust(max(kd.kernarg_size, len(kernargs), 1), b"\0"), "kernargs")
    kd_addr = image_base + co.symbols[f"{kernel}.kd"]
    packet_ptr = private.alloc(
        aql_packet(g, b, kernarg_ptr, kd_addr, kd.private_segment_fixed_size, kd.group_segment_fixed_size), "packet"
    )
    code = image_base + entry
    if code & 0xFF:
        raise EmulationError(f"{kernel}'s code at {code:#x} is not 256-byte aligned (COMPUTE_PGM_LO drops 8 bits)")
    data = user_sgprs(
        kd.user_sgpr_flags, dispatch_ptr=packet_ptr, kernarg_ptr=kernarg_ptr, private_size=kd.private_segment_fixed_size
    )
    # the runtime, not the compiler, sizes LDS: COMPUTE_PGM_RSRC2.LDS_SIZE from the group segment size
    lds_blocks = -(-kd.group_segment_fixed_size // LDS_GRANULE)
    packet = DispatchPacket(
        pgm_lo=(code >> 8) & 0xFFFFFFFF,
        pgm_hi=(code >> 40) & 0xFF,
        rsrc1=kd.rsrc1,
        rsrc2=(kd.rsrc2 & ~(0x1FF << 15)) | (lds_blocks << 15),
        rsrc3=kd.rsrc3,
        user_data=data,
        num_thread=(b[0], b[1], b[2]),
        dim=(g[0], g[1], g[2]),
        scratch_per_lane=kd.private_segment_fixed_size + (DYNAMIC_STACK if kd.uses_dynamic_stack else 0),
        kernel=kernel,
    )
    return dispatch(packet, _Overlay(memory, private), max_instructions=max_instructions, trace=trace)
