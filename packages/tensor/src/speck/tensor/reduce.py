# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Reductions, scans, sorting and linear algebra on Tensor. Everything reduces through one primitive,
REDUCE_AXIS with ADD, MUL or MAX; min/argmax/cumsum/sort/matmul are built from it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from typing import cast as _as

from speck.tensor.device import two_devices_error
from speck.tensor.dims import as_int, flag, real, tensor_args, whole
from speck.tensor.elementwise import Device, broadcast_to, cast, const, join
from speck.tensor.errors import TensorIndexError, TensorNotImplementedError, TensorTypeError, TensorValueError
from speck.tensor.linalg import newton_schulz, qr, svd
from speck.tensor.movement import reshape, resolve_dim
from speck.tensor.nodes import _dt
from speck.tensor.settings import REDUCEOP_SPLIT_THRESHOLD, SPLIT_REDUCEOP
from speck.tensor.weak import materialized
from speck.uop import DType, Ops, UOp, dtypes, least_upper_dtype, least_upper_float, sint, sum_acc_dtype
from speck.uop.dtype import WEAK_DTYPES
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


# Packing the right operand of a large matmul (see _packed_product). The stripe is one 64-byte cache line of columns
# (16 float32s: the CPU heuristic's 4x16 register block reads exactly one stripe row per reduce step).
PACK_STRIPE_BYTES = 64
PACK_MIN_ELEMENTS = 1 << 18  # k*m of one right operand from which packing pays for its extra kernel
PACK_MIN_ROWS = 16  # fewer output rows than this: the copy would cost about as much as the product itself
PACK_DTYPES = (dtypes.float32, dtypes.float64)
# scans (cumsum/cumprod/cummax) longer than this split into blocks (see _blocked_scan); shorter ones are one (n, n)
# masked reduce, a single kernel
SCAN_BLOCKED_FROM = 1024
# SPLIT_REDUCEOP (see _split_reduce): at most this many partial results per output, and at most this many in all
SPLIT_REDUCE_PARTS = 256
SPLIT_REDUCE_SIZE = 1 << 22


def _packed_product(x: Tensor, w: Tensor, dtype: DType | None) -> Tensor | None:
    """x @ w for large float matrices with w first copied into column-stripe-major order, or None when that does not
    pay (small, symbolic or non-float shapes; then the caller builds the plain one-kernel product).

    Read in place, a stripe of 16 columns of a row-major w is 16 floats every m*itemsize bytes: with m a multiple of
    1024 every row of the stripe maps to the same few cache sets, so the stripe a register-blocked kernel walks for
    every block of rows never stays cached (2048x2048 float32 ran at a tenth of numpy's speed). One extra O(k*m)
    kernel copies w to (..., m/16, k, 16); the product out[i, jb, jl] = sum_r x[i, r] * wp[jb, r, jl] then streams each
    stripe contiguously, and the heuristic register-blocks rows of x against it (its loads of wp through j//16 and
    j%16 become plain vector loads once the column axis is split by 16)."""
    shapes = (*x.shape, *w.shape)
    if x.dtype not in PACK_DTYPES or not all(isinstance(d, int) for d in shapes):
        return None
    n, k, m = x.shape[-2], x.shape[-1], w.shape[-1]
    stripe = PACK_STRIPE_BYTES // x.dtype.itemsize
    if m % stripe or m == stripe or k * m < PACK_MIN_ELEMENTS or n < PACK_MIN_ROWS:
        return None
    if x.uop.op is Ops.PERMUTE:
        # a transposed x walks its rows with a stride of n elements: the same cache-set aliasing as w's stripes, so
        # it gets a row-major copy of its own (O(n*k), next to the O(n*k*m) product)
        x = x.contiguous()
    nb = w.ndim - 2
    wp = w.reshape(*w.shape[:-1], m // stripe, stripe).permute(*range(nb), nb + 1, nb, nb + 2).contiguous()
    xe = x.reshape(*x.shape[:-1], 1, k, 1)  # (..., n, 1, k, 1)
    out = (xe * wp.unsqueeze(-4)).sum(-2, dtype=dtype)  # (..., n, m/16, 16)
    return out.reshape(*out.shape[:-2], m)


def product_dtype(dt: DType, dtype: Any) -> DType:
    """The dtype a contraction (dot, einsum, conv2d) multiplies its operands in: their join `dt`, or the requested
    accumulation dtype when that is wider. int8 @ int8 with dtype=int32 then multiplies in int32, as an int8 tensor
    core does, instead of wrapping each product to int8 before the int32 sum (100 * 2 would add as -56)."""
    acc = _dt(dtype)
    return acc if acc is not None and not acc.is_weak and acc is not dt and least_upper_dtype(dt, acc) is acc else dt


# ---------------- the primitive: REDUCE_AXIS over UOps (tensor.py wraps these) ----------------
def axes_of(shape: tuple[sint, ...], axis: Any) -> tuple[int, ...]:
    """axis (an int, a sequence of them or None = all) as resolved dims of shape."""
    if axis is None:
        return tuple(range(len(shape)))
    try:
        ax = (axis,) if isinstance(axis, int) or hasattr(type(axis), "__index__") else tuple(axis)
    except TypeError:  # not iterable: a float, a tensor...
        raise TensorTypeError(f"axis must be an int, a sequence of ints or None, got {type(axis).__name__} "
                              f"{axis!r}") from None  # fmt: skip
    out = tuple(resolve_dim(shape, a) for a in ax)
    if len(set(out)) != len(out):
        raise TensorValueError(f"axis {axis} repeats a dim; name each dim at most once")
    return out if shape else ()  # a 0-d tensor accepts axis 0 / -1 and has nothing to reduce


def concrete(u: UOp) -> UOp:
    """u at a concrete dtype: reductions and scans first make a weak (literal) graph concrete, at the dtype it reads
    as (default int/float; int64 for int literals beyond the default int)."""
    return join(u, materialized(u)) if u.dtype in WEAK_DTYPES else u


_REDUCE_NAMES = {Ops.ADD: "sum", Ops.MUL: "prod", Ops.MAX: "max"}


def reduce(u: UOp, dev: Device, op: Ops, axis: Any = None, keepdim: bool = False) -> tuple[UOp, Device]:
    """op (ADD, MUL or MAX) over axis, with the result's device (an empty MAX is a constant: device-less when u is
    sharded)."""
    if keepdim is not False and keepdim is not True:
        keepdim = flag(_REDUCE_NAMES.get(op, "reduce"), "keepdim", keepdim)
    u = concrete(u)
    shape = u.shape
    axes = axes_of(shape, axis)
    if not shape:
        return u, dev
    kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
    dropped = tuple(s for i, s in enumerate(shape) if i not in axes)
    if op is Ops.MAX and any(isinstance(shape[a], int) and shape[a] == 0 for a in axes):
        # an empty max is the identity: the dtype's minimum (-inf for floats)
        cdev = None if type(dev) is tuple else dev
        ret = broadcast_to(const(dtypes.min(u.dtype), u.dtype, cdev), kept)
        return (ret if keepdim else reshape(ret, dropped)), cdev
    split = split_reduce(u, op, axes)
    ret = split if split is not None else u.reduce_axis(op, axes)
    if ret is u and _is_buffer_view(u):
        # only size-1 dims reduced: the values are u's, but a reduction is a read of its time, not a view of the
        # buffer that later writes to it would show through (x.sum() before x.assign(...) keeps the old sum)
        ret = UOp(Ops.CONTIGUOUS, u.dtype, (u,))
    if ret.shape != kept:
        ret = reshape(ret, kept)
    return (ret if keepdim else reshape(ret, dropped)), dev


def _is_buffer_view(u: UOp) -> bool:
    """u is movement ops over a BUFFER (a realized tensor or a view of one)."""
    while u.op not in (Ops.BUFFER,) and u.src and u.op in _MOVEMENT_OPS:
        u = u.src[0]
    return u.op is Ops.BUFFER


_MOVEMENT_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.DETACH})


def split_reduce(u: UOp, op: Ops, axes: tuple[int, ...]) -> UOp | None:
    """A reduction of many inputs into few outputs as two kernels (SPLIT_REDUCEOP), or None: the largest reduced
    dim n splits into (d, n/d) and the first kernel reduces everything but d, so d partial results per output
    give the CPU workers something to divide (a full sum is otherwise one thread's loop: 16M float32 went from
    6.6 to 11 GB/s on 2 cores); the second kernel reduces the d partials. Outputs keep the reduce's shape."""
    shape = u.shape
    if not SPLIT_REDUCEOP or not axes or not all(isinstance(s, int) for s in shape):
        return None
    out = prod(s for i, s in enumerate(shape) if i not in axes)
    if out == 0 or prod(shape) // out < REDUCEOP_SPLIT_THRESHOLD.value:
        return None
    if any(n.op is Ops.CMPEQ for n in u.toposort()):
        # integer-tensor indexing (a one-hot compare, summed): the scheduler folds it into direct loads, which a
        # split of the reduced axis would prevent (two index tensors into a 2000x2000 target: 600 -> 10M ops)
        return None
    dim = max(axes, key=lambda a: shape[a])
    n = as_int(shape[dim])
    d = next((d for d in range(min(SPLIT_REDUCE_PARTS, SPLIT_REDUCE_SIZE // out), 7, -1) if n % d == 0), None)
    if d is None:
        return None
    parts = reshape(u, (*shape[:dim], d, n // d, *shape[dim + 1 :]))
    first = parts.reduce_axis(op, tuple(a + (a >= dim) for a in axes))  # d stays, n/d is reduced
    kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
    return first.reduce_axis(op, (dim,)).reshape(kept)


def sum_(
    u: UOp, dev: Device, axis: Any = None, keepdim: bool = False, dtype: DType | None = None
) -> tuple[UOp, Device]:
    """Sum over axis (int, tuple or None = all); small ints accumulate in int32, halves in float32."""
    u = concrete(u)
    ret, dev = reduce(cast(u, dtype or sum_acc_dtype(u.dtype)), dev, Ops.ADD, axis, keepdim)
    narrow = u.dtype in (dtypes.float16, dtypes.bfloat16) or dtypes.is_fp8(u.dtype)
    return (cast(ret, u.dtype) if dtype is None and narrow else ret), dev


def prod_(
    u: UOp, dev: Device, axis: Any = None, keepdim: bool = False, dtype: DType | None = None
) -> tuple[UOp, Device]:
    """Product over axis; keeps u's dtype (ints wrap as in their own width) unless dtype is given."""
    u = concrete(u)
    ret, dev = reduce(cast(u, dtype or sum_acc_dtype(u.dtype)), dev, Ops.MUL, axis, keepdim)
    return (cast(ret, u.dtype) if dtype is None else ret), dev


class ReduceMixin:
    """The reductions, scans, sorting and linear algebra of Tensor: the primitives (sum, prod, max: the functions
    above, through tensor.py's wrappers `_reduced` / `_reduce`) and what is composed from them."""

    __slots__ = ()

    # ---------------- the primitives, wrapped (Tensor._reduced) ----------------
    def _axes(self: Tensor, axis: Any) -> tuple[int, ...]:
        return axes_of(self.shape, axis)

    def _concrete(self: Tensor) -> Tensor:
        u = self.uop
        return self if (c := concrete(u)) is u else self._new(c)

    def sum(self: Tensor, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """Sum over axis (int, tuple or None = all); small ints accumulate in int32, halves in float32."""
        return self._reduced(*sum_(self.uop, self._device, axis, keepdim, _dt(dtype)))

    def prod(self: Tensor, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        """Product over axis; keeps self's dtype (ints wrap as in their own width) unless dtype is given."""
        return self._reduced(*prod_(self.uop, self._device, axis, keepdim, _dt(dtype)))

    def max(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        self._nonempty("max", axis)
        return self._reduce(Ops.MAX, axis, keepdim)

    def _nonempty(self: Tensor, op: str, axis: Any) -> None:
        """max and min over zero elements have no value (numpy and torch raise; tinygrad's -inf would be a silent
        wrong value). Internal reductions that want the identity (any, softmax of nothing) call _reduce."""
        if self.ndim and any(isinstance(self.shape[a], int) and self.shape[a] == 0 for a in self._axes(axis)):
            raise TensorValueError(f"{op}() of an empty axis (axis {axis}, shape {self.shape}) has no value: "
                                   "reduce a non-empty axis or check the size first")  # fmt: skip

    def min(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        keepdim = flag("min", "keepdim", keepdim)
        self._nonempty("min", axis)
        if dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            return self.bitwise_not().max(axis, keepdim).bitwise_not()
        return -((-self).max(axis, keepdim))

    def any(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.bool()._reduce(Ops.MAX, axis, flag("any", "keepdim", keepdim))

    def all(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, flag("all", "keepdim", keepdim)).logical_not()

    def _count(self: Tensor, axis: Any) -> Any:
        return prod(self.shape[a] for a in self._axes(axis))

    def mean(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        keepdim = flag("mean", "keepdim", keepdim)
        self = self._concrete()
        ft = least_upper_float(self.dtype)
        n = self._count(axis)
        # divided in the accumulation dtype before the cast back: half's sum of 70000 twos is inf, its mean 2
        s = self.cast(ft).sum(axis, keepdim, dtype=sum_acc_dtype(ft))
        return (s / n if not (isinstance(n, int) and n == 0) else s * math.nan).cast(ft)

    def var(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        """Variance with Bessel-style correction (default 1, like tinygrad/torch; numpy's ddof). Squares are taken,
        summed and divided in the accumulation dtype (float32 for half, where 400**2 is already inf), then cast back,
        as mean does."""
        keepdim = flag("var", "keepdim", keepdim)
        real("var", "correction", correction)  # (a dtype here failed in `n - correction`)
        m = self.mean(axis, keepdim=True)
        n = self._count(axis)
        acc = sum_acc_dtype(m.dtype)
        sq = ((self.cast(m.dtype) - m).cast(acc) ** 2).sum(axis, keepdim)
        out: Tensor = sq / max(n - correction, 0)  # no degrees of freedom left: x / 0 (inf, or NaN for one element)
        return out.cast(m.dtype)

    def std(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def var_mean(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first maximum (over the flattened tensor when axis is None)."""
        keepdim = flag("argmax", "keepdim", keepdim)
        if axis is None:
            r = self.flatten().argmax(0)
            return r.reshape((1,) * self.ndim) if keepdim else r
        d = self._resolve_dim(axis)
        if self.ndim == 0:
            return type(self)(0, dtype=dtypes.int32, device=self.device)
        if not isinstance(sym := self.shape[d], int):  # a symbolic dim (bound Variable): least index of a maximum
            ar = type(self).arange(sym, device=self.device).reshape((sym,) + (1,) * (self.ndim - d - 1))
            hit = (self == self.max(d, keepdim=True)) | (self.isnan() if dtypes.is_float(self.dtype) else False)
            return -(hit.where(-ar, -(2**31)).max(d, keepdim)).cast(dtypes.int32)
        n = as_int(self.shape[d])
        if n == 0:
            raise TensorValueError(f"argmax over an empty axis (axis {axis}, shape {self.shape}) has no value")
        m = self.max(d, keepdim=True)
        rev = type(self).arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (self.ndim - d - 1))
        hit = (self == m) | (self.isnan() if dtypes.is_float(self.dtype) else False)
        idx = hit.where(rev, 0).max(d, keepdim)
        return (n - idx).cast(dtypes.int32)

    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        x = self.bitwise_not() if (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool) else -self
        return x.argmax(axis, keepdim)

    def logsumexp(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
        keepdim = flag("logsumexp", "keepdim", keepdim)
        m = self._reduce(Ops.MAX, axis, keepdim=True)  # (of nothing: -inf, and the sum of nothing is log 0)
        m = m.isinf().where(0.0, m)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in self._axes(axis)))

    def softmax(self: Tensor, axis: int = -1, dtype: Any = None) -> Tensor:
        x = self.cast(dtype) if dtype is not None else self._float()
        e = (x - x._reduce(Ops.MAX, axis, keepdim=True)).exp()  # (an empty axis: an empty result)
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self: Tensor, axis: int = -1, dtype: Any = None) -> Tensor:
        x = self.cast(dtype) if dtype is not None else self._float()
        m = x - x._reduce(Ops.MAX, axis, keepdim=True)
        return m - m.exp().sum(axis, keepdim=True).log()

    def softmin(self: Tensor, axis: int = -1, dtype: Any = None) -> Tensor:
        return (-self._float()).softmax(axis, dtype)

    def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """x / max(||x||_p over dim, eps) (torch.nn.functional.normalize)."""
        p, eps = real("normalize", "p", p), real("normalize", "eps", eps)
        if p != p:
            raise TensorValueError("normalize: p is NaN; pass a norm order (a number, inf or -inf)")
        x = self._float()
        if p in (math.inf, -math.inf, 0):  # (the power-sum formula gave x back for inf, divided by 0 for 0)
            a = x.abs()
            norm = a.max(dim, keepdim=True) if p > 0 else a.min(dim, keepdim=True) if p < 0 else (
                (x != 0).sum(dim, keepdim=True).cast(x.dtype))  # fmt: skip
        else:
            norm = (x.abs() ** p).sum(dim, keepdim=True) ** (1 / p)
        return x / norm.maximum(eps)

    # ---------------- scans ----------------
    def _scan(self: Tensor, axis: int, op: str) -> Tensor:
        """Inclusive scan along axis via a masked (n, n) reduce: element i combines elements j <= i."""
        self = self._concrete()
        d = self._resolve_dim(axis)
        if self.ndim == 0 or as_int(self.shape[d]) == 0:  # nothing to combine: the input, in the dtype sum gives
            return self.sum(()) if op == "sum" else self
        n = as_int(self.shape[d])
        x = self.transpose(d, -1) if d != self.ndim - 1 else self
        if n > SCAN_BLOCKED_FROM:
            r = x._blocked_scan(op)
            return r.transpose(d, -1) if d != self.ndim - 1 else r
        xs = x.unsqueeze(-2).expand(x.shape[:-1] + (n, n))  # [..., i, j] = x[..., j]
        i = type(self).arange(n, device=self.device).reshape(n, 1)
        j = type(self).arange(n, device=self.device).reshape(1, n)
        mask = j <= i
        if op == "sum":
            r = mask.where(xs, xs._const_like(0)).sum(-1)
        elif op == "prod":
            r = mask.where(xs, xs._const_like(1)).prod(-1)
        else:
            lo = -math.inf if dtypes.is_float(xs.dtype) else dtypes.min(xs.dtype)
            r = mask.where(xs, xs._const_like(lo))._reduce(Ops.MAX, -1)
        return r.transpose(d, -1) if d != self.ndim - 1 else r

    def _blocked_scan(self: Tensor, op: str) -> Tensor:
        """The scan of the last dim in blocks of about sqrt(n): scans within blocks, a scan of the block totals, and
        one combine: O(n^1.5) work instead of the (n, n) reduce's O(n^2) (65536 elements: 0.8 s -> ms)."""
        n = as_int(self.shape[-1])
        b = math.isqrt(n - 1) + 1
        nb = -(-n // b)
        ident: float | int | bool = 0 if op == "sum" else 1 if op == "prod" else dtypes.min(self.dtype)
        lead = tuple(self.shape[:-1])
        keep = ((0, 0),) * len(lead)
        x = self.pad((*keep, (0, nb * b - n)), value=ident) if nb * b != n else self
        inner = x.reshape(*lead, nb, b)._scan(-1, op)  # scans within each block
        totals = inner[..., -1]._scan(-1, op)  # (..., nb): the scan of the block totals
        before = totals.pad((*keep, (1, 0)), value=ident)[..., :nb].unsqueeze(-1)  # what precedes each block
        r = inner + before if op == "sum" else inner * before if op == "prod" else inner.maximum(before)
        return r.reshape(*lead, nb * b)[..., :n]

    def _symbolic_scan(self: Tensor, axis: int, scan: Callable[[Tensor], Any], fill: Any = 0) -> Any:
        """`scan(self)` for a scan along axis, also when that dim is symbolic (a bound Variable, as in a KV cache):
        the axis is padded (with `fill`) to its upper bound, scanned at that concrete size, and cut back. The scans
        are inclusive prefixes, so the padding (after the real elements) never reaches the kept ones; a sort pads
        with a value that sorts last. None when the dim is concrete (the caller scans directly)."""
        if self.ndim == 0 or isinstance(n := self.shape[d := self._resolve_dim(axis)], int):
            return None
        top = int(n.vmax)
        pads = tuple((0, top - n) if k == d else (0, 0) for k in range(self.ndim))
        cut = tuple((0, n) if k == d else None for k in range(self.ndim))
        out = scan(self.pad(pads, value=fill))
        return tuple(o.shrink(cut) for o in out) if isinstance(out, tuple) else out.shrink(cut)

    def cumsum(self: Tensor, axis: int = 0) -> Tensor:
        if (r := self._symbolic_scan(axis, lambda x: x.cumsum(axis))) is not None:
            return _as("Tensor", r)
        return self._scan(axis, "sum")

    def cumprod(self: Tensor, axis: int = 0) -> Tensor:
        if (r := self._symbolic_scan(axis, lambda x: x.cumprod(axis))) is not None:
            return _as("Tensor", r)
        return self._scan(axis, "prod")

    def cummax(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running maximum, int32 index of its first occurrence) along axis."""
        if (r := self._symbolic_scan(axis, lambda x: x.cummax(axis))) is not None:
            return _as("tuple[Tensor, Tensor]", r)
        v = self._scan(axis, "max")
        return v, self._first_index_of(v, axis)

    def cummin(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running minimum, int32 index of its first occurrence) along axis."""
        if (r := self._symbolic_scan(axis, lambda x: x.cummin(axis))) is not None:
            return _as("tuple[Tensor, Tensor]", r)
        if dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            v = self.bitwise_not()._scan(axis, "max").bitwise_not()
        else:
            v = -((-self)._scan(axis, "max"))
        return v, self._first_index_of(v, axis)

    def _first_index_of(self: Tensor, v: Tensor, axis: int) -> Tensor:
        """For each position i along axis: the smallest j <= i with self[j] == v[i] (v a running extreme)."""
        if self.ndim == 0:
            return type(self)(0, dtype=dtypes.int32, device=self.device)
        d = self._resolve_dim(axis)
        n = as_int(self.shape[d])
        if n == 0:
            return self.cast(dtypes.int32)
        x, vv = self.transpose(d, -1), v.transpose(d, -1)
        i = type(self).arange(n, device=self.device).reshape(n, 1)
        j = type(self).arange(n, device=self.device).reshape(1, n)
        same = x.unsqueeze(-2) == vv.unsqueeze(-1)  # [..., i, j]
        if dtypes.is_float(self.dtype):  # a NaN running extreme is the first NaN's (NaN == NaN is False: index n)
            same = same | (x.unsqueeze(-2).isnan() & vv.unsqueeze(-1).isnan())
        hit = (j <= i) & same
        return hit.where(j, n).min(-1).cast(dtypes.int32).transpose(d, -1)

    def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along axis, each prefix shifted by its own maximum: one shift for the whole axis
        underflows the prefixes far below the axis maximum to log(0) = -inf."""
        if (r := self._symbolic_scan(axis, lambda x: x.logcumsumexp(axis))) is not None:
            return _as("Tensor", r)
        x = self._float()
        d = x._resolve_dim(axis)
        if x.ndim == 0 or as_int(x.shape[d]) == 0:
            return x
        n = as_int(x.shape[d])
        xt = x.transpose(d, -1) if d != x.ndim - 1 else x
        i = type(self).arange(n, device=self.device).reshape(n, 1)
        j = type(self).arange(n, device=self.device).reshape(1, n)
        r = (j <= i).where(xt.unsqueeze(-2), -math.inf).logsumexp(-1)  # [..., i] = logsumexp of x[..., :i+1]
        return r.transpose(d, -1) if d != x.ndim - 1 else r

    # ---------------- sorting ----------------
    def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """Stable sort along dim: (values, int32 indices). O(n^2) compares per row, fused into two kernels."""
        descending = flag("sort", "descending", descending)
        self = self._concrete()
        # along a symbolic dim: pad with what sorts after every real value (stable, so real ties stay first)
        last = _sorts_last(self.dtype, descending)
        if (r := self._symbolic_scan(dim, lambda x: x.sort(dim, descending), last)) is not None:
            return _as("tuple[Tensor, Tensor]", r)
        if self.ndim == 0:
            return self, type(self)(0, dtype=dtypes.int32, device=self.device)
        d = self._resolve_dim(dim)
        n = as_int(self.shape[d])
        x = self.transpose(d, -1) if d != self.ndim - 1 else self
        if n == 0:
            return self, self.cast(dtypes.int32)
        xi = x.unsqueeze(-1)  # [..., i, 1]
        xj = x.unsqueeze(-2)  # [..., 1, j]
        i = type(self).arange(n, device=self.device).reshape(n, 1)
        j = type(self).arange(n, device=self.device).reshape(1, n)
        lt, eq = (xj > xi, xj == xi) if descending else (xj < xi, xj == xi)
        if dtypes.is_float(x.dtype):  # NaN sorts above +inf (last ascending, first descending, as in PyTorch)
            nj, ni = xj.isnan(), xi.isnan()
            lt = lt | ((nj & ni.logical_not()) if descending else (ni & nj.logical_not()))
            eq = eq | (nj & ni)
        rank = (lt | (eq & (j < i))).sum(-1).contiguous()  # rank of element i: [..., i], a permutation of 0..n-1
        p = type(self).arange(n, device=self.device).reshape(1, n)
        sel = rank.unsqueeze(-1) == p  # [..., i, p]: element i lands at position p
        vals = sel.where(x.unsqueeze(-1), x._const_like(0)).sum(-2, dtype=x.dtype) if x.dtype != dtypes.bool else \
            (sel & x.unsqueeze(-1)).any(-2)  # fmt: skip
        idx = sel.where(type(self).arange(n, device=self.device).reshape(n, 1), 0).sum(-2).cast(dtypes.int32)
        if d != self.ndim - 1:
            vals, idx = vals.transpose(d, -1), idx.transpose(d, -1)
        return vals, idx

    def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
        largest = flag("topk", "largest", largest)
        if not flag("topk", "sorted_", sorted_):
            raise TensorNotImplementedError("topk(sorted_=False) is not implemented; the result is always sorted")
        if self.ndim == 0:  # (shape[0] of a 0-d tensor: a bare IndexError)
            raise TensorIndexError("topk needs a tensor of at least 1 dim; reshape(1) a 0-d tensor first")
        d = self._resolve_dim(dim)
        k = whole("topk", "k", k)
        if not isinstance(n := self.shape[d], int):  # a symbolic dim: every value it can be bound to must hold k
            if not 0 <= k <= n.vmin:
                raise TensorValueError(f"topk: k={k} must be in [0, {n.vmin}] for the symbolic dim {d} "
                                       f"({n.render()}, at least {n.vmin}); raise the Variable's lower bound or take "
                                       f"fewer")  # fmt: skip
            # sorted at the Variable's upper bound with padding that sorts last: the first k are all real elements
            x = self._concrete()
            pads = tuple((0, int(n.vmax) - n) if j == d else (0, 0) for j in range(self.ndim))
            v, i = x.pad(pads, value=_sorts_last(x.dtype, largest)).sort(d, descending=largest)
            return v._slice_dim(d, 0, k), i._slice_dim(d, 0, k)
        if not 0 <= k <= n:
            raise TensorValueError(f"topk: k={k} must be in [0, {n}] for dim {d} of shape {self.shape}")
        v, i = self.sort(d, descending=largest)
        return v._slice_dim(d, 0, k), i._slice_dim(d, 0, k)

    # ---------------- linear algebra ----------------
    def dot(self: Tensor, w: Tensor, dtype: DType | None = None) -> Tensor:
        """Matrix product with numpy's rules for 1-D operands and broadcasting of batch dims."""
        x = self
        if not hasattr(w, "uop"):  # (t @ True was an AttributeError)
            if not isinstance(w, (list, tuple)) and not hasattr(w, "__array__"):
                raise TensorTypeError(f"matmul needs a Tensor (or an array-like) operand, got {type(w).__name__} "
                                      f"{w!r}; multiply by a scalar with * instead")  # fmt: skip
            w = type(self)(w, device=self.device)
        if x.ndim == 0 or w.ndim == 0:
            raise TensorValueError(f"matmul needs at least 1-D operands, got shapes {x.shape} and {w.shape}")
        if type(x.device) is str and type(w.device) is str and x.device != w.device:
            raise two_devices_error(x.device, w.device, "matmul")
        k1, k2 = x.shape[-1], w.shape[-2] if w.ndim > 1 else w.shape[0]
        if k1 != k2:
            raise TensorValueError(f"matmul shape mismatch: {x.shape} @ {w.shape} (inner dims {k1} and {k2} differ)")
        dt = dtypes.as_concrete(least_upper_dtype(x.dtype, w.dtype))  # (int64 with uint64: weak float)
        x, w = x._joined(dt), w._joined(dt)
        if (pdt := product_dtype(dt, dtype)) is not dt:
            x, w = x.cast(pdt), w.cast(pdt)
        xv, wv = x.ndim == 1, w.ndim == 1
        if xv:
            x = x.unsqueeze(0)
        if wv:
            w = w.unsqueeze(1)
        packed = _packed_product(x, w, dtype)
        if packed is not None:
            out = packed
        else:
            # x: (..., n, k) -> (..., n, 1, k); w: (..., k, m) -> (..., 1, m, k)
            xe = x.unsqueeze(-2)
            we = w.transpose(-1, -2).unsqueeze(-3)
            out = (xe * we).sum(-1, dtype=dtype if dtype is not None else None)
        if dtype is None and out.dtype != dt:  # the result has the inputs' join (int8 @ int8 is int8, wrapping)
            out = out.cast(dt)
        if xv:
            out = out.squeeze(-2)
        if wv:
            out = out.squeeze(-1)
        return out

    def qr(self: Tensor) -> tuple[Tensor, Tensor]:
        """(Q, R) by Householder reflections (batched over leading dims)."""
        return qr(self._concrete())  # (weak input: computed at its default dtype, like the reductions)

    def svd(self: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vh), singular values descending, by one-sided Jacobi rotations."""
        return svd(self._concrete(), flag("svd", "full_matrices", full_matrices))

    def newton_schulz(self: Tensor, steps: int, params: tuple[float, ...], eps: float = 1e-7) -> Tensor:
        """Odd-polynomial (params = (a, b, c)) Newton-Schulz orthogonalization, `steps` iterations."""
        return newton_schulz(self._concrete(), steps, params, eps)

    def matmul(self: Tensor, x: Tensor, reverse: bool = False, dtype: DType | None = None) -> Tensor:
        reverse = reverse if reverse is False or reverse is True else flag("matmul", "reverse", reverse)
        if reverse and not hasattr(x, "uop"):  # (x.dot of an int: an AttributeError)
            if not isinstance(x, (list, tuple)) and not hasattr(x, "__array__"):
                raise TensorTypeError(f"matmul needs a Tensor (or an array-like) operand, got {type(x).__name__}")
            x = type(self)(x, device=self.device)
        return x.dot(self, dtype) if reverse else self.dot(x, dtype)

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None, dtype: DType | None = None) -> Tensor:
        """self @ weight + bias (weight is (in, out)); a 1-D weight multiplies elementwise."""
        tensor_args("linear", "weight", (weight,), type(self))
        out = self.matmul(weight, dtype=dtype) if weight.ndim > 1 else self * weight
        return out + bias if bias is not None else out

    @staticmethod
    def einsum(formula: str, *operands: Any, dtype: Any = None) -> Tensor:
        """numpy's einsum: explicit ('ij,jk->ik') or implicit output (letters seen once, alphabetical), '...' for
        broadcast leading dims, repeated letters in one operand take its diagonal ('ii->i', 'ii' is the trace).
        The product is one broadcast multiply reduced with sum(dtype=dtype); the result has the operands' join.
        The operands come as arguments or as one list."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if not isinstance(formula, str):  # ("'int' object has no attribute 'replace'")
            raise TensorTypeError(f"einsum: the formula must be a str like 'ij,jk->ik', got {type(formula).__name__}")
        f = formula.replace(" ", "")
        if bad := sorted(set(f.replace("...", "").replace("->", "").replace(",", "")) - set(_EINSUM_LETTERS)):
            raise TensorValueError(f"einsum {formula!r}: {bad} are not subscripts; name dims with letters a-z, A-Z "
                                   "('...': broadcast dims, ',' between operands, '->' before the output)")  # fmt: skip
        if f.count("->") > 1:
            raise TensorValueError(f"einsum {formula!r} has more than one '->'")
        lhs, out = f.split("->") if "->" in f else (f, None)
        o = (out or "").replace("...", "")
        if rep := sorted(c for c in set(o) if o.count(c) > 1):
            raise TensorValueError(f"einsum {formula!r}: output letters {rep} appear more than once; name each "
                                   "output dim once (a repeated input letter takes the diagonal)")  # fmt: skip
        ins = lhs.split(",")
        if len(ins) != len(operands):
            raise TensorValueError(f"einsum {formula!r} names {len(ins)} operands, got {len(operands)}")

        # '...' becomes as many fresh letters as the broadcast leading dims need (right-aligned across operands)
        def n_ell(s: str, t: Tensor) -> int:
            return t.ndim - len(s.replace("...", "")) if "..." in s else 0

        ne = max((n_ell(s, t) for s, t in zip(ins, operands)), default=0)
        ell = "".join(chr(0x100 + i) for i in range(ne))
        ins = [s.replace("...", ell[ne - n_ell(s, t) :]) for s, t in zip(ins, operands)]
        if out is None:
            letters = "".join(ins)
            out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
        else:
            out = out.replace("...", ell)
        ts: list[Tensor] = []
        subs: list[str] = []
        for s_, t in zip(ins, operands):
            if len(s_) != t.ndim:
                raise TensorValueError(f"einsum {formula!r}: operand {s_!r} has {len(s_)} letters for shape {t.shape}")
            while len(set(s_)) != len(s_):  # a repeated letter: keep only the diagonal of those two dims
                c = next(c for c in s_ if s_.count(c) > 1)
                p = s_.index(c)
                q = s_.index(c, p + 1)
                t = t.diagonal(0, p, q)
                s_ = "".join(x for i, x in enumerate(s_) if i not in (p, q)) + c
            ts.append(t)
            subs.append(s_)
        sizes: dict[str, Any] = {}
        for s_, t in zip(subs, ts):
            for c, n in zip(s_, t.shape):
                if c in sizes and sizes[c] != n and n != 1 and sizes[c] != 1:
                    raise TensorValueError(f"einsum {formula!r}: letter {c!r} has sizes {sizes[c]} and {n}")
                sizes[c] = n if c not in sizes or sizes[c] == 1 else sizes[c]
        for c in out:
            if c not in sizes:
                raise TensorValueError(f"einsum {formula!r}: output letter {c!r} is not in the inputs")
        full = list(out) + sorted(c for c in sizes if c not in out)
        dt = dtypes.as_concrete(least_upper_dtype(*[t.dtype for t in ts]))
        prodt: Tensor | None = None
        pdt = product_dtype(dt, dtype)
        for s_, t in zip(subs, ts):
            tt = t.cast(pdt).permute(sorted(range(len(s_)), key=lambda i: full.index(s_[i]))) if s_ else t.cast(pdt)
            present = sorted(s_, key=lambda c: full.index(c))
            tt = tt.reshape(tuple(tt.shape[present.index(c)] if c in present else 1 for c in full))
            tt = tt.expand(tuple(sizes[c] for c in full))
            prodt = tt if prodt is None else prodt * tt
        assert prodt is not None
        red = tuple(range(len(out), len(full)))
        res = prodt.sum(red, dtype=dtype) if red else prodt
        return res.cast(_dt(dtype) or dt)


_EINSUM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _sorts_last(dt: DType, descending: bool) -> Any:
    """A value a stable sort puts after every real value of dtype dt (NaN sorts above +inf, as in PyTorch)."""
    if dtypes.is_float(dt):
        return -math.inf if descending else math.nan
    return dtypes.min(dt) if descending else dtypes.max(dt)
