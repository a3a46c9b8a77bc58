"""CPU graphs: a captured list of kernel calls and memory copies replayed by native code in one exec command.

Launching one kernel from Python costs several microseconds of argument handling, queue bookkeeping and (for a
kernel split across workers) two thread hand-offs through Python locks. A graph pays that once per batch: its
commands live in a table in memory and a small native interpreter (LLVM IR compiled once per process through
llvmlite, linked by speck.hcq.elf, so no system compiler is needed) walks the table and calls every kernel with
its arguments. Every worker of the CPU pool enters the interpreter once per launch; a kernel split across workers
gives each worker its contiguous slice of global_size[0] (the same slices WorkerPool.run hands out, so results do
not depend on batching), and the workers meet at a spin barrier (an atomic counter) after it. Kernels that run on
one thread run on worker 0 only; the others skip them and wait at the next barrier.

Arguments are read from a flat table of 64-bit words (buffer addresses and variable values), so replaying with
other buffers only rewrites table entries (`set_arg`). A graph is submitted to the device's compute engine as one
exec command, so queue order, signals and `synchronize` behave as for a single kernel.

Every CPU device computes on host memory with the one shared worker pool, so a graph may also hold kernels loaded on
other CPU devices and copies between their buffers (`joins_devices`): a data-parallel step over CPU:0 and CPU:1 is
then one launch, as on one device, instead of a launch per device per allreduce phase, each waking the pool's
workers again. It is still submitted to its own device's engine: the caller makes sure the other devices' engines
hold no earlier work (speck.hcq.runner does)."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from speck.codegen.compiler import LLVMCompiler
from speck.hcq.allocator import check_copy_size
from speck.hcq.buffer import Buffer
from speck.hcq.elf import load_elf
from speck.hcq.errors import ElfLinkError, GraphArgumentError, HCQError, HCQValueError, ProgramArgumentError
from speck.hcq.interfaces import DeviceLike
from speck.hcq.libs import Library, default_libraries
from speck.hcq.queue import EXEC
from speck.hcq.settings import CPU_GRAPH_WORKERS
from speck.hcq.worker_choice import WorkerChoice


# what a graph needs of its device and its kernels: speck.hcq.cpu's CPUDevice (whose `graph` is CPUGraph) and
# CPUProgram, which build on this module, so it names them only through these Protocols
class CPUWorkersLike(Protocol):
    def run(self, fn: Any, args: tuple[Any, ...], n: int, threads: int, parts: int = 0) -> None: ...
    def run_graph(self, fn: Any, args: tuple[Any, ...], workers: int) -> None: ...


class CPUDeviceLike(DeviceLike, Protocol):
    @property
    def threads(self) -> int: ...  # the workers a split kernel uses when its command does not fix a count
    @property
    def pool(self) -> CPUWorkersLike: ...


class CPUProgramLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def device(self) -> DeviceLike: ...
    @property
    def address(self) -> int: ...  # the kernel's entry point, called with the CPU ABI
    @property
    def global_size(self) -> tuple[Any, ...] | None: ...
    @property
    def _symbolic_size(self) -> bool: ...
    def check_args(self, bufs: Sequence[Any], vals: Sequence[int]) -> None: ...
    def launch_dims(self, vals: Sequence[int]) -> tuple[int, ...]: ...


# the interpreter calls a kernel through a switch on its argument count: one case per count up to this many words
# (buffers + variables); a command with more arguments can't join a graph (add_* raises, callers run it alone)
MAX_ARGS = 48
# words per command in the command table: function address, argument count, offset of its first argument in the
# argument table, global size (the split dimension), threads (resolved worker count, 1 = worker 0 alone), parts
# (0: one contiguous slice per worker; else the split dimension cut into this many parts the workers take in turn)
_CMD_WORDS = 6
# spins on the barrier before each worker starts yielding its core (the machine may have fewer free cores than
# workers; a spinning waiter would then keep the worker it waits for off the CPU)
_SPINS_BEFORE_YIELD = 2048


def _parts(n: int, threads: int, per_thread: int) -> int:
    """Parts a command over n rows split across `threads` workers is cut into: `per_thread` each (at most n), taken
    in turn, so a worker whose core another process holds up delays the command by one part rather than by a whole
    slice (as WorkerPool.run does for a direct launch); 0 (one contiguous slice each) when that is no more."""
    k = min(n, per_thread * threads)
    return k if threads > 1 and k > threads else 0


def _interpreter_ir() -> str:
    """LLVM IR of `speck_graph_run(cmds, ncmds, args, sync, worker, worker_end)`: see the module docstring. `sync`
    points at four words: the barrier counter (reset to 0 before each launch), the number of workers, the
    address of ncmds + 1 timestamps worker 0 writes before the first and after every command (0: no timing), and
    the part counter (reset to 0 before each launch). A command cut into parts hands them out by an atomic
    increment of the part counter, which is never reset within a launch: every worker taking part counts the
    tickets earlier commands used (their parts, plus the one ticket past the end each of their workers drew) and
    reads this command's part numbers relative to that base."""
    cases, blocks = [], []
    for k in range(MAX_ARGS + 1):
        cases.append(f"i64 {k}, label %n{k}")
        loads = [
            f"  %p{k}_{j} = getelementptr i64, ptr %a, i64 {j}\n  %v{k}_{j} = load i64, ptr %p{k}_{j}, align 8"
            for j in range(k)
        ]
        params = "".join(f"i64 %v{k}_{j}, " for j in range(k))
        blocks.append(
            f"n{k}:\n" + "\n".join(loads) + ("\n" if loads else "")
            + f"  call void %fn({params}i32 %s, i32 %e)\n  ret void"
        )  # fmt: skip
    dispatch = (
        "define internal void @dispatch(ptr %fn, i64 %nargs, ptr %a, i32 %s, i32 %e) {\n"
        "entry:\n"
        f"  switch i64 %nargs, label %bad [{' '.join(cases)}]\n"
        "bad:\n  ret void\n" + "\n".join(blocks) + "\n}\n"
    )
    return (
        dispatch
        + f"""
declare i32 @sched_yield()
declare i32 @clock_gettime(i32, ptr)
declare void @llvm.x86.sse2.pause()

; arrive at barrier number `target / nworkers` and wait until every worker has
define internal void @barrier(ptr %sync, i64 %target) {{
entry:
  %old = atomicrmw add ptr %sync, i64 1 seq_cst, align 8
  br label %check
check:
  %spins = phi i64 [0, %entry], [%spins1, %again]
  %now = load atomic i64, ptr %sync acquire, align 8
  %ok = icmp uge i64 %now, %target
  br i1 %ok, label %done, label %wait
wait:
  %spins1 = add i64 %spins, 1
  %long = icmp ugt i64 %spins1, {_SPINS_BEFORE_YIELD}
  br i1 %long, label %yield, label %pause
yield:
  %r = call i32 @sched_yield()
  br label %again
pause:
  call void @llvm.x86.sse2.pause()
  br label %again
again:
  br label %check
done:
  ret void
}}

; with timing on (worker 0 only), times[idx] = CLOCK_MONOTONIC in ns (what time.perf_counter_ns reads on Linux)
define internal void @stamp(i1 %on, ptr %times, i64 %idx) {{
entry:
  br i1 %on, label %go, label %done
go:
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %sec = load i64, ptr %ts, align 8
  %nsp = getelementptr i64, ptr %ts, i64 1
  %nsec = load i64, ptr %nsp, align 8
  %ns0 = mul i64 %sec, 1000000000
  %ns = add i64 %ns0, %nsec
  %slot = getelementptr i64, ptr %times, i64 %idx
  store i64 %ns, ptr %slot, align 8
  br label %done
done:
  ret void
}}

define void @speck_graph_run(ptr %cmds, i64 %ncmds, ptr %args, ptr %sync, i32 %worker, i32 %worker_end) {{
entry:
  %nwp = getelementptr i64, ptr %sync, i64 1
  %nw = load i64, ptr %nwp, align 8
  %w = sext i32 %worker to i64
  %w1 = add i64 %w, 1
  %is0 = icmp eq i64 %w, 0
  %ttp = getelementptr i64, ptr %sync, i64 2
  %ttw = load i64, ptr %ttp, align 8
  %times = inttoptr i64 %ttw to ptr
  %hast = icmp ne i64 %ttw, 0
  %stamps = and i1 %hast, %is0
  %tick = getelementptr i64, ptr %sync, i64 3
  call void @stamp(i1 %stamps, ptr %times, i64 0)
  %any = icmp sgt i64 %ncmds, 0
  br i1 %any, label %body, label %exit
body:
  %i = phi i64 [0, %entry], [%inext, %next]
  %pending = phi i1 [false, %entry], [%pend2, %next]
  %bars = phi i64 [0, %entry], [%bars2, %next]
  %base = phi i64 [0, %entry], [%base2, %next]
  %ci = mul i64 %i, {_CMD_WORDS}
  %cp = getelementptr i64, ptr %cmds, i64 %ci
  %fnw = load i64, ptr %cp, align 8
  %fn = inttoptr i64 %fnw to ptr
  %nap = getelementptr i64, ptr %cp, i64 1
  %nargs = load i64, ptr %nap, align 8
  %offp = getelementptr i64, ptr %cp, i64 2
  %off = load i64, ptr %offp, align 8
  %ap = getelementptr i64, ptr %args, i64 %off
  %np = getelementptr i64, ptr %cp, i64 3
  %n = load i64, ptr %np, align 8
  %tp = getelementptr i64, ptr %cp, i64 4
  %t = load i64, ptr %tp, align 8
  %ptp = getelementptr i64, ptr %cp, i64 5
  %parts = load i64, ptr %ptp, align 8
  %n32 = trunc i64 %n to i32
  %single = icmp sle i64 %t, 1
  br i1 %single, label %one, label %par
one:
  br i1 %is0, label %one_call, label %one_done
one_call:
  call void @dispatch(ptr %fn, i64 %nargs, ptr %ap, i32 0, i32 %n32)
  br label %one_done
one_done:
  br label %next
par:
  ; work worker 0 did alone since the last barrier must be visible before anybody starts this kernel
  br i1 %pending, label %pre, label %run
pre:
  %barsp = add i64 %bars, 1
  %tgtp = mul i64 %barsp, %nw
  call void @barrier(ptr %sync, i64 %tgtp)
  br label %run
run:
  %bars1 = phi i64 [%bars, %par], [%barsp, %pre]
  %dyn = icmp ugt i64 %parts, 0
  %used0 = add i64 %parts, %t
  %used = select i1 %dyn, i64 %used0, i64 0
  %basen = add i64 %base, %used
  %mine = icmp slt i64 %w, %t
  br i1 %mine, label %pick, label %post
pick:
  br i1 %dyn, label %part, label %slice
part:
  %tk = atomicrmw add ptr %tick, i64 1 seq_cst, align 8
  %k = sub i64 %tk, %base
  %inr = icmp ult i64 %k, %parts
  br i1 %inr, label %part_call, label %post
part_call:
  %plo = mul i64 %n, %k
  %pstart = udiv i64 %plo, %parts
  %k1 = add i64 %k, 1
  %phi_ = mul i64 %n, %k1
  %pend = udiv i64 %phi_, %parts
  %ps32 = trunc i64 %pstart to i32
  %pe32 = trunc i64 %pend to i32
  call void @dispatch(ptr %fn, i64 %nargs, ptr %ap, i32 %ps32, i32 %pe32)
  br label %part
slice:
  %lo = mul i64 %n, %w
  %start = udiv i64 %lo, %t
  %hi = mul i64 %n, %w1
  %end = udiv i64 %hi, %t
  %s32 = trunc i64 %start to i32
  %e32 = trunc i64 %end to i32
  call void @dispatch(ptr %fn, i64 %nargs, ptr %ap, i32 %s32, i32 %e32)
  br label %post
post:
  %barsq = add i64 %bars1, 1
  %tgtq = mul i64 %barsq, %nw
  call void @barrier(ptr %sync, i64 %tgtq)
  br label %next
next:
  %pend2 = phi i1 [true, %one_done], [false, %post]
  %bars2 = phi i64 [%bars, %one_done], [%barsq, %post]
  %base2 = phi i64 [%base, %one_done], [%basen, %post]
  %inext = add i64 %i, 1
  call void @stamp(i1 %stamps, ptr %times, i64 %inext)
  %more = icmp slt i64 %inext, %ncmds
  br i1 %more, label %body, label %exit
exit:
  ret void
}}

; a pool worker waiting for its next task without sleeping (see speck.hcq.cpu): `slot` holds the worker's state
; (0 away, 1 spinning here, 2 a graph run posted), a Python task flag, the spin budget in ns, and the six packed
; arguments of a posted run. Runs posted graphs until the budget passes without one (returns 0, the state back to
; 0) or a Python task is flagged (returns 1).
define i64 @speck_worker_idle(ptr %slot) {{
entry:
  %pyp = getelementptr i64, ptr %slot, i64 1
  %limp = getelementptr i64, ptr %slot, i64 2
  %params = getelementptr i64, ptr %slot, i64 3
  store atomic i64 1, ptr %slot release, align 8
  %ts = alloca [2 x i64], align 8
  br label %restart
restart:
  %limit = load atomic i64, ptr %limp acquire, align 8
  %t0 = call i64 @now_ns(ptr %ts)
  br label %loop
loop:
  %spins = phi i64 [0, %restart], [%spins1, %pause], [%spins1, %clock], [%spins1, %leave]
  %py = load atomic i64, ptr %pyp acquire, align 8
  %haspy = icmp ne i64 %py, 0
  br i1 %haspy, label %to_python, label %check
to_python:
  store atomic i64 0, ptr %slot release, align 8
  ret i64 1
check:
  %st = load atomic i64, ptr %slot acquire, align 8
  %posted = icmp eq i64 %st, 2
  br i1 %posted, label %work, label %tick
work:
  call void @speck_graph_run_packed(ptr %params)
  store atomic i64 1, ptr %slot release, align 8
  br label %restart
tick:
  %spins1 = add i64 %spins, 1
  %low = and i64 %spins1, 255
  %round = icmp eq i64 %low, 0
  br i1 %round, label %clock, label %pause
pause:
  call void @llvm.x86.sse2.pause()
  br label %loop
clock:
  %y = call i32 @sched_yield()
  %t1 = call i64 @now_ns(ptr %ts)
  %dt = sub i64 %t1, %t0
  %over = icmp uge i64 %dt, %limit
  br i1 %over, label %leave, label %loop
leave:
  %cx = cmpxchg ptr %slot, i64 1, i64 0 seq_cst seq_cst, align 8
  %ok = extractvalue {{ i64, i1 }} %cx, 1
  br i1 %ok, label %timeout, label %loop
timeout:
  ret i64 0
}}

; hand a spinning worker the run whose arguments were written to its slot: 1 when it took it, 0 when it was not
; spinning (the caller then wakes it through Python)
define i64 @speck_graph_post(ptr %slot) {{
entry:
  %cx = cmpxchg ptr %slot, i64 1, i64 2 seq_cst seq_cst, align 8
  %ok = extractvalue {{ i64, i1 }} %cx, 1
  %r = zext i1 %ok to i64
  ret i64 %r
}}

; wait until the worker behind `slot` finished the run posted to it
define i64 @speck_graph_wait(ptr %slot) {{
entry:
  br label %check
check:
  %spins = phi i64 [0, %entry], [%spins1, %again]
  %st = load atomic i64, ptr %slot acquire, align 8
  %busy = icmp eq i64 %st, 2
  br i1 %busy, label %wait, label %done
wait:
  %spins1 = add i64 %spins, 1
  %long = icmp ugt i64 %spins1, {_SPINS_BEFORE_YIELD}
  br i1 %long, label %yield, label %pause
yield:
  %r = call i32 @sched_yield()
  br label %again
pause:
  call void @llvm.x86.sse2.pause()
  br label %again
again:
  br label %check
done:
  ret i64 0
}}

define internal i64 @now_ns(ptr %ts) {{
entry:
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %sec = load i64, ptr %ts, align 8
  %nsp = getelementptr i64, ptr %ts, i64 1
  %nsec = load i64, ptr %nsp, align 8
  %ns0 = mul i64 %sec, 1000000000
  %ns = add i64 %ns0, %nsec
  ret i64 %ns
}}

; speck_graph_run with its six arguments read from six words at %p (cmds, ncmds, args, sync, worker, worker_end):
; ctypes converts one argument instead of six, which is most of a small graph's launch cost
define void @speck_graph_run_packed(ptr %p) {{
entry:
  %cw = load i64, ptr %p, align 8
  %cmds = inttoptr i64 %cw to ptr
  %p1 = getelementptr i64, ptr %p, i64 1
  %ncmds = load i64, ptr %p1, align 8
  %p2 = getelementptr i64, ptr %p, i64 2
  %aw = load i64, ptr %p2, align 8
  %args = inttoptr i64 %aw to ptr
  %p3 = getelementptr i64, ptr %p, i64 3
  %sw = load i64, ptr %p3, align 8
  %sync = inttoptr i64 %sw to ptr
  %p4 = getelementptr i64, ptr %p, i64 4
  %w64 = load i64, ptr %p4, align 8
  %w = trunc i64 %w64 to i32
  %p5 = getelementptr i64, ptr %p, i64 5
  %we64 = load i64, ptr %p5, align 8
  %we = trunc i64 %we64 to i32
  call void @speck_graph_run(ptr %cmds, i64 %ncmds, ptr %args, ptr %sync, i32 %w, i32 %we)
  ret void
}}
"""
    )


_RUN_PROTO = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32
)
_PACKED_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_SLOT_PROTO = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
_interp_lock = threading.Lock()
# (LoadedObject kept alive, speck_graph_run, speck_graph_run_packed) as ctypes functions
_interp: tuple[Any, Any, Any] | None = None
# (speck_worker_idle, speck_graph_post, speck_graph_wait) as ctypes functions, once the interpreter is built
_worker_fns: tuple[Any, Any, Any] | None = None
# speck_graph_run_packed's address once the interpreter is built (0 before): the native runner calls it directly
_packed_addr = 0
# words of a pool worker's slot (see speck_worker_idle): state, Python task flag, spin budget (ns), six run arguments
SLOT_WORDS = 9


def worker_functions() -> tuple[Any, Any, Any] | None:
    """(idle, post, wait): the native side of a pool worker that waits for CPU graph runs without sleeping
    (speck.hcq.cpu's WorkerPool), each called with a slot's address; None until a graph built the interpreter."""
    return _worker_fns


_memmove_addr: int | None = None


def _interpreter() -> Any:
    """The compiled interpreter's ctypes function (compiled with LLVM and linked on first use, then shared)."""
    global _interp, _worker_fns, _packed_addr
    if _interp is None:
        with _interp_lock:
            if _interp is None:
                try:
                    compiler, src = LLVMCompiler(), _interpreter_ir()
                    try:
                        image = load_elf(compiler.compile(src), default_libraries(), name="speck_graph_run")
                    except ElfLinkError:  # a cached object that doesn't load: compile afresh once
                        image = load_elf(compiler.recompile(src), default_libraries(), name="speck_graph_run")
                except Exception as e:
                    raise HCQError(f"could not build the CPU graph interpreter: {e}") from e
                _worker_fns = tuple(  # type: ignore[assignment]
                    _SLOT_PROTO(image.address(f)) for f in ("speck_worker_idle", "speck_graph_post", "speck_graph_wait")
                )
                _packed_addr = image.address("speck_graph_run_packed")
                _interp = (image, _RUN_PROTO(image.address("speck_graph_run")), _PACKED_PROTO(_packed_addr))
    return _interp[1]


def _memmove() -> int:
    global _memmove_addr
    if _memmove_addr is None:
        addr = Library("libc", ctypes.CDLL(None)).lookup("memmove")
        if addr is None:
            raise HCQError("libc has no memmove: CPU graphs can't copy memory")
        _memmove_addr = addr
    return _memmove_addr


class CPUGraph:
    """A batch of commands for one CPU device: `add_exec` (a kernel on Buffers, checked like a direct call),
    `add_kernel` (raw arguments), `add_copy` (bytes between addresses). `run()` submits the whole batch as one exec
    command and waits (returning the elapsed seconds); `set_arg(cmd, j, value)` rewrites argument j of command
    `cmd` (buffer address or variable value) for later runs. Commands run in the order they were added."""

    # kernels of other devices whose graph class this is (the other CPU devices) may join one graph (see the module
    # docstring)
    joins_devices = True

    def __init__(self, device: CPUDeviceLike, name: str = "graph") -> None:
        if getattr(device, "graph", None) is not CPUGraph:
            raise HCQError(f"CPU graphs run on CPU devices, not on {getattr(device, 'name', device)!r}")
        self.device, self.name = device, name
        self._engine = device.engines["compute"]
        self._fns: list[int] = []
        self._names: list[str] = []
        self._sizes: list[int] = []
        self._threads: list[int | None] = []  # None: all of the device's workers
        self._ppt: list[int] = []  # parts per worker when split (0: one contiguous slice each; see CPUProgram)
        self._offsets: list[int] = []
        self._words: list[int] = []
        self._cmds: list[int] | None = None  # the command table (threads resolved), None: rebuild
        # workers -> (command table, its address, worker 0's packed arguments, their address)
        self._tables: dict[int, tuple[Any, int, Any, int]] = {}
        # the packed arguments' address once the tables are built for one worker and no command splits (nworkers 1,
        # every count fixed: nothing a run could choose), 0 otherwise: launch's short route
        self._solo = 0
        self._args: Any = None
        # barrier counter, workers, address of the timestamps (0: none), part counter
        self._sync = (ctypes.c_uint64 * 4)()
        self._built_for = -1  # device.threads the command table was resolved for
        self._fixed = False  # every command has its own worker count: the table does not depend on device.threads
        self._submission = [(EXEC, self, (), (1, 1, 1), None)]  # the one-exec submission submit() hands the engine
        self.nworkers = 1  # the most workers any command splits across
        # worker count for runs: None chooses by timing the first runs (see run); 1 runs every command on worker 0;
        # $CPU_GRAPH_WORKERS sets it for every new graph
        self.workers: int | None = int(CPU_GRAPH_WORKERS.value) or None
        self._choice = WorkerChoice(1)  # one worker or all nworkers, by measured time (see run)
        self._last_workers = 1

    @staticmethod
    def supports(prog: Any, nargs: int) -> bool:
        """Whether a kernel `prog` called with `nargs` argument words (buffers + variables) can join a graph: a
        native CPU kernel (its `address` follows the CPU ABI) with few enough arguments."""
        return isinstance(getattr(prog, "address", None), int) and nargs <= MAX_ARGS

    def __len__(self) -> int:
        return len(self._fns)

    @property
    def names(self) -> list[str]:
        """The commands' names in order (the kernel's name, or "copy <n>B")."""
        return list(self._names)

    # -- building -----------------------------------------------------------------------------------------------
    def _add(self, fn: int, name: str, words: Sequence[int], n: int, threads: int | None, ppt: int = 0) -> int:
        if len(words) > MAX_ARGS:
            raise ProgramArgumentError(
                f"{name!r} takes {len(words)} argument words; a CPU graph command takes at most {MAX_ARGS} "
                "(run it on its own)"
            )
        if n < 0 or n >= 2**31:
            raise ProgramArgumentError(f"{name!r}: global size {n} is outside [0, 2**31)")
        self._fns.append(fn)
        self._names.append(name)
        self._sizes.append(n)
        self._threads.append(threads)
        self._ppt.append(ppt)
        self._offsets.append(len(self._words))
        self._words.extend(int(w) & 0xFFFFFFFFFFFFFFFF for w in words)
        self._cmds = None  # rebuild the tables on the next run
        self._solo = 0
        return len(self._fns) - 1

    def add_kernel(
        self, prog: CPUProgramLike, words: Sequence[int], global_size: Sequence[int], threads: int | None = None
    ) -> int:
        """Append a call of `prog` with raw argument words (buffer addresses, then variable values) over
        `global_size` (its first entry is split across `threads` workers; None: the graph's device's count). `prog`
        may be loaded on any CPU device (joins_devices). Returns the command's index. No checking: use add_exec for
        Buffers."""
        if prog.device is not self.device and getattr(prog.device, "graph", None) is not CPUGraph:
            raise HCQError(f"program {prog.name!r} is loaded on {prog.device.name}, which is no CPU device: it can't "
                           f"join a graph on {self.device.name}")  # fmt: skip
        # as a direct launch: no global dimension at all -> one call with (0, 1); a zero size -> (0, 0)
        n = int(global_size[0]) if len(global_size) else 1
        return self._add(prog.address, prog.name, words, n, threads, int(getattr(prog, "_parts", 0) or 0))

    def add_exec(
        self,
        prog: CPUProgramLike,
        bufs: Sequence[Buffer],
        global_size: Sequence[int] | None = None,
        vals: Sequence[int] = (),
        threads: int | None = None,
    ) -> int:
        """Append `prog(*bufs, global_size=..., vals=...)`: the arguments are checked now (ProgramArgumentError,
        as for a direct call), buffers allocated, and the thread count chosen by the device when not given."""
        prog.check_args(bufs, vals)
        gs = tuple(global_size) if global_size is not None else (prog.global_size or (1, 1, 1))
        if global_size is None and prog._symbolic_size:
            gs = prog.launch_dims(vals)
        if threads is None:
            threads = prog.device.choose_threads(prog, bufs)
        return self.add_kernel(prog, [b.ptr for b in bufs] + [int(v) for v in vals], gs, threads)

    def add_copy(self, dest: int, src: int, nbytes: int) -> int:
        """Append a copy of `nbytes` bytes from address `src` to address `dest` (memmove, on worker 0)."""
        if nbytes < 0:
            raise HCQValueError(f"a copy moves >= 0 bytes, got {nbytes}")
        return self._add(_memmove(), f"copy {nbytes}B", [dest, src, nbytes], 1, 1)

    def add_buffer_copy(self, dest: Buffer, src: Buffer) -> int:
        """Append a copy of all of `src` into `dest` (both on this device, the same byte size)."""
        for b in (dest, src):
            if b.dev is not self.device:
                raise HCQError(f"graph on {self.device.name} can't copy {b!r}: it lives on {b.device}")
        check_copy_size(f"copy from {src!r} to {dest!r}", dest.nbytes, src.nbytes)
        return self.add_copy(dest.ptr, src.ptr, src.nbytes)

    def arg_index(self, cmd: int, j: int) -> int:
        """Position of argument j of command `cmd` in the flat argument table."""
        return self._offsets[cmd] + j

    def set_arg(self, cmd: int, j: int, value: int) -> None:
        """Rewrite argument j (a buffer address or a variable value) of command `cmd` for later runs."""
        k = self._offsets[cmd] + j
        end = self._offsets[cmd + 1] if cmd + 1 < len(self._offsets) else len(self._words)
        if j < 0 or k >= end:
            raise GraphArgumentError(
                f"command {cmd} ({self._names[cmd]!r}) has {end - self._offsets[cmd]} arguments, not {j}"
            )
        self._words[k] = value & 0xFFFFFFFFFFFFFFFF
        if self._args is not None:
            self._args[k] = value & 0xFFFFFFFFFFFFFFFF

    @property
    def args(self) -> Any:
        """The live argument table (a ctypes uint64 array; writes take effect on the next run)."""
        self._build()
        return self._args

    def _build(self) -> None:
        if self._cmds is not None and (self._fixed or self._built_for == int(self.device.threads)):
            return
        threads = int(self.device.threads)
        n = len(self._fns)
        ends = self._offsets[1:] + [len(self._words)]
        table: list[int] = []
        nworkers = 1
        for i in range(n):
            size, t = self._sizes[i], self._threads[i]
            t = max(1, min(threads if t is None else t, size))
            nworkers = max(nworkers, t)
            parts = _parts(size, t, self._ppt[i])
            table += [self._fns[i], ends[i] - self._offsets[i], self._offsets[i], size, t, parts]
        if self._cmds is None:  # commands were appended: a longer argument table, keeping the values written so far
            if self._args is not None:
                self._words[: len(self._args)] = list(self._args)[: len(self._words)]
            self._args = (ctypes.c_uint64 * max(len(self._words), 1))(*self._words)
        self._cmds = table
        self._tables = {}
        self._solo = 0
        self._args_addr = ctypes.addressof(self._args)
        self._sync_addr = ctypes.addressof(self._sync)
        self.nworkers, self._built_for = nworkers, threads
        self._fixed = all(t is not None for t in self._threads)
        self._choice = WorkerChoice(nworkers, first=1, in_a_row=True)  # (in a row: see WorkerChoice)

    def _table(self, nw: int) -> int:
        """Address of the command table for `nw` workers (every split clamped to nw; 1: all on worker 0)."""
        got = self._tables.get(nw)
        if got is None:
            assert self._cmds is not None, "built before use"
            table = list(self._cmds)
            for c, i in enumerate(range(4, len(table), _CMD_WORDS)):
                table[i] = min(table[i], nw)
                table[i + 1] = _parts(table[i - 1], table[i], self._ppt[c])
            arr = (ctypes.c_uint64 * max(len(table), 1))(*table)
            # worker 0 alone (nw 1) runs speck_graph_run_packed on these
            words = (ctypes.addressof(arr), len(self._fns), self._args_addr, self._sync_addr, 0, 1)
            packed = (ctypes.c_uint64 * 6)(*words)
            got = self._tables[nw] = (arr, ctypes.addressof(arr), packed, ctypes.addressof(packed))
        return got[1]

    @property
    def chosen_workers(self) -> int | None:
        """The worker count runs use: `workers` when set, else what the first timed runs found faster (None while
        still measuring)."""
        self._build()
        return max(1, min(self.workers, self.nworkers)) if self.workers is not None else self._choice.chosen

    # -- running ------------------------------------------------------------------------------------------------
    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        """Run every command now (the engine calls this for the graph's exec command)."""
        if self._solo:
            _interp[2](self._solo)  # type: ignore[index]  # (_solo is set after a launch made _interp)
            return
        if _interp is None:
            _interpreter()
        assert _interp is not None
        if self._cmds is None or not self._fixed:
            self._build()
        nw = max(1, min(self.workers, self.nworkers)) if self.workers is not None else self._choice.pick()
        self._last_workers = nw
        got = self._tables.get(nw)
        if got is None:
            self._table(nw)
            got = self._tables[nw]
        if nw <= 1:  # worker 0 alone: its table has no split command, so no barrier reads the sync words
            _interp[2](got[3])
            if self.nworkers == 1 and self._fixed:
                self._solo = got[3]
        else:
            sync = self._sync
            sync[0] = 0
            sync[1] = nw
            sync[3] = 0
            self.device.pool.run_graph(_interp[1], (got[1], len(self._fns), self._args_addr, self._sync_addr), nw)

    def submit(self) -> None:
        """Submit the batch as one exec command to the device's compute engine (without waiting)."""
        if _interp is None:
            _interpreter()  # compile errors surface here, not inside the engine
        self._engine.submit(self._submission)

    def run(self) -> float:
        """Submit, wait for completion, and return the elapsed seconds. While no worker count is chosen, the
        first runs alternate between worker 0 alone and all workers (results do not depend on the split) and the
        faster by its best time is kept, and measured again every so often (speck.hcq.worker_choice): on a machine
        whose second core is busy or shares the first one's units, waking and synchronising workers costs more than
        splitting the kernels gains."""
        t0 = time.perf_counter()
        if _interp is None:
            _interpreter()  # (submit(), inlined: compile errors surface here, not inside the engine)
        self._engine.submit(self._submission)
        self.device.wait_idle()
        dt = time.perf_counter() - t0
        if self.workers is None and (self._fixed or self._built_for == self.device.threads):
            self._choice.record(self._last_workers, dt)
        return dt

    def prepare(self) -> None:
        """Build the command tables and the native interpreter now, raising what building raises (HCQError when the
        interpreter can't be compiled), so that later runs only launch."""
        self._build()
        _interpreter()

    def replay(self) -> None:
        """run() without the elapsed time: a graph whose worker count is settled (one worker does it all, or a fixed
        `workers`) is submitted and waited for without reading the clock; one still choosing runs as run(). Waits
        for this graph's engine only (run() synchronizes the whole device)."""
        if self.workers is None and self.nworkers > 1:  # (still choosing, or measuring again every so often)
            self.run()
            return
        e = self._engine
        if self._solo:  # (settled on worker 0 alone: launch()'s short route, run by an idle engine without a command)
            if not e.run_inline(_interp[2], self._solo):  # type: ignore[index]  # (_solo: set once _interp was made)
                e.submit(self._submission)
        else:
            if _interp is None:
                _interpreter()
            e.submit(self._submission)
        if e.timeline.mem[0] < e.submitted or e.error is not None:  # queued behind other work, or an error latched
            self.device.wait_idle()

    def run_timed(self) -> list[tuple[str, float]]:
        """Run once (waiting) with worker 0 reading the monotonic clock before the first and after every command
        (after the barrier that ends a split command), and return [(command name, seconds)] in order: per-kernel
        timing of a batch without a launch per kernel. Timed runs do not count towards the worker choice."""
        self._build()
        n = len(self._fns)
        stamps = (ctypes.c_uint64 * (n + 1))()
        self._sync[2] = ctypes.addressof(stamps)
        nw = self.chosen_workers or 1  # (this run is not timed into the choice: a stand-in choice holds nw)
        choice, self._choice = self._choice, WorkerChoice(self.nworkers)
        self._choice.chosen = nw
        try:
            self.submit()
            self.device.wait_idle()
        finally:
            self._sync[2] = 0
            self._choice = choice
        return [(self._names[i], (stamps[i + 1] - stamps[i]) * 1e-9) for i in range(n)]

    def __repr__(self) -> str:
        return f"<CPUGraph {self.name} on {self.device.name}: {len(self)} commands>"
