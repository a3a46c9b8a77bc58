"""The x86-64 backend end to end: kernel ASTs -> to_program(ast, X86Renderer(), X86Compiler()) -> the object linked by
speck.hcq's ELF loader -> called over the CPU ABI (whole global range, and split in slices as worker threads run it).

Every result is compared with the reference interpreter: bit for bit with `run_program` on the same lowered program,
and with `eval_ast` on the original AST (ints exact; floats within the reassociation tolerance of helpers.assert_same;
skipped for kernels using EXP2/LOG2/SIN, whose polynomial decompositions are not the interpreter's float64 libm).

Corpus restriction: the backend has no half/bfloat16/fp8 registers, so the hypothesis corpus (codegen_strategies.py) is
mapped to float32 wherever it draws those dtypes (same structure, same values widened exactly)."""

from __future__ import annotations

import ctypes
import hashlib
import pathlib
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings

from codegen_helpers import assert_same, out_dtype
from codegen_strategies import kernel_asts
from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.numeric import from_storage
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.x86 import X86Compiler, X86Renderer
from speck.uop import AxisType, Context, DType, Ops, PtrDType, UOp, dtypes

pytestmark = [pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc links the objects for ctypes"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                         "ignore:invalid value encountered:RuntimeWarning")]  # fmt: skip

_NO_REGISTERS = (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s)
_TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN)


def _widen(dt: DType) -> DType:
    if isinstance(dt, PtrDType):
        return _widen(dt.base).ptr(dt.size, dt.addrspace) if dt.base in _NO_REGISTERS else dt
    return dtypes.float32.vec(dt.count) if dt.scalar() in _NO_REGISTERS else dt


def without_narrow_floats(ast: UOp, inputs: list[np.ndarray]) -> tuple[UOp, list[np.ndarray]]:
    """The same kernel with half/bfloat16/fp8 replaced by float32 (buffers converted exactly)."""
    memo: dict[UOp, UOp] = {}
    new_inputs = list(inputs)
    for u in ast.toposort():
        src = tuple(memo[s] for s in u.src)
        dt = _widen(u.dtype)
        if u.op is Ops.PARAM and dt is not u.dtype:
            assert isinstance(u.dtype, PtrDType)
            new_inputs[u.arg] = from_storage(inputs[u.arg], u.dtype.base).astype(np.float32)
        memo[u] = u if (src == u.src and dt is u.dtype) else u.replace(dtype=dt, src=src)
    return memo[ast], new_inputs


def x86_program(ast: UOp, optimize: bool = True) -> ProgramSpec:
    return to_program(ast, X86Renderer(), X86Compiler(), optimize=optimize)


def asm(spec: ProgramSpec) -> str:
    """The machine code listing of a program (spec.src is the program text the compiler reads)."""
    return X86Compiler().disassemble(spec.lib if spec.lib is not None else X86Compiler().compile(spec.src))


_LIBS: dict[str, ctypes.CDLL] = {}


def link(lib: bytes, name: str) -> int:
    """The address of function `name` in ELF object `lib`, linked by gcc into a shared object and loaded with ctypes
    (codegen's tests do not use speck.hcq's loader: the layering rules keep codegen below the runtime)."""
    key = hashlib.sha256(lib).hexdigest()
    if key not in _LIBS:
        d = tempfile.mkdtemp(prefix="speck-x86-test-")
        try:
            obj, so = pathlib.Path(d) / "k.o", pathlib.Path(d) / "k.so"
            obj.write_bytes(lib)
            subprocess.run(["gcc", "-shared", "-o", str(so), str(obj)], check=True, capture_output=True)
            _LIBS[key] = ctypes.CDLL(str(so))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return ctypes.cast(getattr(_LIBS[key], name), ctypes.c_void_p).value or 0


def run_x86(spec: ProgramSpec, inputs: list[np.ndarray], var_vals: dict[str, int],
            slices: list[tuple[int, int]] | None = None) -> list[np.ndarray]:  # fmt: skip
    """Link spec.lib and call it once per (core_start, core_end) slice over copies of the inputs."""
    assert spec.lib is not None
    nb, nv = len(spec.buffers), len(spec.vars)
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nb), *([ctypes.c_int32] * (nv + 2)))(link(spec.lib, spec.name))
    bufs = [b.copy() for b in inputs]
    n = int(spec.launch_dims(var_vals)[0]) if spec.global_size else 1
    for lo, hi in slices if slices is not None else [(0, n)]:
        fn(*[bufs[b.slot].ctypes.data for b in spec.buffers], *[var_vals[v] for v in spec.var_names], lo, hi)
    return bufs


def same_bits(got: np.ndarray, want: np.ndarray, dt: DType) -> bool:
    """Equal element for element; NaNs match NaNs whatever their payload, and the sign of a zero is not compared
    (numpy.maximum(0.0, -0.0) depends on numpy's SIMD path, as in test_render_clang_llvm_exec.same_bits)."""
    if dtypes.is_float(dt):
        g, w = from_storage(got, dt).astype(np.float64), from_storage(want, dt).astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(w)
        return bool(np.all(both_nan | ((g == w) & (np.signbit(g) == np.signbit(w))) | ((g == 0) & (w == 0))))
    return bool(np.array_equal(got, want))


def check(ast: UOp, inputs: list[np.ndarray], var_vals: dict[str, int], vs_ast: bool = True,
          optimize: bool = True) -> ProgramSpec:  # fmt: skip
    """Compile for x86, run whole and in two slices, compare with run_program (bits) and eval_ast."""
    spec = x86_program(ast, optimize)
    want = [b.copy() for b in inputs]
    run_program(spec.uops, want, var_vals)
    n = int(spec.launch_dims(var_vals)[0]) if spec.global_size else 1
    for slices in ([(0, n)], [(0, n // 2), (n // 2, n)]):
        got = run_x86(spec, inputs, var_vals, slices)
        for b in spec.buffers:
            assert same_bits(got[b.slot], want[b.slot], b.dtype), (
                f"slices {slices} buffer {b.slot} ({b.dtype}):\n got {got[b.slot]}\nwant {want[b.slot]}\n{asm(spec)}"
            )
    if vs_ast and not any(u.op in _TRANSCENDENTAL for u in ast.toposort()):
        expected = [b.copy() for b in inputs]
        eval_ast(ast, expected, var_vals)
        assert_same(expected[0], got[0], out_dtype(ast), exact=False)
    return spec


# ---------------------------------------------------------------------------------------------------------------------
# the hypothesis corpus


@given(kernel_asts(max_depth=2))
@settings(max_examples=40)
def test_corpus_matches_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    """Heuristic opts (float32 outputs become 8-lane vectors) and no opts (all scalar) on the same kernels."""
    ast, inputs, var_vals = case
    ast, inputs = without_narrow_floats(ast, inputs)
    check(ast, inputs, var_vals)
    check(ast, inputs, var_vals, optimize=False)


@pytest.mark.slow
@given(kernel_asts())
def test_corpus_deep_matches_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    ast, inputs = without_narrow_floats(ast, inputs)
    check(ast, inputs, var_vals)


# ---------------------------------------------------------------------------------------------------------------------
# hand-written kernels


def _k(name: str, *stores: UOp) -> UOp:
    return UOp.sink(*stores, arg=KernelInfo(name=name))


def test_elementwise_all_int_ops_on_special_values() -> None:
    """Wrapping, x/0 == 0, MIN/-1 wraps, out-of-range shifts: every int dtype against every special value."""
    vals = [0, 1, -1, 2, -2, 7, -7, 31, 32, 33, 63, 64, 127, -128, 255, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    for dt in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
               dtypes.uint64):  # fmt: skip
        from speck.codegen.numeric import storage_np
        from speck.uop import cast_value

        v = np.array([cast_value(x, dt) for x in vals], dtype=storage_np(dt))
        a, b = np.repeat(v, len(v)), np.tile(v, len(v))
        n = len(a)
        r = UOp.range(n, 0, AxisType.GLOBAL)
        pa, pb = UOp.param(1, dt.ptr(n)), UOp.param(2, dt.ptr(n))
        xa, xb = pa.index(r).load(), pb.index(r).load()
        ops = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]
        stores, outs = [], []
        for i, op in enumerate(ops):
            o = UOp.param(3 + i, dt.ptr(n))
            stores.append(o.index(r).store(xa.alu(op, xb)))
            outs.append(np.zeros(n, storage_np(dt)))
        for j, op in enumerate((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)):
            o = UOp.param(3 + len(ops) + j, dtypes.bool.ptr(n))
            stores.append(o.index(r).store(xa.alu(op, xb)))
            outs.append(np.zeros(n, np.bool_))
        o = UOp.param(0, dt.ptr(n))
        stores.append(o.index(r).store(-xa))
        ast = _k(f"ints_{dt.short_name}", *[s.end(r) for s in stores])
        check(ast, [np.zeros(n, storage_np(dt)), a, b, *outs], {}, vs_ast=False)


def test_float_ops_and_casts_on_special_values() -> None:
    specials = [0.0, -0.0, 1.0, -1.5, 0.1, 2.5, -2.5, 1e-8, 65504.0, 1e20, -1e20, 3e9, -3e9, 2.0**63, -(2.0**63),
                2.0**64 + 2.0**41, 1e300, np.inf, -np.inf, np.nan, 255.7, -128.9, 33.0]  # fmt: skip
    for fdt, npt in ((dtypes.float32, np.float32), (dtypes.float64, np.float64)):
        v = np.array(specials, dtype=npt)
        a, b = np.repeat(v, len(v)), np.tile(v, len(v))
        n = len(a)
        r = UOp.range(n, 0, AxisType.GLOBAL)
        xa = UOp.param(1, fdt.ptr(n)).index(r).load()
        xb = UOp.param(2, fdt.ptr(n)).index(r).load()
        exprs = [xa + xb, xa - xb, xa * xb, xa / xb, xa.maximum(xb) if hasattr(xa, "maximum") else xa.alu(Ops.MAX, xb),
                 -xa, xa.alu(Ops.SQRT), xa.alu(Ops.TRUNC), xa.alu(Ops.RECIPROCAL), (xa < xb).where(xa, xb)]  # fmt: skip
        targets = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                   dtypes.uint64, dtypes.bool, dtypes.float32 if fdt == dtypes.float64 else dtypes.float64]  # fmt: skip
        stores, outs = [], []
        slot = 3
        for e in exprs:
            stores.append(UOp.param(slot, fdt.ptr(n)).index(r).store(e))
            outs.append(np.zeros(n, npt))
            slot += 1
        for cmp in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            stores.append(UOp.param(slot, dtypes.bool.ptr(n)).index(r).store(xa.alu(cmp, xb)))
            outs.append(np.zeros(n, np.bool_))
            slot += 1
        from speck.codegen.numeric import storage_np

        for t in targets:
            stores.append(UOp.param(slot, t.ptr(n)).index(r).store(xa.cast(t)))
            outs.append(np.zeros(n, storage_np(t)))
            slot += 1
        o = UOp.param(0, fdt.ptr(n))
        stores.append(o.index(r).store(xa.bitcast(dtypes.int32 if fdt == dtypes.float32 else dtypes.int64)
                                       .bitcast(fdt)))  # fmt: skip
        ast = _k(f"floats_{fdt.short_name}", *[s.end(r) for s in stores])
        check(ast, [np.zeros(n, npt), a, b, *outs], {}, vs_ast=False)


def test_int_to_float_casts() -> None:
    from speck.codegen.numeric import storage_np
    from speck.uop import cast_value

    vals = [0, 1, -1, 7, 127, -128, 255, 2**24 + 1, 2**31 - 1, -(2**31), 2**32 - 1, 2**53 + 1, 2**63 - 1, -(2**63),
            2**64 - 1, 2**63 + 2**40 + 1, 3]  # fmt: skip
    for dt in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
               dtypes.int64, dtypes.uint64):  # fmt: skip
        v = np.array([cast_value(x, dt) for x in vals], dtype=storage_np(dt))
        n = len(v)
        r = UOp.range(n, 0, AxisType.GLOBAL)
        x = UOp.param(1, dt.ptr(n)).index(r).load()
        s0 = UOp.param(0, dtypes.float32.ptr(n)).index(r).store(x.cast(dtypes.float32))
        s2 = UOp.param(2, dtypes.float64.ptr(n)).index(r).store(x.cast(dtypes.float64))
        ast = _k(f"i2f_{dt.short_name}", s0.end(r), s2.end(r))
        check(ast, [np.zeros(n, np.float32), v, np.zeros(n, np.float64)], {})


def test_row_reduction_and_symbolic_size() -> None:
    rows, cols = 9, 13
    n = UOp.variable("n", 1, rows)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    k = UOp.range(cols, 1, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + k).load()
    ast = _k("rowmax", UOp.param(0, dtypes.float32.ptr(rows)).index(r).store(x.reduce(k, op=Ops.MAX)).end(r))
    vals = np.random.default_rng(1).normal(size=rows * cols).astype(np.float32)
    vals[20] = np.nan
    check(ast, [np.zeros(rows, np.float32), vals], {"n": 7})


def test_gated_load_with_alternative_and_gated_store() -> None:
    from test_render_clang_llvm_exec import alu, buf, cc, end, idx, linear, load, rng, store

    n = 40
    r = rng(n, 0)
    src = buf(1, dtypes.float32, n)
    ok = alu(Ops.CMPLT, r, cc(30, dtypes.int32))
    shifted = alu(Ops.ADD, r, cc(-5, dtypes.int32))
    in_range = UOp(Ops.AND, dtypes.bool, (alu(Ops.CMPLT, cc(4, dtypes.int32), r), ok))
    a = load(idx(src, shifted, in_range), alt=cc(-1.0, dtypes.float32))
    b = load(idx(src, alu(Ops.ADD, r, cc(100, dtypes.int32)), cc(False, dtypes.bool)))
    st = store(idx(buf(0, dtypes.float32, n), r, alu(Ops.CMPNE, r, cc(7, dtypes.int32))), alu(Ops.ADD, a, b))
    uops = linear(r, st, end(st, r), name="gated")
    rend = X86Renderer().render(uops)
    lib = X86Compiler().compile(rend)
    out = np.full(n, 9.0, np.float32)
    want = [out.copy(), np.arange(n, dtype=np.float32)]
    run_program(uops, want, {})
    spec = ProgramSpec("gated", rend, uops, (n, 1, 1), None, [], [], None, "x86", lib)  # type: ignore[arg-type]
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(link(lib, "gated"))
    got = [out.copy(), np.arange(n, dtype=np.float32)]
    fn(got[0].ctypes.data, got[1].ctypes.data, 0, n)
    np.testing.assert_array_equal(got[0], want[0])
    assert spec.lib is lib


def test_register_pressure_forces_spills() -> None:
    """40 loaded values all live at once (more than the 16 registers of either class), summed in reverse."""
    for dt, npt in ((dtypes.int32, np.int32), (dtypes.float32, np.float32), (dtypes.int64, np.int64)):
        m, n = 40, 6
        r = UOp.range(n, 0, AxisType.GLOBAL)
        src = UOp.param(1, dt.ptr(m * n))
        xs = [src.index(r * m + j).load() for j in range(m)]
        acc = xs[-1]
        for j, x in enumerate(reversed(xs[:-1])):
            acc = acc * x if j % 3 == 0 and not dtypes.is_float(dt) else acc + x
        # every value is used twice, far apart, so all of them are live at the point of the first sum
        total = acc
        for x in xs:
            total = total - x
        ast = _k(f"pressure_{dt.short_name}", UOp.param(0, dt.ptr(n)).index(r).store(total).end(r))
        vals = (np.random.default_rng(2).integers(-50, 50, m * n)).astype(npt)
        spec = check(ast, [np.zeros(n, npt), vals], {}, vs_ast=not dtypes.is_float(dt))
        assert "rsp" in asm(spec)


def test_loop_carried_spilled_value() -> None:
    """Two dozen accumulators updated in one reduce loop: some live in stack slots across the back edge."""
    n_acc, rows, cols = 24, 3, 11
    r = UOp.range(rows, 0, AxisType.GLOBAL)
    k = UOp.range(cols, 1, AxisType.REDUCE)
    src = UOp.param(1, dtypes.int32.ptr(rows * cols))
    x = src.index(r * cols + k).load()
    reds = [(x * (j + 1) + j).reduce(k, op=Ops.ADD) for j in range(n_acc)]
    total = reds[0]
    for j, red in enumerate(reds[1:]):
        total = total * 3 + red if j % 2 else total - red
    ast = _k("carried", UOp.param(0, dtypes.int32.ptr(rows)).index(r).store(total).end(r))
    vals = np.arange(rows * cols, dtype=np.int32) * 7 - 50
    spec = x86_program(ast)
    assert "rsp" in asm(spec) and "opts" not in asm(spec)
    check(ast, [np.zeros(rows, np.int32), vals], {})


def test_unsupported_dtype_names_op_dtype_and_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 4
    r = UOp.range(n, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float16.ptr(n)).index(r).load()
    ast = _k("halfk", UOp.param(0, dtypes.float16.ptr(n)).index(r).store(x).end(r))
    with pytest.raises(RuntimeError, match=r"LOAD.*half.*'halfk'"):
        x86_program(ast)
    # an UnsupportedOpError carrying op and dtype, raised before selection: a registry can take LLVM for the kernel
    from speck.codegen.pipeline import full_rewrite_to_sink
    from speck.codegen.renderer import UnsupportedOpError
    from speck.codegen.x86 import backend as x86_backend

    uops = full_rewrite_to_sink(ast, X86Renderer())
    selected: list[object] = []
    real_select = x86_backend.select
    monkeypatch.setattr(x86_backend, "select", lambda *a: selected.append(a) or real_select(*a))
    with pytest.raises(UnsupportedOpError) as err:
        X86Renderer().render(uops)
    assert (err.value.op, err.value.dtype.scalar()) == (Ops.LOAD, dtypes.float16) and selected == []


# ---------------------------------------------------------------------------------------------------------------------
# float32 vectors (the optimizer upcasts float32 outputs to 8 lanes)


def _vector_kernels() -> dict[str, tuple[UOp, list[np.ndarray]]]:
    g = np.random.default_rng(7)
    n = 64
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, b = UOp.param(1, dtypes.float32.ptr(n)), UOp.param(2, dtypes.float32.ptr(n))
    xa, xb = a.index(r).load(), b.index(r).load()
    va = g.normal(size=n).astype(np.float32) * 4
    vb = g.normal(size=n).astype(np.float32) * 4
    va[3], vb[5], va[9] = np.nan, np.inf, -0.0
    out = UOp.param(0, dtypes.float32.ptr(n))
    ew = (xa * xb + 1.5).alu(Ops.MAX, -xa) / (xb.alu(Ops.SQRT) + 2.0) + (xa < xb).where(xa.alu(Ops.TRUNC), xb)
    kernels = {
        "vec_elementwise": (_k("vec_ew", out.index(r).store(ew).end(r)), [np.zeros(n, np.float32), va, vb]),
        "vec_transcendental": (_k("vec_tr", out.index(r).store(xa.alu(Ops.EXP2) + xb.alu(Ops.SIN)
                                                                + xa.alu(Ops.LOG2)).end(r)),
                               [np.zeros(n, np.float32), va, vb]),
        "vec_casts": (_k("vec_cast", out.index(r).store(xa.cast(dtypes.int32).cast(dtypes.float32)
                                                          + xb.cast(dtypes.float64).cast(dtypes.float32)).end(r)),
                      [np.zeros(n, np.float32), va, vb]),
    }  # fmt: skip
    # RECIPROCAL becomes 1.0 / x: the literal must fill every lane
    kernels["vec_reciprocal"] = (_k("vec_rcp", out.index(r).store(xa.alu(Ops.RECIPROCAL) + xa).end(r)),
                                 [np.zeros(n, np.float32), va])  # fmt: skip
    # padded (gated) vector reads: in[i - 5] for i >= 5
    src = UOp.param(1, dtypes.float32.ptr(n))
    v = src.index((r - 5).valid((r < 5).logical_not())).load()
    kernels["vec_gated"] = (_k("vec_gated", out.index(r).store(v + 1.0).end(r)), [np.zeros(n, np.float32), va])
    # matmul: broadcast a[i, k] times a vector of b[k, j..j+7], accumulated in a ymm register
    m = 16
    i, j, k = UOp.range(m, 0, AxisType.GLOBAL), UOp.range(m, 1, AxisType.GLOBAL), UOp.range(m, 2, AxisType.REDUCE)
    ma = UOp.param(1, dtypes.float32.ptr(m * m)).index(i * m + k).load()
    mb = UOp.param(2, dtypes.float32.ptr(m * m)).index(k * m + j).load()
    mm = UOp.param(0, dtypes.float32.ptr(m * m)).index(i * m + j).store((ma * mb).reduce(k, op=Ops.ADD)).end(i, j)
    kernels["vec_matmul"] = (_k("vec_mm", mm), [np.zeros(m * m, np.float32), g.normal(size=m * m).astype(np.float32),
                                                  g.normal(size=m * m).astype(np.float32)])  # fmt: skip
    # row max: the reduce axis unrolled into vector lanes
    rr, kk = UOp.range(8, 0, AxisType.GLOBAL), UOp.range(64, 1, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(8 * 64)).index(rr * 64 + kk).load()
    rmax = UOp.param(0, dtypes.float32.ptr(8)).index(rr).store(x.reduce(kk, op=Ops.MAX)).end(rr)
    rows = g.normal(size=8 * 64).astype(np.float32)
    rows[70] = np.nan
    kernels["vec_rowmax"] = (_k("vec_rowmax", rmax), [np.zeros(8, np.float32), rows])
    return kernels


@pytest.mark.parametrize("name", sorted(_vector_kernels()))
def test_float32_vector_kernels(name: str) -> None:
    ast, inputs = _vector_kernels()[name]
    with Context(X86_AVX512=0):  # the xmm/ymm forms below, on an AVX-512 host too (test_x86_avx512*.py: zmm)
        spec = check(ast, inputs, {}, vs_ast=name != "vec_transcendental")
    assert re.search(r"\b[xy]mm\d+", asm(spec))
    if name in ("vec_elementwise", "vec_matmul"):
        assert "ymm" in asm(spec), "the optimizer should have upcast to 8 float32 lanes"


# ---------------------------------------------------------------------------------------------------------------------
# hand-built programs: shapes the AST corpus does not produce


def check_program(uops: list[UOp], inputs: list[np.ndarray], extent: int, nargs: int) -> str:
    """Render+compile a linear program, call it over [0, extent) (and in two slices), compare with run_program;
    returns the listing."""
    src = X86Renderer().render(uops)
    lib = X86Compiler().compile(src)
    want = [b.copy() for b in inputs]
    run_program(uops, want, {})
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int32, ctypes.c_int32)(
        link(lib, uops[-1].arg.name)
    )
    for slices in ([(0, extent)], [(0, extent // 2), (extent // 2, extent)]):
        got = [b.copy() for b in inputs]
        for lo, hi in slices:
            fn(*[g.ctypes.data for g in got], lo, hi)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    return X86Compiler().disassemble(lib)


def test_program_without_global_range_and_int64_ranges() -> None:
    from speck.uop import AddrSpace
    from test_render_clang_llvm_exec import alu, buf, cc, end, idx, linear, load, rng, store

    r = rng(cc(10, dtypes.int64), 0, AxisType.LOOP, dtypes.int64)
    acc = UOp(Ops.DEFINE_REG, dtypes.int64.ptr(1, AddrSpace.REG), (), 0)
    a0 = idx(acc, cc(0, dtypes.int32))
    init = store(a0, cc(0, dtypes.int64))
    upd = store(a0, alu(Ops.ADD, load(a0), alu(Ops.MUL, load(idx(buf(1, dtypes.int64, 10), r)), r)))
    out = store(idx(buf(0, dtypes.int64, 1), cc(0, dtypes.int32)), load(a0).replace(tag=("lin", 0)))
    uops = linear(acc, init, r, upd, end(upd, r), out, name="scalar_out")
    check_program(uops, [np.zeros(1, np.int64), np.arange(10, dtype=np.int64) * (2**60)], 1, 2)
    g = rng(cc(12, dtypes.int64), 0, AxisType.GLOBAL, dtypes.int64)
    st = store(idx(buf(0, dtypes.int64, 12), g), alu(Ops.MUL, g, g))
    src = check_program(linear(g, st, end(st, g), name="i64global"), [np.zeros(12, np.int64)], 12, 1)
    assert "movsxd" in src  # the int32 core_start/core_end widened for the int64 counter


@pytest.mark.parametrize("optimize", [False, True])
def test_tap_loops_bounded_by_their_gates(optimize: bool) -> None:
    """A transposed convolution over a virtually padded operand: the tap loops run to ends computed from the output
    row and column (speck.codegen.lower.gated_ranges), and the result is still the padded sum."""
    from test_gated_ranges import _bounded_loops, _inputs, reference, transposed_conv, wbuf

    n, c, o, h, w, k, pads = 2, 3, 4, 6, 5, 3, (2, 2)
    dy, wt = _inputs(n, c, o, h, w, k, seed=5)
    want = reference(dy, wt, k, pads)
    ast = transposed_conv(n, c, o, h, w, k, pads)
    spec = check(ast, [np.zeros(want.size, np.float32), dy.ravel(), wbuf(wt)], {}, optimize=optimize)
    assert _bounded_loops(spec.uops) >= 1
    got = run_x86(spec, [np.zeros(want.size, np.float32), dy.ravel(), wbuf(wt)], {})[0]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
