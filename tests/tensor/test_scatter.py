"""scatter / scatter_reduce against a plain Python reference: random dims, shapes and duplicate indices (the last
duplicate along dim wins for plain scatter; every duplicate takes part in reductions), include_self, out-of-range
indices ignored, and the work: one scatter kernel over the k index elements (plus a copy of self), not a pass over
self per index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor
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
    if mode == "set":
        got = Tensor(x).scatter(dim, Tensor(idx), Tensor(src))
        include_self = True
    else:
        got = Tensor(x).scatter_reduce(dim, Tensor(idx), Tensor(src), mode, include_self=include_self)
    np.testing.assert_allclose(got.numpy(), _reference(x, dim, idx, src, mode, include_self), rtol=1e-6)


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
