"""Hostile round 9, one tensor used by several threads. A write (setitem, assign) waits for its own thread's next
realize, and no other thread can run it: a worker thread that wrote into a shared tensor and ended (or waited)
without realizing lost the write for every reader - `t[i] = i` in 8 threads left t all zeros - and a lazy graph
built before the write read the write's snapshot unfilled (zeros instead of its value). Now a write recorded in a
thread other than the main one runs at once; a read of a tensor the main thread wrote and has not realized since
is a TensorRuntimeError in the reading thread (it would read the old value) naming the writer and what to do.
Values are checked exactly against numpy."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor
from speck.tensor.errors import TensorRuntimeError


def _in_threads(*targets: Callable[[], Any]) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # (re-raised in the main thread by the caller)
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors


def test_setitems_from_ended_worker_threads_are_all_kept() -> None:
    t = Tensor(np.zeros(8, dtype=np.float32)).realize()

    def put(i: int) -> Callable[[], None]:
        def f() -> None:
            t[i] = float(i)

        return f

    assert not _in_threads(*[put(i) for i in range(8)])
    np.testing.assert_array_equal(t.numpy(), np.arange(8, dtype=np.float32))


def test_a_graph_built_before_a_workers_write_keeps_the_old_value_and_the_tensor_the_new() -> None:
    base = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    t = Tensor(base).realize()
    doubled = t * 2  # built before the write: numpy order says it reads [1, 2, 3]

    def write() -> None:
        t[0] = 5.0
        t.assign(t + 1)

    assert not _in_threads(write)
    np.testing.assert_array_equal(doubled.numpy(), base * 2)
    np.testing.assert_array_equal(t.numpy(), np.array([6.0, 3.0, 4.0], dtype=np.float32))


def test_a_waiting_writer_threads_write_is_seen_by_the_main_thread() -> None:
    t = Tensor(np.zeros(3, dtype=np.float32)).realize()
    written, go = threading.Event(), threading.Event()
    seen: list[list[float]] = []

    def writer() -> None:
        t[1] = 7.0
        written.set()
        assert go.wait(60)

    th = threading.Thread(target=writer)
    th.start()
    try:
        assert written.wait(60)
        seen.append(t.tolist())
    finally:
        go.set()
        th.join()
    assert seen == [[0.0, 7.0, 0.0]]


@pytest.mark.parametrize("read", [lambda t: t.tolist(), lambda t: (t * 2).numpy(), lambda t: t[1:].sum().item()])
def test_reading_what_the_main_thread_wrote_and_did_not_realize_is_named(read: Callable[[Tensor], Any]) -> None:
    t = Tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32)).realize()
    t[2] = 9.0  # pending in the main thread: another thread can't run it
    errors = _in_threads(lambda: read(t))
    assert len(errors) == 1 and isinstance(errors[0], TensorRuntimeError)
    msg = str(errors[0])
    assert "thread 'MainThread' wrote" in msg and "would read the old value" in msg and "realize_all()" in msg
    Tensor.realize_all()  # what the message says to do
    got: list[Any] = []
    assert not _in_threads(lambda: got.append(read(t)))
    ref = np.array([1.0, 2.0, 9.0], dtype=np.float32)
    want = read(Tensor(ref))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want))


def test_threads_summing_one_tensor_each_get_numpys_sum() -> None:
    arr = np.arange(1000, dtype=np.float32)
    t = Tensor(arr).realize()
    out: dict[int, float] = {}

    def work(i: int) -> Callable[[], None]:
        return lambda: out.__setitem__(i, (t * i).sum().item())

    assert not _in_threads(*[work(i) for i in range(6)])
    assert out == {i: float((arr * i).sum()) for i in range(6)}
