"""speck.codegen.compiler.pool: LLVM compiles in worker processes. Objects must be byte for byte what the compiler
builds in this process (cache entries included), a compiler error must come back as the same CompileError, and a
worker that never starts, dies or disagrees on flags must never change a result (its lane compiles here)."""

from __future__ import annotations

import pathlib
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import wait

import pytest

from speck.codegen.compiler import ClangCompiler, CompileError, LLVMCompiler, pool
from speck.codegen.compiler.pool import CompilePool, WorkerRecipe

needs_cc = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler")
BOOT_TIMEOUT = 120.0  # seconds a worker may take to start on a loaded machine (only a bound, never a measurement)
BAD_IR = "define void @f() {\nentry:\n  %x = add i32 %nope, 1\n  ret void\n}\n"


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
def new_pool() -> Iterator[Callable[[int], CompilePool]]:
    """CompilePool(lanes), shut down (workers stopped) after the test."""
    made: list[CompilePool] = []

    def make(lanes: int) -> CompilePool:
        made.append(CompilePool(lanes))
        return made[-1]

    yield make
    for p in made:
        p.shutdown()


def compile_all(p: CompilePool, c: LLVMCompiler, srcs: list[str]) -> list[bytes]:
    return [f.result() for f in [p.submit(c, s) for s in srcs]]


def test_workers_build_the_same_objects(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    p = new_pool(2)
    p.start_workers()
    assert p.wait_ready(BOOT_TIMEOUT), "the compile workers did not start"
    srcs = [scaled_ir(k) for k in range(12)]
    assert compile_all(p, c, srcs) == [c.compile_uncached(s) for s in srcs]
    workers = p.workers()
    assert len(workers) == 2 and sum(w.compiled for w in workers) == len(srcs)  # all of them, in the workers
    st = p.stats()
    assert st["submitted"] == len(srcs) and st["worker_objects"] == len(srcs) and 0 < st["worker_cpu_s"] <= st["cpu_s"]
    pids = [w.proc.pid for w in workers]
    more = [scaled_ir(k) for k in range(20, 24)]
    assert compile_all(p, c, more) == [c.compile_uncached(s) for s in more]
    assert [w.proc.pid for w in p.workers()] == pids  # reused, not restarted
    p.shutdown()
    assert all(w.proc.poll() is not None for w in workers)  # stopped with their pool


def test_cache_is_read_and_written_here(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    p = new_pool(1)
    p.start_workers()
    assert p.wait_ready(BOOT_TIMEOUT)
    src = scaled_ir(7)
    lib = p.submit(c, src).result()
    assert c.disk_cache().get(c.cache_key(src)) == lib == c.compile_uncached(src)  # the entry compile() would read
    (w,) = p.workers()
    assert p.submit(c, src).result() == lib and w.compiled == 1  # the second time from the cache, not the worker


def test_the_worker_writes_the_entry_of_what_it_built(
    new_pool: Callable[[int], CompilePool], monkeypatch: pytest.MonkeyPatch, private_cache: pathlib.Path
) -> None:
    """The worker writes the cache entry of an object it built, before answering (so it is there once the future
    is), and this process writes none: its lane threads doing file I/O and hashing took the GIL from the lowering
    thread again and again. The entry is the one Compiler.compile would write and read."""
    from speck.codegen.cache import DiskCache

    c = LLVMCompiler()
    p = new_pool(1)
    p.start_workers()
    assert p.wait_ready(BOOT_TIMEOUT)
    here: list[str] = []
    real_put = DiskCache.put
    monkeypatch.setattr(DiskCache, "put", lambda self, key, data: here.append(key) or real_put(self, key, data))
    srcs = [scaled_ir(k) for k in range(30, 34)]
    libs = compile_all(p, c, srcs)
    assert here == []
    assert [c.disk_cache().get(c.cache_key(s)) for s in srcs] == libs == [c.compile_uncached(s) for s in srcs]
    assert all((private_cache / "compile" / "llvm" / c.cache_key(s)).is_file() for s in srcs)
    (w,) = p.workers()
    assert compile_all(p, c, srcs) == libs and w.compiled == len(srcs)  # read back from the cache


def test_compile_error_is_the_compilers(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    with pytest.raises(CompileError) as here:
        c.compile_uncached(BAD_IR)
    p = new_pool(1)
    p.start_workers()
    assert p.wait_ready(BOOT_TIMEOUT)
    with pytest.raises(CompileError) as there:
        p.submit(c, BAD_IR).result()
    assert str(there.value) == str(here.value)
    (w,) = p.workers()
    assert w.proc.poll() is None and w.compiled == 0  # a bad source is the caller's problem, not the worker's
    assert p.submit(c, scaled_ir(1)).result() == c.compile_uncached(scaled_ir(1)) and w.compiled == 1


def test_a_waiting_caller_compiles_what_no_lane_has_taken(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    p = new_pool(1)
    srcs = [scaled_ir(k) for k in range(40, 52)]
    futs = [p.submit(c, s) for s in srcs]
    # the lane's worker is still starting (its feeder holds the first source): the others wait on the queue, and a
    # caller asking for one compiles it itself
    got = [p.result(f) for f in reversed(futs)][::-1]
    assert got == [c.compile_uncached(s) for s in srcs]
    st = p.stats()
    assert st["local_objects"] >= 1 and st["worker_objects"] + st["local_objects"] == len(srcs)  # each one once


def test_flags_mismatch_is_refused_and_the_lane_compiles_here(
    new_pool: Callable[[int], CompilePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = LLVMCompiler()
    r = c.worker_recipe()
    wrong = WorkerRecipe(r.module, r.cls, r.kwargs, (("SPECK_LLVM_UNROLL_THRESHOLD", "17"),), r.flags)
    monkeypatch.setattr(c, "worker_recipe", lambda: wrong)
    p = new_pool(1)
    srcs = [scaled_ir(k) for k in range(4)]
    assert compile_all(p, c, srcs) == [LLVMCompiler().compile_uncached(s) for s in srcs]
    (w,) = p.workers()
    assert w.compiled == 0  # the worker built no object: its compiler would differ


def test_dead_worker_falls_back_to_this_process(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    p = new_pool(1)
    p.start_workers()
    assert p.wait_ready(BOOT_TIMEOUT)
    (w,) = p.workers()
    w.proc.kill()
    w.proc.wait()
    srcs = [scaled_ir(k) for k in range(30, 35)]
    assert compile_all(p, c, srcs) == [c.compile_uncached(s) for s in srcs]
    assert w.compiled == 0


def test_worker_that_fails_to_start_is_never_used(
    new_pool: Callable[[int], CompilePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "_BOOT", "raise SystemExit(3)  # {path} {packages}")  # exits before saying ready
    c = LLVMCompiler()
    p = new_pool(2)
    srcs = [scaled_ir(k) for k in range(40, 44)]
    assert compile_all(p, c, srcs) == [c.compile_uncached(s) for s in srcs]
    assert not p.wait_ready(0) and all(w.compiled == 0 for w in p.workers())


@needs_cc
def test_compilers_without_a_recipe_start_no_worker(new_pool: Callable[[int], CompilePool]) -> None:
    c = ClangCompiler()
    assert getattr(c, "worker_recipe", None) is None
    srcs = [f"void f(float *o, int s, int e) {{ for (int i = s; i < e; i++) o[i] = {k}.0f; }}\n" for k in range(4)]
    p = new_pool(2)
    assert [f.result() for f in [p.submit(c, s) for s in srcs]] == [c.compile_uncached(s) for s in srcs]
    assert p.workers() == []


def test_a_warm_cache_starts_no_worker(new_pool: Callable[[int], CompilePool]) -> None:
    c = LLVMCompiler()
    srcs = [scaled_ir(k) for k in range(50, 53)]
    want = [c.compile(s) for s in srcs]  # cached now
    p = new_pool(2)
    assert compile_all(p, c, srcs) == want
    assert p.workers() == []  # every object came from the cache: no process was started
    new = scaled_ir(60)
    assert p.submit(c, new).result() == c.compile_uncached(new)
    assert len(p.workers()) == 2  # the first miss starts them


def test_an_llvm_worker_boots_light() -> None:
    """A worker rebuilding LLVMCompiler from its recipe (which names no package to import whole) imports only the
    compiler modules: not numpy, the x86 backend, the optimizer or the lowering passes. A cold CNN step starts two
    workers beside the lowering; importing all of speck.codegen cost each ~0.4 s CPU and ~1 s before its first
    compile."""
    import pickle
    import subprocess
    import sys

    recipe = LLVMCompiler().worker_recipe()
    assert recipe.packages == ()
    heavy = ["numpy", "speck.codegen.x86.select", "speck.codegen.opt.heuristic", "speck.codegen.lower.expander",
             "speck.codegen.renderer.llvmir", "speck.codegen.pipeline"]  # fmt: skip
    tail = (
        "import pickle\n"
        f"compiler = pickle.loads({pickle.dumps(recipe)!r}).build()\n"
        "assert compiler.compile_uncached('define void @f() {\\nentry:\\n  ret void\\n}\\n')\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    boot = pool._BOOT.format(path=[p for p in sys.path if isinstance(p, str)],
                             packages=[(n, pool._package_path(n)) for n in pool._LIGHT])  # fmt: skip
    assert "serve()" in boot
    script = boot.replace("from speck.codegen.compiler.pool import serve\nserve()", tail)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=BOOT_TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_waiting_caller_compiles_the_queue_tail_meanwhile(
    new_pool: Callable[[int], CompilePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller whose object a lane is still building compiles the untaken jobs from the newest back, and each
    object is still built exactly once and byte-identical. The 'lane' here is a thread of the test holding the
    first job until every other one is done, so what the caller takes does not depend on timing."""

    class NoLane:  # no feeder: nothing leaves the queue but what the test or the caller takes
        worker = reader = None

        def __init__(self, pool: CompilePool, index: int) -> None:
            self.feeder = threading.Thread(target=lambda: None)
            self.feeder.start()

    monkeypatch.setattr(pool, "_Lane", NoLane)
    c = LLVMCompiler()
    p = new_pool(1)
    srcs = [scaled_ir(k) for k in range(60, 66)]
    futs = [p.submit(c, s) for s in srcs]
    first = futs[0].job  # type: ignore[attr-defined]
    assert first.taken.acquire(blocking=False) and first.future.set_running_or_notify_cancel()
    order: list[int] = []
    for i, f in enumerate(futs[1:], 1):
        f.add_done_callback(lambda _f, i=i: order.append(i))

    def lane() -> None:  # finishes the first job once the caller has compiled all the others (or gave up on it)
        wait(futs[1:], timeout=BOOT_TIMEOUT)  # (a bound so that a caller that does not steal fails, not hangs)
        first.future.set_result(c.compile_uncached(srcs[0]))

    t = threading.Thread(target=lane)
    t.start()
    got = p.result(futs[0])
    t.join()
    assert got == c.compile_uncached(srcs[0])
    assert order == list(range(len(srcs) - 1, 0, -1))  # newest first: the lanes work from the other end
    assert [f.result() for f in futs[1:]] == [c.compile_uncached(s) for s in srcs[1:]]
    assert p.stats()["local_objects"] == len(srcs) - 1 and not p._queued  # each once; nothing kept
