"""Training-step benchmark: first-step (schedule + compile + run) and steady-state step time of the main job's
models at batch 128 under Adam and TinyJit, with images/s.

Run: python3 bench/train.py [--models mlp,small-cnn,cnn] [--steps N] [--warm-cache] [--oob-models mlp,cnn]
[--oob-only]. The default measures all three models (the classic CNN is the main job's). Issue targets: CNN step <
150 ms, MLP step < 2 ms, first CNN step with a cold compile cache <= 1 s. The first step includes scheduling,
lowering and compiling every kernel: it runs with an empty compile cache (a fresh SPECK_CACHE_DIR for this process)
unless --warm-cache uses the usual one, and a line under each model says where its time went: the main thread's CPU
(scheduling and lowering; the LLVM compiles run meanwhile in the compile lanes' worker processes, one per core but
the main thread's, and on the main thread once it waits for them) and the compiles' CPU.

The "bounds check" rows give the cost of CHECK_OOB (the device-side check of index tensors; here the labels of the
cross-entropy): the steady step with the check on and off, built as two jitted steps and timed in interleaved
rounds, medians, as a ratio (target: under 1.03).

The last line is a reference for the host's speed at the time: numpy's float32 1024x1024 matmul, measured before
and after the models. This VM's cores slow down for minutes at a time (by 10-20%), and the step times move with
them; compare runs by it (about 80 GFLOPS when the machine is quiet)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _host
import numpy as np

from speck.tensor import Context, GlobalCounters, Tensor, TinyJit
from speck.tensor.examples.train import MAIN_JOB_WINO, MODELS
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters
from speck.tensor.realize import compile_pool_stats

TARGET_MS = {"mlp": 2.0, "cnn": 150.0}
OOB_TARGET = 1.03  # CHECK_OOB=1 step time / CHECK_OOB=0 step time
FIRST_TARGET_S = {"cnn": 1.0}


def jit_train_step(model: Any, opt: Any) -> Any:
    """The main job's training step (forward, cross-entropy, backward, optimizer step) under TinyJit."""

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train(), Context(WINO=MAIN_JOB_WINO):  # (the main job's convolutions, as speck-train runs them)
            opt.zero_grad()
            loss = model(xb).sparse_categorical_crossentropy(yb)
            loss.backward()
            opt.step(loss)
        return loss

    return step


def fixed_batch_step(name: str, batch: int) -> tuple[Any, Tensor, Tensor]:
    """(the main job's jitted training step (Adam) for one model, a fixed random batch x, its labels y)."""
    Tensor.manual_seed(0)
    model = MODELS[name]()
    opt = Adam(get_parameters(model), lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((batch, 1, 28, 28), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32)).realize()
    return jit_train_step(model, opt), x, y


def make_step(name: str, batch: int) -> Callable[[], Tensor]:
    """The main job's jitted training step (Adam) for one model on a fixed random batch: call it to run a step."""
    step, x, y = fixed_batch_step(name, batch)
    return lambda: step(x, y)


def bench_model(name: str, batch: int, steps: int) -> tuple[float, float, int, str]:
    """(first step s, median steady step s, kernels per step, where the first step's time went) for one model on
    random data."""
    step = make_step(name, batch)
    before = compile_pool_stats()
    t0, c0 = time.perf_counter(), time.thread_time()
    step().item()
    first, main_cpu = time.perf_counter() - t0, time.thread_time() - c0
    after = compile_pool_stats()
    keys = ("submitted", "shared", "cpu_s", "worker_cpu_s", "worker_objects")
    d = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    detail = (f"first step: main thread {main_cpu:.2f} s CPU (schedule, lowering, run); {int(d['submitted'])} "
              f"compiles ({int(d['shared'])} of them another's object renamed), {d['cpu_s']:.2f} s CPU on "
              f"{int(after.get('lanes', 0))} lanes ({int(d['worker_objects'])} objects, {d['worker_cpu_s']:.2f} s, "
              "in worker processes)")  # fmt: skip
    step().item()  # the capture run
    times = []
    for _ in range(steps):
        GlobalCounters.reset()
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), GlobalCounters.kernel_count, detail


def bench_check_oob(name: str, batch: int) -> tuple[float, float]:
    """(median step s with CHECK_OOB=1, with CHECK_OOB=0) of one model's jitted training step: the two steps are
    built and captured under their setting (it decides the graph), then timed in alternating rounds of about
    50 ms (at least 3 steps) each, so a slow spell of the machine hits both alike; as many rounds as fit in about
    10 s (9 to 99)."""
    made = {}
    for check in (1, 0):
        with Context(CHECK_OOB=check):
            step = make_step(name, batch)
            step().item()  # the eager run
            step().item()  # the capture
        made[check] = step
    t0 = time.perf_counter()
    made[1]().item()
    one = time.perf_counter() - t0
    steps = max(3, int(0.05 / one))
    rounds = min(99, max(9, int(10 / (2 * steps * one))))
    times: dict[int, list[float]] = {1: [], 0: []}
    for r in range(rounds):
        for check in (1, 0) if r % 2 == 0 else (0, 1):
            step = made[check]
            step().item()  # (warm: the other step ran last)
            t0 = time.perf_counter()
            for _ in range(steps):
                step().item()
            times[check].append((time.perf_counter() - t0) / steps)
    return statistics.median(times[1]), statistics.median(times[0])


def host_gflops(reps: int = 7) -> float:
    """numpy's float32 1024x1024 matmul rate (median of reps): how fast the machine is right now."""
    a = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
    a @ a  # warm-up: BLAS threads, caches
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t0)
    return 2 * 1024**3 / statistics.median(times) / 1e9


def main() -> None:
    _host.describe()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,small-cnn,cnn", help="comma-separated: " + ",".join(sorted(MODELS)))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10, help="steady-state steps timed (median)")
    ap.add_argument(
        "--warm-cache", action="store_true", help="first step with the usual compile cache, not an empty one"
    )
    ap.add_argument("--oob-models", default="mlp,cnn", help="models whose CHECK_OOB cost is measured ('': none)")
    ap.add_argument("--oob-only", action="store_true", help="only the CHECK_OOB cost rows")
    args = ap.parse_args()
    cold = None if args.warm_cache else tempfile.TemporaryDirectory(prefix="speck-bench-cold-")  # removed at exit
    if cold is not None:
        os.environ["SPECK_CACHE_DIR"] = cold.name  # read at every compile
    before = host_gflops()
    cache = "warm (usual)" if args.warm_cache else "cold (empty)"
    print(f"{'model':10s} {'batch':>5s} {'first s':>8s} {'step ms':>9s} {'images/s':>9s} {'kernels':>7s} "
          f"{'target ms':>9s} {'first target s':>14s}   compile cache: {cache}")  # fmt: skip
    for name in [] if args.oob_only else args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}: expected one of {', '.join(sorted(MODELS))}")
        first, step_s, kernels, detail = bench_model(name, args.batch, args.steps)
        target, first_target = TARGET_MS.get(name), FIRST_TARGET_S.get(name)
        print(f"{name:10s} {args.batch:5d} {first:8.2f} {step_s * 1e3:9.2f} {args.batch / step_s:9.0f} {kernels:7d} "
              f"{'' if target is None else f'{target:9.1f}':>9s} "
              f"{'' if first_target is None else f'{first_target:14.1f}':>14s}")  # fmt: skip
        print(f"{'':10s} {detail}")
    for name in filter(None, args.oob_models.split(",")):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}: expected one of {', '.join(sorted(MODELS))}")
        on, off = bench_check_oob(name, args.batch)
        print(f"bounds check {name:10s} step {on * 1e3:8.3f} ms with CHECK_OOB=1, {off * 1e3:8.3f} ms with "
              f"CHECK_OOB=0: ratio {on / off:.3f} (target < {OOB_TARGET})")  # fmt: skip
    print(
        f"host reference: numpy float32 matmul 1024 at {before:.1f} GFLOPS before the models, {host_gflops():.1f} "
        "after (about 80 on a quiet machine)"
    )


if __name__ == "__main__":
    main()
