"""to_program / ProgramSpec: launch sizes, buffer roles, variables, estimates, error messages, and golden listings
of the linear program for small kernels (the order renderers see)."""

from __future__ import annotations

import numpy as np
import pytest

from speck.codegen import KernelInfo, PythonRenderer, UnsupportedOpError, run_program, to_program
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer import Renderer
from speck.codegen.renderer.python import run_python
from speck.uop import AxisType, GroupOp, Ops, UOp, dtypes


def listing(uops: list[UOp]) -> str:
    pos = {u: i for i, u in enumerate(uops)}
    lines = []
    for i, u in enumerate(uops):
        arg = "" if u.arg is None or u.op is Ops.SINK else f" {u.arg}"
        srcs = " ".join(f"%{pos[s]}" for s in u.src)
        lines.append(f"%{i} {u.op.name} {u.dtype.short_name if u.dtype.count == 1 else u.dtype}{arg} {srcs}".rstrip())
    return "\n".join(lines)


def scale_kernel() -> UOp:
    i = UOp.range(10, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(10)).index(i).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(10)).index(i).store(x * UOp.const(dtypes.float32, 3.0)).end(i),
                    arg=KernelInfo("scale"))  # fmt: skip


GOLDEN_SCALE = """\
%0 PARAM float 0
%1 PARAM float 1
%2 CONST weakint 10
%3 CAST int %2
%4 CONST weakfloat 3.0
%5 CAST float %4
%6 RANGE int (0, AxisType.GLOBAL) %3
%7 INDEX float %0 %6
%8 INDEX float %1 %6
%9 LOAD float %8
%10 MUL float %9 %5
%11 STORE void %7 %10
%12 END void %11 %6
%13 SINK void %12"""


def test_golden_scalar_program() -> None:
    assert listing(full_rewrite_to_sink(scale_kernel(), Renderer())) == GOLDEN_SCALE


def rowsum_kernel() -> UOp:
    r, c = UOp.range(3, 0, AxisType.GLOBAL), UOp.range(4, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.int32.ptr(12)).index(r * 4 + c).load()
    return UOp.sink(UOp.param(0, dtypes.int32.ptr(3)).index(r).store(m.reduce(c, op=Ops.MAX)).end(r),
                    arg=KernelInfo("rowmax"))  # fmt: skip


GOLDEN_ROWMAX = """\
%0 PARAM int 0
%1 PARAM int 1
%2 CONST weakint 3
%3 CAST int %2
%4 DEFINE_REG int 0
%5 CONST weakint 0
%6 CAST int %5
%7 CONST weakint -2147483648
%8 CAST int %7
%9 CONST weakint 4
%10 CAST int %9
%11 RANGE int (0, AxisType.GLOBAL) %3
%12 INDEX int %0 %11
%13 INDEX int %4 %6
%14 STORE void %13 %8
%15 MUL int %11 %10
%16 RANGE int (1, AxisType.REDUCE) %10
%17 INDEX int %4 %6
%18 LOAD int %17
%19 ADD int %15 %16
%20 INDEX int %1 %19
%21 LOAD int %20
%22 MAX int %18 %21
%23 STORE void %17 %22
%24 END void %23 %16
%25 INDEX int %4 %6
%26 LOAD int %25
%27 STORE void %12 %26
%28 END void %27 %11
%29 SINK void %28"""


def test_golden_reduce_program() -> None:
    """identity stored before the reduce loop, load+max+store inside, load after its END."""
    uops = full_rewrite_to_sink(rowsum_kernel(), Renderer())
    assert listing(uops) == GOLDEN_ROWMAX
    m = np.arange(12, dtype=np.int32)[::-1].copy()
    out = np.zeros(3, np.int32)
    run_program(uops, [out, m], {})
    np.testing.assert_array_equal(out, m.reshape(3, 4).max(axis=1))


def test_program_spec_fields() -> None:
    n = UOp.variable("n", 1, 64)
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(64)).index(i).load()
    io = UOp.param(0, dtypes.float32.ptr(64))
    ast = UOp.sink(io.index(i).store(io.index(i).load() + a).end(i), arg=KernelInfo("acc_n", dont_opt=True))
    p = to_program(ast, PythonRenderer())
    assert p.name == "acc_n" and p.renderer == "python" and p.lib is None and p.local_size is None
    assert [(b.slot, b.dtype, b.size, b.role) for b in p.buffers] == [(0, dtypes.float32, 64, "inout"),
                                                                      (1, dtypes.float32, 64, "in")]  # fmt: skip
    assert [v.arg for v in p.vars] == [("n", 1, 64)] and p.vars[0].dtype == dtypes.int32
    assert p.launch_dims({"n": 37}) == (37, 1, 1)
    from speck.uop.symbolic import sym_infer

    assert sym_infer(p.estimates.mem, {"n": 37}) == 37 * 3 * 4  # two loads and a store of float32
    assert sym_infer(p.estimates.ops, {"n": 37}) == 37  # one ADD per element
    assert "def acc_n(rt):" in p.src


def test_renderer_names_op_dtype_and_itself() -> None:
    class NoSqrt(Renderer):
        name = "nosqrt"
        supported_ops = GroupOp.ALU - {Ops.SQRT}

    with pytest.raises(UnsupportedOpError, match=r"'nosqrt' cannot express SQRT on dtypes.float;"):
        _sqrt_prog(NoSqrt())


def _sqrt_prog(r: Renderer) -> list[UOp]:
    i = UOp.range(4, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(4)).index(i).load().sqrt()
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(4)).index(i).store(x).end(i), arg=KernelInfo("s"))
    return full_rewrite_to_sink(ast, r)


def test_two_reduces_over_one_range_get_their_own_loops() -> None:
    r, c = UOp.range(3, 0, AxisType.GLOBAL), UOp.range(5, 1, AxisType.REDUCE)
    m = UOp.param(1, dtypes.float32.ptr(15)).index(r * 5 + c).load()
    v = m.reduce(c, op=Ops.ADD) * m.reduce(c, op=Ops.MAX)
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(3)).index(r).store(v).end(r), arg=KernelInfo("two"))
    uops = full_rewrite_to_sink(ast, Renderer())
    assert sum(u.op is Ops.RANGE for u in uops) == 3
    x = np.random.default_rng(1).standard_normal(15).astype(np.float32)
    out = np.zeros(3, np.float32)
    run_program(uops, [out, x], {})
    np.testing.assert_allclose(out, x.reshape(3, 5).sum(1) * x.reshape(3, 5).max(1), rtol=1e-6)


def test_debug_prints_every_stage_name(capsys: pytest.CaptureFixture[str]) -> None:
    from speck.uop import Context

    with Context(DEBUG=3):
        full_rewrite_to_sink(rowsum_kernel(), PythonRenderer())
    out = capsys.readouterr().out
    for stage in ("simplify", "apply_opts", "expand", "lower_reduce", "devectorize", "explicit_gates",
                  "decompositions", "lower_index_dtype", "casted_consts", "linearize"):  # fmt: skip
        assert f"stage {stage}" in out, stage


def test_compiler_bytes_land_in_lib() -> None:
    class FakeCompiler:
        def compile(self, src: str) -> bytes:
            return src.encode()[:16]

    p = to_program(scale_kernel(), PythonRenderer(), FakeCompiler())
    assert p.lib == p.src.encode()[:16]


@pytest.mark.parametrize("which", ["dup_axis", "index_non_param", "end_non_range"])
def test_convention_errors_name_node_and_stage(which: str) -> None:
    buf = UOp.param(0, dtypes.float32.ptr(8))
    i = UOp.range(8, 0, AxisType.GLOBAL)
    if which == "dup_axis":
        j = UOp.range(4, 0, AxisType.REDUCE)
        val = buf.index(j).load().reduce(j, op=Ops.ADD)
        ast, node = UOp.sink(buf.index(i).store(val).end(i), arg=KernelInfo("bad")), "RANGE"
    elif which == "index_non_param":
        ast, node = UOp.sink(UOp.const(dtypes.float32, 1.0).index(i).store(1.0).end(i), arg=KernelInfo("bad")), "INDEX"
    else:
        ast, node = UOp.sink(UOp(Ops.END, dtypes.void, (buf.index(i).store(1.0), UOp.const(dtypes.weakint, 3)))), "END"
    with pytest.raises(RuntimeError, match=rf"stage 'verify_ast'\): node {node}"):
        full_rewrite_to_sink(ast, PythonRenderer())


def test_estimates_of_a_loop_bounded_by_an_outer_index_are_upper_bounds() -> None:
    """A loop whose end depends on an enclosing loop's index (bounded tap loops) counts its largest trip count: the
    estimate is a plain number (it needs no loop index to evaluate) and bounds the real work from above."""
    i = UOp.range(8, 0, AxisType.GLOBAL)
    j = UOp.range(i + 1, 1, AxisType.LOOP)
    x = UOp.param(1, dtypes.float32.ptr(8)).index(j).load()
    out = UOp.param(0, dtypes.float32.ptr(64))
    ast = UOp.sink(out.index(i * 8 + j).store(x + UOp.const(dtypes.float32, 1.0)).end(i, j),
                   arg=KernelInfo("tri", dont_opt=True))  # fmt: skip
    p = to_program(ast, PythonRenderer())
    assert isinstance(p.estimates.ops, int) and isinstance(p.estimates.mem, int)
    real_stores = sum(k + 1 for k in range(8))  # 36 (load, store) pairs
    assert real_stores * 8 <= p.estimates.mem <= 8 * 8 * 8  # 4 bytes loaded + 4 stored per pair; at most 8 x 8 pairs
    assert real_stores <= p.estimates.ops <= 8 * 8 * 4  # the ADD, plus index arithmetic, per pair
    ref = np.zeros((8, 8), np.float32)
    for k in range(8):
        ref[k, : k + 1] = np.arange(k + 1) + 1
    # both numpy executors run the outer range index by index here (a batch has one trip count per loop), each
    # worker slice covering only its own rows
    for run in (run_program, lambda uops, bufs, vv, cr: run_python(p.src, uops, bufs, vv, cr)):
        buf = np.zeros(64, np.float32)
        for core_range in ((0, 3), (3, 8)):
            run(p.uops, [buf, np.arange(8, dtype=np.float32)], {}, core_range)
        np.testing.assert_array_equal(buf.reshape(8, 8), ref)


@pytest.mark.parametrize("was_on", [True, False])
def test_gc_paused_nests_and_restores_the_collector_once(was_on: bool) -> None:
    """A batch of kernels lowered inside one gc_paused() block keeps the collector off across all of them (each
    to_program's own block is nested, so it must not turn collection back on), and the outermost block restores
    what it found."""
    import gc

    from speck.codegen.program import gc_paused

    before = gc.isenabled()
    (gc.enable if was_on else gc.disable)()
    try:
        with gc_paused():
            assert not gc.isenabled()
            spec = to_program(scale_kernel(), PythonRenderer())  # pauses and resumes inside
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() == was_on
        assert spec.src
    finally:
        (gc.enable if before else gc.disable)()


def test_a_pause_that_leaves_many_objects_moves_them_to_the_oldest_generation_at_once() -> None:
    """When the outermost pause ends with many allocations pending, the young survivors are collected in one pass
    that leaves both younger generations empty (the collector on its own would walk them once in each)."""
    import gc

    from speck.codegen import program

    before = gc.isenabled()
    gc.enable()
    try:
        with program.gc_paused():
            keep = [[i] for i in range(2 * program._YOUNG_MANY)]  # tracked objects that stay alive
        assert gc.get_count()[0] < program._YOUNG_MANY and gc.get_count()[1] == 0
        assert len(keep) == 2 * program._YOUNG_MANY
    finally:
        (gc.enable if before else gc.disable)()


@pytest.mark.parametrize("shape", [(10,), (37, 5), (3, 4, 8)])
def test_gpu_program_estimates_count_every_work_item(shape: tuple[int, ...]) -> None:
    """A GPU program's global/local ranges are SPECIAL ids, not loops: its ops and memory estimates (what
    GlobalCounters.global_ops/global_mem add per run) are those of the whole launch, equal to the CPU program's (they
    counted one work-item's: a 10-element kernel estimated 1 op)."""
    from speck.codegen.renderer.amdgpu import AMDGPURenderer

    n = int(np.prod(shape))
    rngs = [UOp.range(s, i, AxisType.GLOBAL) for i, s in enumerate(shape)]
    flat = rngs[0]
    for r, s in zip(rngs[1:], shape[1:]):
        flat = flat * s + r
    x = UOp.param(1, dtypes.float32.ptr(n)).index(flat).load()
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(flat).store(x * UOp.const(dtypes.float32, 3.0) + x)
                   .end(*rngs), arg=KernelInfo("scale_add"))  # fmt: skip
    cpu, gpu = to_program(ast, PythonRenderer()), to_program(ast, AMDGPURenderer())
    assert any(u.op is Ops.SPECIAL for u in gpu.uops)
    assert cpu.estimates.ops == 2 * n and cpu.estimates.mem == 8 * n
    assert (gpu.estimates.ops, gpu.estimates.mem, gpu.estimates.lds) == (2 * n, 8 * n, 4 * n)
