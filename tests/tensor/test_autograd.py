"""Gradients of Tensor ops checked against float64 central finite differences of the same Tensor graph.

`gradcheck(fn, *arrays)` runs fn on float64 tensors, differentiates sum(fn(...) * R) for a fixed random R (so the
seed gradient is not uniform), and compares each input's gradient with central differences of the forward pass:
every coordinate for tiny inputs, random directions for larger ones (a wrong gradient shows in a random direction
with probability 1). Inputs are drawn away from kinks (relu at 0, ties of max) so finite differences are valid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from tensor_helpers import FEW, SOME

H = 1e-6


def _tensor(a: np.ndarray, **kw: Any) -> Tensor:
    """A tensor of a's values with a device: a 0-d array alone would make a device-less constant, which takes no
    gradient (TENSOR_API 0.2), so a 0-d input is a view of a 1-element buffer."""
    return Tensor(a, **kw) if a.ndim else Tensor(a.reshape(1), **kw).reshape(())


def _forward(fn: Callable[..., Tensor], arrs: list[np.ndarray]) -> np.ndarray:
    return fn(*[_tensor(a) for a in arrs]).numpy().astype(np.float64)


def gradcheck(fn: Callable[..., Tensor], *arrs: np.ndarray, wrt: tuple[int, ...] | None = None, seed: int = 0,
              atol: float = 1e-6, rtol: float = 1e-5, max_coords: int = 16, directions: int = 3) -> None:  # fmt: skip
    """Assert d/dx sum(fn(x...) * R) from backward() matches central finite differences for the inputs in wrt."""
    arrs_l = [np.asarray(a, dtype=np.float64) for a in arrs]
    wrt = tuple(range(len(arrs_l))) if wrt is None else wrt
    rng = np.random.default_rng(seed)
    ts = [_tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrs_l)]
    out = fn(*ts)
    assert out.dtype == dtypes.float64, f"the graph left float64 ({out.dtype}); finite differences need float64"
    r = rng.standard_normal(out.shape)
    (out * Tensor(r)).sum().backward()

    def loss(xs: list[np.ndarray]) -> float:
        return float((_forward(fn, xs) * r).sum())

    for i in wrt:
        g = ts[i].grad
        assert g is not None, f"input {i} got no gradient"
        got = g.numpy()
        assert got.shape == arrs_l[i].shape, f"gradient shape {got.shape} != input shape {arrs_l[i].shape}"
        a = arrs_l[i]
        if a.size <= max_coords:
            dirs = [np.eye(a.size)[k].reshape(a.shape) for k in range(a.size)]
        else:
            dirs = [rng.standard_normal(a.shape) for _ in range(directions)]
        for d in dirs:
            plus = [x + H * d if j == i else x for j, x in enumerate(arrs_l)]
            minus = [x - H * d if j == i else x for j, x in enumerate(arrs_l)]
            fd = (loss(plus) - loss(minus)) / (2 * H)
            an = float((got * d).sum())
            assert abs(an - fd) <= atol + rtol * abs(fd) + 1e-7 * max(1.0, abs(fd)) * 10, (
                f"input {i}: gradient . direction = {an}, finite difference = {fd}"
            )


def away(shape: tuple[int, ...], seed: int, lo: float = 0.2, hi: float = 2.0) -> np.ndarray:
    """Values with |x| in [lo, hi] and random sign: away from 0 (the kink of relu/abs) and distinct (no max ties)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    mags = np.sort(rng.uniform(lo, hi, n))
    mags = mags + np.arange(n) * 1e-3  # strictly distinct magnitudes
    return (rng.permutation(mags) * rng.choice([-1.0, 1.0], n)).reshape(shape)


def pos(shape: tuple[int, ...], seed: int, lo: float = 0.5, hi: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape)


# ---------------- elementwise (unary) ----------------
UNARY: dict[str, tuple[Callable[[Tensor], Tensor], str]] = {
    "neg": (lambda x: -x, "any"),
    "exp": (lambda x: x.exp(), "any"),
    "exp2": (lambda x: x.exp2(), "any"),
    "log": (lambda x: x.log(), "pos"),
    "log2": (lambda x: x.log2(), "pos"),
    "sqrt": (lambda x: x.sqrt(), "pos"),
    "rsqrt": (lambda x: x.rsqrt(), "pos"),
    "reciprocal": (lambda x: x.reciprocal(), "away"),
    "sin": (lambda x: x.sin(), "any"),
    "cos": (lambda x: x.cos(), "any"),
    "tan": (lambda x: x.tan(), "small"),
    "tanh": (lambda x: x.tanh(), "any"),
    "sigmoid": (lambda x: x.sigmoid(), "any"),
    "relu": (lambda x: x.relu(), "away"),
    "abs": (lambda x: x.abs(), "away"),
    "square": (lambda x: x.square(), "any"),
    "leaky_relu": (lambda x: x.leaky_relu(0.1), "away"),
    "elu": (lambda x: x.elu(), "away"),
    "celu": (lambda x: x.celu(0.7), "away"),
    "selu": (lambda x: x.selu(), "away"),
    "gelu": (lambda x: x.gelu(), "any"),
    "quick_gelu": (lambda x: x.quick_gelu(), "any"),
    "silu": (lambda x: x.silu(), "any"),
    "swish": (lambda x: x.swish(), "any"),
    "mish": (lambda x: x.mish(), "any"),
    "softplus": (lambda x: x.softplus(), "any"),
    "hardswish": (lambda x: x.hardswish(), "away3"),
    "hardsigmoid": (lambda x: x.hardsigmoid(), "away3"),
    "hardtanh": (lambda x: x.hardtanh(), "away1"),
    "relu6": (lambda x: x.relu6(), "away"),
    "logsigmoid": (lambda x: x.logsigmoid(), "any"),
    "softsign": (lambda x: x.softsign(), "away"),
    "pow_const": (lambda x: x**3, "any"),
    "pow_frac": (lambda x: x**0.5, "pos"),
    "rpow": (lambda x: 2.0**x, "any"),
    "clip": (lambda x: x.clip(-1, 1), "away1"),
    "erf": (lambda x: x.erf(), "any"),
}


def _unary_input(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    if kind == "pos":
        return pos(shape, seed)
    if kind == "small":
        return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)
    x = away(shape, seed)
    if kind == "away1":  # keep away from +-1 as well (kinks of hardtanh/clip)
        x = np.where(np.abs(np.abs(x) - 1) < 0.1, x * 1.3, x)
    if kind == "away3":  # hardswish/hardsigmoid kinks at +-3
        x = x * 2.0
        x = np.where(np.abs(np.abs(x) - 3) < 0.2, x * 0.8, x)
    return x


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_grad(name: str) -> None:
    fn, kind = UNARY[name]
    gradcheck(fn, _unary_input(kind, (2, 3), 7))


# ---------------- elementwise (binary, broadcasting) ----------------
BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": lambda a, b: a.maximum(b),
    "minimum": lambda a, b: a.minimum(b),
    "pow": lambda a, b: a.abs() ** b,
    "where": lambda a, b: (a > 0).where(a, b),
    "lerp": lambda a, b: a.lerp(b, 0.3),
}
BCAST = [((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((), (2, 3)), ((2, 1, 3), (4, 1))]


@given(name=st.sampled_from(sorted(BINARY)), shapes=st.sampled_from(BCAST), seed=st.integers(0, 2**16))
@SOME
def test_binary_grad_broadcast(name: str, shapes: tuple[tuple[int, ...], tuple[int, ...]], seed: int) -> None:
    sa, sb = shapes
    a, b = away(sa, seed), away(sb, seed + 1)
    if name == "maximum" or name == "minimum":
        b = b + 0.05  # no ties between the operands
    gradcheck(BINARY[name], a, b)


# ---------------- reductions ----------------
REDUCE: dict[str, Callable[[Tensor, Any, bool], Tensor]] = {
    "sum": lambda x, ax, kd: x.sum(axis=ax, keepdim=kd),
    "mean": lambda x, ax, kd: x.mean(axis=ax, keepdim=kd),
    "max": lambda x, ax, kd: x.max(axis=ax, keepdim=kd),
    "min": lambda x, ax, kd: x.min(axis=ax, keepdim=kd),
    "prod": lambda x, ax, kd: x.prod(axis=ax, keepdim=kd),
    "var": lambda x, ax, kd: x.var(axis=ax, keepdim=kd),
    "std": lambda x, ax, kd: x.std(axis=ax, keepdim=kd),
    "logsumexp": lambda x, ax, kd: x.logsumexp(axis=ax, keepdim=kd),
}


@given(name=st.sampled_from(sorted(REDUCE)), axis=st.sampled_from([None, 0, 1, -1, (0, 2)]), keepdim=st.booleans(),
       seed=st.integers(0, 2**16))  # fmt: skip
@SOME
def test_reduce_grad(name: str, axis: Any, keepdim: bool, seed: int) -> None:
    gradcheck(lambda x: REDUCE[name](x, axis, keepdim), away((2, 3, 2), seed))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cumsum", "cumprod_pos", "normalize"])
def test_axis_ops_grad(name: str) -> None:
    x = away((2, 4), 3)
    if name == "softmax":
        gradcheck(lambda t: t.softmax(-1), x)
    elif name == "log_softmax":
        gradcheck(lambda t: t.log_softmax(0), x)
    elif name == "cumsum":
        gradcheck(lambda t: t.cumsum(1), x)
    elif name == "cumprod_pos":
        gradcheck(lambda t: t.cumprod(1), pos((2, 4), 3))
    else:
        gradcheck(lambda t: t / (t * t).sum(-1, keepdim=True).sqrt(), x)


# ---------------- matmul ----------------
@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((2, 3), (3, 4)), ((2, 2, 3), (3, 2)), ((3,), (3, 2)),
                                   ((2, 1, 2, 3), (2, 3, 2))])  # fmt: skip
def test_matmul_grad(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    gradcheck(lambda a, b: a @ b, away(sa, 1), away(sb, 2))


# ---------------- movement ----------------
MOVEMENT: dict[str, Callable[[Tensor], Tensor]] = {
    "reshape": lambda x: x.reshape(3, 4),
    "permute": lambda x: x.permute(2, 0, 1),
    "transpose": lambda x: x.transpose(0, 2),
    "expand": lambda x: x.reshape(2, 1, 3, 2).expand(2, 3, 3, 2),
    "pad": lambda x: x.pad(((1, 0), (0, 2), (1, 1))),
    "pad_value": lambda x: x.pad(((0, 1), (1, 0), (0, 0)), value=2.0),
    "shrink": lambda x: x.shrink(((0, 1), (1, 3), (0, 2))),
    "flip": lambda x: x.flip(1),
    "flip_all": lambda x: x.flip((0, 1, 2)),
    "slice_step": lambda x: x[:, ::2, ::-1],
    "slice_neg": lambda x: x[1:, -2:],
    "squeeze_unsqueeze": lambda x: x.unsqueeze(1).squeeze(1),
    "flatten": lambda x: x.flatten(1),
    "cat": lambda x: x.cat(x * 2, dim=1),
    "stack": lambda x: Tensor.stack(x, x.exp(), dim=0),
    "repeat": lambda x: x.repeat(2, 1, 1),
    "chunk": lambda x: x.chunk(3, dim=1)[1],
    "split": lambda x: x.split([1, 2], dim=1)[1] * 3,
    "unfold": lambda x: x.unfold(1, 2, 1),
    "roll": lambda x: x.roll(1, 1),
    "tril": lambda x: x.tril(),
    "triu": lambda x: x.triu(1),
}


@pytest.mark.parametrize("name", sorted(MOVEMENT))
def test_movement_grad(name: str) -> None:
    fn = MOVEMENT[name]
    gradcheck(fn, away((2, 3, 2), 5))


# ---------------- indexing ----------------
def test_getitem_int_index_grad() -> None:
    gradcheck(lambda x: x[1, :, 0], away((2, 3, 2), 1))


def test_getitem_tensor_index_grad() -> None:
    # a repeated index accumulates
    idx = Tensor(np.array([2, 0, 2], dtype=np.int32))
    gradcheck(lambda x: x[idx], away((3, 2), 1))
    gradcheck(lambda x: x[:, idx], away((2, 3), 2))


def test_gather_grad() -> None:
    idx = Tensor(np.array([[0, 2, 2], [1, 1, 0]], dtype=np.int32))
    gradcheck(lambda x: x.gather(1, idx), away((2, 3), 3))


def test_masked_grad() -> None:
    m = Tensor(np.array([[True, False, True], [False, False, True]]))
    gradcheck(lambda x: m.where(x, 0.0) + x.masked_fill(m, 1.5), away((2, 3), 4))


@pytest.mark.slow
@given(seed=st.integers(0, 2**16), k=st.integers(1, 3))
@FEW
def test_composite_grad(seed: int, k: int) -> None:
    """A small MLP-like graph: matmul, bias broadcast, relu, softmax cross-entropy against fixed labels."""
    y = Tensor(np.random.default_rng(seed).integers(0, 3, 4).astype(np.int32))

    def f(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        h = (x @ w + b).relu() * k
        return h.sparse_categorical_crossentropy(y)

    gradcheck(f, away((4, 2), seed), away((2, 3), seed + 1), away((3,), seed + 2))


# ---------------- API behaviour ----------------
def test_gradient_matches_backward_and_accumulates() -> None:
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (g,) = (x * x).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0, 6.0])
    (x * x).sum().backward()
    (x * 3).sum().backward()  # .grad accumulates across backward() calls
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0, 9.0])


def test_detach_blocks_gradient() -> None:
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (g,) = (x * x.detach()).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0])
    (z,) = x.detach().sum().gradient(x)  # not reached by any gradient: zeros of its shape
    np.testing.assert_array_equal(z.numpy(), [0.0, 0.0])


def test_non_scalar_backward_needs_seed() -> None:
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="gradient="):
        (x * 2).backward()
    (x * 2).backward(Tensor(np.array([1.0, 10.0])))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 20.0])


def test_backward_needs_no_requires_grad_flag() -> None:
    x = Tensor(np.array([1.0, 2.0]))
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_requires_grad_false_gets_no_grad() -> None:
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = Tensor(np.array([3.0, 4.0]), requires_grad=False)
    (x * y).sum().backward()
    assert y.grad is None
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


def test_float32_grad_dtype() -> None:
    x = Tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    (x.half().float() * x).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtypes.float32
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0], rtol=1e-3)


def test_int_root_cannot_be_differentiated() -> None:
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="float dtype"):
        (x > 1).sum().gradient(x)


def test_train_context_sets_and_restores() -> None:
    from speck.tensor import TRAINING, Context
    from speck.tensor.tensor import is_training

    assert not is_training()
    with Tensor.train():
        assert is_training() and Tensor.training
        with Tensor.train(False):
            assert not is_training()
        assert is_training()
    assert not is_training() and not Tensor.training
    with Context(TRAINING=1):
        assert is_training()
    assert TRAINING.value == 0


@pytest.mark.parametrize("zeros", [1, 2])
def test_prod_grad_with_zeros(zeros: int) -> None:
    """prod is multilinear, so finite differences are exact even at zeros: one zero gets the product of the rest,
    two zeros make every gradient 0 (no nan from prod / x)."""
    x = away((2, 4), 9)
    x[0, :zeros] = 0.0
    x[1, 3] = 0.0
    gradcheck(lambda t: t.prod(axis=1), x)
    gradcheck(lambda t: t.prod(), x)
