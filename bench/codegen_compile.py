"""Cold compile latency of speck.codegen: kernel AST -> object bytes, split into lowering (full_rewrite_to_sink),
render and compile, for the C (ClangRenderer + ClangCompiler) and LLVM (LLVMRenderer + LLVMCompiler) paths, plus
speck's own x86-64 backend when present, on an elementwise kernel, a reduction and a fused 3-layer MLP forward
kernel. The compile cache is disabled (CACHELEVEL=0) so every compile is real; the pattern matchers are warmed once
per process (their one-time setup is reported separately). Prints medians of repeats; target: lowering+render
< 30 ms for the elementwise kernel.

    python3 bench/codegen_compile.py [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import _host

from speck.codegen import KernelInfo
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.uop import AxisType, Ops, UOp, dtypes


def elementwise(n: int = 1 << 16) -> UOp:
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a, b, c = (UOp.param(k, dtypes.float32.ptr(n)).index(i).load() for k in (1, 2, 3))
    v = (a * b + c).maximum(UOp.const(dtypes.float32, 0.0))
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(i).store(v).end(i), arg=KernelInfo("elementwise"))


def reduction(rows: int = 1024, cols: int = 1024) -> UOp:
    r, c = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + c).load()
    v = (m * m).reduce(c, op=Ops.ADD).sqrt()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(rows)).index(r).store(v).end(r), arg=KernelInfo("reduction"))


def mlp3(batch: int = 16, d0: int = 32, d1: int = 64, d2: int = 64, d3: int = 10) -> UOp:
    """out = relu(relu(x @ W1) @ W2) @ W3 fused into one kernel (nested reductions, recomputation)."""
    f32 = dtypes.float32
    b, o = UOp.range(batch, 0, AxisType.GLOBAL), UOp.range(d3, 1, AxisType.GLOBAL)
    k1, k2, k3 = (UOp.range(d, 2 + i, AxisType.REDUCE) for i, d in enumerate((d0, d1, d2)))
    x = UOp.param(1, f32.ptr(batch * d0))
    w1, w2, w3 = UOp.param(2, f32.ptr(d0 * d1)), UOp.param(3, f32.ptr(d1 * d2)), UOp.param(4, f32.ptr(d2 * d3))
    zero = UOp.const(f32, 0.0)
    h1 = (x.index(b * d0 + k1).load() * w1.index(k1 * d1 + k2).load()).reduce(k1, op=Ops.ADD).maximum(zero)
    h2 = (h1 * w2.index(k2 * d2 + k3).load()).reduce(k2, op=Ops.ADD).maximum(zero)
    y = (h2 * w3.index(k3 * d3 + o).load()).reduce(k3, op=Ops.ADD)
    out = UOp.param(0, f32.ptr(batch * d3))
    return UOp.sink(out.index(b * d3 + o).store(y).end(b, o), arg=KernelInfo("mlp3"))


def _get(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    out = fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts), out


def main() -> None:
    _host.describe()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ["CACHELEVEL"] = "0"
    paths = [
        ("C", _get("speck.codegen.renderer.cstyle", "ClangRenderer"), _get("speck.codegen.compiler", "ClangCompiler")),
        ("LLVM", _get("speck.codegen.renderer.llvmir", "LLVMRenderer"), _get("speck.codegen.compiler", "LLVMCompiler")),
        ("x86", _get("speck.codegen.x86.renderer", "X86Renderer"), _get("speck.codegen.x86", "X86Compiler")),
    ]
    t = time.perf_counter()
    if paths[0][1] is not None:
        full_rewrite_to_sink(reduction(8, 8), paths[0][1]())  # one-time matcher setup, not part of a compile
    setup_ms = 1e3 * (time.perf_counter() - t)
    rows = []
    errors: list[str] = []
    for kname, build in (("elementwise", elementwise), ("reduction", reduction), ("mlp3 (fused)", mlp3)):
        for pname, rcls, ccls in paths:
            if rcls is None:
                rows.append((kname, pname, None, None, None))
                continue
            r = rcls()
            lower_ms = render_ms = comp_ms = None
            try:  # a backend that fails on a kernel is reported, not fatal: the other rows still matter
                lower_ms, uops = _median_ms(lambda r=r, build=build: full_rewrite_to_sink(build(), r), args.repeats)
                render_ms, src = _median_ms(lambda r=r, uops=uops: r.render(uops), args.repeats)
                if ccls is not None:
                    c = ccls()
                    comp_ms, _ = _median_ms(lambda c=c, src=src: c.compile(src), max(1, args.repeats // 2))
            except Exception as e:
                errors.append(f"{kname} / {pname}: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            rows.append((kname, pname, lower_ms, render_ms, comp_ms))

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:8.2f}"

    print(f"speck.codegen cold compile latency (median of {args.repeats}, ms; matcher setup once per process: "
          f"{setup_ms:.0f} ms)")  # fmt: skip
    cols = ("lowering", "render", "compile", "total")
    print(f"{'kernel':14s} {'path':5s} " + " ".join(f"{c:>9s}" for c in cols) + f" {'lower+render':>13s}")
    for k, p, lo, re_, co in rows:
        tot = None if lo is None or re_ is None or co is None else lo + re_ + co
        lr = None if lo is None or re_ is None else lo + re_
        print(f"{k:14s} {p:5s} {f(lo):>9s} {f(re_):>9s} {f(co):>9s} {f(tot):>9s} {f(lr):>13s}")
    for e in errors:
        print(f"failed: {e}")
    ew = [lo + re_ for k, _, lo, re_, _ in rows if k == "elementwise" and lo is not None and re_ is not None]
    if ew:
        print(f"elementwise lowering+render: {max(ew):.2f} ms (target < 30 ms): {'OK' if max(ew) < 30 else 'MISSED'}")


if __name__ == "__main__":
    main()
