"""TinyJit: run a function eagerly twice, capture the kernels its second call runs, then replay them.

Replays skip Python tracing, scheduling and compilation: the captured calls run on the same intermediate buffers
with the new inputs' buffers swapped in. The returned tensors are the captured outputs, refilled by every replay
(copy them if you need to keep one). Inputs must keep the shapes, dtypes and devices of the capture.

Random numbers (Tensor.rand, dropout, ...) replay fresh: each draw reads the device's counter buffer as a kernel
input and advances it in place, so the captured kernels and copies keep advancing it, and N calls draw exactly
what N eager calls would from the same seed."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from speck.tensor import realize
from speck.tensor.schedule import base_buffer, buffer_map, view_offset
from speck.tensor.tensor import Tensor
from speck.uop import Ops, UOp
from speck.uop.helpers import prod

R = TypeVar("R")


class JitError(RuntimeError):
    """A jitted function was called in a way its capture can't serve."""


@dataclass(frozen=True)
class _Sig:
    shape: tuple[Any, ...]
    dtype: Any
    device: str


def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Tensor]]:
    out = [(f"argument {i}", a) for i, a in enumerate(args) if isinstance(a, Tensor)]
    out += [(f"keyword {k!r}", v) for k, v in sorted(kwargs.items()) if isinstance(v, Tensor)]
    return out


class TinyJit(Generic[R]):
    """Decorator: `@TinyJit def step(x, y): ...`. The first call runs eagerly, the second is captured, later calls
    replay. `reset()` drops the capture."""

    def __init__(self, fn: Callable[..., R]) -> None:
        self.fn = fn
        self.reset()
        functools.update_wrapper(self, fn)

    def reset(self) -> None:
        self.cnt = 0
        self.calls: list[Any] = []
        self.input_bufs: list[UOp] = []
        self.sigs: list[_Sig] = []
        self.ret: Any = None

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return functools.partial(self.__call__, obj)  # methods: bind self

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        named = _inputs(args, kwargs)
        tensors = [t for _, t in named]
        if tensors:
            # every input must be a whole realized buffer: the capture swaps buffers, not views into them
            Tensor.realize_all(*tensors)
            for t in tensors:
                if not _is_whole_buffer(t):
                    # a copy of its own: contiguous() of a contiguous slice is free (a view into the same buffer),
                    # and replays would then read the slice the capture saw
                    t.uop = t.clone().realize().uop
        if self.cnt >= 2:
            return self._replay(named)
        if self.cnt == 0:
            self.cnt = 1
            ret = self.fn(*args, **kwargs)
            _realize_outputs(ret)
            return ret
        # second call: capture every kernel the call runs
        captured: list[tuple[str, Any]] = []
        realize.CAPTURE = captured
        try:
            ret = self.fn(*args, **kwargs)
            _realize_outputs(ret)
        finally:
            realize.CAPTURE = None
        # Tensor.assign made the target buffer share the new value's storage; replays must not write into the
        # target while kernels still read its old value, so the new value gets storage of its own again and the
        # replay copies it over at the point the assign happened
        for kind, item in captured:
            if kind == "assign" and item[0] is not item[1]:
                buffer_map.pop(item[1], None)
        self.calls = captured
        self.input_bufs = [_buf(t) for t in tensors]
        self.sigs = [_Sig(tuple(t.shape), t.dtype, t.device) for t in tensors]
        self.names = [n for n, _ in named]
        self.ret, self.cnt = ret, 2
        return ret

    def _replay(self, named: list[tuple[str, Tensor]]) -> R:
        if len(named) != len(self.sigs):
            raise JitError(f"jitted function was captured with {len(self.sigs)} tensor inputs, called with "
                           f"{len(named)}; call .reset() to capture again")  # fmt: skip
        mapping: dict[UOp, UOp] = {}
        for (name, t), sig, old in zip(named, self.sigs, self.input_bufs):
            now = _Sig(tuple(t.shape), t.dtype, t.device)
            if now != sig:
                raise JitError(
                    f"jitted function input {name} changed: captured shape {sig.shape} {sig.dtype} on {sig.device}, "
                    f"got shape {now.shape} {now.dtype} on {now.device}; the capture only serves the same shapes, "
                    "dtypes and devices (call .reset() to capture again)"
                )
            mapping[old] = _buf(t)
        for kind, item in self.calls:
            realize.replay(kind, item, mapping)
        return self.ret  # type: ignore[no-any-return]


def _buf(t: Tensor) -> UOp:
    b = base_buffer(t.uop)
    assert b is not None, "jit inputs are realized before capture and replay"
    return b


def _is_whole_buffer(t: Tensor) -> bool:
    bb = base_buffer(t.uop)
    return bb is not None and view_offset(t.uop) == 0 and int(bb.arg) == int(prod(t.shape)) and _row_major(t.uop)


def _row_major(u: UOp) -> bool:
    """Only reshapes between the buffer and the view (no permute/expand/shrink/flip/pad)."""
    while u.op is not Ops.BUFFER:
        if u.op not in (Ops.RESHAPE, Ops.DETACH):
            return False
        u = u.src[0]
    return True


def _realize_outputs(ret: Any) -> None:
    outs: list[Tensor] = []
    stack = [ret]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            outs.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    Tensor.realize_all(*outs)  # with none, still applies deferred state updates inside the capture
