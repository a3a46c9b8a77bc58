"""Lowering preserves meaning: the interpreter's result on a kernel AST equals its result on the lowered program,
for every optimizer setting tried; every program passes spec_program and contains only casted consts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codegen_helpers import assert_same, out_dtype, run_ast, run_prog
from codegen_strategies import kernel_asts
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer import Renderer
from speck.codegen.renderer.python import PythonRenderer, run_python
from speck.uop import Context, GroupOp, Ops, UOp, dtypes
from speck.uop.spec import spec_program, type_verify


class ScalarRenderer(Renderer):
    """A renderer without vectors, half arithmetic or transcendental ops: forces devectorize and decompositions."""

    name = "scalar-test"
    supported_ops = GroupOp.ALU - {Ops.THREEFRY, Ops.POW, Ops.MULACC}


def check_program_form(uops: list[UOp]) -> None:
    type_verify(uops, spec_program)
    users: dict[UOp, list[UOp]] = {}
    for u in uops:
        for s in u.src:
            users.setdefault(s, []).append(u)
    for u in uops:
        if u.op is Ops.CONST:
            assert u.dtype == dtypes.from_py(u.arg), f"inner CONST {u.arg!r} has dtype {u.dtype}"
            assert all(x.op is Ops.CAST for x in users.get(u, [])), "bare CONST in a program"
        assert u.op is Ops.CONST or not u.dtype.is_weak, f"weak dtype on {u.op}"
    depth = 0
    for u in uops:
        depth += (u.op is Ops.RANGE) - (u.op is Ops.END)
        assert depth >= 0
    assert depth == 0 and uops[-1].op is Ops.SINK


@given(kernel_asts())
def test_unoptimized_lowering_matches_ast(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    expected = run_ast(ast, inputs, var_vals)
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, PythonRenderer(), optimize=False)
    check_program_form(uops)
    assert_same(expected, run_prog(uops, inputs, var_vals), out_dtype(ast), exact=True)


@given(kernel_asts(max_depth=2))
def test_scalar_renderer_lowering_matches_ast(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    expected = run_ast(ast, inputs, var_vals)
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, ScalarRenderer(), optimize=False)
    check_program_form(uops)
    # half arithmetic is computed in float32 here and rounded once per op, which can differ from native half
    exact = out_dtype(ast) not in (dtypes.float16,) and not any(u.dtype.scalar() == dtypes.float16
                                                               for u in ast.toposort())  # fmt: skip
    assert_same(expected, run_prog(uops, inputs, var_vals), out_dtype(ast), exact=exact)


@given(kernel_asts(max_depth=2))
def test_python_renderer_source_runs_like_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    r = PythonRenderer()
    uops = full_rewrite_to_sink(ast, r, optimize=True)  # heuristic opts: vector code paths too
    want = run_prog(uops, inputs, var_vals)
    bufs = [b.copy() for b in inputs]
    run_python(r.render(uops), uops, bufs, var_vals)
    np.testing.assert_array_equal(want, bufs[0])


@given(kernel_asts(max_depth=2, allow_vars=False))
def test_core_range_slices_compose(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    """Running the outermost global range in slices (as CPU workers do) gives the same result as one call."""
    ast, inputs, var_vals = case
    uops = full_rewrite_to_sink(ast, PythonRenderer(), optimize=False)
    want = run_prog(uops, inputs, var_vals)
    bufs = [b.copy() for b in inputs]
    for lo in range(0, 8, 3):
        from speck.codegen.interpret import run_program

        run_program(uops, bufs, var_vals, core_range=(lo, lo + 3))
    np.testing.assert_array_equal(want, bufs[0])


def test_bad_ast_names_node_and_stage() -> None:
    from speck.codegen.kernel_info import KernelInfo

    buf = UOp.param(0, dtypes.float32.ptr(4))
    bad = UOp.sink(buf.index(UOp.const(dtypes.weakint, 0)).load().reshape((1,)), arg=KernelInfo("bad"))
    with pytest.raises(RuntimeError, match=r"stage 'verify_ast'.*RESHAPE"):
        full_rewrite_to_sink(bad, PythonRenderer())


def _with_opts(ast: UOp, opts: tuple) -> UOp:  # type: ignore[type-arg]
    return ast.replace(arg=ast.arg.replace(opts=opts))


@given(kernel_asts(max_depth=2))
def test_heuristic_optimized_lowering_matches_ast(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    expected = run_ast(ast, inputs, var_vals)
    for r in (PythonRenderer(), ScalarRenderer()):
        with Context(SPEC=1):
            uops = full_rewrite_to_sink(ast, r, optimize=True)
        check_program_form(uops)
        assert_same(expected, run_prog(uops, inputs, var_vals), out_dtype(ast), exact=False)


@given(kernel_asts(max_depth=2, allow_vars=False), st.data())
def test_random_opts_lowering_matches_ast(
    case: tuple[UOp, list[np.ndarray], dict[str, int]], data: st.DataObject
) -> None:
    from hypothesis import assume

    from speck.codegen.lower.simplify import pm_simplify
    from speck.codegen.opt import OptError, apply_opts, opt_base
    from speck.codegen.opt.search import candidate_actions
    from speck.uop import graph_rewrite

    ast, inputs, var_vals = case
    cur = opt_base(graph_rewrite(ast, pm_simplify))
    opts: tuple = ()  # type: ignore[type-arg]
    for _ in range(data.draw(st.integers(1, 3))):
        acts = candidate_actions(cur)
        if not acts:
            break
        a = data.draw(st.sampled_from(acts))
        try:
            cur = apply_opts(cur, (a,))
        except OptError:
            continue
        opts += (a,)
    assume(opts)
    expected = run_ast(ast, inputs, var_vals)
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(_with_opts(ast, opts), PythonRenderer())
    check_program_form(uops)
    assert tuple(uops[-1].arg.applied_opts) == opts
    assert_same(expected, run_prog(uops, inputs, var_vals), out_dtype(ast), exact=False)


def test_index_cast_to_a_value_expands_to_vector_ops() -> None:
    """A counter made from the loop index (a random draw, an arange) is a vector once cast to a value type: the
    hash computed from it is vector ops (8 lanes at once), not eight scalar chains."""
    from speck.codegen.kernel_info import KernelInfo
    from speck.codegen.lower.expander import expand_vectors
    from speck.codegen.opt import Opt, OptOps, apply_opts
    from speck.uop import AxisType

    n = 64
    i = UOp.range(n, 0, AxisType.GLOBAL)
    key = UOp.param(1, dtypes.uint64.ptr(1)).index(UOp.const(dtypes.weakint, 0)).load()
    bits = UOp(Ops.THREEFRY, dtypes.uint64, (i.cast(dtypes.uint64), key))
    val = (bits >> UOp.const(dtypes.uint64, 40)).cast(dtypes.float32) * UOp.const(dtypes.float32, 0.5)
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(i).store(val).end(i), arg=KernelInfo(name="draw"))
    expanded = expand_vectors(apply_opts(ast, [Opt(OptOps.UPCAST, 0, 8)]))
    fry = [u for u in expanded.toposort() if u.op is Ops.THREEFRY]
    assert [u.dtype.count for u in fry] == [8], "one 8-lane threefry, not one per lane"
    inputs = [np.zeros(n, np.float32), np.array([0x1234_5678_9ABC_DEF0], np.uint64)]
    want = run_ast(ast, inputs, {})
    got = run_prog(full_rewrite_to_sink(ast.replace(arg=KernelInfo(name="draw", opts=(Opt(OptOps.UPCAST, 0, 8),))),
                                        Renderer()), inputs, {})  # fmt: skip
    np.testing.assert_array_equal(got, want)
