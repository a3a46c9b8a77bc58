"""Reduction loops bounded by their gates (speck.codegen.lower.gated_ranges): a transposed convolution over a
virtually padded operand sums only the taps that read real elements. Results are compared with a numpy reference
(the scatter form of the transposed convolution) through the interpreter and the C and LLVM renderers, and the
lowered program must show the bounded loops; reductions the rewrite must not touch keep their constant loops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codegen_helpers import run_prog
from speck.codegen import KernelInfo, PythonRenderer
from speck.codegen.lower.gated_ranges import tighten_gated_reductions
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, Ops, UOp, dtypes
from test_render_clang_llvm_exec import check_program


def transposed_conv(n: int, c: int, o: int, h: int, w: int, k: int, pads: tuple[int, int], lower_form: int = 0,
                    op: Ops = Ops.ADD, alt: float = 0.0) -> UOp:  # fmt: skip
    """out[n, o, y, x] = sum over (c, ky, kx) of pad(dy)[n, c, y + ky, x + kx] * w[c, o, ky, kx], with dy padded by
    pads=(before, after) along both spatial axes and never materialized: the load is gated along y and x."""
    lo, hi = pads
    oh, ow = h + lo + hi - k + 1, w + lo + hi - k + 1
    rn, ro, ry, rx = (UOp.range(s, i, AxisType.GLOBAL) for i, s in enumerate((n, o, oh, ow)))
    rc, rky, rkx = (UOp.range(s, 4 + i, AxisType.REDUCE) for i, s in enumerate((c, k, k)))
    py, px = ry + rky, rx + rkx

    def inside(p: UOp, size: int) -> UOp:
        above = (p < lo).logical_not() if lower_form == 0 else (UOp.const(dtypes.weakint, lo - 1) < p)
        return above & (p < lo + size)

    didx = (rn * (c * h * w) + rc * (h * w) + (py - lo) * w + (px - lo)).valid(inside(py, h) & inside(px, w))
    dy = UOp.param(1, dtypes.float32.ptr(n * c * h * w)).index(didx)
    dyv = dy.load() if alt == 0.0 else UOp(Ops.LOAD, dtypes.float32, (dy, UOp.const(dtypes.float32, alt)))
    # channel-last weights (c, ky, kx, o), as speck.tensor lays them out for a convolution
    wv = UOp.param(2, dtypes.float32.ptr(c * o * k * k)).index(rc * (k * k * o) + rky * (k * o) + rkx * o + ro).load()
    red = (dyv * wv).reduce(rc, rky, rkx, op=op)
    out = UOp.param(0, dtypes.float32.ptr(n * o * oh * ow)).index(rn * (o * oh * ow) + ro * (oh * ow) + ry * ow + rx)
    return UOp.sink(out.store(red).end(rn, ro, ry, rx), arg=KernelInfo(name="tconv"))


def reference(dy: np.ndarray, w: np.ndarray, k: int, pads: tuple[int, int], alt: float = 0.0) -> np.ndarray:
    """The transposed convolution as a sum of shifted channel mixes over the explicitly padded operand."""
    padded = np.pad(dy.astype(np.float64), ((0, 0), (0, 0), pads, pads), constant_values=alt)
    n, _, hp, wp = padded.shape
    oh, ow = hp - k + 1, wp - k + 1
    terms = np.stack([np.einsum("nchw,co->nohw", padded[:, :, ky:ky + oh, kx:kx + ow], w[:, :, ky, kx])
                      for ky in range(k) for kx in range(k)])  # fmt: skip
    return terms.sum(0)


def _inputs(n: int, c: int, o: int, h: int, w: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, c, h, w)).astype(np.float32), rng.standard_normal((c, o, k, k)).astype(np.float32)


def wbuf(w: np.ndarray) -> np.ndarray:
    """The (c, o, k, k) weights as the kernel reads them: channel-last (c, ky, kx, o), flat."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1)).ravel()


def _bounded_loops(uops: list[UOp]) -> int:
    """How many loops run to an end computed from other ranges (not a literal)."""
    return sum(1 for u in uops if u.op is Ops.RANGE and Ops.RANGE in {x.op for x in u.src[0].toposort()})


def _run(ast: UOp, dy: np.ndarray, w: np.ndarray, out_size: int, optimize: bool = False
         ) -> tuple[np.ndarray, list[UOp]]:  # fmt: skip
    """Lower (without the optimizer's register blocking unless asked: a blocked output axis keeps its gate) and
    interpret."""
    uops = full_rewrite_to_sink(ast, PythonRenderer(), optimize=optimize)
    got = run_prog(uops, [np.zeros(out_size, np.float32), dy.ravel(), wbuf(w)], {})
    return got, uops


@pytest.mark.parametrize("k,pads", [(3, (2, 2)), (5, (4, 4)), (3, (1, 1)), (4, (3, 1)), (5, (4, 0))])
def test_transposed_conv_sums_only_real_taps(k: int, pads: tuple[int, int]) -> None:
    n, c, o, h, w = 2, 3, 2, 6, 5
    dy, wt = _inputs(n, c, o, h, w, k, seed=k)
    want = reference(dy, wt, k, pads)
    got, uops = _run(transposed_conv(n, c, o, h, w, k, pads), dy, wt, want.size)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    assert _bounded_loops(uops) == 2, "the ky and kx loops should both be bounded by the gate"
    # no gate is left on the window load: every tap the loops visit reads a real element
    assert not any(u.op is Ops.INDEX and len(u.src) == 3 for u in uops)
    # with the optimizer, output columns become vector lanes: their taps keep the gate, the rows' loop is bounded
    got, uops = _run(transposed_conv(n, c, o, h, w, k, pads), dy, wt, want.size, optimize=True)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    assert _bounded_loops(uops) >= 1


def test_c_and_llvm_run_the_bounded_loops() -> None:
    n, c, o, h, w, k, pads = 2, 3, 4, 5, 7, 3, (2, 2)
    dy, wt = _inputs(n, c, o, h, w, k, seed=1)
    want = reference(dy, wt, k, pads)
    uops = full_rewrite_to_sink(transposed_conv(n, c, o, h, w, k, pads), LLVMRenderer())
    assert _bounded_loops(uops) >= 1
    out = np.zeros(want.size, np.float32)
    check_program(uops, [out, dy.ravel(), wbuf(wt)])  # interpreter vs C vs LLVM, bit for bit
    got = run_prog(uops, [out, dy.ravel(), wbuf(wt)], {})
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@given(h=st.integers(1, 6), w=st.integers(1, 6), k=st.integers(1, 5), lo=st.integers(0, 5), hi=st.integers(0, 5),
       lower_form=st.integers(0, 1), seed=st.integers(0, 2**16))  # fmt: skip
def test_any_padding_gives_the_padded_sum(h: int, w: int, k: int, lo: int, hi: int, lower_form: int,
                                          seed: int) -> None:  # fmt: skip
    if min(h, w) + lo + hi < k:
        return  # no output position: nothing to compare
    n, c, o = 1, 2, 2
    dy, wt = _inputs(n, c, o, h, w, k, seed)
    want = reference(dy, wt, k, (lo, hi))
    got, _ = _run(transposed_conv(n, c, o, h, w, k, (lo, hi), lower_form=lower_form), dy, wt, want.size)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_max_and_nonzero_padding_keep_every_tap() -> None:
    """A max, or a load reading a nonzero value outside its gate, gets something from the padded taps: the loops
    keep their full length."""
    n, c, o, h, w, k, pads = 1, 2, 2, 4, 4, 3, (2, 2)
    for ast in (transposed_conv(n, c, o, h, w, k, pads, op=Ops.MAX),
                transposed_conv(n, c, o, h, w, k, pads, alt=1.5)):  # fmt: skip
        assert tighten_gated_reductions(ast) is ast
    dy, wt = _inputs(n, c, o, h, w, k, seed=3)
    want = reference(dy, wt, k, pads, alt=1.5)
    got, uops = _run(transposed_conv(n, c, o, h, w, k, pads, alt=1.5), dy, wt, want.size)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    assert _bounded_loops(uops) == 0


def test_blocking_avoids_the_gated_axes() -> None:
    """The register-blocking heuristic upcasts images and channels, not the output rows and columns whose gates
    bound the tap loops (as lanes they would each need their own gate)."""
    from speck.codegen.lower.simplify import pm_simplify
    from speck.codegen.opt import hand_coded_optimizations
    from speck.codegen.opt.kernel_opts import output_axes
    from speck.uop import graph_rewrite

    ast = graph_rewrite(transposed_conv(8, 16, 64, 6, 6, 3, (2, 2)), pm_simplify)
    opts = hand_coded_optimizations(ast, LLVMRenderer())
    outs = output_axes(ast)
    assert opts, "a convolution-like reduction is register-blocked"
    upcast = {outs[o.axis] for o in opts if o.op.name == "UPCAST"}
    rows, cols = outs[2], outs[3]
    assert rows not in upcast and cols not in upcast, opts
    uops = full_rewrite_to_sink(transposed_conv(8, 16, 64, 6, 6, 3, (2, 2)), LLVMRenderer())
    assert _bounded_loops(uops) == 2
