"""Which tensors backward() fills and how: every live float tensor in the root's graph (no flag needed), the root
gets 1, intermediates held in variables get theirs, int/bool tensors and opted-out ones (requires_grad=False,
detach) get none; accumulation into an existing .grad; Tensor.gradient() leaves .grad alone; is_param. Values are
checked against numpy chain-rule references."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes, live, nn
from speck.tensor.errors import GradientError

RNG = np.random.default_rng(3)


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(t: Tensor | None, ref: np.ndarray | float, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert t is not None, "expected a gradient"
    np.testing.assert_allclose(t.numpy(), ref, rtol=rtol, atol=atol)


# ---------------- which tensors get .grad ----------------
def test_no_flag_needed() -> None:
    x = Tensor.randn(3)
    x.sum().backward()
    close(x.grad, np.ones(3))


def test_root_and_held_intermediates_get_gradients() -> None:
    xn, wn = arr(4), arr(4)
    x, w = Tensor(xn), Tensor(wn)
    y = x * w
    z = y.exp()
    loss = z.sum()
    assert loss.backward() is loss
    yn = xn.astype(np.float64) * wn
    close(loss.grad, 1.0)
    close(z.grad, np.ones(4))
    close(y.grad, np.exp(yn), rtol=1e-5)
    close(x.grad, np.exp(yn) * wn, rtol=1e-5)
    close(w.grad, np.exp(yn) * xn, rtol=1e-5)


def test_int_bool_and_opted_out_tensors_get_nothing() -> None:
    x = Tensor(arr(3))
    i = Tensor([1, 2, 3])
    b = Tensor([True, False, True])
    frozen = Tensor(arr(3), requires_grad=False)
    off = Tensor(arr(3))
    off.requires_grad = False
    loss = (x * i.float() * b.float() * frozen * off).sum()
    loss.backward()
    assert i.grad is None and b.grad is None and frozen.grad is None and off.grad is None
    assert x.grad is not None


def test_detach_stops_the_gradient() -> None:
    xn = arr(3)
    x = Tensor(xn)
    (x * x.detach() * 3).sum().backward()
    close(x.grad, 3 * xn)  # only the attached factor
    y = Tensor(xn)
    (y.detach() * 2).sum().backward()
    close(y.grad, np.zeros(3))  # in the graph only through detach(): zeros


def test_tensors_outside_the_graph_are_untouched() -> None:
    x, other = Tensor(arr(3)), Tensor(arr(3))
    (x * 2).sum().backward()
    assert other.grad is None


def test_accumulates_in_place_into_existing_grad() -> None:
    xn = arr(3)
    x = Tensor(xn)
    (x * x).sum().backward()
    held = x.grad
    (x * 3).sum().backward()
    assert x.grad is held  # the same object, updated: holders see the sum
    close(held, 2 * xn + 3)
    x.grad = None
    (x * 5).sum().backward()
    close(x.grad, np.full(3, 5.0))


def test_backward_with_seed_and_errors() -> None:
    xn = arr(2, 3)
    x = Tensor(xn)
    with pytest.raises(AssertionError, match="gradient="):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="gradient="):
        (x * 2).backward()
    seed = arr(2, 3)
    (x * 2).backward(Tensor(seed))
    close(x.grad, 2 * seed)
    with pytest.raises(RuntimeError, match="only float Tensors have gradient"):
        (x > 0).sum().backward()


def test_half_intermediates_get_half_gradients() -> None:
    xn = np.array([1.0, 2.0], dtype=np.float32)
    x = Tensor(xn)
    h = x.half()
    (h * h).sum().backward()
    assert h.grad is not None and h.grad.dtype == dtypes.float16
    assert x.grad is not None and x.grad.dtype == dtypes.float32
    close(x.grad, 2 * xn, rtol=1e-3)


def test_gradient_across_devices() -> None:
    xn = arr(3)
    x = Tensor(xn)
    y = x.to("PYTHON") * 2
    (y.sum()).backward()
    assert x.grad is not None and x.grad.device == x.device
    close(x.grad, np.full(3, 2.0))


# ---------------- Tensor.gradient ----------------
def test_gradient_leaves_grad_alone() -> None:
    xn, wn = arr(3), arr(3)
    x, w = Tensor(xn), Tensor(wn)
    unrelated = Tensor(arr(2, 2))
    loss = (x * w).sum()
    gx, gw, gu = loss.gradient(x, w, unrelated)
    close(gx, wn)
    close(gw, xn)
    close(gu, np.zeros((2, 2)))  # not in the graph: zeros of its shape
    assert x.grad is None and w.grad is None and loss.grad is None


def test_gradient_errors() -> None:
    x = Tensor(arr(3))
    with pytest.raises(RuntimeError, match="only float Tensors have gradient"):
        (x > 0).sum().gradient(x)
    with pytest.raises(RuntimeError, match="only float Tensors have gradient"):
        x.sum().gradient(Tensor([1, 2, 3]))
    with pytest.raises(AssertionError):
        (x * 2).gradient(x)
    (g,) = (x * 2).gradient(x, gradient=Tensor([1.0, 2.0, 3.0]))
    close(g, [2.0, 4.0, 6.0])


def test_weak_target_is_refused() -> None:
    from speck.uop import Ops, UOp

    weak = Tensor(UOp(Ops.CONST, dtypes.weakfloat, (UOp(Ops.DEVICE, arg="CPU"),), 2.0))
    with pytest.raises(RuntimeError, match="weak"):
        Tensor(arr(3)).sum().gradient(weak)


# ---------------- gradient rules the spec names ----------------
def _grad_of(f: Callable[[Tensor], Tensor], xs: list[float]) -> np.ndarray:
    x = Tensor(np.array(xs, dtype=np.float32))
    f(x).sum().backward()
    assert x.grad is not None
    return x.grad.numpy()


def test_rules_at_kinks_and_ties() -> None:
    np.testing.assert_array_equal(_grad_of(lambda x: x.relu(), [-1, 0, 2]), [0, 0, 1])
    np.testing.assert_array_equal(_grad_of(lambda x: x.abs(), [-1, 0, 2]), [-1, 0, 1])
    np.testing.assert_array_equal(_grad_of(lambda x: x.maximum(Tensor([0.0, 1.0, 5.0])), [0, 2, 5]), [0.5, 1, 0.5])
    np.testing.assert_array_equal(_grad_of(lambda x: x.max(), [3, 1, 3]), [0.5, 0, 0.5])
    assert np.isinf(_grad_of(lambda x: x.sqrt(), [0.0])[0])
    np.testing.assert_array_equal(_grad_of(lambda x: x.prod(), [0, 2, 3]), [6, 0, 0])


def test_pow_rule_at_zero_base_and_zero_exponent() -> None:
    xn = np.array([0.0, 0.0, 0.0, 2.0, 3.0], dtype=np.float32)
    yn = np.array([0.0, 1.0, 2.0, 0.5, 0.0], dtype=np.float32)
    x, y = Tensor(xn), Tensor(yn)
    (x**y).sum().backward()
    x64, y64 = xn.astype(np.float64), yn.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = np.where(y64 == 0, 0.0, y64 * x64 ** (y64 - 1))
        dy = np.where(x64 == 0, 0.0, x64**y64 * np.log(x64))
    close(x.grad, dx)
    close(y.grad, dy)


# ---------------- property: a chain of elementwise ops, every link held ----------------
# (speck op, numpy value, numpy derivative)
NpFn = Callable[[np.ndarray], np.ndarray]
OPS: list[tuple[str, Callable[[Tensor], Tensor], NpFn, NpFn]] = [
    ("sin", lambda t: t.sin(), np.sin, np.cos),
    ("exp", lambda t: (t * 0.5).exp(), lambda a: np.exp(a * 0.5), lambda a: 0.5 * np.exp(a * 0.5)),
    ("square", lambda t: t * t, lambda a: a * a, lambda a: 2 * a),
    ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), lambda a: np.exp(-a) / (1 + np.exp(-a)) ** 2),
    ("affine", lambda t: t * 1.5 - 0.25, lambda a: a * 1.5 - 0.25, lambda a: np.full_like(a, 1.5)),
    ("softplus", lambda t: (t.exp() + 1).log(), lambda a: np.log1p(np.exp(a)), lambda a: 1 / (1 + np.exp(-a))),
]


@settings(max_examples=25)
@given(st.lists(st.integers(0, len(OPS) - 1), min_size=1, max_size=5), st.integers(0, 2**16))
def test_chain_gradients_of_every_held_link(chain: list[int], seed: int) -> None:
    xn = np.random.default_rng(seed).uniform(-1.5, 1.5, 6).astype(np.float32)
    links = [Tensor(xn)]
    vals, derivs = [xn.astype(np.float64)], []
    for k in chain:
        _, f, fn, dfn = OPS[k]
        links.append(f(links[-1]))
        derivs.append(dfn(vals[-1]))
        vals.append(fn(vals[-1]))
    links[-1].sum().backward()
    # d(sum of last)/d(link i) = product of the derivatives after it
    expect = np.ones_like(vals[-1])
    for i in range(len(links) - 1, -1, -1):
        close(links[i].grad, expect, rtol=2e-4, atol=1e-5)
        if i:
            expect = expect * derivs[i - 1]


# ---------------- is_param ----------------
def test_is_param_defaults_and_is_kept() -> None:
    t = Tensor(arr(3))
    assert t.is_param is True and (t + 1).is_param is True
    assert t.is_param_(False) is t and t.is_param is False
    assert t.clone().is_param is False and t.to("PYTHON").is_param is False
    assert t.is_param_() is t and t.is_param is True
    bn = nn.BatchNorm(4)
    assert bn.weight is not None and bn.weight.is_param
    assert not bn.running_mean.is_param and not bn.running_var.is_param and not bn.num_batches_tracked.is_param


def test_clone_and_to_carry_grad() -> None:
    xn = arr(3)
    x = Tensor(xn)
    (x * 4).sum().backward()
    c, m = x.clone(), x.to("PYTHON")
    close(c.grad, np.full(3, 4.0))
    assert m.grad is not None and m.grad.device == "PYTHON"
    close(m.grad, np.full(3, 4.0))


# ---------------- the registry ----------------
def test_registry_holds_no_dead_tensors_and_stays_bounded() -> None:
    gc.collect()
    x = Tensor(arr(2))
    before = live.count()
    for _ in range(3000):
        x + 1  # temporaries die at once
    gc.collect()
    assert live.count() <= before + 10
    assert any(t is x for t in live.tensors())
    assert len(live._refs) <= max(live._MIN_SWEEP, 2 * live.count()) + 1


def test_backward_after_realize_of_a_graph_needing_gradients_is_an_error() -> None:
    """realize() replaces a tensor's graph by its buffer: a backward() from it reached nothing and silently left
    every parameter's .grad None. It is a GradientError naming the order to use; backward() before realize() and
    backward() after .item() (which keeps the graph) fill the gradients, as numpy says."""
    x_np = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = Tensor(x_np)
    for realize in (lambda t: t.realize(), lambda t: Tensor.realize(t, t * 2)):
        w = Tensor(np.ones((3, 3), np.float32), requires_grad=True)
        loss = (x @ w).sum()
        realize(loss)
        with pytest.raises(GradientError, match="call backward\\(\\) before realize\\(\\)"):
            loss.backward()
        assert w.grad is None
    expected = np.repeat(x_np.sum(0)[:, None], 3, axis=1)
    w = Tensor(np.ones((3, 3), np.float32), requires_grad=True)
    loss = (x @ w).sum()
    loss.backward()
    loss.realize()
    np.testing.assert_allclose(w.grad.numpy(), expected)
    w2 = Tensor(np.ones((3, 3), np.float32), requires_grad=True)
    loss2 = (x @ w2).sum()
    assert loss2.item() == float((x_np @ np.ones((3, 3), np.float32)).sum())
    loss2.backward()
    np.testing.assert_allclose(w2.grad.numpy(), expected)
