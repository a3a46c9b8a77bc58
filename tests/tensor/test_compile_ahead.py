"""Compiling a schedule's kernels ahead (speck.tensor.realize._compile_ahead): lowering happens up front, objects
come from a background thread. The objects are byte-identical to serial compiles and the results equal numpy; a
compile error raised in the background surfaces where the kernel runs, with the serial error's message, after the
kernels before it ran; a lowering error is likewise left to the point the kernel is needed."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import speck.codegen.program as program_mod
import speck.tensor.realize as R
from speck.codegen.compiler import CompileError
from speck.hcq import Device
from speck.tensor import GlobalCounters, Tensor


@pytest.fixture(autouse=True)
def fresh_programs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every kernel compiles again (empty program cache, empty disk cache) and compile-ahead is on."""
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
    monkeypatch.setattr(R, "_ahead", {})
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 1)
    yield


class SpyCompiler:
    """Wraps the device's compiler: records which thread compiled which kernel, and rejects one kernel by name."""

    def __init__(self, inner: Any, reject: str | None = None) -> None:
        self.inner, self.reject = inner, reject
        self.calls: list[tuple[str, str]] = []  # (kernel name, thread name)

    def compile(self, src: str) -> bytes:
        name = src.split("\n", 1)[0].removeprefix("; kernel ").strip()
        self.calls.append((name, threading.current_thread().name))
        if name == self.reject:
            raise CompileError("spy", f"kernel {name} rejected on purpose", src)
        return bytes(self.inner.compile(src))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> SpyCompiler:
    backend = Device["CPU"].backend
    s = SpyCompiler(backend.compiler)
    monkeypatch.setattr(backend, "_compiler", s)
    monkeypatch.setattr(backend, "quick", None)  # (every kernel through the spy, small ones too)
    return s


def softmax_net(seed: int) -> tuple[Tensor, np.ndarray]:
    """A few dependent kernels (matmul, row max, exp-sum, normalize) and numpy's answer."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    h = Tensor(a) @ Tensor(w)
    out = (h - h.max(axis=1, keepdim=True)).exp()
    out = out / out.sum(axis=1, keepdim=True)
    z = a @ w
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return out, e / e.sum(axis=1, keepdims=True)


def test_ahead_compiled_objects_equal_serial_ones(spy: SpyCompiler) -> None:
    out, want = softmax_net(0)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    progs = [p for p in R._program_cache.values() if isinstance(p, R.Kernel)]
    assert len(progs) >= 2
    background = [n for n, t in spy.calls if t.startswith("speck-compile")]
    assert len(background) >= 2  # the kernels of the schedule went through the compile thread
    assert not R._ahead  # every kernel compiled ahead was picked up
    for p in progs:
        assert p.spec.lib == spy.inner.compile_uncached(p.spec.src)  # byte-identical to a serial compile


def test_serial_mode_compiles_on_the_calling_thread(spy: SpyCompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 0)
    out, want = softmax_net(1)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    assert spy.calls and all(t == threading.current_thread().name for _, t in spy.calls)


def _kernel_order(seed: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the kernels the schedule of softmax_net(seed) compiles, in run order (a serial dry run)."""
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 0)
    dry = SpyCompiler(Device["CPU"].compiler)
    with monkeypatch.context() as m:
        m.setattr(Device["CPU"].backend, "_compiler", dry)
        m.setattr(Device["CPU"].backend, "quick", None)
        m.setattr(R, "_program_cache", R.ProgramCache(1024))
        softmax_net(seed)[0].numpy()
    return [n for n, _ in dry.calls]


def _failure(seed: int, reject: str, threads: int, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int, list[Any]]:
    """(error message, kernels run before it, compile calls) of running softmax_net(seed) with `reject` failing."""
    s = SpyCompiler(Device["CPU"].compiler, reject=reject)
    monkeypatch.setattr(Device["CPU"].backend, "_compiler", s)
    monkeypatch.setattr(Device["CPU"].backend, "quick", None)
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
    monkeypatch.setattr(R, "_ahead", {})
    monkeypatch.setattr(R.COMPILE_THREADS, "value", threads)
    out, _ = softmax_net(seed)
    GlobalCounters.reset()
    with pytest.raises(CompileError) as ei:
        out.numpy()
    return str(ei.value), GlobalCounters.kernel_count, s.calls


def test_background_compile_error_surfaces_at_its_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    names = _kernel_order(2, monkeypatch)
    assert len(names) >= 3
    reject = names[-1]  # the last kernel: every other one runs first
    serial_msg, serial_ran, _ = _failure(2, reject, 0, monkeypatch)
    ahead_msg, ahead_ran, calls = _failure(2, reject, 1, monkeypatch)
    assert ahead_msg == serial_msg  # the same error, naming the kernel (its source's first line)
    assert f"kernel {reject} rejected on purpose" in ahead_msg and f"; kernel {reject}" in ahead_msg
    assert any(n == reject and t.startswith("speck-compile") for n, t in calls)  # it failed in the background
    assert ahead_ran == serial_ran == 0  # a plan is made whole before it runs: nothing ran


def test_lowering_error_is_raised_when_its_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    names = _kernel_order(3, monkeypatch)
    reject = names[1]
    real = program_mod.to_program

    def failing(ast: Any, *a: Any, **k: Any) -> Any:
        spec = real(ast, *a, **k)
        if spec.name == reject:
            raise RuntimeError(f"lowering {spec.name} failed on purpose")
        return spec

    monkeypatch.setattr(program_mod, "to_program", failing)
    results = []
    for threads in (0, 1):
        monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
        monkeypatch.setattr(R, "_ahead", {})
        monkeypatch.setattr(R.COMPILE_THREADS, "value", threads)
        out, _ = softmax_net(3)
        GlobalCounters.reset()
        with pytest.raises(RuntimeError, match=f"lowering {reject} failed on purpose") as ei:
            out.numpy()
        results.append((str(ei.value), GlobalCounters.kernel_count))
    assert results[0] == results[1] == (f"lowering {reject} failed on purpose", 0)  # raised before anything ran


def test_ahead_compiles_in_worker_processes_give_the_same_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.codegen.compiler.pool import CompilePool

    pool = CompilePool(2)
    pool.start_workers()
    assert pool.wait_ready(120), "the compile workers did not start"
    monkeypatch.setattr(R, "_compile_pool", pool)
    monkeypatch.setattr(pool, "_steal", lambda: None)  # the caller takes no job off the lanes: they build them all
    try:
        out, want = softmax_net(4)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    finally:
        pool.shutdown()
    progs = [p for p in R._program_cache.values() if isinstance(p, R.Kernel)]
    assert len(progs) >= 2 and sum(w.compiled for w in pool.workers()) == len(progs)  # all built by the workers
    backend = Device["CPU"].backend
    for p in progs:  # byte-identical to an in-process compile (with the compiler the backend picks for it)
        assert p.spec.lib == backend.compiler_for(p.spec).compile_uncached(p.spec.src)


def _same_body_pair(seed: int) -> tuple[list[np.ndarray], list[str]]:
    """Two elementwise kernels over 32 and 64 elements (bodies equal but for the name: the CPU ABI hands each call
    its slice) realized in one schedule: their results and the kernels' names."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(32).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    x, y = (Tensor(a) * 3 + 1).exp(), (Tensor(b) * 3 + 1).exp()
    Tensor.realize(x, y)
    names = sorted(p.spec.name for p in R._program_cache.values() if isinstance(p, R.Kernel))
    return [x.numpy(), y.numpy()], names


def test_kernels_equal_but_for_their_name_compile_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 0)  # each kernel compiled by itself
    serial, serial_names = _same_body_pair(4)
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 1)
    before = R.compile_pool_stats().get("shared", 0)
    shared, names = _same_body_pair(4)
    assert R.compile_pool_stats()["shared"] > before  # one of the two objects was the other's renamed
    assert names == serial_names and len(set(names)) == 2  # each kernel keeps its own name
    for got, want in zip(shared, serial, strict=True):
        np.testing.assert_array_equal(got, want)  # the same code: bit-identical results
    rng = np.random.default_rng(4)
    for got, n in zip(shared, (32, 64), strict=True):
        np.testing.assert_allclose(got, np.exp(rng.standard_normal(n).astype(np.float32) * 3 + 1), rtol=1e-5)
    for p in R._program_cache.values():
        if isinstance(p, R.Kernel):
            assert f"@{p.spec.name}(" in p.spec.src  # the source still describes the object it runs
