"""Large float matmuls copy their right operand into column-stripe-major order first (reduce.py, _packed_product):
results stay equal to numpy's on both sides of the packing threshold (rows, k*m, columns not a multiple of the
stripe, batched and broadcast operands, transposed views, float64, ints), the packed product takes exactly its
expected kernels (one copy + one product; small matmuls stay one kernel), and gradients flow through the copy.
Tolerances: float32 1e-4 relative plus 1e-4 * sqrt(k) absolute (sums of k products in a different order)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.codegen.opt import Opt, OptOps, hand_coded_optimizations, opt_base
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.tensor import Tensor, assert_kernel_count, dtypes
from speck.tensor.reduce import PACK_MIN_ELEMENTS, PACK_MIN_ROWS
from tensor_helpers import assert_matches

# the threshold is k*m = 2**18: 512x512 packs, 512x496 and 496x512 do not
assert PACK_MIN_ELEMENTS == 512 * 512 and PACK_MIN_ROWS == 16


def _arr(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _check(a: np.ndarray, b: np.ndarray, got: np.ndarray) -> None:
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert_matches(got, want, atol=1e-4 * a.shape[-1] ** 0.5, rtol=1e-4)


def _packs(n: int, k: int, m: int) -> bool:
    return m % 16 == 0 and m > 16 and k * m >= PACK_MIN_ELEMENTS and n >= PACK_MIN_ROWS


@pytest.mark.parametrize(
    "n,k,m",
    [(16, 512, 512), (15, 512, 512), (20, 512, 496), (24, 496, 512), (33, 256, 1024), (17, 1024, 272),
     (19, 512, 500), (64, 600, 520), (67, 513, 528)],
)  # fmt: skip
def test_matmul_around_the_packing_threshold_matches_numpy(n: int, k: int, m: int) -> None:
    a, b = _arr((n, k), n), _arr((k, m), m)
    with assert_kernel_count(2 if _packs(n, k, m) else 1):
        out = (Tensor(a).realize() @ Tensor(b).realize()).realize()
    _check(a, b, out.numpy())


@pytest.mark.parametrize("batch", [0, 2])
def test_packed_product_kernel_is_register_blocked(batch: int) -> None:
    # the product kernel the scheduler builds from the packed layout gets the heuristic's 4x16 block (its read of the
    # copy through j//16 and j%16 counts as contiguous) with the column blocks outside the row blocks
    pre = (batch,) if batch else ()
    x, w = Tensor(_arr((*pre, 64, 512), 19)).realize(), Tensor(_arr((*pre, 512, 512), 20)).realize()
    items = [it for it in (x @ w).schedule() if it.ast is not None]
    assert len(items) == 2
    opts = hand_coded_optimizations(opt_base(items[-1].ast), LLVMRenderer(max_vector_bytes=32))
    row, col = (1, 2) if batch else (0, 1)
    assert opts == [Opt(OptOps.UPCAST, row, 4), Opt(OptOps.UPCAST, col, 16), Opt(OptOps.SWAP, row, col)]


def test_large_matmul_is_one_copy_and_one_product_with_fused_epilogue() -> None:
    x, w, bias = _arr((64, 512), 1), _arr((512, 512), 2), _arr((512,), 3)
    tx, tw, tb = Tensor(x).realize(), Tensor(w).realize(), Tensor(bias).realize()
    with assert_kernel_count(2):  # the copy of w, then the product with bias and relu fused into its store
        out = (tx @ tw + tb).relu().realize()
    assert_matches(out.numpy(), np.maximum(x.astype(np.float64) @ w + bias, 0), atol=3e-3, rtol=1e-4)


@pytest.mark.parametrize(
    "sa,sb",
    [((2, 32, 512), (2, 512, 512)), ((3, 1, 16, 512), (2, 512, 512)), ((4, 8, 512), (512, 512)),
     ((2, 20, 512), (512, 500))],
)  # fmt: skip
def test_batched_and_broadcast_matmuls_match_numpy(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = _arr(sa, 5), _arr(sb, 6)
    _check(a, b, (Tensor(a) @ Tensor(b)).numpy())


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
def test_transposed_views_match_numpy(ta: bool, tb: bool) -> None:
    a = _arr((512, 48) if ta else (48, 512), 7)
    b = _arr((512, 512), 8)
    x, w = Tensor(a).realize(), Tensor(b).realize()
    x, w = (x.T if ta else x), (w.T if tb else w)
    an, bn = (a.T if ta else a), (b.T if tb else b)
    # a transposed x is copied row-major too: one more kernel
    with assert_kernel_count(3 if ta else 2):
        out = (x @ w).realize()
    _check(an, bn, out.numpy())


def test_float64_packs_and_matches_numpy() -> None:
    a, b = _arr((32, 512), 9, np.float64), _arr((512, 512), 10, np.float64)
    with assert_kernel_count(2):
        out = (Tensor(a).realize() @ Tensor(b).realize()).realize()
    assert out.dtype == dtypes.float64
    assert_matches(out.numpy(), a @ b, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_matmuls_are_exact_and_unpacked(dtype: Any) -> None:
    a, b = _arr((32, 512), 11, dtype), _arr((512, 512), 12, dtype)
    with assert_kernel_count(1):
        out = (Tensor(a).realize() @ Tensor(b).realize()).realize()
    np.testing.assert_array_equal(out.numpy(), a @ b)


def test_half_inputs_are_not_packed() -> None:
    a, b = _arr((32, 512), 13, np.float16), _arr((512, 512), 14, np.float16)
    with assert_kernel_count(1):
        out = (Tensor(a).realize() @ Tensor(b).realize()).realize()
    assert out.dtype == dtypes.float16
    want = a.astype(np.float32) @ b.astype(np.float32)
    assert_matches(out.numpy().astype(np.float32), want, atol=0.1, rtol=1e-2)


def test_matrix_vector_products_are_not_packed() -> None:
    a, v = _arr((512, 512), 15), _arr((512,), 16)
    ta, tv = Tensor(a).realize(), Tensor(v).realize()
    with assert_kernel_count(1):
        mv = (ta @ tv).realize()
    with assert_kernel_count(1):
        vm = (tv @ ta).realize()
    assert_matches(mv.numpy(), a.astype(np.float64) @ v, atol=3e-3, rtol=1e-4)
    assert_matches(vm.numpy(), v.astype(np.float64) @ a, atol=3e-3, rtol=1e-4)


def test_gradients_flow_through_the_packed_copy() -> None:
    x, w = _arr((32, 512), 17), _arr((512, 512), 18)
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    loss = ((tx @ tw).relu() * 0.5).sum()
    loss.backward()
    assert tx.grad is not None and tw.grad is not None
    g = (x.astype(np.float64) @ w > 0) * 0.5
    assert_matches(tx.grad.numpy(), g @ w.T, atol=3e-3, rtol=1e-4)
    assert_matches(tw.grad.numpy(), x.T @ g, atol=3e-3, rtol=1e-4)
