"""speck.tensor.nn: layers. Each layer is a plain object whose Tensor attributes are its parameters (found by
`speck.tensor.nn.state.get_parameters`); calling it applies it. Initialisation follows PyTorch's defaults."""

from __future__ import annotations

import math

from speck.tensor.bounds import checked
from speck.tensor.dims import as_int, whole
from speck.tensor.errors import TensorAssertionError, TensorTypeError, TensorValueError
from speck.tensor.gradient import override_gradient
from speck.tensor.nnops import _conv_padding
from speck.tensor.tensor import Tensor, is_training
from speck.uop import UOp, dtypes, sum_acc_dtype


def _pair(x: int | tuple[int, ...], n: int) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


def _sizes(layer: str, least: int = 1, **sizes: object) -> None:
    """Each of a layer's size arguments an int >= least (a kernel_size of 0 divided by zero, a negative one surfaced
    as "rand needs a concrete shape", an op the caller never called)."""
    for what, v in sizes.items():
        for n in v if isinstance(v, (tuple, list)) else (v,):
            if whole(layer, what, n) < least:
                raise TensorValueError(f"{layer}: {what} must be >= {least}, got {v}")


def _reals(layer: str, least: float | None = None, **values: object) -> None:
    """Each of a layer's number arguments (eps, momentum) a finite real, >= least when given: a string surfaced at the
    first call as a raw TypeError or as "can't make a Tensor from str", a negative or NaN eps as NaN outputs."""
    for what, v in values.items():
        if isinstance(v, Tensor):  # (a tensor hyperparameter is the caller's graph: taken as is)
            continue
        if isinstance(v, (str, bytes)) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise TensorTypeError(f"{layer}: {what} must be a number, got {type(v).__name__} {v!r:.40}")
        x = float(v)
        if not math.isfinite(x) or (least is not None and x < least):
            raise TensorValueError(f"{layer}: {what} must be finite" + ("" if least is None else f" and >= {least:g}")
                                   + f", got {v!r}")  # fmt: skip


def _describe(v: object) -> str:
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)} ({', '.join(type(x).__name__ for x in v)})"
    return type(v).__name__


def _channels(layer: str, x: Tensor, want: int) -> None:
    """x is (N, C, ...) with C == want: a mismatch surfaced as a reshape error naming no layer."""
    if x.ndim < 2 or (isinstance(x.shape[1], int) and x.shape[1] != want):
        raise TensorValueError(f"{layer}({want}) expects input (N, {want}, ...) with {want} channels on dim 1, got "
                               f"shape {x.shape}")  # fmt: skip


def _fresh(t: Tensor) -> Tensor:
    """A constant-initialised parameter as a tensor of its own: two lazy constants of one shape are one graph node,
    so without the copy every BatchNorm of a size would share its weight (and gradients would add up across them)."""
    return t.clone()


def _state(t: Tensor) -> Tensor:
    """A realized state tensor that optimizers realize but do not update (running statistics, counters)."""
    return t.contiguous().realize().is_param_(False)


class Linear:
    """y = x @ W.T + b with W (out, in) ~ U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        _sizes("Linear", 0, in_features=in_features, out_features=out_features)  # (None: a '<' TypeError)
        if in_features < 1 or out_features < 0:
            raise TensorValueError(f"Linear needs in_features >= 1 and out_features >= 0, got {in_features} and "
                                   f"{out_features}")  # fmt: skip
        bound = 1 / math.sqrt(in_features)
        self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
    """N-d convolution layer (Conv2d for 2 spatial dims; Conv1d/Conv3d set kernel dims): stride, padding
    (int, tuple or 'same'), dilation, groups."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int = 1,
                 padding: int | str | tuple[int, ...] = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 ndim: int = 2) -> None:  # fmt: skip
        _sizes("Conv2d", in_channels=in_channels, out_channels=out_channels, groups=groups, stride=stride,
               dilation=dilation, kernel_size=kernel_size, ndim=ndim)  # fmt: skip
        if in_channels % groups or out_channels % groups:
            raise TensorValueError(f"in_channels {in_channels} and out_channels {out_channels} must divide by groups")
        self.kernel_size = _pair(kernel_size, ndim)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        if isinstance(padding, str):  # 'same'/'valid' (any case): checked now, resolved to explicit amounts
            self.padding = tuple(p for pair in reversed(_conv_padding(padding, self.kernel_size,
                                 _pair(dilation, ndim), _pair(stride, ndim))) for p in pair)  # fmt: skip
        # the bound uses all in_channels, not in_channels // groups (tinygrad's init)
        bound = 1 / math.sqrt(in_channels * math.prod(self.kernel_size))
        self.weight = Tensor.uniform(out_channels, in_channels // groups, *self.kernel_size, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int | str = 0,
           dilation: int = 1, groups: int = 1, bias: bool = True) -> Conv2d:  # fmt: skip
    """1-d convolution layer over (N, C, L)."""
    return Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, ndim=1)


class ConvTranspose2d:
    """Transposed convolution layer; weight (in, out/groups, *k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int = 1,
                 padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 ndim: int = 2) -> None:  # fmt: skip
        _sizes("ConvTranspose2d", in_channels=in_channels, out_channels=out_channels, groups=groups, stride=stride,
               dilation=dilation, kernel_size=kernel_size, ndim=ndim)  # fmt: skip
        if in_channels % groups or out_channels % groups:
            raise TensorValueError(f"in_channels {in_channels} and out_channels {out_channels} must divide by groups")
        self.kernel_size = _pair(kernel_size, ndim)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        bound = 1 / math.sqrt(in_channels * math.prod(self.kernel_size))
        self.weight = Tensor.uniform(in_channels, out_channels // groups, *self.kernel_size, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                                  self.output_padding)  # fmt: skip


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                    output_padding: int = 0, dilation: int = 1, groups: int = 1,
                    bias: bool = True) -> ConvTranspose2d:  # fmt: skip
    """1-d transposed convolution layer."""
    return ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding, output_padding, dilation, groups,
                           bias, ndim=1)  # fmt: skip


class BatchNorm:
    """Batch normalisation over every axis but the channel axis (1). In training mode it normalises with the batch
    statistics and updates the running ones (momentum, unbiased variance); in eval mode it uses the running ones."""

    def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float = 0.1) -> None:  # fmt: skip
        _sizes("BatchNorm", sz=sz)
        _reals("BatchNorm", 0, eps=eps)
        _reals("BatchNorm", momentum=momentum)
        self.sz = sz
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = _fresh(Tensor.ones(sz)) if affine else None
        self.bias: Tensor | None = _fresh(Tensor.zeros(sz)) if affine else None
        # realized now: assign() updates realized buffers in place (and TinyJit replays those updates); a lazy
        # constant would only be rebound to a growing graph
        self.num_batches_tracked = _state(Tensor.zeros((), dtype=dtypes.int64))
        if track_running_stats:
            self.running_mean = _state(Tensor.zeros(sz))
            self.running_var = _state(Tensor.ones(sz))

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        axes = tuple(i for i in range(len(x.shape)) if i != 1)
        mean = x.mean(axis=axes)
        d = x - mean.reshape(1, -1, *([1] * (len(x.shape) - 2)))
        # in the accumulation dtype: a half deviation of 300 squares to inf, a variance of 90000 is beyond half too
        var = (d.cast(sum_acc_dtype(d.dtype)) ** 2).mean(axis=axes)
        return mean, var

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight is not None or self.track_running_stats:  # (else the channel count is the input's)
            _channels("BatchNorm", x, self.sz)
        if is_training() or not self.track_running_stats:
            mean, var = self.calc_stats(x)
            if is_training() and self.track_running_stats:
                n = as_int(x.numel()) / as_int(x.shape[1])
                # deferred: computed in the schedule that realizes the loss, not in a forward pass of their own
                rm, rv = self.running_mean, self.running_var
                optim.settle_deferred(rm, rv, self.num_batches_tracked)  # (called twice before a realize)
                rm.assign_deferred(rm * (1 - self.momentum) + mean.detach() * self.momentum)
                unbiased = var.detach() * (n / max(n - 1, 1))
                rv.assign_deferred(rv * (1 - self.momentum) + unbiased * self.momentum)
                self.num_batches_tracked.assign_deferred(self.num_batches_tracked + 1)
            invstd = (var + self.eps).rsqrt().cast(mean.dtype)  # (the batch's dtype: half stays half)
        else:
            # a training call's deferred update still pending (nothing realized since) applies first: tinygrad's
            # lazy assigns make the eval forward read the updated statistics
            optim.settle_deferred(self.running_mean, self.running_var)
            mean, var = self.running_mean, self.running_var
            invstd = (var + self.eps).rsqrt()
        return x.batchnorm(self.weight, self.bias, mean, invstd)


BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """Normalise over the trailing `normalized_shape` dims, then scale and shift elementwise."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True
                 ) -> None:  # fmt: skip
        _sizes("LayerNorm", 0, normalized_shape=normalized_shape)  # (None: "object of type ... has no len()")
        _reals("LayerNorm", 0, eps=eps)
        self.normalized_shape = _pair(normalized_shape, 1) if isinstance(normalized_shape, int) else normalized_shape
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps = eps
        self.weight = _fresh(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
        self.bias = _fresh(Tensor.zeros(*self.normalized_shape)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-len(self.normalized_shape) :]) != tuple(self.normalized_shape):
            raise TensorAssertionError(f"LayerNorm over {self.normalized_shape} got input of shape {x.shape}")
        y = x.layernorm(self.axis, self.eps)
        if self.weight is None or self.bias is None:
            return y if self.weight is None else y * self.weight
        return y * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel axis of (N, C, H, W)."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNorm:
    """Normalise each group of channels over the group's channels and spatial dims."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        _sizes("GroupNorm", num_groups=num_groups, num_channels=num_channels)
        _reals("GroupNorm", 0, eps=eps)
        if num_channels % num_groups:
            raise TensorValueError(f"num_channels {num_channels} must divide by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = _fresh(Tensor.ones(num_channels)) if affine else None
        self.bias = _fresh(Tensor.zeros(num_channels)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        _channels("GroupNorm", x, self.num_channels)
        y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None:
            return y
        shape = (1, -1) + (1,) * (len(x.shape) - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)  # type: ignore[union-attr]


class InstanceNorm:
    """Normalise each channel of each sample over its spatial dims."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        _sizes("InstanceNorm", num_features=num_features)
        _reals("InstanceNorm", 0, eps=eps)
        self.num_features, self.eps = num_features, eps
        self.weight = _fresh(Tensor.ones(num_features)) if affine else None
        self.bias = _fresh(Tensor.zeros(num_features)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight is not None:
            _channels("InstanceNorm", x, self.num_features)
        y = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None:
            return y
        shape = (1, -1) + (1,) * (len(x.shape) - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)  # type: ignore[union-attr]


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32 and cast back to x's dtype before
    the (float32) weight multiplies it (so a half input gives a float32 result, as in tinygrad)."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        _sizes("RMSNorm", 0, dim=dim)
        _reals("RMSNorm", 0, eps=eps)
        self.eps = eps
        self.weight = _fresh(Tensor.ones(dim)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight is not None and (
            x.ndim == 0 or (isinstance(x.shape[-1], int) and x.shape[-1] != self.weight.shape[0])
        ):
            raise TensorValueError(f"RMSNorm({self.weight.shape[0]}) normalizes the last dim, which must have size "
                                   f"{self.weight.shape[0]}; got input of shape {x.shape}")  # fmt: skip
        xf = x.float()
        y = (xf * (xf.square().mean(axis=-1, keepdim=True) + self.eps).rsqrt()).cast(x.dtype)
        return y if self.weight is None else y * self.weight


class Embedding:
    """Lookup table: integer indices (any shape) -> rows of a (vocab_size, embed_size) weight."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        _sizes("Embedding", vocab_size=vocab_size, embed_size=embed_size)
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        if not dtypes.is_int(idx.dtype):
            raise TensorTypeError(f"Embedding indices must be integers, got {idx.dtype}")
        # an index outside [0, vocab_size) is an error, found on the device (speck.tensor.bounds)
        ix = checked(idx, "Embedding", 0, self.vocab_sz, device=self.weight.device)
        # a row lookup, not one-hot @ weight: that multiplied every row of the table (50257 x 256 floats for each of
        # 64 tokens: 150x slower) and a non-finite value in any row made every lookup NaN (0 * inf). _take: an index
        # outside the table (possible with CHECK_OOB=0) reads a zero row, as one-hot did (getitem would wrap -1)
        out = self.weight._take(0, ix.reshape(-1, 1).expand(-1, self.embed_sz))
        if isinstance(self.weight.device, str):
            _lookup_gradient(out, self.weight, idx)
        return out.reshape(*idx.shape, self.embed_sz)


def _lookup_gradient(out: Tensor, weight: Tensor, idx: Tensor) -> None:
    """The table's gradient: a scatter-add of each looked-up row's output gradient into its row (O(N * dim) after
    zeroing it). Walking the lookup's graph gives an O(N * vocab * dim) compare-and-reduce instead, which also reads
    the bounds-checked index inside a reduction: codegen fails to linearize that kernel next to a tied weight's
    matmul gradient (GPT-2's wte with wpe; plain getitem hits it too)."""
    cls, wdev, iu, idev, wdt = type(out), weight.device, idx.uop, idx.device, weight.dtype
    vocab, dim = as_int(weight.shape[0]), as_int(weight.shape[1])

    def rule(g: UOp) -> tuple[UOp | None, ...]:
        rows = cls(iu, device=idev).reshape(-1, 1).expand(-1, dim).to(wdev)
        gw = cls.zeros(vocab, dim, dtype=wdt, device=wdev).scatter_reduce(0, rows, cls(g, device=wdev), "sum")
        return (gw.uop,)

    override_gradient(out.uop, (weight.uop,), rule)


class LSTMCell:
    """One LSTM step: (x, (h, c)) -> (h', c') with gates i, f, g, o as in PyTorch."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        _sizes("LSTMCell", input_size=input_size, hidden_size=hidden_size)  # (sqrt of a str, or of -3)
        bound = 1 / math.sqrt(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = Tensor.uniform(hidden_size * 4, input_size, low=-bound, high=bound)
        self.weight_hh = Tensor.uniform(hidden_size * 4, hidden_size, low=-bound, high=bound)
        self.bias_ih = _fresh(Tensor.zeros(hidden_size * 4)) if bias else None
        self.bias_hh = _fresh(Tensor.zeros(hidden_size * 4)) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            z = Tensor.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (z, z)
        elif not isinstance(hc, (tuple, list)) or len(hc) != 2 or not all(isinstance(t, Tensor) for t in hc):
            raise TensorTypeError(f"LSTMCell: hc must be None or a (h, c) pair of Tensors, got {_describe(hc)}; pass "
                                  "the pair the previous call returned")  # fmt: skip
        gates = x.linear(self.weight_ih.T, self.bias_ih) + hc[0].linear(self.weight_hh.T, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c = f.sigmoid() * hc[1] + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        return h, c


# `from tinygrad import nn` users reach the optimizers, state helpers and datasets as nn.optim, nn.state, nn.datasets
from speck.tensor.nn import datasets as datasets  # noqa: E402
from speck.tensor.nn import optim as optim  # noqa: E402
from speck.tensor.nn import state as state  # noqa: E402

__all__ = [
    "BatchNorm", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Embedding",
    "GroupNorm", "InstanceNorm", "LSTMCell", "LayerNorm", "LayerNorm2d", "Linear", "RMSNorm",
]  # fmt: skip
