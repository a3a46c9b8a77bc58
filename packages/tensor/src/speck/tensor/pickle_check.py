"""Checks of the tensor graphs a pickle holds, made as they load.

Every unpickled graph is checked against what the Tensor API could have built: each node as the tensor spec has it
(dtypes, arguments), each movement op against its source's shape (a RESHAPE to more elements than its source, an
EXPAND of a dim that isn't 1, a SHRINK past the end made kernels read and write outside their buffers: SIGBUS),
elementwise sources of one shape. A graph that fails is a TensorPickleError naming the node; nothing runs.

`strict()` (what pickling.safe_loads turns on) also refuses what carries code or reaches outside the pickle: ops
other than data, movement, elementwise, reductions and copies (custom kernels, kernel-level INDEX/LOAD/STORE) and
DISK buffers (a path to any file on this machine)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from speck.tensor.device import file_backed
from speck.tensor.errors import TensorPickleError
from speck.uop import DType, Ops, UOp
from speck.uop.errors import SpecError
from speck.uop.ops import GroupOp
from speck.uop.spec import spec_tensor, type_verify

# what a data graph is made of (strict loads refuse any other op)
DATA_OPS = frozenset(
    {
        Ops.BUFFER,
        Ops.UNIQUE,
        Ops.DEVICE,
        Ops.CONST,
        Ops.DEFINE_VAR,
        Ops.BIND,
        Ops.CAST,
        Ops.BITCAST,
        Ops.REDUCE_AXIS,
        Ops.COPY,
        Ops.CONTIGUOUS,
        Ops.DETACH,
        Ops.ASSIGN,
        Ops.NOOP,
        Ops.CHECK,
    }
    | GroupOp.Movement
    | GroupOp.ALU
)
_state = threading.local()


def is_strict() -> bool:
    return bool(getattr(_state, "strict", False))


@contextlib.contextmanager
def strict() -> Iterator[None]:
    """Loads in this block refuse code-carrying ops and DISK buffers (see the module docstring)."""
    before = is_strict()
    _state.strict = True
    try:
        yield
    finally:
        _state.strict = before


def check_buffer(device: Any, size: Any, dtype: Any) -> None:
    """A pickled buffer record's fields are a device name, a size >= 0 and a DType."""
    if not isinstance(device, str) or type(size) is not int or size < 0 or not isinstance(dtype, DType):
        raise TensorPickleError(f"can't unpickle a buffer: expected a device name, a size >= 0 and a dtype, found "
                                f"{device!r:.40}, {size!r:.40}, {dtype!r:.40}; the pickle is damaged or was not made "
                                "by speck")  # fmt: skip
    if is_strict() and file_backed(device):
        raise TensorPickleError(f"safe_loads refuses a buffer on {device!r}: a DISK tensor pickles as a path to a "
                                "file of the loading machine; use pickle.loads if you trust the pickle")  # fmt: skip


def check_graph(u: UOp) -> None:
    """Raise TensorPickleError unless every node of u is one the Tensor API could have made (module docstring)."""
    try:
        type_verify(u, spec_tensor)
    except SpecError as e:
        raise TensorPickleError(f"can't unpickle a tensor: its graph is malformed ({e}); the pickle is damaged or "
                                "was not made by speck") from None  # fmt: skip
    strict_ = is_strict()
    for n in u.toposort():
        if strict_ and n.op not in DATA_OPS:
            raise TensorPickleError(f"safe_loads refuses a {n.op.name} node: it is not data (custom kernels and "
                                    "kernel-level ops carry code); use pickle.loads if you trust it")  # fmt: skip
        if (why := _shape_fault(n)) is not None:
            raise TensorPickleError(f"can't unpickle a tensor: a {n.op.name} node {why}; its kernels would reach "
                                    "outside their buffers (a damaged pickle, or not speck's)")  # fmt: skip


def _shape_fault(n: UOp) -> str | None:
    """Why n's shape doesn't follow from its sources' (None: it does, or a symbolic size leaves it to the bind)."""
    op, arg = n.op, n.arg
    if op is Ops.BUFFER:
        return None if type(arg) is int and arg >= 0 else f"has size {arg!r}"
    if op not in GroupOp.Movement and op is not Ops.REDUCE_AXIS and op not in GroupOp.ALU and op is not Ops.ASSIGN:
        return None
    srcs = [s for s in n.src if s.op not in (Ops.DEVICE, Ops.UNIQUE)]
    shapes = [s.shape if s.has_shape else None for s in srcs]
    if op in GroupOp.ALU or op is Ops.ASSIGN:
        shaped = {sh for sh in shapes if sh}
        return None if len(shaped) <= 1 else f"combines sources of shapes {sorted(shaped, key=str)}"
    src = shapes[0] if shapes else None
    if src is None:  # (nothing to check it against: the graph can't be lowered either)
        return None
    if not all(type(d) is int for d in src):
        return None
    if op is Ops.RESHAPE:
        if any(type(d) is int and d < 0 for d in arg) or not all(type(d) is int or isinstance(d, UOp) for d in arg):
            return f"has the shape {arg!r}"
        if not all(type(d) is int for d in arg):  # (a symbolic size: checked where it is bound)
            return None
        return None if _prod(arg) == _prod(src) else f"reshapes {src} ({_prod(src)} elements) to {arg} ({_prod(arg)})"
    if op is Ops.REDUCE_AXIS:
        return None if all(type(a) is int and 0 <= a < len(src) for a in arg[1]) else f"reduces axes {arg[1]} of {src}"
    if len(arg) != len(src):
        return f"has {len(arg)} dims in its argument for a source of shape {src}"
    if op is Ops.EXPAND:
        ok = all(not isinstance(a, int) or a == s or (s == 1 and a >= 0) for a, s in zip(arg, src))
        return None if ok else f"expands {src} to {arg}"
    if op is Ops.SHRINK:
        ok = all(not (type(b) is int and type(e) is int) or 0 <= b <= e <= s for (b, e), s in zip(arg, src))
        return None if ok else f"shrinks {src} to {arg}"
    if op is Ops.PAD:
        ok = all(not (type(b) is int and type(e) is int) or (b >= 0 and e >= 0) for b, e in arg)
        return None if ok else f"pads by {arg}"
    return None  # PERMUTE (the spec checks its order), FLIP


def _prod(xs: Any) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
