"""speck.hcq runtime benchmark: the CPU device beside numpy, in one process.

Rows: elementwise a+b on 16M float32 (GB/s), sum of 16M float32 (GB/s), empty-kernel submit-to-completion round
trip (us), and the 2-thread speedup over 1 thread on the sum. Medians of repeats.

The kernels are hand-written LLVM IR following CPU_ABI.md (8-wide float vectors, four accumulators for the sum,
a partial sum per row of the outermost dimension then a one-row combine kernel). They stand in for
codegen-generated kernels and will be replaced by them once speck.codegen's renderers land.

Run: python3 bench/runtime.py   (N=... elements, REPEATS=... to change the defaults)"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from speck.hcq import Buffer, Device

N = int(os.environ.get("N", str(16 * 1024 * 1024)))
REPEATS = int(os.environ.get("REPEATS", "15"))
ROWS = 64  # partial sums: the unit the worker threads split
BATCH = 64  # empty kernels per batch in the launch-overhead row

# o[8i:8i+8] = a[8i:8i+8] + b[8i:8i+8]; non-temporal stores skip reading the output lines first
ADD8_IR = """
define void @add8(ptr noalias align 32 %o, ptr noalias align 32 %a, ptr noalias align 32 %b, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %ix = sext i32 %i to i64
  %off = shl i64 %ix, 3
  %pa = getelementptr float, ptr %a, i64 %off
  %pb = getelementptr float, ptr %b, i64 %off
  %va = load <8 x float>, ptr %pa, align 32
  %vb = load <8 x float>, ptr %pb, align 32
  %r = fadd <8 x float> %va, %vb
  %q = getelementptr float, ptr %o, i64 %off
  store <8 x float> %r, ptr %q, align 32, !nontemporal !0
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  fence seq_cst
  ret void
}
!0 = !{i32 1}
"""

# out[row] = sum(in[row*len : (row+1)*len]) with four <8 x float> accumulators (len a multiple of 32)
SUM_ROWS_IR = """
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
define void @sum_rows(ptr noalias %o, ptr noalias align 32 %a, i32 %len, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %row, label %exit
row:
  %r = phi i32 [%s, %entry], [%rn, %rowend]
  %r64 = sext i32 %r to i64
  %len64 = sext i32 %len to i64
  %base = mul i64 %r64, %len64
  br label %inner
inner:
  %j = phi i64 [0, %row], [%jn, %inner]
  %a0 = phi <8 x float> [zeroinitializer, %row], [%n0, %inner]
  %a1 = phi <8 x float> [zeroinitializer, %row], [%n1, %inner]
  %a2 = phi <8 x float> [zeroinitializer, %row], [%n2, %inner]
  %a3 = phi <8 x float> [zeroinitializer, %row], [%n3, %inner]
  %k = add i64 %base, %j
  %p0 = getelementptr float, ptr %a, i64 %k
  %p1 = getelementptr float, ptr %p0, i64 8
  %p2 = getelementptr float, ptr %p0, i64 16
  %p3 = getelementptr float, ptr %p0, i64 24
  %v0 = load <8 x float>, ptr %p0, align 32
  %v1 = load <8 x float>, ptr %p1, align 32
  %v2 = load <8 x float>, ptr %p2, align 32
  %v3 = load <8 x float>, ptr %p3, align 32
  %n0 = fadd <8 x float> %a0, %v0
  %n1 = fadd <8 x float> %a1, %v1
  %n2 = fadd <8 x float> %a2, %v2
  %n3 = fadd <8 x float> %a3, %v3
  %jn = add i64 %j, 32
  %cj = icmp slt i64 %jn, %len64
  br i1 %cj, label %inner, label %rowend
rowend:
  %s01 = fadd <8 x float> %n0, %n1
  %s23 = fadd <8 x float> %n2, %n3
  %sv = fadd <8 x float> %s01, %s23
  %tot = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %sv)
  %q = getelementptr float, ptr %o, i64 %r64
  store float %tot, ptr %q
  %rn = add i32 %r, 1
  %c = icmp slt i32 %rn, %e
  br i1 %c, label %row, label %exit
exit:
  ret void
}
"""

# out[0] = sum(in[0:n]) sequentially: the final combine of the partial sums (no global dimension)
COMBINE_IR = """
define void @combine(ptr noalias %o, ptr noalias %a, i32 %n, i32 %s, i32 %e) {
entry:
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%in, %loop]
  %acc = phi float [0.0, %entry], [%acc2, %loop]
  %ix = sext i32 %i to i64
  %p = getelementptr float, ptr %a, i64 %ix
  %v = load float, ptr %p
  %acc2 = fadd float %acc, %v
  %in = add i32 %i, 1
  %c = icmp slt i32 %in, %n
  br i1 %c, label %loop, label %exit
exit:
  store float %acc2, ptr %o
  ret void
}
"""

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


def main() -> None:
    assert N % (ROWS * 32) == 0, f"N must be a multiple of {ROWS * 32}"
    dev = Device["CPU"]
    threads = dev.threads  # type: ignore[attr-defined]
    comp = dev.compiler
    add8 = dev.runtime("add8", comp.compile(ADD8_IR))
    sum_rows = dev.runtime("sum_rows", comp.compile(SUM_ROWS_IR))
    combine = dev.runtime("combine", comp.compile(COMBINE_IR))
    empty = dev.runtime("empty", comp.compile(EMPTY_IR), buffers=[], vars=[])

    rng = np.random.default_rng(0)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    out_np = np.empty_like(a)
    A, B, O = (
        Buffer("CPU", N, np.float32).copyin(a),
        Buffer("CPU", N, np.float32).copyin(b),
        Buffer("CPU", N, np.float32),
    )
    O.copyin(out_np)  # touch the pages once, as numpy's out array is touched by its first run
    P, S = Buffer("CPU", ROWS, np.float32), Buffer("CPU", 1, np.float32)

    # correctness first: a benchmark of wrong results is worthless
    add8(O, A, B, global_size=(N // 8, 1, 1), wait=True)
    np.testing.assert_array_equal(O.numpy(), a + b)

    def speck_sum(t: int | None = None) -> None:
        sum_rows(P, A, global_size=(ROWS, 1, 1), vals=(N // ROWS,), threads=t)
        combine(S, P, global_size=(1, 1, 1), vals=(ROWS,), wait=True)

    speck_sum()
    ref = float(np.sum(a, dtype=np.float64))
    got = float(S.numpy()[0])
    assert abs(got - ref) <= 1e-4 * np.sum(np.abs(a)), (got, ref)

    nbytes_add, nbytes_sum = 3 * 4 * N, 4 * N
    t_np_add, t_sp_add = paired_times(
        lambda: np.add(a, b, out=out_np), lambda: add8(O, A, B, global_size=(N // 8, 1, 1), wait=True)
    )
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
    print(f"speck.hcq runtime benchmark: N={N}, {threads} worker threads, medians of {REPEATS} alternating runs")
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
