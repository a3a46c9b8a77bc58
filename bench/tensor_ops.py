"""speck.tensor vs numpy, side by side in one process: matmul GFLOPS (1024, 2048), a 16M-element 3-op elementwise
chain (GB/s), softmax over 4096x4096 (ms), the per-op overhead of (a+b).realize() on 4-element tensors (us), and
100k scattered writes into a 4M float32 tensor (ms): `a[idx] = v` against numpy's, and a scatter_reduce sum
assigned back against np.add.at.

Each figure is the median of repeats after a warm-up run (compiles and caches excluded). Run: python3
bench/tensor_ops.py [--quick]. Targets from the issue: matmul >= 50% of numpy, elementwise >= 2x numpy, overhead
< 100 us, scatter within 5x of numpy."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import _host
import numpy as np

from speck.tensor import Tensor


def median_time(fn: Callable[[], object], repeats: int, budget_s: float = 8.0) -> float:
    """Median wall time of fn() over `repeats` runs (fewer when a run is slow, to stay within budget_s)."""
    t0 = time.perf_counter()
    fn()  # warm-up: compile, allocate
    warm = time.perf_counter() - t0
    if warm > budget_s / 2:  # a very slow run: compile time is noise next to it, so the warm-up is the figure
        return warm
    times: list[float] = []
    t_start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > budget_s:
            break
    return statistics.median(times)


def bench_matmul(n: int, repeats: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    t_np = median_time(lambda: a @ b, repeats)
    t_sp = median_time(lambda: (ta @ tb).realize(), repeats)
    err = np.abs((ta @ tb).numpy() - a @ b).max()
    assert err < 1e-2 * n**0.5, f"matmul {n} mismatch: max error {err}"
    flops = 2 * n**3
    return flops / t_sp * 1e-9, flops / t_np * 1e-9


def bench_elementwise(n: int, repeats: int) -> tuple[float, float]:
    x = np.random.default_rng(1).random(n, dtype=np.float32)
    tx = Tensor(x).realize()
    t_np = median_time(lambda: np.sqrt(x * 2.0 + 1.0), repeats)
    t_sp = median_time(lambda: ((tx * 2.0 + 1.0).sqrt()).realize(), repeats)
    nbytes = 2 * n * 4  # one read, one write: the ideal traffic of the fused chain
    return nbytes / t_sp * 1e-9, nbytes / t_np * 1e-9


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def bench_softmax(n: int, repeats: int) -> tuple[float, float]:
    x = np.random.default_rng(2).standard_normal((n, n), dtype=np.float32)
    tx = Tensor(x).realize()
    t_np = median_time(lambda: _np_softmax(x), repeats)
    t_sp = median_time(lambda: tx.softmax(-1).realize(), repeats)
    return t_sp * 1e3, t_np * 1e3


def bench_overhead(repeats: int) -> tuple[float, float]:
    a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    b = Tensor([5.0, 6.0, 7.0, 8.0]).realize()
    na, nb = a.numpy(), b.numpy()
    t_np = median_time(lambda: na + nb, repeats)
    t_sp = median_time(lambda: (a + b).realize(), repeats)
    return t_sp * 1e6, t_np * 1e6


def bench_scatter(n: int, k: int, repeats: int) -> tuple[float, float, float, float]:
    """(speck setitem, numpy setitem, speck scatter-add, np.add.at) in ms: k random (duplicated) indices into n."""
    rng = np.random.default_rng(3)
    idx = rng.integers(0, n, k).astype(np.int32)
    v = rng.random(k, dtype=np.float32)
    a = np.zeros(n, np.float32)
    ta, ti, tv = Tensor(a).realize(), Tensor(idx).realize(), Tensor(v).realize()

    def sp_set() -> None:
        ta[ti] = tv
        ta.realize()

    def sp_add() -> None:
        ta.assign(ta.scatter_reduce(0, ti, tv, "sum")).realize()

    def np_set() -> None:
        a[idx] = v

    def np_add() -> None:
        np.add.at(a, idx, v)

    sp_set()
    np_set()
    assert np.array_equal(ta.numpy(), a), "setitem with an index tensor differs from numpy"
    sp_add()
    np_add()
    assert np.allclose(ta.numpy(), a, rtol=1e-5), "scatter_reduce sum differs from np.add.at"
    return (median_time(sp_set, repeats) * 1e3, median_time(np_set, repeats) * 1e3,
            median_time(sp_add, repeats) * 1e3, median_time(np_add, repeats) * 1e3)  # fmt: skip


def main() -> None:
    _host.describe()
    quick = "--quick" in sys.argv
    rows: list[tuple[str, float, float, str, str]] = []
    print("speck.tensor vs numpy (median of repeats, warm caches)", flush=True)
    for n in (1024,) if quick else (1024, 2048):
        s, np_ = bench_matmul(n, 3)
        rows.append((f"matmul {n}x{n} float32", s, np_, "GFLOPS", "higher"))
        print(f"  matmul {n}: done", flush=True)
    s, np_ = bench_elementwise(1 << 22 if quick else 1 << 24, 5)
    rows.append(("elementwise sqrt(x*2+1) 16M" if not quick else "elementwise 4M", s, np_, "GB/s", "higher"))
    s, np_ = bench_softmax(1024 if quick else 4096, 3)
    rows.append((f"softmax {1024 if quick else 4096}^2 last axis", s, np_, "ms", "lower"))
    s, np_ = bench_overhead(200)
    rows.append(("(a+b).realize() 4 elements", s, np_, "us", "lower"))
    s_set, np_set, s_add, np_add = bench_scatter(1 << 22, 100_000, 7)
    rows.append(("a[idx] = v, 100k into 4M", s_set, np_set, "ms", "lower"))
    rows.append(("scatter-add 100k into 4M (add.at)", s_add, np_add, "ms", "lower"))
    print()
    print(f"{'benchmark':34s} {'speck':>12s} {'numpy':>12s} {'unit':>7s} {'speck/numpy':>12s}")
    for name, s, np_, unit, better in rows:
        ratio = s / np_ if np_ else float("nan")
        print(f"{name:34s} {s:12.2f} {np_:12.2f} {unit:>7s} {ratio:11.2f}x ({better} is better)")


if __name__ == "__main__":
    main()
