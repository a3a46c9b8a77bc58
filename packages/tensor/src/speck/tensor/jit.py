"""TinyJit: run a function eagerly twice, capture the kernels its second call runs, then replay them.

Replays skip Python tracing, scheduling and compilation: the captured calls run on the same intermediate buffers
with the new inputs' buffers swapped in. The returned tensors are the captured outputs, refilled by every replay
(copy them if you need to keep one). Inputs must keep the shapes, dtypes and devices of the capture.

Random numbers (Tensor.rand, dropout, ...) replay fresh: each draw reads the device's counter buffer as a kernel
input and advances it in place, so the captured kernels and copies keep advancing it, and N calls draw exactly
what N eager calls would from the same seed.

On CPU devices a replay runs each stretch of consecutive captured kernels and buffer copies as one speck.hcq
CPUGraph: one native call per worker thread instead of a Python launch per kernel (results are identical; the
graph calls the same kernels with the same slices). JIT_BATCH=0 (or `jit.BATCH = 0`) replays call by call, and so
do replays under DEBUG>=2 or PROFILE=1, which time every kernel."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from speck.tensor import profile, realize
from speck.tensor.counters import GlobalCounters
from speck.tensor.schedule import base_buffer, buffer_device, buffer_map
from speck.tensor.tensor import Tensor
from speck.uop import DEBUG, Ops, UOp, getenv
from speck.uop.helpers import prod

# 0: replay every captured call on its own (the per-kernel path), e.g. to compare; read at each replay
BATCH = getenv("JIT_BATCH", 1)

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
        self.plan: ReplayPlan | None = None  # the replay's batches, built at the first replay

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
        if self.plan is None:
            self.plan = ReplayPlan(self.calls, self.input_bufs)
        self.plan.run(mapping)
        return self.ret  # type: ignore[no-any-return]


def _buf(t: Tensor) -> UOp:
    b = base_buffer(t.uop)
    assert b is not None, "jit inputs are realized before capture and replay"
    return b


def _is_whole_buffer(t: Tensor) -> bool:
    # only reshapes over the buffer: the view starts at element 0 (view_offset, which builds index expressions,
    # is not needed; this runs for every input of every call)
    if not _row_major(t.uop):
        return False
    bb = base_buffer(t.uop)
    return bb is not None and int(bb.arg) == int(prod(t.shape))


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


# ---------------- batched replay ----------------
class _Batch:
    """Consecutive captured kernels and copies on one device, replayed as one graph of the device's graph class
    (`device.graph`; speck.hcq's CPUGraph on CPU devices: one native call per worker instead of a Python launch per
    kernel). The graph's argument table holds buffer addresses;
    each run looks the buffers up again (inputs are swapped, Tensor.assign outside the step may give a BUFFER
    other storage) and rewrites only the table entries whose address changed."""

    def __init__(self, device: Any, calls: list[tuple[str, Any]], input_bufs: list[UOp]) -> None:
        self.device, self.calls, self.input_bufs = device, calls, set(input_bufs)
        self.graph: Any = None
        self.failed = False  # building the graph raised: replay these calls one by one
        self.refs: list[weakref.ref[UOp]] = []
        self.inputs: list[tuple[int, UOp]] = []  # (position in uops, captured BUFFER) of the jit's inputs
        self.uops: list[UOp] = []  # every BUFFER the batch's commands read or write, once
        self.where: list[list[tuple[int, int]]] = []  # per uop: (argument table index, byte offset) it fills
        self.last: list[int] = []
        self.last_bufs: list[Any] = []  # the Buffers the table's addresses were taken from (a Buffer never moves)
        self.count, self.ops, self.mem = 0, 0, 0

    def build(self) -> None:
        """Make the graph from the captured calls and the buffers as they are now."""
        g = self.device.graph(self.device, name=f"jit[{len(self.calls)}]")
        index: dict[UOp, int] = {}
        fills: list[tuple[int, UOp, int]] = []  # (table index, uop, byte offset)
        for kind, item in self.calls:
            if kind == "kernel":
                prog, it = item
                bufs = [it.bufs[s] for s in prog.slots]
                hb = [realize.get_buffer(b) for b in bufs]
                gs, vals = _launch(prog, it)
                cmd = g.add_exec(prog.prog, hb, gs, vals)
                fills += [(g.arg_index(cmd, j), b, 0) for j, b in enumerate(bufs)]
                ops, mem = realize._cached_estimate(prog, it)
                self.count, self.ops, self.mem = self.count + 1, self.ops + ops, self.mem + mem
            else:
                dst, src, off, nbytes = _copy_args(kind, item)
                cmd = g.add_copy(realize.get_buffer(dst).ptr, realize.get_buffer(src).ptr + off, nbytes)
                fills += [(g.arg_index(cmd, 0), dst, 0), (g.arg_index(cmd, 1), src, off)]
        for k, u, off in fills:
            if u not in index:
                index[u] = len(self.uops)
                self.uops.append(u)
                self.where.append([])
            self.where[index[u]].append((k, off))
        self.last = [0] * len(self.uops)  # the first run writes every address
        self.graph = g

    def run(self, mapping: dict[UOp, UOp]) -> None:
        if self.graph is None:
            try:
                self.build()
            except Exception as e:  # e.g. no llvmlite for the interpreter: these calls replay one by one instead
                self.failed = True
                if DEBUG >= 1:
                    print(f"speck.tensor: TinyJit replays {len(self.calls)} calls one by one, batching failed: {e!r}")
                for kind, item in self.calls:
                    realize.replay(kind, item, mapping)  # raises again if a call itself is at fault
                return
            self.refs = [weakref.ref(u) for u in self.uops]
            self.inputs = [(i, u) for i, u in enumerate(self.uops) if u in self.input_bufs]
        data = getattr(buffer_map, "data", None)
        if isinstance(data, dict):  # the WeakKeyDictionary's own dict: one C lookup per buffer with refs made once
            bufs = [data.get(r) for r in self.refs]
        else:
            bufs = [buffer_map.get(u) for u in self.uops]
        for i, u in self.inputs:
            bufs[i] = buffer_map.get(mapping.get(u, u))
        if bufs == self.last_bufs:  # the same Buffer objects (compared by identity): their memory has not moved
            return self._launch()
        ptrs = []
        for i, b in enumerate(bufs):
            if b is None:  # not created yet: make it
                u = self.uops[i]
                b = bufs[i] = realize.get_buffer(mapping.get(u, u))
            ptrs.append(b.ptr)  # .ptr allocates a buffer that has no memory yet
        if ptrs != self.last:
            table = self.graph.args
            for p, q, where in zip(ptrs, self.last, self.where):
                if p != q:
                    for k, off in where:
                        table[k] = p + off
            self.last = ptrs
        self.last_bufs = bufs
        self._launch()

    def _launch(self) -> None:
        p0 = profile.now_ns() if profile.enabled() else 0
        t = self.graph.run()
        if p0:
            profile.record("graph", self.graph.name, self.device.name, p0, profile.now_ns(), self.ops, self.mem,
                           kernels=self.count)  # fmt: skip
        gc = GlobalCounters
        gc.kernel_count += self.count
        gc.global_ops += self.ops
        gc.global_mem += self.mem
        gc.time_sum_s += t


def _launch(prog: Any, it: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global size, variable values) of a captured kernel call (fixed for its captured var_vals)."""
    if prog.static_gs is not None:
        return prog.static_gs, ()
    from speck.uop.symbolic import sym_infer

    spec = prog.spec
    gs = tuple(int(sym_infer(g, it.var_vals)) if isinstance(g, UOp) else int(g) for g in spec.global_size)
    vals = tuple(it.var_vals[v.arg[0]] if isinstance(v, UOp) else it.var_vals[v[0]] for v in spec.vars)
    return gs, vals


def _copy_args(kind: str, item: Any) -> tuple[UOp, UOp, int, int]:
    """(dst, src, byte offset into src, bytes) of a captured assign or copy."""
    if kind == "assign":
        dst, src = item
        return dst, src, 0, int(dst.arg) * dst.dtype.itemsize
    dst, src = item.bufs
    return dst, src, item.copy_offset * src.dtype.itemsize, int(dst.arg) * dst.dtype.itemsize


def _batch_device(kind: str, item: Any) -> Any:
    """The device a captured call can join a graph on (one whose `graph` class takes it), or None when it must
    replay on its own."""
    from speck.hcq import Device

    if kind == "kernel":
        prog, it = item
        if not isinstance(prog, realize._CompiledProgram) or prog.device.graph is None:
            return None
        return prog.device if prog.device.graph.supports(prog.prog, len(prog.slots) + len(prog.spec.vars)) else None
    if kind not in ("assign", "copy"):
        return None
    dst, src, off, nbytes = _copy_args(kind, item)
    if dst.dtype.itemsize != src.dtype.itemsize or off < 0 or off + nbytes > int(src.arg) * src.dtype.itemsize:
        return None  # the per-call path raises the error this deserves
    if kind == "assign" and int(dst.arg) != int(src.arg):
        return None
    ddev, sdev = buffer_device(dst), buffer_device(src)
    if ddev != sdev:
        return None
    dev = Device[ddev]
    return dev if dev.graph is not None and dev.host_visible else None


class ReplayPlan:
    """A capture's calls grouped for replay: runs of consecutive calls on one device with a graph become _Batches (a run
    must hold a kernel to be worth a graph); everything else replays one call at a time through realize.replay.
    Under DEBUG>=2 or PROFILE=1 every call replays on its own, so per-kernel timing stays available."""

    def __init__(self, calls: list[tuple[str, Any]], input_bufs: list[UOp]) -> None:
        self.calls, self.input_bufs = calls, input_bufs
        self.steps: list[tuple[str, Any]] = []
        run: list[tuple[str, Any]] = []
        run_dev: Any = None
        for kind, item in calls:
            dev = _batch_device(kind, item)
            if run and dev is not run_dev:
                self._flush(run, run_dev)
                run = []
            if dev is None:
                self.steps.append((kind, item))
            else:
                run.append((kind, item))
                run_dev = dev
        if run:
            self._flush(run, run_dev)
        self.devices = {b.device for kind, b in self.steps if kind == "batch"}

    def _flush(self, run: list[tuple[str, Any]], dev: Any) -> None:
        if any(k == "kernel" for k, _ in run):
            self.steps.append(("batch", _Batch(dev, run, self.input_bufs)))
        else:
            self.steps.extend(run)

    @property
    def batches(self) -> list[_Batch]:
        return [b for kind, b in self.steps if kind == "batch"]

    def run(self, mapping: dict[UOp, UOp]) -> None:
        """Replay every captured call with the BUFFERs in `mapping` swapped in."""
        if not BATCH or DEBUG.value >= 2 or any(d.profile for d in self.devices):
            for kind, item in self.calls:
                realize.replay(kind, item, mapping)
            return
        for kind, item in self.steps:
            if kind != "batch":
                realize.replay(kind, item, mapping)
            elif item.failed:
                for k, it in item.calls:
                    realize.replay(k, it, mapping)
            else:
                item.run(mapping)
