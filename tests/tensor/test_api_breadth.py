"""tinygrad API parity of the tensor front end (TENSOR_API sections 0.5, 0.6, 3, 4.1-4.5, 6, 7, 8): dtypes on the
way in and out, the Python protocol, which error class bad input raises, factories, symbolic slicing, rearrange,
einsum, scans, bitcasts, linear algebra and nn layers - differential against numpy wherever values are involved."""

from __future__ import annotations

import math
import operator
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, Variable, dtypes, nn
from speck.uop import truncate
from tensor_helpers import FEW, SOME, arrays, assert_matches

# ---------------------------------------------------------------------------------------------------------------------
# dtypes in and out


@pytest.mark.parametrize("dt", [dtypes.bfloat16, *dtypes.fp8s], ids=lambda d: d.name)
def test_narrow_floats_cast_in_and_read_as_float32(dt) -> None:  # type: ignore[no-untyped-def]
    x = np.array([0.0, 1.0, -2.5, 0.3, 1e6, -1e-6, 3.14159], dtype=np.float64)
    ref = np.array([truncate[dt](float(v)) for v in x], dtype=np.float32)
    for t in (Tensor(x, dtype=dt), Tensor(x.tolist(), dtype=dt), Tensor(x.astype(np.float32)).cast(dt)):
        got = t.numpy()
        assert t.dtype == dt and got.dtype == np.float32
        assert_matches(got, ref, atol=0, rtol=0)
    assert Tensor(x, dtype=dt).tolist() == ref.tolist()
    # arithmetic rounds back to the format after each op, like the constant folder
    two = Tensor(x, dtype=dt) * 2
    assert_matches(two.numpy(), np.array([truncate[dt](float(v) * 2) for v in ref], dtype=np.float32), atol=0, rtol=0)


def test_bytes_and_ints_on_the_way_in() -> None:
    assert Tensor(b"\x01\x00\x02\x00", dtype=dtypes.int16).tolist() == [1, 2]
    assert Tensor(b"\x00\x3f\x80\x3f", dtype=dtypes.bfloat16).tolist() == [0.5, 1.0]
    assert Tensor([-1, 256], dtype=dtypes.uint8).tolist() == [255, 0]
    assert Tensor([1, 2]).dtype == dtypes.int32 and Tensor([1, 2.0]).dtype == dtypes.float32
    assert Tensor([True, 2]).dtype == dtypes.int32 and Tensor([]).shape == (0,)
    assert Tensor(None).shape == () and Tensor(None).item() == 0.0
    with pytest.raises(ValueError):
        Tensor([[1, 2], [3]])


@given(st.sampled_from([np.int8, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32]),
       st.sampled_from([np.uint8, np.int16, np.int32, np.uint32, np.int64, np.float32]), st.integers(0, 9))  # fmt: skip
@SOME
def test_bitcast_across_item_sizes_matches_numpy_view(src: Any, dst: Any, seed: int) -> None:
    n = 8 // np.dtype(src).itemsize * 2  # a last dim whose bytes split into whole dst items
    a = arrays((3, n), src, seed, -100, 100)
    got = Tensor(a).bitcast(dtypes.from_py(0) if False else _dt(dst)).numpy()
    assert_matches(got, a.view(dst), atol=0, rtol=0)


def _dt(npdt: Any) -> Any:
    from speck.tensor.dtype import _from_np_dtype

    return _from_np_dtype(npdt)


def test_bitcast_of_a_disk_file(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "w.bin"
    data = np.arange(6, dtype=np.int32)
    p.write_bytes(data.tobytes())
    t = Tensor(p)
    assert t.device == f"DISK:{p.resolve()}" and t.shape == (24,) and t.dtype == dtypes.uint8
    assert t.bitcast(dtypes.int32).to("CPU").tolist() == data.tolist()
    assert Tensor(p, dtype=dtypes.int32).to("CPU").tolist() == data.tolist()
    assert Tensor(p, device="CPU").tolist() == list(data.view(np.uint8))
    assert t[4:8].to("CPU").tolist() == [1, 0, 0, 0]


# ---------------------------------------------------------------------------------------------------------------------
# protocol and error classes


def test_python_protocol() -> None:
    t = Tensor([1, 2, 3])
    with pytest.raises(TypeError):
        bool(t)
    with pytest.raises(TypeError):
        _ = t in [Tensor([1])]
    with pytest.raises(TypeError):
        len(Tensor(1))
    with pytest.raises(TypeError):
        del t[0]
    for f in (float, int, round, operator.index):
        with pytest.raises(TypeError):
            f(Tensor([1]))  # type: ignore[arg-type]
    assert [x.item() for x in t] == [1, 2, 3] and list(Tensor(5)) == []
    assert repr(t).startswith("<Tensor <UOp CPU (3,) dtypes.int> on CPU with grad None")
    z = Tensor.zeros(2, 3)
    assert z.size() == (2, 3) and z.size(-1) == 3 and z.max_shape == (2, 3) and z.max_numel() == 6


ERRORS: list[tuple[str, type[BaseException], Callable[[], Any]]] = [
    ("broadcast", IndexError, lambda: Tensor.ones(2, 3) + Tensor.ones(4)),
    ("expand", ValueError, lambda: Tensor.ones(2, 3).expand(4, 3)),
    ("reshape", ValueError, lambda: Tensor.ones(2, 3).reshape(4, 2)),
    ("reshape -1 next to 0", ZeroDivisionError, lambda: Tensor.ones(0, 3).reshape(-1, 0)),
    ("dim", IndexError, lambda: Tensor.ones(2, 3).sum(2)),
    ("flip repeated", RuntimeError, lambda: Tensor.ones(2, 3).flip(0, 0)),
    ("shrink", ValueError, lambda: Tensor.ones(2, 3).shrink(((0, 3), (0, 3)))),
    ("pad odd", ValueError, lambda: Tensor.ones(2, 3).pad((1,))),
    ("pad mode", NotImplementedError, lambda: Tensor.ones(2, 3).pad((1, 1), mode="wrap")),
    ("reflect", ValueError, lambda: Tensor.ones(2, 3).pad((3, 3), mode="reflect")),
    ("cat", AssertionError, lambda: Tensor.ones(2, 3).cat(Tensor.ones(2, 4))),
    ("stack", AssertionError, lambda: Tensor.ones(2, 3).stack(Tensor.ones(2, 4))),
    ("split", AssertionError, lambda: Tensor.ones(6).split([2, 2])),
    ("chunk", AssertionError, lambda: Tensor.ones(6).chunk(0)),
    ("repeat", ValueError, lambda: Tensor.ones(2, 3).repeat(2)),
    ("transpose 1-d", IndexError, lambda: Tensor.ones(3).transpose()),
    ("diag 2-d", ValueError, lambda: Tensor.ones(2, 2).diag()),
    ("rearrange", AssertionError, lambda: Tensor.ones(2, 3).rearrange("a b -> a c")),
    ("arange overflow", OverflowError, lambda: Tensor.arange(0, 300, dtype=dtypes.int8)),
    ("linspace steps", ValueError, lambda: Tensor.linspace(0, 1, -1)),
    ("linspace bool", ValueError, lambda: Tensor.linspace(0, 1, 3, dtype=dtypes.bool)),
    ("eye", ValueError, lambda: Tensor.eye(-1)),
    ("rand int", ValueError, lambda: Tensor.rand(2, dtype=dtypes.int32)),
    ("rand negative", ValueError, lambda: Tensor.rand(-1)),
    ("randint float bound", TypeError, lambda: Tensor.randint(2, low=0.5, high=3)),
    ("randint empty range", ValueError, lambda: Tensor.randint(2, low=3, high=3)),
    ("uniform", ValueError, lambda: Tensor.uniform(2, low=1.0, high=1.0)),
    ("normal", ValueError, lambda: Tensor.normal(2, std=-1.0)),
    ("rand_like int", ValueError, lambda: Tensor([1, 2]).rand_like()),
    ("multinomial", AssertionError, lambda: Tensor([1.0, 1.0]).multinomial(3)),
    ("item", AssertionError, lambda: Tensor([1, 2]).item()),
    ("replace", AssertionError, lambda: Tensor([1]).replace(Tensor([2, 3]))),
    ("pow negative int", RuntimeError, lambda: Tensor([2]) ** -1),
    ("where int cond", RuntimeError, lambda: Tensor([1, 0]).where(1, 2)),
    ("gelu mode", RuntimeError, lambda: Tensor([1.0]).gelu(approximate="erf")),
    ("topk k", ValueError, lambda: Tensor([1, 2]).topk(3)),
    ("topk unsorted", NotImplementedError, lambda: Tensor([1, 2]).topk(1, sorted_=False)),
    ("einsum count", ValueError, lambda: Tensor.einsum("ij,jk", Tensor.ones(3, 4))),
    ("matmul 0-d", RuntimeError, lambda: Tensor(1.0) @ Tensor([1.0])),
    ("matmul inner", RuntimeError, lambda: Tensor.rand(3) @ Tensor.rand(4)),
    ("conv channels", AssertionError, lambda: Tensor.ones(1, 2, 3, 3).conv2d(Tensor.ones(1, 1, 2, 2))),
    ("pool too big", AssertionError, lambda: Tensor.ones(1, 1, 2, 2).max_pool2d(kernel_size=3)),
    ("interpolate mode", AssertionError, lambda: Tensor.ones(1, 1, 4).interpolate((8,), mode="cubic")),
    ("dropout p", ValueError, lambda: Tensor([1.0]).dropout(2)),
    ("one_hot", ValueError, lambda: Tensor([1]).one_hot(-2)),
    ("reduction", ValueError, lambda: Tensor([[1.0, 2.0]]).sparse_categorical_crossentropy(Tensor([0]), reduction="x")),
    ("label_smoothing", AssertionError,
     lambda: Tensor([[1.0, 2.0]]).sparse_categorical_crossentropy(Tensor([0]), label_smoothing=2)),
    ("Conv2d same stride", ValueError, lambda: nn.Conv2d(1, 2, 3, stride=2, padding="same")),
    ("Conv2d padding", ValueError, lambda: nn.Conv2d(1, 2, 3, padding="full")),
    ("LayerNorm shape", AssertionError, lambda: nn.LayerNorm(4)(Tensor.rand(2, 3))),
    ("Embedding float", TypeError, lambda: nn.Embedding(4, 3)(Tensor([1.0]))),
    ("dtype name", AttributeError, lambda: Tensor([1], dtype="float7")),
]  # fmt: skip


@pytest.mark.parametrize("name,exc,fn", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_classes(name: str, exc: type[BaseException], fn: Callable[[], Any]) -> None:
    with pytest.raises(exc):
        fn()


def test_tinygrad_error_classes_are_still_runtime_errors() -> None:
    # speck's errors were RuntimeErrors before; code catching those keeps working
    for fn in (lambda: Tensor.ones(2, 3).reshape(4, 2), lambda: Tensor.ones(2, 3) + Tensor.ones(4),
               lambda: Tensor.ones(2, 3).cat(Tensor.ones(2, 4)),
               lambda: Tensor.randint(2, low=0.5, high=3)):  # fmt: skip
        with pytest.raises(RuntimeError):
            fn()


# ---------------------------------------------------------------------------------------------------------------------
# creation, random


def test_factories() -> None:
    assert Tensor.arange(2**31, 2**31 + 3).dtype == dtypes.int64
    assert Tensor.arange(2**31, 2**31 + 3).tolist() == [2**31, 2**31 + 1, 2**31 + 2]
    assert Tensor.arange(0, 1, 0.25).dtype == dtypes.float32 and Tensor.arange(5, 0).shape == (0,)
    assert Tensor.full((2,), 3).dtype == dtypes.int32 and Tensor.full((2,), True).dtype == dtypes.bool
    assert Tensor.const(3).item() == 3 and Tensor.const(2.5, dtypes.half).dtype == dtypes.half
    c = Tensor([[1, 2]]).const_like(7)
    assert c.tolist() == [[7, 7]] and c.dtype == dtypes.int32
    assert Tensor([1, 2]).randn_like().dtype == dtypes.int32
    assert Tensor([1, 2]).clone("CPU").tolist() == [1, 2]
    assert_matches(Tensor.linspace(-1, 2, 7).numpy(), np.linspace(-1, 2, 7))


@given(st.integers(0, 2**31 - 1))
@FEW
def test_multinomial_without_replacement_draws_distinct_allowed_indices(seed: int) -> None:
    Tensor.manual_seed(seed)
    w = Tensor([0.0, 1.0, 2.0, 0.0, 3.0])
    idx = w.multinomial(3).tolist()
    assert sorted(idx) == [1, 2, 4]
    batch = Tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]).multinomial(2).numpy()
    assert batch.dtype == np.int32 and sorted(batch[0]) == [0, 1] and sorted(batch[1]) == [1, 2]


# ---------------------------------------------------------------------------------------------------------------------
# indexing and movement


def test_slices_with_bound_variables_and_tensor_bounds() -> None:
    a = np.arange(24).reshape(4, 6)
    i, j = Variable("i", 0, 3), Variable("j", 1, 6)
    for vi, vj in ((0, 2), (1, 4), (3, 6)):
        t, rows = Tensor(a), min(vj, 4)  # (rows: a Variable slice can't clamp a bound past the 4 rows as numpy does)
        assert t[: j.bind(rows)].sum().item() == a[:rows].sum()
        assert t[i.bind(vi) : j.bind(rows)].sum().item() == a[vi:rows].sum()
        assert t[1:, : j.bind(vj)].sum().item() == a[1:, :vj].sum()
        assert t[i.bind(vi)].sum().item() == a[vi].sum()
        assert t[Tensor(vi) : Tensor(vj)].tolist() == a[vi:vj].tolist()
    with pytest.raises(ValueError, match=r"keeps \[0, 6\) of a dim of 4"):  # (it had 2 rows of zeros: mean 7.67)
        Tensor(a)[: j.bind(6)]
    with pytest.raises(TypeError):
        Tensor(a)[: j.bind(2) : 2]


def test_int_indices_apply_before_advanced_placement() -> None:
    b = np.arange(24).reshape(2, 3, 4)
    # tinygrad applies the int first: (3, 2), where numpy gives (2, 3)
    assert Tensor(b)[0, :, [1, 2]].numpy().tolist() == b[0][:, [1, 2]].tolist()


REARRANGES = [("a b c -> a (b c)", {}), ("a b c -> c a b", {}), ("(a b) c d -> a b c d", {"a": 2}),
              ("a ... -> ... a", {}), ("a b c -> a 1 b c 1", {}), ("... -> (...)", {}),
              ("a (b1 b2) c -> b2 a c b1", {"b2": 3})]  # fmt: skip


def _np_rearrange(a: np.ndarray, formula: str, sizes: dict[str, int]) -> np.ndarray:
    """Reference via einops' documented semantics, spelled with numpy for the cases above."""
    refs = {
        "a b c -> a (b c)": lambda: a.reshape(a.shape[0], -1),
        "a b c -> c a b": lambda: a.transpose(2, 0, 1),
        "(a b) c d -> a b c d": lambda: a.reshape(2, a.shape[0] // 2, *a.shape[1:]),
        "a ... -> ... a": lambda: np.moveaxis(a, 0, -1),
        "a b c -> a 1 b c 1": lambda: a[:, None, :, :, None],
        "... -> (...)": lambda: a.reshape(-1),
        "a (b1 b2) c -> b2 a c b1": lambda: a.reshape(a.shape[0], -1, 3, a.shape[2]).transpose(2, 0, 3, 1),
    }
    return refs[formula]()


@pytest.mark.parametrize("formula,sizes", REARRANGES, ids=[r[0] for r in REARRANGES])
def test_rearrange_matches_reference(formula: str, sizes: dict[str, int]) -> None:
    a = np.arange(4 * 6 * 5).reshape(4, 6, 5)
    assert_matches(Tensor(a).rearrange(formula, **sizes).numpy(), _np_rearrange(a, formula, sizes))


EINSUMS = [
    "ii",
    "ii->i",
    "ij->ji",
    "...ij,...jk",
    "bij,bjk->bik",
    "i,i",
    "ij,jk",
    "...j,j",
    "iji->j",
    "ij->",
    "ij,ij->ij",
]
EIN_SHAPES = {"ii": [(3, 3)], "ii->i": [(3, 3)], "ij->ji": [(2, 3)], "...ij,...jk": [(2, 3, 4), (2, 4, 5)],
              "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)], "i,i": [(4,), (4,)], "ij,jk": [(2, 3), (3, 4)],
              "...j,j": [(2, 3, 4), (4,)], "iji->j": [(2, 3, 2)], "ij->": [(2, 3)],
              "ij,ij->ij": [(2, 3), (1, 3)]}  # fmt: skip


@pytest.mark.parametrize("formula", EINSUMS)
def test_einsum_matches_numpy(formula: str) -> None:
    ops = [arrays(s, np.float32, k) for k, s in enumerate(EIN_SHAPES[formula])]
    assert_matches(Tensor.einsum(formula, *[Tensor(o) for o in ops]).numpy(), np.einsum(formula, *ops), atol=1e-5)
    ints = [arrays(s, np.int32, k, -5, 5) for k, s in enumerate(EIN_SHAPES[formula])]
    out = Tensor.einsum(formula, [Tensor(o) for o in ints])
    assert out.dtype == dtypes.int32
    assert_matches(out.numpy(), np.einsum(formula, *ints))


# ---------------------------------------------------------------------------------------------------------------------
# reductions, scans, linear algebra


@given(st.sampled_from([(5,), (2, 4), (3, 1, 4)]), st.integers(0, 9), st.sampled_from([np.int32, np.float32]))
@SOME
def test_cummax_cummin_values_and_first_indices(shape: tuple[int, ...], seed: int, npdt: Any) -> None:
    a = arrays(shape, npdt, seed, -3, 3)
    for axis in range(len(shape)):
        for fn, acc in (("cummax", np.maximum), ("cummin", np.minimum)):
            v, i = getattr(Tensor(a), fn)(axis)
            ref = acc.accumulate(a, axis=axis)
            assert_matches(v.numpy(), ref)
            # the index of the first occurrence of the running extreme
            am, rm = np.moveaxis(a, axis, -1), np.moveaxis(ref, axis, -1)
            first = np.zeros(rm.shape, np.int32)
            for idx in np.ndindex(rm.shape):
                first[idx] = next(j for j in range(idx[-1] + 1) if am[idx[:-1]][j] == rm[idx])
            first = np.moveaxis(first, -1, axis)
            assert i.dtype == dtypes.int32
            assert_matches(i.numpy(), first)


def test_reduction_dtypes_and_empty_identities() -> None:
    assert Tensor([1], dtype=dtypes.int8).prod().dtype == dtypes.int8
    assert Tensor([100, 3], dtype=dtypes.int8).prod().item() == np.int8(44)  # wraps like int8 arithmetic
    # max/min of nothing raise, as in numpy and torch (tests/tensor/test_rejected_inputs.py); any/all keep identities
    assert Tensor.ones(0).any().item() is False and Tensor.ones(0, dtype=dtypes.int32).all().item() is True
    assert Tensor.ones(2, 0).any(1).shape == (2,)
    m8 = Tensor([[100]], dtype=dtypes.int8) @ Tensor([[3]], dtype=dtypes.int8)
    assert m8.dtype == dtypes.int8 and m8.item() == np.int8(44)
    half = Tensor([[1.0]], dtype=dtypes.half) @ Tensor([[1.0]], dtype=dtypes.half)
    assert half.dtype == dtypes.half
    assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0])).item() is True


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (2, 5, 3), (3, 5)])
def test_qr_and_svd_match_numpy(shape: tuple[int, ...]) -> None:
    a = arrays(shape, np.float32, 1)
    q, r = (x.numpy() for x in Tensor(a).qr())
    m = shape[-2]
    assert_matches(q @ r, a, atol=1e-4)
    assert_matches(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(m), q.shape), atol=1e-4)
    assert_matches(np.triu(r), r, atol=0)
    u, s, vh = (x.numpy() for x in Tensor(a).svd())
    k = min(shape[-2:])
    assert_matches(s, np.linalg.svd(a)[1], atol=1e-4)
    assert_matches((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=1e-4)
    assert u.shape[-1] == shape[-2] and vh.shape[-1] == shape[-1]
    assert_matches(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(np.eye(m), u.shape), atol=1e-4)


def test_newton_schulz_orthogonalizes() -> None:
    g = arrays((4, 6), np.float32, 3)
    x = Tensor(g).newton_schulz(10, (2.0, -1.5, 0.5)).numpy()  # the cubic iteration converges to the polar factor
    u, _, vh = np.linalg.svd(g, full_matrices=False)
    assert_matches(x, u @ vh, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------------------
# nn functional and layers


def test_nn_functional() -> None:
    x = arrays((2, 3, 4), np.float32, 5)
    y = np.array([[0, 1, 2, 0], [2, 2, 1, 0]])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    ref = -np.take_along_axis(logp, y[:, None, :], 1)[:, 0, :]
    assert_matches(Tensor(x).cross_entropy(Tensor(y), reduction="none").numpy(), ref, atol=1e-5)
    assert_matches(Tensor(x).log_softmax(1).nll_loss(Tensor(y)).numpy(), ref.mean(), atol=1e-5)
    xs = arrays((5,), np.float32, 6)
    from math import erf

    assert_matches(Tensor(xs).gelu(approximate="none").numpy(), [0.5 * v * (1 + erf(v / math.sqrt(2))) for v in xs],
                   atol=1e-5)  # fmt: skip
    assert Tensor([1.0]).sequential([lambda t: t + 1, lambda t: t * 3]).tolist() == [6.0]
    q, k = Tensor.rand(1, 4, 2, 8), Tensor.rand(1, 2, 2, 8)
    out = q.scaled_dot_product_attention(k, k, enable_gqa=True)
    ref = q.scaled_dot_product_attention(k.repeat_interleave(2, dim=1), k.repeat_interleave(2, dim=1))
    assert_matches(out.numpy(), ref.numpy(), atol=1e-6)


def test_nn_layers() -> None:
    assert nn.Conv2d(1, 2, 4, padding="SAME")(Tensor.ones(1, 1, 5, 5)).shape == (1, 2, 5, 5)
    c = nn.Conv2d(4, 2, 3, groups=2)
    assert np.abs(c.weight.numpy()).max() <= 1 / math.sqrt(4 * 9)
    bn = nn.BatchNorm(3)
    assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.dtype == dtypes.int64
    assert bn(Tensor.ones(2, 3)).shape == (2, 3)
    r = nn.RMSNorm(4)
    x = arrays((2, 4), np.float16, 7)
    out = r(Tensor(x))
    assert out.dtype == dtypes.float32
    xf = x.astype(np.float32)
    assert_matches(out.numpy(), (xf / np.sqrt((xf**2).mean(-1, keepdims=True) + 1e-6)).astype(np.float16), atol=1e-3)
    with pytest.raises(IndexError, match=r"^Embedding: index 7 is out of bounds for size 4"):
        nn.Embedding(4, 3)(Tensor([7])).tolist()
    with Context(CHECK_OOB=0):  # unchecked: an out-of-range index gives a zero row
        assert nn.Embedding(4, 3)(Tensor([7])).tolist() == [[0.0, 0.0, 0.0]]
    assert nn.LSTMCell(2, 3).bias_ih.tolist() == [0.0] * 12  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------------------------
# random chains of ops against numpy, including the error class of shapes that don't fit

CHAIN_OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add", lambda x, y: x + y), ("mul", lambda x, y: x * y), ("sub", lambda x, y: x - y),
    ("max", lambda x, y: x.maximum(y) if isinstance(x, Tensor) else np.maximum(x, y)),
]  # fmt: skip
UNARY: list[tuple[str, Callable[[Any], Any]]] = [
    ("T", lambda x: x.transpose(1, 0) if isinstance(x, Tensor) else np.swapaxes(x, 0, 1)),
    ("flip", lambda x: x.flip(0) if isinstance(x, Tensor) else np.flip(x, 0)),
    ("slice", lambda x: x[1:]), ("neg", lambda x: -x), ("abs", abs),
    ("sum0", lambda x: x.sum(0, keepdim=True) if isinstance(x, Tensor) else x.sum(0, keepdims=True, dtype=x.dtype)),
]  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from(range(len(UNARY))), st.sampled_from(range(len(CHAIN_OPS))),
                          st.sampled_from([(3, 4), (4,), (1, 4), (3, 1), (2, 4), (5,)])), min_size=1, max_size=4),
       st.sampled_from([np.int32, np.float32]), st.integers(0, 99))  # fmt: skip
@SOME
def test_op_chains_match_numpy(steps: list[tuple[int, int, tuple[int, ...]]], npdt: Any, seed: int) -> None:
    a = arrays((3, 4), npdt, seed)
    t = Tensor(a)
    for k, (u, b, shape) in enumerate(steps):
        if a.ndim >= 2 or UNARY[u][0] not in ("T",):
            a, t = UNARY[u][1](a), UNARY[u][1](t)
        other = arrays(shape, npdt, seed + k + 1)
        try:
            ref = CHAIN_OPS[b][1](a, other)
        except ValueError:  # numpy: shapes don't broadcast; tinygrad raises IndexError
            with pytest.raises(IndexError):
                CHAIN_OPS[b][1](t, Tensor(other))
            continue
        a, t = ref, CHAIN_OPS[b][1](t, Tensor(other))
    assert t.dtype == _dt(a.dtype)
    assert_matches(t.numpy(), a, atol=1e-5)
