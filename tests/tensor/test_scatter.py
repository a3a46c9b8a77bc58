"""scatter / scatter_reduce against a plain Python reference: random dims, shapes and duplicate indices (the last
duplicate along dim wins for plain scatter; every duplicate takes part in reductions), include_self, out-of-range
indices an IndexError (ignored with CHECK_OOB=0), and the work: one scatter kernel over the k index elements (plus a
copy of self), not a pass over self per index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor
from speck.tensor.errors import IndexOutOfBoundsError
from speck.tensor.schedule import assert_kernel_count


def _reference(x: np.ndarray, dim: int, idx: np.ndarray, src: np.ndarray, mode: str, include_self: bool) -> np.ndarray:
    out = x.astype(np.float64).copy()
    groups: dict[tuple[int, ...], list[float]] = {}
    for p in np.ndindex(*idx.shape):  # row-major: along dim, later duplicates come later
        q = list(p)
        q[dim] = int(idx[p])
        if not 0 <= q[dim] < x.shape[dim]:
            continue
        groups.setdefault(tuple(q), []).append(float(src[p]))
    for q, vals in groups.items():
        allv = ([out[q]] if include_self else []) + vals
        out[q] = {"set": vals[-1], "sum": sum(allv), "prod": float(np.prod(allv)), "amax": max(allv),
                  "amin": min(allv), "mean": sum(allv) / len(allv)}[mode]  # fmt: skip
    return out.astype(x.dtype)


@given(data=st.data(), mode=st.sampled_from(["set", "sum", "prod", "amax", "amin", "mean"]),
       include_self=st.booleans())  # fmt: skip
@settings(max_examples=30)
def test_scatter_matches_reference(data: st.DataObject, mode: str, include_self: bool) -> None:
    shape = data.draw(st.sampled_from([(6,), (3, 5), (2, 3, 4)]), label="shape")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    ishape = tuple(data.draw(st.integers(1, s + 2 if i == dim else s)) for i, s in enumerate(shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = rng.integers(-4, 5, shape).astype(np.float32)
    idx = rng.integers(-1, shape[dim] + 1, ishape).astype(np.int32)  # duplicates and out-of-range values
    src = rng.integers(-4, 5, ishape).astype(np.float32)

    def run() -> np.ndarray:
        if mode == "set":
            return Tensor(x).scatter(dim, Tensor(idx), Tensor(src)).numpy()
        return Tensor(x).scatter_reduce(dim, Tensor(idx), Tensor(src), mode, include_self=include_self).numpy()

    ref = _reference(x, dim, idx, src, mode, include_self or mode == "set")
    if ((idx < 0) | (idx >= shape[dim])).any():
        with pytest.raises(IndexOutOfBoundsError, match="^scatter: index"):
            run()
        with Context(CHECK_OOB=0):  # unchecked: out-of-range indices are ignored
            np.testing.assert_allclose(run(), ref, rtol=1e-6)
    else:
        np.testing.assert_allclose(run(), ref, rtol=1e-6)


def test_scatter_scalar_src_and_reduce_names() -> None:
    x = np.zeros((2, 4), np.float32)
    idx = np.array([[0, 0], [3, 1]], np.int32)
    got = Tensor(x).scatter(1, Tensor(idx), 2.0, reduce="add").numpy()
    np.testing.assert_array_equal(got, _reference(x, 1, idx, np.full((2, 2), 2, np.float32), "sum", True))
    with pytest.raises(TypeError):
        Tensor(x).scatter(1, Tensor(idx), 2.0, reduce="max")
    with pytest.raises(RuntimeError):
        Tensor(x).scatter_reduce(1, Tensor(idx), Tensor(np.ones((2, 2), np.float32)), "median")
    with pytest.raises(RuntimeError, match="dtype"):
        Tensor(x).scatter(1, Tensor(idx), Tensor(np.ones((2, 2), np.int32)))


def test_int_scatter_reduce() -> None:
    x = np.array([[5, -3, 2]], np.int32)
    idx = np.array([[2, 2, 0, 1]], np.int32)
    src = np.array([[7, -9, 4, 1]], np.int32)
    for mode in ("sum", "prod", "amax", "amin"):
        for inc in (True, False):
            got = Tensor(x).scatter_reduce(1, Tensor(idx), Tensor(src), mode, include_self=inc).numpy()
            np.testing.assert_array_equal(got, _reference(x, 1, idx, src, mode, inc), err_msg=f"{mode} {inc}")


def test_scatter_is_a_copy_and_one_pass_over_the_indices() -> None:
    n, k = 1 << 18, 5000
    rng = np.random.default_rng(0)
    x = rng.random(n, dtype=np.float32)
    idx, src = rng.integers(0, n, k).astype(np.int32), rng.random(k, dtype=np.float32)
    t, ti, ts = Tensor(x).realize(), Tensor(idx).realize(), Tensor(src).realize()
    out = t.scatter_reduce(0, ti, ts, "sum")
    with assert_kernel_count(2):
        out.realize()
    ref = x.copy()
    np.add.at(ref, idx, src)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    np.testing.assert_array_equal(t.numpy(), x)  # functional: self is untouched
    view = t[:10]
    with assert_kernel_count(1):  # the in-place form (np.add.at): one scatter kernel, no copy of the target
        t.assign(t.scatter_reduce(0, ti, ts, "sum")).realize()
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(view.numpy(), ref[:10], rtol=1e-6)


# ---------------- gradients of the O(k) scatter (inputs that did not ask for gradients when scattered) ----------------
def _linear_grads(f: object, args: list[np.ndarray]) -> list[np.ndarray]:
    """d sum(f(*args)) / d args by unit perturbations: exact for f linear in its arguments, which scatter (set,
    sum, mean) followed by a product with fixed weights is."""
    fn = f  # type: ignore[assignment]
    at = fn(*args).sum()  # type: ignore[operator]
    out = []
    for i, a in enumerate(args):
        g = np.zeros(a.shape)
        for p in np.ndindex(*a.shape):
            b = [x.copy() for x in args]
            b[i][p] += 1.0
            g[p] = fn(*b).sum() - at  # type: ignore[operator]
        out.append(g)
    return out


@pytest.mark.parametrize("mode,include_self", [("set", True), ("sum", True), ("sum", False), ("mean", True),
                                               ("mean", False)])  # fmt: skip
def test_scatter_gradient_matches_reference(mode: str, include_self: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5))
    src = rng.standard_normal((3, 4))
    idx = rng.integers(-1, 6, (3, 4))  # duplicates and out-of-range (-1, 5) indices
    w = rng.standard_normal((3, 5))

    def ref(xv: np.ndarray, sv: np.ndarray) -> np.ndarray:
        return _reference(xv, 1, idx, sv, mode, include_self).astype(np.float64) * w

    want_x, want_src = _linear_grads(ref, [x, src])
    tx, tsrc = Tensor(x.astype(np.float32)), Tensor(src.astype(np.float32))  # no requires_grad: the O(k) scatter
    ti = Tensor(idx.astype(np.int32))
    with Context(CHECK_OOB=0):  # (out-of-range indices are an error with the check on: ignored without it)
        out = (
            tx.scatter(1, ti, tsrc)
            if mode == "set"
            else tx.scatter_reduce(1, ti, tsrc, mode, include_self=include_self)
        )
        (out * Tensor(w.astype(np.float32))).sum().backward()
        assert tx.grad is not None and tsrc.grad is not None
        np.testing.assert_allclose(tx.grad.numpy(), want_x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tsrc.grad.numpy(), want_src, rtol=1e-5, atol=1e-6)


def test_setitem_gradient_reaches_values_and_the_kept_base() -> None:
    rng = np.random.default_rng(8)
    base, vals, w = rng.standard_normal(6), rng.standard_normal(3), rng.standard_normal(6)
    idx = np.array([4, 1, 4])  # a duplicate: the last write wins
    tb, tv = Tensor(base.astype(np.float32)), Tensor(vals.astype(np.float32))
    x = tb * 2
    x[Tensor(idx.astype(np.int32))] = tv
    tw = Tensor(w.astype(np.float32), requires_grad=True)
    gb, gv = (x * tw).sum().gradient(tb, tv)
    kept = np.ones(6)
    kept[idx] = 0
    np.testing.assert_allclose(gb.numpy(), 2 * w * kept, rtol=1e-6)
    np.testing.assert_allclose(gv.numpy(), [0.0, w[1], w[4]], rtol=1e-6)


def test_scatter_amax_gradient_splits_between_tied_contributors() -> None:
    # tinygrad's scatter_reduce is differentiable in every mode; torch splits an amax gradient between ties
    x, s = Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((2, 2), np.float32))
    out = x.scatter_reduce(1, Tensor(np.zeros((2, 2), np.int32)), s, "amax")
    (out * Tensor(np.ones((2, 3), np.float32), requires_grad=True)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1 / 3, 1, 1]] * 2, rtol=1e-6)
    np.testing.assert_allclose(s.grad.numpy(), np.full((2, 2), 1 / 3), rtol=1e-6)
