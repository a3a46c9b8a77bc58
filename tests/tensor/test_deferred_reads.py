"""Reads of a tensor with a deferred update pending (BatchNorm's running statistics after a training forward, an
optimizer's parameters after schedule_step) see the new value, as after assign(); a plain training step applies
its deferred updates in the loss's schedule, never in one of their own."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit, nn
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import get_parameters
from speck.tensor.writes import _DEFERRED


@pytest.fixture(autouse=True)
def _training():
    prev = Tensor.training
    Tensor.training = True
    yield
    Tensor.training = prev


def _batch(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((4, 3, 5, 5), dtype=np.float32)


def test_graph_built_after_a_training_forward_reads_the_new_running_mean():
    bn, x = nn.BatchNorm2d(3, momentum=0.1), _batch()
    bn(Tensor(x))
    z = bn.running_mean * 2  # lazy: built before anything is realized
    np.testing.assert_allclose(z.numpy(), 2 * 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5)


def test_eval_forward_after_a_training_forward_normalises_with_the_new_statistics():
    bn, x = nn.BatchNorm2d(3, momentum=1.0, eps=0.0), _batch()
    bn(Tensor(x))
    Tensor.training = False
    out = bn(Tensor(x)).numpy()  # momentum 1: the running statistics are this batch's (variance unbiased)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
    want = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_a_write_between_the_update_and_the_read_keeps_the_update_pending():
    bn, x = nn.BatchNorm2d(3, momentum=0.5), _batch()
    other = Tensor.zeros(3).contiguous().realize()
    bn(Tensor(x))
    other.assign(Tensor.ones(3))  # a recorded write (the write log is tidied) before the read
    other[1:] = 5.0
    got = (bn.running_mean + other).numpy()
    np.testing.assert_allclose(got, 0.5 * x.mean(axis=(0, 2, 3)) + np.array([1, 5, 5]), rtol=1e-5)


def test_parameters_read_after_schedule_step_are_the_stepped_ones():
    w = Tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32), requires_grad=True)
    opt = SGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.schedule_step()
    doubled = w * 2  # built before any realize: reads the stepped w (w - 0.5 * 2w = 0)
    np.testing.assert_allclose(doubled.numpy(), np.zeros(3), atol=1e-7)


def test_a_plain_training_step_applies_its_updates_in_the_loss_schedule() -> None:
    bn = nn.BatchNorm2d(4)
    model = [nn.Conv2d(3, 4, 3), bn, lambda t: t.relu().mean(axis=(2, 3)), nn.Linear(4, 2)]
    opt = SGD(get_parameters(model), lr=0.1)
    for seed in range(2):
        opt.zero_grad()
        loss = Tensor(_batch(seed)).sequential(model).sum()
        loss.backward()
        # backward looked through every live tensor for the loss's inputs without reading (and so applying) the
        # pending running statistics: they are still queued for the realize that computes the loss
        assert id(bn.running_mean) in _DEFERRED and id(bn.running_var) in _DEFERRED
        opt.step()
        assert not _DEFERRED
        loss.item()


def test_jitted_steps_match_eager_steps_in_running_statistics():
    def run(jit: bool) -> np.ndarray:
        Tensor.manual_seed(1)
        bn = nn.BatchNorm2d(3)

        def step(x: Tensor) -> Tensor:
            out = bn(x).sum()
            return (out + bn.running_mean.sum()).realize()  # reads the statistics this step updated

        f = TinyJit(step) if jit else step
        outs = [f(Tensor(_batch(i))).item() for i in range(4)]
        return np.array([*outs, *bn.running_mean.numpy()])

    np.testing.assert_allclose(run(True), run(False), rtol=1e-5)


def test_an_assign_after_a_training_forward_follows_the_pending_update():
    bn, x = nn.BatchNorm2d(3), _batch()
    out = bn(Tensor(x))
    bn.running_mean.assign(Tensor([5.0, 6.0, 7.0]))  # in eager order after the forward's update: it wins
    out.realize()
    np.testing.assert_allclose(bn.running_mean.numpy(), [5.0, 6.0, 7.0])
