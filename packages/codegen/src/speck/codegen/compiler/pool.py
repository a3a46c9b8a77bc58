"""`CompilePool`: compiles many sources at once on several lanes, some of them in worker processes.

llvmlite runs one call into LLVM at a time per process (a global lock), so LLVM compiles on several threads of one
process still queue behind each other. A compiler that can be rebuilt elsewhere (it has a `worker_recipe()`
returning a `WorkerRecipe`) is therefore compiled on lanes 1.. in worker processes, and on lane 0 in this process;
other compilers (gcc/clang run as subprocesses already) compile on every lane's thread. A cold CNN training step
lowers its kernels on the main thread while LLVM compiles them: with one LLVM lane, LLVM (about 3 s of CPU for
103 kernels) was the critical path; with one lane per core both cores stay busy until the last object is done.

A worker is started the first time its lane gets a task and compiles nothing until it has booted: meanwhile its
lane compiles in this process (no slower than a single lane). The worker is a fresh interpreter (not a fork: the
parent has threads) that imports only the compiler modules, rebuilds the compiler from the recipe, checks that its
`flags` (the cache key's compiler identity: LLVM version, CPU, features, passes) equal the parent's, and then
answers (recipe, source) -> object bytes over pipes. Caching stays in this process (`Compiler.compile`). A
compiler's own error comes back as the same CompileError; a worker that dies or disagrees on flags is never used
again and its lane compiles in this process, so objects are always exactly what `compiler.compile` returns."""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from speck.codegen.compiler.base import CompileError, Compiler

DEFAULT_MAX_LANES = 4  # lanes by default: one per usable core, at most this many (each worker holds an LLVM)


def default_lanes() -> int:
    """One lane per core this process may run on, at most DEFAULT_MAX_LANES."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, DEFAULT_MAX_LANES))


@dataclass(frozen=True)
class WorkerRecipe:
    """How a worker process rebuilds a compiler: `module.cls(**kwargs)` with `env` set first; the result's `flags`
    must equal `flags` (else the worker refuses to compile: it would not build the same objects)."""

    module: str
    cls: str
    kwargs: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]

    def build(self) -> Compiler:
        os.environ.update(dict(self.env))
        compiler: Compiler = getattr(importlib.import_module(self.module), self.cls)(**dict(self.kwargs))
        if tuple(compiler.flags) != self.flags:
            raise RuntimeError(f"the worker's {self.cls} has flags {compiler.flags}, the parent's {self.flags}")
        return compiler


class WorkerError(RuntimeError):
    """A worker process died, could not start, or could not rebuild the compiler."""


# The worker's bootstrap: the parent's import path, and speck.codegen / speck.codegen.compiler registered without
# running their __init__ (which imports every renderer, the interpreter and numpy): the worker needs only the
# compiler modules, and a light import keeps its start-up cheap next to the compiles it takes over.
_BOOT = """
import sys, types
sys.path[:] = {path!r}
for name, path in {packages!r}:
    module = types.ModuleType(name)
    module.__path__ = path
    sys.modules[name] = module
from speck.codegen.compiler.pool import serve
serve()
"""


def serve() -> None:
    """A worker's main loop: answer pickled (recipe, source) requests from stdin on stdout until stdin closes."""
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the reply stream
    pickle.dump(("ready", os.getpid()), out)
    out.flush()
    compilers: dict[WorkerRecipe, Compiler] = {}
    while True:
        try:
            recipe, src = pickle.load(inp)
        except EOFError:
            return
        try:
            compiler = compilers.get(recipe)
            if compiler is None:
                compiler = compilers[recipe] = recipe.build()
            t = time.thread_time()
            lib = compiler.compile_uncached(src)
            reply: tuple[Any, ...] = ("ok", lib, time.thread_time() - t)
        except CompileError as e:
            reply = ("compile_error", e.compiler, e.diagnostics)
        except Exception as e:  # anything else means this worker can't stand in for the parent's compiler
            reply = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(reply, out)
        out.flush()


class _Worker:
    """One worker process, used by one lane thread at a time."""

    def __init__(self) -> None:
        import speck.codegen
        import speck.codegen.compiler

        packages = [(m.__name__, list(m.__path__)) for m in (speck.codegen, speck.codegen.compiler)]
        boot = _BOOT.format(path=[p for p in sys.path if isinstance(p, str)], packages=packages)
        # site still runs: import hooks of editable installs come from its .pth files
        self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self.owner = os.getpid()  # a forked child must not talk to its parent's worker
        self.booted = False
        self.dead = False
        self.compiled = 0  # objects it returned
        self.cpu_s = 0.0  # CPU seconds it spent compiling them

    def ready(self, timeout: float = 0.0) -> bool:
        """True once the worker has said it is up; waits at most `timeout` seconds for that (0: never blocks). A
        worker that failed to start, and any worker seen from a forked child of its parent, is never ready."""
        if self.booted or self.dead or os.getpid() != self.owner:
            return self.booted and not self.dead and os.getpid() == self.owner
        if not select.select([self.stdout], [], [], timeout)[0]:
            return False
        try:
            self.booted = self._receive()[0] == "ready"
        except WorkerError:
            self.booted = False
        self.dead = not self.booted
        return self.booted

    def _receive(self) -> tuple[Any, ...]:
        try:
            reply: tuple[Any, ...] = pickle.load(self.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            self.dead = True
            raise WorkerError(f"compile worker {self.proc.pid} stopped (exit code {self.proc.poll()}): {e!r}") from e
        return reply

    def compile(self, recipe: WorkerRecipe, src: str) -> bytes:
        """The object of `src` compiled by the recipe's compiler in the worker; CompileError as the compiler raises
        it, WorkerError when the worker can't do it (it is then dead for good)."""
        try:
            pickle.dump((recipe, src), self.stdin)
            self.stdin.flush()
        except OSError as e:
            self.dead = True
            raise WorkerError(f"compile worker {self.proc.pid} is gone: {e!r}") from e
        reply = self._receive()
        if reply[0] == "ok":
            self.compiled += 1
            self.cpu_s += float(reply[2])
            return bytes(reply[1])
        if reply[0] == "compile_error":
            raise CompileError(reply[1], reply[2], src)
        self.dead = True
        raise WorkerError(f"compile worker {self.proc.pid} could not compile: {reply[-1]}")

    def close(self) -> None:
        try:
            self.stdin.close()
            self.proc.wait(timeout=2)
        except Exception:  # exiting anyway: a worker that does not stop on EOF is killed
            self.proc.kill()


class _ViaWorker(Compiler):
    """`compiler` with compile_uncached done by a worker: Compiler.compile's caching, the same cache entries."""

    def __init__(self, compiler: Compiler, worker: _Worker, recipe: WorkerRecipe) -> None:
        self.inner, self.worker, self.recipe = compiler, worker, recipe
        self.name, self.flags = compiler.name, compiler.flags

    def cache_key(self, src: str) -> str:
        return self.inner.cache_key(src)

    def disk_cache(self) -> Any:
        return self.inner.disk_cache()

    def compile_uncached(self, src: str) -> bytes:
        if not self.worker.dead:
            try:
                return self.worker.compile(self.recipe, src)
            except WorkerError as e:
                from speck.uop import DEBUG

                if DEBUG >= 1:
                    print(f"speck.codegen: {e}; compiling in this process from now on")
        return self.inner.compile_uncached(src)


class CompilePool:
    """Compiles (compiler, source) pairs on `lanes` threads; see the module docstring for which lanes use worker
    processes. `submit` returns a Future of the object bytes (or of the compiler's CompileError)."""

    def __init__(self, lanes: int | None = None) -> None:
        self.lanes = default_lanes() if lanes is None else max(1, lanes)
        self._executor = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix="speck-compile")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._next_lane = 0
        self._workers: dict[int, _Worker] | None = None  # lane -> its worker, once started
        self._local_cpu_s = 0.0  # CPU seconds of the compiles done in this process (their lane threads)
        self._submitted = 0

    def submit(self, compiler: Compiler, src: str) -> Future[bytes]:
        if self._workers is None and getattr(compiler, "worker_recipe", None) is not None:
            self.start_workers()
        self._submitted += 1
        return self._executor.submit(self._compile, compiler, src)

    def start_workers(self) -> None:
        """Start the worker processes of lanes 1.. now (they boot while the lanes compile here); done by the first
        submit of a compiler with a worker recipe, and at most once."""
        with self._lock:
            if self._workers is not None:
                return
            self._workers = {}
            for lane in range(1, self.lanes):
                try:
                    w = _Worker()
                except OSError:  # no process could be started: that lane compiles in this process
                    continue
                atexit.register(w.close)
                self._workers[lane] = w

    def shutdown(self) -> None:
        """Finish the queued compiles, then stop the lanes and their worker processes (also done at exit)."""
        self._executor.shutdown(wait=True)
        for w in self.workers():
            w.close()
            atexit.unregister(w.close)

    def workers(self) -> list[_Worker]:
        """The workers started so far, by lane."""
        return [w for _, w in sorted((self._workers or {}).items())]

    def _lane(self) -> int:
        lane: int | None = getattr(self._local, "lane", None)
        if lane is None:
            with self._lock:
                lane = self._local.lane = self._next_lane
                self._next_lane += 1
        return lane

    def _compile(self, compiler: Compiler, src: str) -> bytes:
        lane = self._lane()
        recipe = getattr(compiler, "worker_recipe", None)
        worker = None if recipe is None or self._workers is None else self._workers.get(lane)
        if recipe is not None and worker is not None and worker.ready():
            return _ViaWorker(compiler, worker, recipe()).compile(src)
        t = time.thread_time()  # lane 0, no recipe, or a worker still booting: compile here
        try:
            return compiler.compile(src)
        finally:
            with self._lock:
                self._local_cpu_s += time.thread_time() - t

    def stats(self) -> dict[str, float]:
        """Lanes, sources submitted, CPU seconds spent compiling (in this process's lane threads, cache lookups
        included, and in the workers) and objects the workers built: what a benchmark reports."""
        ws = self.workers()
        return {
            "lanes": self.lanes,
            "submitted": self._submitted,
            "cpu_s": self._local_cpu_s + sum(w.cpu_s for w in ws),
            "worker_cpu_s": sum(w.cpu_s for w in ws),
            "worker_objects": sum(w.compiled for w in ws),
        }


__all__ = ["CompilePool", "WorkerError", "WorkerRecipe", "default_lanes", "serve"]
