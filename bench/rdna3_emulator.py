"""The RDNA3 shader-core emulator (speck.usbgpu.sim.rdna3) on the main job's training step: every kernel of one
jitted CNN step (forward, backward, Adam; batch 2 by default) compiled for gfx1100 by the AMD backend, run in the
emulator and in the reference interpreter on the same random inputs (results must agree bit for bit), side by side in
interleaved rounds (medians). Prints the kernels with the most emulated work, the totals, and the closing figures of
issue 29: instruction coverage (mnemonics implemented / seen in the step) and emulated wave-instructions per second.

    python3 bench/rdna3_emulator.py [--batch N] [--rounds R] [--top K] [--no-reference]

--no-reference times the emulator alone (the interpreter dominates the run time otherwise); then the bits column is
"-". Times are wall-clock medians and the emulator's CPU time (time.process_time) is printed too: on a shared host the
CPU time is the steadier figure.

`emulate(spec, inputs, var_vals)` is the function other benchmarks (bench/amd_codegen.py) call for a ProgramSpec's
"emulated instructions executed".
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from collections import Counter
from typing import Any

import _host
import numpy as np
from train import jit_train_step

from speck.codegen.compiler.amdgpu import AMDGPUCompiler
from speck.codegen.interpret import run_program
from speck.codegen.numeric import storage_np
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.uop import Ops, UOp, dtypes
from speck.usbgpu.sim.rdna3 import FlatMemory, Stats, coverage, coverage_of, disassemble_kernel, run


def emulate(spec: ProgramSpec, inputs: list[np.ndarray], var_vals: dict[str, int]) -> tuple[list[np.ndarray], Stats]:
    """Run an AMD ProgramSpec in the emulator: buffers (by PARAM slot) mapped with gaps between them, kernel
    arguments as the renderer declares them (the used buffers' pointers by slot, then the variables as int32)."""
    assert spec.lib is not None
    mem = FlatMemory()
    ptrs = [mem.alloc(np.ascontiguousarray(b).view(np.uint8) if b.nbytes else 4, f"data{i}") for i, b in
            enumerate(inputs)]  # fmt: skip
    args = b"".join(struct.pack("<Q", ptrs[b.slot]) for b in spec.buffers)
    args += b"".join(struct.pack("<i", var_vals[n]) for n in spec.var_names)
    stats = run(spec.lib, spec.function_name, spec.launch_dims(var_vals), spec.local_size or (1, 1, 1), args, mem)
    return [mem.array(p, b.dtype, b.size).copy() for p, b in zip(ptrs, inputs)], stats


def step_kernels(batch: int) -> list[tuple[UOp, dict[str, int]]]:
    """The distinct kernels of one jitted CNN training step on CPU (bench/train.py's step), from the capture."""
    from speck.tensor import Tensor
    from speck.tensor.examples.train import MODELS
    from speck.tensor.nn.optim import Adam
    from speck.tensor.nn.state import get_parameters

    Tensor.manual_seed(0)
    model = MODELS["cnn"]()
    step = jit_train_step(model, Adam(get_parameters(model), lr=1e-3))
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((batch, 1, 28, 28), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32)).realize()
    for _ in range(2):  # run, then capture
        step(x, y).item()
    out: dict[UOp, dict[str, int]] = {}
    for ei in step.jit_cache:  # the capture's calls as ExecItems; copies have no AST
        if ei.si.ast is not None:
            out.setdefault(ei.si.ast, dict(ei.si.var_vals))
    return list(out.items())


def inputs(ast: UOp, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for p in sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg):
        dt, size = p.dtype.base, p.dtype.size  # type: ignore[attr-defined]
        if p.arg == 0:
            out.append(np.zeros(size, storage_np(dt)))
        elif dtypes.is_int(dt) and dt != dtypes.bool:
            out.append(rng.integers(0, 10, size).astype(storage_np(dt)))
        elif dt == dtypes.bool:
            out.append(rng.integers(0, 2, size).astype(np.bool_))
        else:
            out.append(rng.uniform(-2, 2, size).astype(storage_np(dt)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-reference", action="store_true", help="skip the interpreter (emulator timing only)")
    args = ap.parse_args()
    _host.describe()
    compiler = AMDGPUCompiler()
    kernels = step_kernels(args.batch)
    rows: list[dict[str, Any]] = []
    seen: Counter[str] = Counter()
    for i, (ast, var_vals) in enumerate(kernels):
        spec = to_program(ast, AMDGPURenderer(), compiler)
        bufs = inputs(ast, i)
        listing = disassemble_kernel(spec.lib or b"", spec.function_name)
        seen.update(inst.name for inst in listing)
        emu_t: list[float] = []
        cpu_t: list[float] = []
        ref_t: list[float] = []
        for _ in range(args.rounds):  # interleaved: emulator, then interpreter, per round
            t0, c0 = time.perf_counter(), time.process_time()
            got, stats = emulate(spec, bufs, var_vals)
            emu_t.append(time.perf_counter() - t0)
            cpu_t.append(time.process_time() - c0)
            if args.no_reference:
                continue
            want = [b.copy() for b in bufs]
            t0 = time.perf_counter()
            run_program(spec, want, var_vals)
            ref_t.append(time.perf_counter() - t0)
        same = None if args.no_reference else got[0].tobytes() == want[0].tobytes()
        rows.append(dict(name=spec.name, insts=len(listing), executed=stats.instructions, waves=stats.waves,
                         emu=statistics.median(emu_t), cpu=statistics.median(cpu_t),
                         ref=statistics.median(ref_t) if ref_t else float("nan"), same=same))  # fmt: skip
    rows.sort(key=lambda r: -r["executed"])
    print(f"\nCNN training step, batch {args.batch}: {len(rows)} distinct kernels compiled for gfx1100 (AMD backend)")
    print(f"{'kernel':34s} {'listing':>7s} {'waves':>6s} {'emulated wave-insts':>20s} {'emulator ms':>12s} "
          f"{'interpreter ms':>15s} {'ratio':>6s} {'bits':>5s}")  # fmt: skip
    for r in rows[: args.top]:
        bits = "-" if r["same"] is None else "same" if r["same"] else "DIFF"
        print(f"{r['name']:34s} {r['insts']:7d} {r['waves']:6d} {r['executed']:20,d} {r['emu'] * 1e3:12.1f} "
              f"{r['ref'] * 1e3:15.1f} {r['emu'] / r['ref']:6.2f} {bits:>5s}")  # fmt: skip
    total_emu, total_ref = sum(r["emu"] for r in rows), sum(r["ref"] for r in rows)
    total_cpu = sum(r["cpu"] for r in rows)
    executed = sum(r["executed"] for r in rows)
    print(f"{'all ' + str(len(rows)) + ' kernels':34s} {sum(r['insts'] for r in rows):7d} "
          f"{sum(r['waves'] for r in rows):6d} {executed:20,d} {total_emu * 1e3:12.1f} {total_ref * 1e3:15.1f} "
          f"{total_emu / total_ref:6.2f} {sum(bool(r['same']) for r in rows):>5d}")  # fmt: skip
    done, total, missing = coverage_of(seen)
    known = sum(len(d) for d, _ in coverage().values())
    print(f"\ninstruction coverage: {done}/{total} mnemonics seen in the step implemented"
          + (f" (missing: {', '.join(missing)})" if missing else "")
          + f"; {known} mnemonics implemented in all")  # fmt: skip
    print(f"emulation speed: {executed / total_emu / 1e6:.2f} M wave-instructions/s "
          f"({executed * 32 / total_emu / 1e6:.0f} M lane-instructions/s); emulator CPU time {total_cpu:.2f} s, "
          f"{executed / total_cpu / 1e6:.2f} M wave-instructions per CPU second")  # fmt: skip


if __name__ == "__main__":
    main()
