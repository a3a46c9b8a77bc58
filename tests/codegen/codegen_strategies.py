"""Hypothesis strategies for kernel ASTs (KERNEL_CONTRACT.md section 1), shared by the codegen, renderer, x86 and
hcq tests.

`kernel_asts()` yields `(ast, inputs, var_vals)`: `ast` a SINK storing into PARAM 0 (the output, all zeros in
`inputs[0]`), `inputs` the numpy arrays for every PARAM slot (output first), `var_vals` the values of the AST's
symbolic variables. The kernels: random ALU trees over 1-3 input buffers of random dtypes, broadcasting through
stride-0 index terms, reductions (ADD/MAX/MUL) over random axes, gated (padded) reads, an optional symbolic size.
Evaluate the expected result with `speck.codegen.interpret.eval_ast`."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.numeric import storage_np, to_storage
from speck.uop import AxisType, DType, Ops, UOp, dtypes

INPUT_DTYPES: tuple[DType, ...] = (
    dtypes.float32, dtypes.float32, dtypes.float16, dtypes.float64, dtypes.bfloat16, dtypes.int32, dtypes.int8,
    dtypes.uint8, dtypes.int64, dtypes.uint32, dtypes.bool,
)  # fmt: skip
COMPUTE_DTYPES: tuple[DType, ...] = (dtypes.float32, dtypes.float32, dtypes.int32, dtypes.float16, dtypes.float64,
                                     dtypes.int64, dtypes.uint8)  # fmt: skip

_FLOAT_UNARY = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC)
_FLOAT_BINARY = (Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.FDIV)
_INT_BINARY = (Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.CDIV, Ops.CMOD, Ops.XOR, Ops.AND, Ops.OR)


def _random_values(rng: np.random.Generator, dt: DType, n: int) -> np.ndarray:
    if dt == dtypes.bool:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtypes.is_float(dt):
        vals = rng.uniform(-4, 4, n).astype(np.float32 if dt != dtypes.float64 else np.float64)
        return to_storage(vals, dt)
    lo, hi = (0, 256) if dt == dtypes.uint8 else (-100, 100) if dt == dtypes.int8 else (-1000, 1000)
    if dtypes.is_unsigned(dt):
        lo = 0
    return rng.integers(lo, hi, n).astype(storage_np(dt))


@st.composite
def kernel_asts(draw: Any, max_inputs: int = 3, allow_reduce: bool = True, allow_vars: bool = True,
                max_depth: int = 3) -> tuple[UOp, list[np.ndarray], dict[str, int]]:  # fmt: skip
    """A random kernel AST with its input arrays and variable values (see the module docstring)."""
    n_out = draw(st.integers(1, 3))
    out_sizes = [draw(st.integers(1, 6)) for _ in range(n_out)]
    var_vals: dict[str, int] = {}
    ends: list[Any] = list(out_sizes)
    if allow_vars and draw(st.booleans()) and draw(st.booleans()):
        hi = out_sizes[0] + 3
        var = UOp.variable("n", 1, hi)
        var_vals["n"] = draw(st.integers(1, hi))
        ends[0] = var
        out_sizes[0] = hi  # buffers are sized for the largest value
    rngs = [UOp.range(e, i, AxisType.GLOBAL) for i, e in enumerate(ends)]
    n_red = draw(st.integers(0, 2)) if allow_reduce else 0
    red_sizes = [draw(st.integers(1, 5)) for _ in range(n_red)]
    red_rngs = [UOp.range(s, n_out + i, AxisType.REDUCE) for i, s in enumerate(red_sizes)]
    all_rngs = rngs + red_rngs
    all_sizes = out_sizes + red_sizes
    cdt = draw(st.sampled_from(COMPUTE_DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_in = draw(st.integers(1, max_inputs))
    inputs: list[np.ndarray] = []
    loads_inner: list[UOp] = []  # may depend on reduce ranges
    loads_outer: list[UOp] = []  # only output ranges
    for k in range(n_in):
        dt = draw(st.sampled_from(INPUT_DTYPES))
        in_reduce = bool(red_rngs) and (k == 0 or draw(st.booleans()))
        use = all_rngs if in_reduce else rngs
        sizes = all_sizes if in_reduce else out_sizes
        strides = [draw(st.sampled_from((0, 1, 1, 2, 3))) for _ in use]
        offset = draw(st.integers(0, 3))
        idx: UOp = UOp.const(dtypes.weakint, offset)
        for r, s in zip(use, strides):
            if s:
                idx = idx + r * s
        size = offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1
        gated = draw(st.integers(0, 3)) == 0
        if gated:
            which = draw(st.integers(0, len(use) - 1))
            cut = draw(st.integers(0, sizes[which]))
            cond = (use[which] < cut) if draw(st.booleans()) else (use[which] < cut).logical_not()
            idx = idx.valid(cond)
        buf = UOp.param(k + 1, dt.ptr(size))
        inputs.append(_random_values(rng, dt, size))
        ld = buf.index(idx).load()
        (loads_inner if in_reduce else loads_outer).append(ld)

    def leaf(pool: list[UOp]) -> UOp:
        if pool and draw(st.integers(0, 4)) != 0:
            return draw(st.sampled_from(pool)).cast(cdt)
        if dtypes.is_float(cdt):
            return UOp.const(cdt, draw(st.sampled_from((0.5, 1.0, -2.0, 3.25, 0.0))))
        return UOp.const(cdt, draw(st.sampled_from((1, 2, 3, -1, 7))))

    def tree(pool: list[UOp], depth: int) -> UOp:
        if depth <= 0 or draw(st.integers(0, 3)) == 0:
            return leaf(pool)
        kind = draw(st.integers(0, 9))
        a = tree(pool, depth - 1)
        if kind == 0:
            b = tree(pool, depth - 1)
            return (a < b).where(a, tree(pool, depth - 1))
        if kind == 1:
            other = draw(st.sampled_from((dtypes.float32, dtypes.int32, dtypes.float16, dtypes.int8)))
            return a.cast(other).cast(cdt)
        if dtypes.is_float(cdt):
            if kind <= 3:
                return a.alu(draw(st.sampled_from(_FLOAT_UNARY)))
            return a.alu(draw(st.sampled_from(_FLOAT_BINARY)), tree(pool, depth - 1))
        if kind == 2:
            return a.alu(draw(st.sampled_from((Ops.SHL, Ops.SHR))), UOp.const(cdt, draw(st.integers(0, 5))))
        return a.alu(draw(st.sampled_from(_INT_BINARY)), tree(pool, depth - 1))

    inner = loads_inner + loads_outer
    if red_rngs:
        op = draw(st.sampled_from((Ops.ADD, Ops.ADD, Ops.MAX, Ops.MUL)))
        if op is Ops.MUL and dtypes.is_float(cdt):
            op = Ops.ADD  # float products of random trees overflow; ints wrap exactly
        val = tree(inner, max_depth - 1)
        if not any(r in val.toposort() for r in red_rngs):
            val = val + loads_inner[0].cast(cdt)
        red = val.reduce(*red_rngs, op=op)
        value = red if draw(st.booleans()) else red.alu(draw(st.sampled_from((Ops.ADD, Ops.MUL, Ops.MAX))),
                                                        tree(loads_outer, 1))  # fmt: skip
    else:
        value = tree(inner, max_depth)
    out_idx: UOp = UOp.const(dtypes.weakint, 0)
    stride = 1
    for r, n in reversed(list(zip(rngs, out_sizes))):
        out_idx = out_idx + r * stride
        stride *= n
    out = UOp.param(0, cdt.ptr(stride))
    ast = UOp.sink(out.index(out_idx).store(value).end(*rngs), arg=KernelInfo(name="hypo"))
    return ast, [np.zeros(stride, dtype=storage_np(cdt))] + inputs, var_vals
