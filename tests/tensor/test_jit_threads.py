"""TinyJit with threads: a capture records only the realizations of the thread that runs the jitted function, and
pending writes and deferred updates belong to the thread that made them, so threads each with their own jitted
function run side by side with the results of running alone. Values are checked exactly against numpy."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Switch threads every few bytecodes, so the threads interleave inside captures and realizes."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run_threads(*targets: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # re-raised in the main thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _accumulator(scale: float) -> tuple[Tensor, TinyJit[Tensor]]:
    acc = Tensor(np.zeros(4, dtype=np.float32)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        acc.assign(acc + x * scale).realize()
        return (acc * 2).realize()

    return acc, step


def test_two_threads_each_with_a_jitted_accumulator_run_1000_steps() -> None:
    steps = 1000
    seen: dict[int, list[np.ndarray]] = {0: [], 1: []}
    accs: dict[int, Tensor] = {}

    def worker(k: int) -> Callable[[], None]:
        def run() -> None:
            acc, step = _accumulator(float(k + 1))
            accs[k] = acc
            for i in range(steps):
                x = np.full(4, (i * (k + 3)) % 11, dtype=np.float32)
                seen[k].append(step(Tensor(x)).numpy().copy())
            assert step.captured is not None

        return run

    _run_threads(worker(0), worker(1))
    for k in (0, 1):
        xs = np.array([(i * (k + 3)) % 11 for i in range(steps)], dtype=np.float64)
        want = np.cumsum(xs * (k + 1)) * 2  # small integers: float32 is exact
        got = np.array([s[0] for s in seen[k]])
        np.testing.assert_array_equal(got, want)
        assert all(np.all(s == s[0]) for s in seen[k])
        np.testing.assert_array_equal(accs[k].numpy(), np.full(4, want[-1] / 2, dtype=np.float32))


def test_a_capture_records_only_its_own_threads_realizes() -> None:
    """Thread B realizes, reads and assigns while thread A is inside its capture: A's capture holds exactly the calls
    a capture made alone holds, B's reads don't raise JitError, and both get numpy's values."""

    def make() -> tuple[TinyJit[Tensor], threading.Event, threading.Event]:
        inside, resume = threading.Event(), threading.Event()

        @TinyJit
        def f(x: Tensor) -> Tensor:
            y = ((x + 1) * 3).realize()
            if f.cnt == 2:  # the capture call: let the other thread work now
                inside.set()
                assert resume.wait(60)
            return (y.sum() + x).realize()

        return f, inside, resume

    alone, inside0, resume0 = make()
    resume0.set()
    for _ in range(2):
        alone(Tensor(np.ones(3, dtype=np.float32)))
    assert alone.captured is not None
    calls_alone = len(alone.captured.jit_cache)

    f, inside, resume = make()
    f(Tensor(np.ones(3, dtype=np.float32)))  # warm-up, in this thread
    other_results: list[Any] = []

    def capture() -> None:
        f(Tensor(np.ones(3, dtype=np.float32)))

    def meanwhile() -> None:
        assert inside.wait(60)
        try:
            b = Tensor(np.arange(5, dtype=np.float32)).realize()
            acc = Tensor(np.zeros(5, dtype=np.float32)).realize()
            for _ in range(3):
                acc.assign(acc + b * b).realize()
            other_results.append(acc.numpy())
            other_results.append((b.exp() - 1).sum().item())
        finally:
            resume.set()

    _run_threads(capture, meanwhile)
    assert f.captured is not None
    assert len(f.captured.jit_cache) == calls_alone
    np.testing.assert_array_equal(other_results[0], 3 * np.arange(5, dtype=np.float32) ** 2)
    np.testing.assert_allclose(other_results[1], (np.exp(np.arange(5)) - 1).sum(), rtol=1e-5)
    for v in (2.0, -1.0, 5.0):
        x = np.full(3, v, dtype=np.float32)
        y = (x + 1) * 3
        np.testing.assert_allclose(f(Tensor(x)).numpy(), y.sum() + x, rtol=1e-6)


def test_pending_writes_and_deferred_updates_stay_in_their_thread() -> None:
    """A write (and a deferred update) one thread records while another captures is not run by the capturing
    thread's realizes: it can't end up in that capture (whose replays would repeat it), and runs when its own thread
    realizes."""
    t = Tensor(np.zeros(3, dtype=np.float32)).realize()
    u = Tensor(np.zeros(3, dtype=np.float32)).realize()
    inside, recorded, go = threading.Event(), threading.Event(), threading.Event()

    @TinyJit
    def g(x: Tensor) -> Tensor:
        if g.cnt == 2:  # the capture call: the other thread records its writes now
            inside.set()
            assert recorded.wait(60)
        return (x * 2).realize()

    def writer() -> None:
        assert inside.wait(60)
        try:
            t.assign(t + 5)  # pending in this thread
            u.assign_deferred(u + 7)
        finally:
            recorded.set()
        assert go.wait(60)
        Tensor(np.ones(1, dtype=np.float32)).realize()  # this thread's realize runs both
        np.testing.assert_array_equal(t.numpy(), np.full(3, 5, dtype=np.float32))
        np.testing.assert_array_equal(u.numpy(), np.full(3, 7, dtype=np.float32))

    def capturer() -> None:
        try:
            for _ in range(2):
                g(Tensor(np.ones(2, dtype=np.float32)))
            assert g.captured is not None
            assert len(g.captured.jit_cache) == 1  # its own kernel only: nothing of the other thread's writes
        finally:
            go.set()

    _run_threads(writer, capturer)
    for v in (3.0, 4.0):
        np.testing.assert_array_equal(g(Tensor(np.full(2, v, dtype=np.float32))).numpy(), np.full(2, 2 * v))
    np.testing.assert_array_equal(t.numpy(), np.full(3, 5, dtype=np.float32))  # replays did not add again
    np.testing.assert_array_equal(u.numpy(), np.full(3, 7, dtype=np.float32))


def _train_bn(seed: int, steps: int = 40) -> tuple[list[float], np.ndarray, np.ndarray]:
    """A jitted training step with BatchNorm (its running statistics are deferred updates) and SGD."""
    import speck.tensor.nn.state  # noqa: F401  (nn.state)
    from speck.tensor import nn
    from speck.tensor.nn.optim import SGD

    rng = np.random.default_rng(seed)
    lin, bn = nn.Linear(3, 4), nn.BatchNorm(4)
    lin.weight.assign(Tensor(rng.standard_normal((4, 3)).astype(np.float32))).realize()
    lin.bias.assign(Tensor(rng.standard_normal(4).astype(np.float32))).realize()
    opt = SGD(nn.state.get_parameters(lin), lr=0.05)

    @TinyJit
    def step(x: Tensor) -> Tensor:  # (in training mode: set by the caller, process-wide)
        opt.zero_grad()
        loss = bn(lin(x)).square().mean() + lin(x).mean()
        loss.backward()
        opt.step()
        return loss.realize()

    losses = [float(step(Tensor(rng.standard_normal((8, 3)).astype(np.float32))).numpy()) for _ in range(steps)]
    return losses, bn.running_mean.numpy().copy(), lin.weight.numpy().copy()


def test_two_threads_train_with_deferred_updates_as_one_thread_does() -> None:
    got: dict[int, tuple[list[float], np.ndarray, np.ndarray]] = {}

    def worker(k: int) -> Callable[[], None]:
        def run() -> None:
            got[k] = _train_bn(k)

        return run

    # training mode is a process-wide setting: entered once here, not by each thread (a `with` in two threads
    # would restore each other's values)
    with Tensor.train():
        want = {k: _train_bn(k) for k in (0, 1)}
        _run_threads(worker(0), worker(1))
    for k in (0, 1):
        for w, g in zip(want[k], got[k]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
