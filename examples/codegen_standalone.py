"""speck.codegen on its own: build a saxpy and a row-sum kernel directly from UOps (no tensor package), lower them,
and print the C source, the LLVM IR and (when speck.codegen.x86 offers a renderer) the x86-64 listing. Each kernel
is also run by the reference interpreter and checked against numpy.

    python3 examples/codegen_standalone.py
"""

from __future__ import annotations

import importlib

import numpy as np

from speck.codegen import KernelInfo, PythonRenderer, run_program, to_program
from speck.uop import AxisType, Ops, UOp, dtypes


def saxpy(n: int) -> UOp:
    """out[i] = a * x[i] + y[i] with the constant a = 2.5."""
    i = UOp.range(n, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(n)).index(i).load()
    y = UOp.param(2, dtypes.float32.ptr(n)).index(i).load()
    out = UOp.param(0, dtypes.float32.ptr(n))
    return UOp.sink(out.index(i).store(UOp.const(dtypes.float32, 2.5) * x + y).end(i), arg=KernelInfo("saxpy"))


def row_sum(rows: int, cols: int) -> UOp:
    """out[r] = sum_c m[r, c]."""
    r = UOp.range(rows, 0, AxisType.GLOBAL)
    c = UOp.range(cols, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + c).load()
    out = UOp.param(0, dtypes.float32.ptr(rows))
    return UOp.sink(out.index(r).store(m.reduce(c, op=Ops.ADD)).end(r), arg=KernelInfo("row_sum"))


def _optional(module: str, name: str) -> object | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def main() -> None:
    rng = np.random.default_rng(0)
    x, y, m = (rng.standard_normal(64, dtype=np.float32), rng.standard_normal(64, dtype=np.float32),
               rng.standard_normal(16 * 32, dtype=np.float32))  # fmt: skip
    kernels = [
        (saxpy(64), [np.zeros(64, np.float32), x, y], 2.5 * x + y),
        (row_sum(16, 32), [np.zeros(16, np.float32), m], m.reshape(16, 32).sum(axis=1)),
    ]
    renderers = [("C", "speck.codegen.renderer.cstyle", "ClangRenderer"),
                 ("LLVM IR", "speck.codegen.renderer.llvmir", "LLVMRenderer"),
                 ("x86-64", "speck.codegen.x86.renderer", "X86Renderer")]  # fmt: skip
    for ast, bufs, want in kernels:
        prog = to_program(ast, PythonRenderer())
        run_program(prog, bufs, {})
        np.testing.assert_allclose(bufs[0], want, rtol=1e-5, atol=1e-5)
        roles = [(b.slot, b.role) for b in prog.buffers]
        print(f"==== {prog.name}: global_size={prog.global_size} opts={prog.applied_opts} buffers={roles} "
              f"estimates={prog.estimates}; interpreter OK")  # fmt: skip
        for label, module, cls in renderers:
            r = _optional(module, cls)
            if r is None:
                print(f"---- {label}: not available in this installation ({module}.{cls} missing), skipped")
                continue
            print(f"---- {label}")
            print(to_program(ast, r()).src)  # type: ignore[operator]


if __name__ == "__main__":
    main()
