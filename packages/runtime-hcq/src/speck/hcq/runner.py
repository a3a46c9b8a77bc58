"""The runner: the one way kernels, copies and host work reach the devices.

A `Plan` is an ordered list of calls over numbered buffer slots, with everything that does not change between runs
resolved when it is made: `Exec` (a loaded program, the slots of its buffers in argument order, its variables and
launch size), `Copy` (bytes from one slot to another) and `Host` (a Python function over slots: an MPI collective,
codegen's reference interpreter standing in for a kernel). `run(plan, bufs, var_vals)` binds the slots to Buffers
and the variables to values and runs the calls:

- consecutive calls on a device whose `graph` class takes them run as one device graph (a batch: the CPU's native
  interpreter today; an indirect buffer and one doorbell on a GPU). A graph is built once per plan, from its
  `batch_from`-th run on; later runs rewrite only the argument-table words of slots bound to other buffers;
- a copy between devices goes to the destination's copy engine and overlaps with what follows; whatever reads or
  overwrites its memory waits for it; kernels of a plan spanning several host devices are queued on their engines
  side by side;
- the counters (speck.hcq.counters.GlobalCounters) are updated here and nowhere else; under DEBUG>=2 every call is
  timed and printed, under PROFILE recorded as an `Event`;
- `run` returns when every call has completed (wait=False leaves them to the engines: direct program calls).

A device joins by what it declares, never by its name: `graph` (a class with `supports(prog, nargs)`, `add_exec`,
`add_copy`, `arg_index`, `args` - the argument table, a mutable sequence of 64-bit words - `prepare`, `replay` and
`run`; `device_copies` True when it copies within a device whose memory the host cannot see), `host_visible`,
`runs_kernels`, `engines`, `wait_kernels()` (a timed launch waits with it), and optionally `transfer(dest, src)` for
a device that moves data itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from speck.codegen.program import reads_only_where_it_stores
from speck.hcq import graph as _graph
from speck.hcq.buffer import Buffer
from speck.hcq.counters import COUNTS, GlobalCounters
from speck.hcq.errors import HCQError
from speck.hcq.interfaces import ProgramLike
from speck.hcq.queue import EXEC
from speck.hcq.settings import NATIVE_RUNNER, PROFILE
from speck.hcq.signal import Signal
from speck.uop import DEBUG, UOp
from speck.uop.symbolic import sym_infer

try:  # the short route in C: optional (built at install time when a C compiler is there)
    import speck.hcq._native_runner as _native_runner
except ImportError:
    _native_runner = None  # type: ignore[assignment]


# ---------------- calls ----------------
class Exec(NamedTuple):
    """A kernel: `program` on the buffers in slots `args` (its argument order). `vals`: its variables as (name,
    value at the plan's making), in the program's order; a run's var_vals override them by name. `global_size`: the
    launch size (None: the program's, resolved with the variables when symbolic). `ops`/`mem`: estimates per run
    (ints, or UOps of the variables). `writes`: positions in `args` the kernel stores to."""

    program: ProgramLike
    args: tuple[int, ...]
    vals: tuple[tuple[str, int], ...] = ()
    global_size: tuple[int, ...] | None = None
    threads: int | None = None
    ops: Any = 0
    mem: Any = 0
    writes: frozenset[int] = frozenset()


class Copy(NamedTuple):
    """`nbytes` bytes from slot `src` (from byte `offset` on) into slot `dst`."""

    dst: int
    src: int
    offset: int
    nbytes: int


class Host(NamedTuple):
    """`fn(buffers, var_vals)` on the calling thread, over the buffers in slots `args`, once every earlier call has
    completed. `kernel`: it stands in for a kernel (counted as one)."""

    fn: Callable[[list[Buffer], Mapping[str, int]], None]
    args: tuple[int, ...]
    name: str = "host"
    kernel: bool = False


Call = Exec | Copy | Host


def reads_writes(call: Call) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(slots read, slots written) by a call (host work reads and writes all of its slots)."""
    if isinstance(call, Exec):
        w, args = call.writes, call.args
        return tuple(s for i, s in enumerate(args) if i not in w), tuple(s for i, s in enumerate(args) if i in w)
    if isinstance(call, Copy):
        return (call.src,), (call.dst,)
    return call.args, call.args


# ---------------- profiling ----------------
@dataclass(frozen=True)
class Event:
    """One executed call under PROFILE: `kind` is "kernel", "copy" or "graph"; times are perf_counter_ns."""

    kind: str
    name: str
    device: str
    queue: str
    start_ns: int
    end_ns: int
    ops: int = 0
    nbytes: int = 0
    kernels: int = 0  # for a graph: how many kernels it ran


EVENTS: list[Event] = []
_OFF = ("", "0", 0)  # PROFILE values that record nothing


def tracing() -> bool:
    """Whether the PROFILE setting asks for recording (any value but "" and "0")."""
    v = PROFILE.value
    return v not in _OFF


def record(kind: str, name: str, device: str, start_ns: int, end_ns: int, ops: int = 0, nbytes: int = 0,
           kernels: int = 0, queue: str | None = None) -> None:  # fmt: skip
    EVENTS.append(Event(kind, name, device, queue or ("copy" if kind == "copy" else "compute"), start_ns, end_ns,
                        ops, nbytes, kernels))  # fmt: skip


def _debug_line(device: str, name: str, nbufs: int, t: float, ops: int, mem: int) -> None:
    gflops = ops / t * 1e-9 if t > 0 else 0.0
    gbs = mem / t * 1e-9 if t > 0 else 0.0
    print(
        f"*** {device:7s} {GlobalCounters.kernel_count:4d} {name:36s} arg {nbufs:3d} "
        f"mem {GlobalCounters.mem_used_bytes() / 1e9:7.3f} GB "
        f"tm {t * 1e6:10.2f}us/{GlobalCounters.time_sum_s * 1e3:9.2f}ms "
        f"({gflops:9.2f} GFLOPS {gbs:7.2f} GB/s)"
    )


def count_run(kernels: int, copies: int, ops: int, mem: int, t: float = 0.0) -> None:
    """The one place GlobalCounters grow: what a run (or one call of it) ran."""
    c = COUNTS
    c.kernel_count += kernels
    c.global_ops += ops
    c.global_mem += mem
    if copies:
        c.copy_count += copies
    if t:
        c.time_sum_s += t


# ---------------- copy folding ----------------
def _renamed(call: Call, old: int, new: int) -> Call:
    """call with slot `old` replaced by `new` wherever it appears."""
    if isinstance(call, Copy):
        return call._replace(dst=new if call.dst == old else call.dst, src=new if call.src == old else call.src)
    return call._replace(args=tuple(new if a == old else a for a in call.args))


def _in_place_ok(call: Exec, store_pos: int, read_pos: int) -> bool:
    """Whether kernel `call` stays exact when the buffer at argument `read_pos` is its output (`store_pos`) too: by
    its AST (a program loaded without one never is)."""
    spec = getattr(call.program, "spec", None)
    ast, params = getattr(spec, "ast", None), getattr(spec, "buffers", None)
    if not isinstance(ast, UOp) or not params or len(params) != len(call.args):
        return False
    slots = [int(b.slot) for b in params]  # (argument position -> the AST's PARAM number)
    return reads_only_where_it_stores(ast, slots[store_pos], slots[read_pos])


def _fold_one(calls: list[Call], j: int, nbytes: Sequence[int], keep: Collection[int], where: Sequence[Any]) -> bool:
    """Fold copy calls[j] into the kernel that computed its source, in place (see fold_copies); False when it
    can't be."""
    c = calls[j]
    assert isinstance(c, Copy)
    t, d = c.src, c.dst
    if c.offset or t == d or t in keep or not (c.nbytes == nbytes[t] == nbytes[d]) or where[t] != where[d]:
        return False
    rws = [reads_writes(x) for x in calls]
    touching = [i for i, (r, w) in enumerate(rws) if t in r or t in w]
    writers = [i for i in touching if t in rws[i][1]]
    if len(writers) != 1 or writers[0] != touching[0] or touching[-1] != j:
        return False  # t is written once, first, and nothing after the copy touches it
    k = writers[0]
    kc = calls[k]
    if not isinstance(kc, Exec) or kc.args.count(t) != 1 or len(kc.writes) != 1:
        return False
    if any(d in rws[i][0] or d in rws[i][1] for i in range(k + 1, j)):
        return False  # d is read or written between the kernel and the copy: it must keep its old value until then
    wpos = kc.args.index(t)
    if any(a == d and not _in_place_ok(kc, wpos, p) for p, a in enumerate(kc.args)):
        return False  # the kernel reads d's old value elsewhere than where it stores
    for i in range(k, j):
        calls[i] = _renamed(calls[i], t, d)
    del calls[j]
    return True


def fold_copies(
    calls: Sequence[Call], nbytes: Sequence[int], where: Sequence[Any], keep: Collection[int] = ()
) -> list[Call]:
    """The calls with whole-buffer copies out of temporaries folded away: `Copy(d <- t)` where one kernel computed
    t, whose only other readers run between that kernel and the copy, becomes the kernel storing into d directly
    (its readers read d), when nothing between them reads or writes d and the kernel reads d, if at all, only at
    the element it stores over (an update in place, `m = b*m + g`: speck.codegen.program.reads_only_where_it_stores).
    A captured training step's optimizer updates (new values computed into temporaries, then copied over the
    parameters and moments) then write their targets directly: one pass over memory fewer per state tensor.
    `nbytes[s]`: slot s's size in bytes, `where[s]` its device (a copy between devices stays); slots in `keep`
    (whose contents are observed after the calls: inputs, returned values) are never folded away. t's slot is left
    unused."""
    out = list(calls)
    j = 0
    while j < len(out):
        c = out[j]
        if isinstance(c, Copy) and _fold_one(out, j, nbytes, keep, where):
            continue  # (the copy is gone: calls[j] is the next call)
        j += 1
    return out


# ---------------- plans ----------------
class Plan:
    """Calls over `nslots` buffer slots (see the module docstring). `replayed`: a captured step (TinyJit), replayed
    many times on buffers that outlive its runs, rather than an eager schedule run on new buffers each time. A
    replayed plan batches from its first run (an eager one from its second: an op run once builds no graph), its
    graphs take kernels that split across a device's workers too (the graph tunes one split for the whole batch;
    an eager op's big kernel launches on its own and picks its own split), and its graphs keep the Buffers they were
    bound to, rebinding on a change of identity (an eager plan's keep addresses: its buffers die with their
    tensors). `batch_from` (the run from which calls are batched) may be changed between runs."""

    def __init__(self, calls: Sequence[Call], nslots: int, name: str = "plan", replayed: bool = False) -> None:
        self.calls = tuple(calls)
        self.nslots, self.name, self.replayed = nslots, name, replayed
        self.batch_from = 0 if replayed else 1
        self.runs = 0
        # what a run counts when nothing in it depends on the variables (None: count call by call)
        self.static_counts: tuple[int, int, int, int] | None = None
        self.symbolic = any(type(c) is Exec and (c.vals or _symbolic(c)) for c in self.calls)
        self.steps: list[Call | Batch] | None = None  # the calls with runs of them batched (built on a batching run)
        self.single: Batch | None = None  # the plan is one batch: run()'s short route
        self.lock = threading.Lock()  # one thread rewrites a batch's argument table at a time

    @property
    def batches(self) -> list[Batch]:
        return [s for s in self.steps or () if type(s) is Batch]

    def __repr__(self) -> str:
        return f"<Plan {self.name}: {len(self.calls)} calls over {self.nslots} buffers>"


def _symbolic(c: Exec) -> bool:
    gs = c.global_size if c.global_size is not None else c.program.global_size
    return (
        isinstance(c.ops, UOp) or isinstance(c.mem, UOp) or (gs is not None and not all(isinstance(g, int) for g in gs))
    )


class Batch:
    """Consecutive calls of a plan on one device, run as one graph of the device's graph class. The argument table
    holds buffer addresses; `fills[i]` lists (table index, byte offset) of the graph's i-th slot, `slots`. `hold`:
    keep the bound Buffers and compare by identity (a replayed plan's), else keep addresses."""

    __slots__ = ("calls", "device", "every", "failed", "fills", "graph", "hold", "kernels", "last", "last_bufs",
                 "mem", "moves", "ops", "others", "slots", "table", "transfers")  # fmt: skip

    def __init__(self, device: Any, calls: list[Call], hold: bool = False) -> None:
        self.device, self.calls, self.hold = device, calls, hold
        self.every = False  # slots are 0..n-1 of an n-slot plan: a run's buffer list is the batch's as it is
        self.last_bufs: list[Any] = []
        self.moves = -1  # Buffer.moves when last_bufs were bound
        self.graph: Any = None
        self.failed = False  # building raised: its calls run one by one
        self.slots: tuple[int, ...] = ()
        self.fills: list[list[tuple[int, int]]] = []
        self.last: list[int] = []  # the slots' addresses the table holds
        self.table: Any = None
        self.kernels, self.ops, self.mem = sum(1 for c in calls if type(c) is Exec), 0, 0
        # the other devices whose kernels or memory the batch's calls use (a graph class that joins_devices): their
        # engines must be idle before the graph, submitted to `device`'s engine, runs
        self.others: tuple[Any, ...] = ()
        self.transfers = 0  # copies between devices (counted as kernels and copies, as when they run alone)

    def build(self, bufs: Sequence[Buffer]) -> None:
        """Make the graph on the buffers bound now (raises what the device raises)."""
        g = self.device.graph(self.device, name=f"{len(self.calls)} calls")
        where: dict[int, int] = {}
        fills: list[list[tuple[int, int]]] = []

        def fill(cmd: int, j: int, slot: int, off: int) -> None:
            if slot not in where:
                where[slot] = len(fills)
                fills.append([])
            fills[where[slot]].append((g.arg_index(cmd, j), off))

        for c in self.calls:
            if type(c) is Exec:
                hb = [bufs[s] for s in c.args]
                cmd = g.add_exec(c.program, hb, _launch_size(c, ()), tuple(v for _, v in c.vals), c.threads)
                for j, s in enumerate(c.args):
                    fill(cmd, j, s, 0)
                self.ops += c.ops
                self.mem += c.mem
            else:
                assert type(c) is Copy
                cmd = g.add_copy(bufs[c.dst].ptr, bufs[c.src].ptr + c.offset, c.nbytes)
                fill(cmd, 0, c.dst, 0)
                fill(cmd, 1, c.src, c.offset)
        g.prepare()  # (an interpreter that can't be built fails here: the calls then run one by one)
        # (a kernel's buffers are on its program's device: the devices of the slots are every device the batch uses)
        devs = {bufs[s].dev for s in where}
        self.transfers = sum(1 for c in self.calls if type(c) is Copy and bufs[c.dst].dev is not bufs[c.src].dev)
        self.others = tuple(sorted((d for d in devs if d is not self.device), key=lambda d: d.name))
        # (in slot order: a plan whose calls use each of its slots has slots 0..n-1, and `every` binds its buffer list
        # as it is)
        self.slots = tuple(sorted(where))
        self.fills = [fills[where[s]] for s in self.slots]
        self.every = self.slots == tuple(range(len(bufs)))
        self.last = [bufs[s].ptr for s in self.slots]
        self.last_bufs = [bufs[s] for s in self.slots] if self.hold else []
        self.moves = Buffer.moves
        self.table, self.graph = g.args, g

    def bind(self, bufs: Sequence[Buffer]) -> None:
        """Point the argument table at `bufs` (only the words of slots whose address changed)."""
        if self.hold:  # the same Buffers (compared by identity) hold the same addresses unless memory moved since
            held = bufs if self.every else [bufs[s] for s in self.slots]
            if held == self.last_bufs and self.moves == Buffer.moves:
                return
            self.last_bufs, self.moves = list(held), Buffer.moves
        # (.ptr gives a buffer without memory its memory; a whole buffer whose address is known is read without
        # the property's frame: the test is ptr's own)
        cur = []
        for b in bufs if self.every else map(bufs.__getitem__, self.slots):
            cur.append(b._addr if b._base is None and (o := b._opaque) is not None and o is b._addr_of else b.ptr)
        if cur != self.last:
            self.point(cur)

    def point(self, cur: list[int]) -> None:
        """Write the slots' addresses `cur` into the argument table where they differ from the last ones."""
        table = self.table
        for p, old, where in zip(cur, self.last, self.fills):
            if p != old:
                for k, off in where:
                    table[k] = p + off
        self.last = cur


# ---------------- running ----------------
def run(plan: Plan, bufs: Sequence[Buffer], var_vals: Mapping[str, int] | None = None, wait: bool = True,
        timing: bool = False, count: bool = True) -> list[float] | None:  # fmt: skip
    """Run `plan` with its slots bound to `bufs` and its variables to `var_vals` (else the values it was made with).
    Returns when every call has completed (`wait=False`: once every call is submitted); with `timing`, the seconds
    each call took. `count`: add what ran to GlobalCounters (a program called directly is not counted)."""
    if (native := _native) is not None and native(plan, bufs, var_vals, wait, timing, count):
        return None  # (the short route below, taken in one native call)
    b = plan.single
    # (device._profile: the device's profile property, read without its Python frame)
    if b is not None and not var_vals and wait and not timing and count and DEBUG.value < 2 \
            and not b.device._profile and PROFILE.value in _OFF:  # fmt: skip
        # the short route: one batch, nothing to time
        if plan.lock.acquire(False):  # (positional: a keyword argument costs ~90 ns more)
            try:
                if b.every and not b.hold:  # (bind without its frame when the table holds these addresses already)
                    cur = []
                    for x in bufs:  # (a loop, not a comprehension: in 3.11 that is a function call)
                        cur.append(x._addr if x._base is None and (o := x._opaque) is not None and o is x._addr_of
                                   else x.ptr)  # fmt: skip
                    if cur != b.last:
                        b.point(cur)
                else:
                    b.bind(bufs)
                b.graph.replay()
            finally:
                plan.lock.release()
            count_run(b.kernels, 0, b.ops, b.mem)
            return None
    return _run(plan, bufs, var_vals or {}, wait, timing, count)


# the short route in C (speck.hcq._native_runner, built at install time when a C compiler is there): run_short(plan,
# bufs, var_vals, wait, timing, count) takes the route above exactly when it would be taken, with the same effects
# (tests/hcq/test_native_runner.py runs both), and returns False, having done nothing, otherwise. It reads
# NATIVE_RUNNER at every call (0: this module's route). None: not built.
_native: Callable[[Plan, Sequence[Buffer], Mapping[str, int] | None, bool, bool, bool], bool] | None = None


def _setup_native() -> None:
    global _native
    if _native_runner is not None:
        _native_runner.setup(Buffer, Batch, Signal, COUNTS, _graph.CPUGraph, _graph, DEBUG, PROFILE, NATIVE_RUNNER,
                             _OFF, 2)  # fmt: skip
        _native = _native_runner.run_short


def _run(plan: Plan, bufs: Sequence[Buffer], var_vals: Mapping[str, int], wait: bool, timing: bool,
         count: bool) -> list[float] | None:  # fmt: skip
    # (timed: every call on its own, timed, printed under DEBUG>=2 and recorded under PROFILE)
    timed = timing or DEBUG.value >= 2 or tracing() or any(c.program.device.profile for c in plan.calls
                                                             if type(c) is Exec)  # fmt: skip
    plan.runs += 1
    steps: Sequence[Call | Batch] = plan.calls
    if wait and plan.runs > plan.batch_from:
        if plan.steps is None:
            with plan.lock:  # (one thread builds the graphs)
                if plan.steps is None:
                    _batch(plan, bufs, var_vals)
        if not timed:  # (timed runs go call by call)
            assert plan.steps is not None
            steps = plan.steps
    times: list[float] | None = [] if timing else None
    run = _Run(plan, bufs, var_vals, timed, times, count)
    try:
        for s in steps:
            if type(s) is Batch:
                run.batch(s)
            elif type(s) is Exec:
                run.exec(s)
            elif type(s) is Copy:
                run.copy(s)
            else:
                run.host(s)  # type: ignore[arg-type]
    except BaseException:
        run.finish(wait=True, raise_errors=False)
        raise
    run.finish(wait=wait, raise_errors=True)
    return times


def _launch_size(c: Exec, vals: Sequence[int]) -> tuple[int, ...]:
    if c.global_size is not None:
        return c.global_size
    prog = c.program
    if prog._symbolic_size:
        return prog.launch_dims(vals)
    return tuple(prog.global_size) if prog.global_size is not None else (1, 1, 1)


def _values(c: Exec, var_vals: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(var_vals.get(k, v) for k, v in c.vals) if var_vals else tuple(v for _, v in c.vals)


def _estimate(x: Any, c: Exec, var_vals: Mapping[str, int]) -> int:
    if isinstance(x, UOp):
        return int(sym_infer(x, {**dict(c.vals), **var_vals}))
    return int(x)


class _Run:
    """One run's state: copies in flight (destination slot -> (the copy engine's timeline, value, the memory written
    as (root Buffer, first byte, end byte))) and the devices whose kernels it queued without waiting."""

    def __init__(self, plan: Plan, bufs: Sequence[Buffer], var_vals: Mapping[str, int], timed: bool,
                 times: list[float] | None, count: bool) -> None:  # fmt: skip
        self.plan, self.bufs, self.var_vals, self.timed, self.times = plan, bufs, var_vals, timed, times
        self.counted = count
        self.trace = tracing()
        # (the copy engine's timeline, value, the memory written, the memory read: each as (root Buffer, first byte,
        # end byte))
        self.inflight: dict[int, tuple[Any, int, Any, int, int, Any, int, int]] = {}
        self.queued: set[Any] | None = None if timed else _side_by_side(plan, bufs)

    # -- kernels --------------------------------------------------------------------------------------------------
    def exec(self, c: Exec) -> None:
        prog, bufs = c.program, self.bufs
        hb = [bufs[s] for s in c.args]
        vals = _values(c, self.var_vals)
        gs = _launch_size(c, vals)
        prog.check_args(hb, vals)
        dev = prog.device
        threads = c.threads if c.threads is not None else dev.choose_threads(prog, hb)
        cmd = (EXEC, prog, prog.raw_args(hb, vals), gs, threads)
        ops, mem = _estimate(c.ops, c, self.var_vals), _estimate(c.mem, c, self.var_vals)
        queued = self.queued
        if queued is not None and dev.runs_kernels and dev.host_visible:
            queued.add(dev)
            q = dev.hw_queue()
            for sig, value in self._waits(c.args, _written(c)):
                q.wait(sig, value)
            q.cmds.append(cmd)
            q.submit(dev, background=True)
            self._count(1, 0, ops, mem, 0.0)
            return
        if queued:  # a kernel run here reads what the queued kernels of its device write
            self._wait_queued()
        if self.inflight:
            self._wait_copies(c.args, _written(c))
        eng = dev.engines["compute"]
        if not self.timed:
            eng.submit([cmd])  # (an idle engine runs it on this thread; finish() waits for a busy one)
            self._count(1, 0, ops, mem, 0.0)
            return
        t0, p0 = time.perf_counter(), time.perf_counter_ns()
        eng.submit([cmd])
        if eng.timeline.mem[0] < eng.submitted:
            eng.timeline.wait(eng.submitted)
        if eng.error is not None:
            dev.wait_idle()  # raises the latched error
        dev.wait_kernels()  # (a GPU's launch returns when queued: the time is until the kernel completed)
        t = time.perf_counter() - t0
        self._count(1, 0, ops, mem, t)
        if self.trace:
            record("kernel", prog.name, dev.name, p0, time.perf_counter_ns(), ops, mem)
        if DEBUG.value >= 2:
            _debug_line(dev.name, prog.name, len(hb), t, ops, mem)

    def batch(self, b: Batch) -> None:
        if b.failed:
            for c in b.calls:
                self.exec(c) if type(c) is Exec else self.copy(c)  # type: ignore[arg-type]
            return
        if self.queued:
            self._wait_queued()
        if b.others:  # a graph joining devices: all their earlier work first (its engine orders only its device's)
            if self.inflight:
                self._wait_copies()
            for d in b.others:
                d.synchronize_if_busy()
        elif self.inflight:  # copies between devices still writing or reading this device's memory
            self._wait_copies([s for s, w in self.inflight.items() if w[2].dev is b.device or w[5].dev is b.device])
        with self.plan.lock:
            b.bind(self.bufs)
            b.graph.replay()
        if self.counted:
            count_run(b.kernels + b.transfers, b.transfers, b.ops, b.mem)

    # -- copies ---------------------------------------------------------------------------------------------------
    def copy(self, c: Copy) -> None:
        db, sb = self.bufs[c.dst], self.bufs[c.src]
        t0, p0 = time.perf_counter(), time.perf_counter_ns()
        cross = sb.dev is not db.dev
        if self.inflight:  # (a copy between devices waits for copies into its source on the copy engine)
            self._wait_copies((c.dst,) if cross else (c.dst, c.src), (c.dst,))
        if cross and not self.timed and self._async_copy(c, db, sb):
            self._count(1, 1, 0, 0, 0.0)
            if self.trace:  # (the submission; the copy itself runs on the copy engine)
                record("copy", f"copy {c.nbytes}B", db.device, p0, time.perf_counter_ns(), nbytes=c.nbytes)
            return
        if self.queued:
            self._wait_queued()
        if db.dev.file_backed:  # (a file's buffer is mapped for reading until something writes it)
            db.make_writable()
        src = sb if c.offset == 0 and sb.nbytes == c.nbytes else sb.view(c.nbytes, _BYTE, c.offset)
        transfer = getattr(db.dev, "transfer", None) or getattr(sb.dev, "transfer", None)
        if transfer is not None:  # a device that moves data itself (through its own copy queue)
            transfer(db, src)
        else:
            db.copy_from(src)
        t = time.perf_counter() - t0
        if cross:
            self._count(1, 1, 0, 0, t if self.timed else 0.0)
        elif self.times is not None:
            self.times.append(t)
        if self.trace:
            record("copy", f"copy {c.nbytes}B", db.device, p0, time.perf_counter_ns(), nbytes=c.nbytes)
        if DEBUG.value >= 2:
            _debug_line(db.device, f"copy {c.nbytes}B" + (f" from {sb.device}" if cross else ""), 2, t, 0, 0)

    def _async_copy(self, c: Copy, db: Buffer, sb: Buffer) -> bool:
        """Submit the copy to db's device's copy engine; False when the devices can't (one runs no kernels, or their
        memories differ in host visibility). It waits for both devices' kernels and for the copies in flight into
        the source's memory only: waiting for all the source device's copies would chain the copies of one ring
        step one after another (each device receives while it sends)."""
        sdev, ddev = sb.dev, db.dev
        if not (sdev.runs_kernels and ddev.runs_kernels and sdev.host_visible == ddev.host_visible):
            return False
        view = sb if c.offset == 0 and sb.nbytes == c.nbytes else sb.view(c.nbytes, _BYTE, c.offset)
        db.ensure_allocated()
        view.ensure_allocated()
        q = ddev.hw_queue("copy")
        for eng in (sdev.engines["compute"], ddev.engines["compute"]):  # kernels that write the source or use dst
            if eng.timeline.mem[0] < eng.submitted:
                q.wait(eng.timeline, eng.submitted)
        for sig, value in self._waits((c.src,)):
            q.wait(sig, value)
        engine = ddev.engines["copy"]
        # a small copy runs on this thread when the copy engine is idle: handing it to the engine's thread costs two
        # thread wake-ups (there and back, when something waits for it), far more than the memmove
        q.copy(db, view, c.nbytes).submit(ddev, background=c.nbytes >= SMALL_COPY_BYTES)
        self.inflight[c.dst] = (engine.timeline, engine.submitted, *_extent(db), *_extent(view))
        return True

    def _touching(self, slots: Sequence[int], written: Sequence[int]) -> list[int]:
        """Destination slots of the copies in flight that write memory of any of `slots` (what a call using them must
        wait for), or read memory of any of `written` (a call overwriting it must not start before they have read)."""
        ext = [_extent(self.bufs[s]) for s in slots]
        wext = [_extent(self.bufs[s]) for s in written]
        return [d for d, (_, _, root, lo, hi, sroot, slo, shi) in self.inflight.items()
                if any(r is root and a < hi and lo < e for r, a, e in ext)
                or any(r is sroot and a < shi and slo < e for r, a, e in wext)]  # fmt: skip

    def _waits(self, slots: Sequence[int], written: Sequence[int] = ()) -> list[tuple[Any, int]]:
        """(signal, value) of the copies in flight a call must wait for (see _touching)."""
        if not self.inflight:
            return []
        return [(w[0], w[1]) for d in self._touching(slots, written) for w in (self.inflight[d],)]

    def _wait_copies(self, slots: Sequence[int] | None = None, written: Sequence[int] = ()) -> None:
        """Wait for the copies in flight a call on `slots`, writing `written`, must wait for (see _touching; every
        copy when slots is None)."""
        todo = list(self.inflight) if slots is None else self._touching(slots, written)
        for d in todo:
            if (w := self.inflight.pop(d, None)) is not None:
                sig, value = w[0], w[1]
                sig.wait(value)
                if sig.error is not None:
                    raise HCQError(f"a copy into {self.bufs[d].device} failed: {sig.error}") from sig.error

    # -- host work ------------------------------------------------------------------------------------------------
    def host(self, c: Host) -> None:
        if self.queued:
            self._wait_queued()
        if self.inflight:
            self._wait_copies()
        for d in {self.bufs[s].dev for s in c.args}:
            d.synchronize_if_busy()
        t0, p0 = time.perf_counter(), time.perf_counter_ns()
        c.fn([self.bufs[s] for s in c.args], self.var_vals)
        t = time.perf_counter() - t0
        if c.kernel:
            self._count(1, 0, 0, 0, t if self.timed else 0.0)
            dev = self.bufs[c.args[0]].device if c.args else ""
            if self.trace:
                record("kernel", c.name, dev, p0, time.perf_counter_ns())
            if DEBUG.value >= 2:
                _debug_line(dev, c.name, len(c.args), t, 0, 0)
        elif self.times is not None:
            self.times.append(t)

    # -- bookkeeping ----------------------------------------------------------------------------------------------
    def _count(self, kernels: int, copies: int, ops: int, mem: int, t: float) -> None:
        if self.times is not None:
            self.times.append(t)
        if self.counted:
            count_run(kernels, copies, ops, mem, t)

    def _wait_queued(self, raise_errors: bool = False) -> None:
        """Wait until the kernels queued side by side have run; raise_errors: a failed one's error (the engine
        latched it), after waiting for every device."""
        assert self.queued is not None
        for dev in self.queued:
            eng = dev.engines["compute"]
            if eng.timeline.mem[0] < eng.submitted:
                eng.timeline.wait(eng.submitted)
        if raise_errors:
            for dev in self.queued:
                if dev.engines["compute"].error is not None:
                    dev.wait_idle()  # raises it

    def finish(self, wait: bool, raise_errors: bool) -> None:
        """Every call completed (the run's copies and queued kernels included): nothing outlives run()."""
        if self.queued:
            self._wait_queued(raise_errors)
        if self.inflight:
            if raise_errors:
                self._wait_copies()
            else:
                for sig, value, *_ in self.inflight.values():
                    sig.wait(value)
        if wait and not self.timed:
            for dev in {c.program.device for c in self.plan.calls if type(c) is Exec}:
                eng = dev.engines["compute"]
                if eng.timeline.mem[0] < eng.submitted or eng.error is not None:
                    if raise_errors:
                        dev.wait_idle()
                    else:
                        eng.timeline.wait(eng.submitted)


_BYTE = "uint8"
# copies between devices smaller than this are not worth a thread of their own: they run on the submitting thread
# (_Run._async_copy) or inside a graph that joins the two devices (_graph_device). A data-parallel training step's
# allreduces of batch-norm statistics and small gradients move a few hundred bytes each, and a wake-up of the copy
# engine's thread and of the waiting one cost more than that (10s of us each, ms on a busy host). Larger copies go
# to the copy engine's thread, overlapping with the kernels and other copies that follow (a ring allreduce's
# chunks move between all the devices at once)
SMALL_COPY_BYTES = 1 << 20


def _written(c: Exec) -> tuple[int, ...]:
    """The slots kernel c writes (all of its slots when the plan does not say)."""
    return tuple(c.args[i] for i in c.writes) if c.writes else c.args


def _extent(b: Buffer) -> tuple[Buffer, int, int]:
    """(root Buffer, first byte, end byte) of the memory a Buffer names (a view names part of its base's)."""
    return b.base, b.offset, b.offset + b.nbytes


def _side_by_side(plan: Plan, bufs: Sequence[Buffer]) -> set[Any] | None:
    """An empty set to collect devices in when the plan's kernels should be queued on their devices' engines rather
    than run one by one: kernels on several devices that all compute on host memory (an allreduce: each device's
    kernels then run beside the others' and beside the copies). Else None."""
    first: Any = None
    for c in plan.calls:
        if type(c) is Exec:
            d = c.program.device
            if first is None:
                first = d
            elif d is not first:
                break
    else:
        return None
    for b in bufs:
        if not (b.dev.runs_kernels and b.dev.host_visible):
            return None
    return set()


# ---------------- batching ----------------
def _batch(plan: Plan, bufs: Sequence[Buffer], var_vals: Mapping[str, int]) -> None:
    """plan.steps: the calls (each device's work made contiguous where dependencies allow) with every run of
    consecutive calls one device's graph takes, holding a kernel, as a Batch."""
    steps: list[Call | Batch] = []
    run: list[Call] = []
    run_dev: Any = None

    def flush() -> None:
        if any(type(c) is Exec for c in run):
            b = Batch(run_dev, list(run), hold=plan.replayed)
            try:
                b.build(bufs)
            except Exception as e:  # e.g. no llvmlite for the interpreter: these calls run one by one instead
                b.failed = True
                if DEBUG >= 1:
                    print(f"speck.hcq: {plan.name} runs {len(run)} calls one by one, batching failed: {e!r}")
            steps.append(b)
        else:
            steps.extend(run)

    for c in device_runs(plan.calls, bufs):
        dev = _graph_device(plan, c, bufs, var_vals)
        if run and not _same_graph(dev, run_dev):
            flush()
            run = []
        if dev is None:
            steps.append(c)
        else:
            if not run:
                run_dev = dev
            run.append(c)
    if run:
        flush()
    plan.steps = steps
    only = steps[0] if len(steps) == 1 else None
    # (the short route submits to the batch's device alone: a batch joining devices waits for the others first)
    plan.single = only if type(only) is Batch and not only.failed and not plan.symbolic and not only.others else None


def _same_graph(dev: Any, run_dev: Any) -> bool:
    """A call whose graph device is `dev` may join the graph of a run on `run_dev`: the same device, or devices of
    one graph class that joins_devices (the CPU devices: one memory, one worker pool)."""
    return dev is run_dev or (dev is not None and run_dev is not None and dev.graph is run_dev.graph
                              and getattr(dev.graph, "joins_devices", False))  # fmt: skip


def _graph_device(plan: Plan, c: Call, bufs: Sequence[Buffer], var_vals: Mapping[str, int]) -> Any:
    """The device whose graph can hold call c, or None when it runs on its own."""
    if type(c) is Exec:
        prog = c.program
        dev = prog.device
        graph: Any = dev.graph
        if graph is None or plan.symbolic and (c.vals or _symbolic(c)):  # a graph fixes sizes and values
            return None
        if not graph.supports(prog, len(c.args) + len(c.vals)):
            return None
        if not plan.replayed and dev.choose_threads(prog, [bufs[s] for s in c.args]) != 1:
            return None
        return dev
    if type(c) is not Copy:
        return None
    db, sb = bufs[c.dst], bufs[c.src]
    if c.offset < 0 or c.offset + c.nbytes > sb.nbytes or c.nbytes > db.nbytes:
        return None  # (the call-by-call path raises the error this deserves)
    dev, graph = db.dev, db.dev.graph
    if graph is None:
        return None
    if sb.dev is not dev:  # between devices: a small copy joins a graph spanning both (a large one overlaps alone)
        joins = getattr(graph, "joins_devices", False) and sb.dev.graph is graph and c.nbytes < SMALL_COPY_BYTES
        ok = joins and dev.host_visible and sb.dev.host_visible and not hasattr(dev, "transfer")
        return dev if ok and not hasattr(sb.dev, "transfer") else None
    if getattr(graph, "device_copies", False):  # the graph copies within the device's memory itself
        return dev
    return dev if dev.host_visible and not hasattr(dev, "transfer") else None


def device_runs(calls: Sequence[Call], bufs: Sequence[Buffer]) -> list[Call]:
    """The calls reordered so that each device's work is contiguous where dependencies allow (a sharded step
    interleaves its devices call by call, which would split it into one-kernel graphs). A call's phase is the
    number of device changes along its longest chain of dependencies (read after write, write after read or write,
    on the same memory: a view counts as its base); calls are ordered by (phase, device, order), which keeps every
    dependency in order. One device's calls keep their order; host work keeps its place among host work."""
    phase: list[int] = []
    devs: list[Any] = []
    last_write: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    host = -1  # a pseudo-buffer every host call writes: they keep their order
    for i, c in enumerate(calls):
        r, w = reads_writes(c)
        reads, writes = {id(bufs[s].base) for s in r}, {id(bufs[s].base) for s in w}
        dev: Any = None
        if isinstance(c, Exec):
            dev = c.program.device
        elif isinstance(c, Copy):
            dev = bufs[c.dst].dev
        else:
            reads.add(host)
            writes.add(host)
        deps = [last_write[b] for b in reads | writes if b in last_write]
        deps += [j for b in writes for j in readers.get(b, ())]
        phase.append(max((phase[d] + (devs[d] is not dev) for d in deps), default=0))
        devs.append(dev)
        for b in reads:
            readers.setdefault(b, []).append(i)
        for b in writes:
            last_write[b], readers[b] = i, []
    order = {id(d): k for k, d in enumerate(dict.fromkeys(devs))}
    if len(order) <= 1:
        return list(calls)
    return [calls[i] for i in sorted(range(len(calls)), key=lambda i: (phase[i], order[id(devs[i])], i))]


_setup_native()
