"""Differential execution of the C and LLVM renderers against the reference interpreter.

Each program (hand-built in the linear program form of KERNEL_CONTRACT.md section 2) is rendered, compiled (C: the
production ClangCompiler flags but `-shared`, loaded with ctypes; LLVM IR: parsed, verified, optimized at O2 and
run through llvmlite's MCJIT), executed on numpy buffers, and its output bits compared with
`speck.codegen.interpret.run_program` on copies of the same inputs."""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.codegen import numeric as nm
from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.renderer import UnsupportedOpError
from speck.codegen.renderer.common import kernel_signature
from speck.codegen.renderer.cstyle import ClangRenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AddrSpace, AxisType, DType, Ops, UOp, cast_value, dtypes

# the interpreter's numpy casts of out-of-range values warn by design; the results are still exact
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"), pytest.mark.c_backend]

# ---------------------------------------------------------------------------------------------------------------------
# building linear programs by hand


def linear(*anchors: UOp, name: str = "k") -> list[UOp]:
    """The anchors in the given order, each preceded by whichever of its sources are not listed yet, plus a final
    SINK carrying KernelInfo(name). Anchors fix the positions that matter (RANGE, accumulator STOREs, END)."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    for a in anchors:
        stack: list[tuple[UOp, bool]] = [(a, False)]
        while stack:
            n, done = stack.pop()
            if n in seen:
                continue
            if done:
                seen.add(n)
                out.append(n)
                continue
            stack.append((n, True))
            stack.extend((s, False) for s in reversed(n.src) if s not in seen)
    effects = [u for u in out if u.op is Ops.END] or [u for u in out if u.op is Ops.STORE]
    return out + [UOp(Ops.SINK, dtypes.void, tuple(effects), KernelInfo(name=name))]


def cc(v: Any, dt: DType) -> UOp:
    return UOp.cconst(v, dt)


def rng(end: UOp | int, axis: int, at: AxisType = AxisType.GLOBAL, dt: DType = dtypes.int32) -> UOp:
    e = end if isinstance(end, UOp) else cc(end, dt)
    return UOp(Ops.RANGE, dt, (e,), (axis, at))


def buf(slot: int, dt: DType, size: int) -> UOp:
    return UOp.param(slot, dt.ptr(size))


def idx(b: UOp, i: UOp, gate: UOp | None = None) -> UOp:
    return UOp(Ops.INDEX, b.dtype, (b, i) if gate is None else (b, i, gate))


def load(i: UOp, dt: DType | None = None, alt: UOp | None = None) -> UOp:
    dt = dt if dt is not None else i.src[0].dtype.base
    return UOp(Ops.LOAD, dt, (i,) if alt is None else (i, alt))


def store(i: UOp, v: UOp) -> UOp:
    return UOp(Ops.STORE, dtypes.void, (i, v))


def end(e: UOp, r: UOp) -> UOp:
    return UOp(Ops.END, dtypes.void, (e, r))


def alu(op: Ops, *src: UOp) -> UOp:
    dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else src[-1].dtype
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) and src[0].dtype.count > 1:
        dt = dtypes.bool.vec(src[0].dtype.count)
    return UOp(op, dt, tuple(src))


# ---------------------------------------------------------------------------------------------------------------------
# running a program three ways

_LLVM: dict[str, Any] = {}


def _llvm() -> Any:
    if not _LLVM:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()
        _LLVM["llvm"] = llvm
    return _LLVM["llvm"]


def _target_machine() -> Any:
    # a fresh one per engine: MCJIT takes ownership of the target machine it is given
    llvm = _llvm()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=2)  # fmt: skip


def compile_llvm(src: str, name: str, opt: int = 2) -> tuple[Any, Any]:
    """(function address, keep-alive objects) of kernel `name` in LLVM IR `src`, JIT-compiled with MCJIT."""
    llvm = _llvm()
    mod = llvm.parse_assembly(src)
    mod.verify()
    if opt:
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pb = llvm.create_pass_builder(_target_machine(), pto)
        pb.getModulePassManager().run(mod, pb)
        mod.verify()
    ee = llvm.create_mcjit_compiler(mod, _target_machine())
    ee.finalize_object()
    return ee.get_function_address(name), ee


def compile_c(src: str, name: str) -> tuple[Any, Any]:
    """(function address, the loaded library) of kernel `name` in C `src`, built with the production ClangCompiler
    flags as a shared object (`-shared` instead of `-c`)."""
    from speck.codegen.compiler.clang import CLANG_FLAGS, find_c_compiler

    compiler = find_c_compiler()
    assert compiler is not None, "tests need gcc or clang"
    flags = [f for f in CLANG_FLAGS if f not in ("-c", "-w")]
    d = tempfile.mkdtemp(prefix="speck-test-c-")
    try:
        so = os.path.join(d, "k.so")
        proc = subprocess.run([compiler, *flags, "-shared", "-Werror=implicit-function-declaration", "-", "-o", so],
                              input=src.encode(), capture_output=True)  # fmt: skip
        assert proc.returncode == 0, f"C compile failed:\n{proc.stderr.decode()}\n{src}"
        lib = ctypes.CDLL(so)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, lib


def call(addr: int, uops: list[UOp], bufs: list[np.ndarray], var_vals: dict[str, int], core: tuple[int, int]) -> None:
    sig = kernel_signature(uops, "test")
    args: list[Any] = [bufs[b.arg if isinstance(b.arg, int) else b.arg[0]].ctypes.data for b in sig.buffers]
    args += [var_vals[str(v.arg[0])] for v in sig.variables] + list(core)
    nscalar = len(args) - len(sig.buffers)
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(sig.buffers)), *([ctypes.c_int32] * nscalar))(addr)
    fn(*args)


def global_extent(uops: list[UOp], var_vals: dict[str, int]) -> int:
    sig = kernel_signature(uops, "test")
    if sig.sliced is None:
        return 1
    e = sig.sliced.src[0]
    if e.op is Ops.DEFINE_VAR:
        return var_vals[str(e.arg[0])]
    return int(e.src[0].arg)


def same_bits(got: np.ndarray, want: np.ndarray, dt: DType) -> bool:
    """Equal element for element; float NaNs compare equal to NaNs whatever their payload."""
    if dtypes.is_float(dt) and dt.scalar() in (dtypes.float16, dtypes.float32, dtypes.float64):
        g, w = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(w)
        return bool(np.all(both_nan | ((g == w) & (np.signbit(g) == np.signbit(w))) | ((g == 0) & (w == 0))))
    return bool(np.array_equal(got, want))


def check_program(uops: list[UOp], inputs: list[np.ndarray], var_vals: dict[str, int] | None = None,
                  backends: tuple[str, ...] = ("clang", "llvm"), splits: bool = True, extent: int | None = None,
                  src: str | None = None) -> dict[str, str]:  # fmt: skip
    """Run uops with the interpreter, then compiled by each backend (whole range, and split in two slices as two CPU
    workers would run it); every buffer must end bit-identical. Returns the rendered sources. `extent`: the sliced
    range's extent (default: read from the program); `src`: an already rendered source for the single backend."""
    var_vals = var_vals or {}
    want = [b.copy() for b in inputs]
    run_program(uops, want, var_vals)
    n = global_extent(uops, var_vals) if extent is None else extent
    sig = kernel_signature(uops, "test")
    srcs = {}
    for be in backends:
        if src is None or len(backends) > 1:
            src = (ClangRenderer() if be == "clang" else LLVMRenderer()).render(uops)
        srcs[be] = src
        addr, keep = compile_c(src, sig.name) if be == "clang" else compile_llvm(src, sig.name)
        cores = [[(0, n)]] + ([[(0, n // 2), (n // 2, n)]] if splits and n > 1 and sig.sliced is not None else [])
        for slices in cores:
            got = [b.copy() for b in inputs]
            for core in slices:
                call(addr, uops, got, var_vals, core)
            for b in sig.buffers:
                slot = b.arg if isinstance(b.arg, int) else b.arg[0]
                assert same_bits(got[slot], want[slot], b.dtype.base), (
                    f"{be} slices={slices} buffer {slot} ({b.dtype.base}) differs:\n got {got[slot]}\nwant "
                    f"{want[slot]}\n{src}"
                )
        del keep
    return srcs


# ---------------------------------------------------------------------------------------------------------------------
# value sets

FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.5, 0.1, 2.5, -2.5, 3.5, 1e-8, 6e-5, 65504.0, 65520.0, 70000.0, 448.0, 464.0,
                  500.0, 57344.0, 61440.0, 1e20, -1e20, 3e9, -3e9, 2.0**63, -(2.0**63), 2.0**64 + 2.0**41, 1e300,
                  math.inf, -math.inf, math.nan, 255.7, -128.9, 1 / 3, 2.0**-140, 33.0, -7.0]  # fmt: skip
INT_SPECIALS = [0, 1, -1, 2, -2, 7, -7, 31, 32, 33, 63, 64, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768,
                65535, 65536, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1,
                3]  # fmt: skip

ALL_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
              dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, *dtypes.fp8s,
              dtypes.float32, dtypes.float64]  # fmt: skip


def values_of(dt: DType, n: int | None = None, seed: int = 0) -> np.ndarray:
    """Storage array of special values of dt (plus random ones), exactly as a buffer of dt holds them."""
    r = np.random.default_rng(seed)
    if dt == dtypes.bool:
        vals: list[Any] = [False, True, True, False] + list(r.integers(0, 2, 28).astype(bool))
    elif dtypes.is_int(dt):
        rand = r.integers(-(2**40), 2**40, 16)
        vals = [cast_value(v, dt) for v in INT_SPECIALS] + [cast_value(int(v), dt) for v in rand]
    else:
        vals = [cast_value(v, dt) for v in FLOAT_SPECIALS] + [cast_value(float(v), dt) for v in r.normal(0, 50, 16)]
    if n is not None:
        vals = (vals * (n // len(vals) + 1))[:n]
    arr = np.array(vals, dtype=nm.compute_np(dt)) if not dtypes.is_float(dt) else np.array(vals, dtype=np.float64)
    return nm.to_storage(nm.round_to(arr, dt) if dtypes.is_float(dt) else arr, dt)


def elementwise(name: str, in_dts: list[DType], out_dt: DType, n: int, fn: Callable[..., UOp]) -> list[UOp]:
    """out[i] = fn(in0[i], in1[i], ...) over a GLOBAL range of n."""
    r = rng(n, 0)
    ins = [load(idx(buf(i + 1, dt, n), r)) for i, dt in enumerate(in_dts)]
    st = store(idx(buf(0, out_dt, n), r), fn(*ins))
    return linear(r, st, end(st, r), name=name)


# ---------------------------------------------------------------------------------------------------------------------
# casts: every pair of dtypes, on special values


@pytest.mark.parametrize("src", ALL_DTYPES, ids=lambda d: d.name)
def test_casts_from(src: DType) -> None:
    n = len(FLOAT_SPECIALS) + 16 if dtypes.is_float(src) else 48
    r = rng(n, 0)
    x = load(idx(buf(0, src, n), r))
    targets = [dt for dt in ALL_DTYPES if dt != src]
    stores = [store(idx(buf(i + 1, dt, n), r), UOp(Ops.CAST, dt, (x,))) for i, dt in enumerate(targets)]
    uops = _multi_store_program(f"cast_{src.short_name}", r, stores)
    inputs = [values_of(src, n)] + [np.zeros(n, nm.storage_np(dt)) for dt in targets]
    check_program(uops, inputs, splits=False)


# ---------------------------------------------------------------------------------------------------------------------
# ALU ops on every dtype they apply to

_BIN_INT = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
            Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]  # fmt: skip
_BIN_FLOAT = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
_UN_FLOAT = [Ops.NEG, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL]
_INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
         dtypes.uint64]  # fmt: skip


def _pairs(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    a = values_of(dt, seed=1)
    b = values_of(dt, seed=2)
    # every value against every value (cross product), so 0, -1, MIN, NaN meet each other
    return np.repeat(a, len(b)), np.tile(b, len(a))


@pytest.mark.parametrize("dt", _INTS, ids=lambda d: d.name)
def test_int_binary_ops(dt: DType) -> None:
    a, b = _pairs(dt)
    n = len(a)
    r = rng(n, 0)
    xa, xb = load(idx(buf(0, dt, n), r)), load(idx(buf(1, dt, n), r))
    stores = []
    for i, op in enumerate(_BIN_INT):
        out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
        stores.append(store(idx(buf(i + 2, out_dt, n), r), alu(op, xa, xb)))
    neg = store(idx(buf(len(_BIN_INT) + 2, dt, n), r), alu(Ops.NEG, xa))
    stores.append(neg)
    uops = _multi_store_program(f"ints_{dt.short_name}", r, stores)
    outs = [
        np.zeros(n, nm.storage_np(dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt)) for op in _BIN_INT
    ]
    check_program(uops, [a, b, *outs, np.zeros(n, nm.storage_np(dt))], splits=False)


def _multi_store_program(name: str, r: UOp, stores: list[UOp]) -> list[UOp]:
    """One loop holding several stores (END over the last one, the others placed before it)."""
    return linear(r, *stores, end(stores[-1], r), name=name)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_ops(dt: DType) -> None:
    a, b = _pairs(dt)
    n = len(a)
    r = rng(n, 0)
    xa, xb = load(idx(buf(0, dt, n), r)), load(idx(buf(1, dt, n), r))
    ops = _BIN_FLOAT + _UN_FLOAT
    stores = []
    for i, op in enumerate(ops):
        out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
        v = alu(op, xa, xb) if op in _BIN_FLOAT else UOp(op, dt, (xa,))
        stores.append(store(idx(buf(i + 2, out_dt, n), r), v))
    cond = alu(Ops.CMPLT, xa, xb)
    stores.append(store(idx(buf(len(ops) + 2, dt, n), r), UOp(Ops.WHERE, dt, (cond, xa, xb))))
    uops = _multi_store_program(f"floats_{dt.short_name}", r, stores)
    outs = [np.zeros(n, nm.storage_np(dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt)) for op in ops]
    check_program(uops, [a, b, *outs, np.zeros(n, nm.storage_np(dt))], splits=False)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, *dtypes.fp8s], ids=lambda d: d.name)
def test_narrow_float_compare_and_select(dt: DType) -> None:
    a, b = _pairs(dt)
    n = len(a)
    r = rng(n, 0)
    xa, xb = load(idx(buf(0, dt, n), r)), load(idx(buf(1, dt, n), r))
    stores = [store(idx(buf(i + 2, dtypes.bool, n), r), alu(op, xa, xb))
              for i, op in enumerate((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ))]  # fmt: skip
    stores.append(store(idx(buf(5, dt, n), r), UOp(Ops.WHERE, dt, (alu(Ops.CMPLT, xb, xa), xa, xb))))
    uops = _multi_store_program(f"narrow_{dt.short_name}", r, stores)
    outs = [np.zeros(n, np.bool_) for _ in range(3)] + [np.zeros(n, nm.storage_np(dt))]
    check_program(uops, [a, b, *outs], splits=False)


def test_bool_ops() -> None:
    a = np.array([False, False, True, True] * 4)
    b = np.array([False, True, False, True] * 4)
    n = len(a)
    r = rng(n, 0)
    xa, xb = load(idx(buf(0, dtypes.bool, n), r)), load(idx(buf(1, dtypes.bool, n), r))
    ops = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
    stores = [store(idx(buf(i + 2, dtypes.bool, n), r), alu(op, xa, xb)) for i, op in enumerate(ops)]
    stores.append(store(idx(buf(len(ops) + 2, dtypes.bool, n), r), UOp(Ops.NEG, dtypes.bool, (xa,))))
    uops = _multi_store_program("bools", r, stores)
    check_program(uops, [a, b] + [np.zeros(n, np.bool_) for _ in range(len(ops) + 1)], splits=False)


# ---------------------------------------------------------------------------------------------------------------------
# structure: reductions, variables, gates, vectors, bitcasts


def test_row_sum_and_max_with_registers() -> None:
    rows, cols = 7, 13
    inp = buf(1, dtypes.float32, rows * cols)
    r = rng(rows, 0)
    k = rng(cols, 1, AxisType.REDUCE)
    acc = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(2, AddrSpace.REG), (), 0)
    a0, a1 = idx(acc, cc(0, dtypes.int32)), idx(acc, cc(1, dtypes.int32))
    init0, init1 = store(a0, cc(0.0, dtypes.float32)), store(a1, cc(-math.inf, dtypes.float32))
    x = load(idx(inp, alu(Ops.ADD, alu(Ops.MUL, r, cc(cols, dtypes.int32)), k)))
    upd0 = store(a0, alu(Ops.ADD, load(a0), x))
    upd1 = store(a1, alu(Ops.MAX, load(a1), x))
    e_k = end(upd1, k)
    # after the loop: the same loads again, kept distinct by a position tag as the linearizer does
    res0, res1 = load(a0).replace(tag=("lin", 0)), load(a1).replace(tag=("lin", 1))
    out0 = store(idx(buf(0, dtypes.float32, rows), r), res0)
    out1 = store(idx(buf(2, dtypes.float32, rows), r), res1)
    uops = linear(acc, r, init0, init1, k, upd0, upd1, e_k, out0, out1, end(out1, r), name="rowstats")
    vals = np.random.default_rng(3).normal(size=rows * cols).astype(np.float32)
    vals[5] = np.nan
    check_program(uops, [np.zeros(rows, np.float32), vals, np.zeros(rows, np.float32)])


def test_variable_bounds_and_nested_loops() -> None:
    n = UOp.variable("n", 1, 64, dtypes.int32)
    m = UOp.variable("m", 1, 8, dtypes.int32)
    r = rng(n, 0)
    j = rng(m, 1, AxisType.LOOP)
    pos = alu(Ops.ADD, alu(Ops.MUL, r, m), j)
    v = load(idx(buf(1, dtypes.int32, 512), pos))
    st = store(idx(buf(0, dtypes.int32, 512), pos), alu(Ops.MUL, alu(Ops.ADD, v, r), cc(-3, dtypes.int32)))
    e_j = end(st, j)
    uops = linear(r, j, st, e_j, end(e_j, r), name="nested")
    inp = np.arange(512, dtype=np.int32) * 7919
    check_program(uops, [np.zeros(512, np.int32), inp], {"n": 37, "m": 5})


def test_gated_loads_and_stores() -> None:
    n = 40
    r = rng(n, 0)
    src = buf(1, dtypes.float32, n)
    ok = alu(Ops.CMPLT, r, cc(30, dtypes.int32))
    shifted = alu(Ops.ADD, r, cc(-5, dtypes.int32))
    in_range = UOp(Ops.AND, dtypes.bool, (alu(Ops.CMPLT, cc(4, dtypes.int32), r), ok))
    a = load(idx(src, shifted, in_range), alt=cc(-1.0, dtypes.float32))  # reads src[r-5] for 4 < r < 30, else -1
    b = load(idx(src, alu(Ops.ADD, r, cc(100, dtypes.int32)), cc(False, dtypes.bool)))  # never reads: 0
    st = store(idx(buf(0, dtypes.float32, n), r, alu(Ops.CMPNE, r, cc(7, dtypes.int32))), alu(Ops.ADD, a, b))
    uops = linear(r, st, end(st, r), name="gated")
    out = np.full(n, 9.0, np.float32)
    check_program(uops, [out, np.arange(n, dtype=np.float32)])


def test_vectors_load_alu_stack_gep_store() -> None:
    n = 16  # 16 groups of 4 floats
    r = rng(n, 0)
    base = alu(Ops.MUL, r, cc(4, dtypes.int32))
    f4 = dtypes.float32.vec(4)
    v = load(idx(buf(1, dtypes.float32, 4 * n), base), f4)
    w = load(idx(buf(2, dtypes.float32, 4 * n), base), f4)
    s = alu(Ops.ADD, alu(Ops.MUL, v, w), UOp.stack(*[cc(float(i), dtypes.float32) for i in range(4)]))
    mx = alu(Ops.MAX, s, w)
    rev = UOp(Ops.GEP, f4, (mx,), (3, 2, 1, 0))
    lane = UOp(Ops.GEP, dtypes.float32, (s,), (1,))
    gated = load(idx(buf(1, dtypes.float32, 4 * n), base, alu(Ops.CMPLT, r, cc(5, dtypes.int32))), f4,
                 alt=UOp.stack(*[cc(-2.0, dtypes.float32)] * 4))  # fmt: skip
    cmp = alu(Ops.CMPLT, v, w)
    sel = UOp(Ops.WHERE, f4, (cmp, rev, gated))
    i4 = dtypes.int32.vec(4)
    as_int = UOp(Ops.CAST, i4, (sel,))
    st0 = store(idx(buf(0, dtypes.float32, 4 * n), base), sel)
    st1 = store(idx(buf(3, dtypes.float32, n), r), lane)
    st2 = store(idx(buf(4, dtypes.int32, 4 * n), base), alu(Ops.MUL, as_int, UOp.stack(*[cc(3, dtypes.int32)] * 4)))
    uops = linear(r, st0, st1, st2, end(st2, r), name="vec4")
    g = np.random.default_rng(5)
    a = g.normal(size=4 * n).astype(np.float32) * 100
    b = g.normal(size=4 * n).astype(np.float32) * 100
    a[3] = np.nan
    check_program(uops, [np.zeros(4 * n, np.float32), a, b, np.zeros(n, np.float32), np.zeros(4 * n, np.int32)])


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.uint16, dtypes.bool,
                                dtypes.fp8e4m3, dtypes.fp8e5m2fnuz, dtypes.int64], ids=lambda d: d.name)  # fmt: skip
def test_vector_casts_and_loads_of_narrow_types(dt: DType) -> None:
    n = 8
    r = rng(n, 0)
    base = alu(Ops.MUL, r, cc(8, dtypes.int32))
    v = load(idx(buf(1, dt, 8 * n), base), dt.vec(8))
    f = UOp(Ops.CAST, dtypes.float32.vec(8), (v,))
    back = UOp(Ops.CAST, dt.vec(8), (alu(Ops.MUL, f, UOp.stack(*[cc(1.5, dtypes.float32)] * 8)),))
    st = store(idx(buf(0, dt, 8 * n), base), back)
    st2 = store(idx(buf(2, dtypes.float32, 8 * n), base), f)
    uops = linear(r, st, st2, end(st2, r), name=f"vcast_{dt.short_name}")
    check_program(uops, [np.zeros(8 * n, nm.storage_np(dt)), values_of(dt, 8 * n), np.zeros(8 * n, np.float32)])


def test_bitcasts() -> None:
    n = 32
    r = rng(n, 0)
    f = load(idx(buf(1, dtypes.float32, n), r))
    as_u = UOp(Ops.BITCAST, dtypes.uint32, (f,))
    h = load(idx(buf(2, dtypes.float16, n), r))
    as_i16 = UOp(Ops.BITCAST, dtypes.int16, (h,))
    bf = UOp(Ops.BITCAST, dtypes.bfloat16, (as_i16,))
    st0 = store(idx(buf(0, dtypes.uint32, n), r), alu(Ops.XOR, as_u, cc(0x80000000, dtypes.uint32)))
    st3 = store(idx(buf(3, dtypes.float32, n), r), UOp(Ops.CAST, dtypes.float32, (bf,)))
    uops = linear(r, st0, st3, end(st3, r), name="bitcasts")
    check_program(uops, [np.zeros(n, np.uint32), values_of(dtypes.float32, n), values_of(dtypes.float16, n),
                         np.zeros(n, np.float32)])  # fmt: skip


def test_no_global_range_and_int64_range() -> None:
    r = rng(cc(10, dtypes.int64), 0, AxisType.LOOP, dtypes.int64)
    acc = UOp(Ops.DEFINE_REG, dtypes.int64.ptr(1, AddrSpace.REG), (), 0)
    a0 = idx(acc, cc(0, dtypes.int32))
    init = store(a0, cc(0, dtypes.int64))
    upd = store(a0, alu(Ops.ADD, load(a0), alu(Ops.MUL, load(idx(buf(1, dtypes.int64, 10), r)), r)))
    out = store(idx(buf(0, dtypes.int64, 1), cc(0, dtypes.int32)), load(a0).replace(tag=("lin", 0)))
    uops = linear(acc, init, r, upd, end(upd, r), out, name="scalar_out")
    check_program(uops, [np.zeros(1, np.int64), np.arange(10, dtype=np.int64) * (2**60)])


def test_sliced_range_is_int64() -> None:
    r = rng(cc(12, dtypes.int64), 0, AxisType.GLOBAL, dtypes.int64)
    st = store(idx(buf(0, dtypes.int64, 12), r), alu(Ops.MUL, r, r))
    uops = linear(r, st, end(st, r), name="i64global")
    check_program(uops, [np.zeros(12, np.int64)])


# ---------------------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("renderer", [ClangRenderer(), LLVMRenderer()], ids=lambda r: r.name)
def test_unsupported_op_names_op_dtype_renderer(renderer: Any) -> None:
    uops = elementwise("bad", [dtypes.float32], dtypes.float32, 4, lambda x: UOp(Ops.EXP2, dtypes.float32, (x,)))
    with pytest.raises(UnsupportedOpError, match=rf"'{renderer.name}'.*EXP2.*float"):
        renderer.render(uops)
    uops = elementwise("bad2", [dtypes.int32] * 2, dtypes.int32, 4, lambda a, b: alu(Ops.FDIV, a, b))
    with pytest.raises(RuntimeError, match=rf"'{renderer.name}'.*FDIV.*int"):
        renderer.render(uops)


@pytest.mark.parametrize("renderer", [ClangRenderer(), LLVMRenderer()], ids=lambda r: r.name)
def test_bare_const_is_rejected(renderer: Any) -> None:
    uops = elementwise("bare", [dtypes.float32], dtypes.float32, 4,
                       lambda x: alu(Ops.ADD, x, UOp.const(dtypes.float32, 1.0)))  # fmt: skip
    with pytest.raises(RuntimeError, match="bare CONST"):
        renderer.render(uops)


@pytest.mark.parametrize("renderer", [ClangRenderer(), LLVMRenderer()], ids=lambda r: r.name)
def test_dtype_without_a_type_names_op_dtype_renderer(renderer: Any) -> None:
    uops = elementwise("weak", [dtypes.int32], dtypes.int32, 4,
                       lambda x: UOp(Ops.CAST, dtypes.int32, (UOp(Ops.CAST, dtypes.weakint, (x,)),)))  # fmt: skip
    with pytest.raises(UnsupportedOpError, match=rf"'{renderer.name}'.*CAST.*weakint"):
        renderer.render(uops)


def test_variable_names_that_are_c_keywords_are_renamed() -> None:
    v = UOp.variable("int", 1, 16, dtypes.int32)
    w = UOp.variable("alu0", 1, 16, dtypes.int32)
    r = rng(v, 0)
    st = store(idx(buf(0, dtypes.int32, 16), r), alu(Ops.MUL, r, w))
    uops = linear(r, st, end(st, r), name="kw")
    src = check_program(uops, [np.zeros(16, np.int32)], {"int": 9, "alu0": 3})
    assert "int var0, int var1, int core_start" in src["clang"]


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint8, dtypes.int64, dtypes.float64, dtypes.int16],
                         ids=lambda d: d.name)  # fmt: skip
def test_native_vector_compare_select_max_and_casts(dt: DType) -> None:
    """Whole-vector forms (masks, bitwise selects, __builtin_convertvector) agree with the scalar semantics."""
    lanes = 32 // dt.itemsize if dt.itemsize <= 4 else 4
    vdt = dt.vec(lanes)
    n = 6
    r = rng(n, 0)
    base = alu(Ops.MUL, r, cc(lanes, dtypes.int32))
    a = load(idx(buf(1, dt, lanes * n), base), vdt)
    b = load(idx(buf(2, dt, lanes * n), base), vdt)
    lt, ne = alu(Ops.CMPLT, a, b), alu(Ops.CMPNE, a, b)
    sel = UOp(Ops.WHERE, vdt, (lt, a, b))
    mx = alu(Ops.MAX, a, b)
    as_bool = UOp(Ops.CAST, dtypes.bool.vec(lanes), (a,))
    as_f32 = UOp(Ops.CAST, dtypes.float32.vec(lanes), (mx,))
    as_i8 = UOp(Ops.CAST, dtypes.int8.vec(lanes), (sel,))
    bsel = UOp(Ops.WHERE, dtypes.bool.vec(lanes), (ne, as_bool, lt))
    outs = [(sel, dt), (mx, dt), (as_f32, dtypes.float32), (as_i8, dtypes.int8), (bsel, dtypes.bool)]
    stores = [store(idx(buf(i + 3, odt, lanes * n), base), v) for i, (v, odt) in enumerate(outs)]
    stores.append(store(idx(buf(0, dt, lanes * n), base), b))
    uops = _multi_store_program(f"nvec_{dt.short_name}", r, stores)
    bufs = [values_of(dt, lanes * n, seed=11), values_of(dt, lanes * n, seed=12)]
    outs_np = [np.zeros(lanes * n, nm.storage_np(odt)) for _, odt in outs]
    src = check_program(uops, [np.zeros(lanes * n, nm.storage_np(dt)), *bufs, *outs_np])
    assert "__builtin_convertvector" in src["clang"]
