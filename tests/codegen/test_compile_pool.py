"""speck.codegen.compiler.pool: compiling on several lanes, LLVM in worker processes. Objects must be byte for byte
what the compiler builds in this process (cache entries included), a compiler error must come back as the same
CompileError, and a worker that dies or disagrees on flags must never change a result (its lane compiles here)."""

from __future__ import annotations

import pathlib
import shutil
import threading
from collections.abc import Callable, Iterator

import pytest

from speck.codegen.compiler import ClangCompiler, CompileError, Compiler, LLVMCompiler, pool
from speck.codegen.compiler.pool import CompilePool, WorkerError, WorkerRecipe, _ViaWorker, _Worker

needs_cc = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler"
)
BOOT_TIMEOUT = 120.0  # seconds a worker may take to start on a loaded machine (only a bound, never a measurement)


def scaled_ir(k: int) -> str:
    """A small kernel whose constant differs per k, so every source (and object) is distinct."""
    return f"""
define void @scale{k}(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {{
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %pa = getelementptr <8 x float>, ptr %a, i32 %i
  %va = load <8 x float>, ptr %pa
  %r = fmul <8 x float> %va, <float {k}.0, float 1.0, float 2.0, float 3.0, float 4.0, float 5.0, float 6.0, float 7.0>
  %q = getelementptr <8 x float>, ptr %o, i32 %i
  store <8 x float> %r, ptr %q
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield tmp_path


@pytest.fixture
def worker() -> Iterator[_Worker]:
    w = _Worker()
    assert w.ready(BOOT_TIMEOUT), "the compile worker did not start"
    yield w
    w.close()


def test_worker_builds_the_same_objects(worker: _Worker) -> None:
    c = LLVMCompiler()
    for k in range(3):
        src = scaled_ir(k)
        assert worker.compile(c.worker_recipe(), src) == c.compile_uncached(src)


def test_worker_object_goes_into_the_parents_cache(worker: _Worker, private_cache: pathlib.Path) -> None:
    c = LLVMCompiler()
    src = scaled_ir(7)
    lib = _ViaWorker(c, worker, c.worker_recipe()).compile(src)
    assert c.disk_cache().get(c.cache_key(src)) == lib  # the entry an in-process compile would read
    assert lib == c.compile_uncached(src)


def test_worker_compile_error_is_the_compilers(worker: _Worker) -> None:
    c = LLVMCompiler()
    bad = "define void @f() {\nentry:\n  %x = add i32 %nope, 1\n  ret void\n}\n"
    with pytest.raises(CompileError) as here:
        c.compile_uncached(bad)
    with pytest.raises(CompileError) as there:
        worker.compile(c.worker_recipe(), bad)
    assert str(there.value) == str(here.value)
    assert not worker.dead  # a bad source is the caller's problem, not the worker's


def test_flags_mismatch_is_refused_and_the_lane_compiles_here(worker: _Worker) -> None:
    c = LLVMCompiler()
    r = c.worker_recipe()
    wrong = WorkerRecipe(r.module, r.cls, r.kwargs, (("SPECK_LLVM_UNROLL_THRESHOLD", "17"),), r.flags)
    with pytest.raises(WorkerError, match="flags"):
        worker.compile(wrong, scaled_ir(1))
    assert worker.dead
    src = scaled_ir(2)
    assert _ViaWorker(c, worker, r).compile_uncached(src) == c.compile_uncached(src)


def test_dead_worker_falls_back_to_this_process(worker: _Worker) -> None:
    c = LLVMCompiler()
    worker.proc.kill()
    worker.proc.wait()
    src = scaled_ir(3)
    assert _ViaWorker(c, worker, c.worker_recipe()).compile_uncached(src) == c.compile_uncached(src)
    assert worker.dead


class _Gate(Compiler):
    """A compiler (no worker recipe) whose compile waits for an event: it holds the lane that runs it."""

    name = "gate"

    def __init__(self) -> None:
        self.event = threading.Event()

    def compile(self, src: str) -> bytes:
        assert self.event.wait(BOOT_TIMEOUT)
        return b"gate"


@pytest.fixture
def new_pool() -> Iterator[Callable[[int], CompilePool]]:
    """CompilePool(lanes), shut down (workers stopped) after the test."""
    made: list[CompilePool] = []

    def make(lanes: int) -> CompilePool:
        made.append(CompilePool(lanes))
        return made[-1]

    yield make
    for p in made:
        p.shutdown()


def test_pool_results_match_in_process_compiles(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    srcs = [scaled_ir(k) for k in range(12)]
    pool = new_pool(2)
    got = [f.result() for f in [pool.submit(c, s) for s in srcs]]
    assert got == [c.compile_uncached(s) for s in srcs]
    assert len(pool.workers()) == 1  # lane 0 is this process, lane 1 has one worker


def test_pool_compiles_on_its_worker_once_booted(new_pool: Callable[[int], CompilePool]) -> None:
    pool = new_pool(2)
    gate = _Gate()
    held = pool.submit(gate, "")  # the first task run makes its thread lane 0 and keeps it busy
    pool.start_workers()
    (worker,) = pool.workers()
    assert worker.ready(BOOT_TIMEOUT)
    c = LLVMCompiler()
    srcs = [scaled_ir(k) for k in range(20, 26)]
    got = [f.result() for f in [pool.submit(c, s) for s in srcs]]  # all on lane 1: its worker
    gate.event.set()
    assert held.result() == b"gate"
    assert got == [c.compile_uncached(s) for s in srcs]
    assert worker.compiled == len(srcs)
    st = pool.stats()
    assert st["submitted"] == len(srcs) + 1 and st["worker_objects"] == len(srcs)
    assert 0 < st["worker_cpu_s"] <= st["cpu_s"]
    pid = worker.proc.pid
    more = [scaled_ir(k) for k in range(30, 34)]
    assert [f.result() for f in [pool.submit(c, s) for s in more]] == [c.compile_uncached(s) for s in more]
    assert [w.proc.pid for w in pool.workers()] == [pid]  # reused, not restarted
    pool.shutdown()
    assert worker.proc.poll() is not None  # the worker stopped with its pool


@needs_cc
def test_compilers_without_a_recipe_start_no_worker(new_pool: Callable[[int], CompilePool]) -> None:
    c = ClangCompiler()
    assert getattr(c, "worker_recipe", None) is None
    srcs = [f"void f(float *o, int s, int e) {{ for (int i = s; i < e; i++) o[i] = {k}.0f; }}\n" for k in range(4)]
    pool = new_pool(2)
    assert [f.result() for f in [pool.submit(c, s) for s in srcs]] == [c.compile_uncached(s) for s in srcs]
    assert pool.workers() == []


def test_worker_that_fails_to_start_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "_BOOT", "raise SystemExit(3)  # {path} {packages}")  # exits before saying ready
    w = _Worker()
    assert not w.ready(BOOT_TIMEOUT)
    assert w.dead
    c = LLVMCompiler()
    src = scaled_ir(5)
    assert _ViaWorker(c, w, c.worker_recipe()).compile(src) == c.compile_uncached(src)
    w.close()
