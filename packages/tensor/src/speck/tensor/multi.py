"""Tensors over several devices: `Tensor.shard(devices, axis)` splits a tensor along `axis` into equal pieces, one
per device (axis None replicates it on every device).

A sharded tensor's `.uop` is a `MultiUOp`: a logical node of the tensor graph (op, sources, arg, logical shape, like
any tensor-level UOp) that also carries one ordinary UOp graph per device, its `shards`. Every operation builds the
logical node and its shards together: elementwise ops run shard by shard, movement ops rewrite their arguments for
the shard's piece, and a reduction over the sharded axis ends in an allreduce (speck.tensor.allreduce) built from
COPY nodes and elementwise kernels. The scheduler only ever sees the shards; autograd walks the logical nodes (so
the gradient of a replicated parameter used on a sharded batch is summed across devices by the same allreduce, and
custom gradient rules registered on logical nodes apply unchanged)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor.allreduce import allreduce
from speck.tensor.device import canonical, default_device
from speck.tensor.errors import ShardingError as ShardingError
from speck.tensor.errors import TensorTypeError, TensorValueError
from speck.tensor.gradient import override_gradient, register_combine
from speck.tensor.nodes import _clone_counter, copy_uop
from speck.tensor.realize import realize_targets
from speck.tensor.schedule import base_buffer, max_dim
from speck.tensor.settings import ALLREDUCE_CAST
from speck.tensor.weak import materialized
from speck.uop import DType, Ops, UOp, dtypes, least_upper_dtype, sint
from speck.uop.dtype import ConstType
from speck.uop.helpers import prod
from speck.uop.uop import ssimplify

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

MULTI = "multi"  # the arg of a realized sharded tensor's leaf node (op NOOP: nothing to compute)


def canonical_devices(devices: Sequence[str]) -> tuple[str, ...]:
    """Canonical names of a tuple of devices (each must be distinct)."""
    out = tuple(canonical(d) for d in devices)
    if not out:  # (an IndexError from deep in the sharding code)
        raise TensorValueError(f"device={devices!r} names no device; pass a device name or a tuple of at least one")
    if len(set(out)) != len(out):
        raise TensorValueError(f"devices {tuple(devices)} name the same device twice ({out}); each shard needs its own")
    return out


def device_of(u: UOp) -> str:
    """The device a plain (single-device) tensor graph computes on: its first buffer, copy or device node."""
    for n in u.toposort(gate=lambda x: x.op not in (Ops.BUFFER, Ops.COPY)):
        if n.op is Ops.BUFFER:
            return str(n.src[1].arg)
        if n.op is Ops.COPY:
            return str(n.arg)
        if n.op is Ops.DEVICE and isinstance(n.arg, str):
            return n.arg

    return default_device()


def _device_uop(d: str) -> UOp:
    return UOp(Ops.DEVICE, arg=d)


def _axis_arg(shape: tuple[sint, ...], axis: int, lo: sint, hi: sint) -> tuple[tuple[sint, sint], ...]:
    return tuple((lo, hi) if d == axis else (0, s) for d, s in enumerate(shape))


def _piece(u: UOp, axis: int, n: int, i: int) -> UOp:
    """Piece i of n equal pieces of u along axis."""
    size = u.shape[axis]
    assert isinstance(size, int) and size % n == 0, "shard sizes are checked when sharding"
    k = size // n
    return u.shrink(_axis_arg(u.shape, axis, k * i, k * (i + 1)))


def _concat(pieces: Sequence[UOp], axis: int) -> UOp:
    """Pieces of equal shape joined along axis (padded into place and added: one elementwise kernel)."""
    if len(pieces) == 1:
        return pieces[0]
    k = pieces[0].shape[axis]
    total = k * len(pieces)
    out: UOp | None = None
    for i, p in enumerate(pieces):
        padded = p.pad(tuple((k * i, total - k * (i + 1)) if d == axis else (0, 0) for d in range(len(p.shape))))
        out = padded if out is None else out.alu(Ops.OR if p.dtype == dtypes.bool else Ops.ADD, padded)
    assert out is not None
    return out


def _on_device(u: UOp, d: str) -> UOp:
    """A plain graph without buffers (constants, iotas) rebuilt on device d: every DEVICE node names d and every
    constant carries it, so the scheduler places what it materializes from it on d."""
    subs: dict[UOp, UOp] = {}
    for n in u.toposort():
        if n.op is Ops.DEVICE and n.arg != d:
            subs[n] = _device_uop(d)
        elif n.op is Ops.CONST and not n.src:
            subs[n] = UOp(Ops.CONST, n.dtype, (_device_uop(d),), n.arg)
    return u.substitute(subs) if subs else u


class MultiUOp(UOp):
    """A logical tensor node over `device` (a tuple of device names): `shards[i]` is its piece on `device[i]`,
    split along `axis` (None: every shard holds the whole tensor). `op`, `src`, `arg` and `shape` describe the
    logical operation, as for a single-device tensor node; a realized sharded tensor is a leaf (op NOOP, arg
    "multi") whose shards are views of buffers."""

    __slots__ = ("axis", "device", "shards")
    axis: int | None
    device: tuple[str, ...]
    shards: tuple[UOp, ...]

    @staticmethod
    def make(op: Ops, src: tuple[UOp, ...], arg: Any, shards: Sequence[UOp], axis: int | None,
             device: tuple[str, ...]) -> MultiUOp:  # fmt: skip
        self = object.__new__(MultiUOp)
        shards = tuple(shards)
        shape = shards[0].shape
        if axis is not None:
            shape = tuple(s * len(shards) if d == axis else s for d, s in enumerate(shape))
        for name, v in (("op", op), ("dtype", shards[0].dtype), ("src", src), ("arg", arg), ("tag", None),
                        ("_bounds", None), ("_shape", shape), ("axis", axis), ("device", device),
                        ("shards", shards)):  # fmt: skip
            object.__setattr__(self, name, v)
        object.__setattr__(self, "_ck", (MULTI, id(self)))  # never in UOp's hash-consing table
        return self

    @staticmethod
    def leaf(shards: Sequence[UOp], axis: int | None, device: tuple[str, ...]) -> MultiUOp:
        return MultiUOp.make(Ops.NOOP, (), MULTI, shards, axis, device)

    def _new(self, op: Ops, src: tuple[UOp, ...], arg: Any, shards: Sequence[UOp], axis: int | None) -> MultiUOp:
        return MultiUOp.make(op, src, arg, shards, axis, self.device)

    def __repr__(self) -> str:
        return f"<MultiUOp {self.op.name} {self.dtype} shape={self.shape} axis={self.axis} on {self.device}>"

    @property
    def is_realized(self) -> bool:
        return all(base_buffer(s) is not None for s in self.shards)

    def has_buffer_identity(self) -> bool:
        """Every shard names storage of its own (UOp.has_buffer_identity)."""
        return all(s.has_buffer_identity() for s in self.shards)

    # ---------------- elementwise ----------------
    def alu(self, op: Ops, *src: UOp | ConstType) -> UOp:
        return multi_alu(op, self, *src)

    def cast(self, dtype: DType) -> UOp:
        if dtype == self.dtype:
            return self
        return self._new(Ops.CAST, (self,), None, [s.cast(dtype) for s in self.shards], self.axis)

    def bitcast(self, dtype: DType) -> UOp:
        if dtype == self.dtype:
            return self
        return self._new(Ops.BITCAST, (self,), None, [s.bitcast(dtype) for s in self.shards], self.axis)

    def where(self, a: UOp | ConstType, b: UOp | ConstType) -> UOp:
        ua = a if isinstance(a, UOp) else (b.ufix(a) if isinstance(b, UOp) else UOp.const(dtypes.from_py(a), a))
        ub = b if isinstance(b, UOp) else ua.ufix(b)
        return multi_alu(Ops.WHERE, self, ua, ub)

    def threefry(self, key: UOp) -> UOp:
        return multi_alu(Ops.THREEFRY, self, key)

    # the reflected operators: a plain UOp on the left defers to these (MultiUOp subclasses UOp)
    def __radd__(self, x: ConstType | UOp) -> UOp:
        return multi_alu(Ops.ADD, self.ufix(x), self)

    def __rmul__(self, x: ConstType | UOp) -> UOp:
        return multi_alu(Ops.MUL, self.ufix(x), self)

    def __rsub__(self, x: ConstType | UOp) -> UOp:
        return multi_alu(Ops.ADD, self.ufix(x), -self)

    def __rtruediv__(self, x: ConstType | UOp) -> UOp:
        return multi_alu(Ops.FDIV, self.ufix(x), self)

    def __gt__(self, x: UOp | ConstType) -> UOp:
        return multi_alu(Ops.CMPLT, self.ufix(x), self)

    # ---------------- movement ----------------
    def reshape(self, shape: tuple[sint, ...]) -> UOp:
        shape = tuple(shape)
        a = self.axis
        if a is None:
            return self._new(Ops.RESHAPE, (self,), shape, [s.reshape(shape) for s in self.shards], None)
        n = len(self.shards)
        before = prod(self.shape[:a])
        for k, s in enumerate(shape):
            if _same_size(prod(shape[:k]), before) and isinstance(s, int) and s % n == 0 and s >= n:
                piece = tuple(s // n if d == k else x for d, x in enumerate(shape))
                return self._new(Ops.RESHAPE, (self,), shape, [u.reshape(piece) for u in self.shards], k)
        raise ShardingError(
            f"reshape of {self.shape} sharded on axis {a} over {n} devices to {shape} moved items between shards: "
            "the new shape must keep the shard boundary (a dim whose leading dims multiply to the same size, "
            f"divisible by {n}); gather first with .to(device), or reshard"
        )

    def permute(self, order: tuple[int, ...]) -> UOp:
        axis = None if self.axis is None else tuple(order).index(self.axis)
        return self._new(Ops.PERMUTE, (self,), tuple(order), [s.permute(order) for s in self.shards], axis)

    def expand(self, shape: tuple[sint, ...]) -> UOp:
        shape = tuple(shape)
        a = self.axis
        if a is not None and shape[a] != self.shape[a]:
            raise ShardingError(f"can't expand the sharded axis {a} of {self.shape} to {shape}")
        piece = tuple(s if a is None or d != a else self.shards[0].shape[a] for d, s in enumerate(shape))
        return self._new(Ops.EXPAND, (self,), shape, [s.expand(piece) for s in self.shards], a)

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        arg = tuple(tuple(p) for p in arg)  # type: ignore[misc]
        a = self.axis
        if a is not None and tuple(arg[a]) != (0, 0):
            raise ShardingError(
                f"can't pad the sharded axis {a} of {self.shape} by {arg[a]}: padding would move items between "
                "shards; pad another axis, or gather with .to(device) first"
            )
        return self._new(Ops.PAD, (self,), arg, [s.pad(arg) for s in self.shards], a)

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        arg = tuple(tuple(p) for p in arg)  # type: ignore[misc]
        a = self.axis
        if a is None:
            return self._new(Ops.SHRINK, (self,), arg, [s.shrink(arg) for s in self.shards], a)
        k = self.shards[0].shape[a]
        if tuple(arg[a]) == (0, self.shape[a]):
            piece = tuple((0, k) if d == a else p for d, p in enumerate(arg))
            return self._new(Ops.SHRINK, (self,), arg, [s.shrink(piece) for s in self.shards], a)
        lo, hi = arg[a]
        n = len(self.shards)
        for i in range(n):
            if (lo, hi) == (k * i, k * (i + 1)):  # exactly one device's shard: an ordinary tensor on that device
                return (
                    self.shards[i]
                    .shrink(_axis_arg(tuple(self.shards[i].shape), a, 0, k))
                    .shrink(tuple((0, k) if d == a else p for d, p in enumerate(arg)))
                )
        raise ShardingError(
            f"can't shrink the sharded axis {a} of {self.shape} (shards of {k} on {n} devices) to {(lo, hi)}: only "
            "the whole axis or exactly one device's shard can be taken; gather with .to(device) first"
        )

    def flip(self, axes: tuple[bool, ...]) -> UOp:
        if self.axis is not None and axes[self.axis]:
            raise ShardingError(f"can't flip the sharded axis {self.axis} of {self.shape}; gather it first")
        return self._new(Ops.FLIP, (self,), tuple(axes), [s.flip(axes) for s in self.shards], self.axis)

    # ---------------- reductions ----------------
    def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
        if op not in (Ops.ADD, Ops.MUL, Ops.MAX):
            raise TensorValueError(f"reduce op must be ADD, MUL or MAX, got {op}")
        axes = tuple(sorted({a for a in axes if self.shape[a] != 1}))
        if not axes:
            return self
        partials = [s.reduce_axis(op, axes) for s in self.shards]  # (a size-1 piece reduces to itself)
        if self.axis is None or self.axis not in axes:
            return self._new(Ops.REDUCE_AXIS, (self,), (op, axes), partials, self.axis)

        # ALLREDUCE_CAST: the sum of a half/bfloat16 value upcast for accumulation crosses devices in its own dtype
        src = self.src[0] if self.op is Ops.CAST and self.src else None
        narrow = src is not None and src.dtype in (dtypes.float16, dtypes.bfloat16) and self.dtype == dtypes.float32
        wire = src.dtype if narrow and op is Ops.ADD and ALLREDUCE_CAST.value and src is not None else None
        return self._new(Ops.REDUCE_AXIS, (self,), (op, axes), allreduce(op, partials, self.device, wire), None)

    # ---------------- buffering and devices ----------------
    def contiguous(self, arg: Any = None, tag: Any = None) -> MultiUOp:
        shards = [UOp(Ops.CONTIGUOUS, s.dtype, (s,), arg, tag) for s in self.shards]
        return self._new(Ops.CONTIGUOUS, (self,), arg, shards, self.axis)

    def detach(self) -> MultiUOp:
        if self.op is Ops.DETACH:
            return self
        return self._new(Ops.DETACH, (self,), None, [UOp(Ops.DETACH, s.dtype, (s,)) for s in self.shards], self.axis)

    def to_device(self, device: str) -> UOp:
        """The whole tensor on one device (a gather: shards copied there and joined; device 0's copy of a
        replicated one). Differentiable back to this node."""
        if self.axis is None:
            i = self.device.index(device) if device in self.device else 0
            out = copy_uop(self.shards[i], device, self.device[i])
            if out is self.shards[i]:
                out = out.reshape(out.shape)  # a node of its own, to hang the gradient rule on
        else:
            out = _concat([copy_uop(s, device, d) for s, d in zip(self.shards, self.device)], self.axis)
        _gradient_to(out, self, lambda g: replicate(g, self.device, device) if self.axis is None
                     else split(g, self.device, self.axis, device))  # fmt: skip
        return out

    def to_devices(self, devices: tuple[str, ...], axis: int | None) -> MultiUOp:
        """This tensor over `devices` sharded on `axis` (the same devices: a reshard)."""
        if devices == self.device and axis == self.axis:
            return self
        if axis is not None and axis != self.axis:  # (a reshard to an uneven axis failed an internal assert)
            _check_even(self.shape, axis, len(devices))
        if devices == self.device:
            shards = _shards_as(self, axis, devices)
        elif len(devices) == len(self.device) and axis == self.axis:
            shards = [copy_uop(s, d, e) for s, d, e in zip(self.shards, devices, self.device)]
        else:
            whole = self.to_device(devices[0])
            return split(whole, devices, axis, devices[0]) if axis is not None else replicate(
                whole, devices, devices[0])  # fmt: skip
        out = MultiUOp.make(Ops.COPY, (self,), devices, shards, axis, devices)
        _gradient_to(out, self, lambda g: _as_multi(g, devices).to_devices(self.device, self.axis))
        return out


def _as_multi(g: UOp, devices: tuple[str, ...]) -> MultiUOp:
    """A gradient as a MultiUOp over devices (a plain device-less gradient, e.g. a constant, is replicated)."""
    if isinstance(g, MultiUOp):
        return g
    return MultiUOp.leaf(_plain_to_shards(g, None, devices), None, devices)


def _combine_gradients(prev: UOp, new: UOp, node: UOp) -> UOp:
    """prev + new, two gradient contributions to node; a sharded contribution to a plain one-device node (a shared
    constant) is gathered to the node's device."""
    if isinstance(prev, MultiUOp) != isinstance(new, MultiUOp) and not isinstance(node, MultiUOp):
        dev = node.device
        if isinstance(dev, str):
            prev, new = (g.to_device(dev) if isinstance(g, MultiUOp) else g for g in (prev, new))
    return prev + new


register_combine(_combine_gradients)


def _gradient_to(node: UOp, src: UOp, rule: Any) -> None:
    override_gradient(node, (src,), lambda g: (rule(g),))


def replicate(u: UOp, devices: tuple[str, ...], src_device: str) -> MultiUOp:
    """u (a plain graph on src_device) copied to every device (no copy where it already is)."""
    if isinstance(u, MultiUOp):
        return u.to_devices(devices, None)
    shards = [_own_copy(u, d, src_device) for d in devices]
    out = MultiUOp.make(Ops.COPY, (u,), devices, shards, None, devices)
    _gradient_to(out, u, lambda g: _as_multi(g, devices).to_device(src_device))
    return out


_shard_copies = itertools.count()


def _own_copy(u: UOp, dst: str, src: str) -> UOp:
    """u on dst as storage of the sharded tensor's own (as tinygrad's shard copies): the shard on the source's own
    device is a clone too. A view would alias the source's buffer, and a pending computation is interned: realized
    through another tensor first, it would become that tensor's buffer. Either way writes to one would show in the
    other."""
    if dst == src:
        return UOp(Ops.CONTIGUOUS, u.dtype, (u,), "clone", ("shard", next(_shard_copies)))
    return copy_uop(u, dst, src)


def _check_even(shape: tuple[sint, ...], axis: int, n: int) -> None:
    size = shape[axis]
    if not isinstance(size, int) or size % n != 0:
        raise ShardingError(
            f"multi axis uneven: axis {axis} of shape {shape} has size {size}, which does not split evenly over "
            f"{n} devices; pad or shrink it to a multiple of {n}, or shard another axis"
        )


def split(u: UOp, devices: tuple[str, ...], axis: int, src_device: str) -> MultiUOp:
    """u (a plain graph on src_device) split into equal pieces along axis, piece i copied to devices[i]."""
    if isinstance(u, MultiUOp):
        return u.to_devices(devices, axis)
    n = len(devices)
    _check_even(u.shape, axis, n)
    shards = [_own_copy(_piece(u, axis, n, i), d, src_device) for i, d in enumerate(devices)]
    out = MultiUOp.make(Ops.COPY, (u,), devices, shards, axis, devices)
    _gradient_to(out, u, lambda g: _as_multi(g, devices).to_device(src_device))
    return out


# ---------------- elementwise across operands ----------------
def multi_alu(op: Ops, *operands: UOp | ConstType) -> MultiUOp:
    """op on operands of which at least one is a MultiUOp. All multi operands must be on the same devices; the
    result is sharded like the last sharded operand (others are resharded to it: a replicated one is cut, no
    copies); plain operands must not hold buffers (constants, iotas), they are rebuilt on every device."""
    multis = [x for x in operands if isinstance(x, MultiUOp)]
    first = multis[0]
    devices = first.device
    for m in multis[1:]:
        if m.device != devices:
            raise ShardingError(f"operands are sharded over different devices: {devices} and {m.device}; move one "
                                "with .to(devices) or .shard(devices, axis)")  # fmt: skip
    axis: int | None = None
    for m in multis:
        if m.axis is not None:
            axis = m.axis
    ref = operands[0] if isinstance(operands[0], UOp) else first
    srcs = tuple(x if isinstance(x, UOp) else ref._const_like(x) for x in operands)
    per = [_shards_as(x, axis, devices) for x in srcs]
    shards = [per[0][i].alu(op, *[p[i] for p in per[1:]]) for i in range(len(devices))]
    return MultiUOp.make(op, srcs, None, shards, axis, devices)


def replicated_node(op: Ops, dtype: DType, srcs: tuple[UOp, ...], arg: Any) -> MultiUOp:
    """A node that reads its operands whole (a scatter: its flat positions index all of self), over the devices of
    its multi operands: every device computes it from replicated operands (sharded ones are all-gathered, plain ones
    must hold no buffers), so the result is replicated."""
    multis = [x for x in srcs if isinstance(x, MultiUOp)]
    devices = multis[0].device
    if any(m.device != devices for m in multis[1:]):
        raise ShardingError(f"operands are sharded over different devices: {[m.device for m in multis]}; move them "
                            "onto one set with .to(devices) or .shard(devices, axis)")  # fmt: skip
    # the node's sources are the replicated operands: its gradient rule then works on whole tensors, and the
    # gradients flow back to sharded operands through the all-gather's rule
    srcs = tuple(x.to_devices(devices, None) if isinstance(x, MultiUOp) else x for x in srcs)
    per = [_shards_as(x, None, devices) for x in srcs]
    shards = [UOp(op, dtype, tuple(p[i] for p in per), arg) for i in range(len(devices))]
    return MultiUOp.make(op, srcs, arg, shards, None, devices)


def _shards_as(x: UOp, axis: int | None, devices: tuple[str, ...]) -> list[UOp]:
    """x's per-device pieces when sharded on axis over devices."""
    if not isinstance(x, MultiUOp):
        return _plain_to_shards(x, axis, devices)
    n = len(devices)
    if x.axis == axis:
        return list(x.shards)
    if x.axis is None:
        assert axis is not None
        return [_piece(s, axis, n, i) for i, s in enumerate(x.shards)]
    if axis is None:  # allgather: every device gets every shard
        return [_concat([_moved(s, None, n, 0, d, e) for s, e in zip(x.shards, devices)], x.axis) for d in devices]
    # reshard from x.axis to axis: device j gathers piece j (along axis) of every shard, joined along x.axis
    return [_concat([_moved(s, axis, n, j, d, e) for s, e in zip(x.shards, devices)], x.axis)
            for j, d in enumerate(devices)]  # fmt: skip


def _moved(s: UOp, axis: int | None, n: int, j: int, dst: str, src: str) -> UOp:
    """Piece j of n of shard s along axis (all of it for None), copied from device src to dst. A broadcast shard
    (a matmul operand expanded along the other operand's dims) is copied before its expand and expanded on dst:
    copying the expanded view would move (and hold, in a TinyJit capture) a materialized broadcast per layer."""
    if s.op is Ops.EXPAND and src != dst:
        inner = s.src[0]
        shape = s.shape
        if axis is not None:
            k = shape[axis] // n  # (shard sizes are checked when sharding)
            shape = tuple(k if d == axis else v for d, v in enumerate(shape))
            if inner.shape[axis] != 1:
                inner = _piece(inner, axis, n, j)
        return copy_uop(inner, dst, src).expand(shape)
    return copy_uop(s if axis is None else _piece(s, axis, n, j), dst, src)


def _plain_to_shards(u: UOp, axis: int | None, devices: tuple[str, ...]) -> list[UOp]:
    bufs = {str(n.src[1].arg) for n in u.toposort() if n.op is Ops.BUFFER}
    if bufs:
        raise ShardingError(
            f"all buffers must be on the same device: a tensor on {', '.join(sorted(bufs))} can't be combined with "
            f"one sharded over {devices}; move it with .to({devices}) (replicated) or .shard({devices}, axis)"
        )
    on = [_on_device(u, d) for d in devices]
    if axis is None or not u.shape or u.shape[axis] == 1:
        return on
    return [_piece(s, axis, len(devices), i) for i, s in enumerate(on)]


# ---------------- tensors ----------------
def shard(t: Tensor, devices: Sequence[str], axis: int | None = None) -> Tensor:
    """`Tensor.shard`: t split along axis over devices (None: replicated), as a new tensor."""
    if isinstance(devices, str) or not isinstance(devices, (tuple, list)):
        raise TensorTypeError(f"shard needs a tuple of devices, got {devices!r}; use .to(device) for one device")
    if t.device is None:  # device-less: it combines with sharded tensors as it is (replicated where it meets them)
        return t
    if t.dtype.is_weak:  # sharded tensors hold storage: a literal's dtype is made concrete first
        t = t.cast(materialized(t.uop))
    devs = canonical_devices(devices)
    if len(devs) == 1:
        return t.to(devs[0])
    if isinstance(t.uop, MultiUOp):
        raise ShardingError(
            f"this tensor is already sharded over {t.uop.device} (axis {t.uop.axis}); re-sharding a multi-device "
            "tensor is not supported: gather it with .to(device) and shard that, or use shard_like"
        )
    ax = None if axis is None else t._resolve_dim(axis)
    src = str(t.device)
    u = split(t.uop, devs, ax, src) if ax is not None else replicate(t.uop, devs, src)
    return _keep_flags(t, type(t)(u))


def _keep_flags(src: Tensor, dst: Tensor) -> Tensor:
    """Sharding or moving a tensor keeps whether it is a parameter."""
    for name in ("is_param", "requires_grad"):
        if hasattr(type(src), name) and hasattr(src, name):
            try:
                setattr(dst, name, getattr(src, name))
            except AttributeError:
                pass
    return dst


def shard_like(t: Tensor, y: Tensor) -> Tensor:
    """`Tensor.shard_like`: t placed like y (y's devices and axis; y on one device: t moved there; y device-less:
    t as it is)."""
    if y.device is None:
        return t
    if not isinstance(y.uop, MultiUOp):
        return t.to(str(y.device))
    if isinstance(t.uop, MultiUOp):
        if t.uop.device == y.uop.device and t.uop.axis == y.uop.axis:
            return t  # already placed like y: a no-op
        return t._new(t.uop.to_devices(y.uop.device, y.uop.axis))
    return shard(t, y.uop.device, y.uop.axis)


def to(t: Tensor, device: Any) -> Tensor:
    """`Tensor.to` where t is sharded or device is a tuple: gather to one device, or replicate over a tuple."""
    if isinstance(device, (tuple, list)):
        devs = canonical_devices(device)
        if len(devs) == 1:  # (an unsharded tensor to ["CPU"] hit the sharded-only path: a bare AssertionError)
            return to(t, devs[0]) if isinstance(t.uop, MultiUOp) else t.to(devs[0])
        if isinstance(t.uop, MultiUOp):
            return _keep_flags(t, t._new(t.uop.to_devices(devs, t.uop.axis if len(devs) == len(t.uop.device)
                                                         else None)))  # fmt: skip
        return _keep_flags(t, type(t)(replicate(t.uop, devs, str(t.device))))

    assert isinstance(t.uop, MultiUOp)
    dev = canonical(device)
    return _keep_flags(t, type(t)(t.uop.to_device(dev), device=dev))


def per_device(devices: tuple[str, ...], make: Any, axis: int | None = None) -> MultiUOp:
    """A new tensor built independently on each device: make(device) gives each shard's plain Tensor."""
    return MultiUOp.leaf([make(d).uop for d in devices], axis, devices)


# ---------------- realizing and reading ----------------
def realize_all(tensors: Sequence[Tensor]) -> None:
    """Realize plain and sharded tensors in one schedule (shared work, an allreduce feeding several outputs, is
    computed once); every sharded tensor then holds a leaf over its shards' buffers."""
    targets: list[tuple[Tensor, list[tuple[UOp, str]]]] = []
    for t in tensors:
        u = t.uop
        if isinstance(u, MultiUOp):
            if not u.is_realized or u.op is not Ops.NOOP:
                targets.append((t, list(zip(u.shards, u.device))))
        elif base_buffer(u) is None:
            targets.append((t, [(u, str(t.device))]))
    if not targets:
        return
    views = iter(realize_targets([p for _, parts in targets for p in parts]))
    for t, parts in targets:
        vs = [next(views) for _ in parts]
        if isinstance(t.uop, MultiUOp):
            t.uop = MultiUOp.leaf(vs, t.uop.axis, t.uop.device)
        else:
            t.uop = vs[0]


def numpy(t: Tensor) -> Any:
    """The values of a sharded tensor: each shard read back from its device, joined on the host (reads are not
    device copies)."""
    t.realize()
    u = t.uop
    assert isinstance(u, MultiUOp)
    parts = [type(t)(s, device=d)._buffer_data() for s, d in zip(u.shards, u.device)]
    return parts[0] if u.axis is None else np.concatenate(parts, axis=u.axis)


def assign(t: Tensor, x: Any) -> Tensor:
    """`Tensor.assign` for sharded tensors: shard by shard, in place (the value realized as a whole first, so work
    shared between shards runs once). A value on one device is placed like the target; sharded values must be
    sharded on the same axis."""
    tu = t.uop
    if not isinstance(x, type(t)):
        x = type(t)(x, dtype=t.dtype)
    if x.dtype != t.dtype:  # a literal's (weak) value joins into the target's dtype; anything else is a mismatch
        if not x.dtype.is_weak or least_upper_dtype(x.dtype, t.dtype) != t.dtype:
            raise TensorTypeError(f"assign dtype mismatch: the target is {t.dtype}, the value is {x.dtype}; cast the "
                                  f"value with .cast({t.dtype}) first")  # fmt: skip
        x = x._joined(t.dtype)
    if x.device is None and isinstance(tu, MultiUOp):  # device-less: built on every device, placed like t
        u = x.uop if x.shape == t.shape else x.uop.reshape((1,) * (len(t.shape) - x.ndim) + x.shape).expand(t.shape)
        x = type(t)(MultiUOp.leaf(_plain_to_shards(u, tu.axis, tu.device), tu.axis, tu.device))
    if x.shape != t.shape:
        if x.ndim == 0:
            x = x.expand(t.shape)
        else:
            raise TensorValueError(f"assign: shape {x.shape} does not match the target's shape {t.shape}")
    if not isinstance(tu, MultiUOp):
        raise ShardingError(f"assign: a sharded value (over {x.device}) can't be assigned to a tensor on {t.device}; "
                            "gather it with .to(device) first")  # fmt: skip
    if not isinstance(x.uop, MultiUOp):
        x = shard_like(x, t)
    xu = x.uop
    assert isinstance(xu, MultiUOp)
    if xu.axis != tu.axis or xu.device != tu.device:
        raise ShardingError(f"assign: the value is sharded over {xu.device} on axis {xu.axis}, the target over "
                            f"{tu.device} on axis {tu.axis}; reshard it with .shard_like(target)")  # fmt: skip
    if not tu.is_realized:
        # an unrealized target simply takes the new value, lazily (as a single-device one does): a clone, so it never
        # shares buffers with an equal graph. Realizing it here ran a schedule of its own: backward()'s accumulation
        # into the .grad of a sharded input (x.grad += g, every step) computed the whole forward and backward pass
        # once more, plus the input's gradient, which nothing reads
        t.uop = xu.contiguous("clone", next(_clone_counter))
        return t
    if not xu.is_realized:
        x = x.contiguous().realize()
    xu = x.uop
    assert isinstance(xu, MultiUOp)
    out = []
    for s, v, d in zip(tu.shards, xu.shards, tu.device):
        ts = type(t)(s, device=d)
        ts.assign(type(t)(v, device=d))
        out.append(ts.uop)
    t.uop = MultiUOp.leaf(out, tu.axis, tu.device)
    return t


def jit_inputs(named: list[tuple[str, Tensor]], views: list[tuple[Tensor, UOp]] | None = None,
               ) -> list[tuple[str, Tensor]]:  # fmt: skip
    """TinyJit inputs with every sharded tensor replaced by one plain tensor per shard (each a whole buffer: a
    shard that is a view gets a buffer of its own first, set into the sharded tensor for the call; the tensor and
    its view go into `views`, for TinyJit to restore after the call)."""
    if not any(isinstance(t.uop, MultiUOp) for _, t in named):
        return named
    out: list[tuple[str, Tensor]] = []
    for name, t in named:
        if not isinstance(t.uop, MultiUOp):
            out.append((name, t))
            continue
        t.realize()
        u = t.uop
        assert isinstance(u, MultiUOp)
        parts = [type(t)(s, device=d) for s, d in zip(u.shards, u.device)]
        if not all(_whole(p) for p in parts):  # (contiguous() of a contiguous view would be the same view)
            parts = [p if _whole(p) else p.clone().realize() for p in parts]
            if views is not None:
                views.append((t, u))
            t.uop = u = MultiUOp.leaf([p.uop for p in parts], u.axis, u.device)
        out += [(f"{name} shard {i} on {d}", p) for i, (p, d) in enumerate(zip(parts, u.device))]
    return out


def _whole(t: Tensor) -> bool:
    u = t.uop
    while u.op in (Ops.RESHAPE, Ops.DETACH):
        u = u.src[0]
    bb = base_buffer(t.uop)
    # (a symbolic shape's buffer holds its largest size)
    return u.op is Ops.BUFFER and bb is not None and int(bb.arg) == int(prod(max_dim(s) for s in t.shape))


def _same_size(a: sint, b: sint) -> bool:
    """a and b are the same size for every value of the Variables in them (symbolic sizes: their difference folds
    to 0)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    d = ssimplify(a - b)
    return isinstance(d, int) and d == 0
