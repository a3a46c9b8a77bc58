"""speck's x86-64 backend against LLVM, on the same kernels with the same optimizer settings.

Run time: each kernel is lowered once per backend (to_program with the device's renderer and compiler), loaded on
`Device["CPU"]` (LLVM via llvmlite) and `Device["CPU:X86"]` (speck's backend), and executed on the same hcq buffers;
medians of repeats, all worker threads. Compile time: lowering is shared, so the table shows what differs - the
x86 backend's legalize+select+allocate+encode(+ELF) against LLVM's render + full compile (O2, cache off) - plus the
shared lowering for reference. Targets (issue 8): generated code within 2x of LLVM's run time; compile >= 5x faster
for small kernels.

    python3 bench/x86_backend.py [--repeats N] [--small]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from speck.codegen import KernelInfo
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.program import to_program
from speck.uop import AxisType, Ops, UOp, dtypes

os.environ.setdefault("CACHELEVEL", "0")  # every LLVM compile is real


def elementwise(n: int) -> UOp:
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a, b = (UOp.param(k, dtypes.float32.ptr(n)).index(i).load() for k in (1, 2))
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(i).store(a * b + 1.0).end(i), arg=KernelInfo("ew"))


def row_reduction(rows: int, cols: int) -> UOp:
    r, c = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + c).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(rows)).index(r).store(m.reduce(c, op=Ops.ADD)).end(r),
                    arg=KernelInfo("rowsum"))  # fmt: skip


def matmul(n: int) -> UOp:
    i, j, k = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.GLOBAL), UOp.range(n, 2, AxisType.REDUCE)
    a = UOp.param(1, dtypes.float32.ptr(n * n)).index(i * n + k).load()
    b = UOp.param(2, dtypes.float32.ptr(n * n)).index(k * n + j).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n * n)).index(i * n + j).store((a * b).reduce(k, op=Ops.ADD))
                    .end(i, j), arg=KernelInfo("matmul"))  # fmt: skip


def _median(fn: Callable[[], Any], repeats: int) -> float:
    # the collector off while timing: a collection landing in one side's repeats would skew a millisecond compile
    gc.collect()
    gc.disable()
    try:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(ts)


def run_time(ast: UOp, device: str, renderer: Any, repeats: int) -> tuple[float, np.ndarray]:
    """Median seconds of one launch on `device`, and the output."""
    from speck.hcq import Buffer, Device

    dev = Device[device]
    spec = to_program(ast, renderer, dev.compiler)
    prog = dev.load_program(spec)
    params = sorted((u for u in ast.toposort() if u.op is Ops.PARAM), key=lambda p: p.arg)
    rng = np.random.default_rng(0)
    bufs = []
    for p in params:
        b = Buffer(device, p.dtype.size, p.dtype.base, preallocate=True)  # type: ignore[attr-defined]
        b.copyin(rng.standard_normal(p.dtype.size).astype(np.float32).data)  # type: ignore[attr-defined]
        bufs.append(b)
    prog(*bufs, vals=[], wait=True)  # warm up (page faults, worker threads)
    t = _median(lambda: prog(*bufs, vals=[], wait=True), repeats)
    return t, bufs[0].numpy().copy()


def compile_times(ast: UOp, repeats: int) -> tuple[float, float, float]:
    """(shared lowering, x86 backend, LLVM render+compile) median seconds."""
    from speck.codegen.compiler import LLVMCompiler
    from speck.codegen.renderer.llvmir import LLVMRenderer
    from speck.codegen.x86 import X86Compiler, X86Renderer

    xr, xc, lr, lc = X86Renderer(), X86Compiler(), LLVMRenderer(), LLVMCompiler()
    uops_x = full_rewrite_to_sink(ast, xr)
    uops_l = full_rewrite_to_sink(ast, lr)
    lower = _median(lambda: full_rewrite_to_sink(ast, xr), repeats)
    x86 = _median(lambda: xc.compile(xr.render(uops_x)), 3 * repeats)
    llvm = _median(lambda: lc.compile_uncached(lr.render(uops_l)), max(3, repeats // 3))
    return lower, x86, llvm


def stage_times(ast: UOp, repeats: int) -> dict[str, float]:
    """Median seconds of each x86 backend stage (render_x86's own timings) plus listing text and compile."""
    from speck.codegen.x86 import X86Compiler, X86Renderer
    from speck.codegen.x86.renderer import render_x86

    uops = full_rewrite_to_sink(ast, X86Renderer())
    runs: dict[str, list[float]] = {}
    gc.collect()
    gc.disable()
    try:
        for _ in range(3 * repeats):
            r = render_x86(uops)
            t0 = time.perf_counter()
            text = r.listing
            t1 = time.perf_counter()
            X86Compiler().compile(text)
            t2 = time.perf_counter()
            for k, v in {**r.times, "listing": t1 - t0, "compile": t2 - t1}.items():
                runs.setdefault(k, []).append(v)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--small", action="store_true", help="small sizes (a quick smoke run)")
    args = ap.parse_args()
    from speck.codegen.renderer.llvmir import LLVMRenderer
    from speck.codegen.x86 import X86Renderer

    scale = 16 if args.small else 1
    kernels = {
        "elementwise 16M f32": elementwise((1 << 24) // scale),
        "row reduction 4096x4096": row_reduction(4096 // scale, 4096),
        "matmul 256x256x256": matmul(256 // (4 if args.small else 1)),
    }
    print(f"{'kernel':26s} {'LLVM ms':>9s} {'x86 ms':>9s} {'x86/LLVM':>9s}   {'lower ms':>9s} {'x86 cc ms':>10s} "
          f"{'LLVM cc ms':>10s} {'speedup':>8s}")  # fmt: skip
    # the same kernels with the same opts on both backends: the x86 heuristic's choice, pinned in KernelInfo (the
    # LLVM heuristic register-blocks matmuls, which would compare optimizers rather than backends)
    from speck.codegen.opt import hand_coded_optimizations, opt_base

    for name in kernels:
        ast = kernels[name]
        opts = tuple(hand_coded_optimizations(opt_base(ast), X86Renderer()))
        kernels[name] = ast.replace(arg=ast.arg.replace(opts=opts)) if opts else ast
    for name, ast in kernels.items():
        t_llvm, out_l = run_time(ast, "CPU", LLVMRenderer(), args.repeats)
        t_x86, out_x = run_time(ast, "CPU:X86", X86Renderer(), args.repeats)
        np.testing.assert_allclose(out_x, out_l, rtol=1e-3, atol=1e-3)
        lower, cx, cl = compile_times(ast, args.repeats)
        print(f"{name:26s} {1e3 * t_llvm:9.3f} {1e3 * t_x86:9.3f} {t_x86 / t_llvm:8.2f}x   {1e3 * lower:9.2f} "
              f"{1e3 * cx:10.2f} {1e3 * cl:10.2f} {cl / cx:7.1f}x")  # fmt: skip
    print(
        "run: medians of launches on all CPU workers; compile: x86 = legalize+select+allocate+encode+ELF, "
        "LLVM = render + O2 compile (lowering shared, shown separately)"
    )
    stages = ("legalize", "select", "allocate", "encode", "listing", "compile")
    print(f"\nx86 backend stages, ms (medians):\n{'kernel':26s} " + " ".join(f"{s:>9s}" for s in stages))
    for name, ast in kernels.items():
        st = stage_times(ast, args.repeats)
        print(f"{name:26s} " + " ".join(f"{1e3 * st[s]:9.3f}" for s in stages))
    print("encode includes the ELF object; listing = the text render() returns; compile = X86Compiler on that text")


if __name__ == "__main__":
    main()
