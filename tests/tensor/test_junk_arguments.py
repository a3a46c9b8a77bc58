"""Junk arguments to public Tensor methods (None, a str, a dict, a numpy array, a float where an int belongs, a
nested list, a dtype) are speck's own errors naming what was expected: each case once failed deep inside with a
builtin AttributeError or TypeError ("'NoneType' object has no attribute 'uop'", "object of type 'float' has no
len()", "unsupported operand type(s) for -: 'int' and 'DType'"). Valid arguments keep their results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes, nn
from speck.tensor.errors import TensorError
from speck.tensor.nn import optim

JUNK: list[Any] = [None, "abc", {"a": 1}, np.zeros((2, 2)), [[1, [2]]], dtypes.float32]
NON_TENSORS: list[Any] = [*JUNK, 2.5, 3]
NON_INTS: list[Any] = [*JUNK, 2.5]


def t22() -> Tensor:
    return Tensor([[1.0, 2.0], [3.0, 4.0]])


def _refused(call: Callable[[], Any], err: type[Exception]) -> str:
    with pytest.raises(err) as info:
        r = call()
        for x in r if isinstance(r, tuple) else (r,):
            if isinstance(x, Tensor):
                x.realize()
    assert isinstance(info.value, TensorError), f"{type(info.value).__name__}: {info.value}"
    return str(info.value)


TENSOR_TAKERS: dict[str, Callable[[Any], Any]] = {
    "schedule": lambda j: t22().schedule(j),
    "schedule_with_vars": lambda j: t22().schedule_with_vars(j),
    "schedule_linear": lambda j: t22().schedule_linear(j),
    "linear_with_vars": lambda j: t22().linear_with_vars(j),
    "callify": lambda j: t22().callify(j),
    "shard_like": lambda j: t22().shard_like(j),
    "realize_all": lambda j: Tensor.realize_all(t22(), j),
    "assign_deferred": lambda j: t22().realize().assign_deferred(j),
    "cat_tensors": lambda j: Tensor.cat_tensors([t22(), j]),
}


@pytest.mark.parametrize("junk", NON_TENSORS, ids=repr)
@pytest.mark.parametrize("name", sorted(TENSOR_TAKERS))
def test_a_non_tensor_where_a_tensor_belongs_is_a_type_error_naming_it(name: str, junk: Any) -> None:
    msg = _refused(lambda: TENSOR_TAKERS[name](junk), TypeError)
    assert "must be a Tensor" in msg and name in msg


@pytest.mark.parametrize("junk", [None, t22(), 3, "ab", ()], ids=repr)
def test_cat_tensors_takes_a_non_empty_list(junk: Any) -> None:
    assert "non-empty list" in _refused(lambda: Tensor.cat_tensors(junk), TypeError)


def test_cat_tensors_and_schedules_of_tensors_keep_working() -> None:
    a, b = Tensor([1.0, 2.0]), Tensor([3.0])
    assert Tensor.cat_tensors([a, b]).tolist() == [1.0, 2.0, 3.0]
    assert Tensor.cat_tensors((a,)).tolist() == [1.0, 2.0]
    assert len((a + 1).schedule(b + 1)) >= 1
    c = (a * 2).callify()
    assert c.tolist() == [2.0, 4.0]


INITIALIZERS = ["scaled_uniform", "glorot_uniform", "kaiming_uniform", "kaiming_normal"]


@pytest.mark.parametrize("junk", [*NON_INTS, (2, None), (2, "3")], ids=repr)
@pytest.mark.parametrize("name", INITIALIZERS)
def test_an_initializer_with_a_junk_shape_is_a_type_error(name: str, junk: Any) -> None:
    msg = _refused(lambda: getattr(Tensor, name)(*(junk if isinstance(junk, tuple) else (junk,))), TypeError)
    assert "must be an int" in msg and name in msg


@pytest.mark.parametrize("name", INITIALIZERS)
def test_an_initializer_with_a_negative_dim_is_a_value_error(name: str) -> None:
    _refused(lambda: getattr(Tensor, name)(3, -2), ValueError)


@pytest.mark.parametrize("junk", [None, "abc", dtypes.float32, [1]], ids=repr)
@pytest.mark.parametrize("name", ["kaiming_uniform", "kaiming_normal"])
def test_kaiming_with_a_junk_slope_is_a_type_error(name: str, junk: Any) -> None:
    assert "real number" in _refused(lambda: getattr(Tensor, name)(3, 4, a=junk), TypeError)


@pytest.mark.parametrize("name", INITIALIZERS)
@pytest.mark.parametrize("shape", [(3, 4), (np.int64(3), 4), ((5, 2),), (4, 0)], ids=repr)
def test_initializers_keep_their_shapes_and_bounds(name: str, shape: tuple[Any, ...]) -> None:
    t = getattr(Tensor, name)(*shape)
    want = tuple(int(d) for d in (shape[0] if isinstance(shape[0], tuple) else shape))
    assert t.shape == want
    v = t.numpy()
    assert np.isfinite(v).all()
    if name != "kaiming_normal" and v.size:
        rest = int(np.prod(want[1:]))
        fan = want[0] + rest if name == "glorot_uniform" else rest if "kaiming" in name else int(np.prod(want))
        bound = {"scaled_uniform": fan**-0.5, "glorot_uniform": (6 / fan) ** 0.5,
                 "kaiming_uniform": 3**0.5 * (2 / (1 + 0.01**2)) ** 0.5 / fan**0.5}[name]  # fmt: skip
        assert np.abs(v).max() <= bound + 1e-6


@pytest.mark.parametrize("junk", [None, {"a": 1}, 2.5, np.zeros((2, 2)), t22(), dtypes.float32], ids=repr)
def test_rearrange_with_a_non_str_formula_is_a_type_error(junk: Any) -> None:
    assert "formula must be a str" in _refused(lambda: t22().rearrange(junk), TypeError)


def test_rearrange_with_a_junk_size_is_a_type_error() -> None:
    _refused(lambda: Tensor.ones(6).rearrange("(a b) -> a b", a="2"), TypeError)
    assert Tensor.arange(6).rearrange("(a b) -> b a", a=2).tolist() == np.arange(6).reshape(2, 3).T.tolist()


@pytest.mark.parametrize("junk", [None, 2.5, dtypes.float32, 3], ids=repr)
def test_shrink_with_a_non_sequence_is_a_type_error(junk: Any) -> None:
    assert "(begin, end) pair" in _refused(lambda: t22().shrink(junk), TypeError)


@pytest.mark.parametrize("junk", [((0, 1), 5), ((0, 1), 2.5), ((0, 1), "ab")], ids=repr)
def test_shrink_with_a_non_pair_for_a_dim_is_a_type_error(junk: Any) -> None:
    assert "(begin, end) pair" in _refused(lambda: t22().shrink(junk), TypeError)


@pytest.mark.parametrize("junk", [((0, 1), (0,)), ((0, 1), (0, 1, 2))], ids=repr)
def test_shrink_with_a_bad_pair_is_a_value_error(junk: Any) -> None:
    assert "(begin, end) pair" in _refused(lambda: t22().shrink(junk), ValueError)


@pytest.mark.parametrize("junk", [((0, 1), (None, 2)), ((0, 1.5), None), (("0", 1), None)], ids=repr)
def test_shrink_with_a_non_int_bound_is_a_type_error(junk: Any) -> None:
    assert "must be an int" in _refused(lambda: t22().shrink(junk), TypeError)


def test_shrink_keeps_lists_none_and_numpy_ints() -> None:
    x = np.arange(12).reshape(3, 4)
    assert Tensor(x).shrink([(1, 3), None]).tolist() == x[1:3].tolist()
    assert Tensor(x).shrink(((np.int64(0), 2), [1, 3])).tolist() == x[0:2, 1:3].tolist()


@pytest.mark.parametrize("size, step", [(None, 1), (2, None), (2.0, 1), ("2", 1), (2, 1.5), (True, 1)], ids=repr)
def test_unfold_with_a_non_int_size_or_step_is_a_type_error(size: Any, step: Any) -> None:
    assert "must be an int" in _refused(lambda: Tensor.arange(6).unfold(0, size, step), TypeError)


def test_unfold_takes_numpy_ints_like_ints() -> None:
    want = Tensor.arange(6).unfold(0, 2, 2).tolist()
    assert Tensor.arange(6).unfold(0, np.int64(2), np.int32(2)).tolist() == want == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("junk", [None, "1", dtypes.float32, [1], np.zeros(2)], ids=repr)
@pytest.mark.parametrize("name", ["var", "std", "var_mean", "std_mean"])
def test_a_junk_correction_is_a_type_error(name: str, junk: Any) -> None:
    assert "correction must be a real number" in _refused(lambda: getattr(t22(), name)(correction=junk), TypeError)


@pytest.mark.parametrize("correction", [0, 1, 2, 0.5, np.int64(1)], ids=repr)
def test_var_and_std_take_numeric_corrections_like_numpy(correction: Any) -> None:
    x = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 9.0]], dtype=np.float32)
    np.testing.assert_allclose(Tensor(x).var(1, correction=correction).numpy(), x.var(1, ddof=float(correction)),
                               rtol=1e-5)  # fmt: skip
    np.testing.assert_allclose(Tensor(x).std(correction=correction).numpy(), x.std(ddof=float(correction)), rtol=1e-5)


@pytest.mark.parametrize("junk", [None, "a", dtypes.float32, np.zeros(2)], ids=repr)
def test_dropout_multinomial_diagonal_squeeze_refuse_junk(junk: Any) -> None:
    with Tensor.train():
        _refused(lambda: t22().dropout(junk), TypeError)
    _refused(lambda: Tensor([1.0, 2.0]).multinomial(junk), TypeError)
    _refused(lambda: t22().diagonal(junk), TypeError)
    _refused(lambda: Tensor.ones(1, 2).squeeze(junk if junk is not None else 2.5), IndexError)  # (resolve_dim's)


@pytest.mark.parametrize("junk", NON_TENSORS, ids=repr)
def test_losses_and_unpool_refuse_a_non_tensor_target(junk: Any) -> None:
    x = Tensor([0.2, 0.7])
    assert "target 0 must be a Tensor" in _refused(lambda: x.binary_crossentropy(junk), TypeError)
    assert "target 0 must be a Tensor" in _refused(lambda: x.binary_crossentropy_logits(junk), TypeError)
    if junk is not None:  # (None: no pos_weight)
        _refused(lambda: x.binary_crossentropy_logits(Tensor([0.0, 1.0]), pos_weight=junk), TypeError)
    assert "indices" in _refused(lambda: Tensor.ones(1, 1, 2, 2).max_unpool2d(junk), TypeError)


def test_binary_crossentropy_matches_numpy() -> None:
    p, y, w = np.array([0.2, 0.7], np.float32), np.array([0.0, 1.0], np.float32), np.array([2.0, 3.0], np.float32)
    want = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    np.testing.assert_allclose(Tensor(p).binary_crossentropy(Tensor(y)).item(), want, rtol=1e-5)
    z = np.array([-1.0, 2.0], np.float32)
    want_l = ((1 - y) * z + (1 + (w - 1) * y) * (np.log1p(np.exp(-np.abs(z))) + np.maximum(-z, 0))).mean()
    np.testing.assert_allclose(Tensor(z).binary_crossentropy_logits(Tensor(y), pos_weight=Tensor(w)).item(), want_l,
                               rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("junk", [None, 2.5, "ab", [1, "x"], [Tensor.ones(2)]], ids=repr)
def test_sequential_takes_a_list_of_callables(junk: Any) -> None:
    assert "list of callables" in _refused(lambda: Tensor.ones(2).sequential(junk), TypeError)
    assert Tensor([1.0, -2.0]).sequential([Tensor.relu, lambda x: x + 1]).tolist() == [2.0, 1.0]


@pytest.mark.parametrize("junk", [np.zeros((2, 2)), [1, 2], Tensor([1.0, 2.0])], ids=repr)
def test_full_with_a_non_scalar_fill_is_a_value_error(junk: Any) -> None:
    assert "fill_value must be a scalar" in _refused(lambda: Tensor.full((2,), junk), ValueError)
    _refused(lambda: Tensor([1.0, 2.0]).full_like(junk), ValueError)
    assert Tensor.full((2,), np.array(3.0)).tolist() == Tensor.full((2,), np.float32(3)).tolist() == [3.0, 3.0]


@pytest.mark.parametrize("junk", [None, 2.5, {"a": 1}, [[1, [2]]], dtypes.float32], ids=repr)
def test_from_url_with_a_non_str_url_is_a_type_error(junk: Any) -> None:
    assert "url must be a str" in _refused(lambda: Tensor.from_url(junk), TypeError)


def test_from_url_with_neither_a_url_nor_a_path_is_a_value_error() -> None:
    assert "'./abc'" in _refused(lambda: Tensor.from_url("abc"), ValueError)


LAYERS: dict[str, Callable[[Any], Any]] = {
    "Linear in": lambda j: nn.Linear(j, 3),
    "Linear out": lambda j: nn.Linear(3, j),
    "LayerNorm": lambda j: nn.LayerNorm(j),
    "LSTMCell input": lambda j: nn.LSTMCell(j, 3),
    "LSTMCell hidden": lambda j: nn.LSTMCell(3, j),
    "Conv2d ndim": lambda j: nn.Conv2d(2, 3, 3, ndim=j),
    "ConvTranspose2d ndim": lambda j: nn.ConvTranspose2d(2, 3, 3, ndim=j),
}


@pytest.mark.parametrize("junk", NON_INTS, ids=repr)
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_with_a_junk_size_is_a_type_error_naming_the_layer(layer: str, junk: Any) -> None:
    assert layer.split()[0] in _refused(lambda: LAYERS[layer](junk), TypeError)


def test_lstm_with_a_negative_size_is_a_value_error_and_layers_keep_their_shapes() -> None:
    _refused(lambda: nn.LSTMCell(3, -3), ValueError)
    assert nn.Linear(np.int64(3), 4).weight.shape == (4, 3)
    assert nn.LayerNorm((2, 3)).weight.shape == (2, 3) and nn.LayerNorm(4).weight.shape == (4,)
    assert nn.LSTMCell(3, 4).weight_ih.shape == (16, 3)
    assert nn.Conv2d(2, 3, 3, ndim=1).weight.shape == (3, 2, 3)


@pytest.mark.parametrize("junk", [None, 2.5, 3, dtypes.float32, "ab", Tensor.ones(2, 2), [[Tensor.ones(2)]],
                                  [np.zeros(2)], [{"a": 1}]], ids=repr)  # fmt: skip
def test_an_optimizer_given_no_list_of_tensors_is_a_type_error(junk: Any) -> None:
    assert "list of Tensors" in _refused(lambda: optim.SGD(junk), TypeError)


def test_an_optimizer_takes_any_iterable_of_tensors() -> None:
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD({"w": w}.values(), lr=0.5)
    with Tensor.train():
        (w * w).sum().backward()
        opt.step()
    assert w.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("junk", [2.5, 3, dtypes.float32, np.zeros(3)], ids=repr)
def test_lars_with_junk_ns_coefficients_is_a_type_error(junk: Any) -> None:
    w = Tensor([1.0, 2.0], requires_grad=True)
    assert "ns_coefficients" in _refused(lambda: optim.LARS([w], ns_coefficients=junk), TypeError)


@pytest.mark.parametrize("junk", [None, "abc", {"a": 1}, [[1, [2]]], dtypes.float32], ids=repr)
@pytest.mark.parametrize("kw", ["low", "high"])
def test_uniform_with_a_junk_bound_is_a_type_error(kw: str, junk: Any) -> None:
    assert f"{kw} must be a real number" in _refused(lambda: Tensor.uniform(2, **{kw: junk}), TypeError)


@pytest.mark.parametrize("junk", [None, "abc", {"a": 1}, [[1, [2]]], dtypes.float32], ids=repr)
@pytest.mark.parametrize("kw", ["mean", "std"])
def test_normal_with_a_junk_parameter_is_a_type_error(kw: str, junk: Any) -> None:
    assert f"{kw} must be a real number" in _refused(lambda: Tensor.normal(2, **{kw: junk}), TypeError)


def test_uniform_and_normal_keep_numpy_scalar_parameters() -> None:
    u = Tensor.uniform(1000, low=np.float32(-2), high=np.int64(3)).numpy()
    assert u.min() >= -2 and u.max() < 3
    assert Tensor.normal(10, mean=np.float64(5.0), std=0).tolist() == [5.0] * 10


@pytest.mark.parametrize("junk", ["abc", {"a": 1}, np.ones(2), 2.5, [[1, [2]]], dtypes.float32], ids=repr)
def test_a_junk_gradient_seed_is_a_type_error(junk: Any) -> None:
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert "seed must be a Tensor" in _refused(lambda: (x * 2).gradient(x, gradient=junk), TypeError)
    assert "seed must be a Tensor" in _refused(lambda: (x * 2).backward(gradient=junk), TypeError)
    (x * 2).backward(gradient=Tensor([1.0, 3.0]))
    assert x.grad is not None and x.grad.tolist() == [2.0, 6.0]


@pytest.mark.parametrize("wshape, xshape", [((2,), (1, 2, 3, 3)), ((2, 3), (1, 2, 3)), ((2, 3, 3, 3), (2, 3, 3))])
def test_conv_transpose2d_with_mismatched_dims_is_an_assertion_error(
    wshape: tuple[int, ...], xshape: tuple[int, ...]
) -> None:
    assert "conv_transpose2d" in _refused(lambda: Tensor.ones(*xshape).conv_transpose2d(Tensor.ones(*wshape)),
                                          AssertionError)  # fmt: skip
    assert Tensor.conv_transpose2d.__doc__ and "Transposed convolution" in Tensor.conv_transpose2d.__doc__
