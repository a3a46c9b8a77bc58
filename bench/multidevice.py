"""Multi-device benchmark: allreduce across CPU devices on one host, MPI allreduce across processes, and a
data-parallel CNN training step.

Run: python3 bench/multidevice.py [--reps N] [--steps N] [--only-dp]. Rows:
- allreduce of 64 MB float32 (a (4, 16M) tensor sharded over CPU:0..3, summed over the sharded axis) with the ring
  and the naive algorithm, in GB/s of the 64 MB reduced, beside numpy summing the same four arrays on one core set
  (the memory-bound limit of the reduction itself; the allreduce also leaves the result on all four devices).
  Target: ring >= 0.5x numpy.
- MPI allreduce of 64 MB across 2 ranks on this host (mpiexec, when speck-tensor[mpi] is installed): speck's
  distributed.allreduce_ against mpi4py's Allreduce on numpy arrays, interleaved in the same run. Target >= 0.9x.
- the main job's CNN training step (Adam, TinyJit) data-parallel on CPU:0,CPU:1 against one device with the same
  per-device batch, in images/s (the two steps timed in turns). Target: 2 devices >= 1 device (per image, the same
  work on the same cores).
Times are medians of interleaved rounds; other work on the host moves them (compare the ratios)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import _host  # noqa: F401  (first: unsets the OpenBLAS overrides before numpy loads)
import numpy as np
from train import jit_train_step

from speck.tensor import Context, Tensor
from speck.tensor.examples.train import MODELS
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters

MB64 = 16 << 20  # float32 elements in 64 MB


def bench_allreduce(reps: int) -> list[tuple[str, float]]:
    devices = ("CPU", "CPU:1", "CPU:2", "CPU:3")
    rng = np.random.default_rng(0)
    arrays = [rng.random(MB64, dtype=np.float32) for _ in devices]
    x = Tensor(np.stack(arrays)).shard(devices, axis=0).realize()
    expected = arrays[0] + arrays[1] + arrays[2] + arrays[3]
    times: dict[str, list[float]] = {"ring": [], "naive": [], "numpy": []}
    for ring in (2, 0):  # warm up (compiles) and check the values once
        with Context(RING=ring):
            np.testing.assert_allclose(x.sum(0).numpy(), expected, rtol=1e-5)
    for _ in range(reps):
        for name, ring in (("ring", 2), ("naive", 0)):
            with Context(RING=ring):
                t0 = time.perf_counter()
                x.sum(0).realize()
                times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        arrays[0] + arrays[1] + arrays[2] + arrays[3]
        times["numpy"].append(time.perf_counter() - t0)
    return [(k, MB64 * 4 / statistics.median(v) / 1e9) for k, v in times.items()]


def ring_breakdown(reps: int = 3) -> dict[str, float]:
    """Where one ring allreduce's time goes (the 64 MB case, devices' PROFILE events, best of `reps` calls):
    GB/s of each copy (bytes copied / its time) and of each add kernel (3 chunks read or written / its time),
    the engines' busy time over the span from the first to the last command (average commands running at once),
    the most commands seen running at once, and the call's whole time against that span (the rest: scheduling and
    dispatch on the calling thread)."""
    from speck.hcq import Device

    devices = ("CPU", "CPU:1", "CPU:2", "CPU:3")
    x = Tensor(np.ones((4, MB64), np.float32)).shard(devices, axis=0).realize()
    chunk = MB64 // len(devices) * 4
    devs = [Device[d] for d in devices]
    best: dict[str, float] = {}
    with Context(RING=2):
        x.sum(0).realize()
        for d in devs:
            d.profile = True
        try:
            for _ in range(reps):
                for d in devs:
                    for e in d.engines.values():
                        e.events.clear()
                t0 = time.perf_counter_ns()
                x.sum(0).realize()
                call = time.perf_counter_ns() - t0
                evs = [ev for d in devs for ev in d.profile_events if ev.kind in ("copy", "exec")]
                copies = [ev.end_ns - ev.start_ns for ev in evs if ev.kind == "copy"]
                adds = [ev.end_ns - ev.start_ns for ev in evs if ev.kind == "exec"]
                lo, hi = min(ev.start_ns for ev in evs), max(ev.end_ns for ev in evs)
                edges = sorted([(ev.start_ns, 1) for ev in evs] + [(ev.end_ns, -1) for ev in evs])
                running = peak = 0
                for _, step in edges:
                    running += step
                    peak = max(peak, running)
                row = {"call ms": call / 1e6, "engines' span ms": (hi - lo) / 1e6,
                       "copies": len(copies), "copy GB/s (median)": chunk / statistics.median(copies),
                       "adds": len(adds), "add GB/s (median)": 3 * chunk / statistics.median(adds),
                       "commands at once (mean)": (sum(copies) + sum(adds)) / (hi - lo),
                       "commands at once (peak)": peak}  # fmt: skip
                if not best or row["call ms"] < best["call ms"]:
                    best = row
        finally:
            for d in devs:
                d.profile = False
    return best


MPI_WORKER = """
import json, statistics, time
import numpy as np
from mpi4py import MPI
from speck.tensor import Tensor, distributed as D
D.init()
reps = int(__import__("sys").argv[1])
t = Tensor(np.ones(16 << 20, np.float32)).realize()
a = np.ones(16 << 20, np.float32)
D.allreduce_([t]); MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)  # warm up
ts, tm = [], []
for i in range(reps):  # interleaved, taking turns at going first
    for which in ((0, 1) if i % 2 else (1, 0)):
        D.barrier(); t0 = time.perf_counter()
        if which:
            D.allreduce_([t]); ts.append(time.perf_counter() - t0)
        else:
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a); tm.append(time.perf_counter() - t0)
if D.rank() == 0:
    print(json.dumps({"speck": statistics.median(ts), "mpi4py": statistics.median(tm)}))
"""


def bench_mpi(reps: int) -> list[tuple[str, float]] | str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "not measured: mpi4py is not installed (pip install 'speck-tensor[mpi]')"
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    exe = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if exe is None:
        return "not measured: no mpiexec"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    cmd = [exe, "--oversubscribe", "-n", "2", *(["-x", "PYTHONPATH"] if "PYTHONPATH" in env else [])]
    res = subprocess.run([*cmd, sys.executable, "-c", MPI_WORKER, str(reps)], capture_output=True, text=True,
                         env=env, timeout=600)  # fmt: skip
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        return f"failed: {res.stderr.strip()[-300:]}"
    r = json.loads(lines[0])
    return [(k, MB64 * 4 / v / 1e9) for k, v in r.items()]


def cnn_step(devices: tuple[str, ...], batch: int) -> tuple[Callable[[], object], int]:
    """(one call of the jitted CNN training step, captured and warm, the images it trains on) with `batch` images
    per device (data-parallel over `devices`, or on the default device when empty)."""
    Tensor.manual_seed(0)
    model = MODELS["cnn"]()
    if devices:
        for p in get_parameters(model):
            p.shard_(devices).realize()
    opt = Adam(get_parameters(model), lr=1e-3)
    n = batch * max(1, len(devices))
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((n, 1, 28, 28), dtype=np.float32))
    y = Tensor(rng.integers(0, 10, n).astype(np.int32))
    if devices:
        x, y = x.shard(devices, 0), y.shard(devices, 0)
    x, y = x.realize(), y.realize()

    step = jit_train_step(model, opt)

    def run() -> object:
        return step(x, y).item()

    for _ in range(3):  # run, capture, first replay
        run()
    return run, n


def cnn_step_images_s(devices: tuple[str, ...], batch: int, steps: int) -> float:
    """images/s of the jitted CNN training step with `batch` images per device (data-parallel over `devices`,
    or on the default device when empty): the median of `steps` calls."""
    run, n = cnn_step(devices, batch)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def bench_data_parallel(batch: int, steps: int) -> list[tuple[str, float]]:
    """images/s of the CNN step on one device (batch `batch`) and on CPU:0,CPU:1 (batch `batch` per device): the
    medians of `steps` rounds, each timing one call of either step, taking turns at going first."""
    rows = [(f"1 device x {batch}", cnn_step((), batch)),
            (f"2 devices x {batch} (CPU,CPU:1)", cnn_step(("CPU", "CPU:1"), batch))]  # fmt: skip
    times: list[list[float]] = [[] for _ in rows]
    for i in range(steps):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            rows[k][1][0]()
            times[k].append(time.perf_counter() - t0)
    return [(name, n / statistics.median(ts)) for (name, (_, n)), ts in zip(rows, times)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="per-device batch of the data-parallel step")
    ap.add_argument("--skip-mpi", action="store_true", help="leave out the MPI row (it starts mpiexec)")
    ap.add_argument("--breakdown", action="store_true", help="also print where a ring allreduce's time goes")
    ap.add_argument("--only-dp", action="store_true", help="only the data-parallel CNN step rows")
    args = ap.parse_args()
    if not args.only_dp:
        bench_collectives(args)
    print(f"data-parallel CNN training step (Adam, TinyJit), batch {args.batch} per device")
    for k, v in bench_data_parallel(args.batch, args.steps):
        print(f"  {k:30s} {v:7.0f} images/s")


def bench_collectives(args: argparse.Namespace) -> None:
    """The allreduce rows (with --breakdown, where the ring's time goes) and the MPI row."""
    print("allreduce of 64 MB float32 over CPU:0..3 (GB/s of the 64 MB reduced; numpy: the same four-array sum)")
    rows = dict(bench_allreduce(args.reps))
    for k, v in rows.items():
        print(f"  {k:8s} {v:7.2f} GB/s  {v / rows['numpy']:5.2f}x numpy")
    if args.breakdown:
        print("  ring breakdown (PROFILE events of the fastest of 3 calls):")
        for k, v in ring_breakdown().items():
            print(f"    {k:26s} {v:8.2f}")
    print("MPI allreduce of 64 MB float32, 2 ranks on this host (GB/s of the 64 MB reduced)")
    mpi = bench_mpi(args.reps) if not args.skip_mpi else "not measured: --skip-mpi"
    if isinstance(mpi, str):
        print(f"  {mpi}")
    else:
        m = dict(mpi)
        for k, v in m.items():
            print(f"  {k:8s} {v:7.2f} GB/s  {v / m['mpi4py']:5.2f}x mpi4py")


if __name__ == "__main__":
    main()
