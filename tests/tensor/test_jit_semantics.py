"""TinyJit's user-visible contract: the call timeline (.cnt, .captured, reset), the JIT and CAPTURING settings,
which arguments are inputs, returned objects, symbolic sizes served by one capture, prune=True, and a JitError for
every call a capture can't serve. Values are checked against numpy."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, TinyJit, Variable, dtypes
from speck.tensor import jit as jit_mod
from speck.tensor.jit import CapturedJit, JitError
from speck.tensor.realize import compiled_program_count

RNG = np.random.default_rng(7)


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------- timeline ----------------
def test_timeline_counts_calls_and_sets_captured_on_the_second() -> None:
    calls = []

    @TinyJit
    def f(a: Tensor) -> Tensor:
        calls.append(1)
        return a * 2 + 1

    for i in range(5):
        x = arr(3, 4)
        out = f(Tensor(x))
        np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
        assert f.cnt == i + 1
        assert (f.captured is None) == (i == 0)
    assert len(calls) == 2  # warm-up and capture; calls 3..5 replayed without calling the function
    assert isinstance(f.captured, CapturedJit) and len(f.captured.jit_cache) >= 1
    f.reset()
    assert f.captured is None and f.cnt == 0
    x = arr(3, 4)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), x * 2 + 1, rtol=1e-6)
    assert len(calls) == 3


def test_prune_decorator_form_and_plain_form() -> None:
    def body(a: Tensor) -> Tensor:
        return a.sum(axis=0)

    for f in (TinyJit(body), TinyJit(body, prune=False), TinyJit(prune=True)(body)):
        assert f.__name__ == "body"
        for _ in range(4):
            x = arr(5, 2)
            np.testing.assert_allclose(f(Tensor(x)).numpy(), x.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_returned_objects_are_the_same_on_every_replay() -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> dict[str, Any]:
        return {"sum": a + b, "pair": (a * b, None)}

    outs = []
    for _ in range(5):
        x, y = arr(4), arr(4)
        out = f(Tensor(x), Tensor(y))
        np.testing.assert_allclose(out["sum"].numpy(), x + y, rtol=1e-6)
        np.testing.assert_allclose(out["pair"][0].numpy(), x * y, rtol=1e-6)
        outs.append(out)
    assert outs[2] is outs[3] is outs[4] is outs[1]  # the capture's return value, refilled by each replay


def test_captured_is_plain_data() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a.exp()

    for _ in range(3):
        f(Tensor(arr(3)))
    cap = f.captured
    assert cap is not None and dataclasses.is_dataclass(cap)
    state = cap.__getstate__()
    assert state["plan"] is None  # the batched graphs are derived, not part of the capture's data
    for v in state.values():
        assert not isinstance(v, (types.FunctionType, types.LambdaType, types.MethodType))


# ---------------- settings ----------------
def test_jit_0_calls_the_function_every_time() -> None:
    calls = []

    @TinyJit
    def f(a: Tensor) -> Tensor:
        calls.append(1)
        return a - 1

    with Context(JIT=0):
        for _ in range(4):
            x = arr(2, 2)
            np.testing.assert_allclose(f(Tensor(x)).numpy(), x - 1, rtol=1e-6)
    assert len(calls) == 4 and f.captured is None


@pytest.mark.parametrize("jit_level", [1, 2])
def test_jit_1_batches_and_jit_2_replays_call_by_call(jit_level: int) -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return ((a + 1) * b).sum(axis=1) + a.max(axis=1)

    with Context(JIT=jit_level):
        for _ in range(4):
            x, y = arr(4, 9), arr(4, 9)
            np.testing.assert_allclose(
                f(Tensor(x), Tensor(y)).numpy(), ((x + 1) * y).sum(axis=1) + x.max(axis=1), rtol=1e-5, atol=1e-5
            )
    assert f.plan is not None
    graphs = [b.graph for b in f.plan.batches]
    if jit_level == 2:
        assert all(g is None for g in graphs)  # no device graph was built
    elif f.plan.batches:
        assert all(g is not None for g in graphs)


def test_capturing_0_runs_unrecorded() -> None:
    counter = Tensor([0.0]).contiguous().realize()

    @TinyJit
    def f(a: Tensor) -> Tensor:
        with Context(CAPTURING=0):
            counter.assign(counter + 1)  # runs at the warm-up and the capture, not on replays
            seen = counter.item()  # a read is allowed when not recorded
        assert seen >= 1
        return a * 3

    for _ in range(5):
        x = arr(3)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), x * 3, rtol=1e-6)
    assert counter.item() == 2.0


# ---------------- inputs ----------------
def test_inputs_in_containers_and_keywords() -> None:
    @TinyJit
    def f(xs: list[Tensor], d: dict[str, Tensor], scale: float, *, k: Tensor) -> Tensor:
        return (xs[0] + xs[1]) * d["w"] * scale + k

    for _ in range(4):
        a, b, w, k = arr(3), arr(3), arr(3), arr(3)
        got = f([Tensor(a), Tensor(b)], {"w": Tensor(w)}, 2.0, k=Tensor(k)).numpy()
        np.testing.assert_allclose(got, (a + b) * w * 2.0 + k, rtol=1e-5, atol=1e-6)


def test_non_tensor_arguments_are_baked_in() -> None:
    @TinyJit
    def f(a: Tensor, scale: float) -> Tensor:
        return a * scale

    x = arr(3)
    f(Tensor(x), 2.0)
    f(Tensor(x), 2.0)
    np.testing.assert_allclose(f(Tensor(x), 5.0).numpy(), x * 2.0, rtol=1e-6)  # the capture's value


def test_lazy_inputs_are_realized_and_views_keep_their_structure() -> None:
    """A lazy input (contiguous() of a slice included) and a contiguous range of a buffer are buffers of their own; an
    input passed as a strided view of a realized buffer has its view structure in the signature (TENSOR_API 11.3):
    the same view of another buffer replays, the same shape at another offset (or a whole buffer instead of a view)
    is an args mismatch."""
    base = arr(6, 5)
    t = Tensor(base).realize()

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * 10

    for i in range(4):
        np.testing.assert_allclose(f(t[i : i + 2, ::2] + 1).numpy(), (base[i : i + 2, ::2] + 1) * 10, rtol=1e-6)
        np.testing.assert_allclose(f(t[i : i + 2, ::2].contiguous()).numpy(), base[i : i + 2, ::2] * 10, rtol=1e-6)

    @TinyJit
    def h(a: Tensor) -> Tensor:
        return a * 10

    for i in range(4):  # contiguous ranges (what contiguous().realize() of a row slice is): buffers of their own
        np.testing.assert_allclose(h(t[i : i + 2].contiguous().realize()).numpy(), base[i : i + 2] * 10, rtol=1e-6)
        np.testing.assert_allclose(h(t[i + 1 : i + 3]).numpy(), base[i + 1 : i + 3] * 10, rtol=1e-6)

    @TinyJit
    def g(a: Tensor) -> Tensor:
        return a * 10

    for _ in range(4):
        other = arr(6, 5)
        np.testing.assert_allclose(g(Tensor(other).realize()[1:3, ::2]).numpy(), other[1:3, ::2] * 10, rtol=1e-6)
    with pytest.raises(JitError, match=r"args mismatch.*a view of a buffer: reshape \(6, 5\), shrink"):
        g(t[2:4, ::2])  # another offset
    with pytest.raises(JitError, match=r"args mismatch.*a whole buffer"):
        g(Tensor(arr(2, 3)))
    np.testing.assert_allclose(g(t[1:3, ::2]).numpy(), base[1:3, ::2] * 10, rtol=1e-6)  # still usable


def test_implicit_inputs_see_in_place_updates() -> None:
    w = Tensor([1.0, 2.0, 3.0]).contiguous().realize()

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * w

    for i in range(5):
        w.assign(Tensor([1.0, 2.0, 3.0]) * (i + 1))
        x = arr(3)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), x * np.array([1, 2, 3]) * (i + 1), rtol=1e-6)


def test_output_fed_back_as_input() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a.flip(0) * 0.5 + a.sum()).realize()

    x0 = arr(5)
    y, ref = Tensor(x0), x0.astype(np.float64)
    for _ in range(6):
        y = f(y)
        ref = ref[::-1] * 0.5 + ref.sum()
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5)


# ---------------- symbolic sizes ----------------
def test_one_capture_serves_every_bound_value_of_a_shrunk_input() -> None:
    data = arr(12)
    a = Tensor(data).realize()
    v = Variable("n", 1, 12)

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2 + 1).realize()

    programs = None
    for i, n in enumerate([3, 5, 12, 1, 7, 7, 2]):
        out = f(a.shrink(((0, v.bind(n)),)))
        np.testing.assert_allclose(out.shrink(((0, n),)).numpy(), data[:n] * 2 + 1, rtol=1e-6)
        bound = out.shape[0]
        assert isinstance(bound, type(v)) and bound.unbind()[1] == n  # the returned shape shows this call's n
        if i == 1:
            programs = compiled_program_count()
    assert f.cnt == 7 and programs == compiled_program_count()  # no recapture, no recompile


def test_bound_variable_as_argument() -> None:
    data = arr(4, 10)
    a = Tensor(data).realize()
    v = Variable("k", 1, 10)

    @TinyJit
    def f(x: Tensor, k: Any) -> Tensor:
        return x.shrink((None, (0, k))).sum(axis=1).realize()

    for n in [2, 9, 4, 10, 1]:
        np.testing.assert_allclose(f(a, v.bind(n)).numpy(), data[:, :n].sum(axis=1), rtol=1e-5, atol=1e-5)


@settings(max_examples=8)
@given(st.lists(st.integers(1, 16), min_size=3, max_size=6))
def test_symbolic_reduction_matches_numpy(sizes: list[int]) -> None:
    data = arr(16)
    a = Tensor(data).realize()
    v = Variable("m", 1, 16)

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * x).sum().realize()

    for n in sizes:
        np.testing.assert_allclose(f(a.shrink(((0, v.bind(n)),))).item(), (data[:n] ** 2).sum(), rtol=1e-5)


# ---------------- prune ----------------
def test_prune_skips_input_independent_kernels_but_keeps_state_updates() -> None:
    w = Tensor(arr(8)).realize()
    steps = Tensor([0.0]).contiguous().realize()

    def body(a: Tensor) -> Tensor:
        steps.assign(steps + 1)  # state: must run on every replay
        return (a + (w.exp() * 2).sum()).realize()  # exp(w) * 2 summed: the same value every call

    plain, pruned = TinyJit(body), TinyJit(prune=True)(body)
    wn = w.numpy().astype(np.float64)
    for f in (plain, pruned):
        steps.assign(Tensor([0.0]))
        for _ in range(5):
            x = arr(8)
            np.testing.assert_allclose(f(Tensor(x)).numpy(), x + (np.exp(wn) * 2).sum(), rtol=1e-5)
        assert steps.item() == 5.0
    assert plain.captured is not None and pruned.captured is not None
    assert len(pruned.captured.jit_cache) < len(plain.captured.jit_cache)


# ---------------- errors ----------------
def _captured(f: TinyJit[Any], *args: Any) -> None:
    for _ in range(2):
        f(*args)
    assert f.captured is not None


def test_changed_shape_dtype_device_raise() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * 3

    _captured(f, Tensor(arr(2, 3)))
    with pytest.raises(JitError, match=r"args mismatch.*captured shape \(2, 3\).*got shape \(3, 3\)"):
        f(Tensor(arr(3, 3)))
    with pytest.raises(JitError, match="dtypes.float.*dtypes.int"):
        f(Tensor(np.ones((2, 3), dtype=np.int32)))
    with pytest.raises(JitError, match="on CPU.*on PYTHON"):
        f(Tensor(arr(2, 3)).to("PYTHON"))
    np.testing.assert_allclose(f(Tensor(np.ones((2, 3), np.float32))).numpy(), np.full((2, 3), 3.0))  # still usable


def test_changed_1d_length_raises() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a + 1

    _captured(f, Tensor(arr(4)))
    with pytest.raises(JitError, match=r"\(4,\).*\(5,\)"):
        f(Tensor(arr(5)))


def test_changed_argument_layout_raises() -> None:
    @TinyJit
    def f(a: Tensor, b: Any = None, **kw: Any) -> Tensor:
        return a * 2

    _captured(f, Tensor(arr(3)), 1.0)
    with pytest.raises(JitError, match="args mismatch"):
        f(Tensor(arr(3)))  # one positional argument fewer
    with pytest.raises(JitError, match="args mismatch"):
        f(Tensor(arr(3)), 1.0, extra=2)  # a keyword more
    with pytest.raises(JitError, match="args mismatch.*1 tensor inputs, called with 2"):
        f(Tensor(arr(3)), Tensor(arr(3)))  # a value became a tensor
    f(Tensor(arr(3)), 7.0)  # a different value in the same place is fine (it is baked in)


@pytest.mark.parametrize("views", [False, True])
def test_duplicate_inputs_raise(views: bool) -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return a + b

    t = Tensor(arr(4)).realize()
    args = (t[0:2], t[2:4]) if views else (t, t)
    with pytest.raises(JitError, match="duplicate inputs"):
        f(*args)
    _captured(f, Tensor(arr(2 if views else 4)), Tensor(arr(2 if views else 4)))
    with pytest.raises(JitError, match="duplicate inputs"):
        f(*args)


def test_virtual_input_raises() -> None:
    from speck.uop import Ops, UOp

    weak = Tensor(UOp(Ops.CONST, dtypes.weakfloat, (UOp(Ops.DEVICE, arg="CPU"),), 2.0))

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * 2

    with pytest.raises(JitError, match="must be real buffers"):
        f(weak)


def test_function_that_runs_nothing_raises() -> None:
    a = Tensor(arr(3)).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x

    f(a)
    with pytest.raises(JitError, match="didn't JIT anything"):
        f(a)
    assert f.captured is None


@pytest.mark.parametrize("ret", [3, "s", 2.5, np.ones(2)])
def test_non_tensor_return_raises(ret: Any) -> None:
    @TinyJit
    def f(x: Tensor) -> Any:
        return (x * 2).realize(), ret

    f(Tensor(arr(3)))
    with pytest.raises(JitError, match="returned a"):
        f(Tensor(arr(3)))


@pytest.mark.parametrize("read", ["numpy", "tolist", "item", "data"])
def test_data_read_during_capture_raises(read: str, monkeypatch: pytest.MonkeyPatch) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        s = x.sum()
        getattr(s, read)()
        return s * 2

    f(Tensor(arr(3)))  # the warm-up may read
    with pytest.raises(JitError, match="during TinyJit capture"):
        f(Tensor(arr(3)))
    monkeypatch.setattr(jit_mod.UNSAFE_ALLOW_JIT_BUFFER, "value", 1)
    f(Tensor(arr(3)))
    assert f.captured is not None


def test_nested_capture_raises_but_captured_inner_replays_inside() -> None:
    @TinyJit
    def inner(x: Tensor) -> Tensor:
        return (x * 2).realize()

    @TinyJit
    def outer(x: Tensor) -> Tensor:
        return (inner(x) + 1).realize()

    x0 = arr(3)
    outer(Tensor(x0))  # warm-up: inner's first call (eager)
    with pytest.raises(RuntimeError, match="nested TinyJit"):
        outer(Tensor(x0))  # outer captures while inner would capture
    fresh_inner_calls = [inner(Tensor(arr(3))) for _ in range(2)]  # inner captured on its own
    assert inner.captured is not None and fresh_inner_calls
    outer.reset()
    for _ in range(4):
        x = arr(3)
        np.testing.assert_allclose(outer(Tensor(x)).numpy(), x * 2 + 1, rtol=1e-6)
    assert outer.captured is not None


def test_changed_variable_set_raises_naming_the_variables() -> None:
    """The Variables of an input's symbolic shape (name and range) are part of its signature; the message shows
    both sides' ranges."""

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a + 1).sum().realize()

    data = arr(20)
    for n in (2, 3):
        np.testing.assert_allclose(f(Tensor(data[:10]).realize()[: Variable("i", 1, 10).bind(n)]).numpy(),
                                   (data[:n] + 1).sum(), rtol=1e-5)  # fmt: skip
    with pytest.raises(JitError, match=r"args mismatch.*captured shape \('i\[1\.\.10\]',\).*got shape \(3,\)"):
        f(Tensor(data[:3]))
    with pytest.raises(JitError, match=r"captured shape \('i\[1\.\.10\]',\).*got shape \('j\[1\.\.10\]',\)"):
        f(Tensor(data[:10]).realize()[: Variable("j", 1, 10).bind(3)])
    with pytest.raises(JitError, match=r"captured shape \('i\[1\.\.10\]',\).*got shape \('i\[1\.\.20\]',\)"):
        f(Tensor(data).realize()[: Variable("i", 1, 20).bind(3)])


def test_realized_inputs_reshaped_to_a_symbolic_shape_replay() -> None:
    """A realized (3, n) buffer reshaped to (3, i) with i bound to n: one view structure for every n (the buffer's
    size is not part of it), so one capture serves them all; a matmul over the symbolic axis matches numpy."""

    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a @ b + 1).realize()

    for n in (1, 2, 3, 4, 7, 2):
        vi = Variable("i", 1, 10).bind(n)
        a, b = arr(3, n), arr(n, 5)
        got = f(Tensor(a).realize().reshape(3, vi), Tensor(b).realize().reshape(vi, 5)).numpy()
        np.testing.assert_allclose(got, a @ b + 1, rtol=1e-5, atol=1e-5)
    assert f.captured is not None and len(f.captured.jit_cache) == 1


# ---------------- data-dependent sizes ----------------
@settings(max_examples=4, deadline=None)
@given(st.integers(1, 7), st.integers(2, 4), st.integers(-3, 3))
def test_nonzero_and_masked_select_with_size_replay_like_numpy(size: int, cols: int, fill: int) -> None:
    """With size= the result has a fixed shape, so the capture serves every input: the first `size` hits in
    row-major order, padded with fill_value, as numpy computes them."""

    @TinyJit
    def f(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        return x.nonzero(size=size, fill_value=fill), x.masked_select(m, size=size, fill_value=fill)

    rng = np.random.default_rng(size * 100 + cols * 10 + fill)
    for _ in range(5):
        x = rng.integers(-2, 3, (3, cols)).astype(np.int32) * rng.integers(0, 2, (3, cols)).astype(np.int32)
        m = rng.integers(0, 2, (3, cols)).astype(bool)
        nz, sel = f(Tensor(x), Tensor(m))
        want_nz = np.full((size, 2), fill, dtype=np.int64)
        hits = np.argwhere(x)[:size]
        want_nz[: len(hits)] = hits
        want_sel = np.full(size, fill, dtype=np.int32)
        picked = x[m][:size]
        want_sel[: len(picked)] = picked
        np.testing.assert_array_equal(nz.numpy(), want_nz)
        np.testing.assert_array_equal(sel.numpy(), want_sel)
    assert f.captured is not None


@pytest.mark.parametrize("op", ["nonzero", "masked_select"])
def test_data_dependent_size_without_size_raises_at_capture(op: str) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x.nonzero() if op == "nonzero" else x.masked_select(x > 0)

    x = Tensor(np.array([1.0, 0.0, 2.0], np.float32))
    f(x)  # the warm-up computes it eagerly
    with pytest.raises(JitError, match="during TinyJit capture"):
        f(x)


def test_view_inputs_stay_views_of_their_buffer() -> None:
    """An input passed as a view of a realized buffer is read through a copy during the call, and is that view again
    afterwards: it sees later writes to its buffer, and calling again with the same view object reads them."""

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a * 2).realize()

    data = np.arange(10, dtype=np.float32)
    base = Tensor(data).realize()
    v = base[2:5]
    for _ in range(5):
        np.testing.assert_array_equal(f(v).numpy(), data[2:5] * 2)
        base.assign(base + 1).realize()
        data = data + 1
        np.testing.assert_array_equal(v.numpy(), data[2:5])
    assert f.captured is not None


def test_sharded_view_inputs_stay_views_of_their_buffers() -> None:
    devs = ("CPU", "CPU:1")

    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a * 2).realize()

    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    base = Tensor(data).shard(devs, axis=0).realize()
    v = base[:, 2:5]
    for _ in range(4):
        np.testing.assert_array_equal(f(v).numpy(), data[:, 2:5] * 2)
        base.assign(base + 1).realize()
        data = data + 1
        np.testing.assert_array_equal(v.numpy(), data[:, 2:5])


@pytest.mark.parametrize("view", ["whole", "slice", "reshape"])
def test_returned_input_shows_each_calls_input(view: str) -> None:
    """An input returned as it is (contiguous() of a buffer is the buffer) or as a view, next to a computed output:
    every replay returns the new call's input, not the one the capture saw."""

    @TinyJit
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        passed = {"whole": x.contiguous(), "slice": x[::2], "reshape": x.reshape(2, 2)}[view]
        return passed, (x * 2).contiguous()

    for i in range(4):
        a = np.arange(4, dtype=np.float32) + i
        passed, doubled = f(Tensor(a).realize())
        want = {"whole": a, "slice": a[::2], "reshape": a.reshape(2, 2)}[view]
        np.testing.assert_array_equal(passed.numpy(), want)
        np.testing.assert_array_equal(doubled.numpy(), a * 2)


def test_returned_input_after_a_write_to_another_input_shows_each_calls_input() -> None:
    """The capture's only kernel is a write the return value doesn't depend on (flushed after the returns are
    realized): the passed-through input is still returned as the new call's."""

    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        y.assign(y + 1)
        return x

    for i in range(4):
        a = np.arange(3, dtype=np.float32) + i
        np.testing.assert_array_equal(f(Tensor(a).realize(), Tensor(np.zeros(2, np.float32)).realize()).numpy(), a)
