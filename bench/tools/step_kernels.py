"""Where a jitted training step's CPU time goes, measured so that a busy shared machine barely moves it: every
kernel of the step run alone on the calling thread (one core), best of --reps process-CPU times, sorted, with the
kernels' sum; and the whole step's process CPU time with its CPU graph on one worker (the work itself, without
waiting for a descheduled second core). Wall-clock step times on a loaded 2-core host swing by 2-4x; these move by
a few percent, so they are what to compare between two checkouts (run this under each one's packages).

Run: python3 bench/tools/step_kernels.py [--model cnn] [--top 25] [--reps 5] [--steps 8]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for train.py

from train import fixed_batch_step  # type: ignore[import-not-found]

from speck.hcq import runner
from speck.tensor.examples.train import MODELS
from speck.tensor.schedule import buffer_map_data


def captured_step(model_name: str, batch: int = 128) -> tuple[Any, Any]:
    """(the step function, its TinyJit) after warm-up and capture, on a fixed random batch."""
    jit, x, y = fixed_batch_step(model_name, batch)
    for _ in range(3):
        jit(x, y).item()
    return (lambda: jit(x, y).item()), jit


def kernel_times(jit: Any, reps: int) -> list[tuple[float, str, tuple[Any, ...]]]:
    """(best single-thread CPU seconds, name, applied opts) of every kernel call of the captured step."""
    cap = jit.captured
    plan = cap.plan
    bufs: list[Any] = list(map(buffer_map_data.get, cap._keys))
    rows = []
    for c in plan.calls:
        if type(c) is not runner.Exec:
            continue
        hb = [bufs[s] for s in c.args]
        best = float("inf")
        for _ in range(reps):
            t0 = time.process_time()
            c.program(*hb, wait=True, global_size=c.global_size, threads=1)
            best = min(best, time.process_time() - t0)
        spec = c.program.spec
        rows.append((best, c.program.name, tuple(spec.applied_opts) if spec is not None else ()))
    return sorted(rows, key=lambda r: -r[0])


def one_worker_cpu(step: Any, jit: Any, steps: int) -> float:
    """Median process CPU seconds of a step with every CPU graph of the capture on one worker."""
    for s in jit.captured.plan.steps or ():
        if type(s).__name__ == "Batch":
            s.graph.workers = 1
    times = []
    for _ in range(steps):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn", choices=sorted(MODELS))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    step, jit = captured_step(a.model)
    rows = kernel_times(jit, a.reps)
    total = sum(r[0] for r in rows)
    print(f"{a.model}: {len(rows)} kernels, {total * 1e3:.1f} ms single-thread CPU in all (each alone, best of "
          f"{a.reps})")  # fmt: skip
    for t, name, opts in rows[: a.top]:
        print(f"{t * 1e3:8.2f} ms {100 * t / total:5.1f}%  {name:40s} {' '.join(map(repr, opts))}")
    print(f"step on one worker: {one_worker_cpu(step, jit, a.steps) * 1e3:.1f} ms process CPU (median of {a.steps})")


if __name__ == "__main__":
    main()
