"""Pickling tensors and captured TinyJits.

A tensor pickles as its UOp graph (a realized tensor's graph is a view of a BUFFER; an unrealized one is the lazy
graph) plus one `_BufferRecord` per BUFFER in it: the bytes of a buffer that holds data, nothing for one never
written, the file path for a DISK buffer (its file is mapped again on load, never copied). Unpickling allocates
each buffer on its original device at once and copies the bytes in (no kernel runs), rebuilds the graph on the new
buffers, and gives CONTIGUOUS clones fresh tags, so nothing aliases what already lives in the loading process.
Every tensor (and JIT) in one pickle that shares a buffer gets one record, so it still shares it after loading.

A captured TinyJit pickles its recorded calls (compiled programs included: ProgramSpec with its object code),
its input/intermediate/output buffers (through the same records) and its returned tensors; the loaded JIT
replays at once without tracing (its function is not pickled, so it can't capture again). UOps, DTypes and
Variables pickle by themselves (hash-consed/interned again on load); PatternMatchers by their module-level name.

What can't be pickled raises TensorPickleError naming the object and the reason."""

from __future__ import annotations

import copyreg
import os
import pickle
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import realize
from speck.tensor.schedule import ScheduleItem, buffer_device, buffer_map, new_buffer_uop
from speck.uop import Ops, UOp

if TYPE_CHECKING:
    from speck.tensor.jit import TinyJit
    from speck.tensor.tensor import Tensor


class TensorPickleError(pickle.PicklingError, RuntimeError):
    """A tensor, buffer or TinyJit that can't be pickled (or unpickled here), with the reason."""


# ---------------- buffers ----------------
class _BufferRecord:
    """The pickled form of one BUFFER: kept per BUFFER (weakly) so every reference to it in one pickle is the same
    object, which pickle stores once and unpickles to one new BUFFER."""

    def __init__(self, buf: UOp) -> None:
        self.ref = weakref.ref(buf)

    def __reduce__(self) -> tuple[Any, ...]:
        buf = self.ref()
        assert buf is not None, "a record outlived its BUFFER while being pickled"
        device = buffer_device(buf)
        if device.startswith("DISK"):
            return (_load_buffer, (device, buf.arg, buf.dtype, None))
        storage = buffer_map.get(buf)
        if storage is not None and not hasattr(type(storage), "copyout"):
            raise TensorPickleError(f"can't pickle a {buf.dtype} buffer of {buf.arg} element(s) on {device}: it is "
                                    f"{storage!r}, not device memory (an @function placeholder?)")  # fmt: skip
        data = None
        if storage is not None and storage.is_allocated:
            data = np.empty(storage.nbytes, dtype=np.uint8)
            storage.copyout(data)
        return (_load_buffer, (device, buf.arg, buf.dtype, data))


_records: weakref.WeakKeyDictionary[UOp, _BufferRecord] = weakref.WeakKeyDictionary()


def _record(buf: UOp) -> _BufferRecord:
    rec = _records.get(buf)
    if rec is None:
        rec = _records[buf] = _BufferRecord(buf)
    return rec


def _load_buffer(device: str, size: int, dtype: Any, data: np.ndarray | None) -> UOp:
    """A new BUFFER on `device` holding `data` (allocated and filled now: no kernel)."""
    try:
        from speck.hcq import Device

        Device[device]
    except Exception as e:
        raise TensorPickleError(f"can't unpickle a {dtype} buffer of {size} element(s): its device {device!r} can't "
                                f"be opened here ({type(e).__name__}: {e})") from e  # fmt: skip
    if device.startswith("DISK"):
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
    from speck.tensor import tensor

    new: dict[UOp, UOp] = dict(zip(bufs, loaded))
    for n in u.toposort(gate=lambda x: x.op is not Ops.BUFFER):
        if n in new:
            continue
        nsrc = tuple(new.get(s, s) for s in n.src)
        if n.op is Ops.CONTIGUOUS and n.arg == "clone":  # a clone's tag is its identity: take a fresh one
            new[n] = n.replace(src=nsrc, tag=next(tensor._clone_counter))
        else:
            new[n] = n if all(a is b for a, b in zip(nsrc, n.src)) else n.replace(src=nsrc)
    out = new[u]
    _restore_custom_kernel_gradients(out)
    return out


def _restore_custom_kernel_gradients(u: UOp) -> None:
    """Custom kernels lose their grad_fxn in a pickle: their outputs differentiate to an error, not through."""
    from speck.tensor.custom_kernel import CustomKernel, _gradient_rule
    from speck.tensor.gradient import override_gradient

    for n in u.toposort():
        if n.op is Ops.AFTER and len(n.src) == 2 and isinstance(n.src[1].arg, CustomKernel):
            override_gradient(n, n.src[1].src, _gradient_rule(n.src[1], n.src[1].arg))


def reduce_tensor(t: Tensor) -> tuple[Any, ...]:
    """Tensor.__reduce__: graph (with buffer records), device, requires_grad and grad."""
    return (_load_tensor, (_GraphRecord(t.uop), t.device, t.requires_grad, t.grad))


def _load_tensor(u: UOp | _GraphRecord, device: str, requires_grad: bool | None, grad: Tensor | None) -> Tensor:
    from speck.tensor.tensor import Tensor

    if isinstance(u, _GraphRecord):  # copy.copy passes the record itself: a shallow copy shares the graph
        u = u.u
    t = Tensor(u, device=device, requires_grad=requires_grad)
    t.grad = grad
    return t


# ---------------- TinyJit ----------------
class _NotPickled:
    """Stands in for a loaded TinyJit's function: it replays, it can't trace again."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TensorPickleError(f"TinyJit {self.name} was unpickled without its function: it can only replay its "
                                "capture (don't reset() it; build a new TinyJit to capture again)")  # fmt: skip


def reduce_jit(jit: TinyJit[Any]) -> tuple[Any, ...]:
    """TinyJit.__reduce__: the capture with every BUFFER as a record; the function and replay plan are dropped."""
    name = getattr(jit, "__qualname__", None) or getattr(jit.fn, "__name__", "jit")
    if jit.cnt < 2:
        raise TensorPickleError(f"can't pickle TinyJit {name}: it has not captured yet (call it {2 - jit.cnt} "
                                "more time(s) first; a JIT pickles its captured kernels, not code)")  # fmt: skip
    state = {k: _swap_buffers(v) for k, v in vars(jit).items() if k not in ("fn", "__wrapped__", "plan")}
    return (_load_jit, (type(jit), str(name), state))


def _swap_buffers(x: Any) -> Any:
    """x with BUFFER UOps replaced by their records and graphs over buffers by graph records (through the
    containers a capture is made of)."""
    if isinstance(x, UOp):
        if x.op is Ops.BUFFER:
            return _record(x)
        return _GraphRecord(x) if any(n.op is Ops.BUFFER for n in x.toposort()) else x
    if isinstance(x, ScheduleItem):
        return replace(x, ast=x.ast, bufs=tuple(_swap_buffers(b) for b in x.bufs))
    if isinstance(x, tuple):
        return tuple(_swap_buffers(v) for v in x)
    if isinstance(x, list):
        return [_swap_buffers(v) for v in x]
    if isinstance(x, dict):
        return {k: _swap_buffers(v) for k, v in x.items()}
    return x


def _load_jit(cls: Any, name: str, state: dict[str, Any]) -> Any:
    jit = cls.__new__(cls)
    jit.__dict__.update(state)
    jit.fn = _NotPickled(name)
    jit.plan = None
    return jit


# ---------------- compiled programs (inside a TinyJit's calls) ----------------
def _reduce_compiled(p: realize._CompiledProgram) -> tuple[Any, ...]:
    spec = p.spec
    if spec.lib is None:
        raise TensorPickleError(f"can't pickle program {p.name}: it has no compiled object")
    return (_load_compiled, (str(p.device.name), spec))


def _load_compiled(device: str, spec: Any) -> realize._CompiledProgram:
    from speck.hcq import Device

    try:
        dev = Device[device]
        prog = dev.load_program(spec)
    except Exception as e:
        raise TensorPickleError(f"can't unpickle program {spec.name}: device {device!r} can't load it here "
                                f"({type(e).__name__}: {e})") from e  # fmt: skip
    return realize._CompiledProgram(spec, prog, dev)


def _reduce_numpy_program(p: realize._NumpyProgram) -> tuple[Any, ...]:
    return (realize._NumpyProgram, (p.ast, p.reason))


copyreg.pickle(realize._CompiledProgram, _reduce_compiled)
copyreg.pickle(realize._NumpyProgram, _reduce_numpy_program)

__all__ = ["TensorPickleError", "reduce_jit", "reduce_tensor"]
