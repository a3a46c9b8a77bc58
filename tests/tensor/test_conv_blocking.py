"""Register blocks of convolution kernels on targets with 32 vector registers (AVX-512, speck.codegen.opt.heuristic):
a forward convolution whose row block runs along the window (a vector of input pixels feeds it) also blocks 2
images (16 accumulators), and a transposed convolution (the input gradient, its window gated over padding) keeps
4 images beside 4 vectors of channels; with 16 registers (AVX2) the blocks stay as they were. The values, on
whatever CPU runs the tests (a first layer's weight gradient among them, blocked 8 output channels at a time with
32 registers), equal numpy's (float32 sums of 288-800 products: 1e-4 relative, 1e-3 absolute). These are the direct
convolution's kernels: Winograd's rewrite (WINO, test_winograd.py) is off here."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from speck.codegen.opt import Opt, OptOps, apply_opts, hand_coded_optimizations, opt_base
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.tensor import Context, Tensor
from speck.uop import UOp
from tensor_helpers import assert_matches


@pytest.fixture(autouse=True)
def _direct_convolution() -> Iterator[None]:
    with Context(WINO=0):
        yield


AVX2, AVX512 = LLVMRenderer(max_vector_bytes=32), LLVMRenderer(max_vector_bytes=64)


def _arr(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_np(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (kh, kw), axis=(2, 3))
    return np.einsum("bihwyx,oiyx->bohw", win, w.astype(np.float64))


def _conv_grads_np(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d/dx and d/dw of sum(conv(x, w) * g)."""
    kh, kw = w.shape[2:]
    oh, ow = g.shape[2:]
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
    dx = np.zeros_like(x64)
    dw = np.zeros_like(w64)
    for ky in range(kh):
        for kx in range(kw):
            dx[:, :, ky : ky + oh, kx : kx + ow] += np.einsum("bohw,oi->bihw", g64, w64[:, :, ky, kx])
            dw[:, :, ky, kx] = np.einsum("bohw,bihw->oi", g64, x64[:, :, ky : ky + oh, kx : kx + ow])
    return dx, dw


def _product(t: Tensor) -> UOp:
    """The AST of the convolution's product kernel (the one reducing over a window: two or more reduce axes)."""
    asts = [it.ast for it in t.schedule() if it.ast is not None and it.ast.arg.name.startswith("r_")]
    assert len(asts) == 1, [a.arg.name for a in asts]
    return asts[0]


def test_a_forward_convolution_blocks_two_images_with_32_registers() -> None:
    x, w = Tensor(_arr((8, 32, 12, 12), 1)).realize(), Tensor(_arr((32, 32, 5, 5), 2)).realize()
    ast = opt_base(_product(x.conv2d(w)))
    # 4 output columns (read as one vector of input pixels) x 2 images x 2 vectors of output channels
    assert hand_coded_optimizations(ast, AVX512) == [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UPCAST, 0, 2),
                                                     Opt(OptOps.UPCAST, 1, 32)]  # fmt: skip
    assert hand_coded_optimizations(ast, AVX2) == [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UPCAST, 1, 16)]


def test_an_input_gradient_keeps_four_images_with_32_registers() -> None:
    x = Tensor(_arr((8, 64, 8, 8), 3), requires_grad=True)
    w = Tensor(_arr((64, 64, 3, 3), 4)).realize()
    x.conv2d(w).sum().backward()
    assert x.grad is not None
    ast = opt_base(_product(x.grad))
    assert hand_coded_optimizations(ast, AVX512) == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 64)]
    assert hand_coded_optimizations(ast, AVX2) == [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 32)]


def test_a_forward_convolution_over_images_strided_rows_is_not_widened() -> None:
    # 6x6 outputs: the row block runs along the images (no load reads them contiguously), so no second row
    x, w = Tensor(_arr((8, 64, 8, 8), 5)).realize(), Tensor(_arr((64, 64, 3, 3), 6)).realize()
    assert hand_coded_optimizations(opt_base(_product(x.conv2d(w))), AVX512) == [Opt(OptOps.UPCAST, 0, 4),
                                                                                 Opt(OptOps.UPCAST, 1, 32)]  # fmt: skip


@pytest.mark.parametrize(
    "xs,ws",
    [((8, 32, 12, 12), (32, 32, 5, 5)), ((8, 64, 8, 8), (64, 64, 3, 3)), ((6, 32, 13, 11), (32, 32, 5, 3)),
     ((8, 1, 20, 20), (32, 1, 5, 5))],
)  # fmt: skip
def test_blocked_convolutions_and_their_gradients_match_numpy(xs: tuple[int, ...], ws: tuple[int, ...]) -> None:
    xn, wn = _arr(xs, 7), _arr(ws, 8)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    out = x.conv2d(w)
    gn = _arr(out.shape, 9)
    (out * Tensor(gn)).sum().backward()
    assert x.grad is not None and w.grad is not None
    dx, dw = _conv_grads_np(xn, wn, gn)
    assert_matches(out.numpy(), _conv_np(xn, wn), atol=1e-3, rtol=1e-4)
    assert_matches(x.grad.numpy(), dx, atol=1e-3, rtol=1e-4)
    assert_matches(w.grad.numpy(), dw, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("renderer", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_block_over_every_image_of_a_two_image_batch_applies(renderer: LLVMRenderer) -> None:
    # the 2-image block upcasts the whole batch axis, which leaves the numbering the later opts see: they must name
    # the axes as they are then (an opt naming a vanished axis used to fail, and the kernel ran unoptimized, 20x
    # slower than a batch of 4)
    xn, wn = _arr((2, 64, 16, 16), 10), _arr((64, 64, 3, 3), 11)
    x, w = Tensor(xn).realize(), Tensor(wn).realize()
    ast = opt_base(_product(x.conv2d(w, padding=1)))
    opts = hand_coded_optimizations(ast, renderer)
    assert opts, "a convolution gets register-blocked"
    done = apply_opts(ast, opts, renderer)  # raises OptError when an opt names an axis that is not there
    assert done is not ast
    padded = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert_matches(x.conv2d(w, padding=1).numpy(), _conv_np(padded, wn), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_heuristic_opts_of_every_convolution_kernel_apply(n: int, stride: int) -> None:
    # forward, input-gradient and weight-gradient kernels of small batches: a register block may upcast a whole
    # axis (the batch), and the later opts must still name existing axes (before the fix 16% of such kernels, e.g.
    # the input gradient of a 4-image batch on AVX-512, fell back to no opts at all)
    x = Tensor.empty(n, 64, 8, 8, requires_grad=True)
    w = Tensor.empty(32, 64, 3, 3, requires_grad=True)
    out = x.conv2d(w, padding=1, stride=stride)
    out.sum().backward()
    assert x.grad is not None and w.grad is not None
    asts = [it.ast for t in (out, x.grad, w.grad) for it in t.schedule()
            if it.ast is not None and it.ast.arg.name.startswith("r_")]  # fmt: skip
    assert asts
    for ast in asts:
        base = opt_base(ast)
        for renderer in (AVX2, AVX512):
            apply_opts(base, hand_coded_optimizations(base, renderer), renderer)  # OptError: an opt names no axis


def test_heuristic_opts_that_do_not_apply_are_reported_at_debug_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import speck.codegen.opt as opt_mod
    from speck.uop import Context

    x, w = Tensor.empty(2, 8, 6, 6), Tensor.empty(8, 8, 3, 3)
    ast = _product(x.conv2d(w))
    monkeypatch.setattr(opt_mod, "hand_coded_optimizations", lambda sink, r: [Opt(OptOps.UPCAST, 9, 4)])
    with Context(DEBUG=2):
        assert opt_mod.optimize_kernel(ast, AVX2) is not None  # the kernel still gets a (plain) AST
    out = capsys.readouterr().out
    assert "did not apply" in out and "UPCAST, 9, 4" in out, out
