"""speck.hcq runtime benchmark: the CPU device beside numpy, in one process.

Rows: elementwise a+b on 16M float32 (GB/s), sum of 16M float32 (GB/s), empty-kernel submit-to-completion round
trip (us), the 2-thread speedup over 1 thread on the sum, and kernels launched one by one vs batched in a CPU graph.
Medians of alternating repeats.

The a+b and sum kernels are the ones speck.codegen emits for `a + b` and `a.sum()` (scheduled by speck.tensor,
lowered and compiled for the CPU device's backend); the runtime calls them directly on speck.hcq Buffers, so the
figures are the kernels' and the runtime's, without the tensor layer's scheduling. The empty kernel measuring launch
overhead is a one-line LLVM function: it has no body for codegen to produce.

Run: python3 bench/runtime.py   (N=... elements, REPEATS=... to change the defaults)"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import _host
import numpy as np

from speck.hcq import Buffer, Device

N = int(os.environ.get("N", str(16 * 1024 * 1024)))
REPEATS = int(os.environ.get("REPEATS", "15"))
BATCH = 64  # empty kernels per batch in the launch-overhead row

EMPTY_IR = """
define void @empty(i32 %s, i32 %e) {
  ret void
}
"""


def median_time(fn: Callable[[], object], repeats: int = REPEATS, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def paired_times(a: Callable[[], object], b: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float]:
    """Median times of `a` and `b` measured alternately, so both see the same machine load (other processes on a
    shared machine otherwise skew one side of the ratio)."""
    for _ in range(2):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta), statistics.median(tb)


class Kernels:
    """The programs codegen emits for one tensor expression, loaded on `dev`, with Buffers for every buffer they
    touch (inputs filled from `inputs`, in the order the expression's realized tensors were made)."""

    def __init__(self, dev: Any, expr: Any, buffer_of: dict[Any, Buffer]) -> None:
        self.calls: list[tuple[Any, list[Buffer], tuple[int, ...]]] = []
        items = expr.schedule()
        for it in items:
            spec = dev.backend.to_program(it.ast)
            prog = dev.load_program(spec)
            bufs = []
            for u in it.bufs:
                if u not in buffer_of:
                    buffer_of[u] = Buffer(dev.name, int(u.arg), np.float32)
                bufs.append(buffer_of[u])
            self.calls.append((prog, [bufs[a.slot] for a in spec.buffers], tuple(int(g) for g in spec.global_size)))
        self.out = buffer_of[items[-1].bufs[0]]

    def run(self, threads: int | None = None) -> None:
        for prog, bufs, gs in self.calls:
            prog(*bufs, global_size=gs, threads=threads, wait=True)


def main() -> None:
    from speck.tensor import Tensor
    from speck.tensor.schedule import base_buffer

    dev = Device["CPU"]
    threads = dev.threads  # type: ignore[attr-defined]
    empty = dev.runtime("empty", dev.compiler.compile(EMPTY_IR), buffers=[], vars=[])

    rng = np.random.default_rng(0)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    out_np = np.empty_like(a)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    A, B = Buffer("CPU", N, np.float32).copyin(a), Buffer("CPU", N, np.float32).copyin(b)
    buffer_of = {base_buffer(ta.uop): A, base_buffer(tb.uop): B}
    add = Kernels(dev, ta + tb, buffer_of)
    total = Kernels(dev, ta.sum(), buffer_of)
    add.out.copyin(out_np)  # touch the pages once, as numpy's out array is touched by its first run

    # correctness first: a benchmark of wrong results is worthless
    add.run()
    np.testing.assert_array_equal(add.out.numpy(), a + b)
    add_kernels = len(add.calls)

    def speck_sum(t: int | None = None) -> None:
        total.run(t)

    S = total.out
    speck_sum()
    ref = float(np.sum(a, dtype=np.float64))
    got = float(S.numpy()[0])
    assert abs(got - ref) <= 1e-4 * np.sum(np.abs(a)), (got, ref)

    nbytes_add, nbytes_sum = 3 * 4 * N, 4 * N
    t_np_add, t_sp_add = paired_times(lambda: np.add(a, b, out=out_np), add.run)
    t_np_sum, t_sp_sum = paired_times(lambda: np.sum(a), speck_sum)
    t_sum_1, t_sum_2 = paired_times(lambda: speck_sum(1), lambda: speck_sum(2))
    t_np_call = median_time(lambda: np.add(a[:1], b[:1], out=out_np[:1]), repeats=2000, warmup=50)
    t_rt = median_time(lambda: empty(wait=True), repeats=2000, warmup=50)

    # launch overhead: BATCH empty kernels one exec at a time vs one CPU graph (speck.hcq.graph) holding all of
    # them, per kernel; and the same graph with every kernel split across all workers (a spin barrier after each)
    from speck.hcq.graph import CPUGraph

    def one_by_one() -> None:
        for _ in range(BATCH):
            empty(global_size=(1, 1, 1))
        dev.synchronize()

    graph, split = CPUGraph(dev), CPUGraph(dev)  # type: ignore[arg-type]
    for _ in range(BATCH):
        graph.add_exec(empty, [], (1, 1, 1), threads=1)
        split.add_exec(empty, [], (threads, 1, 1), threads=threads)
    split.workers = threads
    t_each, t_graph = paired_times(one_by_one, graph.run, repeats=200)
    t_split = median_time(split.run, repeats=200)

    gbs = lambda nbytes, t: nbytes / t / 1e9
    rows = [
        ("a+b 16M float32 (GB/s)", f"{gbs(nbytes_add, t_np_add):.2f}", f"{gbs(nbytes_add, t_sp_add):.2f}",
         f"{t_np_add / t_sp_add:.2f}x", ">= 1.5x"),
        ("sum 16M float32 (GB/s)", f"{gbs(nbytes_sum, t_np_sum):.2f}", f"{gbs(nbytes_sum, t_sp_sum):.2f}",
         f"{t_np_sum / t_sp_sum:.2f}x", ">= 2x"),
        ("empty kernel round trip (us)", f"{t_np_call * 1e6:.1f}*", f"{t_rt * 1e6:.1f}", "", "< 20 us"),
        ("sum: 2 threads over 1 thread", "", f"{t_sum_1 / t_sum_2:.2f}x", "", ">= 1.7x"),
        (f"{BATCH} empty kernels: one by one / batched (us per kernel)", "", f"{t_each / BATCH * 1e6:.2f} / "
         f"{t_graph / BATCH * 1e6:.2f}", f"{t_each / t_graph:.1f}x", ""),
    ]  # fmt: skip
    _host.describe()
    print(f"speck.hcq runtime benchmark: N={N}, {threads} worker threads, medians of {REPEATS} alternating runs; "
          f"codegen's kernels: a+b {add_kernels}, sum {len(total.calls)}")  # fmt: skip
    head = ("", "numpy", "speck CPU", "ratio", "target")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print("* numpy column of the round-trip row: a 1-element np.add call, for scale")
    print(f"sum 1 thread {gbs(nbytes_sum, t_sum_1):.2f} GB/s, 2 threads {gbs(nbytes_sum, t_sum_2):.2f} GB/s")
    print(f"batched with every kernel split across {threads} workers: {t_split / BATCH * 1e6:.2f} us per kernel")
    print(f"load average while running: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other processes skew this)")


if __name__ == "__main__":
    main()
