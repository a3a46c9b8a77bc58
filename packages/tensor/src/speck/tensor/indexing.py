# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Indexing on Tensor with numpy semantics: ints, slices (any step), None, Ellipsis, boolean masks and integer
tensors (advanced indexing), plus gather/scatter and the data-dependent selections (nonzero, masked_select).

Basic indexing is pure movement (shrink, flip, a pad+reshape for steps). Integer-tensor indexing selects with a
one-hot comparison against an arange and a sum, which fuses into one kernel."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor.bounds import checked
from speck.tensor.dims import as_int, tensor_args, whole
from speck.tensor.elementwise import broadcast_shape
from speck.tensor.errors import (
    GradientError,
    TensorAssertionError,
    TensorIndexError,
    TensorTypeError,
    TensorValueError,
)
from speck.tensor.gradient import uop_device
from speck.tensor.multi import MultiUOp, replicated_node
from speck.tensor.writes import setitem, storable
from speck.uop import Ops, UOp, dtypes, resolve
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


def scatter_gradient(cls: type[Tensor], ctx: UOp, ret: UOp) -> tuple[UOp | None, ...] | None:
    """ASSIGN(base, pos, value, arg=reduce), the O(k) scatter (_scatter_node below, setitem): the
    gradient reaches base where nothing was written (everywhere for a 'sum' scatter) and each value element from the
    position it landed on, when it is the last writer there (any contributor for 'sum'); pos gets none. The gradient
    rule of ASSIGN (speck.tensor.gradient.register_gradient_rule): tensor.py registers it over its class, cls."""
    if len(ret.src) != 3:
        return None
    base, pos, value = ret.src
    if ret.arg not in (None, "sum", "prod", "amax", "amin"):
        raise GradientError(f"no gradient rule for a scatter with reduce={ret.arg!r}; detach() the result")
    dev = uop_device(ret)
    g = cls(ctx, device=dev)
    p = cls(pos, device=dev).flatten().cast(dtypes.int32)  # 1 + flat position in base, 0: skipped
    n = int(prod(base.shape))
    picked = g.flatten()._take(0, p - 1)  # position -1 (a skipped element) takes 0
    if ret.arg == "sum":
        return (ctx, None, picked.reshape(value.shape).uop)
    if ret.arg in ("prod", "amax", "amin"):
        return _scatter_reduce_gradient(cls, g.flatten(), ret, p, n)
    ids = cls.arange(1, as_int(p.shape[0]) + 1, device=dev, dtype=dtypes.int32)
    owner = cls.zeros(n, device=dev, dtype=dtypes.int32)._scatter_node(p, ids, None)  # the last writer's id
    won = owner._take(0, p - 1) == ids
    gvalue = won.where(picked, picked._const_like(0)).reshape(value.shape)
    gbase = (owner > 0).reshape(base.shape).where(g._const_like(0), g)
    return (gbase.uop, None, gvalue.uop)


def _scatter_reduce_gradient(cls: type[Tensor], g: Tensor, ret: UOp, p: Tensor, n: int) -> tuple[UOp | None, ...]:
    """Gradients of out[j] = reduce(base[j], the values landing on j) for 'prod', 'amax' and 'amin', everything
    flat (g: the output gradient, p: 1 + the position each value lands on, 0 skipped). 'prod' is exact with zeros
    (an element's gradient is the product of the others); 'amax'/'amin' split the gradient evenly between every
    contributor equal to the result, as torch does."""
    base, _, value = ret.src
    dev = g.device
    b, v = cls(base, device=dev).flatten(), cls(value, device=dev).flatten()
    landed = p > 0

    def at(t: Tensor) -> Tensor:  # t (flat over base) at each value's landing position
        return t._take(0, p - 1)

    def scatter_sum(x: Tensor) -> Tensor:
        return cls.zeros(n, device=dev, dtype=x.dtype)._scatter_node(p, x, "sum")

    if ret.arg == "prod":
        zb, zv = b == 0, landed & (v == 0)
        # the product of the non-zero contributors and the number of zero ones, per position
        nz = zb.where(1.0, b)._scatter_node(p, zv.where(1.0, v), "prod")
        zc = zb.cast(dtypes.int32) + scatter_sum(zv.cast(dtypes.int32))

        def others(x: Tensor, z: Tensor, nzx: Tensor, zcx: Tensor) -> Tensor:  # the product of x's co-contributors
            return z.where((zcx == 1).where(nzx, 0.0), (zcx == 0).where(nzx / z.where(1.0, x), 0.0))

        gb = g * others(b, zb, nz, zc)
        gv = landed.where(at(g) * others(v, zv, at(nz), at(zc)), 0.0)
    else:
        out = cls(ret, device=dev).flatten().detach()
        hb, hv = b == out, landed & (v == at(out))
        count = hb.cast(b.dtype) + scatter_sum(hv.cast(b.dtype))
        gb = hb.where(g / count, 0.0)
        gv = hv.where(at(g) / at(count), 0.0)
    return (gb.reshape(base.shape).uop, None, gv.reshape(value.shape).uop)


def _whole(t: Tensor) -> Tensor:
    """t itself, or replicated over its devices when it is sharded along an axis."""
    u = t.uop
    return t._new(u.to_devices(u.device, None)) if isinstance(u, MultiUOp) and u.axis is not None else t


def _identity(mode: str, dtype: Any) -> Any:
    """The value a scatter reduction starts from where the original element does not take part."""
    if mode == "sum":
        return 0
    if mode == "prod":
        return 1
    if dtypes.is_float(dtype):
        return -np.inf if mode == "amax" else np.inf
    return dtypes.min(dtype) if mode == "amax" else dtypes.max(dtype)


def _exceeds(a: Any, b: Any) -> bool:
    """Size a is larger than size b: for symbolic sizes, only when their bounds prove it (the same Variable on both
    sides is not larger; `a > b` of two UOps has no truth value)."""
    return a is not b and resolve(a > b, False)


def _check_variable_index(v: UOp, size: Any, dim: int) -> None:
    """A Variable used as an int index of a concrete dim: the value bound now, and the whole range when it lies
    outside the dim, must be in [0, size) (the view would read past the dim: zeros, no error)."""
    if not isinstance(size, int):
        return
    var = v.src[0] if v.op is Ops.BIND else v
    name = var.arg[0] if var.op is Ops.DEFINE_VAR else "the symbolic index"
    if v.op is Ops.BIND and not 0 <= v.src[1].arg < size:
        raise TensorIndexError(f"index {name}={v.src[1].arg} is out of bounds for dim {dim} with size {size}; bind a "
                               f"value in 0..{size - 1}")  # fmt: skip
    if v.vmax < 0 or v.vmin >= size:
        raise TensorIndexError(f"index {name} (range {v.vmin}..{v.vmax}) is out of bounds for dim {dim} with size "
                               f"{size}")  # fmt: skip


def _check_mask_shape(shape: tuple[Any, ...], mask: tuple[Any, ...], pos: int | None) -> None:
    """A boolean mask indexes len(mask) dims from pos and must have exactly their sizes (numpy's rule)."""
    if pos is None:  # after an ellipsis the mask's dims are not known here; the later shape checks apply
        return
    dims = shape[pos : pos + len(mask)]
    if len(dims) < len(mask):
        raise TensorIndexError(
            f"too many indices: a boolean mask of shape {mask} from dim {pos} of a tensor of shape {shape}"
        )
    for i, (d, m) in enumerate(zip(dims, mask)):
        if d != m:
            raise TensorIndexError(
                f"boolean index did not match the indexed tensor along dim {pos + i}: the dim is {d} but the "
                f"corresponding boolean dim is {m}; the mask must have the shape {tuple(dims)}"
            )


class IndexingMixin:
    """Indexing methods of Tensor."""

    __slots__ = ()

    def _normalize_index(self: Tensor, idx: Any) -> list[Any]:
        # tinygrad's rule (TENSOR_API 6.1): a list of ints/bools is one advanced index, a list holding anything else
        # (lists, slices, None, tensors) is a sequence of per-dim indices like a tuple: t[[[0], [2]]] is t[[0], [2]]
        # (numpy: one 2-d index; write t[[[0], [2]],] for that)
        if isinstance(idx, list) and not all(isinstance(x, (int, np.integer, np.bool_)) for x in idx):
            idx = tuple(idx)
        items = list(idx) if isinstance(idx, tuple) else [idx]
        out: list[Any] = []
        pos: int | None = 0  # the dim the next index applies to (None after an ellipsis: counted from the end)
        for it in items:
            if isinstance(it, slice) and any(isinstance(x, type(self)) for x in (it.start, it.stop, it.step)):
                # 0-d int tensors as slice bounds: their values (read now)
                it = slice(
                    *[_scalar_index(x) if isinstance(x, type(self)) else x for x in (it.start, it.stop, it.step)]
                )
            if isinstance(it, slice):
                it = _checked_slice(it)
            elif isinstance(it, np.ndarray) and it.ndim == 0:  # a 0-d array indexes as its value does (numpy)
                it = it.item()
            if isinstance(it, np.integer):
                it = int(it)
            if isinstance(it, (list, np.ndarray)):
                # an empty list selects nothing: an int index (Tensor([]) would be float)
                it = type(self)(it, device=self.device, dtype=dtypes.int32 if len(it) == 0 else None)
            if isinstance(it, type(self)) and it.dtype == dtypes.bool:
                # boolean mask: data-dependent, becomes integer index tensors of its true positions
                if it.ndim == 0:  # (numpy's nonzero refuses 0-d arrays: a bare ValueError of numpy's)
                    raise TensorIndexError(
                        "a 0-d boolean tensor is not a valid index (like a Python bool); use t[None] where it is "
                        "True, or a mask with the indexed dims' shape"
                    )
                _check_mask_shape(self.shape, it.shape, pos)
                pos = None if pos is None else pos + it.ndim
                nz = np.nonzero(it.numpy())
                out.extend(type(self)(n.astype(np.int32), device=self.device) for n in nz)
                continue
            if isinstance(it, type(self)) and not dtypes.is_int(it.dtype):
                raise TensorIndexError(f"tensors used as indices must be int or bool, got {it.dtype}")
            if isinstance(it, type(self)):
                _same_device(self, it, "getitem")
            if isinstance(it, bool):
                raise TensorIndexError("a Python bool is not a valid index; use a boolean tensor mask")
            if not (it is None or it is Ellipsis or isinstance(it, (int, slice, type(self), UOp))):
                raise TensorIndexError(f"invalid index {it!r} of type {type(it).__name__}; expected int, slice, None, "
                                       "Ellipsis, a list or an int/bool tensor")  # fmt: skip
            out.append(it)
            if it is Ellipsis:
                pos = None
            elif it is not None and pos is not None:
                pos += 1
        consumed = sum(1 for it in out if it is not None and it is not Ellipsis)
        if sum(1 for it in out if it is Ellipsis) > 1:
            raise TensorIndexError("an index can only have a single ellipsis ('...')")
        if consumed > self.ndim:
            raise TensorIndexError(f"too many indices for tensor of shape {self.shape}: {consumed} were indexed")
        if Ellipsis in [x for x in out if x is Ellipsis]:
            i = next(k for k, x in enumerate(out) if x is Ellipsis)
            out = out[:i] + [slice(None)] * (self.ndim - consumed) + out[i + 1 :]
        else:
            out = out + [slice(None)] * (self.ndim - consumed)
        return out

    def __getitem__(self: Tensor, idx: Any) -> Tensor:
        return self._getitem(idx, "getitem")

    def _getitem(self: Tensor, idx: Any, op: str) -> Tensor:
        """self[idx]; `op` names the user's op in the error an out-of-range index tensor raises (setitem selects
        its positions through this)."""
        items = self._normalize_index(idx)
        t = self
        dim = 0  # current dim in t
        final_shape: list[Any] = []
        adv: list[tuple[int, Tensor]] = []  # (dim in t, index tensor)
        user_dims: list[int] = []  # the dim of self each index tensor indexes (what an out-of-range error names)
        src_dim = -1
        adv_positions: list[int] = []  # position in final shape where each advanced index appeared
        for it in items:
            src_dim += it is not None
            if it is None:
                t = t.unsqueeze(dim)
                dim += 1
                final_shape.append(1)
                continue
            size = t.shape[dim]
            if isinstance(it, UOp):  # a bound Variable: a symbolic position (its range is the caller's promise)
                _check_variable_index(it, size, dim)
                t = t._slice_dim(dim, it, it + 1)
                t = t.reshape(t.shape[:dim] + t.shape[dim + 1 :])
                continue
            if isinstance(it, slice) and (not isinstance(size, int) or any(isinstance(x, UOp) for x in
                                                                           (it.start, it.stop, it.step))):  # fmt: skip
                t = t._symbolic_slice(dim, it)
                final_shape.append(t.shape[dim])
                dim += 1
                continue
            if isinstance(it, int) and not isinstance(size, int):  # a symbolic dim: negatives count from its end
                # (the shortest the dim can be: bound Variables count with their whole range)
                least = size.substitute({b: b.src[0] for b in size.toposort() if b.op is Ops.BIND}).vmin
                if not (-least <= it < least if it < 0 else 0 <= it < least):
                    raise TensorIndexError(f"index {it} can be out of bounds for the symbolic dim {dim} (at least "
                                           f"{least} long)")  # fmt: skip
                pos: Any = size + it if it < 0 else it
                t = t._slice_dim(dim, pos, pos + 1)
                t = t.reshape(t.shape[:dim] + t.shape[dim + 1 :])
                continue
            if isinstance(it, int):
                if not -size <= it < size:
                    raise TensorIndexError(f"index {it} is out of bounds for dim {dim} with size {size}")
                i = it + size if it < 0 else it
                t = t._slice_dim(dim, i, i + 1)
                t = t.reshape(t.shape[:dim] + t.shape[dim + 1 :])
                continue
            if isinstance(it, slice):
                assert isinstance(size, int)  # symbolic dims took the _symbolic_slice path above
                start, stop, step = it.indices(size)
                r = range(start, stop, step)
                n = len(r)
                if n == 0:
                    t = t._slice_dim(dim, 0, 0)
                else:
                    first = r[0]
                    if step < 0:
                        t = t.flip(dim)
                        first, step = size - 1 - first, -step
                    t = t._slice_dim(dim, first, first + (n - 1) * step + 1)._stride_dim(dim, step)
                final_shape.append(n)
                dim += 1
                continue
            # integer tensor (advanced)
            adv.append((dim, it))
            user_dims.append(src_dim)
            adv_positions.append(len(final_shape))
            final_shape.append(None)
            dim += 1
        if not adv:
            return t
        return t._advanced(adv, adv_positions, op, user_dims)

    def _symbolic_slice(self: Tensor, dim: int, sl: slice) -> Tensor:
        """A step-1 slice where the bounds or the dim are symbolic: a shrink with symbolic bounds (negative int bounds
        count from the end; no clamping, so bounds must be in range)."""
        if sl.step not in (None, 1):
            raise TensorTypeError(f"a slice with symbolic bounds or of a symbolic dim needs step 1, got {sl.step}")
        size = self.shape[dim]

        def bound(x: Any, default: Any) -> Any:
            if x is None:
                return default
            return size + x if isinstance(x, int) and x < 0 else x

        start, stop = bound(sl.start, 0), bound(sl.stop, size)
        if isinstance(start, int) and start == 0 and stop is size:
            return self
        return self._slice_dim(dim, start, stop)

    def _advanced(self: Tensor, adv: list[tuple[int, Tensor]], positions: list[int], op: str,
                  user_dims: list[int]) -> Tensor:  # fmt: skip
        """Apply integer-tensor indices at dims `adv` (numpy placement rules for the broadcast index shape); an index
        outside [-n, n) is an error (found on the device: speck.tensor.bounds)."""
        self = self._concrete()  # (a weak tensor - an int tensor times 2.5 - is gathered at its default dtype)
        bshape = broadcast_shape(*[ix.shape for _, ix in adv])
        dims = [d for d, _ in adv]
        rest = [i for i in range(self.ndim) if i not in dims]
        x = self.permute(rest + dims)  # (rest..., adv dims...)
        nb = len(bshape)
        rest_shape = tuple(self.shape[i] for i in rest)
        xe = x.reshape(rest_shape + (1,) * nb + tuple(self.shape[d] for d in dims))
        mask: Tensor | None = None
        for k, (d, ix) in enumerate(adv):
            n = self.shape[d]
            if not isinstance(n, int):
                raise TensorIndexError("integer-tensor indexing of a symbolic dim is not supported")
            ii = checked(ix, op, -n, n, user_dims[k], device=self.device)._broadcast_to(bshape).cast(dtypes.int32)
            ii = (ii < 0).where(ii + n, ii)
            ar = type(self).arange(n, device=self.device)
            shape_k = tuple(n if j == k else 1 for j in range(len(adv)))
            m = ii.reshape(bshape + (1,) * len(adv)) == ar.reshape((1,) * nb + shape_k)
            mask = m if mask is None else (mask & m)
        assert mask is not None
        mask = mask.reshape((1,) * len(rest) + mask.shape)
        picked = mask.where(xe, xe._const_like(0))
        red = tuple(range(len(rest) + nb, len(rest) + nb + len(adv)))
        out = picked.sum(red, dtype=self.dtype) if self.dtype != dtypes.bool else picked.any(red)
        # out: (rest..., bshape...). numpy puts the broadcast dims at the first advanced index's place when the
        # advanced indices are adjacent, else first.
        adjacent = all(b - a == 1 for a, b in zip(positions, positions[1:]))
        if adjacent:
            p = positions[0]
            # final layout: rest dims before position p, bshape, rest dims after
            before = p
            order = list(range(before)) + list(range(len(rest), len(rest) + nb)) + list(range(before, len(rest)))
            out = out.permute(order)
        else:
            order = list(range(len(rest), len(rest) + nb)) + list(range(len(rest)))
            out = out.permute(order)
        return out

    def __setitem__(self: Tensor, idx: Any, value: Any) -> None:
        """x[idx] = value: basic indices write through the view x[idx]; index tensors store the selected elements
        with a scatter kernel (O(k) for k elements, the last duplicate wins) - see speck.tensor.writes."""
        storable(self, value)
        setitem(self, idx, value)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along dim (index may be smaller elsewhere). A negative
        index counts from the end (numpy's take_along_axis); one outside [-n, n) is an error, found on the device
        (speck.tensor.bounds; with CHECK_OOB=0 it reads 0)."""
        tensor_args("gather", "index", (index,), type(self))  # (a list: "'list' object has no attribute 'ndim'")
        d = self._resolve_dim(dim)
        if index.ndim != self.ndim:
            raise TensorValueError(f"gather: index has {index.ndim} dims, self has {self.ndim} ({self.shape})")
        if not dtypes.is_int(index.dtype):  # a float index would be compared by value: 1.5 silently reads 0
            raise TensorTypeError(f"gather: index must be an int tensor, got {index.dtype}; use .cast('int32')")
        _same_device(self, index, "gather")
        n = as_int(self.shape[d])
        ii = checked(index, "gather", -n, n, d, device=self.device)
        if not dtypes.is_unsigned(ii.dtype):
            ii = (ii < 0).where(ii + n, ii)  # negatives wrap once
        return self._take(d, ii)

    def _take(self: Tensor, d: int, index: Tensor) -> Tensor:
        """gather along dim d without the bounds check or negative wrap: an index outside [0, n) reads 0 (what
        internal users that mark skipped elements with -1 rely on)."""
        self = self._concrete()
        if index.ndim != self.ndim:
            raise TensorValueError(f"gather: index has {index.ndim} dims, self has {self.ndim} ({self.shape})")
        for i, (a, b) in enumerate(zip(index.shape, self.shape)):
            if i != d and _exceeds(a, b):
                raise TensorAssertionError(f"gather: index shape {index.shape} exceeds self shape {self.shape} at "
                                           f"dim {i}; off dim {d} the index may be smaller, not larger")  # fmt: skip
        n = as_int(self.shape[d])
        x = self.shrink(tuple(None if i == d else (0, index.shape[i]) for i in range(self.ndim)))
        # move dim to the end of x: x[..., k]; index[..., i at d]
        xk = x.transpose(d, -1).unsqueeze(-2)  # (..., 1, n) with d's slot replaced
        ii = index.transpose(d, -1).unsqueeze(-1)  # (..., m, 1)
        m = ii == type(self).arange(n, device=self.device)  # an index outside [0, n) matches nothing: 0
        out = m.where(xk, xk._const_like(0)).sum(-1, dtype=self.dtype) if self.dtype != dtypes.bool else \
            (m & xk).any(-1)  # fmt: skip
        return out.transpose(d, -1)

    def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float | int, reduce: str | None = None) -> Tensor:
        """self with out[..., index[p], ...] = src[p] along dim (the last duplicate along dim wins; out-of-range
        indices are ignored); reduce 'add' or 'multiply' combines with what is there instead."""
        if reduce is None:
            return self._scatter(dim, index, src, None, True)
        if type(reduce) is not str or reduce not in ("add", "multiply"):
            raise TensorTypeError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
        return self._scatter(dim, index, src, "sum" if reduce == "add" else "prod", True)

    def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                       include_self: bool = True) -> Tensor:  # fmt: skip
        """Combine src into self at index along dim with sum, prod, mean, amax or amin (torch semantics): every
        duplicate takes part; include_self=False leaves the original out where something was scattered."""
        if type(reduce) is not str or reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise TensorValueError(f"scatter_reduce reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        return self._scatter(dim, index, src, reduce, include_self)

    def _scatter(self: Tensor, dim: int, index: Tensor, src: Any, mode: str | None, include_self: bool) -> Tensor:
        """One scatter kernel per pass over the k index elements (O(k) after a copy of self): see _scatter_node. An
        index outside [0, n) is an error, found on the device (speck.tensor.bounds; with CHECK_OOB=0 it is ignored)."""
        tensor_args("scatter", "index", (index,), type(self))
        self = self._concrete()
        d = self._resolve_dim(dim)
        if index.ndim != self.ndim:
            raise TensorValueError(f"scatter: index has {index.ndim} dims, self has {self.ndim} (shape {self.shape})")
        if not dtypes.is_int(index.dtype):
            raise TensorTypeError(f"scatter: index must be an int tensor, got {index.dtype}")
        # a device-less operand (a constant's graph: Tensor.arange, Tensor.ones) takes the other's device
        self, index = self._on_device_of(index), index._on_device_of(self)
        if index.device != self.device:
            raise TensorValueError(f"scatter: index is on {index.device}, self on {self.device}; move one with .to()")
        s = src if isinstance(src, type(self)) else type(self)(src, device=self.device, dtype=self.dtype)
        if s.dtype != self.dtype:
            raise TensorTypeError(f"scatter: src dtype {s.dtype} differs from self's {self.dtype}; cast it first")
        if s.ndim == 0:
            s = s._broadcast_to(index.shape)
        if s.ndim != self.ndim:
            raise TensorValueError(f"scatter: src has {s.ndim} dims, self has {self.ndim}")
        for i, (a, b, c) in enumerate(zip(index.shape, s.shape, self.shape)):
            if _exceeds(a, b) or (i != d and _exceeds(a, c)):
                raise TensorAssertionError(f"scatter: index shape {index.shape} must fit in src {s.shape} and, off dim "
                                           f"{d}, in self {self.shape}")  # fmt: skip
        s = s.shrink(tuple((0, n) for n in index.shape))
        index = checked(index, "scatter", 0, as_int(self.shape[d]), d, device=self.device)
        if mode in (None, "sum") and (self.requires_grad is True or s.requires_grad is True):
            # the write kernel has no gradient rule: a tensor that asks for gradients takes the differentiable
            # (one-hot, O(n*k)) form, on whole (replicated) operands when they are sharded along an axis
            ab = self.uop.axis if isinstance(self.uop, MultiUOp) else None
            whole_self, whole_ix, whole_s = (_whole(t) for t in (self, index, s))
            out = whole_self._scatter_dense(d, whole_ix, whole_s, mode, include_self)
            return out if ab is None or not isinstance(out.uop, MultiUOp) else out._new(
                out.uop.to_devices(out.uop.device, ab))  # fmt: skip
        pos = self._scatter_positions(d, index)
        if mode is None:
            return self._scatter_node(pos, s, None)
        if mode == "mean":
            total = self._scatter(d, index, s, "sum", include_self)
            ones = type(self).ones(index.shape, dtype=dtypes.int32, device=self.device)
            count = type(self).zeros(self.shape, dtype=dtypes.int32, device=self.device)._scatter_node(pos, ones, "sum")
            count = count + 1 if include_self else count.maximum(1)
            return (total / count).cast(self.dtype)
        base = self
        if not include_self:  # the original counts nowhere something lands: start those from the identity
            base = self._scatter_node(pos, s._const_like(_identity(mode, self.dtype))._broadcast_to(s.shape), None)
        return base._scatter_node(pos, s, mode)

    def _scatter_dense(self: Tensor, d: int, index: Tensor, s: Tensor, mode: str | None, include_self: bool) -> Tensor:
        """scatter (mode None: the last duplicate along d wins) or scatter_reduce 'sum' from elementwise ops and
        sums over a one-hot of index, so gradients reach self and src."""
        n = as_int(self.shape[d])
        # index and src with d moved last, compared against every target position along d: (..., k, n)
        ix, sv = index.transpose(d, -1).unsqueeze(-1), s.transpose(d, -1).unsqueeze(-1)
        hit = ix == type(self).arange(n, device=self.device, dtype=ix.dtype)
        if mode is None:  # only the last index element naming a target writes it
            hit = hit & (hit.int().flip(-2).cumsum(-2).flip(-2) == 1)
        vals = hit.where(sv, sv._const_like(0)).sum(-2, dtype=self.dtype)
        written = hit.any(-2)
        # back to self's layout; positions off dim d beyond index's extent get nothing
        vals, written = vals.transpose(d, -1), written.transpose(d, -1)
        pads = tuple((0, as_int(a) - as_int(b)) for a, b in zip(self.shape, vals.shape))
        vals, written = vals.pad(pads), written.pad(pads, value=False)
        if mode is None:
            return written.where(vals, self)
        return self + vals if include_self else written.where(vals, self)

    def _scatter_positions(self: Tensor, d: int, index: Tensor) -> Tensor:
        """int32, index's shape: 1 + the flat position in self each index element names (its own coordinates,
        with index's value along d), 0 for a value outside [0, self.shape[d])."""
        shape = [as_int(n) for n in self.shape]
        strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
        ix = index.cast(dtypes.int32)
        pos = ix * strides[d] + 1
        for j, n in enumerate(index.shape):
            if j != d and as_int(n) > 1:
                ar = type(self).arange(as_int(n), device=self.device)
                pos = pos + ar.reshape([-1 if k == j else 1 for k in range(self.ndim)]) * strides[j]
        return ((ix >= 0) & (ix < shape[d])).where(pos, 0)

    def _scatter_node(self: Tensor, pos: Tensor, value: Tensor, reduce: str | None) -> Tensor:
        """self with value's elements stored at the 1-based flat positions pos (0 skips), in index order, combined
        with what is there when reduce names one (schedule._COMBINE): the scheduler runs it as one kernel over
        value's elements on top of a copy of self. Sharded operands: each device scatters into a whole copy (the
        positions are global), and the result is sharded like self."""
        srcs = (self.uop, pos.uop, value.uop)
        if not any(isinstance(u, MultiUOp) for u in srcs):
            return self._new(UOp(Ops.ASSIGN, self.dtype, srcs, reduce))
        out = replicated_node(Ops.ASSIGN, self.dtype, srcs, reduce)
        axis = self.uop.axis if isinstance(self.uop, MultiUOp) else None
        return self._new(out if axis is None else out.to_devices(out.device, axis))

    def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """The elements where mask (bool, broadcast with self) is true, as a 1-D tensor in row-major order.
        size=None reads the mask (a data-dependent length); size=N gives exactly N elements without reading data:
        the selection truncated, or padded with fill_value."""
        tensor_args("masked_select", "mask", (mask,), type(self))
        if mask.dtype != dtypes.bool:
            raise TensorTypeError(f"masked_select needs a bool mask, got {mask.dtype}; compare first (e.g. x != 0)")
        self = self._concrete()
        sh = broadcast_shape(self.shape, mask.shape)
        x, m = self._broadcast_to(sh).flatten(), mask._broadcast_to(sh).flatten()
        if size is not None:
            return x._select_sized(m, size, fill_value)
        pos = np.flatnonzero(m.numpy()).astype(np.int32)
        return x[type(self)(pos, device=self.device)] if pos.size else type(self).empty(0, dtype=self.dtype,
                                                                                device=self.device)  # fmt: skip

    def _select_sized(self: Tensor, m: Tensor, size: int, fill_value: Any) -> Tensor:
        """The elements of 1-D self where 1-D bool m is true, placed in order into `size` slots that start as
        fill_value (extra selected elements are dropped): one scatter to 1-based positions, lazy."""
        if not isinstance(size, int) or size < 0:
            raise TensorValueError(f"size must be an int >= 0, got {size!r}")
        rank = m.cast(dtypes.int32).cumsum(0)  # 1-based slot of each selected element
        pos = (m & (rank <= size)).where(rank, 0)
        out = type(self).full((size,), fill_value, dtype=self.dtype, device=self.device)
        return out._scatter_node(pos, self, None) if size and self.shape[0] else out

    def nonzero(self: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """(count, ndim) int32 coordinates of the nonzero elements, in row-major order. size=None reads the tensor
        (a data-dependent count); size=N gives N rows without reading data, padded with fill_value or truncated."""
        if size is None:
            nz = np.argwhere(self.numpy()).astype(np.int32)
            # (no coordinates to copy - nothing nonzero, or a 0-d tensor's one row of none - is an empty of
            # that many rows: a nonzero 0-d tensor gives shape (1, 0))
            return type(self)(nz.reshape(-1, self.ndim), device=self.device) if nz.size else type(self).empty(
                len(nz), self.ndim, dtype=dtypes.int32, device=self.device)  # fmt: skip
        m = (self != 0).flatten()
        coords = [
            type(self)
            .arange(as_int(n), device=self.device, dtype=dtypes.int32)
            .reshape([-1 if k == d else 1 for k in range(self.ndim)])
            ._broadcast_to(self.shape)
            .flatten()
            for d, n in enumerate(self.shape)
        ]
        if not coords:  # 0-d: one row of no coordinates if the value is nonzero (`size` rows either way)
            return type(self).empty(size, 0, dtype=dtypes.int32, device=self.device)
        return type(self).stack(*[c._select_sized(m, size, fill_value) for c in coords], dim=1)

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        if not dtypes.is_int(self.dtype):
            raise TensorTypeError(f"one_hot needs an int tensor, got {self.dtype}")
        num_classes = whole("one_hot", "num_classes", num_classes)  # (an array of several ints has __index__ too)
        if num_classes < -1:
            raise TensorValueError(f"one_hot needs num_classes >= 0 (or -1: max + 1), got {num_classes}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1

        idx = checked(self, "one_hot", 0, num_classes)
        # literal 1s and 0s: weakint (TENSOR_API 3.3), read as the default int, adopting the dtype they meet
        return (idx.unsqueeze(-1) == type(self).arange(num_classes)).where(1, 0)

    def meshgrid(self: Tensor, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of self and args (`Tensor.meshgrid(a, b)` or `a.meshgrid(b)`)."""
        tensors = (self, *args)
        if type(indexing) is not str or indexing not in ("ij", "xy"):
            raise TensorValueError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        tensor_args("meshgrid", "argument", tensors)
        ts = [t.flatten() for t in tensors]
        shape = tuple(as_int(t.shape[0]) for t in ts)
        out = []
        for i, t in enumerate(ts):
            out.append(t.reshape(tuple(-1 if j == i else 1 for j in range(len(ts)))).expand(shape))
        if indexing == "xy" and len(ts) >= 2:
            out = [o.transpose(0, 1) for o in out]
        return tuple(out)


def _same_device(t: Any, index: Any, op: str) -> None:
    """An index tensor on another device than the indexed tensor (device-less ones take its device) is refused when
    the op is called: it failed at realize with the runtime's "program loaded on X but buffer on Y"."""
    if isinstance(t.device, str) and isinstance(index.device, str) and t.device != index.device:  # (sharded: multi's)
        raise TensorValueError(f"{op}: the index tensor is on {index.device} but the indexed tensor is on {t.device}; "
                               f"move the index with .to({t.device!r})")  # fmt: skip


def _checked_slice(sl: slice) -> slice:
    """sl with int bounds (numpy ints taken as ints; symbolic ones kept); a float or string bound and a step of 0 are
    errors here, as in numpy, rather than a builtin TypeError from deep in the slicing."""
    parts = []
    for what, x in (("start", sl.start), ("stop", sl.stop), ("step", sl.step)):
        if x is None or isinstance(x, (int, UOp)):
            parts.append(x)
        elif hasattr(type(x), "__index__"):
            parts.append(operator.index(x))
        else:
            raise TensorTypeError(f"slice {what} must be an int or None, got {x!r} ({type(x).__name__}) in {sl}")
    if isinstance(parts[2], int) and parts[2] == 0:
        raise TensorValueError(f"slice step cannot be zero (in {sl}); use a positive or negative step")
    return slice(*parts)


def _scalar_index(t: Tensor) -> int:
    """The value of a 0-d int tensor used as a slice bound."""
    if t.ndim != 0 or not dtypes.is_int(t.dtype):
        raise TensorIndexError(
            f"slice bounds must be ints, bound Variables or 0-d int tensors, got {t.dtype} {t.shape}"
        )
    return int(t.item())
