"""Pickling tensors and captured TinyJits.

A tensor pickles as its UOp graph (a realized tensor's graph is a view of a BUFFER; an unrealized one is the lazy
graph) plus one `_BufferRecord` per BUFFER in it: the bytes of a buffer that holds data, nothing for one never
written, the file path for a DISK buffer (its file is mapped again on load, never copied). Unpickling allocates
each buffer on its original device at once and copies the bytes in (no kernel runs), rebuilds the graph on the new
buffers, and gives CONTIGUOUS clones fresh tags, so nothing aliases what already lives in the loading process.
Every tensor (and JIT) in one pickle that shares a buffer gets one record, so it still shares it after loading.

A captured TinyJit pickles its CapturedJit: the recorded calls (compiled programs included: ProgramSpec with its
object code), its input/intermediate/output buffers (through the same records) and its returned tensors; the
loaded JIT replays at once without tracing (its function is not pickled: reset() raises JitResetError).
UOps, DTypes and Variables pickle by themselves (hash-consed/interned again on load); PatternMatchers by their
module-level name.

What can't be pickled raises TensorPickleError naming the object and the reason.

Only unpickle what you or someone you trust pickled: these pickles carry code (a captured TinyJit's compiled kernels
run as they are, and pickle itself calls whatever the stream names), so loading a hostile one runs its author's code.
Exchange weights as safetensors (nn.state.safe_save / safe_load), which hold only data."""

from __future__ import annotations

import os
import pickle
import weakref
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import realize
from speck.tensor.bounds import is_record, record_buffer
from speck.tensor.custom_kernel import CustomKernel, _gradient_rule
from speck.tensor.device import file_backed
from speck.tensor.errors import JitNotCapturedError
from speck.tensor.errors import TensorPickleError as TensorPickleError
from speck.tensor.gradient import override_gradient
from speck.tensor.multi import MultiUOp
from speck.tensor.nodes import _clone_counter
from speck.tensor.schedule import ScheduleItem, buffer_device, buffer_map, new_buffer_uop
from speck.uop import Ops, UOp

if TYPE_CHECKING:
    from speck.tensor.jit import TinyJit
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
    _restore_custom_kernel_gradients(out)
    return out


def _restore_custom_kernel_gradients(u: UOp) -> None:
    """Custom kernels lose their grad_fxn in a pickle: their outputs differentiate to an error, not through."""
    for n in u.toposort():
        if n.op is Ops.AFTER and len(n.src) == 2 and isinstance(n.src[1].arg, CustomKernel):
            override_gradient(n, n.src[1].src, _gradient_rule(n.src[1], n.src[1].arg))


def reduce_tensor(t: Tensor) -> tuple[Any, ...]:
    """Tensor.__reduce__: graph (with buffer records), device, requires_grad, grad and is_param. A sharded tensor
    (device a tuple) pickles its values and sharding instead, and is sharded the same way again on load."""
    if isinstance(t.device, tuple):
        rest = (t.requires_grad, t.grad, t.is_param)

        u = t.uop
        if isinstance(u, MultiUOp) and u.op is Ops.NOOP and u.is_realized:
            # realized: its per-device buffers (through records, so a JIT in the same pickle replays into them)
            shards = tuple(_GraphRecord(s) for s in u.shards)
            return (_load_shards, (shards, u.axis, tuple(u.device), *rest))
        return (_load_sharded, (t.numpy(), t.dtype, tuple(t.device), getattr(t.uop, "axis", None), *rest))
    return (_load_tensor, (_GraphRecord(t.uop), t.device, t.requires_grad, t.grad, t.is_param))


def _load_sharded(data: np.ndarray, dtype: Any, devices: tuple[str, ...], axis: int | None,
                  requires_grad: bool | None, grad: Tensor | None, is_param: bool) -> Tensor:  # fmt: skip
    from speck.tensor.hook import Tensor

    t = Tensor(data, device=devices[0], dtype=dtype).shard(devices, axis)
    t.requires_grad, t.grad, t.is_param = requires_grad, grad, is_param
    return t


def _load_shards(shards: tuple[UOp | _GraphRecord, ...], axis: int | None, devices: tuple[str, ...],
                 requires_grad: bool | None, grad: Tensor | None, is_param: bool) -> Tensor:  # fmt: skip
    from speck.tensor.hook import Tensor

    plain = tuple(s.u if isinstance(s, _GraphRecord) else s for s in shards)
    t = Tensor(MultiUOp.leaf(plain, axis, devices), requires_grad=requires_grad)
    t.grad, t.is_param = grad, is_param
    return t


def _load_tensor(u: UOp | _GraphRecord, device: str | None, requires_grad: bool | None, grad: Tensor | None,
                 is_param: bool = True) -> Tensor:  # fmt: skip
    from speck.tensor.hook import Tensor

    if isinstance(u, _GraphRecord):  # copy.copy passes the record itself: a shallow copy shares the graph
        u = u.u
    t = Tensor(u, device=device, requires_grad=requires_grad)
    t.grad, t.is_param = grad, is_param
    if device is None:  # a device-less tensor (a constant's graph, on whatever device is the default now)
        t._device = None
    return t


# ---------------- TinyJit ----------------
def reduce_jit(jit: TinyJit[Any]) -> tuple[Any, ...]:
    """TinyJit.__reduce__: its CapturedJit with every BUFFER as a record (the replay plan is rebuilt on load; the
    function is not pickled, so the loaded JIT replays but can't capture again)."""
    fn = getattr(jit, "fxn", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "jit"
    cap = jit.captured
    if cap is None:
        calls = max(1, 2 - jit.cnt)
        raise JitNotCapturedError(f"can't pickle TinyJit {name}: it has not captured yet (call it {calls} more "
                                  "time(s) first; a JIT pickles its captured kernels, not code)")  # fmt: skip
    state = {f.name: _swap_buffers(getattr(cap, f.name)) for f in fields(cap) if f.init and not f.name.startswith("_")
             and f.name not in ("plan", "fast")}  # fmt: skip
    return (_load_jit, (type(jit), type(cap), state, jit.prune))


def _swap_buffers(x: Any) -> Any:
    """x with BUFFER UOps replaced by their records and graphs over buffers by graph records (through the
    containers a capture is made of)."""
    if isinstance(x, UOp):
        if x.op is Ops.BUFFER:
            return _record(x)
        return _GraphRecord(x) if any(n.op is Ops.BUFFER for n in x.toposort()) else x
    if isinstance(x, ScheduleItem):
        return replace(x, bufs=tuple(_swap_buffers(b) for b in x.bufs))
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a runner call (a named tuple)
        return type(x)(*(_swap_buffers(v) for v in x))
    if isinstance(x, (tuple, list, set, frozenset)):
        return type(x)(_swap_buffers(v) for v in x)
    if isinstance(x, dict):
        return {k: _swap_buffers(v) for k, v in x.items()}
    return x


def _load_jit(jit_cls: Any, cap_cls: Any, state: dict[str, Any], prune: bool) -> Any:
    return jit_cls(None, captured=cap_cls(**state), prune=prune)


__all__ = ["TensorPickleError", "reduce_jit", "reduce_tensor"]
