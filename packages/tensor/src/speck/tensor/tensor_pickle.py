"""How a Tensor pickles (speck.tensor.pickling covers captured TinyJits, and keeps the loader names of older pickles).

A tensor pickles as its class, its UOp graph (a realized tensor's graph is a view of a BUFFER; an unrealized one is the
lazy graph) plus one `_BufferRecord` per BUFFER in it: the bytes of a buffer that holds data, nothing for one never
written, the file path for a DISK buffer (its file is mapped again on load, never copied). Unpickling allocates
each buffer on its original device at once and copies the bytes in (no kernel runs), rebuilds the graph on the new
buffers, gives CONTIGUOUS clones fresh tags, so nothing aliases what already lives in the loading process, and makes
the tensor with the pickled class. Every tensor (and JIT) in one pickle that shares a buffer gets one record, so it
still shares it after loading.

What can't be pickled raises TensorPickleError naming the object and the reason."""

from __future__ import annotations

import os
import pickle
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import realize
from speck.tensor.bounds import is_record, record_buffer
from speck.tensor.custom_kernel import CustomKernel, _gradient_rule
from speck.tensor.device import file_backed
from speck.tensor.errors import TensorPickleError as TensorPickleError
from speck.tensor.gradient import override_gradient
from speck.tensor.multi import MultiUOp
from speck.tensor.nodes import _clone_counter
from speck.tensor.pickle_check import check_buffer, check_graph
from speck.tensor.schedule import buffer_device, buffer_map, new_buffer_uop, take_host_array
from speck.uop import Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


# ---------------- buffers ----------------
class _BufferRecord:
    """The pickled form of one BUFFER: kept per BUFFER (weakly) so every reference to it in one pickle is the same
    object, which pickle stores once and unpickles to one new BUFFER."""

    def __init__(self, buf: UOp) -> None:
        self.ref = weakref.ref(buf)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__reduce_ex__(2)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        buf = self.ref()
        assert buf is not None, "a record outlived its BUFFER while being pickled"
        device = buffer_device(buf)
        if is_record(buf):  # a bounds-check record: the loading process's own (where its reads look)
            return (record_buffer, (device,))
        if file_backed(device):  # the file is the data: pickled by path
            return (_load_buffer, (device, buf.arg, buf.dtype, None))
        take_host_array(buf)  # (a Tensor(ndarray)'s array: its values, as they are now)
        storage = buffer_map.get(buf)
        if storage is not None and not hasattr(type(storage), "copyout"):
            raise TensorPickleError(f"can't pickle a {buf.dtype} buffer of {buf.arg} element(s) on {device}: it is "
                                    f"{storage!r}, not device memory (an @function placeholder?)")  # fmt: skip
        data: Any = None
        if storage is not None and storage.is_allocated:
            raw = bytearray(storage.nbytes)
            storage.copyout(raw)
            # plain bytes (no numpy objects in the stream): out-of-band capable with protocol 5
            data = pickle.PickleBuffer(raw) if isinstance(protocol, int) and protocol >= 5 else bytes(raw)
        return (_load_buffer, (device, buf.arg, buf.dtype, data))


_records: weakref.WeakKeyDictionary[UOp, _BufferRecord] = weakref.WeakKeyDictionary()


def _record(buf: UOp) -> _BufferRecord:
    rec = _records.get(buf)
    if rec is None:
        rec = _records[buf] = _BufferRecord(buf)
    return rec


def _load_buffer(device: str, size: int, dtype: Any, data: Any) -> UOp:
    """A new BUFFER on `device` holding `data` (allocated and filled now: no kernel)."""
    check_buffer(device, size, dtype)
    try:
        on_file = file_backed(device)
    except Exception as e:
        raise TensorPickleError(f"can't unpickle a {dtype} buffer of {size} element(s): its device {device!r} can't "
                                f"be opened here ({type(e).__name__}: {e})") from e  # fmt: skip
    if on_file:
        path = device.partition(":")[2]
        need = size * dtype.itemsize
        if not os.path.isfile(path) or os.path.getsize(path) < need:
            raise TensorPickleError(f"can't unpickle a tensor on {device}: the file {path!r} is missing or "
                                    f"smaller than the {need} bytes it held (DISK tensors pickle by path, not "
                                    "content)")  # fmt: skip
    buf = new_buffer_uop(device, size, dtype)
    if data is not None:
        if dtype == dtypes.bool and len(raw := np.frombuffer(data, np.uint8)) and raw.max() > 1:
            data = np.not_equal(raw, 0).view(np.uint8)  # (a stream's bool bytes other than 0/1: True, as numpy reads)
        realize.get_buffer(buf).copyin(data)
    return buf


# ---------------- graphs and tensors ----------------
class _GraphRecord:
    """A UOp graph that reads BUFFERs: pickled with a record per BUFFER, rebuilt on the loaded buffers."""

    def __init__(self, u: UOp) -> None:
        self.u = u

    def __reduce__(self) -> tuple[Any, ...]:
        bufs = tuple(n for n in self.u.toposort() if n.op is Ops.BUFFER)
        return (_load_graph, (self.u, bufs, tuple(_record(b) for b in bufs)))


def _load_graph(u: UOp, bufs: tuple[UOp, ...], loaded: tuple[UOp, ...]) -> UOp:
    new: dict[UOp, UOp] = dict(zip(bufs, loaded))
    for n in u.toposort(gate=lambda x: x.op is not Ops.BUFFER):
        if n in new:
            continue
        nsrc = tuple(new.get(s, s) for s in n.src)
        if n.op is Ops.CONTIGUOUS and n.arg == "clone":  # a clone's tag is its identity: take a fresh one
            new[n] = n.replace(src=nsrc, tag=next(_clone_counter))
        else:
            new[n] = n if all(a is b for a, b in zip(nsrc, n.src)) else n.replace(src=nsrc)
    out = new[u]
    _checked_graph(out)
    _restore_custom_kernel_gradients(out)
    return out


_checked: weakref.WeakSet[UOp] = weakref.WeakSet()


def _checked_graph(u: UOp) -> UOp:
    """u, once pickle_check.check_graph passed it (a graph reaches load_tensor through _load_graph: checked once)."""
    if u not in _checked:
        check_graph(u)
        _checked.add(u)
    return u


def _restore_custom_kernel_gradients(u: UOp) -> None:
    """Custom kernels lose their grad_fxn in a pickle: their outputs differentiate to an error, not through."""
    for n in u.toposort():
        if n.op is Ops.AFTER and len(n.src) == 2 and isinstance(n.src[1].arg, CustomKernel):
            override_gradient(n, n.src[1].src, _gradient_rule(n.src[1], n.src[1].arg))


def reduce_tensor(t: Tensor, cls: type[Tensor]) -> tuple[Any, ...]:
    """Tensor.__reduce__: the class to load it as (cls), graph (with buffer records), device, requires_grad, grad and
    is_param. A sharded tensor (device a tuple) pickles its values and sharding instead, and is sharded the same way
    again on load."""
    if isinstance(t.device, tuple):
        rest = (t.requires_grad, t.grad, t.is_param)

        u = t.uop
        if isinstance(u, MultiUOp) and u.op is Ops.NOOP and u.is_realized:
            # realized: its per-device buffers (through records, so a JIT in the same pickle replays into them)
            shards = tuple(_GraphRecord(s) for s in u.shards)
            return (load_shards, (cls, shards, u.axis, tuple(u.device), *rest))
        return (load_sharded, (cls, t.numpy(), t.dtype, tuple(t.device), getattr(t.uop, "axis", None), *rest))
    return (load_tensor, (cls, _GraphRecord(t.uop), t.device, t.requires_grad, t.grad, t.is_param))


def load_sharded(cls: type[Tensor], data: np.ndarray, dtype: Any, devices: tuple[str, ...], axis: int | None,
                 requires_grad: bool | None, grad: Tensor | None, is_param: bool) -> Tensor:  # fmt: skip
    t = cls(data, device=devices[0], dtype=dtype).shard(devices, axis)
    t.requires_grad, t.grad, t.is_param = requires_grad, grad, is_param
    return t


def load_shards(cls: type[Tensor], shards: tuple[UOp | _GraphRecord, ...], axis: int | None,
                devices: tuple[str, ...], requires_grad: bool | None, grad: Tensor | None,
                is_param: bool) -> Tensor:  # fmt: skip
    plain = tuple(s.u if isinstance(s, _GraphRecord) else _checked_graph(s) for s in shards)
    t = cls(MultiUOp.leaf(plain, axis, devices), requires_grad=requires_grad)
    t.grad, t.is_param = grad, is_param
    return t


def load_tensor(cls: type[Tensor], u: UOp | _GraphRecord, device: str | None, requires_grad: bool | None,
                grad: Tensor | None, is_param: bool = True) -> Tensor:  # fmt: skip
    if isinstance(u, _GraphRecord):  # copy.copy passes the record itself: a shallow copy shares the graph
        u = u.u
    elif isinstance(u, UOp):
        _checked_graph(u)
    t = cls(u, device=device, requires_grad=requires_grad)
    t.grad, t.is_param = grad, is_param
    if device is None:  # a device-less tensor (a constant's graph, on whatever device is the default now)
        t._device = None
    return t


__all__ = ["TensorPickleError", "reduce_tensor"]
