"""TinyJit: run a function eagerly once, capture the kernels its second call runs, then replay them.

Replays skip Python tracing, scheduling and compilation: the captured calls run on the same intermediate buffers
with the new inputs' buffers swapped in. The returned tensors are the captured outputs, refilled by every replay
(copy them if you need to keep one). Inputs are the tensor arguments, tensor keyword arguments and tensors one level
deep in list/tuple/dict arguments; they must keep the shapes, dtypes and devices of the capture, except that sizes
given by bound Variables (in input shapes, or Variables passed as arguments) may change: one capture serves every
value, the kernels get the new values at each replay. Non-tensor arguments are baked in (only their layout is
checked). Calls the capture can't serve raise JitError. `captured.free_intermediates()` gives back the memory
of the buffers every replay computes from scratch until the next replay.

Captures are per thread: a capture records the realizations of the thread running the jitted function only.

Random numbers (Tensor.rand, dropout, ...) replay fresh: each draw reads the device's counter buffer as a kernel
input and advances it in place, so the captured kernels and copies keep advancing it, and N calls draw exactly
what N eager calls would from the same seed.

Settings: JIT=0 makes TinyJit call the function every time; JIT=1 (default) replays each stretch of consecutive
captured kernels and copies on a device with a graph class (speck.hcq's CPUGraph on CPU) as one native call;
JIT=2 replays call by call (as do replays under DEBUG>=2 or PROFILE=1, which time every kernel, and JIT_BATCH=0).
Context(CAPTURING=0) inside a captured function runs its realizations immediately, unrecorded."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from weakref import ref as _ref

from speck.hcq import Buffer as _HcqBuffer
from speck.hcq import runner as _runner
from speck.hcq.runner import Copy, Plan, reads_writes
from speck.tensor import multi, realize
from speck.tensor.bounds import raise_recorded
from speck.tensor.engine.realize import exec_items
from speck.tensor.errors import JitError as JitError  # re-exported: tinygrad users import it from the jit module
from speck.tensor.errors import JitResetError, TensorTypeError
from speck.tensor.live import tensors
from speck.tensor.movement import capture_bounds as _capture_bounds
from speck.tensor.multi import MultiUOp
from speck.tensor.pickling import reduce_jit
from speck.tensor.realize import _capture_state  # (this thread's capture, read on the replay hot path)
from speck.tensor.schedule import base_buffer, buffer_device, buffer_map, buffer_map_data, max_dim, view_offset
from speck.tensor.settings import JIT, UNSAFE_ALLOW_JIT_BUFFER
from speck.tensor.tensor import Tensor
from speck.tensor.writes import _DEFERRED, DEFERRED_ANY, buffers_read, rebinding
from speck.tensor.writes import EPOCH as _EPOCH
from speck.tensor.writes import finish_capture as _finish_capture
from speck.tensor.writes import flush as _flush_writes
from speck.tensor.writes import pending as _pending_writes
from speck.tensor.writes import replay_written as _replay_written
from speck.uop import Ops, UOp
from speck.uop.helpers import prod
from speck.uop.symbolic import sym_infer

# 1: reading data (numpy/item/...) inside a capture is allowed (the value read is the capture call's)

R = TypeVar("R")


def check_read_allowed(what: str) -> None:
    """Data reads (numpy/tolist/item/data) can't be part of a capture: a replay would not redo them. Called by
    Tensor reads; raises JitError while a TinyJit captures (unless CAPTURING=0 or UNSAFE_ALLOW_JIT_BUFFER=1)."""
    if realize.recording() is not None and not UNSAFE_ALLOW_JIT_BUFFER.value:
        raise JitError(
            f"{what} during TinyJit capture: a replay would not read the data again (the function is not called on "
            "replays). Return the tensor from the jitted function and read it outside, or run the read under "
            "Context(CAPTURING=0)"
        )


realize.register_read_check(check_read_allowed)  # Tensor reads call it (tensor.py does not import this module)


# ---------------- inputs ----------------
@dataclass(frozen=True)
class InputSig:
    """What a replay needs unchanged of one tensor input: its shape (symbolic dims with their Variables unbound,
    so bound values may change), dtype and device, and its view structure: None for a whole buffer, else the view
    chain down to the buffer (ops and arguments, Variables unbound)."""

    shape: tuple[Any, ...]
    dtype: Any
    device: str
    view: tuple[Any, ...] | None = None

    def describe(self) -> str:
        return f"shape {tuple(_show_dim(s) for s in self.shape)} {self.dtype} on {self.device}{_show_view(self.view)}"


def _show_dim(s: Any) -> Any:
    if isinstance(s, int):
        return s
    if isinstance(s, UOp) and s.op is Ops.DEFINE_VAR:
        name, lo, hi = s.arg
        return f"{name}[{lo}..{hi}]"
    return s.render()


def _show_view(view: tuple[Any, ...] | None) -> str:
    if view is None:
        return " (a whole buffer)"
    ops = ", ".join(f"{op.name.lower()} {tuple(_show_dim(d) if isinstance(d, UOp) else d for d in arg)}"
                    if isinstance(arg, tuple) else op.name.lower() for op, arg in reversed(view))  # fmt: skip
    return f" (a view of a buffer: {ops})"


def _unbound(x: Any) -> Any:
    """x (a movement op's argument) with every bound Variable replaced by the Variable."""
    if isinstance(x, UOp):
        binds = [u for u in x.toposort() if u.op is Ops.BIND]
        return x.substitute({b: b.src[0] for b in binds}) if binds else x
    return tuple(_unbound(y) for y in x) if isinstance(x, tuple) else x


def _is_view(t: Tensor) -> bool:
    """t is a chain of views (movement ops, detach) over a BUFFER."""
    u = t.uop
    if type(u) is not UOp:
        return False
    while u.op is not Ops.BUFFER:
        if u.op not in _VIEW_CHAIN or not u.src:
            return False
        u = u.src[0]
    return True


_VIEW_CHAIN = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.DETACH})


def _view_structure(t: Tensor) -> tuple[Any, ...]:
    """The chain of views from t down to its BUFFER (op, argument; Variables unbound). The buffer's size is not part
    of it (a view of a buffer whose size is a bound Variable's multiple has one structure for every value)."""
    out: list[Any] = []
    u = t.uop
    while u.op is not Ops.BUFFER:
        # (detach is no view; of consecutive reshapes only the outermost one counts: they compose into it)
        if u.op is not Ops.DETACH and not (u.op is Ops.RESHAPE and out and out[-1][0] is Ops.RESHAPE):
            out.append((u.op, _unbound(u.arg)))
        u = u.src[0]
    return tuple(out)


@dataclass
class _Inputs:
    """The tensors and bound Variables of one call, and the argument layout they came in."""

    named: list[tuple[str, Tensor]]
    var_vals: dict[str, int]
    layout: tuple[Any, ...]
    # inputs given a copy of their own for the call (views of a realized buffer), with the view they were: they are
    # views again after the call (so they keep seeing writes to their buffer)
    views: list[tuple[Tensor, UOp]] = field(default_factory=list)

    def restore(self) -> None:
        for t, u in self.views:
            t.uop = u
        self.views.clear()


def _kind(x: Any) -> Any:
    if isinstance(x, Tensor):
        u = x.uop
        # a sharded tensor is one input per shard: its axis tells (4, 4) on axis 0 from (2, 8) on axis 1, whose
        # shards look alike
        return ("sharded tensor", u.axis) if isinstance(u, MultiUOp) else "tensor"
    if isinstance(x, UOp) and x.op is Ops.BIND:
        return ("variable", x.src[0].arg[0])
    return "value"


def _gather(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Inputs:
    """Tensors and bound Variables among the arguments (one level into lists, tuples and dicts), in a fixed order:
    positional arguments, then keyword arguments sorted by name."""
    named: list[tuple[str, Tensor]] = []
    var_vals: dict[str, int] = {}
    layout: list[Any] = []

    def visit(name: str, x: Any) -> Any:
        if isinstance(x, Tensor):
            named.append((name, x))
        elif isinstance(x, UOp) and x.op is Ops.BIND:
            var, val = x.unbind()
            var_vals[var.arg[0]] = val
        return _kind(x)

    items = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"keyword {k!r}", kwargs[k]) for k in sorted(kwargs)]
    for name, a in items:
        if isinstance(a, (list, tuple)):
            layout.append((type(a).__name__, tuple(visit(f"{name}[{j}]", x) for j, x in enumerate(a))))
        elif isinstance(a, dict):
            layout.append(("dict", tuple((str(k), visit(f"{name}[{k!r}]", v)) for k, v in a.items())))
        else:
            layout.append(visit(name, a))
    return _Inputs(named, var_vals, (len(args), tuple(sorted(kwargs)), tuple(layout)))


def _signature(t: Tensor, var_vals: dict[str, int], view: tuple[Any, ...] | None = None) -> InputSig:
    """t's signature; the values of Variables bound in its shape go into var_vals."""
    shape: list[Any] = []
    for s in t.shape:
        if isinstance(s, int):
            shape.append(s)
            continue
        binds = [u for u in s.toposort() if u.op is Ops.BIND]
        for b in binds:
            var, val = b.unbind()
            if var_vals.get(var.arg[0], val) != val:
                raise JitError(
                    f"Variable {var.arg[0]!r} is bound to {var_vals[var.arg[0]]} and to {val} in the "
                    "inputs of one call; bind it to one value"
                )
            var_vals[var.arg[0]] = val
        shape.append(s.substitute({b: b.src[0] for b in binds}) if binds else s)
    return InputSig(tuple(shape), t.dtype, t.device, view)


def _prepare(inputs: _Inputs) -> list[InputSig]:
    """Make every input a whole realized buffer of its own (realizing lazy ones, copying views) and check it can be
    one: virtual (constant-only or weak) inputs and one buffer passed twice raise JitError. Returns the signatures."""
    tensors = [t for _, t in inputs.named]
    # passed as a strided view of a realized buffer: the view structure is part of the signature. A lazy graph and
    # a contiguous range of a buffer count as buffers of their own (contiguous() of a contiguous slice is that
    # range, realized or not)
    views = [_view_structure(t) if _is_view(t) and not _is_whole_buffer(t) and view_offset(t.uop) is None else None
             for t in tensors]  # fmt: skip
    for name, t in inputs.named:
        if t.device is None or t.dtype.is_weak:
            raise JitError(
                f"JIT inputs must be real buffers: {name} is a {'weak' if t.dtype.is_weak else 'device-less'}"
                " tensor; give it storage with .clone(device) (contiguous() and to() leave a device-less tensor "
                "as it is: Tensor.arange(5).contiguous() has no device), make it with device=..., or pass it as a "
                "Python value"
            )
        if type(t.uop) is UOp and t.uop.op is Ops.CONST:  # Tensor(3.0): a Python scalar, no buffer to swap
            raise JitError(
                f"JIT inputs must be real buffers: {name} is a Python scalar constant; make it one with "
                "Tensor([x]) or .contiguous().realize() (or pass it as a Python value)"
            )
    # (inputs that all are buffers or views of one already leave realize_all nothing to do but build an empty
    # schedule)
    if tensors and (_DEFERRED or _pending_writes() or any(type(t.uop) is not UOp or base_buffer(t.uop) is None
                                                          for t in tensors)):  # fmt: skip
        Tensor.realize_all(*tensors)
    seen: dict[UOp, str] = {}
    for name, t in inputs.named:
        bb = base_buffer(t.uop)
        if bb is None:
            raise JitError(
                f"JIT inputs must be real buffers: {name} is computed from constants only (no buffer); "
                "make it one with .contiguous().realize() or pass it as a Python value"
            )
        if bb in seen:
            raise JitError(
                f"duplicate inputs to JIT: {seen[bb]} and {name} are the same buffer (or two views of "
                "it); a capture needs distinct input buffers, pass one of them as .clone()"
            )
        seen[bb] = name
    for _, t in inputs.named:
        if not _is_whole_buffer(t):
            # a copy of its own: contiguous() of a contiguous slice is free (a view into the same buffer), and
            # replays would then read the slice the capture saw
            inputs.views.append((t, t.uop))
            t.uop = t.clone().realize().uop
    return [_signature(t, inputs.var_vals, v) for (_, t), v in zip(inputs.named, views)]


def _buf(t: Tensor) -> UOp:
    b = base_buffer(t.uop)
    assert b is not None, "jit inputs are realized before capture and replay"
    return b


def _is_whole_buffer(t: Tensor) -> bool:
    """Only reshapes between t and its BUFFER (no permute/expand/shrink/flip/pad: the view starts at element 0, so
    view_offset, which builds index expressions, is not needed) and as many elements. Runs for every input of every
    checked call."""
    u = t.uop
    while u.op is not Ops.BUFFER:
        if u.op is not Ops.RESHAPE and u.op is not Ops.DETACH:
            return False
        u = u.src[0]
    shape = t.shape
    for s in shape:
        if type(s) is not int:
            return int(u.arg) == int(prod(max_dim(s) for s in shape))  # symbolic: the buffer holds the largest size
    return bool(int(u.arg) == prod(shape))


def _returned_tensors(ret: Any, strict: bool = True) -> list[Tensor]:
    """The tensors in a return value (any nesting of tuples, lists and dicts; None allowed). Anything else can't be
    replayed: JitError (when strict; the warm-up call just skips them)."""
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
        elif x is not None and strict:
            raise JitError(
                f"a jitted function returned a {type(x).__name__} ({x!r:.60}); replays return the captured tensors "
                "and can't recompute other values. Return tensors only (e.g. Tensor(value)) or compute it outside"
            )
    return outs


def _copy_passed_inputs(ret: Any, input_bufs: set[UOp]) -> Any:
    """ret with every returned tensor that is an input (or a view of one) passed through replaced by a realized copy.
    Replays refill the captured outputs and return them: an input passed through would go on showing the capture's
    input instead of the new call's, so it becomes an output the capture computes (a copy kernel)."""
    if isinstance(ret, Tensor):
        if type(ret.uop) is UOp and base_buffer(ret.uop) in input_bufs:
            return ret.clone().realize()
        return ret
    if isinstance(ret, (list, tuple)):
        items = [_copy_passed_inputs(x, input_bufs) for x in ret]
        if all(a is b for a, b in zip(items, ret)):
            return ret
        return type(ret)(*items) if hasattr(ret, "_fields") else type(ret)(items)  # (namedtuples take fields)
    if isinstance(ret, dict):
        new = {k: _copy_passed_inputs(v, input_bufs) for k, v in ret.items()}
        return ret if all(new[k] is v for k, v in ret.items()) else type(ret)(new)
    return ret


# ---------------- the capture ----------------
Entry = tuple[Any, tuple[UOp, ...]]  # a runner call over the BUFFERs beside it (speck.tensor.realize.Entry)


def _reads_writes(entry: Entry) -> tuple[set[UOp], set[UOp]]:
    """The BUFFERs a captured call reads and the ones it writes."""
    call, bufs = entry
    r, w = reads_writes(call)
    return {bufs[i] for i in r}, {bufs[i] for i in w}


def prune_calls(calls: list[Entry], input_bufs: list[UOp]) -> list[Entry]:
    """The calls a replay must run: those whose results can differ between replays. A buffer's contents vary when
    it is an input, is written by a varying call, or carries state (a call writes it after it was read: an update
    of a parameter or counter); a call varies when it reads a varying buffer or writes a buffer a varying call
    writes. The others computed the same values at the capture, and their buffers keep them."""
    rw = [_reads_writes(e) for e in calls]
    first_read: dict[UOp, int] = {}
    for i, (r, _) in enumerate(rw):
        for b in r:
            first_read.setdefault(b, i)
    varies = [any(first_read.get(b, len(calls)) <= i for b in w) for i, (_, w) in enumerate(rw)]
    vbufs: set[UOp] = set(input_bufs)
    vwrites: set[UOp] = set()
    changed = True
    while changed:
        changed = False
        for i, (r, w) in enumerate(rw):
            if not varies[i] and (r & vbufs or w & vwrites):
                varies[i] = True
            if varies[i] and not w <= vwrites:
                vbufs |= w
                vwrites |= w
                changed = True
    return [c for c, v in zip(calls, varies) if v]


@dataclass
class CapturedJit:
    """A capture: the recorded calls and what replays need to check and rebind. Plain data (no functions), so it
    can be serialized; `plan` (the runner Plan of the calls, whose batches are the device graphs) is derived and
    rebuilt on the first replay."""

    ret: Any  # the capture call's return value; every replay returns these same objects, refilled
    entries: list[Entry]  # the calls a replay runs, in order: runner calls (kernels, copies - Tensor.assign's
    # buffer swaps among them - and host work) over the BUFFERs beside them
    input_bufs: list[UOp]  # the capture's input BUFFERs, in input order
    expected_names: list[str]
    expected_sigs: list[InputSig]
    expected_layout: tuple[Any, ...]
    var_vals: dict[str, int]  # the Variables' values the capture ran with (the recorded calls hold them)
    written: frozenset[UOp]  # BUFFERs the calls write: an input that is one of them is copied before a replay
    ret_var_vals: dict[str, int] = field(default_factory=dict)  # the values the returned tensors' shapes show
    # BUFFERs every replay computes from scratch: memory the capture made (none when a recorded call first wrote
    # them), first touched by a call writing them; never inputs. free_intermediates gives their memory back
    intermediates: frozenset[UOp] = frozenset()
    plan: Plan | None = field(default=None, repr=False, compare=False)
    # the last checked replay's positional tensor arguments (their nodes), buffer mapping and Variable values: a call
    # with the very same nodes would pass every check again, so it replays with them unchecked (TinyJit.__call__);
    # last whether those values are the capture's and the returned shapes show them (replay's work is then
    # run(mapping) alone)
    fast: tuple[tuple[UOp, ...], dict[UOp, UOp], dict[str, int], bool] | None = field(
        default=None, repr=False, compare=False
    )
    # the plan's BUFFERs by slot, the slots of the inputs (with their captured BUFFER), and per slot the key
    # buffer_map's dict holds it under (see _stored_key; the plain weak reference until every entry exists)
    _uops: list[UOp] = field(default_factory=list, repr=False, compare=False)
    _inputs: list[tuple[int, UOp]] = field(default_factory=list, repr=False, compare=False)
    _keys: list[Any] = field(default_factory=list, repr=False, compare=False)
    _keyed: bool = field(default=False, repr=False, compare=False)
    # the last mapping a replay ran with and every slot's key under it (the inputs' mapped BUFFERs' included)
    _mapped: dict[UOp, UOp] | None = field(default=None, repr=False, compare=False)
    _mapped_keys: list[Any] = field(default_factory=list, repr=False, compare=False)
    # returned tensors' storage while free_intermediates has their memory (buffer_map holds _FreedOutput meanwhile)
    _freed: dict[UOp, Any] = field(default_factory=dict, repr=False, compare=False)
    # symbolic shrink bounds the function built (begin, end, dim, what; Variables free): a replay checks them at its
    # Variables' values, as building the graph would have (a value past a dim read past its buffer)
    bounds: list[tuple[Any, ...]] = field(default_factory=list, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, **self._derived()}

    def _derived(self) -> dict[str, Any]:
        """The derived state (what replays rebuild) at its initial values."""
        return {"plan": None, "fast": None, "_uops": [], "_inputs": [], "_keys": [], "_keyed": False, "_mapped": None,
                "_mapped_keys": []}  # fmt: skip

    @property
    def jit_cache(self) -> list[Any]:
        """The recorded calls as ExecItems (tinygrad's `captured.jit_cache`: `.prg`, `.bufs`; the capture keeps them
        as data in `entries`)."""
        return exec_items(self.entries)

    def free_intermediates(self) -> None:
        """Give back the memory of the buffers every replay computes from scratch (intermediates and returned
        tensors; not inputs, not state that carries over between replays - assign targets and the values assigned
        to them -, not what
        prune=True computed once). The next replay allocates them again. Until then the returned tensors can't be
        read (JitError); the capture itself is kept (no tracing or compiling again)."""
        data = buffer_map_data
        outs = {b for t in _returned_tensors(self.ret) for b in _tensor_buffers(t)}
        for u in self.intermediates:
            hb = data.get(_ref(u))
            if type(hb) is not _HcqBuffer:  # never made (or already freed)
                continue
            hb.deallocate()
            if u in outs:
                self._freed[u] = hb
                buffer_map[u] = _FreedOutput()
        # intermediates placed in a shared arena (speck.tensor.engine.memory) are views: the arena goes back when
        # no other buffer of the calls lives in it
        arenas = {id(hb.base): hb.base for u in self.intermediates
                  if type(hb := data.get(_ref(u))) is _HcqBuffer and hb.base is not hb}  # fmt: skip
        for _, bufs in self.entries:
            for u in bufs:
                if u not in self.intermediates and type(hb := data.get(_ref(u))) is _HcqBuffer:
                    arenas.pop(id(hb.base), None)
        for base in arenas.values():
            base.deallocate()
        # the plan is rebuilt (and the memory allocated) at the next replay; the unchecked replay's inputs stay
        self.__dict__.update({**self._derived(), "fast": self.fast})

    def replay(self, mapping: dict[UOp, UOp], var_vals: dict[str, int]) -> None:
        """Run the calls with the BUFFERs in `mapping` swapped in and the Variables at `var_vals`."""
        vv = var_vals if var_vals != self.var_vals else {}
        if realize.recording() is not None:  # inside another TinyJit's capture
            realize.run_entries([(c, tuple(mapping.get(b, b) for b in bufs)) for c, bufs in self.entries], vv)
        else:
            self.run(mapping, vv)
        if var_vals != (self.ret_var_vals or self.var_vals):
            _rebind_outputs(_returned_tensors(self.ret), var_vals)
            self.ret_var_vals = dict(var_vals)
        raise_recorded(host_only=True)  # an out-of-range index the replay met (speck.tensor.bounds)

    def run(self, mapping: dict[UOp, UOp], var_vals: dict[str, int] | None = None) -> None:
        """The plan on the capture's buffers with the inputs in `mapping` swapped in: the warm path's run, with the
        buffers of the capture instead of new ones."""
        plan = self.plan
        if plan is None:
            plan = self._build()
        plan.batch_from = 0 if JIT.value < 2 else 1 << 62  # (read at each replay: JIT=2 replays call by call)
        data = buffer_map_data  # the WeakKeyDictionary's own dict: one C lookup per buffer with keys made once
        if mapping is self._mapped:  # the same mapping again (TinyJit's unchecked replays): the keys are ready
            bufs: list[Any] = list(map(data.get, self._mapped_keys))
            if None not in bufs:
                _runner.run(plan, bufs, var_vals)
                return
        bufs = list(map(data.get, self._keys))
        for i, u in self._inputs:
            bufs[i] = data.get(_ref(mapping.get(u, u)))
        if None in bufs:  # not created yet (the first replay): make them
            for i, b in enumerate(bufs):
                if b is None:
                    u = self._uops[i]
                    bufs[i] = realize.get_buffer(mapping.get(u, u))
        if not self._keyed:  # every BUFFER has its entry now: look them up by the keys stored there
            self._keys = [k if (k := _stored_key(u)) is not None else _ref(u) for u in self._uops]
            self._keyed = True
        keys = list(self._keys)
        for i, u in self._inputs:
            keys[i] = _stored_key(mapping.get(u, u))
        self._mapped, self._mapped_keys = (mapping, keys) if None not in keys else (None, [])
        _runner.run(plan, bufs, var_vals)

    def _build(self) -> Plan:
        if self._freed:  # after free_intermediates: the returned tensors get their storage back (memory on use)
            for u, hb in self._freed.items():
                buffer_map[u] = hb
            self._freed.clear()
        _replay_written.update(dict.fromkeys(self.written))  # (a capture unpickled: its replays write these too)
        calls, uops = realize.link(self.entries)
        self.plan = Plan(calls, len(uops), name=f"jit[{len(calls)}]", replayed=True)
        self._uops = uops
        slot = {u: i for i, u in enumerate(uops)}
        self._inputs = [(slot[u], u) for u in self.input_bufs if u in slot]
        self._keys = [_ref(u) for u in uops]
        return self.plan


class _FreedOutput:
    """What buffer_map holds for a returned tensor's buffer after free_intermediates, until the next replay: any use
    of it is an error (its memory is gone; reading it would show whatever reuses that memory). A pickle of the
    capture stores no data for it (like any buffer without memory)."""

    is_allocated = False

    def copyout(self, dest: Any) -> Any:
        return self.__getattr__("copyout")

    def __getattr__(self, name: str) -> Any:
        raise JitError(
            "this tensor was returned by a TinyJit whose captured.free_intermediates() gave its memory back; call "
            "the jitted function again (the replay computes it anew) before reading it, or keep a copy "
            "(.clone().realize()) made before freeing"
        )


def _tensor_buffers(t: Tensor) -> list[UOp]:
    """The BUFFERs holding a (realized) tensor: one, or one per shard."""
    u = t.uop
    got = [base_buffer(s) for s in (u.shards if isinstance(u, MultiUOp) else (u,))]
    return [b for b in got if b is not None]


def _observed_buffers() -> set[UOp]:
    """The BUFFERs a live tensor holds or its (lazy) graph reads: their contents are seen after a replay."""
    out: set[UOp] = set()
    for t in tensors():
        # the graph as built and the swaps Tensor.uop would make in it (rebuilding every stale live graph just to
        # list its buffers was most of a capture's time after an optimizer step)
        u, swap = t._uop, rebinding(t)
        for s in u.shards if isinstance(u, MultiUOp) else (u,):
            if (b := base_buffer(s)) is not None:
                out.add(swap.get(b, b))
            else:
                out.update(swap.get(x, x) for x in buffers_read(s))
    return out


def _fold_copies(calls: list[Entry], keep: set[UOp]) -> list[Entry]:
    """The captured calls with Tensor.assign's copies of whole new values (an optimizer's updates) folded into the
    kernels that compute them, which then store into the targets directly (speck.hcq.runner.fold_copies); BUFFERs
    in `keep` are never folded away."""
    if not any(type(c) is Copy for c, _ in calls):
        return calls
    linked, uops = realize.link(calls)
    nbytes = [int(u.arg) * u.dtype.itemsize for u in uops]
    where = [buffer_device(u) for u in uops]
    folded = _runner.fold_copies(linked, nbytes, where, {i for i, u in enumerate(uops) if u in keep})
    if len(folded) == len(linked):
        return calls
    out: list[Entry] = []
    for c in folded:
        if isinstance(c, Copy):
            out.append((c._replace(dst=0, src=1), (uops[c.dst], uops[c.src])))
        else:
            out.append((c._replace(args=tuple(range(len(c.args)))), tuple(uops[a] for a in c.args)))
    return out


def _intermediates(calls: list[Entry], fresh: set[UOp], input_bufs: list[UOp]) -> frozenset[UOp]:
    """The fresh BUFFERs (see CapturedJit.intermediates) whose first use in calls is a write, except the new values
    Tensor.assign copies into a target that is kept (they are part of the state update: tinygrad writes those in
    place, and keeps them)."""
    seen: set[UOp] = set(input_bufs)
    out: set[UOp] = set()
    for e in calls:
        r, w = _reads_writes(e)
        out |= (w - r - seen) & fresh
        seen |= r | w
    for call, bufs in calls:
        if type(call) is Copy and bufs[call.dst] not in out:
            out.discard(bufs[call.src])
    return frozenset(out)


def _stored_key(u: UOp) -> Any:
    """The weak reference buffer_map's dict holds as u's key (among u's weak references, the one carrying
    buffer_map's removal callback), or None (no entry, or not CPython's WeakKeyDictionary). A lookup by the stored
    object itself skips comparing two weak references, which compares their UOps through a Python-level __eq__
    (UOp defines rich comparisons); a key that is no longer the stored one still finds the entry, by that compare."""
    remove = getattr(buffer_map, "_remove", None)
    got = [r for r in weakref.getweakrefs(u) if r.__callback__ is remove] if remove is not None else []
    return got[0] if len(got) == 1 else None


def _rebind_outputs(outs: list[Tensor], var_vals: dict[str, int]) -> None:
    """Returned tensors whose shapes hold bound Variables show the values of the latest replay."""
    for t in outs:
        if not all(isinstance(s, int) for s in t.shape):
            t.uop = _rebind(t.uop, var_vals)


def _rebind(u: UOp, var_vals: dict[str, int]) -> UOp:
    """u with every Variable of var_vals bound to its value there (in sources and in movement-op arguments)."""

    def dim(x: Any) -> Any:
        if isinstance(x, UOp):
            binds = [b for b in x.toposort() if b.op is Ops.BIND and b.src[0].arg[0] in var_vals]
            return x.substitute({b: b.src[0].bind(var_vals[b.src[0].arg[0]]) for b in binds}) if binds else x
        return tuple(dim(y) for y in x) if isinstance(x, tuple) else x

    new: dict[UOp, UOp] = {}
    for n in u.toposort():
        src = tuple(new[s] for s in n.src)
        arg = dim(n.arg) if n.op in _MOVEMENT_ARGS else n.arg
        new[n] = n if arg == n.arg and all(a is b for a, b in zip(src, n.src)) else n.replace(src=src, arg=arg)
    return new[u]


_MOVEMENT_ARGS = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.SHRINK, Ops.PAD})


class TinyJit(Generic[R]):
    """Decorator: `@TinyJit def step(x, y): ...` or `@TinyJit(prune=True)`. The first call runs eagerly, the
    second is captured (`.captured` is set), later calls replay. `.cnt` counts calls; `reset()` drops the capture.
    prune=True runs kernels that don't depend on the inputs only at the capture, not on every replay."""

    def __init__(
        self,
        fxn: Callable[..., R] | None = None,
        captured: CapturedJit | None = None,
        prune: bool = False,
        optimize: bool = False,
    ) -> None:
        if fxn is not None and not callable(fxn):  # (else the first call fails with "'int' object is not callable")
            raise TensorTypeError(f"TinyJit wraps a function, got {type(fxn).__name__} {fxn!r}; use @TinyJit on a "
                                  "def or TinyJit(f) with a callable f")  # fmt: skip
        for name, flag in (("prune", prune), ("optimize", optimize)):
            if not isinstance(flag, int):  # (bools are ints; a string or None here is a mistaken argument)
                raise TensorTypeError(f"TinyJit({name}=...) takes a bool, got {type(flag).__name__} {flag!r}")
        # optimize: tinygrad's request to optimize the captured kernels; speck's kernels are always optimized (NOOPT
        # and BEAM decide how), so it is accepted and kept, with nothing more to do
        self.fxn, self.prune, self.optimize = fxn, bool(prune), bool(optimize)
        self.captured: CapturedJit | None = captured
        self.cnt = 2 if captured is not None else 0
        if fxn is not None:
            functools.update_wrapper(self, fxn)

    def reset(self) -> None:
        """Forget the capture: the next call runs eagerly again and the one after captures."""
        if self.fxn is None:
            raise JitResetError("this TinyJit has no function (an unpickled capture): it can't capture again")
        self.cnt, self.captured = 0, None

    @property
    def jit_cache(self) -> list[Any]:
        """The captured calls a replay runs, as ExecItems (tinygrad's view; the capture keeps them as data)."""
        return self.captured.jit_cache if self.captured is not None else []

    @property
    def plan(self) -> Plan | None:
        """The runner Plan replays run (built at the first replay; its `batches` are the device graphs)."""
        return self.captured.plan if self.captured is not None else None

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return functools.partial(self.__call__, obj)  # methods: bind self (the capture is shared by all instances)

    def __reduce__(self) -> tuple[Any, ...]:
        """A captured JIT pickles its capture (kernels, buffers, returned tensors): see speck.tensor.pickling."""
        return reduce_jit(self)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if self.fxn is None and self.captured is None and len(args) == 1 and callable(args[0]) and not kwargs:
            self.fxn = args[0]  # @TinyJit(prune=...) applied to the function
            functools.update_wrapper(self, self.fxn)
            return self  # type: ignore[return-value]
        if self.fxn is None and self.captured is None:
            raise TensorTypeError(f"TinyJit() has no function to run: it was called with {len(args)} argument(s) and "
                                  f"{len(kwargs)} keyword(s) instead of one function to wrap; write @TinyJit or "
                                  "@TinyJit(prune=...) above a def")  # fmt: skip
        if _pending_writes():
            _flush_writes()  # writes recorded before the call happen before it (a replay reads their results)
        self.cnt += 1
        if not JIT.value and self.fxn is not None:
            return self.fxn(*args, **kwargs)
        cap = self.captured
        if cap is not None and (fast := cap.fast) is not None and not kwargs and not (DEFERRED_ANY[0] and _DEFERRED):
            # the replay hot path: the same input nodes as the last checked replay (nodes are immutable, so shapes,
            # dtypes, devices and buffers are the same too); deferred updates would have to run first
            nodes, epoch = fast[0], _EPOCH[0]
            if len(args) == len(nodes):
                for a, u in zip(args, nodes):
                    # (Tensor.uop inlined: a tensor a write made stale takes the checked path)
                    if a.__class__ is not Tensor or a._ver != epoch or a._uop is not u:
                        break
                else:
                    if fast[3] and cap.plan is not None and _capture_state.calls is None:
                        cap.run(fast[1])
                    else:
                        cap.replay(fast[1], fast[2])
                    return cap.ret  # type: ignore[no-any-return]
        inputs = _gather(args, kwargs)
        try:
            inputs.named[:] = multi.jit_inputs(inputs.named, inputs.views)  # a sharded input: one input per shard
            if self.captured is not None:
                return self._replay(inputs, () if kwargs else args)
            sigs = _prepare(inputs)
            assert self.fxn is not None
            if self.cnt == 1:
                ret = self.fxn(*args, **kwargs)
                Tensor.realize_all(*_returned_tensors(ret, strict=False))  # with none, still applies deferred updates
                return ret
            return self._capture(args, kwargs, inputs, sigs)
        finally:
            inputs.restore()

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: _Inputs, sigs: list[InputSig]) -> R:
        if realize.capture() is not None:
            self.cnt -= 1
            raise JitError(
                "a TinyJit can't capture while another one captures (nested TinyJit): call the inner "
                "function unjitted, or capture it before the outer one"
            )
        assert self.fxn is not None
        calls: list[Entry] = []
        fresh: set[UOp] = set()
        realize.set_capture(calls, fresh)
        bounds: list[tuple[Any, ...]] = []
        _capture_bounds.items = bounds
        try:
            ret = self.fxn(*args, **kwargs)
            Tensor.realize_all(*_returned_tensors(ret))
            if _pending_writes():
                _flush_writes()  # the function's writes the returns don't depend on belong to the capture too
            if calls:  # (a function of nothing but passed-through inputs is refused below)
                ret = _copy_passed_inputs(ret, {_buf(t) for _, t in inputs.named if type(t.uop) is UOp})
        except BaseException:
            self.cnt -= 1  # the next call captures again
            raise
        finally:
            realize.set_capture(None)
            _capture_bounds.items = None
        _finish_capture(calls)
        if not calls:
            self.cnt -= 1
            raise JitError(
                "didn't JIT anything! The function ran no kernel and no copy while it was captured (its "
                "outputs were computed before, or it returns its inputs); there is nothing to replay"
            )
        # Tensor.assign made the target buffer share the new value's storage (a copy recorded between two BUFFERs
        # with one Buffer); replays must not write into the target while kernels still read its old value, so the
        # new value gets storage of its own again and the replay copies it over at the point the assign happened
        data = buffer_map_data
        observed = _observed_buffers()  # what live tensors hold: seen after a replay
        for call, bufs in calls:
            if type(call) is Copy and bufs[0] is not bufs[1]:
                dst, src = data.get(_ref(bufs[0])), data.get(_ref(bufs[1]))
                if dst is not None and dst is src:
                    buffer_map.pop(bufs[1], None)
                    if bufs[1] in observed:  # a returned (or kept) new value keeps the capture's result too
                        realize.get_buffer(bufs[1]).copy_from(dst)
        input_bufs = [_buf(t) for _, t in inputs.named]
        calls = _fold_copies(calls, set(input_bufs) | observed)
        if self.prune:
            calls = prune_calls(calls, input_bufs)
        written = frozenset(b for e in calls for b in _reads_writes(e)[1]) - set(input_bufs)
        _replay_written.update(dict.fromkeys(written))
        names, var_vals = [n for n, _ in inputs.named], dict(inputs.var_vals)
        temps = _intermediates(calls, fresh, input_bufs)
        self.captured = CapturedJit(ret, calls, input_bufs, names, sigs, inputs.layout, var_vals, written, {}, temps)
        self.captured.bounds = bounds
        return ret

    def _replay(self, inputs: _Inputs, args: tuple[Any, ...] = ()) -> R:
        """Check the inputs against the capture and replay. `args`: the positional arguments when they are all the
        call has (no keywords), for the next call's unchecked replay."""
        cap = self.captured
        assert cap is not None
        if inputs.layout != cap.expected_layout:
            raise JitError(
                f"args mismatch: the jitted function was captured with {len(cap.expected_sigs)} tensor inputs, called "
                f"with {len(inputs.named)} (argument layout {_show_layout(cap)}, now {_show_layout(inputs)}); "
                "tensors, Variables and the number and names of arguments must stay the same (call .reset() to "
                "capture again)"
            )
        sigs = _prepare(inputs)
        mapping: dict[UOp, UOp] = {}
        cloned = False
        for (name, t), sig, want, old in zip(inputs.named, sigs, cap.expected_sigs, cap.input_bufs):
            if sig != want:
                raise JitError(
                    f"args mismatch: jitted function input {name} changed: captured {want.describe()}, got "
                    f"{sig.describe()}; the capture only serves the same shapes, dtypes, devices and views "
                    "(call .reset() to capture again)"
                )
            new = _buf(t)
            if new in cap.written:  # an output of the capture fed back in: the replay overwrites it while reading
                new = _buf(t.clone().realize())  # (t itself may be a returned tensor: it keeps its buffer)
                cloned = True
            mapping[old] = new
        var_vals = {**cap.var_vals, **inputs.var_vals}
        for b, e, s, what in getattr(cap, "bounds", ()):  # (a capture pickled before bounds were kept has none)
            bv, ev, sv = (sym_infer(x, var_vals) if isinstance(x, UOp) else x for x in (b, e, s))
            if not 0 <= bv <= ev <= sv:
                raise JitError(f"args mismatch: {what} keeps [{bv}, {ev}) of a dim of {sv} at this call's Variable "
                               f"values {inputs.var_vals}; a replay would read past the buffer. Bind values that "
                               "keep it inside the dim")  # fmt: skip
        cap.fast = None
        cap.replay(mapping, var_vals)
        # positional tensors only, each one plain input, none copied: the next call with the same nodes may skip
        # the checks (a sharded tensor is one input per shard; a list, a keyword or a Variable changes the layout)
        if args and not cloned and len(inputs.named) == len(args) and all(a.__class__ is Tensor for a in args):
            nodes = tuple(a.uop for a in args)
            if not any(type(u) is MultiUOp for u in nodes):
                plain = var_vals == cap.var_vals and var_vals == (cap.ret_var_vals or cap.var_vals)
                cap.fast = (nodes, mapping, var_vals, plain)
        return cap.ret  # type: ignore[no-any-return]


def _show_layout(x: CapturedJit | _Inputs) -> str:
    npos, kw, kinds = x.expected_layout if isinstance(x, CapturedJit) else x.layout
    return f"{npos} positional {list(kinds[:npos])}, keywords {list(kw)}"
