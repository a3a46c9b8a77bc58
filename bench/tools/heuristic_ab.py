"""A/B of two CPU optimizer heuristics on a jitted training step, in one process: the step is built twice, once with
this checkout's `hand_coded_optimizations` and once with the one in another checkout's heuristic.py (each build
with an empty program cache and CACHELEVEL=0), then both are timed in alternating rounds: wall-clock medians and
the process CPU of a step with its CPU graph on one worker (what a busy shared host moves least). Ratios are the
result. It also prints how many of each step's kernels carry a SWAP, to show the two builds differ.

Run: python3 bench/tools/heuristic_ab.py --other /work/main/packages/codegen/src/speck/codegen/opt/heuristic.py
[--model cnn] [--rounds 15]"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for train.py

from train import fixed_batch_step  # type: ignore[import-not-found]

import speck.codegen.opt as opt
import speck.tensor.realize as realize
from speck.hcq import runner
from speck.tensor import Context


def build(model: str, heuristic: Callable[..., Any]) -> tuple[Callable[[], float], Any]:
    """(the captured step, its TinyJit) lowered with `heuristic`."""
    opt.hand_coded_optimizations = heuristic  # type: ignore[assignment]
    realize._program_cache.clear()
    # (no caches: a lowered-kernel cache entry would hand both builds the same program)
    with Context(CACHELEVEL=0):
        jit, x, y = fixed_batch_step(model, 128)
        for _ in range(3):
            jit(x, y).item()
    return (lambda: float(jit(x, y).item())), jit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="the other checkout's speck/codegen/opt/heuristic.py")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("other_heuristic", a.other)
    assert spec is not None and spec.loader is not None, a.other
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    mine = opt.hand_coded_optimizations
    steps = {"other": build(a.model, other.hand_coded_optimizations), "this": build(a.model, mine)}
    opt.hand_coded_optimizations = mine  # type: ignore[assignment]
    for k, (_, jit) in steps.items():
        calls = [c for c in jit.captured.plan.calls if type(c) is runner.Exec and c.program.spec is not None]
        swaps = sum(any(o.op.name == "SWAP" for o in c.program.spec.applied_opts) for c in calls)
        print(f"{k}: {len(calls)} kernels, {swaps} with a SWAP")
    inner = 20 if a.model == "mlp" else 2
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for one_worker, res, clock in ((False, wall, time.perf_counter), (True, cpu, time.process_time)):
        for _, jit in steps.values():
            for s in jit.captured.plan.steps or ():
                if type(s).__name__ == "Batch" and one_worker:
                    s.graph.workers = 1
        for r in range(a.rounds):
            for k in steps if r % 2 == 0 else reversed(list(steps)):
                t0 = clock()
                for _ in range(inner):
                    steps[k][0]()
                res[k].append((clock() - t0) / inner)
    for name, res in (("wall", wall), ("one-worker process CPU", cpu)):
        med = {k: statistics.median(v) for k, v in res.items()}
        print(f"{name}: other {med['other'] * 1e3:.3f} ms, this {med['this'] * 1e3:.3f} ms, "
              f"this/other {med['this'] / med['other']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
