"""The optimizer: opts apply or fail clearly, the CPU heuristic vectorizes contiguous axes, BEAM search picks the
candidate the runtime's timer prefers and caches the winner on disk."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_helpers import assert_same, out_dtype, run_ast, run_prog
from speck.codegen import KernelInfo, PythonRenderer, to_program
from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.opt import Opt, OptError, OptOps, apply_opts, beam_search, hand_coded_optimizations, opt_base
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.program import ProgramSpec
from speck.codegen.renderer import Renderer
from speck.uop import AxisType, Context, Ops, UOp, dtypes


def matvec(n: int = 32, k: int = 16, name: str = "matvec") -> UOp:
    i, j = UOp.range(n, 0, AxisType.GLOBAL), UOp.range(k, 1, AxisType.REDUCE)
    a = UOp.param(1, dtypes.float32.ptr(n * k)).index(i * k + j).load()
    b = UOp.param(2, dtypes.float32.ptr(k)).index(j).load()
    out = UOp.param(0, dtypes.float32.ptr(n))
    return UOp.sink(out.index(i).store((a * b).reduce(j, op=Ops.ADD)).end(i), arg=KernelInfo(name))


def inputs(n: int = 32, k: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.zeros(n, np.float32), rng.standard_normal(n * k).astype(np.float32),
            rng.standard_normal(k).astype(np.float32)]  # fmt: skip


def test_heuristic_upcasts_contiguous_output_to_vector_width() -> None:
    opts = hand_coded_optimizations(matvec(), PythonRenderer())
    assert opts == [Opt(OptOps.UPCAST, 0, 8)]  # 8 float32 lanes fill a 256-bit register


def test_heuristic_unrolls_reduce_when_output_is_scalar() -> None:
    j = UOp.range(64, 0, AxisType.REDUCE)
    v = UOp.param(1, dtypes.float32.ptr(64)).index(j).load().reduce(j, op=Ops.ADD)
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(1)).index(UOp.const(dtypes.weakint, 0)).store(v),
                   arg=KernelInfo("sum"))  # fmt: skip
    assert hand_coded_optimizations(ast, PythonRenderer()) == [Opt(OptOps.UNROLL, 0, 8)]
    buf = [np.zeros(1, np.float32), np.arange(64, dtype=np.float32)]
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, PythonRenderer())
    assert any(u.op is Ops.LOAD and u.dtype.count == 8 for u in uops)
    assert run_prog(uops, buf, {})[0] == np.arange(64).sum()


def test_no_vectors_means_no_upcast() -> None:
    assert hand_coded_optimizations(matvec(), Renderer()) == []


@pytest.mark.parametrize(
    "opts",
    [(Opt(OptOps.UPCAST, 0, 4),), (Opt(OptOps.UNROLL, 0, 4),), (Opt(OptOps.THREAD, 0, 4),),
     (Opt(OptOps.UPCAST, 0, 16),), (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 2)),
     (Opt(OptOps.PADTO, 0, 5),), (Opt(OptOps.NOLOCALS),)],
)  # fmt: skip
def test_explicit_opts_preserve_results(opts: tuple[Opt, ...]) -> None:
    ast = matvec()
    want = run_ast(ast, inputs(), {})
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast.replace(arg=ast.arg.replace(opts=opts)), PythonRenderer())
    assert uops[-1].arg.applied_opts == opts
    assert_same(want, run_prog(uops, inputs(), {}), out_dtype(ast), exact=False)


def test_thread_opt_makes_a_new_outermost_global() -> None:
    ast = matvec()
    prog = to_program(ast.replace(arg=ast.arg.replace(opts=(Opt(OptOps.THREAD, 0, 4),))), PythonRenderer())
    assert prog.global_size[0] == 4


@pytest.mark.parametrize(
    "opt,match",
    [(Opt(OptOps.UPCAST, 0, 5), "does not split"), (Opt(OptOps.UPCAST, 3, 2), "out of range"),
     (Opt(OptOps.LOCAL, 0, 4), "local memory"), (Opt(OptOps.UNROLL, 1, 2), "out of range")],
)  # fmt: skip
def test_bad_opts_raise_opt_error(opt: Opt, match: str) -> None:
    with pytest.raises(OptError, match=match):
        apply_opts(matvec(), (opt,), PythonRenderer())


def test_beam_picks_what_the_timer_prefers_and_caches(tmp_path: pytest.TempPathFactory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    calls: list[tuple[Opt, ...]] = []

    def timer(p: ProgramSpec) -> float:
        # a fake device that likes 4-wide upcasts of the output and dislikes everything else
        calls.append(p.applied_opts)
        return 1.0 - 0.5 * (Opt(OptOps.UPCAST, 0, 4) in p.applied_opts) + 0.01 * len(p.applied_opts)

    def kernel_timer(ast: UOp) -> float:  # what to_program builds from a ProgramSpec timer
        return timer(to_program(ast, PythonRenderer()))

    best = beam_search(matvec(name="beamk"), PythonRenderer(), 2, timer=kernel_timer)
    assert best == (Opt(OptOps.UPCAST, 0, 4),)
    assert len(calls) > 1
    n = len(calls)
    assert beam_search(matvec(name="beamk"), PythonRenderer(), 2, timer=kernel_timer) == best
    assert len(calls) == n  # second search answered from the disk cache
    with Context(BEAM=2):
        prog = to_program(matvec(name="beamk"), PythonRenderer(), beam_timer=timer)
    assert prog.applied_opts == best
    with Context(BEAM=2):  # without a timer to measure with, BEAM leaves the choice to the heuristic
        assert to_program(matvec(name="beamk2"), PythonRenderer()).applied_opts == tuple(
            hand_coded_optimizations(opt_base(matvec(name="beamk2")), PythonRenderer())
        )


def _ew3(broadcast: bool) -> UOp:
    a0, a1, a2 = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(6, 1, AxisType.GLOBAL), UOp.range(10, 2, AxisType.GLOBAL)
    idx = a0 * 60 + a1 * 10 + a2
    x = UOp.param(1, dtypes.float32.ptr(240)).index(idx).load()
    y = UOp.param(2, dtypes.float32.ptr(240)).index(a2 if broadcast else idx).load()
    out = UOp.param(0, dtypes.float32.ptr(240))
    return UOp.sink(out.index(idx).store(x * y).end(a0, a1, a2), arg=KernelInfo(f"ew3_{broadcast}"))


@pytest.mark.parametrize("broadcast,ranges", [(False, 1), (True, 2)])
def test_contiguous_ranges_merge_only_when_exact(broadcast: bool, ranges: int) -> None:
    from speck.codegen.opt import merge_ranges

    ast = _ew3(broadcast)
    merged = merge_ranges(ast)
    assert len([u for u in merged.toposort() if u.op is Ops.RANGE]) == ranges
    rng = np.random.default_rng(3)
    bufs = [np.zeros(240, np.float32), rng.standard_normal(240).astype(np.float32),
            rng.standard_normal(240).astype(np.float32)]  # fmt: skip
    want = run_ast(ast, bufs, {})
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, PythonRenderer())
    np.testing.assert_array_equal(want, run_prog(uops, bufs, {}))


def _channel_sum(pooled: bool) -> UOp:
    """(N=3, C=4, H=6, W=6) summed over N, H, W per channel; pooled also reads a 2x2-pooled (3, 4, 3, 3) operand."""
    c = UOp.range(4, 0, AxisType.GLOBAL)
    n, h, w = UOp.range(3, 1, AxisType.REDUCE), UOp.range(6, 2, AxisType.REDUCE), UOp.range(6, 3, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(432)).index(n * 144 + c * 36 + h * 6 + w).load()
    if pooled:
        x = x * UOp.param(2, dtypes.float32.ptr(108)).index(n * 36 + c * 9 + (h // 2) * 3 + w // 2).load()
    out = UOp.param(0, dtypes.float32.ptr(4))
    return UOp.sink(out.index(c).store(x.reduce(n, h, w, op=Ops.ADD)).end(c), arg=KernelInfo(f"csum_{pooled}"))


@pytest.mark.parametrize("pooled,reduce_ranges", [(False, 2), (True, 3)])
def test_reduce_ranges_merge_only_when_exact(pooled: bool, reduce_ranges: int) -> None:
    """A per-channel sum's rows and columns merge into one contiguous run (it then vectorizes); reading a pooled
    operand through h // 2 and w // 2 keeps them apart. Both compute the same sums as the unmerged kernel."""
    from speck.codegen.opt import merge_ranges

    ast = _channel_sum(pooled)
    merged = merge_ranges(ast)
    red = [u for u in merged.toposort() if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE]
    assert len(red) == reduce_ranges
    rng = np.random.default_rng(4)
    bufs = [np.zeros(4, np.float32), rng.standard_normal(432).astype(np.float32),
            rng.standard_normal(108).astype(np.float32)]  # fmt: skip
    if not pooled:
        bufs = bufs[:2]
    want = run_ast(ast, bufs, {})
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, PythonRenderer())
    np.testing.assert_allclose(run_prog(uops, bufs, {}), want, rtol=1e-5, atol=1e-5)


def _on_spec(timer):  # type: ignore[no-untyped-def]
    """A kernel timer from a ProgramSpec timer (as to_program(..., beam_timer=timer) makes one)."""
    return lambda ast: timer(to_program(ast, PythonRenderer()))


def test_beam_keeps_the_heuristic_when_nothing_beats_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    renderer = PythonRenderer()
    heuristic = tuple(hand_coded_optimizations(opt_base(matvec(name="beamh")), renderer))
    assert heuristic, "the heuristic should optimize a matvec"

    def timer(p: ProgramSpec) -> float:  # a device on which only the heuristic's choice is fast
        return 0.1 if p.applied_opts == heuristic else 1.0

    assert beam_search(matvec(name="beamh"), renderer, 3, timer=_on_spec(timer)) == heuristic


def test_beam_search_stops_at_its_time_budget(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    calls: list[tuple[Opt, ...]] = []

    def timer(p: ProgramSpec) -> float:
        calls.append(p.applied_opts)
        return 1.0

    with Context(BEAM_TIMEOUT=0.0):
        beam_search(matvec(name="beamt"), PythonRenderer(), 4, timer=_on_spec(timer))
    assert len(calls) <= 2  # only the start candidates (no opts, the heuristic's) were timed


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'[["UPCAST", 0]]', b"\x00\xff" * 10, b'"x"'])
def test_a_corrupt_beam_cache_entry_is_a_miss(tmp_path, monkeypatch, garbage: bytes) -> None:  # type: ignore[no-untyped-def]
    from speck.codegen.cache.store import encode_entry
    from speck.codegen.opt.search import BEAM_CACHE, cache_key

    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    ast, renderer = matvec(name="beamc"), PythonRenderer()
    timer = lambda p: 1.0 - 0.5 * (Opt(OptOps.UPCAST, 0, 4) in p.applied_opts)
    best = beam_search(ast, renderer, 2, timer=_on_spec(timer))
    key = cache_key(ast, renderer, 2, "")
    BEAM_CACHE.path(key).write_bytes(garbage)
    with pytest.warns(UserWarning):  # a damaged file: a miss, said once
        assert beam_search(ast, renderer, 2, timer=_on_spec(timer)) == best
    BEAM_CACHE.path(key).write_bytes(encode_entry(key, garbage, version=2))  # intact entry whose content isn't opts
    assert beam_search(ast, renderer, 2, timer=_on_spec(timer)) == best  # searched again, not misread
    assert beam_search(ast, renderer, 2, timer=lambda k: 1 / 0) == best  # and the rewritten entry is healthy


def test_ignore_beam_cache_searches_again(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    calls: list[int] = []

    def timer(p: ProgramSpec) -> float:
        calls.append(1)
        return 1.0

    beam_search(matvec(name="beami"), PythonRenderer(), 2, timer=_on_spec(timer))
    n = len(calls)
    with Context(IGNORE_BEAM_CACHE=1):
        beam_search(matvec(name="beami"), PythonRenderer(), 2, timer=_on_spec(timer))
    assert len(calls) == 2 * n


def test_a_gated_store_whose_upcast_lane_is_never_valid_is_dropped() -> None:
    # out[r] = 2r everywhere and side[r] = r + 1 only for r < 3: upcast by 4, the gate of side's lane 3 folds to false
    # and its store must vanish (an INDEX left with a bare Invalid used to reach index lowering and fail there)
    r = UOp.range(4, 0, AxisType.GLOBAL)
    out, side = UOp.param(0, dtypes.int32.ptr(4)), UOp.param(1, dtypes.int32.ptr(4))
    ri = r.cast(dtypes.int32)
    ast = UOp.sink(out.index(r).store(ri * 2).end(r), side.index(r.valid(r < 3)).store(ri + 1).end(r),
                   arg=KernelInfo("gated"))  # fmt: skip
    bufs = [np.zeros(4, np.int32), np.full(4, 9, np.int32)]
    eval_ast(ast, bufs, {})
    assert bufs[1].tolist() == [1, 2, 3, 9]
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast.replace(arg=ast.arg.replace(opts=(Opt(OptOps.UPCAST, 0, 4),))),
                                    PythonRenderer())  # fmt: skip
    bufs = [np.zeros(4, np.int32), np.full(4, 9, np.int32)]
    run_program(uops, bufs, {})
    assert bufs[0].tolist() == [0, 2, 4, 6] and bufs[1].tolist() == [1, 2, 3, 9]
