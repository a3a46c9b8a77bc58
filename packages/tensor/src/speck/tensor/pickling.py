"""Pickling tensors and captured TinyJits.

Tensors pickle as speck.tensor.tensor_pickle describes: graph, one record per BUFFER (bytes, or a file path for a DISK
buffer), and the class to load them as. This module sits above the Tensor class: it keeps the loader names that
pickles written before the class was pickled with the tensor name (`_load_tensor`, `_load_shards`, `_load_sharded`,
`_load_buffer`, `_load_graph`), so those still load, as Tensors.

A captured TinyJit pickles its CapturedJit: the recorded calls (compiled programs included: ProgramSpec with its
object code), its input/intermediate/output buffers (through the same records) and its returned tensors; the
loaded JIT replays at once without tracing (its function is not pickled: reset() raises JitResetError).
UOps, DTypes and Variables pickle by themselves (hash-consed/interned again on load); PatternMatchers by their
module-level name.

What can't be pickled raises TensorPickleError naming the object and the reason.

Only `pickle.loads` what you or someone you trust pickled: these pickles carry code (a captured TinyJit's compiled
kernels run as they are, and pickle itself calls whatever the stream names), so loading a hostile one runs its
author's code. `safe_loads` / `safe_load` read tensors (and containers of them) from bytes you don't trust: the
stream may name only what a tensor pickle needs, and each graph may hold only data ops (pickle_check.strict); a
TinyJit, a custom kernel, a DISK tensor or any other name is a TensorPickleError before anything runs. Every load,
safe or not, checks each graph's shapes (pickle_check.check_graph). Exchange weights as safetensors
(nn.state.safe_save / safe_load), which hold only data."""

from __future__ import annotations

import builtins
import codecs
import collections
import importlib
import io
import pickle
from dataclasses import fields, replace
from typing import Any, Protocol

import numpy as np

from speck.tensor.bounds import record_buffer
from speck.tensor.errors import JitNotCapturedError
from speck.tensor.errors import TensorPickleError as TensorPickleError
from speck.tensor.pickle_check import strict
from speck.tensor.schedule import ScheduleItem
from speck.tensor.tensor import Tensor
from speck.tensor.tensor_pickle import _GraphRecord, _record, load_sharded, load_shards, load_tensor, reduce_tensor
from speck.tensor.tensor_pickle import _load_buffer as _load_buffer
from speck.tensor.tensor_pickle import _load_graph as _load_graph
from speck.uop import Ops, UOp, to_dtype
from speck.uop.uop import _uop_from_flat


# ---------------- the loaders older pickles name (they carry no class: they load as Tensor) ----------------
def _load_sharded(data: np.ndarray, dtype: Any, devices: tuple[str, ...], axis: int | None,
                  requires_grad: bool | None, grad: Tensor | None, is_param: bool) -> Tensor:  # fmt: skip
    return load_sharded(Tensor, data, dtype, devices, axis, requires_grad, grad, is_param)


def _load_shards(shards: tuple[UOp | _GraphRecord, ...], axis: int | None, devices: tuple[str, ...],
                 requires_grad: bool | None, grad: Tensor | None, is_param: bool) -> Tensor:  # fmt: skip
    return load_shards(Tensor, shards, axis, devices, requires_grad, grad, is_param)


def _load_tensor(u: UOp | _GraphRecord, device: str | None, requires_grad: bool | None, grad: Tensor | None,
                 is_param: bool = True) -> Tensor:  # fmt: skip
    return load_tensor(Tensor, u, device, requires_grad, grad, is_param)


# ---------------- TinyJit ----------------
class _Jit(Protocol):
    """What pickling reads of a TinyJit (a protocol, so this module need not import jit.py, which imports it)."""

    fxn: Any
    captured: Any
    cnt: int
    prune: bool


def reduce_jit(jit: _Jit) -> tuple[Any, ...]:
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


# ---------------- loading bytes nobody vouches for ----------------
def _numpy_name(module: str, name: str) -> Any:
    """numpy's array-pickle helper `name` (numpy 2 keeps it in numpy._core, numpy 1 in numpy.core)."""
    for m in (f"numpy._core.{module}", f"numpy.core.{module}"):
        try:
            return getattr(importlib.import_module(m), name)
        except (ImportError, AttributeError):
            continue
    return None


_SAFE_NAMES: dict[tuple[str, str], Any] = {
    ("speck.tensor.tensor", "Tensor"): Tensor,
    ("speck.tensor.tensor_pickle", "_load_buffer"): _load_buffer,
    ("speck.tensor.tensor_pickle", "_load_graph"): _load_graph,
    ("speck.tensor.tensor_pickle", "load_tensor"): load_tensor,
    ("speck.tensor.tensor_pickle", "load_shards"): load_shards,
    ("speck.tensor.tensor_pickle", "load_sharded"): load_sharded,
    ("speck.tensor.pickling", "_load_buffer"): _load_buffer,
    ("speck.tensor.pickling", "_load_graph"): _load_graph,
    ("speck.tensor.pickling", "_load_tensor"): _load_tensor,
    ("speck.tensor.pickling", "_load_shards"): _load_shards,
    ("speck.tensor.pickling", "_load_sharded"): _load_sharded,
    ("speck.tensor.bounds", "record_buffer"): record_buffer,  # (the loading process's own bounds-check record)
    ("speck.uop.dtype", "to_dtype"): to_dtype,
    ("speck.uop.ops", "Ops"): Ops,
    ("speck.uop.uop", "_uop_from_flat"): _uop_from_flat,
    ("_codecs", "encode"): codecs.encode,  # (protocol 2 writes bytes as a latin-1 str and this call)
    **{(f"numpy.{c}.multiarray", "_reconstruct"): _numpy_name("multiarray", "_reconstruct") for c in ("core", "_core")},
    **{(f"numpy.{c}.numeric", "_frombuffer"): _numpy_name("numeric", "_frombuffer") for c in ("core", "_core")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    **{("builtins", n): getattr(builtins, n) for n in ("set", "frozenset", "slice", "complex", "bytearray")},
    **{("collections", n): getattr(collections, n) for n in ("OrderedDict",)},
}


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only _SAFE_NAMES."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_NAMES:
            return _SAFE_NAMES[module, name]
        raise TensorPickleError(f"safe_loads: the pickle names {module}.{name}, which a pickle of tensors does not "
                                "need (a TinyJit carries compiled code; anything else may run code); nothing was run. "
                                "Use pickle.loads only if you trust who made it")  # fmt: skip

    def persistent_load(self, pid: Any) -> Any:
        raise TensorPickleError(f"safe_loads: the pickle refers to an outside object {pid!r:.40}; it is not a pickle "
                                "of tensors")  # fmt: skip


def safe_loads(data: bytes | bytearray | memoryview) -> Any:
    """pickle.loads for bytes you don't trust: Tensors (and lists, dicts, tuples, numbers and strings of them), as
    pickle.dumps of speck tensors writes them, and nothing else. A TinyJit, a custom kernel, a DISK tensor, any
    other name, or a graph whose shapes don't add up is a TensorPickleError, raised before anything runs."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TensorPickleError(f"safe_loads takes bytes, got {type(data).__name__}; for a file use safe_load")
    return safe_load(io.BytesIO(data))


def safe_load(file: Any) -> Any:
    """safe_loads from a binary file object."""
    with strict():
        try:
            return _SafeUnpickler(file).load()
        except (TensorPickleError, MemoryError):
            raise
        except Exception as e:  # (a truncated or garbled stream: pickle's and the loaders' own errors)
            raise TensorPickleError(f"safe_loads: the bytes are not a readable pickle of tensors ({type(e).__name__}: "
                                    f"{e})"[:400]) from e  # fmt: skip


def _load_jit(jit_cls: Any, cap_cls: Any, state: dict[str, Any], prune: bool) -> Any:
    return jit_cls(None, captured=cap_cls(**state), prune=prune)


__all__ = ["TensorPickleError", "reduce_jit", "reduce_tensor", "safe_load", "safe_loads"]
