"""`Tensor`: the user-facing lazy tensor. Methods build tensor-level UOp graphs; `realize()` (and anything that
reads data) schedules them into kernels and runs them. Names, arguments, broadcasting and dtype promotion follow
tinygrad's Tensor; numpy is the numeric reference.

This module is the class's core: construction, properties, autograd and sharding entry points, realization and
reads (`realize`, `numpy`, `item`), moves and copies (`to`, `clone`, `contiguous`), and the one place where the
primitives - functions over UOps - are wrapped into Tensors: `_new`, `_binary` and `_unary` (over
`speck.tensor.elementwise`), `_move` (over `speck.tensor.movement`), `_reduced` and `_reduce` (over
`speck.tensor.reduce`). The methods live in mixins named for what they do: operators and elementwise primitives in
`operators.py`, dtype conversions in `casting.py`, constructors in `creation.py`, composed math in
`elementwise.py`, movement in `movement.py`, reductions and linear algebra in `reduce.py`, indexing in
`indexing.py`, nn ops in `nnops.py`, random numbers in `random.py`. They take the class from the tensor at hand
(`type(self)`, `cls`), never importing this module."""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import functools
import pathlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any
from weakref import ref as _ref

import numpy as np

from speck.codegen.numeric import storage_np as np_dtype
from speck.tensor import elementwise as ew
from speck.tensor import live as _live
from speck.tensor import multi
from speck.tensor import realize as _realize
from speck.tensor import reduce as rd
from speck.tensor.autograd import backward, realized_roots
from speck.tensor.autograd import gradient as _gradient
from speck.tensor.base import TensorBase
from speck.tensor.bounds import raise_recorded
from speck.tensor.bounds import records as _bound_records
from speck.tensor.casting import CastMixin
from speck.tensor.creation import CreationMixin
from speck.tensor.custom_kernel import custom_kernel
from speck.tensor.device import canonical, default_device, file_backed
from speck.tensor.dims import as_int, bound_value, flag, raw_bytes, show_shape, tensor_args
from speck.tensor.disk import HOST, host_graph, is_view, needs_host, write_pending_copy
from speck.tensor.dtype import _to_np_dtype as _to_np_dtype
from speck.tensor.elementwise import ElementwiseMixin
from speck.tensor.errors import NumpyDTypeError, TensorAssertionError, TensorTypeError, TensorValueError
from speck.tensor.function import _PlaceholderStorage, callify, linear_with_vars, schedule_linear
from speck.tensor.gradient import register_gradient_rule
from speck.tensor.indexing import IndexingMixin, scatter_gradient
from speck.tensor.keccak import keccak, tensor_hash
from speck.tensor.live import LiveTensors as _LiveTensors
from speck.tensor.live import track as _track
from speck.tensor.metadata import record as _record_metadata
from speck.tensor.movement import MovementMixin
from speck.tensor.multi import MultiUOp
from speck.tensor.nnops import NNMixin
from speck.tensor.nodes import (
    _NP_TO_DT,
    _UINT_OF_SIZE,
    _clone_counter,
    _const_uop,
    _disk_tensor,
    _dt,
    _from_nested,
    _from_numpy,
    _np_cast,
)
from speck.tensor.operators import OperatorMixin
from speck.tensor.random import RandomMixin
from speck.tensor.reduce import ReduceMixin
from speck.tensor.schedule import (
    MAY_HOLD_DATA,
    base_buffer,
    buffer_map,
    buffer_map_data,
    max_dim,
    new_buffer_uop,
    reads_external,
    realized_cache,
    realized_data,
    staged,
    unstage,
    view_offset,
)
from speck.tensor.settings import DISALLOW_BROADCAST, TRAINING
from speck.tensor.tensor_pickle import reduce_tensor
from speck.tensor.writes import _DEFERRED, DEFERRED_ANY, assign, check_foreign, schedule_pending
from speck.tensor.writes import EPOCH as _EPOCH
from speck.tensor.writes import flush as _flush_writes
from speck.tensor.writes import pending as _pending_writes
from speck.tensor.writes import refresh as _refresh
from speck.tensor.writes import thread_writes as _write_state
from speck.uop import DType, Ops, UOp, dtypes, sint
from speck.uop.dtype import WEAK_DTYPES
from speck.uop.helpers import prod
from speck.uop.uop import register_service, set_shape

Scalar = int | float | bool
_BUFFER = Ops.BUFFER  # (a module constant: Tensor.realize tests it per op)
_live_refs, _live_ref = _live._refs, _ref  # (Tensor._binary registers its result itself: live.track's list)
_getrefcount, _KEPT_NODE = sys.getrefcount, _realize.KEPT_NODE  # (the node a per-op realize keeps: see there)
_uop_new = UOp.__new__  # (the hash-consing constructor called as a function: Tensor._binary's per-op node)
_DIRECT_NODE = ew.DIRECT_NODE


# the scheduler and autograd walk graphs recursively: a chain of a few thousand ops (a Python sum() over a list of
# tensors, an unrolled loop) needs more than Python's default depth of 1000 (never lowered here)
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
DTypeLike = DType | str
# a device name, or a tuple of them for a tensor sharded over several devices
DeviceLike = str | tuple[str, ...] | list[str]


def _own_constants(pending: Sequence[Tensor]) -> list[tuple[UOp, Any]]:
    """The (graph, device) targets of tensors realized together. Two tensors holding one constant node (two
    `Tensor.zeros(3)`: hash-consing makes them one node) each get a buffer of their own, or a write into one would
    show in the other."""
    seen: dict[UOp, Tensor] = {}
    out = []
    for t in pending:
        u = t.uop
        if seen.setdefault(u, t) is not t and _realize.is_const_graph(u):
            u = UOp(Ops.CONTIGUOUS, u.dtype, (u,), "clone", next(_clone_counter))
        out.append((u, t.device))
    return out


class _TensorMeta(type):
    """`Tensor.training` is the TRAINING setting itself (so Context(TRAINING=1), Tensor.train() and a direct
    `Tensor.training = True` all agree); a property on the metaclass makes the class-level read and write live."""

    @property
    def training(cls) -> bool:
        return bool(TRAINING)

    @training.setter
    def training(cls, mode: bool) -> None:
        TRAINING.value = int(bool(mode))


class Tensor(
    TensorBase,
    OperatorMixin,
    CastMixin,
    CreationMixin,
    ElementwiseMixin,
    MovementMixin,
    ReduceMixin,
    IndexingMixin,
    NNMixin,
    RandomMixin,
    metaclass=_TensorMeta,
):
    """A lazily computed n-dimensional array on a device. See the module docstring."""

    __slots__ = ("_uop", "_ver", "_device", "requires_grad", "grad", "is_param", "__weakref__")
    grad: Tensor | None
    # None (default) or True: backward() fills .grad when this tensor is in the graph; False: never (opt-out)
    requires_grad: bool | None
    # optimizers update params and only realize the others (buffers: BatchNorm statistics, step counters)
    is_param: bool
    no_grad: bool = False
    # numpy hands binary operators with a Tensor back to the Tensor (np.float32(2) * t is t.__rmul__: a Tensor),
    # instead of treating the Tensor as an object to broadcast (an object array of 0-d Tensors)
    __array_ufunc__ = None

    @property
    def training(self) -> builtins.bool:
        """Whether training mode is on (the TRAINING setting); `t.training` reads the same as `Tensor.training`."""
        return builtins.bool(TRAINING)

    def __init__(
        self,
        data: Any = None,
        device: DeviceLike | None = None,
        dtype: DTypeLike | None = None,
        requires_grad: bool | None = None,
    ) -> None:
        tp = type(data)
        if tp in _SCALAR_TYPES or (tp is np.ndarray and not data.shape):  # (type tests: this is a per-tensor path)
            _init_scalar(self, data, dtype, requires_grad)
            return
        if isinstance(device, (tuple, list)) or isinstance(data, MultiUOp):
            _init_multi(self, data, device, dtype, requires_grad)
            return
        if device is None and tp is UOp:  # a graph node: on the device its graph names
            # (a graph naming no device - UOp.const(...) - is a device-less tensor)
            device = multi.device_of(data) if data.device is not None else None
        dev = canonical(device)
        dt = _dt(dtype)
        self.requires_grad, self.grad, self.is_param = requires_grad, None, True
        self._device: Any = dev if device is not None or tp is not UOp else None
        _track(self)
        if isinstance(data, UOp):
            self.uop = data
            return
        if isinstance(data, Tensor):
            self.uop = data.uop if dt is None else data.cast(dt).uop
            return
        if isinstance(data, pathlib.Path):
            self.uop = _disk_tensor(data, dt or dtypes.uint8)
            self._device = f"DISK:{data.resolve()}"
            if device is not None:
                self.uop, self._device = self.to(dev).uop, dev
            return
        if raw_bytes(data):
            # the bytes reinterpreted as dt (len / itemsize elements)
            dt = dt or dtypes.uint8
            raw = np.frombuffer(bytes(data), dtype=np.uint8)
            if len(raw) % dt.itemsize:  # (b"abc" as int32 was an empty tensor: the bytes were dropped)
                raise TensorValueError(
                    f"Tensor({type(data).__name__} of {len(raw)} bytes, dtype={dt}): {dt} items are {dt.itemsize} "
                    f"bytes and {len(raw)} is no multiple of that; pass whole items (pad or slice the bytes)"
                )
            if dt == dtypes.bool:  # (a BITCAST to bool no renderer expresses; any nonzero byte is True, as numpy reads)
                self.uop = _from_numpy(raw != 0, dt, dev)
                return
            bits = _UINT_OF_SIZE[dt.itemsize]
            self.uop = _from_numpy(raw.view(np_dtype(bits)), bits, dev)
            if dt != bits:
                self.uop = self.uop.bitcast(dt)
            return
        elif isinstance(data, (np.ndarray, memoryview)):  # (a memoryview of values: raw_bytes)
            arr = np.asarray(data)
            if not arr.dtype.isnative and arr.dtype.newbyteorder("=") in _NP_TO_DT:
                arr = arr.astype(arr.dtype.newbyteorder("="))  # (a '>f4' array: same values, native byte order)
            if arr.dtype not in _NP_TO_DT:
                raise NumpyDTypeError(f"numpy dtype {arr.dtype} is not supported; convert to one of the numeric types")
            if arr.dtype == np.bool_ and arr.size and arr.view(np.uint8).max() > 1:
                arr = arr.view(np.uint8) != 0  # bool bytes other than 0/1 (a file's, a frombuffer view): kernels read 1
            dt = dt or _NP_TO_DT[arr.dtype]
        elif isinstance(data, (list, tuple)):
            arr, inferred = _from_nested(data, Tensor)
            dt = dt or inferred
        else:
            raise TensorTypeError(
                f"can't make a Tensor from {type(data).__name__}; expected a Python scalar, list, tuple, bytes, "
                "numpy array, UOp or Tensor"
            )
        if dt.fmt is None:  # bfloat16/fp8: numpy has no such type; stage as float32 and cast on the device
            arr = np.ascontiguousarray(_np_cast(arr, dtypes.float32)).reshape(np.shape(arr))
            self.uop = _from_numpy(arr, dtypes.float32, dev).cast(dt)
            return
        if tp is not list and tp is not tuple and arr.size:  # an ndarray: wrapped, copied in when first used (nodes.py)
            self.uop = staged(_from_numpy(_np_cast(arr, dt), dt, dev, wrap=True))
            return
        arr = np.ascontiguousarray(_np_cast(arr, dt)).reshape(np.shape(arr))
        self.uop = staged(_from_numpy(arr, dt, dev)) if arr.size else _from_numpy(arr, dt, dev)

    @property
    def uop(self) -> UOp:
        """The node of the computation graph this tensor is (a view of a BUFFER once realized)."""
        if self._ver == _EPOCH[0]:
            return self._uop
        if self._ver < 0 and id(self) in _DEFERRED:  # an update deferred on it: reads see the new value (as assign)
            Tensor._realize_with_deferred(())
        return _refresh(self)

    @uop.setter
    def uop(self, u: UOp) -> None:
        self._uop, self._ver = u, _EPOCH[0]

    # tinygrad's name for `uop` until 2025 (older model code reads and writes `t.lazydata`)
    lazydata = uop

    # ---------------- autograd ----------------
    def is_param_(self, flag: builtins.bool = True) -> Tensor:
        """Mark this tensor as an optimizer parameter (True) or a buffer that optimizers only realize (False)."""
        self.is_param = flag
        return self

    def as_param(self, slot: builtins.int = 0) -> Tensor:
        """A placeholder for this tensor as parameter number `slot` of a traced function or kernel: a buffer of the
        same shape, dtype and device that has no data (reading it raises). A weak or device-less tensor has no
        storage a parameter could stand for: RuntimeError."""
        if self._device is None or self.dtype.is_weak or isinstance(self.uop, MultiUOp):
            what = "device-less" if self._device is None else "sharded" if isinstance(self.uop, MultiUOp) else "weak"
            raise TensorValueError(f"as_param needs a tensor with storage on one device; this one is {what} "
                                   f"({self.dtype} on {self.device}): clone() it onto a device first")  # fmt: skip
        size = as_int(prod(max_dim(s) for s in self.shape))
        buf = new_buffer_uop(self._device, size, self.dtype)
        what = f"parameter {slot} (shape {self.shape}, {self.dtype})"
        buffer_map[buf] = _PlaceholderStorage("as_param", what, f"{what} is a placeholder made by as_param(): it has "
                                              "no data to read; bind a real tensor in its place")  # fmt: skip
        out = Tensor(buf.reshape(self.shape) if self.shape != (size,) else buf, device=self._device)
        out.is_param = self.is_param
        return out

    def requires_grad_(self, requires_grad: builtins.bool = True) -> Tensor:
        """Set requires_grad in place (False: backward() never fills this tensor's .grad). Returns self."""
        self.requires_grad = requires_grad
        return self

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d(self)/d(t) into t.grad for every live float tensor t in self's graph (parameters,
        intermediates held in variables and self itself), except those made with requires_grad=False. Returns
        self."""
        return backward(self, self._multi_seed(gradient))

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d(self)/d(target) for each target, as lazy tensors (self must be a scalar unless gradient= is given)."""
        return _gradient(self, *targets, gradient=self._multi_seed(gradient))

    def _multi_seed(self, gradient: Tensor | None) -> Tensor | None:
        """A sharded tensor's seed gradient placed like it (ones for a scalar): gradients of sharded graphs are
        built from sharded nodes only."""
        if not isinstance(self.uop, MultiUOp):
            return gradient
        if gradient is None:
            return self.ones_like() if self.shape == () else None
        return gradient if isinstance(gradient.uop, MultiUOp) else gradient.shard_like(self)

    # ---------------- several devices ----------------
    def shard(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
        """This tensor split into equal pieces along `axis`, piece i on devices[i] (axis None: a full copy on
        every device). `.device` is then the tuple of devices; every op works on it, a reduction over the
        sharded axis ending in an allreduce."""
        return multi.shard(self, devices, axis)

    def shard_(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
        """shard() in place: this tensor becomes the sharded one. Returns self."""
        t = self.shard(devices, axis)
        self.uop, self._device = t.uop, t._device
        return self

    def shard_like(self, y: Tensor) -> Tensor:
        """This tensor placed like y: sharded over y's devices on y's axis, or moved to y's one device."""
        tensor_args("shard_like", "argument", (y,))
        return multi.shard_like(self, y)

    @staticmethod
    def train(mode: builtins.bool = True) -> Any:
        """Context manager for training mode (dropout, batch-norm statistics, optimizer steps)."""
        return train(mode)

    @staticmethod
    def test(mode: builtins.bool = True) -> Any:
        """Context manager (and decorator) for evaluation mode: training off while mode is True."""
        return train(not flag("test", "mode", mode))

    # ---------------- basic properties ----------------
    @property
    def device(self) -> Any:
        """The device name; for a sharded tensor the tuple of its devices' names."""
        return self._device

    # (shape and dtype read the graph as it is: rebinding it to the values of its time changes neither)
    @property
    def shape(self) -> tuple[sint, ...]:
        return self._uop.shape

    @property
    def dtype(self) -> DType:
        return self._uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> sint:
        n: sint = prod(self.shape)
        return n

    def element_size(self) -> int:
        if self.dtype.is_weak:
            raise TensorTypeError(f"a {self.dtype} tensor has no element size (a Python literal's dtype has no storage "
                                  "width); cast it to a concrete dtype first")  # fmt: skip
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return as_int(self.numel()) * self.element_size()

    def size(self, dim: int | None = None) -> sint | tuple[sint, ...]:
        """The shape, or the size of one dim (negative dims count from the end)."""
        return self.shape if dim is None else self.shape[self._resolve_dim(dim)]

    @property
    def max_shape(self) -> tuple[int, ...]:
        """The shape with every symbolic dim at its upper bound."""
        return tuple(max_dim(s) for s in self.shape)

    def max_numel(self) -> int:
        return int(prod(self.max_shape))

    def __len__(self) -> int:
        if not self.shape:
            raise TensorTypeError("len() of a 0-d tensor")
        return as_int(self.shape[0])

    def __repr__(self) -> str:
        grad = None if self.grad is None else f"<UOp {self.grad.device} {self.grad.shape} {self.grad.dtype}>"
        return f"<Tensor <UOp {self.device} {self.shape} {self.dtype}> on {self.device} with grad {grad}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        raise TensorTypeError("the truth value of a Tensor is ambiguous (it would need a device read); use .item(), or "
                              ".any()/.all() then .item()")  # fmt: skip

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self))) if self.ndim else iter(())

    def __delitem__(self, idx: Any) -> None:
        raise TensorTypeError("Tensor doesn't support item deletion; build a new tensor (e.g. cat the parts to keep)")

    def _new(self, u: UOp, device: str | None = None) -> Tensor:
        t = Tensor.__new__(Tensor)
        dev = device or self._device
        if type(dev) is tuple or type(u) is MultiUOp:  # sharded, or a single shard taken out of a sharded tensor
            dev = u.device if isinstance(u, MultiUOp) else multi.device_of(u)
        t._uop, t._ver, t._device = u, _EPOCH[0], dev
        # an op result needs a gradient as its input does (False: computed only from tensors that opted out)
        t.requires_grad, t.grad, t.is_param = self.requires_grad, None, True
        _track(t)
        _record_metadata(u)
        return t

    def _const_like(self, v: Scalar, dtype: DType | None = None) -> Tensor:
        """A 0-d constant of dtype (default self's) where self is (device-less for device-less or sharded self)."""
        dev = self._device
        return Tensor._constant(v, dtype or self.dtype, None if type(dev) is tuple else dev)

    @staticmethod
    def _constant(value: Scalar, dtype: DType | None, device: Any) -> Tensor:
        """A 0-d constant of dtype (default: the literal's own, weak for int/float) on device; device None makes it
        device-less. Internal code uses this for constants that belong to a device (Tensor(scalar) ignores
        device=); the Python int must fit an int dtype (a literal never wraps silently)."""
        dt = dtypes.from_py(value) if dtype is None else dtype
        home = default_device() if device is None else device
        t = Tensor(ew.const(value, dt, home), device=home)
        t._device = device
        return t

    # ---------------- realization ----------------
    def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
        """Compute this tensor (and lst) now; the tensors then hold buffers instead of graphs. do_update_stats=False
        leaves GlobalCounters' run totals (kernel_count, global_ops, global_mem, time_sum_s) as they were."""
        if not do_update_stats:
            _realize.without_run_counts(Tensor.realize_all, self, *lst)
            return self
        if lst or self._device is None or self._uop.dtype in WEAK_DTYPES or DEFERRED_ANY[0] or _write_state.pending:
            Tensor.realize_all(self, *lst)
            return self
        # one tensor, no writes or deferred updates pending (the per-op case): realize_all's checks without its frames
        u = self._uop if self._ver == _EPOCH[0] else self.uop  # (the uop property, without its frame)
        if u.__class__ is UOp and len(src := u.src) == 2 and src[0].op is _BUFFER and src[1].op is _BUFFER \
                and (not realized_data or _ref(u) not in realized_data):  # fmt: skip
            # one op over two BUFFERs (`(a + b).realize()`, a computation): _realize_one's path without its frame
            view = _realize.realize_binary(u, a := src[0], b := src[1], self._device, _KEPT_NODE[-1:])  # (its note)
            self._uop, self._ver = view, _EPOCH[0]
            if self.requires_grad is True:
                realized_roots[id(self)] = self
            # (u here, getrefcount's argument, and the keep: nobody else's; a slice, as other threads may empty it)
            mine = 3 if (last := (kept := _KEPT_NODE)[-1:]) and last[0][0] is u else 2
            del last  # (its reference to u, before counting)
            if (n := _getrefcount(u)) > mine and not _realize.is_const_graph(u) and not reads_external(u):
                realized_cache[u] = view  # (see _realize_one)
            elif n == 2:  # (nobody's, not kept yet)
                _realize.keep_node(kept, u, a, b)
        elif not Tensor._realize_one(self):
            Tensor._realize_now((self,))
        if _realize.capture_state.calls is None and _bound_records:
            raise_recorded(host_only=True)
        return self

    @staticmethod
    def realize_all(*tensors: Tensor) -> None:
        tensor_args("realize_all", "argument", tensors)
        Tensor._realize_all(tensors)
        if _realize.capture() is None:  # an out-of-range index its kernels met, where they ran synchronously (bounds)
            raise_recorded(host_only=True)

    @staticmethod
    def _realize_all(tensors: tuple[Tensor, ...]) -> None:
        for t in tensors:
            if t._device is None or t._uop.dtype in WEAK_DTYPES:
                # device-less and weak tensors have no storage: realizing them is a no-op (reads compute them)
                tensors = tuple(t for t in tensors if t._device is not None and t._uop.dtype not in WEAK_DTYPES)
                break
        if DEFERRED_ANY[0] and _DEFERRED:
            Tensor._realize_with_deferred(tensors)
            return
        if _pending_writes():
            # the writes these tensors depend on run first, in program order (the later ones stay pending); a tensor
            # made before some of them is computed just before them
            _flush_writes(tensors, needed_only=True)
        Tensor._realize_now(tensors)

    @staticmethod
    def _realize_now(tensors: Sequence[Tensor]) -> None:
        """Compute tensors from the buffers as they are now (realize_all without the pending writes)."""
        _KEPT_NODE.clear()  # (a kept node is nobody's: realize_targets would cache it for as long as it is kept)
        if len(tensors) == 1 and Tensor._realize_one(tensors[0]):
            return
        for t in tensors:  # host data and views of it (Tensor(ndarray)) already sit in their buffer
            if type(u := t.uop) is UOp and base_buffer(u) is None and (v := unstage(u)) is not u:
                t.uop = v
        if any(type(t.uop) is MultiUOp for t in tensors):
            multi.realize_all(tensors)
            return
        pending = []
        for t in tensors:
            if (bb := base_buffer(t.uop)) is None:
                pending.append(t)
            else:
                _realize.attach_storage(bb)  # (a Tensor.empty's storage is made when realized)
        if pending:
            for t, v in zip(pending, _realize.realize_targets(_own_constants(pending))):
                t.uop = v
                if t.requires_grad is True:
                    realized_roots[id(t)] = t

    @staticmethod
    def _realize_one(t: Tensor) -> bool:
        """_realize_now of one tensor when it is a single-device one (realize.realize_graph's warm path); False
        (nothing done) for any other."""
        u = t._uop if t._ver == _EPOCH[0] else t.uop  # (the uop property, without its frame)
        if type(u) is not UOp:
            return False
        if u.op in MAY_HOLD_DATA:  # (any other node is a computation still to run)
            if (bb := base_buffer(u)) is not None:
                if _ref(bb) not in buffer_map_data:  # (a Tensor.empty's: its storage is made when realized)
                    _realize.attach_storage(bb)
                return True
            if (v := unstage(u)) is not u:  # host data and views of it (Tensor(ndarray)) sit in their buffer
                t.uop = u = v
                if base_buffer(u) is not None:
                    return True
        if _ref(u) in realized_data:
            return False
        view = _realize.realize_graph(u, t._device)
        t._uop, t._ver = view, _EPOCH[0]  # (t.uop = view, without the setter's frame)
        if t.requires_grad is True:
            realized_roots[id(t)] = t
        # later graphs holding u read the buffer instead of computing u again; when nothing else holds u (only this
        # frame's `u` and getrefcount's argument) it dies now and the entry would go with it
        if sys.getrefcount(u) > 2 and not _realize.is_const_graph(u) and not reads_external(u):
            realized_cache[u] = view
        return True

    @staticmethod
    def _realize_with_deferred(tensors: Sequence[Tensor]) -> None:
        """Realize tensors and every deferred update's value in one schedule (so they share kernels: BatchNorm's
        running statistics reuse the forward pass the loss computes), then apply the updates."""
        updates = _DEFERRED.take()
        Tensor.realize_all(*tensors, *[v for _, v in updates])
        for target, value in updates:
            target.assign(value)
        _flush_writes()

    def assign_deferred(self, x: Tensor) -> Tensor:
        """Like assign(), but the update happens at the next realize of any tensor, computed in the same schedule
        as what that realize computes: a state update (BatchNorm's running statistics) costs no pass of its own
        over the graph it reads. Until then a graph built from this tensor (or a second deferred update of it) applies
        the pending updates first, so it reads the new value as after assign()."""
        tensor_args("assign_deferred", "argument", (x,))
        if x.shape != self.shape:
            raise TensorValueError(f"assign_deferred: shape {x.shape} does not match the target's shape {self.shape}")
        if id(self) in _DEFERRED:
            Tensor._realize_with_deferred(())
        _DEFERRED.put(self, x)
        return self

    def schedule(self, *lst: Tensor) -> list[Any]:
        """The ScheduleItems realizing this tensor (and lst) would run (without running them)."""
        tensor_args("schedule", "argument", lst)
        parts: list[tuple[Any, Any]] = []
        for t in (self, *lst):
            u = t.uop
            parts += list(zip(u.shards, u.device)) if isinstance(u, MultiUOp) else [(u, t.device)]

        # (the whole-tensor assigns still pending on these tensors' buffers come first: `a.assign(a + 1).schedule()`
        # lists the kernel computing the new value)
        return schedule_pending([u for u, _ in parts]) + _realize.schedule_targets(parts)[0]

    def schedule_with_vars(self, *lst: Tensor) -> tuple[list[Any], dict[str, int]]:
        """(schedule(*lst), the values of the bound Variables its items use)."""
        tensor_args("schedule_with_vars", "argument", lst)
        items = self.schedule(*lst)
        return items, {k: v for it in items for k, v in it.var_vals.items()}

    def kernelize(self, *lst: Tensor) -> Tensor:
        """tinygrad's step between building a graph and realizing it (grouping it into kernels); returns self.
        speck's scheduler groups a graph into kernels when it is realized or scheduled, so there is nothing to do
        before: values, `schedule()` and `realize()` are the same with or without this call."""
        tensor_args("kernelize", "argument", lst)
        return self

    def contiguous(self) -> Tensor:
        """A tensor materialised in its own row-major buffer (free when it already is one). Device-less and weak
        tensors have no buffer to give: a plain new tensor of the same graph."""
        if self._device is None or self.dtype.is_weak:
            return self._new(self.uop)
        if isinstance(self.uop, MultiUOp):
            return self if self.uop.op is Ops.CONTIGUOUS and self.uop.arg is None else self._new(self.uop.contiguous())
        if self.uop.op is Ops.BUFFER or (self.uop.op is Ops.CONTIGUOUS and self.uop.arg is None):
            return self  # a buffer, or already going to be one (a second copy would be a kernel of its own)
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def contiguous_backward(self) -> Tensor:
        """The same tensor; its gradient is made contiguous in the backward pass. speck schedules the gradient
        graph as a whole, so there is nothing to mark: the values are exactly self's."""
        return self

    def clone(self, device: str | None = None) -> Tensor:
        """A copy in a new buffer of its own (a fresh tag keeps two clones of one tensor from sharing a buffer), on
        `device` if given; .grad is cloned too and is_param kept."""
        src = self._materialized(canonical(device) if isinstance(device, str) else default_device())
        src = src.to(device) if device is not None else src
        if isinstance(src.uop, MultiUOp):
            out = src._new(src.uop.contiguous("clone", next(_clone_counter)))
        else:
            out = src._new(UOp(Ops.CONTIGUOUS, src.dtype, (src.uop,), "clone", next(_clone_counter)))
        out.is_param = self.is_param
        if out.requires_grad is False:
            out.requires_grad = None  # a clone of a detached value is a new leaf: it gets .grad (detach opted out)
        if src.grad is not None:
            out.grad = src.grad.clone()
        return out

    def detach(self) -> Tensor:
        """The same values with no gradient flowing back through them."""
        if isinstance(self.uop, MultiUOp):
            t = self._new(self.uop.detach())
        else:
            t = self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)) if self.uop.op is not Ops.DETACH else self.uop)
        t.requires_grad = False
        return t

    def to(self, device: DeviceLike | None) -> Tensor:
        """This tensor on `device` (a copy when the device differs). A tuple of devices replicates it on each; a
        sharded tensor moved to one device is gathered there."""
        if self._device is None:  # device-less: it takes the device of what it meets (tinygrad returns it as is)
            for d in device if isinstance(device, (tuple, list)) else (device,):
                if d is not None:  # (but a misspelled name is an error here as for any tensor, not silently kept)
                    canonical(d)
            return self
        if isinstance(device, (tuple, list)) or isinstance(self.uop, MultiUOp):
            return multi.to(self, device)
        dev = canonical(device)
        if dev == self.device:
            return self
        if self.dtype.is_weak:
            raise TensorTypeError(f"can't move a {self.dtype} tensor from {self.device} to {dev}: a Python literal's "
                                  "dtype has no storage to copy; cast it to a concrete dtype first")  # fmt: skip

        if file_backed(self._device) and not is_view(self.uop):
            write_pending_copy(self)
        if file_backed(self._device) and is_view(self.uop) and needs_host(self.uop):  # a strided view of a file
            host = Tensor(host_graph(self.uop), device=HOST)
            return host if dev == HOST else host.to(dev)
        out = self._new(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=dev)), dev), dev)
        out.is_param = self.is_param  # .grad moves along (to_ keeps the moved one)
        if self.grad is not None:
            out.grad = self.grad.to(dev)
        return out

    def to_(self, device: DeviceLike | None) -> Tensor:
        t = self.to(device)
        self.uop, self._device, self.grad = t.uop, t._device, t.grad
        return self

    def _buffer_data(self) -> np.ndarray:
        """The row-major data as a numpy array of the concrete shape (a copy). bfloat16 and fp8, which numpy
        lacks, are read as float32 (exact)."""
        if self._device is None or self.dtype.is_weak:  # computed at the default dtype (device-less: on CPU)
            return self._materialized("CPU" if self._device is None else self._device)._buffer_data()
        if isinstance(self.uop, MultiUOp):
            out: np.ndarray = multi.numpy(self)
            return out
        if self.dtype.fmt is None:  # (a file computes nothing: a bf16/fp8 DISK tensor is converted on the host)
            return (self.to(HOST) if file_backed(self._device) else self).cast(dtypes.float32)._buffer_data()
        if any(not isinstance(s, int) for s in self.shape):
            raise TensorAssertionError(
                f"can't read symbolic shape {show_shape(self.shape)}; .reshape{tuple(map(bound_value, self.shape))} it"
            )
        shape = tuple(as_int(s) for s in self.shape)

        if file_backed(self._device) and not is_view(self.uop):
            write_pending_copy(self)
        if file_backed(self._device) and is_view(self.uop) and needs_host(self.uop):  # a strided view of a file
            return Tensor(host_graph(self.uop), device=HOST)._buffer_data()
        if _realize.capture() is not None:  # reading inside a TinyJit capture: a replay would not read again
            _realize.check_read_allowed("reading a tensor's data (numpy/tolist/item/data)")
        check_foreign(self, "reading a tensor's data (numpy/tolist/item/data)")
        if len(shape) > 64:  # numpy's limit on dims (a crafted checkpoint can claim any number)
            raise TensorValueError(f"can't read a tensor of {len(shape)} dims into numpy, which holds at most 64; "
                                   "reshape it to fewer dims first")  # fmt: skip
        if 0 in shape:
            try:
                return np.zeros(shape, dtype=np_dtype(self.dtype))
            except ValueError as e:  # a dim beyond what numpy indexes (2**70 x 0 is empty, yet no numpy shape)
                raise TensorValueError(
                    f"can't read an empty tensor of shape {shape} into numpy ({e}); each dim must "
                    "be below 2**63 and their product fit in memory; reshape it first"
                ) from None
        src = self
        if dtypes.is_float(self.dtype) and base_buffer(self.uop) is None:
            # a read computes a copy and leaves self's graph as it is (TENSOR_API 0.1), so gradients still reach
            # its inputs: `print(loss.item()); loss.backward()` (the copy is remembered for graphs that hold it)
            src = self._new(self.uop)
        src.realize()
        off = view_offset(src.uop)
        if off is None:
            t = src.contiguous().realize()
            off = view_offset(t.uop)
            u = t.uop
        else:
            u = src.uop
        assert off is not None
        bb = base_buffer(u)
        assert bb is not None
        n = prod(shape)
        out = np.array(_realize.buffer_numpy(bb)[off : off + n]).reshape(shape)
        raise_recorded()  # an out-of-range index some kernel met since the last read (speck.tensor.bounds)
        return out

    def numpy(self) -> np.ndarray:
        """The values as a new numpy array."""
        return self._buffer_data()

    def __array__(self, dtype: Any = None, copy: builtins.bool | None = None) -> np.ndarray:
        """np.asarray(t) / np.array(t): the values (a new array, as numpy()), not an object array of Tensors."""
        if copy is False:
            raise TensorValueError("np.asarray(tensor, copy=False): a tensor's values are always copied out of its "
                                   "buffer; drop copy=False")  # fmt: skip
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def tolist(self) -> Any:
        """The values as (nested) Python lists; a 0-d tensor gives a scalar."""
        return self._buffer_data().tolist()

    def item(self) -> Scalar:
        """The single value of a 1-element tensor as a Python scalar."""
        if self.numel() != 1:
            raise TensorAssertionError(f"item() needs a tensor with exactly 1 element, this one has shape {self.shape}")
        return self._buffer_data().reshape(()).item()  # type: ignore[no-any-return]

    def data(self) -> memoryview:
        """The values as a memoryview shaped like the tensor (0-d: shape ()), in the dtype's struct format (int64 is
        'q', not numpy's 'l')."""
        arr = self._buffer_data()
        mv: Any = memoryview(np.ascontiguousarray(arr).reshape(arr.shape if self.ndim else ()))  # type: ignore[arg-type]
        fmt = self.dtype.fmt if self.dtype.fmt is not None and not self.dtype.is_weak else arr.dtype.char
        if arr.size and mv.format != fmt and fmt in _MV_CASTABLE:
            # (memoryview casts to a shape without zeros, and not to 'e' before Python 3.12: those keep numpy's view)
            mv = mv.cast("B").cast(fmt, list(mv.shape))
        out: memoryview = mv
        return out

    # ---------------- the primitives, wrapped ----------------
    # The one place Tensor wraps speck.tensor.elementwise's functions over UOps: `_binary` turns Tensor and scalar
    # operands into nodes (ew.promote applies the dtype, device and broadcasting rules), calls the function and makes
    # the result a Tensor whose requires_grad is the operands' (True if any is True, else None if any is None).
    def _operand(self, y: Any) -> Tensor | Scalar:
        """y as the other operand of a binary op: a Tensor or Python scalar as it is; an array-like (list, numpy)
        becomes a tensor on self's device, a UOp a tensor of its own."""
        if isinstance(y, (Tensor, builtins.int, builtins.float)):
            return y
        if isinstance(y, UOp):
            return Tensor(y)
        if hasattr(y, "__len__") or hasattr(y, "dtype"):
            return Tensor(y, device=self.device)
        raise TensorTypeError(f"can't combine a Tensor with {type(y).__name__} {y!r}")

    def _binary(self, fn: Any, y: Any, reverse: builtins.bool = False) -> Tensor:
        """fn(a, b, device) over self and y promoted to one shape, dtype and device (reverse: y first)."""
        rg = self.requires_grad
        dev = self._device
        if dev.__class__ is str or (dev is None and y.__class__ is Tensor):
            # the per-op fast path: y a Tensor of self's dtype and device (a device-less side is rebuilt on the other's
            # device), of self's shape or 0-d, or a Python float/int self's dtype takes unchanged. ew.promote's nodes
            # (hash-consing: the same objects) and _new's Tensor, made without their general steps and frames
            ep = _EPOCH[0]
            xu = self._uop if self._ver == ep else self.uop
            dt, a = xu.dtype, None
            if y.__class__ is Tensor:
                yu = y._uop if y._ver == ep else y.uop
                if yu.dtype is dt and xu.__class__ is UOp and yu.__class__ is UOp \
                        and ((yd := y._device) is dev or ew.joinable(yd, dev)):  # fmt: skip
                    if yd is None and dev is not None:
                        yu = ew.on_device_of(yu, None, dev)[0]
                    elif dev is None and yd is not None:
                        xu, dev = ew.on_device_of(xu, None, yd)
                    if (xs := xu._shape) == yu._shape and xs.__class__ is tuple:
                        a, b = (yu, xu) if reverse else (xu, yu)
                    else:
                        xs, ys = xu.shape, yu.shape
                        if xs != ys and (xs == () or ys == ()) and not DISALLOW_BROADCAST.value:  # a 0-d side
                            if ys == ():
                                yu, ys = ew.expand_0d(yu, xs), xs
                            else:
                                xu, xs = ew.expand_0d(xu, ys), ys
                        if xs == ys:
                            a, b = (yu, xu) if reverse else (xu, yu)
                    if a is not None and rg is not True \
                            and ((o := y.requires_grad) is True or (rg is False and o is None)):  # fmt: skip
                        rg = o
            elif (y.__class__ is float or y.__class__ is int) and xu.__class__ is UOp and dev is not None \
                    and dt in ew.TAKES_LITERAL[y.__class__]:  # fmt: skip
                xs = xs if (xs := xu._shape).__class__ is tuple else xu.shape
                c = ew.broadcast_literal(y, dt, dev, xs)  # (a literal leaves requires_grad to self)
                a, b = (c, xu) if reverse else (xu, c)
            if a is not None:
                if (d := _DIRECT_NODE.get(fn)) is None or dt not in d[2]:  # one ALU node (weak dtypes: not)
                    u, fresh, k = fn(a, b, dev), False, _KEPT_NODE[-1:]
                elif (k := _KEPT_NODE[-1:]) and (u := k[0][0]).op is d[0] and (s := u.src)[0] is a and s[1] is b \
                        and u.dtype is (d[1] or dt) and u.arg is None and u.tag is None:  # fmt: skip
                    fresh = False  # (the kept node, this op's: hash-consing's node, without its key and lookup)
                elif fresh := _getrefcount(u := _uop_new(UOp, d[0], d[1] or dt, (a, b))) == 2:  # (only this frame's)
                    set_shape(u, xs)  # (no name, no shape yet)
                out = Tensor.__new__(Tensor)
                # (the epoch now, not ep: reading self.uop above may have applied a deferred update, a write)
                out._uop, out._ver, out._device = u, _EPOCH[0], dev
                out.requires_grad, out.grad, out.is_param = rg, None, True
                _live_refs.append(_live_ref(out))  # (live.track, inlined)
                if len(_live_refs) > _live._sweep_at:
                    _live._sweep()
                # (the walk starts at the caller, as _new's would; nothing to record for the kept node k with its entry)
                if fresh or not (k and k[0][0] is u and k[0][1]):
                    _record_metadata(u, fresh)
                return out
        if y.__class__ is not Tensor:
            y = self._operand(y)
        if isinstance(y, Tensor):
            a, b, dev, _ = ew.promote(self.uop, self._device, y.uop, y._device, reverse)
            o = y.requires_grad
            if rg is not True and (o is True or (rg is False and o is None)):
                rg = o
        else:  # (a Python scalar never needs a gradient: it leaves the result's requires_grad to self)
            a, b, dev, _ = ew.promote(self.uop, self._device, y, None, reverse)
        out = self._new(fn(a, b, dev), dev)
        out.requires_grad = rg
        return out

    def _unary(self, fn: Any, *args: Any) -> Tensor:
        return self._new(fn(self.uop, self._device, *args))

    def _on_device_of(self, other: Tensor) -> Tensor:
        u, dev = ew.on_device_of(self.uop, self._device, other._device)
        return self if dev is self._device else Tensor(u, device=dev)

    # speck.tensor.movement's functions over UOps: a view of self, or self when there is nothing to do
    def _move(self, fn: Any, arg: Any) -> Tensor:
        u = self.uop
        return self if (out := fn(u, arg)) is u else self._new(out)

    # speck.tensor.reduce's functions over UOps
    def _reduced(self, u: UOp, dev: Any) -> Tensor:
        out = self._new(u, dev)
        if dev is None and self._device is not None:  # (an empty max of a sharded tensor: a device-less constant)
            out._device, out.requires_grad = None, None
        return out

    def _reduce(self, op: Ops, axis: Any = None, keepdim: builtins.bool = False) -> Tensor:
        return self._reduced(*rd.reduce(self.uop, self._device, op, axis, keepdim))

    # ---------------- assign ----------------
    def assign(self, x: Tensor | Scalar | Any) -> Tensor:
        """In-place update: self now holds x (a tensor of self's dtype and device, or a scalar/list converted to
        them), broadcast to self's shape. Lazy: the write runs at the next realize, in program order with other
        writes. Through a view of a realized buffer the write lands in the buffer, and every view of it sees it;
        tensors computed before the write keep the values they were computed from (speck.tensor.writes)."""
        if isinstance(self.uop, MultiUOp) or isinstance(x, Tensor) and isinstance(x.uop, MultiUOp):
            return multi.assign(self, x)

        return assign(self, x)

    def custom_kernel(self, *others: Tensor, fxn: Any, grad_fxn: Any = None) -> list[Tensor]:
        """Run a kernel written in UOps on (self, *others): `fxn` gets one buffer placeholder per tensor and returns
        a SINK of stores; the result is each tensor after the kernel (see speck.tensor.custom_kernel)."""
        return custom_kernel((self, *others), fxn, grad_fxn)

    def callify(self, *others: Tensor) -> Tensor:
        """Make the pending computation of self and others one self-contained call, rewiring them to its outputs
        (values unchanged; see speck.tensor.function.callify). Returns self."""
        callify(self, *others)
        return self

    def linear_with_vars(self, *others: Tensor) -> tuple[list[Any], dict[str, builtins.int]]:
        """(the ScheduleItems realizing self and others would run, in order; the bound Variables' values)."""
        return linear_with_vars(self, *others)

    def schedule_linear(self, *others: Tensor) -> list[Any]:
        """linear_with_vars without Variables (TensorAssertionError when the program reads some)."""
        return schedule_linear(self, *others)

    def keccak(self, cfg: str | tuple[builtins.int, builtins.int] = "sha3_256") -> Tensor:
        """SHA-3/SHAKE digest (uint8) of each message along the last dim (see speck.tensor.keccak)."""
        return keccak(self, cfg)

    def hash(self) -> Tensor:
        """A 16-byte (uint8) tree hash of the whole tensor's bytes (see speck.tensor.keccak.tensor_hash)."""
        return tensor_hash(self)

    def replace(self, x: Tensor) -> Tensor:
        if x.shape != self.shape:
            raise TensorAssertionError(f"replace: shape {x.shape} does not match {self.shape}")
        self.uop, self._device = x.uop, x._device
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the graph with its buffers' bytes (realized or not; see speck.tensor.tensor_pickle). It loads as a
        Tensor, as it always has (a subclass's instance too)."""
        return reduce_tensor(self, Tensor)


# what Tensor(x) makes a device-less 0-d constant of: Python scalars, None, numpy scalars (and 0-d arrays)
# the struct formats memoryview.cast accepts (every dtype's but half's "e" before Python 3.12)
_MV_CASTABLE = frozenset("?bBhHiIlLqQfd")
# the run totals realize(do_update_stats=False) leaves unchanged
_SCALAR_TYPES = frozenset({bool, int, float, type(None), *(np.dtype(d).type for d in _NP_TO_DT), np.float64})


def _init_scalar(t: Tensor, data: Any, dtype: DTypeLike | None, requires_grad: bool | None) -> None:
    """Tensor(Python scalar, None or 0-d array): a device-less 0-d constant (device= is ignored; it takes the device
    of the tensors it meets). An int or float literal is weak (weakint, weakfloat) unless dtype= is given."""
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        if arr.dtype not in _NP_TO_DT:
            raise NumpyDTypeError(f"numpy dtype {arr.dtype} is not supported; convert to one of the numeric types")
        data, dtype = arr.item(), dtype or _NP_TO_DT[arr.dtype]
    dt = _dt(dtype, weak_ok=True) or dtypes.from_py(0.0 if data is None else data)
    t.requires_grad, t.grad, t.is_param = requires_grad, None, True
    t._device = None
    _track(t)
    t.uop = _const_uop(0.0 if data is None else data, dt, default_device())


def _init_multi(t: Tensor, data: Any, device: Any, dtype: DTypeLike | None, requires_grad: bool | None) -> None:
    """Tensor(data, device=(dev0, dev1, ...)): the data replicated on every device (a graph of sharded nodes keeps
    its own placement; a plain graph holding buffers stays on their device)."""
    devs = None if isinstance(data, MultiUOp) else multi.canonical_devices(device)
    if devs is not None and len(devs) == 1:
        Tensor.__init__(t, data, devs[0], dtype, requires_grad)
        return
    t.requires_grad, t.grad, t.is_param = requires_grad, None, True
    _track(t)
    dt = _dt(dtype)
    if isinstance(data, MultiUOp):
        u = data if dt is None else data.cast(dt)
        assert isinstance(u, MultiUOp)
        t.uop, t._device = u, u.device
        return
    assert devs is not None
    if isinstance(data, Tensor):
        src = data if dt is None else data.cast(dt)
        moved = src.to(devs)
        t.uop, t._device = moved.uop, moved._device
        return
    if isinstance(data, UOp):
        if any(n.op is Ops.BUFFER for n in data.toposort()):
            t.uop, t._device = data, multi.device_of(data)
            return
        u = MultiUOp.leaf(multi._plain_to_shards(data, None, devs), None, devs)
        t.uop, t._device = (u if dt is None else u.cast(dt)), devs
        return
    u = multi.per_device(devs, lambda d: Tensor(data, device=d, dtype=dtype))
    t.uop, t._device = u, devs


def is_training() -> bool:
    """Training mode: the TRAINING setting (which Tensor.training reads and writes, and Tensor.train() sets)."""
    return bool(TRAINING)


class train(contextlib.ContextDecorator):
    """Training mode for the block: dropout is active, batch-norm updates its running statistics, and optimizer
    steps are allowed. Same as Context(TRAINING=1). Also a decorator; `__enter__` alone switches the mode until
    `__exit__` (the object holds no generator that dropping it would close)."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = flag("train", "mode", mode)  # (int("no") failed only at __enter__; a list counted as yes)
        self.saved: list[int] = []

    def __enter__(self) -> None:
        self.saved.append(TRAINING.value)
        TRAINING.value = int(self.mode)

    def __exit__(self, *exc: object) -> None:
        TRAINING.value = self.saved.pop()


# tinygrad's module-level names: `all_tensors` (weak references to every live Tensor, a view of speck.tensor.live)
# and `_METADATA` (the Metadata of the op being built; speck records no per-op metadata, so nothing sets it)
all_tensors = _LiveTensors()
_METADATA: contextvars.ContextVar[Any] = contextvars.ContextVar("_METADATA", default=None)


def _shard_uop(u: UOp, devices: tuple[str, ...], axis: int | None) -> UOp:
    return Tensor(u).shard(devices, axis).uop


# the services of layers below that build tensors from bare nodes, with no tensor at hand to take the class from
register_service("uop_shard", _shard_uop)  # UOp.shard: Tensor.shard of the node
register_gradient_rule(Ops.ASSIGN, functools.partial(scatter_gradient, Tensor))  # the O(k) scatter's gradient
