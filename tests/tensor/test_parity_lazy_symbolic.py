"""tinygrad parity: host data is a pending copy until realized (`Tensor(ndarray).uop.is_realized` is False), arange
with a Variable bound, and the Renderer/ProgramSpec fields tinygrad users read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Device, Tensor, TinyJit, Variable, assert_kernel_count, dtypes
from speck.tensor.engine.realize import lower_schedule_item
from speck.uop import UOp

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("make", [lambda a: Tensor(a), lambda a: Tensor(a.tolist())])
def test_host_data_is_pending_until_realized(make: object) -> None:
    a = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    t = make(a)  # type: ignore[operator]
    assert not t.uop.is_realized and t.uop.realized is None
    assert t.shape == (3, 4) and t.dtype == dtypes.int32 and t.device == Device.DEFAULT
    with assert_kernel_count(0):  # the data already sits in its buffer: realizing runs nothing
        t.realize()
    assert t.uop.is_realized
    np.testing.assert_array_equal(t.numpy(), a)


def test_views_of_pending_host_data_share_its_buffer() -> None:
    a = RNG.standard_normal((4, 6)).astype(np.float32)
    t = Tensor(a)
    v, r = t[1:3], t.reshape(24)
    with assert_kernel_count(0):
        Tensor.realize(v, r, t)
    assert v.uop.base is t.uop.base is r.uop.base
    np.testing.assert_array_equal(v.numpy(), a[1:3])
    np.testing.assert_array_equal(r.numpy(), a.reshape(24))


def test_pending_host_data_computes_and_takes_writes() -> None:
    a = RNG.standard_normal(6).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) * Tensor(b) + 1).numpy(), a * b + 1, rtol=1e-6)
    t = Tensor(a)
    t += 2
    np.testing.assert_allclose(t.numpy(), a + 2, rtol=1e-6)
    s = Tensor(a)
    s[2] = 7.0
    expected = a.copy()
    expected[2] = 7.0
    np.testing.assert_array_equal(s.numpy(), expected)
    g = Tensor(a, requires_grad=True)
    (g * g).sum().backward()
    assert g.grad is not None
    np.testing.assert_allclose(g.grad.numpy(), 2 * a, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 4, 9])
def test_arange_with_a_variable_end(n: int) -> None:
    v = Variable("n", 1, 10).bind(n)
    t = Tensor.arange(v)
    assert t.shape[0] is v and t.dtype == dtypes.default_int
    assert t.sum().item() == np.arange(n).sum()
    assert (t.float() * 0.5).sum().item() == pytest.approx((np.arange(n) * 0.5).sum())
    x = Tensor.ones(v).contiguous() + t  # shapes agree symbolically
    assert x.sum().item() == pytest.approx((np.arange(n) + 1).sum())


@pytest.mark.parametrize("n", [2, 5, 10])
def test_arange_with_variable_bounds_and_steps(n: int) -> None:
    v = Variable("m", 1, 10).bind(n)
    for start, stop, step in [(1, v, 1), (0, v, 2), (0, v, 3), (v, 0, -1), (v, -3, -2)]:
        lo, hi = (n if start is v else start), (n if stop is v else stop)
        ref = np.arange(lo, hi, step)
        got = Tensor.arange(start, stop, step)
        assert got.sum().item() == ref.sum(), (start, stop, step)
        assert (got * got).sum().item() == (ref * ref).sum(), (start, stop, step)


def test_arange_with_a_variable_rejects_float_bounds() -> None:
    v = Variable("k", 1, 10).bind(3)
    with pytest.raises(TypeError, match="Variable"):
        Tensor.arange(0.5, v)
    with pytest.raises(TypeError, match="concrete int step"):
        Tensor.arange(0, 10, v)


def test_renderer_fields_tinygrad_users_read() -> None:
    r = Device[Device.DEFAULT].renderer
    assert isinstance(r.suffix, str) and r.device == "CPU"
    assert r.has_local is False and r.has_shared is False and r.local_max is None and r.shared_max == 0
    assert r.supports_float4 == r.has_vectors and list(r.tensor_cores) == []


def test_program_spec_ins_outs_globals() -> None:
    a, b = Tensor(RNG.standard_normal(8).astype(np.float32)), Tensor(RNG.standard_normal(8).astype(np.float32))
    a.realize(), b.realize()
    (si,) = (a + b).schedule()
    p = lower_schedule_item(si).prg.p
    assert p is not None and p.function_name == p.name and p.name in p.src
    assert p.outs == [0] and sorted(p.ins) == [1, 2] and p.globals == [0, 1, 2]


def test_train_mode_entered_without_a_with_block() -> None:
    import gc

    assert Tensor.training is False
    ctx = Tensor.train()
    ctx.__enter__()
    del ctx
    gc.collect()  # dropping the context object doesn't leave training mode
    try:
        assert Tensor.training is True
        x = Tensor.ones(2000).dropout(0.5).numpy()
        assert 0.4 < float((x == 0).mean()) < 0.6 and set(np.unique(x).tolist()) == {0.0, 2.0}
    finally:
        Tensor.train(False).__enter__()  # back to evaluation mode (Tensor.training and the TRAINING setting)
    with Tensor.train(), Tensor.test():  # nested: test() inside train() switches it off, and back
        assert Tensor.training is False
    assert Tensor.training is False

    @Tensor.train()
    def inside() -> bool:
        return bool(Tensor.training)

    assert inside() and inside() and Tensor.training is False


def test_jit_rejects_python_scalar_inputs_but_takes_filled_tensors() -> None:
    from speck.tensor.errors import JitError

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x * 2

    with pytest.raises(JitError, match="real buffers"):
        f(Tensor(3.0))  # device-less in tinygrad's model: nothing a replay could swap
    # full/ones make buffers (TENSOR_API 4.2: buffer=True): fine inputs, and each call's values are used
    for v in (1.0, 2.0, 3.0, 4.0):
        np.testing.assert_array_equal(f(Tensor.full((4,), v)).numpy(), np.full(4, 2 * v, np.float32))


def test_pickling_a_jit_before_capture_is_an_assertion_error() -> None:
    import pickle

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x + 1

    with pytest.raises(AssertionError, match="has not captured yet"):
        pickle.dumps(f)


def test_get_state_dict_prefix_is_prepended_as_given() -> None:
    from speck.tensor import nn
    from speck.tensor.nn.state import get_state_dict

    class Model:
        def __init__(self) -> None:
            self.layers = [nn.Linear(1, 2), nn.Linear(2, 1)]
            self.heads = {"out": nn.Linear(1, 1)}

    m = Model()
    plain = list(get_state_dict(m))
    assert plain == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "heads.out.weight",
                     "heads.out.bias"]  # fmt: skip
    assert list(get_state_dict(m, prefix="model.")) == ["model." + k for k in plain]
    assert list(get_state_dict(m, prefix="m")) == ["m" + k for k in plain]  # tinygrad adds no dot of its own
    t = Tensor([1.0])
    assert get_state_dict(t) == {"": t} and get_state_dict({"a": [t]}, prefix="p.") == {"p.a.0": t}


@pytest.mark.parametrize(
    "op, ref",
    [
        ("//=", lambda a, b: a // b), ("**=", lambda a, b: a**b), ("&=", lambda a, b: a & b),
        ("|=", lambda a, b: a | b), ("^=", lambda a, b: a ^ b), ("<<=", lambda a, b: a << b),
        (">>=", lambda a, b: a >> b),
    ],
)  # fmt: skip
def test_inplace_int_operators_write_into_the_tensor(op: str, ref: object) -> None:
    a = RNG.integers(1, 50, 6).astype(np.int32)
    b = RNG.integers(1, 4, 6).astype(np.int32)
    x = Tensor(a).realize()
    alias = x
    ns = {"x": x, "y": Tensor(b)}
    exec(f"x {op} y", ns)
    assert ns["x"] is alias  # the same object, written in place
    np.testing.assert_array_equal(alias.numpy(), ref(a, b))  # type: ignore[operator]


def test_inplace_matmul_writes_into_the_tensor() -> None:
    a = RNG.standard_normal((3, 3)).astype(np.float32)
    b = RNG.standard_normal((3, 3)).astype(np.float32)
    x = Tensor(a).realize()
    alias = x
    x @= Tensor(b)
    assert x is alias
    np.testing.assert_allclose(alias.numpy(), a @ b, rtol=1e-5, atol=1e-6)


def test_int64_with_uint64_computes_in_the_default_float() -> None:
    a = np.array([3, -4, 5], np.int64)
    b = np.array([2, 7, 2**40], np.uint64)
    ta, tb = Tensor(a), Tensor(b)
    expected = a.astype(np.float32) + b.astype(np.float32)
    out = ta + tb
    assert out.dtype == dtypes.weakfloat  # their join (TENSOR_API 3.2), read at the default float
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    cat = ta.cat(tb)
    assert cat.dtype == dtypes.default_float
    np.testing.assert_allclose(cat.numpy(), np.concatenate([a, b.astype(np.float64)]).astype(np.float32), rtol=1e-6)
    mm = ta.reshape(1, 3) @ tb.reshape(3, 1)
    assert mm.dtype == dtypes.default_float
    np.testing.assert_allclose(mm.numpy(), a.astype(np.float32).reshape(1, 3) @ b.astype(np.float32).reshape(3, 1),
                               rtol=1e-5)  # fmt: skip


def test_one_draw_is_not_two_smaller_draws_but_seeding_repeats_it() -> None:
    Tensor.manual_seed(3)
    six = Tensor.rand(6).numpy()
    Tensor.manual_seed(3)
    halves = np.concatenate([Tensor.rand(3).numpy(), Tensor.rand(3).numpy()])
    Tensor.manual_seed(3)
    again = Tensor.rand(6).numpy()
    assert not np.array_equal(six, halves[:6])
    np.testing.assert_array_equal(six, again)


@given(st.integers(3, 10))
def test_negative_bounds_against_a_symbolic_dim_resolve_like_slice_indices(n: int) -> None:
    x = np.arange(3 * 10 * 2, dtype=np.float32).reshape(3, 10, 2)
    s = Tensor(x)[:, : Variable("i", 3, 10).bind(n)]
    assert s[:, -3:-1].shape == (3, 2, 2) and s[:, -1].shape == (3, 2)  # sizes fold: (i-1) - (i-3) is 2
    np.testing.assert_array_equal(s[:, -3:-1].numpy(), x[:, :n][:, -3:-1])
    np.testing.assert_array_equal(s[:, -1].numpy(), x[:, :n][:, -1])
    np.testing.assert_array_equal(s[:, 1].numpy(), x[:, 1])
    with pytest.raises(IndexError):
        s[:, -4]  # the dim can be 3 long
    with pytest.raises(ValueError, match="bound to"):
        Tensor(np.zeros(30, np.float32)).reshape(3, Variable("j", 1, 10).bind(2))


def test_bound_variable_bounds_are_its_range_and_jit_replays_other_bindings() -> None:
    # tinygrad's BIND reports the Variable's range (nothing may fold on the value bound at capture time)
    v = Variable("bv_range", 1, 9)
    b = v.bind(3)
    assert (b.vmin, b.vmax) == (1, 9) and b.val == 3 and b.unbind() == (v, 3)

    @TinyJit
    def f(x: Tensor, i: Variable) -> Tensor:
        return (x[:i].pad(((0, 10 - i),)) + (x[i] > 4).where(100.0, 0.0)).realize()

    x = Tensor.arange(10, device=Device.DEFAULT).float().clone(Device.DEFAULT).realize()
    for k in (2, 5, 7, 3, 9):
        want = np.where(np.arange(10) < k, np.arange(10), 0) + (100.0 if k > 4 else 0.0)
        np.testing.assert_array_equal(f(x, v.bind(k)).numpy(), want)


@given(st.integers(-3, 12))
def test_bound_variable_int_index_out_of_the_dim_is_an_index_error(k: int) -> None:
    x = Tensor.arange(5).clone(Device.DEFAULT).realize()
    v = Variable("bv_idx", -3, 12)
    if 0 <= k < 5:
        assert x[v.bind(k)].item() == k
    else:  # it read past the dim and gave 0
        with pytest.raises(IndexError, match="out of bounds"):
            x[v.bind(k)]
    with pytest.raises(IndexError, match="out of bounds"):  # a range wholly outside the dim, bound or not
        x[Variable("bv_far", 5, 9)]


@given(st.integers(1, 8), st.integers(0, 3))
def test_argmax_argmin_over_a_symbolic_dim_match_numpy_under_jit(k: int, seed: int) -> None:
    # ties (small ints) take the first index, as numpy; it said "needs a concrete size"
    a = np.random.default_rng(seed).integers(0, 3, (8, 3)).astype(np.float32)
    x = Tensor(a).clone(Device.DEFAULT).realize()
    v = Variable("am_n", 1, 8)

    @TinyJit
    def f(t: Tensor, n: Variable) -> tuple[Tensor, Tensor]:
        return t[:n].argmax(0).realize(), t[:n].argmin(0).realize()

    for kk in (k, max(1, k - 1), k):  # warm-up, capture, replay with another binding
        got_max, got_min = f(x, v.bind(kk))
        np.testing.assert_array_equal(got_max.numpy(), a[:kk].argmax(0))
        np.testing.assert_array_equal(got_min.numpy(), a[:kk].argmin(0))
    assert x[: v.bind(k)].argmax(0, keepdim=True).shape == (1, 3)


def test_causal_mask_with_a_symbolic_start_pos_under_jit() -> None:
    # tinygrad's KV-cache attention: full((1, 1, n, start_pos + n), -inf).triu(start_pos + 1), start_pos bound
    # (tril/triu said "needs a concrete size" for symbolic dims and refused a symbolic diagonal)
    rng = np.random.default_rng(5)
    q, kv = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((10, 4)).astype(np.float32)
    kvt = Tensor(kv).clone(Device.DEFAULT).realize()
    sp = Variable("tri_sp", 0, 8)

    @TinyJit
    def attend(qt: Tensor, start_pos: Variable) -> Tensor:
        keys = kvt[: start_pos + 2]
        mask = Tensor.full((2, start_pos + 2), float("-inf"), device=Device.DEFAULT).triu(start_pos + 1)
        return ((qt @ keys.T) + mask).softmax(-1).realize() @ keys.tril(0)[:, :1].contiguous().realize()

    for k in (0, 3, 5, 2, 7):
        keys = kv[: k + 2]
        s = q @ keys.T + np.triu(np.full((2, k + 2), -np.inf), k + 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ np.tril(keys)[:, :1]
        np.testing.assert_allclose(attend(Tensor(q).realize(), sp.bind(k)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_gather_off_a_symbolic_dim_matches_numpy() -> None:
    # the index-fits-self check compared two symbolic sizes with `>` (UOpTypeError: no truth value)
    rng = np.random.default_rng(6)
    a, idx = rng.standard_normal((10, 4)).astype(np.float32), rng.integers(0, 4, (10, 3)).astype(np.int32)
    x, it = Tensor(a).clone(Device.DEFAULT).realize(), Tensor(idx).clone(Device.DEFAULT).realize()
    n = Variable("g_n", 1, 10)
    for k in (3, 7):
        got = x[: n.bind(k)].gather(1, it[: n.bind(k)]).sum(0).numpy()
        np.testing.assert_allclose(got, np.take_along_axis(a[:k], idx[:k], 1).sum(0), rtol=1e-6)
    with pytest.raises(AssertionError, match="exceeds self shape"):
        Tensor.ones(3, 4).gather(1, Tensor.zeros(5, 2, dtype=dtypes.int32))


@pytest.mark.parametrize("k", [1, 4])
def test_repeat_and_merges_of_a_symbolic_dim_match_numpy(k: int) -> None:
    # a RANGE over 2*n and one over n*2 (or over n and 1*n) got one axis id: ProgramFormError at compile time
    a = np.random.default_rng(k).standard_normal((10, 4)).astype(np.float32)
    x = Tensor(a).clone(Device.DEFAULT).realize()
    b = Variable("rep_n", 1, 10).bind(k)
    s, ak = x[:b], a[:k]
    np.testing.assert_allclose(s.repeat(1, 2).sum(0).numpy(), np.tile(ak, (1, 2)).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.repeat(2, 1).sum(0).numpy(), np.tile(ak, (2, 1)).sum(0), rtol=1e-5, atol=1e-5)
    merged = s[:, 0].reshape(1, b).expand(2, b).reshape(2 * b)
    np.testing.assert_allclose(merged.sum().numpy(), 2 * ak[:, 0].sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((merged * 2).max().numpy(), 2 * ak[:, 0].max(), rtol=1e-6)


@pytest.mark.parametrize("k", [3, 5, 8])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("np_dt", [np.float32, np.int32])
def test_topk_along_a_symbolic_dim_matches_numpy_under_jit(k: int, largest: bool, np_dt: type) -> None:
    """topk(3) along a dim of Variable length L in [3, 8]: sorted at L's upper bound with padding that sorts last,
    so the 3 taken are real elements (ties in their original order); one capture serves every L."""
    a: np.ndarray = (RNG.integers(-4, 5, (2, 8)) if np_dt is np.int32 else RNG.standard_normal((2, 8))).astype(np_dt)
    src = Tensor(a).realize()

    @TinyJit
    def f(n: UOp) -> tuple[Tensor, Tensor]:
        v, i = src[:, :n].topk(3, dim=1, largest=largest)
        return v.contiguous().realize(), i.contiguous().realize()

    for m in (k, 8, 4, k):
        v, i = f(Variable("L", 3, 8).bind(m))
        ref = a[:, :m]
        order = np.argsort(-ref if largest else ref, 1, kind="stable")[:, :3]
        np.testing.assert_array_equal(i.numpy(), order)
        np.testing.assert_array_equal(v.numpy(), np.take_along_axis(ref, order, 1))


def test_topk_along_a_symbolic_dim_needs_k_within_its_lower_bound() -> None:
    t = Tensor(np.arange(8, dtype=np.float32))[: Variable("L", 2, 8).bind(5)]
    with pytest.raises(ValueError, match=r"k=3 must be in \[0, 2\].*lower bound"):
        t.topk(3)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_symbolic_cat_padded_back_to_a_fixed_length_is_concrete(k: int) -> None:
    """cat((2, L), (2, 1)) has length L+1; padding it by 9 - (L+1) gives the fixed length 9 (the size expression
    folds), so the result reads and reshapes like any concrete tensor."""
    a = RNG.standard_normal((2, 8)).astype(np.float32)
    b = RNG.standard_normal((2, 1)).astype(np.float32)
    v = Variable("L", 1, 8).bind(k)
    c = Tensor(a)[:, :v].cat(Tensor(b), dim=1)
    d = c.pad((None, (0, 9 - c.shape[1])))
    assert d.shape == (2, 9)
    want = np.concatenate([a[:, :k], b, np.zeros((2, 8 - k), np.float32)], 1)
    np.testing.assert_array_equal(d.reshape(18).numpy(), want.reshape(18))


def test_kv_cache_by_cat_and_pad_back_under_jit_matches_numpy() -> None:
    """The older llama KV cache: keys = cache[:, :start_pos].cat(new) (length start_pos+1), written back padded by
    MAXLEN - keys.shape[1] (a size that must fold to MAXLEN), then attention over the keys; one capture serves
    every start_pos."""
    maxlen, d = 8, 4
    cache = Tensor.zeros(1, maxlen, d).contiguous().realize()

    @TinyJit
    def step(xk: Tensor, q: Tensor, start_pos: UOp) -> Tensor:
        keys = cache[:, :start_pos].cat(xk, dim=1)
        cache.assign(keys.pad((None, (0, maxlen - keys.shape[1]), None)).contiguous()).realize()
        return (q @ keys.transpose(1, 2)).softmax(-1).matmul(keys).realize()

    ref_cache = np.zeros((1, maxlen, d), np.float32)
    for p in range(1, 6):
        xk, q = RNG.standard_normal((1, 1, d)).astype(np.float32), RNG.standard_normal((1, 1, d)).astype(np.float32)
        got = step(Tensor(xk), Tensor(q), Variable("start_pos", 1, maxlen - 1).bind(p)).numpy()
        ref_cache[:, p] = xk[:, 0]
        keys = ref_cache[:, : p + 1]
        s = q @ keys.transpose(0, 2, 1)
        w = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (w / w.sum(-1, keepdims=True)) @ keys, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cache.numpy(), ref_cache, atol=0)
