"""A direct gradient for max pooling over non-overlapping windows.

Walking the graph of `max_pool2d` differentiates the MAX reduction over the window view (pad + unfold) and then the
view itself: the per-window gradient, a (..., *out, *k) tensor, is summed back onto the input through the unfold's
movement ops, which a kernel can only do by re-reading every window for every input element. When the stride equals
the kernel size (and there is no dilation) every input element lies in at most one window, so the same gradient is
elementwise: pad the input to whole windows, split each spatial dim into (out, k), compare with the pooled max
broadcast over k, and hand each maximum its share of the output gradient. That costs one small reduction (the number
of ties per window) and one elementwise kernel over the input.

The formula is the one of the MAX-reduce rule in speck.tensor.gradient (mask / tie count * gradient, with the mask
and count taken over the -inf padded window), so results equal the general path's, NaN and ties included (bit for
bit, except that a zero share of a negative gradient stays -0 where the general path's summation makes it +0).
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

from speck.tensor.gradient import override_gradient
from speck.uop import Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


def _direct_geometry(x_shape: tuple[object, ...], out_shape: tuple[object, ...], kernel: tuple[int, ...],
                     stride: tuple[int, ...], dilation: tuple[int, ...], padding: tuple[int, ...]
                     ) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """Per spatial dim (input size, output size, kernel, leading padding) when the direct gradient applies, else None
    (overlapping or gapped windows, dilation, symbolic sizes, or arguments the forward spreads differently)."""
    nsp = len(kernel)
    if nsp == 0 or len(stride) != nsp or len(x_shape) < nsp or len(out_shape) != len(x_shape):
        return None
    if any(d != 1 for d in dilation[:nsp]) or any(s != k for s, k in zip(stride, kernel)):
        return None
    # the forward pairs padding[i] with spatial dim i; a padding tuple of another length is only harmless when zero
    if len(padding) != nsp and any(p != 0 for p in padding):
        return None
    pads = tuple(padding[:nsp]) if len(padding) >= nsp else (0,) * nsp
    dims = [*x_shape, *out_shape]
    if not all(isinstance(d, int) for d in dims) or x_shape[:-nsp] != out_shape[:-nsp]:
        return None
    geo = []
    for i in range(nsp):
        n, o = x_shape[len(x_shape) - nsp + i], out_shape[len(out_shape) - nsp + i]
        assert isinstance(n, int) and isinstance(o, int)
        if kernel[i] <= 0 or pads[i] < 0 or o <= 0 or o * kernel[i] < pads[i]:
            return None
        geo.append((n, o, kernel[i], pads[i]))
    return geo


def max_pool_gradient(out: Tensor, x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
                      dilation: tuple[int, ...], padding: tuple[int, ...]) -> bool:  # fmt: skip
    """Register the direct gradient for `out`, the max pool of `x` over its trailing len(kernel) dims (padded with
    -inf by `padding` on both sides, any ceil_mode extension read off out's shape). Only non-overlapping windows
    (stride == kernel, dilation 1) of a float tensor qualify; returns whether the override was registered, otherwise
    the gradient keeps walking the pooling graph."""
    # (a 1x1 pool could one day fold to the input node itself: an override there would feed x's gradient to itself)
    if not dtypes.is_float(x.dtype) or out.dtype != x.dtype or out.uop is x.uop:
        return False
    geo = _direct_geometry(tuple(x.shape), tuple(out.shape), kernel, stride, dilation, padding)
    if geo is None:
        return False
    nsp = len(geo)
    lead = tuple(x.shape[: len(x.shape) - nsp])
    device = x.device
    xu = x.uop
    # the rule only runs while compute_gradient holds the node; a strong reference from the rule would keep the key
    # of the override table (and its whole graph) alive forever
    node_ref, cls = weakref.ref(out.uop), type(out)
    split = (*lead, *[d for _, o, k, _ in geo for d in (o, k)])
    bcast = (*lead, *[d for _, o, _, _ in geo for d in (o, 1)])
    win_axes = tuple(len(lead) + 2 * i + 1 for i in range(nsp))
    keep = ((0, 0),) * len(lead)

    def rule(ctx: UOp) -> tuple[UOp | None, ...]:
        node = node_ref()
        assert node is not None, "the pooled node is alive while its gradient is computed"
        # the input cut or -inf padded to exactly the windows: element j of dim i sits in window j // k
        xv = cls(xu, device=device).pad((*keep, *[(p, o * k - p - n) for n, o, k, p in geo]), value=-math.inf)
        xw = xv.uop.reshape(split)
        mask = xw.ne(node.reshape(bcast).expand(split)).ne(True).cast(ctx.dtype)
        count = mask.reduce_axis(Ops.ADD, win_axes)
        gw = (mask / count.expand(split)) * ctx.reshape(bcast).expand(split)
        gv = cls(gw.reshape(tuple(xv.shape)), device=device)
        # back to the input's extent: drop the leading padding, zeros for the tail no window reaches
        gx = gv.pad((*keep, *[(-p, n + p - o * k) for n, o, k, p in geo]))
        return (gx.uop,)

    override_gradient(out.uop, (xu,), rule)
    return True
