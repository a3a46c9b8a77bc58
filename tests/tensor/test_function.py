"""@function: the body is captured once per input signature and instantiated per call; results match numpy and
the plain (undecorated) function, kernels fuse across the boundary, gradients flow through it, implicit inputs and
device use inside the body are clear errors, and a failing body leaves no state behind."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.kernel_info import KernelInfo
from speck.tensor import Tensor, assert_kernel_count, function
from speck.tensor.function import Function, FunctionError
from speck.tensor.realize import DeviceUsageError
from speck.tensor.settings import ALLOW_DEVICE_USAGE
from speck.uop import UOp
from tensor_helpers import FEW


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


def test_import_forms() -> None:
    import speck.tensor

    assert speck.tensor.function is function
    assert isinstance(function(lambda x: x), Function)
    assert isinstance(function(allow_implicit=True, precompile=False)(lambda x: x), Function)


def test_one_elementwise_op_is_one_kernel() -> None:
    @function
    def double(x: Tensor) -> Tensor:
        return x * 2

    an = _rand(8, 8, seed=1)
    a = Tensor(an).realize()
    with assert_kernel_count(1):
        got = double(a).numpy()
    np.testing.assert_array_equal(got, an * 2)


def test_captured_once_per_signature() -> None:
    traced: list[tuple[int, ...]] = []

    @function
    def f(x: Tensor, y: Tensor, scale: float) -> Tensor:
        traced.append(tuple(x.shape))
        return (x + y) * scale

    a, b = _rand(3, 4, seed=2), _rand(3, 4, seed=3)
    np.testing.assert_allclose(f(Tensor(a), Tensor(b), 2.0).numpy(), (a + b) * 2)
    np.testing.assert_allclose(f(Tensor(b), Tensor(a), 2.0).numpy(), (a + b) * 2)
    assert traced == [(3, 4)] and len(f.captures) == 1
    np.testing.assert_allclose(f(Tensor(b), Tensor(a), 3.0).numpy(), (a + b) * 3)  # a new Python value: new trace
    c = _rand(5, seed=4)
    np.testing.assert_allclose(f(Tensor(c), Tensor(c), 1.0).numpy(), c + c)  # new shape: new trace
    assert traced == [(3, 4), (3, 4), (5,)] and len(f.captures) == 3


def test_same_input_twice_and_nested() -> None:
    @function
    def inner(x: Tensor, y: Tensor) -> Tensor:
        return x * y + 1

    @function
    def outer(x: Tensor) -> Tensor:
        return inner(x, x).sum() + inner(x, x + 1).max()

    an = _rand(4, 5, seed=5)
    got = outer(Tensor(an)).item()
    ref = (an * an + 1).sum() + (an * (an + 1) + 1).max()
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    np.testing.assert_allclose(inner(Tensor(an), Tensor(an)).numpy(), an * an + 1, rtol=1e-6)


def test_tuple_return_and_method() -> None:
    class Layer:
        def __init__(self, w: np.ndarray) -> None:
            self.w = Tensor(w)

        @function
        def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
            y = x @ self.w
            return y.relu(), y.sum()

    wn, xn = _rand(4, 3, seed=6), _rand(2, 4, seed=7)
    layer = Layer(wn)
    r, s = layer(Tensor(xn))
    np.testing.assert_allclose(r.numpy(), np.maximum(xn @ wn, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.item(), (xn @ wn).sum(), rtol=1e-5)
    other = Layer(wn * 2)  # same class, same shapes: the capture is reused with this instance's weight
    np.testing.assert_allclose(other(Tensor(xn))[0].numpy(), np.maximum(xn @ (wn * 2), 0), rtol=1e-5, atol=1e-6)


def test_backward_through_function() -> None:
    @function
    def loss(x: Tensor, w: Tensor) -> Tensor:
        return ((x @ w).tanh() ** 2).mean()

    xn, wn = _rand(3, 4, seed=8), _rand(4, 2, seed=9)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    loss(x, w).backward()
    x2, w2 = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    loss.fn(x2, w2).backward()  # the plain function: the reference gradients
    assert x.grad is not None and w.grad is not None and x2.grad is not None and w2.grad is not None
    # (tanh's gradient is its own rule in the plain function and the traced graph's inside @function: float32
    # rounding apart, not more)
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=1e-4, atol=1e-6)
    t = np.tanh(xn @ wn)
    np.testing.assert_allclose(w.grad.numpy(), xn.T @ (2 * t * (1 - t * t) / t.size), rtol=1e-4, atol=1e-6)


def test_implicit_inputs() -> None:
    weight = Tensor(_rand(4, 4, seed=10)).realize()

    @function
    def strict(x: Tensor) -> Tensor:
        return x @ weight

    with pytest.raises(FunctionError, match="'weight'.*allow_implicit=True"):
        strict(Tensor(_rand(2, 4, seed=11)))

    @function(allow_implicit=True)
    def loose(x: Tensor) -> Tensor:
        return x @ weight

    xn = _rand(2, 4, seed=12)
    np.testing.assert_allclose(loose(Tensor(xn)).numpy(), xn @ weight.numpy(), rtol=1e-5, atol=1e-6)
    new_w = _rand(4, 4, seed=13)
    weight.assign(Tensor(new_w))  # an in-place update of the implicit input is seen by the next call
    np.testing.assert_allclose(loose(Tensor(xn)).numpy(), xn @ new_w, rtol=1e-5, atol=1e-6)


def test_exception_in_body_restores_state() -> None:
    @function
    def broken(x: Tensor) -> Tensor:
        raise ValueError("boom")

    an = _rand(3, seed=14)
    a = Tensor(an)
    before = a.uop
    with pytest.raises(ValueError, match="boom"):
        broken(a)
    assert a.uop is before and ALLOW_DEVICE_USAGE.value == 1 and not broken.captures
    np.testing.assert_array_equal((a + 1).numpy(), an + 1)


def test_device_use_and_bad_returns_are_errors() -> None:
    @function
    def reads(x: Tensor) -> Tensor:
        return Tensor((x + 1).numpy())

    @function
    def reads_input(x: Tensor) -> Tensor:
        return Tensor(x.numpy())

    a = Tensor(_rand(3, seed=15)).realize()
    for fn in (reads, reads_input):
        with pytest.raises(AssertionError, match="@function"):
            fn(a)
    with pytest.raises(DeviceUsageError):
        reads(a)

    @function
    def not_tensors(x: Tensor) -> int:
        return 3

    with pytest.raises(FunctionError, match="must return a Tensor or a tuple of Tensors, got int"):
        not_tensors(a)


def test_empty_in_body_is_fresh_per_call() -> None:
    @function
    def fill(x: Tensor) -> Tensor:
        return Tensor.custom_kernel(Tensor.empty(*x.shape), x, fxn=_scale3)[0]

    a, b = _rand(6, seed=16), _rand(6, seed=17)
    ra, rb = fill(Tensor(a)), fill(Tensor(b))
    Tensor.realize(ra, rb)
    np.testing.assert_allclose(ra.numpy(), a * 3, rtol=1e-6)  # not overwritten by the second call's kernel
    np.testing.assert_allclose(rb.numpy(), b * 3, rtol=1e-6)


def _scale3(out: UOp, x: UOp) -> UOp:
    i = UOp.range(x.size, 0)
    return out[i].store(x[i] * 3).end(i).sink(arg=KernelInfo(name="scale3"))


def test_custom_kernel_through_function_kernel_bound() -> None:
    from test_custom_kernel import gemm_kernel

    @function
    def mm(a: Tensor, b: Tensor) -> Tensor:
        return Tensor.custom_kernel(Tensor.empty(a.shape[0], b.shape[1]), a, b, fxn=gemm_kernel)[0]

    an, bn = _rand(5, 3, seed=18), _rand(3, 4, seed=19)
    a, b = Tensor(an).realize(), Tensor(bn).realize()
    with assert_kernel_count(1):
        got = mm(a, b).numpy()
    np.testing.assert_allclose(got, an @ bn, rtol=1e-5, atol=1e-6)


def test_precompile_materialises_outputs() -> None:
    @function(precompile=True)
    def f(x: Tensor) -> Tensor:
        return x + 1

    an = _rand(4, seed=20)
    a = Tensor(an).realize()
    with assert_kernel_count(2):  # the body's output is a kernel of its own, *2 another
        got = (f(a) * 2).numpy()
    np.testing.assert_allclose(got, (an + 1) * 2)


@FEW
@given(shape=st.sampled_from([(1,), (5,), (2, 3), (4, 1)]), seed=st.integers(0, 100))
def test_matches_plain_function(shape: tuple[int, ...], seed: int) -> None:
    def body(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return (x * y - x.exp()).softmax(-1), (x - y).abs().sum()

    f = function(body)
    xn, yn = _rand(*shape, seed=seed), _rand(*shape, seed=seed + 1)
    got = f(Tensor(xn), Tensor(yn))
    ref = body(Tensor(xn), Tensor(yn))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got[1].item(), np.abs(xn - yn).sum(), rtol=1e-5)


def test_grad_fxn_replaces_the_backward_of_each_call() -> None:
    # TENSOR_API 13.1 (function(grad_fxn=...) was a TypeError): grad_fxn(grad, call) -> one gradient per input
    seen: list[tuple[tuple[int, ...], ...]] = []

    def scaled(grad: UOp, call: UOp) -> tuple[Tensor, None]:
        seen.append(tuple(s.shape for s in call.src))
        return Tensor(grad) * 10, None  # a Tensor is accepted as a gradient; None: nothing flows to b

    @function(grad_fxn=scaled)
    def mul(a: Tensor, b: Tensor) -> Tensor:
        return a * b

    a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0], requires_grad=True)
    out = mul(a, b)
    assert out.tolist() == [3.0, 8.0]
    (out * Tensor([1.0, 2.0])).sum().backward()
    assert a.grad is not None and a.grad.tolist() == [10.0, 20.0]
    assert b.grad is None or b.grad.tolist() == [0.0, 0.0]
    assert seen == [((2,), (2,))]
    # the same expression outside the function keeps the ordinary gradient (the call's output node is its own)
    a.grad = None
    (a * b).sum().backward()
    assert a.grad is not None and a.grad.tolist() == [3.0, 4.0]


def test_grad_fxn_with_several_outputs_gets_the_grads_and_the_call_by_keyword() -> None:
    got: list[tuple[bool, bool]] = []

    def back(g_sum: UOp | None, g_diff: UOp | None, call: UOp) -> tuple[UOp, UOp]:
        got.append((g_sum is not None, g_diff is not None))
        g = g_sum if g_sum is not None else g_diff
        assert g is not None and len(call.src) == 2
        return g, g * 3  # deliberately not the true gradient of y

    @function(grad_fxn=back)
    def sum_diff(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x + y, x - y

    x, y = Tensor([1.0, 2.0], requires_grad=True), Tensor([5.0, 7.0], requires_grad=True)
    s, d = sum_diff(x, y)
    assert s.tolist() == [6.0, 9.0] and d.tolist() == [-4.0, -5.0]
    (s * 2).sum().backward()  # only the first output is used: back(grad, None, call=...)
    assert got == [(True, False)]
    assert x.grad is not None and y.grad is not None
    assert x.grad.tolist() == [2.0, 2.0] and y.grad.tolist() == [6.0, 6.0]


def test_grad_fxn_returning_the_wrong_count_is_an_error() -> None:
    @function(grad_fxn=lambda g, call: (g,))
    def two(p: Tensor, q: Tensor) -> Tensor:
        return p * q

    p = Tensor([1.0], requires_grad=True)  # (a live tensor: backward fills only those)
    with pytest.raises(FunctionError, match="returned 1 gradient"):
        two(p, Tensor([2.0])).sum().backward()
