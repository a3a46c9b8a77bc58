"""The CPU device: kernels linked into executable memory by speck.hcq.elf and run across a pool of worker threads.

Each exec splits [0, global_size[0]) into contiguous slices, one per worker (a big kernel: PARTS_PER_THREAD parts
per worker, taken in turn); a worker calls the kernel through ctypes with (buffers..., vars..., core_start,
core_end) (see CPU_ABI.md). ctypes releases the GIL for the call, so the workers really run in parallel. The thread
that executes the command works too, so a one-slice (tiny) kernel costs no thread wake-up at all. A CPU graph's run
(WorkerPool.run_graph) is handed to workers still spinning after the previous run natively, without waking them
through Python (idle_spin_ns says how long they spin).

Stopping a kernel (Ctrl-C, a timeout's signal): a native call can't be interrupted, so every slice runs as a series
of calls over growing pieces of its range (one row, then 4x more each time until a piece takes about CHUNK_S). The
Python loop between pieces lets the launching thread's signal handlers run: a KeyboardInterrupt stops the launch
after the current piece, tells the workers to stop after theirs, waits for them, and propagates - the pool and the
device stay usable, and the command's outputs are left partly written (speck.tensor never binds them). A kernel
whose outer range has a single row (or a CPU graph's interpreter call) runs to its end first."""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from speck.codegen.backends import host_backends
from speck.hcq import graph as _graph
from speck.hcq.allocator import HostAllocator, available_ram, check_copy_size, parse_bytes
from speck.hcq.buffer import Buffer
from speck.hcq.device import DeviceBase
from speck.hcq.elf import LoadedObject, load_elf
from speck.hcq.errors import ProgramArgumentError
from speck.hcq.graph import CPUGraph
from speck.hcq.libs import Library, default_libraries
from speck.hcq.program import Program
from speck.hcq.registry import numbered, register_device
from speck.hcq.settings import CHUNK_S as _CHUNK_S
from speck.hcq.settings import CPU_IDLE_SPIN_US, CPU_MEM_LIMIT, NUM_CPU_THREADS, PIN_WORKERS
from speck.hcq.settings import PARALLEL_MIN_BYTES as _PARALLEL_MIN_BYTES
from speck.hcq.settings import PARALLEL_MIN_FLOPS as _PARALLEL_MIN_FLOPS
from speck.hcq.settings import PARTS_PER_THREAD as _PARTS_PER_THREAD
from speck.hcq.trampoline import CTYPES_MAX_ARGS, WordCall
from speck.hcq.worker_choice import WorkerChoice

# kernels touching less than this many bytes and doing fewer estimated flops run on one thread: waking workers
# costs tens of microseconds, more than such a kernel takes (1 MiB streams in ~100 us on one core)
PARALLEL_MIN_BYTES = int(_PARALLEL_MIN_BYTES.value)
PARALLEL_MIN_FLOPS = int(_PARALLEL_MIN_FLOPS.value)
# a slice is run in pieces that grow until one takes about this long: the delay before an interrupt is honoured
CHUNK_S = float(_CHUNK_S.value)
# a kernel split across workers is cut into this many parts per worker, taken in turn: on a shared machine a worker
# whose core runs another process delays the kernel by one part, not by its whole slice (a+b over 16M float32 with
# the second core busy: static halves wait for the slow one)
PARTS_PER_THREAD = int(_PARTS_PER_THREAD.value)
# ...for kernels estimated at least this big (a part is a call of its own: smaller kernels keep one slice per worker)
PARTS_MIN_BYTES = 16 << 20
PARTS_MIN_FLOPS = 1 << 26


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware), read once: every launch and graph run asks (through
    CPUDevice.threads), and the system call costs more than a tiny kernel. `refresh_usable_cores()` re-reads it
    after the affinity changed."""
    global _usable
    if _usable is None:
        try:
            _usable = len(os.sched_getaffinity(0)) or 1
        except (AttributeError, OSError):
            _usable = os.cpu_count() or 1
    return _usable


_usable: int | None = None


def refresh_usable_cores() -> int:
    """Read the process's CPU affinity again (after os.sched_setaffinity) and return the usable cores."""
    global _usable
    _usable = None
    return usable_cores()


if hasattr(os, "register_at_fork"):  # a child process may be pinned differently: it reads its own affinity
    os.register_at_fork(after_in_child=refresh_usable_cores)


def run_range(fn: Any, args: tuple[Any, ...], start: int, end: int, stop: threading.Event | None = None,
              step: int = 0) -> int:  # fmt: skip
    """fn(*args, s, e) over [start, end) in pieces: the first is 1/65536th of the range (at least one row) or
    `step` rows, each next one 4x larger while a piece takes under CHUNK_S/4 (halved when one takes over
    2*CHUNK_S). Between pieces the caller's signal handlers may raise, and `stop` (set by an interrupted launcher)
    ends the loop early. Returns the piece size reached (a caller running more ranges starts the next one there)."""
    n = end - start
    if n <= 1:
        fn(*args, start, end)
        return step
    step = step or max(1, n >> 16)
    limit = int(CHUNK_S * 1e9)
    clock = time.perf_counter_ns
    i = start
    while i < end:
        j = min(end, i + step)
        t0 = clock()
        fn(*args, i, j)
        dt = clock() - t0
        i = j
        if stop is not None and stop.is_set():
            return step
        if dt < limit >> 2:
            step <<= 2
        elif dt > limit << 1:
            step = max(1, step >> 1)
    return step


class _Feed:
    """[0, n) cut into `count` contiguous parts that the launcher and the workers take in turn (dynamic
    scheduling): a worker whose core is busy with another process then holds up a launch by one part, not by a
    whole static slice. `next` on an itertools.count is atomic under the GIL, so taking a part needs no lock."""

    __slots__ = ("count", "n", "taken")

    def __init__(self, n: int, count: int) -> None:
        self.n, self.count, self.taken = n, count, itertools.count()

    def run(self, fn: Any, args: tuple[Any, ...], stop: threading.Event | None) -> None:
        n, count, step = self.n, self.count, 0
        while (k := next(self.taken)) < count:
            step = run_range(fn, args, n * k // count, n * (k + 1) // count, stop, step)
            if stop is not None and stop.is_set():
                return


def pin_worker(index: int) -> int | None:
    """Keep the calling worker thread (number `index`, from 1) on one core of its allowed set, never the first one,
    which is left to the launching thread; returns the core, or None when not pinned (PIN_WORKERS=0, one core, no
    affinity API). Why: a worker that wakes after an idle spell (a sleep, a data-loading pause) was often put on
    the launcher's core and stayed there, and the two then took turns at every spin barrier of a CPU graph: a
    jitted MLP step ran 3x slower for as long as that lasted (1.26 ms against 0.42 ms on a 2-core host)."""
    if not PIN_WORKERS.value or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    core = allowed[1 + (index - 1) % (len(allowed) - 1)]
    os.sched_setaffinity(0, {core})
    return core


class _on_launcher_core:
    """While a split launch runs, the launching thread stays off its pinned workers' cores (on the first allowed
    core), then gets its own affinity back. A launcher that slept (between training steps, say) may wake on a
    worker's core, and the pinned worker then shares that core with it until the OS moves one of them: a 512x512
    matmul ran at half speed. Costs two affinity calls (~5 us) per split launch; nothing when no worker is pinned."""

    __slots__ = ("saved", "workers")

    def __init__(self, workers: list[_Worker]) -> None:
        self.workers = workers
        self.saved: set[int] | None = None

    def __enter__(self) -> None:
        if not self.workers or self.workers[0].core is None:
            return  # (the first launch makes the workers: they pin themselves, the launcher is free this once)
        saved = os.sched_getaffinity(0)
        launcher = saved - {w.core for w in self.workers}
        if launcher and launcher != saved:
            os.sched_setaffinity(0, {min(launcher)})
            self.saved = saved

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)


class _Worker:
    __slots__ = ("core", "done", "go", "slot", "slot_addr", "task", "thread")

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.core: int | None = None  # the core the worker is pinned to (pin_worker), once it has started
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        # where the worker waits for graph runs without sleeping (speck.hcq.graph's speck_worker_idle): state, Python
        # task flag, spin budget in ns, a posted run's arguments
        self.slot = (ctypes.c_uint64 * _graph.SLOT_WORDS)()
        self.slot_addr = ctypes.addressof(self.slot)
        self.task: tuple[Any, tuple[Any, ...], int, int, _Feed | None] | None = None
        self.thread = threading.Thread(target=pool._work, args=(self, index), name=f"speck-cpu-worker{index}",
                                       daemon=True)  # fmt: skip
        self.thread.start()


class WorkerPool:
    """Worker threads shared by every CPU device (there are only so many cores). `run` hands out slices and waits
    for all of them; one launch at a time uses the pool (a second caller waits for the first)."""

    def __init__(self) -> None:
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._stop = threading.Event()  # an interrupted launch: workers end their slices after the current piece
        self.posted = 0  # graph runs' parts a spinning worker took natively (run_graph), for tests and profiling
        self._spin = 0  # ns the workers wait for the next graph run without sleeping (idle_spin_ns of the last one)
        self._closed = False  # the process is exiting: workers no longer spin (see stop_spinning)
        self._exit_hook = False  # stop_spinning is registered to run at exit

    def _work(self, w: _Worker, index: int) -> None:
        w.core = pin_worker(index)
        slot = w.slot
        while True:
            if slot[2] and (fns := _graph.worker_functions()) is not None:
                fns[0](w.slot_addr)  # (runs posted graph runs natively; returns to sleep or for a Python task)
            w.go.acquire()
            slot[1] = 0
            task = w.task
            assert task is not None
            fn, args, start, end, feed = task
            try:
                if feed is None:
                    run_range(fn, args, start, end, self._stop)
                else:
                    feed.run(fn, args, self._stop)
            except BaseException as e:  # a Python kernel (tests) may raise; hand it to the launcher
                self._errors.append(e)
            finally:
                w.done.release()

    def run(self, fn: Any, args: tuple[Any, ...], n: int, threads: int, parts: int = 0) -> None:
        """Call fn(*args, start, end) for `threads` contiguous slices of [0, n) (fewer when n < threads), one per
        thread; or, with `parts` > threads, for `parts` contiguous pieces the threads take in turn (_Feed)."""
        t = min(threads, n)
        if t <= 1:
            run_range(fn, args, 0, n)
            return
        feed = _Feed(n, min(parts, n)) if parts > t else None
        with self._lock, _on_launcher_core(self._workers):
            while len(self._workers) < t - 1:
                self._workers.append(_Worker(self, len(self._workers) + 1))
            workers = self._workers[: t - 1]
            for k, w in enumerate(workers, start=1):
                w.task = (fn, args, n * k // t, n * (k + 1) // t, feed)
                w.slot[2] = 0  # (after a direct launch the worker sleeps, as it did before graphs)
                w.slot[1] = 1  # (a worker spinning for graph runs comes back to take it)
                w.go.release()
            try:
                if feed is None:
                    run_range(fn, args, 0, n // t)
                else:
                    feed.run(fn, args, self._stop)
            except BaseException:
                self._stop.set()
                try:
                    self._join(workers)
                finally:
                    self._errors.clear()  # the launcher's own exception is the one to report
                raise
            self._join(workers)
            if self._errors:
                err = self._errors[0]
                self._errors.clear()
                raise err

    def run_graph(self, fn: Any, args: tuple[Any, ...], workers: int) -> None:
        """A CPU graph's run on `workers` threads: fn(*args, k, k + 1) on worker k (the launcher is worker 0), where
        fn is speck.hcq.graph's interpreter and args its first four arguments. A worker still spinning after an
        earlier graph run takes its part natively, without a wake-up through Python (which cost ~25 us a launch);
        the others are woken as for `run`. Afterwards the workers spin for the next run for as long as this one took
        (idle_spin_ns)."""
        fns = _graph.worker_functions()
        if fns is None or workers <= 1:
            self.run(fn, args, workers, workers)
            return
        _, post, wait = fns
        if not self._exit_hook:
            # (registered now, after the interpreter's image: exit hooks run last-registered first, and the one that
            # unmaps executable memory at exit came with the first image)
            atexit.register(self.stop_spinning)
            self._exit_hook = True
        with self._lock, _on_launcher_core(self._workers):
            while len(self._workers) < workers - 1:
                self._workers.append(_Worker(self, len(self._workers) + 1))
            helpers = self._workers[: workers - 1]
            posted, woken = [], []
            t0 = time.perf_counter_ns()
            for k, w in enumerate(helpers, start=1):
                slot = w.slot
                slot[3], slot[4], slot[5], slot[6], slot[7], slot[8] = (*args, k, k + 1)
                if post(w.slot_addr):
                    posted.append(w)
                else:
                    w.task = (fn, args, k, k + 1, None)
                    slot[2] = self._spin  # (read when its part is done: how long to wait for the next run)
                    slot[1] = 1
                    w.go.release()
                    woken.append(w)
            try:
                fn(*args, 0, 1)
            finally:  # (a signal may raise meanwhile: every worker must be done with the run before it propagates)
                pending: BaseException | None = None
                for w in posted:
                    while True:
                        try:
                            wait(w.slot_addr)
                            break
                        except BaseException as e:
                            pending = pending or e
                self._join(woken)
                if pending is not None:
                    raise pending
            self.posted += len(posted)
            elapsed = time.perf_counter_ns() - t0
            cap = int(CPU_IDLE_SPIN_US.value)
            spin = self._spin = 0 if self._closed else idle_spin_ns(elapsed, cap, usable_cores(), len(self._workers))
            for w in helpers:
                w.slot[2] = spin
            if self._errors:
                err = self._errors[0]
                self._errors.clear()
                raise err

    def stop_spinning(self) -> None:
        """Bring every worker waiting natively for graph runs back to Python, and keep them from spinning again: at
        exit, before the interpreter's code is unmapped under a worker still running it."""
        self._closed, self._spin = True, 0
        for w in self._workers:
            w.slot[2] = 0
            w.slot[1] = 1  # (a spinning worker returns to Python and sleeps on its lock)
        for w in self._workers:
            while w.slot[0] != 0 and w.thread.is_alive():
                time.sleep(1e-5)

    def _join(self, workers: list[_Worker]) -> None:
        """Wait until every worker finished its slice. A signal raising meanwhile (Ctrl-C) stops the workers after
        their current piece; the wait goes on (they must not outlive the launch) and the exception is re-raised."""
        pending: BaseException | None = None
        for w in workers:
            while True:
                try:
                    w.done.acquire()
                    break
                except BaseException as e:
                    self._stop.set()
                    pending = pending or e
        self._stop.clear()
        if pending is not None:
            self._errors.clear()
            raise pending


def idle_spin_ns(run_ns: int, cap_us: int, cores: int, workers: int) -> int:
    """How long (ns) a pool worker waits for the next graph run without sleeping, after a run that took `run_ns`:
    as long as that run (so spinning costs at most as much CPU as the work did), at most `cap_us` microseconds, and
    not at all when the workers don't each have a core of their own beside the launcher's (a spinning worker
    would take the CPU from the thread that is to launch the next run). Back-to-back runs (a training loop's
    steps) then find the workers awake: waking one through Python cost ~25 us of a 0.5 ms MLP step."""
    if cores <= workers or cap_us <= 0:
        return 0
    return max(0, min(run_ns, cap_us * 1000))


POOL = WorkerPool()


def _pool_after_fork() -> None:
    """A forked child has none of the parent's worker threads: its pool starts afresh (else a launch would wait
    for workers that do not exist)."""
    POOL.__init__()  # type: ignore[misc]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool_after_fork)


class CPUProgram(Program):
    """A kernel function in an ELF object, linked by speck.hcq.elf against libm/libgcc_s/libc (or `libraries`)."""

    def __init__(self, device: CPUDevice, name: str, lib: bytes, libraries: list[Library] | None = None, **spec: Any):
        super().__init__(device, name, lib, **spec)
        self.image: LoadedObject = load_elf(lib, libraries if libraries is not None else default_libraries(), name)
        self.address = self.image.address(name)
        self._fns: dict[tuple[int, int], Any] = {}
        self._fn: Any = None
        if self.params is not None and self.var_names is not None:
            self._fn = self.function(len(self.params), len(self.var_names))
        # estimated below the sizes that are worth splitting (see choose_threads): well under CHUNK_S on one core
        self._small = bool(self.est_bytes or self.est_flops) and (
            self.est_bytes < PARALLEL_MIN_BYTES and self.est_flops < PARALLEL_MIN_FLOPS
        )
        big = self.est_bytes >= PARTS_MIN_BYTES or self.est_flops >= PARTS_MIN_FLOPS
        self._parts = PARTS_PER_THREAD if big else 0  # parts per worker when split (see PARTS_PER_THREAD)
        self._choice: WorkerChoice | None = None  # a big kernel's launches with the device's worker count

    def function(self, nbufs: int, nvars: int) -> Any:
        """The ctypes function for a call with `nbufs` pointers and `nvars` int32 values (+ core_start/core_end)."""
        fn = self._fns.get((nbufs, nvars))
        if fn is None:
            if nbufs + nvars + 2 > CTYPES_MAX_ARGS:  # more than ctypes can call: through the trampoline
                fn = self._fns[(nbufs, nvars)] = WordCall(self.address, nbufs + nvars + 2)
                return fn
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs), *([ctypes.c_int32] * (nvars + 2)))
            fn = self._fns[(nbufs, nvars)] = proto(self.address)
        return fn

    def raw_args(self, bufs: Sequence[Buffer], vals: Sequence[int] = ()) -> tuple[Any, ...]:
        """(fn, buffer addresses..., variable values...): the ctypes function travels with its arguments."""
        args = [self._fn if self._fn is not None else self.function(len(bufs), len(vals))]
        for b in bufs:
            args.append(b.ptr)
        return (*args, *vals)

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        """Run now: one call per worker slice of global_size[0] (a kernel with no global dimension gets (0, 1)).
        A small kernel on one thread is one call: it ends long before an interrupt would need pieces."""
        n = global_size[0] if global_size else 1
        if n <= 1 or (threads == 1 and self._small):
            args[0](*args[1:], 0, n)
            return
        t = 1 if threads == 1 else self.device.threads if threads is None else threads  # type: ignore[attr-defined]
        if t > 1 and threads is None and self._parts and n > 1:  # a big kernel, split as the device decides
            choice = self._choice
            if choice is None or choice.n != min(t, n):
                choice = self._choice = WorkerChoice(min(t, n), skip_first=True)
            w = choice.pick()
            t0 = time.perf_counter()
            self._run_split(args, n, w)
            choice.record(w, time.perf_counter() - t0)
            return
        self._run_split(args, n, t)

    def _run_split(self, args: tuple[Any, ...], n: int, t: int) -> None:
        if t <= 1:
            run_range(args[0], args[1:], 0, n)
        else:
            POOL.run(args[0], args[1:], n, t, t * self._parts)


class CPUDevice(DeviceBase):
    """The CPU: host memory (limit `CPU_MEM_LIMIT`, default the available RAM), `threads` workers (`CPU_THREADS`,
    default os.cpu_count()), and the codegen backend named by the device: CPU and CPU:<n> -> LLVM (llvmlite),
    CPU:LLVM, CPU:CLANG (clang/gcc), CPU:X86 (speck's own x86-64 backend)."""

    graph = CPUGraph
    pool = POOL  # the worker threads every CPU device shares (there are only so many cores)

    def __init__(self, name: str) -> None:
        suffix = name.partition(":")[2]
        self.backend_name = suffix if suffix in host_backends() else host_backends()[0]
        limit_env = str(CPU_MEM_LIMIT.value)
        limit = parse_bytes(limit_env, "CPU_MEM_LIMIT") if limit_env else available_ram()
        super().__init__(name, HostAllocator(name, limit=limit))
        self.allocator.limit_setting = "CPU_MEM_LIMIT"
        self._threads: int | None = None
        self.libraries: list[Library] | None = None

    @property
    def threads(self) -> int:
        """Workers a kernel splits across: set explicitly, else NUM_CPU_THREADS, else the usable cores."""
        return self._threads or int(NUM_CPU_THREADS.value) or usable_cores()

    @threads.setter
    def threads(self, n: int | None) -> None:
        self._threads = n

    def runtime(self, name: str, lib: bytes, **spec: Any) -> CPUProgram:
        """Link `lib` (an x86-64 ELF object) and return the program for its function `name`."""
        if not isinstance(lib, (bytes, bytearray, memoryview)):
            raise ProgramArgumentError(
                f"{self.name}.runtime({name!r}) expects the compiled object as bytes, got {type(lib).__name__}"
            )
        return CPUProgram(self, name, bytes(lib), self.libraries, **spec)

    def choose_threads(self, prog: Program, bufs: Sequence[Buffer]) -> int | None:
        """One thread for small kernels (by the program's estimates when it has them, else by the bytes of its
        buffers); None (all `threads` workers) otherwise."""
        if prog.est_bytes or prog.est_flops:
            return None if prog.est_bytes >= PARALLEL_MIN_BYTES or prog.est_flops >= PARALLEL_MIN_FLOPS else 1
        total = 0
        for b in bufs:
            total += b.nbytes
        return None if total >= PARALLEL_MIN_BYTES else 1

    def _copy_raw(self, dest: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dest, src, nbytes)

    def _copy(self, dest: Any, src: Any, nbytes: int) -> None:
        """A copy command between host-memory Buffers (another CPU device's included) is one memmove, which runs
        without the GIL: a copy engine moving data between devices overlaps with kernels on the calling thread."""
        if (
            isinstance(dest, Buffer)
            and isinstance(src, Buffer)
            and isinstance(dest.dev.allocator, HostAllocator)
            and isinstance(src.dev.allocator, HostAllocator)
        ):
            check_copy_size(f"copy command of {nbytes} bytes into {dest!r}", dest.nbytes, nbytes)
            check_copy_size(f"copy command of {nbytes} bytes from {src!r}", src.nbytes, nbytes)
            ctypes.memmove(dest.ptr, src.ptr, nbytes)
            return
        super()._copy(dest, src, nbytes)


def _cpu_suffix(rest: str) -> str | None:
    """CPU:<n>, or CPU:<backend> for each backend of the codegen registry that declares itself a host one (a CPU
    device pinned to that backend)."""
    return rest.upper() if rest.upper() in host_backends() else numbered(rest)


register_device("CPU", CPUDevice, suffix=_cpu_suffix, forms=("CPU", "CPU:<n>", *(f"CPU:{b}" for b in host_backends())))
