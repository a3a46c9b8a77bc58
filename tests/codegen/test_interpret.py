"""The interpreter's exact dtype semantics: numpy evaluation of every ALU op and cast equals speck.uop's constant
folder (exec_alu / cast_value / bitcast) value for value, and eval_ast / run_program agree with numpy on
hand-written kernels (gated reads, variables, inout buffers, core-range slicing)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen import KernelInfo, PythonRenderer, eval_ast, run_program, to_program
from speck.codegen import numeric as nm
from speck.uop import AxisType, DType, Ops, UOp, cast_value, dtypes, exec_alu
from speck.uop.dtype import bitcast as bitcast_value

DTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
       dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, *dtypes.fp8s]  # fmt: skip
INT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR,
           Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.NEG, Ops.MULACC, Ops.WHERE]  # fmt: skip
FLOAT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.EXP2, Ops.LOG2, Ops.SIN,
             Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC, Ops.POW, Ops.MULACC, Ops.WHERE]  # fmt: skip
NARGS = {Ops.NEG: 1, Ops.EXP2: 1, Ops.LOG2: 1, Ops.SIN: 1, Ops.SQRT: 1, Ops.RECIPROCAL: 1, Ops.TRUNC: 1,
         Ops.MULACC: 3, Ops.WHERE: 3}  # fmt: skip


def values(dt: DType) -> st.SearchStrategy:  # type: ignore[type-arg]
    if dtypes.is_float(dt):
        special = st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5])
        return st.one_of(special, st.floats(-1e4, 1e4, allow_nan=False)).map(lambda v: cast_value(v, dt))
    return st.integers(int(dtypes.min(dt)), int(dtypes.max(dt)))


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


@pytest.mark.parametrize("op", sorted(set(INT_OPS) | set(FLOAT_OPS), key=lambda o: o.value), ids=lambda o: o.name)
@settings(max_examples=20)
@given(data=st.data())
def test_alu_matches_constant_folder(op: Ops, data: st.DataObject) -> None:
    dt = data.draw(st.sampled_from([d for d in DTS if op in (FLOAT_OPS if dtypes.is_float(d) else INT_OPS)]))
    n = NARGS.get(op, 2)
    cols = [data.draw(st.lists(values(dt), min_size=8, max_size=8)) for _ in range(n)]
    if op in (Ops.SHL, Ops.SHR):
        cols[1] = data.draw(st.lists(st.integers(0, 8 * dt.itemsize + 2), min_size=8, max_size=8))
    if op is Ops.WHERE:
        cols[0] = data.draw(st.lists(st.booleans(), min_size=8, max_size=8))
    arrs = [np.array([cast_value(v, dtypes.bool if (op is Ops.WHERE and i == 0) else dt) for v in c],
                     dtype=nm.compute_np(dtypes.bool if (op is Ops.WHERE and i == 0) else dt))
            for i, c in enumerate(cols)]  # fmt: skip
    res_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    got = nm.alu(op, res_dt, *arrs)
    for k in range(8):
        operands = [c[k] if not (op is Ops.WHERE and i == 0) else bool(c[k]) for i, c in enumerate(cols)]
        operands = [float(arrs[i][k]) if dtypes.is_float(dt) and not (op is Ops.WHERE and i == 0) else o
                    for i, o in enumerate(operands)]  # fmt: skip
        want = exec_alu(op, res_dt if op not in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt, operands)
        g = got[k].item()
        assert same(float(g) if dtypes.is_float(res_dt) else g, want), f"{op} {dt} {operands}: {g} != {want}"


@pytest.mark.parametrize("src", DTS, ids=lambda d: d.name)
@settings(max_examples=20)
@given(dst=st.sampled_from(DTS + [dtypes.bool]), data=st.data())
def test_casts_and_bitcasts_match_constant_folder(src: DType, dst: DType, data: st.DataObject) -> None:
    vals = data.draw(st.lists(values(src), min_size=8, max_size=8))
    arr = np.array(vals, dtype=nm.compute_np(src))
    got = nm.cast(arr, src, dst)
    for v, g in zip(vals, got):
        assert same(g.item() if not dtypes.is_float(dst) else float(g), cast_value(v, dst)), (src, dst, v)
    if src.itemsize == dst.itemsize and dst != dtypes.bool:
        gb = nm.bitcast(arr, src, dst)
        for v, g in zip(vals, gb):
            assert same(float(g) if dtypes.is_float(dst) else g.item(), bitcast_value(v, src, dst))


def test_gated_read_alt_and_variables() -> None:
    n = UOp.variable("n", 1, 8)
    i = UOp.range(n, 0, AxisType.GLOBAL)
    src = UOp.param(1, dtypes.int32.ptr(8))
    gated = src.index((i + 2).valid(i < 3)).load()
    with_alt = UOp(Ops.LOAD, dtypes.int32, (src.index(i.valid(i < 5)), UOp.const(dtypes.int32, -7)))
    out = UOp.param(0, dtypes.int32.ptr(8))
    ast = UOp.sink(out.index(i).store(gated * 100 + with_alt).end(i), arg=KernelInfo("gated"))
    x = np.arange(10, 18, dtype=np.int32)
    want = np.array([1200 + 10, 1300 + 11, 1400 + 12, 13, 14, -7, -7, 0], dtype=np.int32)
    for runner in ("ast", "program"):
        o = np.zeros(8, np.int32)
        if runner == "ast":
            eval_ast(ast, [o, x], {"n": 7})
        else:
            run_program(to_program(ast, PythonRenderer()), [o, x], {"n": 7})
        np.testing.assert_array_equal(o, want)


def test_memoryview_buffers_and_core_ranges() -> None:
    i = UOp.range(6, 0, AxisType.GLOBAL)
    io = UOp.param(0, dtypes.uint8.ptr(6))
    ast = UOp.sink(io.index(i).store(io.index(i).load() * 3 + 250).end(i), arg=KernelInfo("wrap"))
    prog = to_program(ast, PythonRenderer())
    raw = bytearray(range(6))
    mv = memoryview(raw)
    run_program(prog, [mv], {}, core_range=(0, 2))
    run_program(prog, [mv], {}, core_range=(2, 6))
    assert list(raw) == [(k * 3 + 250) % 256 for k in range(6)]


@pytest.mark.parametrize("runner", ["ast", "program"])
def test_gated_off_read_of_an_empty_buffer_reads_nothing(runner: str) -> None:
    """Padding an empty tensor: every read of the 0-element source is gated off, so the kernel is in bounds (the
    interpreter used to check the stand-in index 0 of the gated-off lanes and raise OutOfBoundsAccessError)."""
    n = UOp.variable("n", 0, 8)
    i = UOp.range(4, 0, AxisType.GLOBAL)
    src = UOp.param(1, dtypes.float32.ptr(0))
    out = UOp.param(0, dtypes.float32.ptr(4))
    ast = UOp.sink(out.index(i).store(src.index(i.valid(i < n)).load() + 1.0).end(i), arg=KernelInfo("pad_empty"))
    o = np.full(4, -1, np.float32)
    if runner == "ast":
        eval_ast(ast, [o, np.zeros(0, np.float32)], {"n": 0})
    else:
        run_program(to_program(ast, PythonRenderer()), [o, np.zeros(0, np.float32)], {"n": 0})
    np.testing.assert_array_equal(o, np.ones(4, np.float32))
