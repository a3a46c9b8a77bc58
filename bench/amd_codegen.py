"""The AMD backend on the main job's training step: every kernel of the CNN step (forward, backward, Adam; batch 128,
TinyJit) compiled for gfx1100, one row per kernel, and the whole step's compile time against the LLVM CPU backend's.

Columns: the launch (workgroups x work-items), the opts the GPU heuristic chose, instructions in the kernel's listing
(LLVM's AMDGPU assembly, instruction lines only), VGPRs and SGPRs (the code object's metadata, as speck.hcq.hsaco
reads it), LDS bytes (group segment) and scratch bytes per work-item (spills), compile time (render + LLVM + the code
object writer, CPU seconds of this thread, medians over --repeats; lowering is excluded and shared by both
backends), and wave-instructions the RDNA3 emulator (speck.usbgpu.sim.rdna3) executed running the kernel on the
step's shapes with --emulate: for kernels whose iteration space is at most --emulate-max points ("-" for the others:
the 5x5 convolutions' weight gradients take hours at 0.5 M wave-instructions/s).

    python3 bench/amd_codegen.py [--repeats N] [--emulate [--emulate-max N]] [--write-golden]

`--write-golden` stores the step's kernel ASTs as tests/codegen/golden/amd/cnn_step.pkl, the corpus the AMD tests
compile (run it again when the tensor frontend changes the step's kernels)."""

from __future__ import annotations

import argparse
import gc
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _host  # first: unsets the OpenBLAS overrides before numpy loads

from speck.codegen.lowered_cache import dumps
from speck.uop import Ops, UOp

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "tests" / "codegen" / "golden" / "amd" / "cnn_step.pkl"


def step_kernels() -> list[UOp]:
    """The kernel ASTs one CNN training step runs on the CPU device (the tensor path's program cache)."""
    import numpy as np
    from train import jit_train_step

    from speck.tensor import Tensor, realize
    from speck.tensor.examples.train import MODELS
    from speck.tensor.nn.optim import Adam
    from speck.tensor.nn.state import get_parameters

    Tensor.manual_seed(0)
    model = MODELS["cnn"]()
    opt = Adam(get_parameters(model), lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((128, 1, 28, 28), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, 128).astype(np.int32)).realize()
    step = jit_train_step(model, opt)
    step(x, y).item()
    return [ast for (dev, ast) in list(realize._program_cache) if dev == "CPU"]


def _median_cpu(fn: Callable[[], Any], repeats: int) -> float:
    gc.collect()
    gc.disable()
    try:
        ts = []
        for _ in range(repeats):
            t0 = time.thread_time()
            fn()
            ts.append(time.thread_time() - t0)
        return statistics.median(ts)
    finally:
        gc.enable()


def instructions(listing: str, name: str) -> int:
    """Instruction lines of kernel `name` in LLVM's AMDGPU assembly (not directives, labels or comments)."""
    body = listing.split(f"\n{name}:", 1)[1].split(".Lfunc_end", 1)[0]
    return sum(1 for ln in body.splitlines() if ln.startswith("\t") and not ln.startswith(("\t.", "\t;")))


def points(ast: UOp) -> int:
    """The kernel's iteration space: the product of its ranges' sizes (what emulating it costs, roughly)."""
    return math.prod(int(u.src[0].arg) for u in ast.toposort() if u.op is Ops.RANGE)


def emulated_instructions(spec: Any, ast: UOp) -> int:
    """Wave-instructions the RDNA3 emulator (speck.usbgpu.sim.rdna3, through bench/rdna3_emulator.py's `emulate`)
    executes running `spec` once on random inputs."""
    from rdna3_emulator import emulate, inputs

    _, stats = emulate(spec, inputs(ast, 0), {})
    return int(stats.instructions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="compiles per kernel and backend (median CPU time)")
    ap.add_argument("--emulate", action="store_true", help="run the kernels in the RDNA3 emulator (slow)")
    ap.add_argument(
        "--emulate-max",
        type=int,
        default=1_000_000,
        help="emulate only kernels whose iteration space is at most this (the convolutions take hours)",
    )
    ap.add_argument("--write-golden", action="store_true", help=f"store the step's kernel ASTs in {GOLDEN}")
    args = ap.parse_args()

    from speck.codegen.backends import get_backend
    from speck.codegen.pipeline import full_rewrite_to_sink
    from speck.codegen.program import to_program
    from speck.hcq.hsaco import parse_code_object
    from speck.uop import Context

    _host.describe()
    t0 = time.perf_counter()
    asts = step_kernels()
    print(f"{len(asts)} kernels in the CNN training step (collected in {time.perf_counter() - t0:.1f} s)")
    if args.write_golden:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(dumps(asts))
        print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
    amd, cpu = get_backend("AMD"), get_backend("LLVM")
    print(f"\n{'kernel':34s} {'workgroups':>14s} {'work-items':>11s} {'insts':>6s} {'VGPR':>5s} {'SGPR':>5s} "
          f"{'LDS B':>6s} {'scratch':>7s} {'AMD cc ms':>9s} {'CPU cc ms':>9s} {'emulated':>9s}  opts")  # fmt: skip
    total = {"AMD": 0.0, "CPU": 0.0}
    most = {"insts": 0, "vgpr": 0, "lds": 0, "scratch": 0}
    with Context(CACHELEVEL=0):  # every compile is real
        for ast in asts:
            spec = to_program(ast, amd.renderer, amd.compiler)
            assert spec.lib is not None
            kernel = parse_code_object(spec.lib, spec.name).kernel(spec.name)
            listing = amd.compiler.to_asm(spec.src)  # type: ignore[attr-defined]
            n = instructions(listing, spec.name)
            cpu_uops = full_rewrite_to_sink(ast, cpu.renderer)
            times = {
                name: _median_cpu(lambda be=be, uops=uops: be.compiler.compile_uncached(be.renderer.render(uops)),
                                  args.repeats)
                for name, be, uops in (("AMD", amd, spec.uops), ("CPU", cpu, cpu_uops))
            }  # fmt: skip
            for k, v in times.items():
                total[k] += v
            emulated = emulated_instructions(spec, ast) if args.emulate and points(ast) <= args.emulate_max else None
            grid = "x".join(str(g) for g in spec.launch_dims())
            block = "x".join(str(b) for b in spec.local_size or (1, 1, 1))
            opts = " ".join(f"{o.op.name}{o.axis}:{o.arg}" for o in spec.applied_opts)
            print(f"{spec.name[:34]:34s} {grid:>14s} {block:>11s} {n:6d} {kernel.vgpr_count:5d} "
                  f"{kernel.sgpr_count:5d} {kernel.group_segment_fixed_size:6d} {kernel.private_segment_fixed_size:7d} "
                  f"{1e3 * times['AMD']:9.1f} {1e3 * times['CPU']:9.1f} {'-' if emulated is None else emulated:>9}  "
                  f"{opts}")  # fmt: skip
            for key, v in (("insts", n), ("vgpr", kernel.vgpr_count), ("lds", kernel.group_segment_fixed_size),
                           ("scratch", kernel.private_segment_fixed_size)):  # fmt: skip
                most[key] = max(most[key], v)
    print(
        f"\ncompile of the {len(asts)} kernels (render + compile, lowering excluded, CPU s of this thread): "
        f"AMD {total['AMD']:.2f} s, LLVM CPU {total['CPU']:.2f} s, AMD/CPU {total['AMD'] / total['CPU']:.2f}x"
    )
    print(f"largest: {most['insts']} instructions, {most['vgpr']} VGPRs, {most['lds']} LDS bytes, "
          f"{most['scratch']} scratch bytes per work-item")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
