"""BEAM=n through the realize engine: candidates are timed on the kernel's own device (Device.time_program), the
winner is cached on disk and reused without timing, and results stay exact."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from speck.codegen.opt import Opt
from speck.hcq import Device
from speck.tensor import Context, Tensor
from speck.tensor import realize as R


@pytest.fixture
def fresh(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 0)
    return tmp_path


def _matmul(n: int, seed: int) -> tuple[Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    return Tensor(a).realize() @ Tensor(b).realize(), a @ b


def test_beam_times_candidates_on_the_device_and_caches_the_winner(fresh, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dev = Device["CPU"]
    timed: list[tuple[Opt, ...]] = []
    real = type(dev).time_program

    def spy(self, spec, runs=3):  # type: ignore[no-untyped-def]
        timed.append(spec.applied_opts)
        return real(self, spec, runs)

    monkeypatch.setattr(type(dev), "time_program", spy)
    out, want = _matmul(64, 0)
    with Context(BEAM=2, BEAM_TIMEOUT=3.0):
        got = out.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(timed) > 2 and () in timed  # the unoptimized kernel and more were timed on the device
    assert list((fresh / "beam").iterdir()), "the winner is cached on disk"

    # the same kernel again, with no compiled program in memory: answered from the cache, nothing is timed
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(1024))
    timed.clear()
    out2, want2 = _matmul(64, 1)
    with Context(BEAM=2):
        np.testing.assert_allclose(out2.numpy(), want2, rtol=1e-4, atol=1e-4)
    assert timed == []


def _median_run(spec, runs: int = 9) -> float:  # type: ignore[no-untyped-def]
    dev = Device["CPU"]
    return statistics.median(dev.time_program(spec, runs=1) for _ in range(runs))


def test_beam_winner_beats_a_deliberately_bad_schedule(fresh) -> None:  # type: ignore[no-untyped-def]
    from speck.codegen.kernel_info import KernelInfo

    out, _ = _matmul(256, 2)
    ast = out.schedule()[-1].ast
    dev = Device["CPU"]
    with Context(BEAM=1, BEAM_TIMEOUT=4.0):
        best = dev.backend.to_program(ast, beam_timer=dev.time_program, beam_tag="test")
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    bad = dev.backend.to_program(ast.replace(arg=info.replace(opts=(), dont_opt=True)))  # scalar, no blocking
    # the gap between a register-blocked vector matmul and a scalar triple loop is many times the noise of a loaded
    # machine, so a generous margin keeps this comparison honest without making it flaky
    assert _median_run(best) * 1.5 < _median_run(bad)
