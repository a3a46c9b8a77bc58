"""Batched TinyJit replay: runs of captured kernels and copies replay as one native CPU graph. A batched replay
computes exactly what the per-kernel replay (JIT=2) and the eager step compute, for an MLP and a small CNN
under Adam, for 1..3 worker threads, with new input buffers every call; per-kernel timing (DEBUG>=2, PROFILE=1)
still replays kernel by kernel."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import speck.tensor.jit as jit
from speck.hcq import Device
from speck.tensor import GlobalCounters, Tensor, TinyJit, nn
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters, get_state_dict
from speck.uop import DEBUG


class MLP:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(100, 16), nn.Linear(16, 5)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x.reshape(x.shape[0], -1)).relu())


class CNN:
    def __init__(self) -> None:
        self.c1, self.bn, self.c2 = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3)
        self.l = nn.Linear(4 * 2 * 2, 5)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn(self.c1(x)).relu().max_pool2d(2)
        return self.l(self.c2(h).relu().reshape(x.shape[0], -1))


MODELS: dict[str, Callable[[], Any]] = {"mlp": MLP, "cnn": CNN}


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    dev: Any = Device["CPU"]
    threads, level = dev.threads, jit.JIT.value
    yield
    dev.threads, jit.JIT.value = threads, level


def _data(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((6, 1, 10, 10)).astype(np.float32), rng.integers(0, 5, 6).astype(np.int32))
            for _ in range(n)]  # fmt: skip


def _trainer(model_name: str, jitted: bool) -> tuple[Any, Callable[[Tensor, Tensor], Tensor]]:
    Tensor.manual_seed(3)
    model = MODELS[model_name]()
    opt = Adam(get_parameters(model), lr=0.01)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step(loss)
        return loss

    return model, (TinyJit(step) if jitted else step)


def _train(model_name: str, mode: str, steps: int = 5) -> tuple[list[float], dict[str, np.ndarray], Any]:
    """Losses and final state after `steps` steps; mode: eager, per-kernel (JIT=2) or batched replay."""
    jit.JIT.value = 1 if mode == "batched" else 2
    model, step = _trainer(model_name, mode != "eager")
    losses = [float(step(Tensor(x), Tensor(y)).item()) for x, y in _data(steps, 0)]
    return losses, {k: v.numpy().copy() for k, v in get_state_dict(model).items()}, step


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_batched_replay_equals_per_kernel_replay_and_eager(model_name: str) -> None:
    eager_l, eager_s, _ = _train(model_name, "eager")
    per_l, per_s, _ = _train(model_name, "per-kernel")
    bat_l, bat_s, step = _train(model_name, "batched")
    assert step.captured is not None and step.plan is not None and step.plan.batches  # replays ran batched
    assert all(b.graph is not None and not b.failed for b in step.plan.batches)
    assert bat_l == per_l  # the same kernels on the same data: bit-identical
    np.testing.assert_allclose(bat_l, eager_l, rtol=1e-5, atol=1e-6)
    for k in eager_s:
        np.testing.assert_array_equal(bat_s[k], per_s[k], err_msg=k)
        np.testing.assert_allclose(bat_s[k], eager_s[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_worker_threads_do_not_change_results(model_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel split across all workers (the size thresholds lowered), graphs forced to use them all."""
    import speck.hcq.cpu as cpu

    monkeypatch.setattr(cpu, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_FLOPS", 0)
    dev: Any = Device["CPU"]
    results = []
    for threads in (1, 2, 3):
        dev.threads = threads
        monkeypatch.setenv("CPU_GRAPH_WORKERS", str(threads))
        losses, state, step = _train(model_name, "batched")
        results.append((losses, state))
        assert max(b.graph.nworkers for b in step.plan.batches) == threads
        assert all(b.graph.chosen_workers == b.graph.nworkers for b in step.plan.batches)
    for losses, state in results[1:]:
        assert losses == results[0][0]
        for k in state:
            np.testing.assert_array_equal(state[k], results[0][1][k], err_msg=k)


def test_inputs_swapped_between_replays() -> None:
    """Every call brings new input buffers: each replay reads its own. One buffer passed as both inputs is refused
    (a capture needs distinct input buffers)."""

    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return ((a + 1) * b).sum(axis=1) + a.max(axis=1)

    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((4, 9)).astype(np.float32) for _ in range(7)]
    ts = [Tensor(x).realize() for x in xs]
    for i in range(6):
        a, b = (ts[i], ts[i + 1]) if i != 4 else (ts[1], ts[1])
        if a is b:
            with pytest.raises(jit.JitError, match="duplicate inputs"):
                f(a, b)
            continue
        got = f(a, b).numpy()
        na, nb = a.numpy(), b.numpy()
        np.testing.assert_allclose(got, ((na + 1) * nb).sum(axis=1) + na.max(axis=1), rtol=1e-5)
    assert f.plan is not None and f.plan.batches


def test_kernel_count_and_per_kernel_timing() -> None:
    """GlobalCounters count every kernel of a batched replay; DEBUG=2 prints one line per kernel (the per-kernel
    path) and PROFILE records one exec event per kernel."""
    losses, _, step = _train("mlp", "batched", steps=3)
    x, y = (Tensor(a) for a in _data(1, 9)[0])
    GlobalCounters.reset()
    step(x, y)
    batched_count = GlobalCounters.kernel_count
    jit.JIT.value = 2
    GlobalCounters.reset()
    step(x, y)
    assert batched_count == GlobalCounters.kernel_count > 5
    jit.JIT.value = 1
    dev: Any = Device["CPU"]
    dev.profile = True
    try:
        dev.engines["compute"].events.clear()
        step(x, y)
        names = [e.name for e in dev.profile_events if e.kind == "exec"]
    finally:
        dev.profile = False
        dev.engines["compute"].events.clear()
    assert len(names) == batched_count and not any(n.startswith("jit[") for n in names)
    old = DEBUG.value
    DEBUG.value = 2
    try:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            step(x, y)
    finally:
        DEBUG.value = old
    assert sum(1 for line in out.getvalue().splitlines() if line.startswith("***")) >= batched_count


def test_shape_change_error_unchanged_with_batching() -> None:
    _, _, step = _train("mlp", "batched", steps=3)
    with pytest.raises(jit.JitError, match=r"captured shape \(6, 1, 10, 10\)"):
        step(Tensor(np.zeros((5, 1, 10, 10), np.float32)), Tensor(np.zeros(5, np.int32)))


def test_steady_replays_read_the_storage_as_it_is_now() -> None:
    """Replays with the very same input tensors take the short route (no input checks, buffer keys found once);
    they still read every buffer's storage as it is at the call: a weight the function reads (not an input) given
    other storage by an assign, or by replacing its buffer_map entry directly, is read from the new storage. Every
    replay counts its kernels."""
    from speck.tensor.realize import get_buffer
    from speck.tensor.schedule import base_buffer, buffer_map

    rng = np.random.default_rng(11)
    w_np, x_np = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    w, x = Tensor(w_np).realize(), Tensor(x_np).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return ((x + 1).contiguous() * w).contiguous() - x

    for _ in range(4):
        np.testing.assert_allclose(f(x).numpy(), (x_np + 1) * w_np - x_np, rtol=1e-6)
    GlobalCounters.reset()
    f(x)
    per_replay = GlobalCounters.kernel_count
    f(x)
    assert per_replay >= 3 and GlobalCounters.kernel_count == 2 * per_replay
    assert f.plan is not None and f.plan.single is not None  # the short route: one graph
    wbuf = base_buffer(w.uop)
    assert wbuf is not None
    for how in ("assign", "buffer_map"):
        new_np = rng.standard_normal(8).astype(np.float32)
        old_storage = get_buffer(wbuf)
        if how == "assign":
            w.assign(Tensor(new_np).realize())
            w.realize()
        else:
            buffer_map[wbuf] = get_buffer(base_buffer(Tensor(new_np).realize().uop))  # type: ignore[arg-type]
        assert base_buffer(w.uop) is wbuf and get_buffer(wbuf) is not old_storage  # the same BUFFER, new storage
        for _ in range(3):
            np.testing.assert_allclose(f(x).numpy(), (x_np + 1) * new_np - x_np, rtol=1e-6)
