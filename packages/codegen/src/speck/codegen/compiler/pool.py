"""`CompilePool`: compiles many sources at once, LLVM and x86 in worker processes.

A cold CNN training step lowers its 103 kernels on the main thread (Python: it holds the GIL) while they compile.
LLVM in this process compiled badly next to that: llvmlite runs one LLVM call at a time per process (a global
lock), and every one of the ~30 llvmlite calls of a compile hands the GIL back and forth with the lowering thread,
each time waiting up to the interpreter's switch interval (5 ms) for it: a compile thread next to a busy main
thread took 2-3x its CPU time in wall time. So a compiler that can be rebuilt elsewhere (it has a `worker_recipe()`
returning a `WorkerRecipe`, as LLVMCompiler does) compiles in worker processes, one lane per core (or one per core
but the caller's, `default_lanes(spare_caller=True)`, for a caller that asks for each object with `result`: a compile
no lane has started yet is then done on the caller's thread, which has nothing else to do then, and while it
waits for one a lane is building, it compiles the queue's newest jobs): each lane is a
worker fed by two threads of this process, a feeder that takes jobs off the pool's queue (answering cache hits
itself) and keeps up to DEPTH requests in the worker's pipe, so the worker never waits for this process's GIL, and
a reader that hands the answers to their futures. The worker writes the cache entry of what it built (before it
answers): writing an entry here (hashing it, a temporary file, a rename) released and retook this process's GIL
half a dozen times per object, each time a chance for the lowering thread (the cold path's critical one) to wait
for it, and cost this process's CPU. LLVMCompiler and X86Compiler have recipes;
compilers without one (gcc/clang run as subprocesses already) compile on `lanes` threads here.

The worker is a fresh interpreter (not a fork: the parent has threads) that imports only the compiler modules,
rebuilds the compiler from the recipe, checks that its `flags` (the cache key's compiler identity: LLVM version,
CPU, features, passes) equal the parent's, and then answers (recipe, source, cache entry to write) -> object bytes
in order. Objects are byte-identical to `compiler.compile(src)` and a compiler's own error comes back as the same
CompileError. One exception: a source equal but for its kernel's name to one submitted before (about 20 of a cold
CNN step's 104 kernels: an elementwise body does not depend on its element count) is not compiled again; its object
is the other's with the function symbol renamed (`speck.codegen.compiler.symbols`), the same code under its own
name. A worker that is not up within BOOT_WAIT seconds, dies, or disagrees on flags is never used again: its
lane compiles in this process (so a result is never different, only slower)."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from speck.codegen.cache import cache_enabled, cache_root
from speck.codegen.compiler.base import Compiler
from speck.codegen.compiler.symbols import rename_symbol
from speck.codegen.errors import CompileError, CompileRefused, WorkerError
from speck.codegen.settings import CACHE_DIR
from speck.uop.helpers import CACHELEVEL

DEFAULT_MAX_LANES = 4  # lanes by default: one per usable core, at most this many (each worker holds an LLVM)
DEPTH = 3  # requests a lane keeps in its worker's pipe: the next one is there when a compile ends
BOOT_WAIT = 10.0  # seconds a lane waits for its worker to start before compiling in this process instead


MAX_LANES = 64
SHARED_BODIES = 1024  # sources (without their names) whose objects are kept for renaming, most recent first


def default_lanes(spare_caller: bool = False) -> int:
    """One lane per core this process may run on, at most DEFAULT_MAX_LANES; with `spare_caller`, one fewer (at
    least one): the caller compiles what it waits for itself (`CompilePool.result`), so its core needs no worker
    (on 2 cores, a second worker competed for the cores with the lowering thread and cost its start-up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores - spare_caller, DEFAULT_MAX_LANES))


@dataclass(frozen=True)
class WorkerRecipe:
    """How a worker process rebuilds a compiler: `module.cls(**kwargs)` with `env` set first; the result's `flags`
    must equal `flags` (else the worker refuses to compile: it would not build the same objects). `packages`: the
    packages among those the worker registers without their __init__ (see _BOOT) that this compiler needs whole
    (the x86 compiler reads its source back into speck.uop UOps)."""

    module: str
    cls: str
    kwargs: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]
    packages: tuple[str, ...] = ()

    def build(self) -> Compiler:
        os.environ.update(dict(self.env))
        if self.packages:  # (import_whole() of nothing named imports every package: the whole of speck.codegen)
            import_whole(self.packages)
        compiler: Compiler = getattr(importlib.import_module(self.module), self.cls)(**dict(self.kwargs))
        if tuple(compiler.flags) != self.flags:
            raise WorkerError(f"the worker's {self.cls} has flags {compiler.flags}, the parent's {self.flags}")
        return compiler


def import_whole(names: Sequence[str] = ()) -> None:
    """Import for real the packages a worker registered without their __init__ (see _BOOT): those named, or every one
    when none is named (code that needs a package's own names - a compiler's rare path - calls it first). A no-op
    outside a worker. Every stub named goes before any is imported again (a package's __init__ imports its
    subpackages); the submodules already loaded are reused."""
    light = [n for n, m in list(sys.modules.items()) if getattr(m, "__speck_light__", False)]
    todo = [n for n in light if not names or n in names]
    for name in todo:
        del sys.modules[name]
    for name in todo:
        importlib.import_module(name)


# The worker's bootstrap: the parent's import path, and speck.uop, speck.codegen and its subpackages (_LIGHT)
# registered without running their __init__ (which import the whole IR, every renderer, the interpreter and numpy,
# the optimizer, the lowering passes): the worker needs only the compiler modules and speck.uop.helpers (the cache's
# setting), and a light import keeps its start-up (which competes with the lowering it runs beside) cheap. A recipe
# names the packages it needs whole (`WorkerRecipe.packages`).
_LIGHT = ("speck.uop", "speck.codegen", "speck.codegen.compiler", "speck.codegen.x86", "speck.codegen.opt",
          "speck.codegen.lower", "speck.codegen.renderer")  # fmt: skip
_BOOT = """
import sys, types
sys.path[:] = {path!r}
for name, path in {packages!r}:
    module = types.ModuleType(name)
    module.__path__ = path
    module.__speck_light__ = True
    sys.modules[name] = module
from speck.codegen.compiler.pool import serve
serve()
"""


def serve() -> None:
    """A worker's main loop: answer pickled (recipe, source, store) requests from stdin on stdout, in order, until
    stdin closes; `store` is None or (cache root, key): where the object goes in the compile cache (written before the
    answer, so the entry is there once the parent has the object). Replies: ("ready", pid) once, then ("ok", object,
    cpu seconds) | ("compile_error", compiler, message) | ("error", message)."""
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the reply stream
    pickle.dump(("ready", os.getpid()), out)
    out.flush()
    compilers: dict[WorkerRecipe, Compiler] = {}
    while True:
        try:
            recipe, src, store = pickle.load(inp)
        except EOFError:
            return
        try:
            compiler = compilers.get(recipe)
            if compiler is None:
                compiler = compilers[recipe] = recipe.build()
            t = time.thread_time()
            lib = compiler.compile_uncached(src)
            cpu = time.thread_time() - t
            if store is not None:
                _put_entry(compiler, store[0], store[1], lib)
            reply: tuple[Any, ...] = ("ok", lib, cpu)
        except CompileError as e:
            reply = ("compile_error", e.compiler, e.diagnostics)
        except CompileRefused as e:  # the registry renders it again with the backend's fallback
            reply = ("refused", str(e))
        except Exception as e:  # anything else means this worker can't stand in for the parent's compiler
            reply = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(reply, out)
        out.flush()


def _put_entry(compiler: Compiler, root: str, key: str, lib: bytes) -> None:
    """Write `lib` as the compile-cache entry `key` under cache root `root` (the parent's, at submit time)."""
    CACHE_DIR.value, CACHELEVEL.value = root, max(1, int(CACHELEVEL.value))
    compiler.disk_cache().put(key, lib)


def _package_path(name: str) -> list[str]:
    """A package's search path, found without importing it (speck.codegen's __init__ imports this module)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations is not None, name
    return list(spec.submodule_search_locations)


class _Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        packages = [(name, _package_path(name)) for name in _LIGHT]
        boot = _BOOT.format(path=[p for p in sys.path if isinstance(p, str)], packages=packages)
        # site still runs: import hooks of editable installs come from its .pth files
        self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self.owner = os.getpid()  # a forked child must not talk to its parent's worker
        self.compiled = 0  # objects it returned
        self.cpu_s = 0.0  # CPU seconds it spent compiling them

    def send(self, recipe: WorkerRecipe, src: str, store: tuple[str, str] | None = None) -> None:
        if os.getpid() != self.owner:
            raise WorkerError(f"compile worker {self.proc.pid} belongs to process {self.owner}")
        try:
            pickle.dump((recipe, src, store), self.stdin)
            self.stdin.flush()
        except (OSError, ValueError) as e:
            raise WorkerError(f"compile worker {self.proc.pid} is gone: {e!r}") from e

    def receive(self) -> tuple[Any, ...]:
        try:
            reply: tuple[Any, ...] = pickle.load(self.stdout)
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
            raise WorkerError(f"compile worker {self.proc.pid} stopped (exit code {self.proc.poll()}): {e!r}") from e
        return reply

    def result(self, reply: tuple[Any, ...], src: str) -> bytes:
        """The object a reply carries; CompileError as the compiler raised it; WorkerError when the worker failed."""
        if reply[0] == "ok":
            self.compiled += 1
            self.cpu_s += float(reply[2])
            return bytes(reply[1])
        if reply[0] == "compile_error":
            raise CompileError(reply[1], reply[2], src)
        if reply[0] == "refused":
            raise CompileRefused(reply[1])
        raise WorkerError(f"compile worker {self.proc.pid} could not compile: {reply[-1]}")

    def close(self) -> None:
        try:
            self.stdin.close()
            self.proc.wait(timeout=2)
        except Exception:  # exiting anyway: a worker that does not stop on EOF is killed
            self.proc.kill()


@dataclass
class _Job:
    compiler: Compiler
    src: str
    future: Future[bytes]
    taken: threading.Lock = field(default_factory=threading.Lock)  # held by whoever compiles it (a lane, a waiter)


class _Queued(Future[bytes]):
    """The Future of a job on the lanes' queue: `CompilePool.result` compiles it on the caller's thread if no lane
    has taken it yet."""

    job: _Job | None = None


class _Renamed(Future[bytes]):
    """The Future of an object renamed from `base`'s (see CompilePool.submit)."""

    base: Future[bytes] | None = None


class _Lane:
    """A worker and the two threads keeping it busy (see the module docstring). The process starts at the pool's
    first cache miss (a warm cache starts none); once it is gone (or never came up) the lane compiles in this
    process."""

    def __init__(self, pool: CompilePool, index: int) -> None:
        self.pool, self.index = pool, index
        self.worker: _Worker | None = None
        self.up = threading.Event()  # set when the worker said it is ready, or when it is gone
        self.dead = False
        self.inflight: deque[_Job] = deque()  # sent, not answered yet (answers come in order)
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(DEPTH)
        self.feeder = threading.Thread(target=self._feed, name=f"speck-compile-{index}-feed", daemon=True)
        self.reader: threading.Thread | None = None
        self.feeder.start()

    def spawn(self) -> None:
        """Start the worker process and the thread reading its answers (the pool does it once, for every lane)."""
        try:
            self.worker = _Worker()
        except OSError:  # no process: this lane compiles in this process
            self.dead = True
            self.up.set()
            return
        self.reader = threading.Thread(target=self._read, name=f"speck-compile-{self.index}-read", daemon=True)
        self.reader.start()

    def _feed(self) -> None:
        jobs = self.pool._jobs
        while (job := jobs.get()) is not None:
            if not job.taken.acquire(blocking=False):
                continue  # (the caller waiting for it compiles it: CompilePool.result)
            if not job.future.set_running_or_notify_cancel():
                continue
            compiler, src = job.compiler, job.src
            # Compiler.compile's steps, split: the cache is read here and written by the worker
            store = None
            if cache_enabled():
                key = compiler.cache_key(src)
                if (lib := compiler.disk_cache().get(key)) is not None:
                    job.future.set_result(lib)
                    continue
                store = (str(cache_root()), key)
            self.pool.start_workers()
            if not self.up.wait(BOOT_WAIT) or self.dead or self.worker is None:
                self.pool._compile_here(job)
                continue
            self.slots.acquire()
            with self.lock:
                alive = not self.dead
                if alive:
                    self.inflight.append(job)
            if not alive:
                self.slots.release()
                self.pool._compile_here(job)
                continue
            try:
                self.worker.send(compiler.worker_recipe(), src, store)  # type: ignore[attr-defined]
            except WorkerError as e:
                self._lost(e)

    def _read(self) -> None:
        worker = self.worker
        assert worker is not None
        try:
            hello = worker.receive()
            if hello[0] != "ready":
                raise WorkerError(f"compile worker {worker.proc.pid} said {hello!r} instead of ready")
            self.up.set()
            while True:
                reply = worker.receive()
                with self.lock:
                    job = self.inflight.popleft()
                self.slots.release()
                try:
                    lib = worker.result(reply, job.src)
                except (CompileError, CompileRefused) as e:
                    job.future.set_exception(e)
                    continue
                except WorkerError:
                    self.pool._compile_here(job)
                    raise
                job.future.set_result(lib)
        except WorkerError as e:
            self._lost(e)

    def _lost(self, e: WorkerError) -> None:
        """The worker is gone (or was closed): compile what it still owed in this process, and everything after."""
        with self.lock:
            was_dead, self.dead = self.dead, True
            owed = list(self.inflight)
            self.inflight.clear()
        self.up.set()
        for _ in range(DEPTH):
            self.slots.release()  # a feeder waiting for a slot wakes up and sees the lane is dead
        if not was_dead and not self.pool._closing:
            from speck.uop import DEBUG

            if DEBUG >= 1:
                print(f"speck.codegen: {e}; this compile lane compiles in-process from now on")
        for job in owed:
            self.pool._compile_here(job)


class CompilePool:
    """Compiles (compiler, source) pairs concurrently: `submit` returns a Future of the object bytes (or of the
    compiler's CompileError). See the module docstring for lanes and worker processes."""

    def __init__(self, lanes: int | None = None) -> None:
        # (a lane is a thread and a worker process: SPECK_COMPILE_THREADS=100000 failed with "can't start new
        # thread" mid-schedule; more lanes than MAX_LANES can't find cores to run on)
        self.lanes = default_lanes() if lanes is None else max(1, min(lanes, MAX_LANES))
        self._threads = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix="speck-compile")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lanes: list[_Lane] | None = None
        self._spawned = False
        self._lock = threading.Lock()
        self._closing = False
        self._local_cpu_s = 0.0  # CPU seconds of the compiles done in this process
        self._submitted = 0
        self._local_objects = 0  # compiles done in this process (cache hits included)
        self._shared = 0  # sources whose object was renamed from another's instead of compiled
        # (compiler, source without its name) -> (the name, the Future of the object) of the first one submitted
        self._queued: deque[_Job] = deque()  # jobs on the lanes' queue, oldest first (taken ones are dropped lazily)
        self._bodies: OrderedDict[tuple[str, str, tuple[str, ...], str], tuple[str, Future[bytes]]] = OrderedDict()

    def submit(self, compiler: Compiler, src: str) -> Future[bytes]:
        """A Future of `src`'s object. A source equal but for its function's name to one submitted before (by the
        compiler's `name_free`) is not compiled again: its object is that one's with the symbol renamed (see
        speck.codegen.compiler.symbols); if that one fails, or can't be renamed, this one is compiled itself."""
        self._submitted += 1
        name_free = getattr(compiler, "name_free", None)  # (duck-typed compilers have none)
        shape = None if name_free is None else name_free(src)
        if shape is None:
            return self._submit(compiler, src)
        body, name = shape
        key = (type(compiler).__qualname__, compiler.name, tuple(compiler.flags), body)
        with self._lock:
            hit = self._bodies.get(key)
            if hit is not None:
                self._bodies.move_to_end(key)
                self._shared += 1
        if hit is not None:
            return self._renamed(compiler, src, hit, name)
        fut = self._submit(compiler, src)
        with self._lock:
            self._bodies[key] = (name, fut)
            if len(self._bodies) > SHARED_BODIES:
                self._bodies.popitem(last=False)
        return fut

    def _renamed(self, compiler: Compiler, src: str, base: tuple[str, Future[bytes]], name: str) -> Future[bytes]:
        base_name, base_fut = base
        out = _Renamed()
        out.base = base_fut
        out.set_running_or_notify_cancel()

        def forward(f: Future[bytes]) -> None:
            if f.cancelled():
                out.cancel()
            elif (e := f.exception()) is not None:
                out.set_exception(e)
            else:
                out.set_result(f.result())

        def done(f: Future[bytes]) -> None:
            lib = None if f.cancelled() or f.exception() is not None else rename_symbol(f.result(), base_name, name)
            if lib is not None:
                out.set_result(lib)
            else:  # (its own error, or an object this can't rename: compiled as if it were the first)
                self._submit(compiler, src).add_done_callback(forward)

        base_fut.add_done_callback(done)
        return out

    def _submit(self, compiler: Compiler, src: str) -> Future[bytes]:
        if getattr(compiler, "worker_recipe", None) is None:
            return self._threads.submit(self._compile_local, compiler, src)
        with self._lock:
            if self._lanes is None:
                self._lanes = [_Lane(self, i) for i in range(self.lanes)]
        fut = _Queued()
        job = fut.job = _Job(compiler, src, fut)
        with self._lock:
            self._prune()
            self._queued.append(job)
        self._jobs.put(job)
        return fut

    def result(self, fut: Future[bytes]) -> bytes:
        """The object of a Future `submit` returned. A compile no lane has started yet is done on the calling thread
        (the caller would only wait for it otherwise: with `default_lanes(spare_caller=True)` lanes, the caller is
        the lane of its core once it has nothing else to do); so is the compile of the object a renamed one waits
        for."""
        base = getattr(fut, "base", None)
        if base is not None:
            self.result(base)
        job = getattr(fut, "job", None)
        if job is not None and job.taken.acquire(blocking=False) and job.future.set_running_or_notify_cancel():
            self._compile_here(job)
        while not fut.done() and (other := self._steal()) is not None:
            self._compile_here(other)
        with self._lock:
            self._prune()
        return fut.result()

    def _prune(self) -> None:
        """Drop the jobs the lanes took from the head of `_queued` (they take them in order), so it holds no
        finished job's source and object for long (called with the pool's lock held)."""
        while self._queued and self._queued[0].taken.locked():
            self._queued.popleft()

    def _steal(self) -> _Job | None:
        """The most recently submitted job no lane has taken yet, taken for the caller (None if there is none). A
        caller waiting for one object compiles the queue's tail meanwhile, while the lanes work from its head: a
        cold CNN step's lowering ends ~0.7 s of LLVM work ahead of the one worker beside it, and its thread would
        otherwise only wait for that."""
        while True:
            with self._lock:
                if not self._queued:
                    return None
                job = self._queued.pop()
            if job.taken.acquire(blocking=False):
                if job.future.set_running_or_notify_cancel():
                    return job

    def start_workers(self) -> None:
        """Start every lane's worker process now (they boot while the caller goes on); done by the first cache miss
        of a compiler with a worker recipe, and at most once."""
        with self._lock:
            if self._lanes is None:
                self._lanes = [_Lane(self, i) for i in range(self.lanes)]
            if self._spawned:
                return
            self._spawned = True
            for ln in self._lanes:
                ln.spawn()
            atexit.register(self._stop_workers)

    def wait_ready(self, timeout: float) -> bool:
        """Whether every lane's worker is up (waiting at most `timeout` seconds in all): tests use it."""
        deadline = time.monotonic() + timeout
        return all(ln.up.wait(max(0.0, deadline - time.monotonic())) and not ln.dead for ln in self._lanes or [])

    def workers(self) -> list[_Worker]:
        """The lanes' worker processes (none before the first cache miss)."""
        return [ln.worker for ln in self._lanes or [] if ln.worker is not None]

    def shutdown(self) -> None:
        """Finish the queued compiles, then stop the lanes and their worker processes (also done at exit)."""
        lanes = self._lanes or []
        for _ in lanes:
            self._jobs.put(None)
        for ln in lanes:
            ln.feeder.join()
        self._stop_workers()
        for ln in lanes:
            if ln.reader is not None:
                ln.reader.join()
        atexit.unregister(self._stop_workers)
        self._threads.shutdown(wait=True)

    def _stop_workers(self) -> None:
        self._closing = True
        for w in self.workers():
            w.close()

    def _compile_local(self, compiler: Compiler, src: str) -> bytes:
        t = time.thread_time()
        try:
            return compiler.compile(src)
        finally:
            with self._lock:
                self._local_cpu_s += time.thread_time() - t
                self._local_objects += 1

    def _compile_here(self, job: _Job) -> None:
        try:
            job.future.set_result(self._compile_local(job.compiler, job.src))
        except BaseException as e:  # the compiler's error goes to whoever waits for the object
            job.future.set_exception(e)

    def stats(self) -> dict[str, float]:
        """Lanes, sources submitted, those of them whose object was another's renamed (`shared`), CPU seconds spent
        compiling (in this process, cache lookups included, and in the workers), objects the workers built and compiles
        done in this process: what a benchmark reports."""
        ws = self.workers()
        worker_cpu = sum(w.cpu_s for w in ws)
        return {"lanes": self.lanes, "submitted": self._submitted, "shared": self._shared,
                "cpu_s": self._local_cpu_s + worker_cpu,
                "worker_cpu_s": worker_cpu, "worker_objects": sum(w.compiled for w in ws),
                "local_objects": self._local_objects}  # fmt: skip


__all__ = ["CompilePool", "WorkerError", "WorkerRecipe", "default_lanes", "import_whole", "serve"]
