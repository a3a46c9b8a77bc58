"""Random numbers inside TinyJit: the counter lives in a device buffer that every draw reads and advances in place,
so replays draw fresh numbers, and a jitted run draws exactly the sequence an eager run draws from the same seed.
The reference for the values is the scalar Threefry-2x32 of speck.uop (independent of kernels and codegen)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit, nn
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import get_parameters
from speck.tensor.schedule import assert_kernel_count
from speck.uop.alu import threefry2x32


def _ref_rand(seed: int, counter: int, n: int) -> np.ndarray:
    """Tensor.rand's n values drawn at `counter` under `seed`: top 24 bits of threefry(counter + i, key), the key
    being the seed with the draw's size mixed in (so a draw of 6 is not two draws of 3)."""
    key = seed ^ (n * 0xD1B54A32D192ED03 & 0xFFFFFFFFFFFFFFFF)
    return np.array([(threefry2x32(counter + i, key) >> 40) * 2.0**-24 for i in range(n)], dtype=np.float32)


def _run(fn: Callable[[], Any], calls: int, seed: int) -> list[np.ndarray]:
    Tensor.manual_seed(seed)
    return [np.asarray(fn().numpy()) for _ in range(calls)]


def test_jitted_rand_replays_fresh_values_equal_to_eager() -> None:
    def draw() -> Tensor:
        return Tensor.rand(3, 5)

    eager = _run(draw, 6, seed=11)
    jitted_fn = TinyJit(draw)
    jitted = _run(jitted_fn, 6, seed=11)
    assert jitted_fn.cnt == 6 and jitted_fn.captured is not None  # calls 3..6 were replays
    for i, (e, j) in enumerate(zip(eager, jitted)):
        np.testing.assert_array_equal(j, e, err_msg=f"call {i}")
        np.testing.assert_array_equal(e.reshape(-1), _ref_rand(11, 15 * i, 15), err_msg=f"call {i} vs reference")
    assert len({a.tobytes() for a in jitted}) == len(jitted)  # every call drew new numbers


def test_several_draws_per_step_and_eager_draws_between_calls() -> None:
    """Two draws of different sizes plus a randn inside the step, and an eager draw between steps: the jitted run
    consumes the counter exactly like the eager run does."""

    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        a = x + Tensor.rand(*x.shape)
        b = (Tensor.randn(7) * x.sum()).realize()
        return a * Tensor.rand(1), b

    def run(f: Callable[[Tensor], tuple[Tensor, Tensor]]) -> list[np.ndarray]:
        Tensor.manual_seed(5)
        out: list[np.ndarray] = []
        for i in range(5):
            x = Tensor(np.full((2, 3), i + 1, dtype=np.float32))
            a, b = f(x)
            out += [a.numpy(), b.numpy(), Tensor.rand(4).numpy()]
        return out

    eager, jitted = run(step), run(TinyJit(step))
    for i, (e, j) in enumerate(zip(eager, jitted)):
        np.testing.assert_array_equal(j, e, err_msg=f"output {i}")


def test_lazy_draw_keeps_its_numbers_through_later_draws_reseeds_and_replays() -> None:
    """A draw's values are fixed when it is made, however late it is realized."""
    f = TinyJit(lambda: Tensor.rand(4))
    Tensor.manual_seed(3)
    for _ in range(3):
        f()  # capture done; the counter is now 12
    pending = Tensor.rand(6) * 1  # counters 12..17, not realized yet
    f()  # a replay advances the counter buffer in place
    Tensor.rand(5).realize()
    Tensor.manual_seed(99)
    f()
    np.testing.assert_array_equal(pending.numpy(), _ref_rand(3, 12, 6))


def test_manual_seed_resets_the_counter_a_capture_reads() -> None:
    f = TinyJit(lambda: Tensor.rand(8))
    first = _run(f, 4, seed=21)  # the last two are replays
    again = _run(f, 4, seed=21)  # reseeding after the capture restarts the sequence the replays draw
    for a, b in zip(first, again):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(_run(f, 1, seed=22)[0], _ref_rand(22, 0, 8))


def test_manual_seed_inside_a_jitted_function_is_replayed() -> None:
    def seeded() -> Tensor:
        Tensor.manual_seed(4)
        return Tensor.rand(5)

    f = TinyJit(seeded)
    outs = [f().numpy() for _ in range(4)]
    for o in outs:
        np.testing.assert_array_equal(o, _ref_rand(4, 0, 5))
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), _ref_rand(4, 5, 5))  # the replay advanced it too


def test_each_device_has_its_own_counter() -> None:
    Tensor.manual_seed(8)
    cpu = Tensor.rand(16).numpy()
    other = Tensor.rand(16, device="PYTHON").numpy()
    np.testing.assert_array_equal(cpu, _ref_rand(8, 0, 16))
    np.testing.assert_array_equal(other, _ref_rand(8, 0, 16))
    np.testing.assert_array_equal(Tensor.rand(4).numpy(), _ref_rand(8, 16, 4))


def test_a_draw_costs_one_extra_kernel() -> None:
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    (x * 2 + 1).sum().realize()  # compile outside the counted blocks
    with assert_kernel_count(1):
        (x * 2 + 1).sum().realize()
    with assert_kernel_count(2):  # the counter update, then the same fused kernel
        (x * 2 + Tensor.rand(3, 4)).sum().realize()
    with Tensor.train(), assert_kernel_count(2):
        (x * 2 + 1).dropout(0.5).sum().realize()

    f = TinyJit(lambda a: (a * 2 + Tensor.rand(3, 4)).sum())
    for _ in range(2):
        f(x)
    with assert_kernel_count(2):  # a replay runs what the eager call ran
        f(x)


@pytest.mark.parametrize("p", [0.25, 0.6])
def test_dropout_in_a_jitted_training_step(p: float) -> None:
    """A jitted SGD step with dropout: every replay draws a new mask, about 1-p of the elements survive scaled by
    1/(1-p), and the parameters follow the eager run from the same seed exactly."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(5)]

    def make() -> tuple[nn.Linear, Callable[[Tensor], tuple[Tensor, Tensor]]]:
        Tensor.manual_seed(2)
        lin = nn.Linear(32, 4)
        opt = SGD(get_parameters(lin), lr=0.1)

        def step(x: Tensor) -> tuple[Tensor, Tensor]:
            with Tensor.train():
                opt.zero_grad()
                h = x.dropout(p)
                loss = lin(h).square().mean()
                loss.backward()
                opt.step()
            return loss, h

        return lin, step

    def run(jit: bool) -> tuple[list[np.ndarray], list[np.ndarray], nn.Linear]:
        # one run after the other: both draw from the one generator, seeded in make()
        lin, step = make()
        f = TinyJit(step) if jit else step
        losses, hs = [], []
        for x in xs:
            loss, h = f(Tensor(x))
            losses.append(loss.numpy())
            hs.append(h.numpy())
        assert not jit or f.captured is not None  # type: ignore[attr-defined]
        return losses, hs, lin

    (loss_e, h_e, lin_e), (loss_j, h_j, lin_j) = run(False), run(True)
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(h_j[i], h_e[i], err_msg=f"dropout output at step {i}")
        np.testing.assert_allclose(loss_j[i], loss_e[i], rtol=1e-6, err_msg=f"loss at step {i}")
        kept = h_j[i] != 0
        np.testing.assert_allclose(h_j[i][kept], x[kept] / (1 - p), rtol=1e-6)
        # 2048 elements: the kept fraction's standard deviation is at most 0.011, this allows 5 of them
        assert abs(kept.mean() - (1 - p)) < 0.055, f"kept {kept.mean():.3f} of the elements at p={p}"
    assert len({(h != 0).tobytes() for h in h_j}) == len(h_j)  # a new mask every step, replays included
    for a, b in zip(get_parameters(lin_j), get_parameters(lin_e)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_dropout_with_batchnorm_and_adam_in_a_jitted_step() -> None:
    """Dropout next to BatchNorm's deferred running-statistics updates: the jitted run (losses, parameters and
    running statistics) follows the eager one."""
    from speck.tensor.nn.optim import Adam
    from speck.tensor.nn.state import get_state_dict

    rng = np.random.default_rng(1)
    data = [
        (rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)) for _ in range(4)
    ]

    def run(jit: bool) -> tuple[list[float], dict[str, np.ndarray]]:
        Tensor.manual_seed(6)
        l1, bn, l2 = nn.Linear(8, 12), nn.BatchNorm(12), nn.Linear(12, 3)
        opt = Adam([*get_parameters(l1), *get_parameters(l2), bn.weight, bn.bias], lr=0.01)

        def step(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                h = bn(l1(x).reshape(-1, 12, 1)).reshape(-1, 12).relu().dropout(0.3)
                loss = l2(h).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
            return loss

        f = TinyJit(step) if jit else step
        losses = [float(f(Tensor(x), Tensor(y)).item()) for x, y in data]
        state = {k: v.numpy() for k, v in get_state_dict({"l1": l1, "bn": bn, "l2": l2}).items()}
        return losses, state

    (loss_e, state_e), (loss_j, state_j) = run(False), run(True)
    np.testing.assert_allclose(loss_j, loss_e, rtol=1e-5)
    for k, v in state_e.items():
        np.testing.assert_allclose(state_j[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.allclose(state_e["bn.running_mean"], 0)  # the running statistics did update


def test_a_draw_leaves_deferred_updates_pending() -> None:
    """Advancing the counter runs its own small schedule: it must not apply deferred updates ahead of the realize
    they were deferred to (they would lose the kernels they share with it)."""
    from speck.tensor import tensor as tensor_module

    t = Tensor(np.zeros(3, dtype=np.float32)).realize()
    t.assign_deferred(t + 1)
    Tensor.rand(4).realize()  # realizing the draw itself applies them, like any realize
    np.testing.assert_array_equal(t.numpy(), np.ones(3, dtype=np.float32))
    t.assign_deferred(t + 1)
    Tensor.rand(4)  # a draw made but not realized
    assert id(t) in tensor_module._DEFERRED
    np.testing.assert_array_equal(t.numpy(), np.full(3, 2, dtype=np.float32))
