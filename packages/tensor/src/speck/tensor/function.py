"""`@function`: a function of tensors captured once per input signature as a subgraph, reused by every call.

    @function
    def gelu_mlp(x, w): return (x @ w).gelu()

The first call with inputs of given shapes, dtypes and devices (and equal non-tensor arguments) traces the body
once: every input tensor (found in the arguments, one list/tuple/dict/object attribute level after another,
`self` included) temporarily holds a placeholder buffer, the body runs with running kernels forbidden
(ALLOW_DEVICE_USAGE=0), and its result graph over the placeholders is kept. Every call then instantiates that
graph with its own inputs substituted for the placeholders (the call's subgraph), so the Python body runs once per
signature and the result fuses with its surroundings like any lazy graph: gradients flow through it by the
ordinary rules. Buffers the body creates without data (Tensor.empty) are made fresh for every call; buffers it
filled (Tensor([1, 2])) are constants of the capture. What the body reads besides its arguments is part of the
signature too: a closure variable or module global holding a Python constant that was rebound (`scale = 3.0`), or
naming another tensor, retraces (replacing that signature's capture) instead of replaying a stale value; objects the
body reads are keyed by identity, so their in-place changes are not seen (as for TinyJit).

A tensor the body reads that is not reachable from the arguments (a closure or global) is an implicit input:
an error naming it, unless `allow_implicit=True`, where it is captured as it is (a realized buffer is read at
each call, so in-place updates are seen; rebinding the Python name is not). `precompile=True` materialises the
outputs in buffers of their own (the body's kernels are not fused into what consumes them); `precompile_backward`
is accepted and changes nothing (the backward is the ordinary gradient graph of the instantiated body).
`grad_fxn(grad, call)` (`grad_fxn(*grads, call=call)` for several outputs, None for unused ones) replaces that
backward: `call.src` are the call's input nodes and it returns one gradient (UOp, Tensor or None) per input; a
pickled call drops it and differentiates through the body again."""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from speck.tensor import schedule, writes
from speck.tensor.autograd import CALL_INPUTS
from speck.tensor.base import TensorBase
from speck.tensor.bounds import is_record
from speck.tensor.dims import tensor_args
from speck.tensor.errors import FunctionError as FunctionError
from speck.tensor.errors import TensorAssertionError, TensorNotImplementedError
from speck.tensor.gradient import compute_gradient, override_gradient, user_gradients
from speck.tensor.multi import MultiUOp
from speck.tensor.realize import DeviceUsageError
from speck.tensor.schedule import base_buffer, buffer_device, buffer_map, host_arrays, max_dim, new_buffer_uop
from speck.uop import Context, Ops, UOp, dtypes
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


class _PlaceholderStorage:
    """What buffer_map holds for a placeholder while (and after) a body is traced: reading it is an error."""

    def __init__(self, fname: str, what: str, why: str = "") -> None:
        self.fname, self.what = fname, what
        self.why = why or (f"@function {fname}: the body read the data of {what}; a body is traced once on "
                           "placeholders and can't read values (.numpy(), .item())")  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        raise DeviceUsageError(self.why)


def function(fn: Callable[..., Any] | None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = False, grad_fxn: Callable[..., Any] | None = None) -> Any:  # fmt: skip
    """`@function` or `@function(allow_implicit=..., precompile=..., grad_fxn=...)`: see the module docstring."""

    def wrap(f: Callable[..., Any]) -> Function:
        return Function(f, allow_implicit=allow_implicit, precompile=precompile, grad_fxn=grad_fxn)

    return wrap(fn) if fn is not None else wrap


class Function:
    """A captured function (the result of `@function`); `captures` maps input signatures to their captures."""

    def __init__(self, fn: Callable[..., Any], allow_implicit: bool = False, precompile: bool = False,
                 grad_fxn: Callable[..., Any] | None = None) -> None:  # fmt: skip
        self.fn, self.allow_implicit, self.precompile, self.grad_fxn = fn, allow_implicit, precompile, grad_fxn
        self.captures: dict[Any, _Capture] = {}
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", repr(self.fn)))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)  # a method: self is an argument

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs: list[Tensor] = []
        key = _signature((args, kwargs), inputs, {})
        env = _environment(self.fn)
        cap = self.captures.get(key)
        if cap is None or cap.env != env:  # (a changed environment replaces the capture: one per signature)
            cap = _Capture(self, args, kwargs, inputs)
            cap.env = env
            self.captures[key] = cap
        return cap(inputs)


def _environment(fn: Callable[..., Any]) -> Any:
    """A key of what the body reads besides its arguments: its closure cells and the module globals its code names.
    Python constants (numbers, strings, None, tuples of them) by value - rebinding `scale = 3.0` is a new trace, not
    a stale capture; tensors (implicit inputs) and everything else by identity (a list the body appends to, a module,
    a config object: mutating them in place is not seen, as for a TinyJit)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    vals: list[tuple[str, Any]] = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            vals.append((name, _env_key(cell.cell_contents)))
        except ValueError:  # (a cell not assigned yet)
            continue
    glb = getattr(fn, "__globals__", None) or {}
    vals += [(n, _env_key(glb[n])) for n in code.co_names if n in glb]
    return tuple(vals)


def _env_key(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return (type(v).__qualname__, v)
    if isinstance(v, tuple) and len(v) <= 64:
        return ("tuple", tuple(_env_key(x) for x in v))
    if isinstance(v, TensorBase):
        t = cast("Tensor", v)
        return ("T", _Same(t), t.shape, t.dtype, t.device)
    return ("id", _Same(v))


class _Same:
    """An object in an environment key, compared by identity and held: while a capture keys on it, no other object
    can take its id (by a bare id(), `del cfg; cfg = Cfg(2)` could reuse the freed id and replay the old capture)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _signature(x: Any, inputs: list[Tensor], seen: dict[int, int]) -> Any:
    """A hashable key of the arguments' structure: tensors by (position, shape, dtype, device), collecting them
    into `inputs` in order (each once); other values by value when hashable, else by identity."""
    if isinstance(x, TensorBase):
        x = cast("Tensor", x)
        if id(x) not in seen:
            seen[id(x)] = len(inputs)
            inputs.append(x)
        return ("T", seen[id(x)], x.shape, x.dtype, x.device, getattr(x.uop, "axis", None))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_signature(v, inputs, seen) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _signature(v, inputs, seen)) for k, v in x.items()))
    if hasattr(x, "__dict__") and not isinstance(x, _OPAQUE):
        if id(x) in seen:  # an object met before (cycles): its identity is enough
            return ("obj", id(x))
        seen[id(x)] = -1
        return ("obj", type(x).__qualname__, tuple((k, _signature(v, inputs, seen)) for k, v in vars(x).items()))
    try:
        hash(x)
    except TypeError:
        return ("id", _Same(x))  # (held: a new array can't take a freed one's id and replay its capture)
    return (type(x).__qualname__, x)


# objects with a __dict__ whose attributes are not the function's data
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


class _Capture:
    """The body traced once for one input signature: its outputs over placeholder views of the inputs."""

    def __init__(self, f: Function, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[Tensor]) -> None:
        start = next(schedule._unique_counter)  # buffers made from here on are the body's own
        self.name, self.grad_fxn = f.name, f.grad_fxn
        self.env: Any = ()  # the _environment key it was traced in
        # per input: its placeholder BUFFERs (one per shard of a sharded input) and the view standing for it
        self.views: list[tuple[list[UOp], UOp]] = []
        for k, t in enumerate(inputs):
            m = t.uop if isinstance(t.uop, MultiUOp) else None
            shape = m.shards[0].shape if m is not None else t.shape
            size = int(prod(max_dim(s) for s in shape))
            bufs = [new_buffer_uop(d, size, t.dtype) for d in (m.device if m is not None else (t.device,))]
            for b in bufs:
                buffer_map[b] = _PlaceholderStorage(f.name, f"input {k} (shape {t.shape}, {t.dtype})")
            views = [b.reshape(shape) if shape != (size,) else b for b in bufs]
            self.views.append((bufs, MultiUOp.leaf(views, m.axis, m.device) if m is not None else views[0]))
        saved = [t.uop for t in inputs]
        epoch = writes.EPOCH[0]
        try:
            for t, (_, view) in zip(inputs, self.views):
                t.uop = view
            with Context(ALLOW_DEVICE_USAGE=0):
                ret = f.fn(*args, **kwargs)
            outs = (ret,) if isinstance(ret, TensorBase) else ret
            valid = isinstance(outs, (tuple, list)) and outs and all(isinstance(o, TensorBase) for o in outs)
            # the outputs' graphs while the inputs are still placeholders (an input may be returned as it is)
            out_uops = [cast("Tensor", o).uop for o in outs] if valid else []
        except DeviceUsageError as e:
            raise DeviceUsageError(f"@function {f.name}: {e}") from e
        finally:
            for t, u in zip(inputs, saved):
                t.uop = u
            body_writes = writes.take_since(epoch)
        self.single = isinstance(ret, TensorBase)
        if not valid:
            raise FunctionError(f"@function {f.name} must return a Tensor or a tuple of Tensors, got "
                                f"{_describe_value(ret)}")  # fmt: skip
        placeholders = {b for bufs, _ in self.views for b in bufs}
        out_uops, finals = _apply_writes(f.name, body_writes, out_uops, placeholders, start)
        outs = [o if o.uop is u else type(o)(u, device=o.device) for o, u in zip(outs, out_uops)]
        # an input the body wrote (assign, setitem, +=): its final value is an extra output the call assigns back
        self.write_back: list[tuple[int, UOp]] = []
        for k, (bufs, view) in enumerate(self.views):
            if any(b in finals for b in bufs):
                vals = [finals.get(b, b) for b in bufs]
                views = list(view.shards) if isinstance(view, MultiUOp) else [view]
                vals = [v.reshape(w.shape) if v.shape != w.shape else v for v, w in zip(vals, views)]
                back = MultiUOp.leaf(vals, view.axis, view.device) if isinstance(view, MultiUOp) else vals[0]
                self.write_back.append((k, back))
        if f.precompile:
            outs = [o.contiguous() for o in outs]
            self.write_back = [(k, u if isinstance(u, MultiUOp) else UOp(Ops.CONTIGUOUS, u.dtype, (u,)))
                               for k, u in self.write_back]  # fmt: skip
        self.devices = [o.device for o in outs]
        self.cls = type(outs[0])  # (the outputs' class: the tensors each call returns)
        self.body = [o.uop for o in outs] + [u for _, u in self.write_back]
        implicit: list[UOp] = []
        self.fresh: list[UOp] = []
        graphs = [g for u in self.body for g in (u.shards if isinstance(u, MultiUOp) else (u,))]
        for n in UOp.sink(*graphs).toposort():
            if n.op is not Ops.BUFFER or n in placeholders or is_record(n):  # (a device's bounds-check record:
                continue  # the process's own, whichever call made it first)
            if n.src[0].arg < start:
                implicit.append(n)
            elif n not in buffer_map and n not in host_arrays:  # made in the body without data (Tensor.empty): a
                # new one per call (a Tensor(ndarray)'s wraps its array: host_arrays)
                self.fresh.append(n)
        if implicit and not f.allow_implicit:
            names = "; ".join(_describe_buffer(b, f.fn) for b in implicit)
            raise FunctionError(f"@function {f.name} reads {len(implicit)} tensor(s) that are not among its "
                                f"arguments: {names}. Pass them as arguments, or use @function(allow_implicit=True) "
                                "to capture them as implicit inputs")  # fmt: skip

    def __call__(self, inputs: list[Tensor]) -> Any:
        mapping: dict[UOp, UOp] = {}
        for (bufs, view), t in zip(self.views, inputs):
            pairs = zip(view.shards, cast(MultiUOp, t.uop).shards) if isinstance(view, MultiUOp) else [(view, t.uop)]
            for buf, (v, u) in zip(bufs, pairs):
                mapping[v] = u
                if buf is not v:
                    mapping[buf] = u.reshape((int(buf.arg),))
        for b in self.fresh:
            mapping[b] = new_buffer_uop(buffer_device(b), b.arg, b.dtype)
        uops = [writes.substitute(u, mapping) for u in self.body]
        back = uops[len(self.devices) :]
        uops = uops[: len(self.devices)]
        if self.grad_fxn is not None:
            uops = _with_grad_fxn(self.name, self.grad_fxn, uops, tuple(t.uop for t in inputs), self.single)
        ins = tuple(t.uop for t in inputs)
        for j, u in enumerate(uops):
            CALL_INPUTS[u] = ins
            if isinstance(u, MultiUOp) and self.grad_fxn is None:
                # a sharded output's logical graph still names the placeholders: its gradient is the traced body's,
                # taken with respect to them and moved onto this call's inputs
                override_gradient(u, ins, self._sharded_gradient(j, mapping))
        outs = [self.cls(u, device=d) for u, d in zip(uops, self.devices)]
        for (k, _), u in zip(self.write_back, back):  # (after the outputs exist: they read the inputs as they were)
            inputs[k].assign(self.cls(u, device=inputs[k].device))
        return outs[0] if self.single else tuple(outs)

    def _sharded_gradient(self, j: int, mapping: dict[UOp, UOp]) -> Callable[[UOp], tuple[UOp | None, ...]]:
        def rule(grad: UOp) -> tuple[UOp | None, ...]:
            views = [view for _, view in self.views]
            got = compute_gradient(self.body[j], grad, views)
            return tuple(writes.substitute(got[v], mapping) if v in got else None for v in views)

        return rule


_call_counter = itertools.count()


def _apply_writes(name: str, ws: list[writes.Write], outs: list[UOp], placeholders: set[UOp],
                  start: int) -> tuple[list[UOp], dict[UOp, UOp]]:  # fmt: skip
    """A body's writes (to its inputs' placeholders or to buffers it made) as values of its graph, in program
    order: each write's buffer gets a new value (the old one with the written elements replaced) and each snapshot
    (what graphs built before a write read) the value before it. Returns the outputs over those values and each
    written buffer's final value. A write to a tensor the body did not get as an argument is refused."""
    if not ws:
        return outs, {}
    alien = [w for w in ws if w.buf not in placeholders and w.buf.src[0].arg < start]
    if alien:
        raise FunctionError(f"@function {name} writes (assign, setitem, +=) to {len(alien)} tensor(s) that are not "
                            "among its arguments; pass them as arguments (writes to arguments are applied to the "
                            "caller's tensors) or return the new value and assign it outside")  # fmt: skip
    cur: dict[UOp, UOp] = {}  # buffer -> its value after the writes so far
    snaps: dict[UOp, UOp] = {}  # a write's snapshot -> its buffer's value before the write
    for w in ws:
        b = w.buf
        before = cur.get(b, b)
        now = {**cur, **snaps}
        value = writes.substitute(w.value, now)
        snaps[w.snap] = before
        if w.pos is not None:
            new = UOp(Ops.ASSIGN, b.dtype, (before, writes.substitute(w.pos, now), value), w.reduce)
        elif w.target is not None:
            pos = writes.positions(w.target, b, buffer_device(b))
            new = UOp(Ops.ASSIGN, b.dtype, (before, pos, value), None)
        else:
            new = value.reshape(b.shape) if value.shape != b.shape else value
        cur[b] = new
    final = {**cur, **snaps}
    return [writes.substitute(o, final) for o in outs], cur


def _with_grad_fxn(name: str, grad_fxn: Callable[..., Any], outs: list[UOp], args: tuple[UOp, ...],
                   single: bool) -> list[UOp]:  # fmt: skip
    """The outputs of one call, each behind an identity node of its own whose gradient is the user's grad_fxn:
    `grad_fxn(grad, call)` for a single output, `grad_fxn(*grads, call=call)` (None for the other outputs) for
    several; `call.src` are the call's input nodes, and it returns one gradient (UOp, Tensor or None) per input."""
    if any(isinstance(u, MultiUOp) for u in (*outs, *args)):
        raise FunctionError(f"@function {name}: grad_fxn is not supported on sharded tensors; drop grad_fxn (the "
                            "body's own gradient is used) or call it per shard")  # fmt: skip
    call = UOp(Ops.SINK, dtypes.void, args, ("function call", name))
    marked: list[UOp] = []
    for k, u in enumerate(outs):
        # a tagged reshape to its own shape: unique, so the same expression computed outside keeps its own gradient
        node = UOp(Ops.RESHAPE, u.dtype, (u,), u.shape, ("grad_fxn", next(_call_counter)))

        def rule(grad: UOp, k: int = k) -> tuple[UOp | None, ...]:
            if single:
                got = grad_fxn(grad, call)
            else:
                got = grad_fxn(*[grad if i == k else None for i in range(len(outs))], call=call)
            return user_gradients(got, args, f"grad_fxn of @function {name}", FunctionError)

        override_gradient(node, args, rule)
        marked.append(node)
    return marked


# ---------------- callify, linear_with_vars, schedule_linear (TENSOR_API 13.3) ----------------
def callify(*tensors: Tensor) -> None:
    """Turn the pending computation of `tensors` into one self-contained call: a Function (precompiled: each output
    in a buffer of its own) over the buffers the graphs read, called once on them; the tensors are rewired to the
    call's outputs. Values and dtypes stay as they were; realized tensors are left alone."""
    tensor_args("callify", "argument", tensors)
    pending = [t for t in dict.fromkeys(tensors) if base_buffer(t.uop) is None]
    if any(isinstance(t.uop, MultiUOp) for t in pending):
        raise TensorNotImplementedError("callify of a sharded tensor: callify each shard's device group separately")
    if not pending:
        return
    graphs = [t.uop for t in pending]
    bufs = list(dict.fromkeys(n for g in graphs for n in g.toposort() if n.op is Ops.BUFFER))
    cls = type(pending[0])
    inputs = [cls(b, device=buffer_device(b)) for b in bufs]

    def body(*xs: Tensor) -> tuple[Tensor, ...]:
        mapping = {b: x.uop for b, x in zip(bufs, xs)}
        return tuple(cls(g.substitute(mapping), device=t.device) for g, t in zip(graphs, pending))

    body.__qualname__ = "callify"
    outs = Function(body, precompile=True)(*inputs)
    for t, o in zip(pending, outs):
        t.uop = o.uop


def linear_with_vars(*tensors: Tensor) -> tuple[list[schedule.ScheduleItem], dict[str, int]]:
    """The program realizing `tensors` would run, in order (kernels and copies as ScheduleItems), and the values of
    the bound Variables it reads; nothing runs and the tensors stay as they are."""
    tensor_args("linear_with_vars", "argument", tensors)
    if not tensors:
        return [], {}
    items, var_vals = tensors[0].schedule_with_vars(*tensors[1:])
    return items, var_vals


def schedule_linear(*tensors: Tensor) -> list[schedule.ScheduleItem]:
    """linear_with_vars for a program without Variables (TensorAssertionError when it reads bound Variables: use
    linear_with_vars and pass their values)."""
    tensor_args("schedule_linear", "argument", tensors)
    items, var_vals = linear_with_vars(*tensors)
    if var_vals:
        raise TensorAssertionError(f"schedule_linear: the program reads the Variables {sorted(var_vals)}; use "
                                   "linear_with_vars to get their values with it")  # fmt: skip
    return items


def _describe_value(x: Any) -> str:
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of ({', '.join(type(v).__name__ for v in x)})"
    return type(x).__name__


def _describe_buffer(buf: UOp, fn: Callable[..., Any]) -> str:
    """A buffer the body read, named after the closure variables and globals of fn whose tensors hold it."""
    names: list[str] = []
    code = getattr(fn, "__code__", None)
    candidates: list[tuple[str, Any]] = []
    if code is not None:
        cells = getattr(fn, "__closure__", None) or ()
        candidates += [(n, c.cell_contents) for n, c in zip(code.co_freevars, cells) if _has_contents(c)]
        glb = getattr(fn, "__globals__", {})
        candidates += [(n, glb[n]) for n in code.co_names if n in glb]
    for name, val in candidates:
        if isinstance(val, TensorBase) and buf in cast("Tensor", val).uop.toposort():
            names.append(repr(name))
    what = f"a {buf.dtype} buffer of {buf.arg} element(s) on {buffer_device(buf)}"
    return f"{' / '.join(names)} ({what})" if names else what


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


__all__ = ["Function", "FunctionError", "callify", "function", "linear_with_vars", "schedule_linear"]
