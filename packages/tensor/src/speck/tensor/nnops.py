# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Neural-network ops as Tensor methods: convolutions (via windows + a reduction), pooling, interpolation, dropout,
the activations, losses and scaled dot-product attention. Everything is composed from Tensor's own ops, so it fuses
and differentiates like any other expression."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from speck.tensor import winograd
from speck.tensor.bounds import checked
from speck.tensor.dims import as_int, flag, real, tensor_args, whole
from speck.tensor.errors import TensorAssertionError, TensorTypeError, TensorValueError
from speck.tensor.gradient import override_gradient
from speck.tensor.pool_grad import max_pool_gradient
from speck.tensor.reduce import product_dtype
from speck.tensor.settings import TRAINING, WINO
from speck.tensor.winograd import winograd_tile
from speck.uop import dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype

if TYPE_CHECKING:
    from collections.abc import Callable

    from speck.tensor.tensor import Tensor
    from speck.uop import UOp


def _pair(x: int | tuple[int, ...], n: int = 2, what: str = "a window argument") -> tuple[int, ...]:
    """An int argument repeated n times, or a sequence of ints as a tuple (numpy ints count as ints); anything else
    (1.5, None, a float in a tuple) is a TensorTypeError: a window, stride or pad is a whole number of elements."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return (int(x),) * n
    if not isinstance(x, (tuple, list)) or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                                                   for v in x):  # fmt: skip
        raise TensorTypeError(f"{what} must be an int or a tuple of ints (sizes in elements), got {x!r}; pass whole "
                              "numbers")  # fmt: skip
    return tuple(int(v) for v in x)


def _pooled_dims(op: str, t: Tensor, k: tuple[int, ...]) -> None:
    """A pool over k dims needs at least k dims to pool (a 1-D tensor under a 2-D kernel is no image)."""
    if t.ndim < len(k):
        raise TensorValueError(f"{op}: a {len(k)}-D kernel {k} pools the last {len(k)} dims, but the input has shape "
                               f"{t.shape}; reshape it or pass a kernel of at most {t.ndim} dims")  # fmt: skip


def _int_labels(op: str, y: Tensor) -> None:
    """Class labels are ints: a float label (0.5, or 5.0 of 3 classes) would match no class and add 0 to the loss."""
    if not dtypes.is_int(y.dtype):
        raise TensorTypeError(f"{op}: labels must be an int tensor of class indices, got {y.dtype}; "
                              "cast them with .cast('int32') (after checking they are whole numbers)")  # fmt: skip


def _window_args(op: str, n: int, **args: tuple[int, ...]) -> None:
    """Kernel sizes, strides and dilations of a windowed op are positive ints (numpy and torch refuse 0 and negative
    ones; here 0 divided by zero and dilation 0 silently made windows of one element), one per windowed dim (n): a
    shorter tuple was an IndexError, a longer one's extra values were ignored."""
    for name, vals in args.items():
        if len(vals) != n:
            raise TensorValueError(f"{op}: {name} {vals} needs one int or {n} of them (one per windowed dim), got "
                                   f"{len(vals)}")  # fmt: skip
        if not all(isinstance(v, int) and v >= 1 for v in vals):
            raise TensorValueError(f"{op}: {name} must be positive integers, got {vals}")


def _groups(op: str, groups: Any) -> int:
    """groups as a positive int (None failed on `*`, 0 as a ZeroDivisionError, -1 as a reshape of -4 channels)."""
    if (g := whole(op, "groups", groups)) < 1:
        raise TensorValueError(f"{op}: groups must be >= 1, got {g}")
    return g


def _conv_padding(padding: int | str | tuple[int, ...], k: tuple[int, ...], d: tuple[int, ...],
                  stride: tuple[int, ...]) -> list[tuple[int, int]]:  # fmt: skip
    """Per spatial dim (before, after) padding; 'same' pads so the output size equals ceil(input / stride)."""
    if not isinstance(padding, (numbers.Integral, str, tuple, list)):  # (an array failed on `== "same"`)
        raise TensorTypeError(f"padding must be an int, a tuple, 'same' or 'valid'; got {type(padding).__name__} "
                              f"{padding!r:.40}")  # fmt: skip
    if isinstance(padding, str):
        padding = padding.lower()
    if padding == "same":
        if any(s != 1 for s in stride):
            raise TensorValueError("padding='same' needs stride 1 (as in PyTorch)")
        out = []
        for kk, dd in zip(k, d):
            total = dd * (kk - 1)
            out.append((total // 2, total - total // 2))
        return out
    if padding == "valid":
        return [(0, 0)] * len(k)
    if isinstance(padding, str):
        raise TensorValueError(f"padding must be an int, a tuple, 'same' or 'valid'; got {padding!r}")
    p = _pair(padding, len(k), "padding")
    if len(p) not in (len(k), 2 * len(k)):  # (it surfaced as "pad needs 4 (before, after) pairs, got 5")
        raise TensorValueError(
            f"padding {padding!r} for {len(k)} spatial dims needs one int, {len(k)} (one per dim) or {2 * len(k)} "
            f"(before/after per dim, innermost first), got {len(p)}"
        )
    if len(p) == 2 * len(k):  # (left, right, top, bottom) style, innermost dim first
        pairs = [(p[2 * i], p[2 * i + 1]) for i in range(len(k))][::-1]
        return pairs
    return [(x, x) for x in p]


class NNMixin:
    """Tensor methods for neural networks (mixed into Tensor)."""

    # ---------------- windows ----------------
    def _windows(self: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) -> (..., *out_spatial, *k): every window of size k (dilated) at the given stride, built
        from movement ops only (pad/shrink/reshape/expand), so it fuses into the consumer."""
        nsp = len(k)
        x = self
        lead = x.shape[:-nsp]
        for i in range(nsp):
            ax = len(lead) + i  # spatial axis i, always right after the already-windowed ones
            size = x.shape[ax]
            ke = dilation[i] * (k[i] - 1) + 1
            o = (size - ke) // stride[i] + 1
            if o <= 0:
                raise TensorAssertionError(
                    f"window {k[i]} (dilation {dilation[i]}) is larger than the padded input size {size} on spatial "
                    f"dim {i}"
                )
            # gather rows ax: out index j, kernel index t -> source j*stride + t*dilation
            x = x.unfold(ax, ke, stride[i])  # (..., o, rest..., ke) with the window as the last axis
            if dilation[i] > 1:
                x = x[(..., slice(None, None, dilation[i]))]
            # move the window axis to the end of the spatial block: it is already last; keep order by permuting later
        # unfold appends each window axis at the end in spatial order, so shape is (..., *o, *k)
        return x

    def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
               stride: int | tuple[int, ...] = 1, dilation: int | tuple[int, ...] = 1,
               padding: int | str | tuple[int, ...] = 0, dtype: Any = None) -> Tensor:  # fmt: skip
        """N-d convolution (cross-correlation, as in PyTorch) of (N, Cin, *spatial) with weight (Cout, Cin/groups,
        *k); works for 1-d and 3-d too. padding may be 'same'; a negative amount crops the input (as pad() does).
        stride and dilation are positive. dtype: accumulation and result dtype."""
        tensor_args("conv2d", "weight/bias", (weight,) if bias is None else (weight, bias), type(self))
        groups = _groups("conv2d", groups)
        nsp = len(weight.shape) - 2
        if nsp < 1:
            raise TensorAssertionError(f"conv weight must be (Cout, Cin/groups, *kernel) with at least 1 kernel dim, "
                                       f"got shape {weight.shape}")  # fmt: skip
        if len(self.shape) != nsp + 2:
            raise TensorAssertionError(
                f"conv input must be (N, C, *spatial) with {nsp} spatial dims, got shape {self.shape}"
            )
        n, cin = self.shape[:2]
        cout, cin_g = weight.shape[:2]
        k = tuple(as_int(d) for d in weight.shape[2:])
        if cin != cin_g * groups or cout % groups:
            raise TensorAssertionError(
                f"conv channels don't match: input has {cin} channels, weight {tuple(weight.shape)} with groups="
                f"{groups} expects {cin_g * groups} input channels and Cout divisible by groups"
            )
        st, dl = _pair(stride, nsp, "conv2d stride"), _pair(dilation, nsp, "conv2d dilation")
        _window_args("conv2d", nsp, stride=st, dilation=dl)
        pads = _conv_padding(padding, k, dl, st)
        if dtype is None and groups == 1 and (m := winograd_tile(self, weight, st, dl, pads, WINO.value)):
            # Winograd's F(m, k): its input transform copies the input channel-last, padding and all
            x = self.pad(((0, 0), (0, 0), *pads)) if any(p != (0, 0) for p in pads) else self
            out, wgrad = winograd.conv(x, weight, m)
            _conv_gradient(out, x, weight, groups, st, dl, k, wgrad)
            return out if bias is None else out + _conv_bias(bias, cout, nsp)
        # padded into a buffer of its own: read in place, every window load would be gated (one branch per lane)
        x = self.pad(((0, 0), (0, 0), *pads)).contiguous() if any(p != (0, 0) for p in pads) else self
        w = x._windows(k, st, dl)  # (N, Cin, *o, *k)
        osp = w.shape[2 : 2 + nsp]
        w = w.reshape(n, groups, 1, cin_g, *osp, *k)
        # the weights in channel-last order (Cin/g, *k, Cout/g) in a buffer of their own: the kernel then reads the
        # output channels contiguously and can vectorize over them (Cout is usually a multiple of the vector width)
        wl = weight.reshape(groups, cout // groups, cin_g, *k).permute(0, *range(2, 3 + nsp), 1).contiguous()
        wt = wl.permute(0, 2 + nsp, *range(1, 2 + nsp)).reshape(1, groups, cout // groups, cin_g, *([1] * nsp), *k)
        red = (3,) + tuple(range(4 + nsp, 4 + 2 * nsp))
        if (pdt := product_dtype(dtypes.as_concrete(least_upper_dtype(w.dtype, wt.dtype)), dtype)) is not w.dtype:
            w, wt = w.cast(pdt), wt.cast(pdt)  # a wider dtype= multiplies in it too (int8 products would wrap)
        out = (w * wt).sum(axis=red, dtype=dtype)
        if dtype is None and out.dtype != w.dtype:  # the result has the operands' dtype (int8 stays int8)
            out = out.cast(dtypes.as_concrete(least_upper_dtype(self.dtype, weight.dtype)))
        out = out.reshape(n, cout, *osp)
        _conv_gradient(out, x, weight, groups, st, dl, k)
        return out if bias is None else out + _conv_bias(bias, cout, nsp)

    def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: int | tuple[int, ...] = 1, dilation: int | tuple[int, ...] = 1,
                         padding: int | tuple[int, ...] = 0, output_padding: int | tuple[int, ...] = 0
                         ) -> Tensor:  # fmt: skip
        """Transposed convolution (the gradient of conv2d) of (N, Cin, *spatial) with weight (Cin, Cout/groups,
        *k): zero-stuff the input by the stride, pad by dilation*(k-1)-padding, and convolve with the flipped
        kernel. padding is as for conv2d (one value per dim, or before/after pairs in torch order)."""
        tensor_args("conv_transpose2d", "weight/bias", (weight,) if bias is None else (weight, bias), type(self))
        groups = _groups("conv_transpose2d", groups)
        nsp = len(weight.shape) - 2
        if nsp < 1 or self.ndim != nsp + 2:  # ("not enough values to unpack (expected 2, got 1)")
            raise TensorAssertionError(f"conv_transpose2d: weight must be (Cin, Cout/groups, *kernel) with at least 1 "
                                       f"kernel dim and the input (N, Cin, *spatial) with as many, got weight "
                                       f"{weight.shape} and input {self.shape}")  # fmt: skip
        cin, cout_g = weight.shape[:2]
        k = tuple(as_int(d) for d in weight.shape[2:])
        st, dl, op = (_pair(v, nsp, f"conv_transpose2d {w}") for v, w in
                      ((stride, "stride"), (dilation, "dilation"), (output_padding, "output_padding")))  # fmt: skip
        _window_args("conv_transpose2d", nsp, stride=st, dilation=dl)
        if cin % groups:  # (it was the regroup reshape's "can't reshape shape (3, 4, 3, 3) ...")
            raise TensorValueError(f"conv_transpose2d: weight {weight.shape} has {cin} input channels, which don't "
                                   f"split into groups={groups}; its dim 0 must be a multiple of groups")  # fmt: skip
        if any(not 0 <= o < max(s, d) for o, s, d in zip(op, st, dl)):
            # (torch's rule: a negative one cropped the output, a larger one added rows no input reaches)
            raise TensorValueError(f"conv_transpose2d: output_padding {op} must be >= 0 and below the stride {st} or "
                                   f"the dilation {dl} of its dim; it only picks among the output sizes a stride "
                                   "makes ambiguous")  # fmt: skip
        pd = _conv_padding(padding, k, dl, (1,) * nsp)
        osp = [(as_int(i) - 1) * s - pb - pa + d * (kk - 1) + o + 1
               for i, s, (pb, pa), d, kk, o in zip(self.shape[2:], st, pd, dl, k, op)]  # fmt: skip
        if any(o < 0 for o in osp):
            raise TensorAssertionError(f"conv_transpose2d: input {self.shape} with weight {weight.shape}, stride "
                                       f"{st}, padding {pd} gives the negative output size {osp}; reduce the "
                                       "padding")  # fmt: skip
        if 0 in osp:  # nothing to compute (the padding crops everything away)
            return type(self).zeros(self.shape[0], cout_g * groups, *osp, dtype=self.dtype, device=self.device)
        x = self
        if any(s > 1 for s in st):  # insert s-1 zeros between input elements
            sp = x.shape[2:]
            x = x.reshape(*x.shape[:2], *[d for s in sp for d in (s, 1)])
            x = x.pad(((0, 0), (0, 0), *[p for s in st for p in ((0, 0), (0, s - 1))]))
            x = x.reshape(*x.shape[:2], *[d * s for d, s in zip(sp, st)])
            x = x.shrink(((0, x.shape[0]), (0, x.shape[1]), *[(0, d * s - (s - 1)) for d, s in zip(sp, st)]))
        pads = tuple((dd * (kk - 1) - pb, dd * (kk - 1) - pa + o) for kk, dd, (pb, pa), o in zip(k, dl, pd, op))
        w = weight.reshape(groups, cin // groups, cout_g, *k).transpose(1, 2).reshape(groups * cout_g, cin // groups,
                                                                                      *k)  # fmt: skip
        w = w.flip(tuple(range(2, 2 + nsp)))
        # the padding stays virtual: the window loads are gated, codegen bounds the kernel-tap loops by those gates
        # (lower/gated_ranges.py) and register-blocks images rather than the gated rows and columns. The k-1 rows
        # and columns of padding on each side of a 20x20 gradient would otherwise be 31% of a 5x5 convolution's
        # input-gradient FLOPs, plus a copy of the padded gradient
        x = x.contiguous().pad(((0, 0), (0, 0), *pads))
        return x.conv2d(w, bias, groups=groups, dilation=dl)

    # ---------------- pooling ----------------
    def _pool_pads(self: Tensor, kernel_size: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                   padding: int | tuple[int, ...], ceil_mode: bool) -> list[tuple[int, int]]:  # fmt: skip
        """Per pooled dim (before, after) padding: `padding` as conv2d takes it (int, one per dim, or 2 per dim in
        torch order), plus, with ceil_mode, the extension that makes room for a last partial window (which must
        start inside the input or its leading padding, as in PyTorch)."""
        pads = _conv_padding(padding, kernel_size, dilation, stride)
        if ceil_mode:
            for i, (n, (pb, pa)) in enumerate(zip(self.shape[-len(kernel_size) :], pads)):
                n_in = as_int(n)
                size = n_in + pb + pa
                ke = dilation[i] * (kernel_size[i] - 1) + 1
                o = -(-(size - ke) // stride[i]) + 1
                if (o - 1) * stride[i] >= n_in + pb:
                    o -= 1
                pads[i] = (pb, pa + max((o - 1) * stride[i] + ke - size, 0))
        return pads

    def _pool_windows(self: Tensor, kernel_size: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                      pads: list[tuple[int, int]], value: float) -> Tensor:  # fmt: skip
        x = self
        if any(p != (0, 0) for p in pads):
            x = x.pad(((0, 0),) * (len(x.shape) - len(kernel_size)) + tuple(pads), value=value)
        return x._windows(kernel_size, stride, dilation)

    def max_pool2d(self: Tensor, kernel_size: int | tuple[int, ...] = 2, stride: int | tuple[int, ...] | None = None,
                   dilation: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] = 0, ceil_mode: bool = False,
                   return_indices: bool = False) -> Any:  # fmt: skip
        """Max over each window (stride defaults to kernel_size; padding is the dtype's minimum); with
        return_indices also the index of each max flattened over the pooled dims (as PyTorch returns, for
        max_unpool2d)."""
        ceil_mode, return_indices = (
            flag("max_pool2d", "ceil_mode", ceil_mode),
            flag("max_pool2d", "return_indices", return_indices),
        )
        k = _pair(kernel_size, 2, "max_pool2d kernel_size")
        # int stride/dilation apply to every pooled dim (a 1-d or 3-d kernel tuple pools that many dims)
        st, dl = (_pair(v, len(k), f"max_pool2d {w}") for v, w in
                  ((stride if stride is not None else k, "stride"), (dilation, "dilation")))  # fmt: skip
        _window_args("max_pool2d", len(k), kernel_size=k, stride=st, dilation=dl)
        _pooled_dims("max_pool2d", self, k)
        pads = self._pool_pads(k, st, dl, padding, ceil_mode)
        w = self._pool_windows(k, st, dl, pads, dtypes.min(self.dtype))
        red = tuple(range(-len(k), 0))
        out = w.max(axis=red)

        # elementwise when windows don't overlap (its geometry needs only the leading pads: out's shape has the rest)
        max_pool_gradient(out, self, k, st, dl, tuple(b for b, _ in pads))
        if not return_indices:
            return out
        sp = tuple(as_int(d) for d in self.shape[-len(k) :])
        lead = (1,) * (self.ndim - len(k))
        idx = type(self).arange(math.prod(sp), device=self.device).reshape(*lead, *sp).expand(self.shape)
        n = math.prod(sp)
        # padded positions get index n, above every real one: a window whose inputs all equal the padding value
        # (-inf) reports its first input, as PyTorch does, not the padding
        iw = idx._pool_windows(k, st, dl, pads, n)
        o = out.reshape(*out.shape, *([1] * len(k)))
        hit = w == o
        if dtypes.is_float(self.dtype):  # a NaN window's max is NaN (== never holds): its first NaN, as PyTorch
            hit = hit | ((w != w) & (o != o))
        # first max in window order, like PyTorch: the smallest flat index among the maxima
        first = hit.where(iw, n).min(axis=red)
        return out, (first == n).where(-1, first)  # (a window wholly in the padding has no input to point at)

    def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: int | tuple[int, ...] = 2,
                     stride: int | tuple[int, ...] | None = None, dilation: int | tuple[int, ...] = 1,
                     padding: int | tuple[int, ...] = 0,
                     output_size: tuple[int, ...] | None = None) -> Tensor:  # fmt: skip
        """Put pooled values back at the positions in `indices` (flat over the pooled dims; zeros elsewhere). The
        pooled dims are the last len(kernel_size) (an int kernel: the last two); output_size defaults to the
        inverse of the pooling's size formula."""
        tensor_args("max_unpool2d", "indices", (indices,))
        k = _pair(kernel_size, 2, "max_unpool2d kernel_size")
        nsp = len(k)
        st, dl = (_pair(v, nsp, f"max_unpool2d {w}") for v, w in
                  ((stride if stride is not None else k, "stride"), (dilation, "dilation")))  # fmt: skip
        _window_args("max_unpool2d", nsp, kernel_size=k, stride=st, dilation=dl)
        _pooled_dims("max_unpool2d", self, k)
        pads = _conv_padding(padding, k, dl, st)
        if output_size is None:
            output_size = tuple((as_int(self.shape[i - nsp]) - 1) * st[i] - pads[i][0] - pads[i][1] +
                                dl[i] * (k[i] - 1) + 1 for i in range(nsp))  # fmt: skip
        osp = tuple(output_size[-nsp:])
        n_out = math.prod(osp)
        lead, isp = self.shape[:-nsp], self.shape[-nsp:]
        x, ix = self.flatten(-nsp) if nsp > 1 else self, indices.flatten(-nsp) if nsp > 1 else indices
        sel = ix.unsqueeze(-1) == type(self).arange(n_out, device=self.device)  # (..., pooled, out)
        # overlapping windows can pick the same position: it gets that value once (not the sum), as in PyTorch
        out = sel.where(x.unsqueeze(-1), 0).sum(axis=-2)
        hits = sel.sum(axis=-2)
        out = (hits > 1).where(out / hits.maximum(1).cast(out.dtype), out).reshape(*lead, *osp)
        _unpool_gradient(out, self, ix, isp)
        return out

    def avg_pool2d(self: Tensor, kernel_size: int | tuple[int, ...] = 2, stride: int | tuple[int, ...] | None = None,
                   dilation: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:  # fmt: skip
        """Mean over each window. The divisor counts the window's elements inside the padded input
        (count_include_pad) or inside the input only; a ceil_mode extension never counts (as in PyTorch)."""
        ceil_mode = flag("avg_pool2d", "ceil_mode", ceil_mode)
        count_include_pad = flag("avg_pool2d", "count_include_pad", count_include_pad)
        k = _pair(kernel_size, 2, "avg_pool2d kernel_size")
        st, dl = (_pair(v, len(k), f"avg_pool2d {w}") for v, w in
                  ((stride if stride is not None else k, "stride"), (dilation, "dilation")))  # fmt: skip
        _window_args("avg_pool2d", len(k), kernel_size=k, stride=st, dilation=dl)
        _pooled_dims("avg_pool2d", self, k)
        red = tuple(range(-len(k), 0))
        pads = self._pool_pads(k, st, dl, padding, ceil_mode)
        w = self._pool_windows(k, st, dl, pads, 0.0)
        if count_include_pad and not ceil_mode:
            return w.mean(axis=red)
        # the divisor over the pooled dims only (it broadcasts over the leading ones)
        sp = tuple(as_int(d) for d in self.shape[-len(k) :])
        user = _conv_padding(padding, k, dl, st)
        if count_include_pad:
            ones = type(self).ones(*[n + b + a for n, (b, a) in zip(sp, user)], device=self.device)
            ones = ones.pad(tuple((0, pa - ua) for (_, pa), (_, ua) in zip(pads, user)))
        else:
            ones = type(self).ones(*sp, device=self.device).pad(tuple(pads))
        div = ones._windows(k, st, dl).sum(axis=red)
        x = w.sum(axis=red)
        return x.cast(least_upper_float(x.dtype)) / div.cast(least_upper_float(x.dtype))

    def interpolate(self: Tensor, size: tuple[int, ...], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the trailing len(size) dims: mode 'nearest', 'nearest-exact' or 'linear' (bi/trilinear)."""
        if type(mode) is not str:  # (an array compared to "linear" was numpy's "truth value ... ambiguous")
            raise TensorTypeError(f"interpolate: mode must be 'nearest', 'nearest-exact' or 'linear', got "
                                  f"{type(mode).__name__} {mode!r:.40}")  # fmt: skip
        if flag("interpolate", "align_corners", align_corners) and mode != "linear":
            raise TensorAssertionError(f"align_corners needs mode='linear', got {mode!r}")
        # int images interpolate linearly in float32 and are cast back at the end (in uint8, hi - lo wraps and the
        # fraction truncates to 0)
        self = self._concrete()
        x = self.cast(dtypes.float32) if mode == "linear" and not dtypes.is_float(self.dtype) else self
        size = _pair(size, 1, "interpolate size")
        nsp = len(size)
        if nsp > self.ndim or any(n < 1 for n in size):
            raise TensorValueError(f"interpolate: size {size} must be positive sizes for the last {nsp} of the input's "
                                   f"{self.ndim} dims (shape {self.shape})")  # fmt: skip
        for i in range(nsp):
            ax = len(x.shape) - nsp + i
            n_in, n_out = as_int(x.shape[ax]), size[i]
            if n_in == n_out:
                continue
            if mode in ("nearest", "nearest-exact"):
                off = 0.5 if mode == "nearest-exact" else 0.0
                src = (
                    ((type(self).arange(n_out, device=x.device) + off) * (n_in / n_out)).floor().int().clip(0, n_in - 1)
                )
                x = x.gather(ax, src.reshape(*[n_out if j == ax else 1 for j in range(len(x.shape))]).expand(
                    *[n_out if j == ax else s for j, s in enumerate(x.shape)]))  # fmt: skip
            elif mode == "linear":
                scale = (n_in - 1) / (n_out - 1) if align_corners and n_out > 1 else n_in / n_out
                pos = type(self).arange(
                    n_out, device=x.device, dtype=dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
                )
                pos = pos * scale if align_corners else ((pos + 0.5) * scale - 0.5).clip(0, n_in - 1)
                lo = pos.floor().int().clip(0, n_in - 1)
                hi = (lo + 1).clip(0, n_in - 1)
                frac = pos - lo.float()
                shp = [n_out if j == ax else 1 for j in range(len(x.shape))]
                full = [n_out if j == ax else s for j, s in enumerate(x.shape)]
                xl = x.gather(ax, lo.reshape(*shp).expand(*full))
                xh = x.gather(ax, hi.reshape(*shp).expand(*full))
                x = xl + (xh - xl) * frac.reshape(*shp).cast(x.dtype)
            else:
                raise TensorAssertionError(f"interpolate mode must be 'nearest', 'nearest-exact' or 'linear', got "
                                           f"{mode!r}")  # fmt: skip
        return x.cast(self.dtype)

    # ---------------- regularisation and activations ----------------
    def leakyrelu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        """Older tinygrad's name for leaky_relu."""
        return self.leaky_relu(neg_slope)

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        """Zero each element with probability p and scale the rest by 1/(1-p), only in training mode."""
        if not 0 <= real("dropout", "p", p) <= 1:
            raise TensorValueError(f"dropout probability must be in [0, 1], got {p}")
        if not TRAINING or p == 0:  # (training mode: Tensor.training reads and writes this setting)
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def sequential(self: Tensor, ll: list[Any]) -> Tensor:
        """Apply the callables in ll in order."""
        if isinstance(ll, (str, bytes)) or not hasattr(ll, "__iter__") or not all(callable(f) for f in ll):
            raise TensorTypeError(f"sequential takes a list of callables (layers, functions), got "
                                  f"{type(ll).__name__} {ll!r:.40}")  # fmt: skip
        out = self
        for f in ll:
            out = f(out)
        return out

    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * (self._nonpositive() / alpha)._expm1())

    def selu(self: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
        return gamma * self.elu(alpha)

    def quick_gelu(self: Tensor) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def mish(self: Tensor) -> Tensor:
        return self * self.softplus().tanh()

    def hardswish(self: Tensor) -> Tensor:
        x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.weakfloat)  # (int8 127 + 3 would wrap)
        return x * ((x + 3).relu6() * (1 / 6))  # the factor first: x * 6 overflows at the largest x

    def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        return (alpha * self + beta).clip(0.0, 1.0)  # (a difference of two relus is inf - inf = NaN at x = inf)

    def logsigmoid(self: Tensor) -> Tensor:
        # an int or bool input is made weakfloat first (the dtype sigmoid gives it): -x of uint8 wraps, of bool is not
        x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.weakfloat)
        return -(-x).softplus()

    def softsign(self: Tensor) -> Tensor:
        x = self if dtypes.is_float(self.dtype) else self._float()  # (int8 abs(-128) is -128)
        return x / (1 + x.abs())

    # ---------------- normalisation helpers ----------------
    def layernorm(self: Tensor, axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> Tensor:
        y = self - self.mean(axis=axis, keepdim=True)
        # the variance of a half/bf16 input in float32 (a deviation of 300 squares to inf in half and the
        # output would be all zeros), the scale cast back to the input dtype
        yf = y.cast(sum_acc_dtype(y.dtype)) if dtypes.is_float(y.dtype) and not y.dtype.is_weak else y
        return y * (yf * yf).mean(axis=axis, keepdim=True).add(eps).rsqrt().cast(y.dtype)

    def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int | tuple[int, ...] = 1) -> Tensor:  # fmt: skip
        """(x - mean) * invstd * weight + bias with the statistics broadcast along `axis`."""
        if isinstance(axis, bool) or not isinstance(axis, (int, tuple, list)):
            raise TensorTypeError(f"batchnorm: axis must be an int or a tuple of ints, got {type(axis).__name__} "
                                  f"{axis!r:.40}")  # fmt: skip
        # (a number was "'int' object has no attribute 'reshape'")
        stats = (("mean", mean, False), ("invstd", invstd, False), ("weight", weight, True), ("bias", bias, True))
        for what, t, optional in stats:
            if not isinstance(t, type(self)) and not (optional and t is None):
                raise TensorTypeError(f"batchnorm: {what} must be a Tensor{' or None' if optional else ''}, got "
                                      f"{type(t).__name__} {t!r:.40}; wrap data with Tensor(...)")  # fmt: skip
        axes = (axis,) if isinstance(axis, int) else axis
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        ret = x.mul(invstd.reshape(shape) if len(invstd.shape) == len(axes) else invstd)
        return (ret + bias.reshape(shape)) if bias is not None else ret

    # ---------------- losses ----------------
    def sparse_categorical_crossentropy(self: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Tensor:  # fmt: skip
        """Cross entropy of logits (N, C) against integer labels (N,); labels equal to ignore_index don't count."""
        tensor_args("sparse_categorical_crossentropy", "labels", (Y,), type(self))
        real("sparse_categorical_crossentropy", "label_smoothing", label_smoothing)
        whole("sparse_categorical_crossentropy", "ignore_index", ignore_index)  # (bytes failed inside the scheduler)
        if not 0.0 <= label_smoothing <= 1.0:
            raise TensorAssertionError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        _int_labels("sparse_categorical_crossentropy", Y)
        log_probs = self.log_softmax(axis=-1)
        c = as_int(self.shape[-1])
        mask = Y != ignore_index
        # a label outside [0, c) that is not ignore_index is an error (found on the device: speck.tensor.bounds)
        labels = checked(Y, "sparse_categorical_crossentropy", 0, c, allow=ignore_index, device=self.device)
        y = (labels.reshape(*Y.shape, 1) == type(self).arange(c, device=self.device)).where(1.0, 0.0)
        y = y * mask.reshape(*Y.shape, 1)
        loss_t = -(log_probs * y).sum(axis=-1)
        smooth = -(log_probs.mean(axis=-1)) * mask
        loss_t = (1 - label_smoothing) * loss_t + label_smoothing * smooth
        return _reduce(loss_t, reduction, mask.sum())

    def cross_entropy(self: Tensor, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                      ignore_index: int = -100) -> Tensor:  # fmt: skip
        """Cross entropy of logits in torch's layout (classes on dim 1, or dim 0 of a 1-D input) against class
        indices (the shape without the class dim) or class probabilities (self's shape)."""
        tensor_args("cross_entropy", "target", (Y,), type(self))
        real("cross_entropy", "label_smoothing", label_smoothing)
        x, y = self._classes_last(), Y._classes_last() if Y.shape == self.shape else Y
        if Y.shape == self.shape:
            c = as_int(x.shape[-1])
            yp = y * (1 - label_smoothing) + label_smoothing / c
            return _reduce(-(x.log_softmax(axis=-1) * yp).sum(axis=-1), reduction, None)
        if y.shape != x.shape[:-1]:
            raise TensorValueError(f"cross_entropy: target shape {Y.shape} must be the input's {self.shape} without "
                                   "the class dim (indices) or equal to it (probabilities)")  # fmt: skip
        return x.sparse_categorical_crossentropy(y, ignore_index, label_smoothing, reduction)

    def _classes_last(self: Tensor) -> Tensor:
        """torch's (N, C, *d) layout -> (N, *d, C) (a 1-D tensor is its own class dim)."""
        return self if self.ndim <= 2 else self.permute(0, *range(2, self.ndim), 1)

    def nll_loss(self: Tensor, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
                 reduction: str = "mean") -> Tensor:  # fmt: skip
        """Negative log likelihood of log-probabilities (N, C, *d) at integer labels (N, *d); weighted mean =
        sum of losses / sum of the weights of the non-ignored targets."""
        tensor_args("nll_loss", "target", (Y,) if weight is None else (Y, weight), type(self))
        if ignore_index is not None:  # (a list failed as an unhashable constant, bytes inside the scheduler)
            whole("nll_loss", "ignore_index", ignore_index)
        _int_labels("nll_loss", Y)
        self = self._classes_last()
        c = as_int(self.shape[-1])
        labels = checked(Y, "nll_loss", 0, c, allow=ignore_index, device=self.device)  # (speck.tensor.bounds)
        onehot = (labels.reshape(*Y.shape, 1) == type(self).arange(c, device=self.device)).where(1.0, 0.0)
        w = onehot * (weight.reshape(1, c) if weight is not None else 1.0)
        if ignore_index is not None:
            w = w * (Y != ignore_index).reshape(*Y.shape, 1)
        loss = -(self * w).sum(axis=-1)
        return _reduce(loss, reduction, w.sum())

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """BCE of probabilities in (0, 1) (log clamped at -100 like PyTorch)."""
        tensor_args("binary_crossentropy", "target", (Y,))
        loss = -(Y * self.log().maximum(-100) + (1 - Y) * (1 - self).log().maximum(-100))
        return _reduce(loss, reduction, None)

    def binary_crossentropy_logits(self: Tensor, Y: Tensor, reduction: str = "mean",
                                   pos_weight: Tensor | None = None) -> Tensor:  # fmt: skip
        """BCE of logits, computed stably: max(x, 0) - x*y + log(1 + exp(-|x|))."""
        tensor_args("binary_crossentropy_logits", "target", (Y,))
        if pos_weight is not None:
            tensor_args("binary_crossentropy_logits", "pos_weight", (pos_weight,))
        log_w = 1 + (pos_weight - 1) * Y if pos_weight is not None else 1
        loss = (1 - Y) * self + log_w * ((-self.abs()).exp().add(1).log() + (-self).maximum(0))
        return _reduce(loss, reduction, None)

    def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     scale: float | None = None, enable_gqa: bool = False) -> Tensor:  # fmt: skip
        """softmax(q @ k^T * scale + mask) @ v; a bool mask keeps True positions, a float mask is added."""
        tensor_args("scaled_dot_product_attention", "key/value", (key, value), type(self))
        is_causal = flag("scaled_dot_product_attention", "is_causal", is_causal)
        enable_gqa = flag("scaled_dot_product_attention", "enable_gqa", enable_gqa)
        if enable_gqa and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:  # grouped-query: repeat k/v heads
            key = key.repeat_interleave(as_int(self.shape[-3]) // as_int(key.shape[-3]), dim=-3)
            value = value.repeat_interleave(as_int(self.shape[-3]) // as_int(value.shape[-3]), dim=-3)
        s = scale if scale is not None else 1 / math.sqrt(as_int(self.shape[-1]))
        # scores at least in float32 (half q.k of 100s overflows before the scale brings it back), cast to the
        # query's dtype for the softmax
        acc = dtypes.as_concrete(least_upper_dtype(self.dtype, key.dtype, dtypes.float32))
        qk = self.matmul(key.transpose(-2, -1), dtype=acc) * s
        if is_causal:
            if attn_mask is not None:
                raise TensorValueError("pass either attn_mask or is_causal=True, not both")
            lq, lk = self.shape[-2], key.shape[-2]
            attn_mask = type(self).ones(lq, lk, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is not None:
            tensor_args("scaled_dot_product_attention", "attn_mask", (attn_mask,), type(self))
            qk = attn_mask.where(qk, -math.inf) if attn_mask.dtype == dtypes.bool else qk + attn_mask
        if dtypes.is_float(self.dtype) and not self.dtype.is_weak:
            qk = qk.cast(self.dtype)
        return qk.softmax(-1).dropout(dropout_p) @ value


def _reduce(loss: Tensor, reduction: str, count: Tensor | None) -> Tensor:
    if not isinstance(reduction, str):  # (an array failed on `==` with numpy's "truth value ... is ambiguous")
        raise TensorTypeError(f"reduction must be 'none', 'sum' or 'mean', got {type(reduction).__name__} "
                              f"{reduction!r:.40}")  # fmt: skip
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        if count is None:
            return loss.mean()
        # the sum over the counted positions' weight (a weighted nll_loss's may be below 1; none counted: 0/0 = nan,
        # as an empty mean and PyTorch)
        out = loss.sum() / count
        # the loss's dtype, as tinygrad's (a float32 weight sum would turn a half loss float32)
        return out.cast(loss.dtype) if dtypes.is_float(loss.dtype) and not loss.dtype.is_weak else out
    raise TensorValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


WGRAD_CHUNK = 16  # batch elements per partial sum of a convolution's weight gradient


def _conv_bias(bias: Tensor, cout: int | UOp, nsp: int) -> Tensor:
    if math.prod(bias.shape) != cout:
        raise TensorAssertionError(f"conv bias must have one value per output channel, shape ({cout},); got shape "
                                   f"{bias.shape}")  # fmt: skip
    return bias.reshape(1, cout, *([1] * nsp))


def _conv_gradient(out: Tensor, x: Tensor, weight: Tensor, groups: int, st: tuple[int, ...], dl: tuple[int, ...],
                   k: tuple[int, ...], wgrad: Callable[[Tensor], Tensor] | None = None) -> None:  # fmt: skip
    """Differentiate a convolution directly. Walking its graph would give the input gradient as a sum over every
    window of a (N, Cin, *out, *k) tensor of per-window gradients (im2col's col2im), which a kernel can't compute
    without first writing that tensor out; the transposed convolution of the output gradient is the same value as
    one convolution kernel. The weight gradient is the windows times the output gradient, summed over batch and
    output positions (what the graph walk gives too); `wgrad` computes it instead (a Winograd convolution's)."""
    nsp = len(k)
    n = x.shape[0]
    cout, cin_g = weight.shape[:2]
    osp = out.shape[2:]
    if not all(isinstance(v, int) for v in (*x.shape[2:], *osp)):
        return  # a symbolic spatial size: the graph's own gradient (the transposed convolution needs numbers)
    # rows at the end of the input no strided window reaches get no gradient: output_padding restores the size
    opad = tuple(as_int(xs) - ((as_int(o) - 1) * s + d * (kk - 1) + 1)
                 for xs, o, s, d, kk in zip(x.shape[2:], osp, st, dl, k))  # fmt: skip

    # (the rule holds no tensor: out's would keep its node, the override table's weak key, alive for good)
    cls, xu, xdev, wu, wdev = type(out), x.uop, x.device, weight.uop, weight.device

    def rule(ctx: UOp) -> tuple[UOp | None, ...]:
        # the output gradient (often a long elementwise chain: BatchNorm and ReLU backward) is computed once, into
        # a buffer both gradients read, rather than fused into the padded copy and the channel-last copy each
        g = cls(ctx, device=xdev).contiguous()
        w = cls(wu, device=wdev)
        gx = g.conv_transpose2d(w, groups=groups, stride=st, dilation=dl, output_padding=opad)
        if wgrad is not None:  # a Winograd convolution's own (winograd.weight_gradient)
            return gx.uop, wgrad(g).uop
        win = cls(xu, device=xdev)._windows(k, st, dl).reshape(n, groups, 1, cin_g, *osp, *k)
        # the output gradient channel-last in a buffer of its own, so the kernel vectorizes over output channels;
        # with one input channel per group (a first layer) the kernel vectorizes along output rows instead, where
        # the gradient is contiguous as it is (conv1: the copy and its 1.4 ms go)
        gl = (
            g
            if cin_g == 1
            else g.permute(0, *range(2, 2 + nsp), 1).contiguous().permute(0, 1 + nsp, *range(1, 1 + nsp))
        )
        gg = gl.reshape(n, groups, cout // groups, 1, *osp, *([1] * nsp))
        prod_ = win * gg
        # split the batch: each chunk's windows and gradient stay in cache while its partial sums accumulate (a
        # kernel of its own), then the partial sums add up
        # (a symbolic batch size is summed in one go)
        chunk = max(d for d in range(1, min(n, WGRAD_CHUNK) + 1) if n % d == 0) if isinstance(n, int) and n else 0
        if isinstance(n, int) and 4 <= chunk < n:
            parts = prod_.reshape(n // chunk, chunk, *prod_.shape[1:]).sum(axis=(1, *range(5, 5 + nsp)))
            gw = parts.sum(0).reshape(cout, cin_g, *k)
        else:
            gw = prod_.sum(axis=(0, *range(4, 4 + nsp))).reshape(cout, cin_g, *k)
        return gx.uop, gw.uop

    override_gradient(out.uop, (xu, wu), rule)


def _unpool_gradient(out: Tensor, x: Tensor, flat_idx: Tensor, pooled: tuple[Any, ...]) -> None:
    """max_unpool2d's gradient is the output gradient read back at each value's index: every pooled value moved to
    its position whole, also where overlapping windows put one value there twice (the forward keeps it once)."""
    nsp = len(pooled)
    idx_uop, device, cls = flat_idx.uop, x.device, type(out)

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        gt = cls(g, device=device)
        gf = gt.flatten(-nsp) if nsp > 1 else gt
        gx = gf.gather(-1, cls(idx_uop, device=device))
        return (gx.reshape(*gx.shape[:-1], *pooled).uop,)

    override_gradient(out.uop, (x.uop,), rule)
