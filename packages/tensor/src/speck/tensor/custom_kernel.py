"""`Tensor.custom_kernel`: a kernel written by hand in UOps, run through speck's normal codegen and runtime.

`fxn` gets one placeholder per tensor (`UOp.placeholder(shape, dtype, slot)`: a buffer view indexed as `C[i, j]`)
and returns a SINK built from ranges, indexed loads and stores, `.end(*ranges)`, `.set`/`.after` accumulation,
GROUPs of stores and `contract`. `lower_custom_kernel` turns that into a kernel AST of KERNEL_CONTRACT.md section 1
(flat PARAM buffers, one load per element read, stores; reads after in-place writes keep their AFTER ordering).

In the tensor graph the call is one KERNEL node (src: the argument tensors, arg: a `CustomKernel`); each returned
tensor is `AFTER(argument, KERNEL)`, the argument's value after the kernel ran. The scheduler gives the call its
own kernel (`schedule_custom_kernel`): arguments are realized into whole row-major buffers first, nothing is fused
into it, and arguments it writes that already are whole buffers (made with Tensor.empty) are written in place."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.lower.ranges import RangeScope
from speck.tensor.errors import CustomKernelError as CustomKernelError
from speck.tensor.gradient import override_gradient, user_gradients
from speck.tensor.multi import MultiUOp, _as_multi
from speck.tensor.schedule import (
    ScheduleItem,
    _reshape_index,
    base_buffer,
    buffer_device,
    buffer_map,
    contiguous_index,
    realized_cache,
    register_schedule_rule,
    view_offset,
)
from speck.uop import Ops, PtrDType, UOp, dtypes
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.schedule import Scheduler
    from speck.tensor.tensor import Tensor

GradFxn = Callable[..., Any]


@dataclass(eq=False)
class CustomKernel:
    """The arg of a custom kernel's KERNEL node (compared by identity: every call is a run of its own).

    ast: the lowered kernel (PARAM slot k = argument k); writes: the slots it stores to; grad_fxn: the user's
    backward (dropped when pickled)."""

    ast: UOp
    writes: frozenset[int]
    grad_fxn: GradFxn | None = None

    @property
    def name(self) -> str:
        return str(getattr(self.ast.arg, "name", "custom_kernel"))

    def __repr__(self) -> str:
        return f"CustomKernel({self.name!r}, writes={sorted(self.writes)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CustomKernel, (self.ast, self.writes))


# ---------------- building ----------------
def custom_kernel(tensors: Sequence[Tensor], fxn: Callable[..., UOp], grad_fxn: GradFxn | None) -> list[Tensor]:
    """The tensors after `fxn`'s kernel ran on them (one per argument; see the module docstring)."""
    if not tensors:
        raise CustomKernelError("custom_kernel needs at least one tensor")
    for what, f in (("fxn", fxn), ("grad_fxn (or None)", grad_fxn)):  # (was "'NoneType' object is not callable")
        if not callable(f) and not (f is None and what != "fxn"):
            raise CustomKernelError(f"custom_kernel: {what} must be a function, got {type(f).__name__} {f!r:.40}")
    fname = getattr(fxn, "__name__", repr(fxn))
    _check_arity(fxn, fname, len(tensors))
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise CustomKernelError(f"custom_kernel {fname}: all tensors must be on one device (or sharded over the same "
                                f"ones), got {sorted(map(str, devices))}")  # fmt: skip
    sharded = [isinstance(t.uop, MultiUOp) for t in tensors]
    if any(sharded) and not all(sharded):  # (a tuple device on a plain node: one sharded, others replicated .to())
        raise CustomKernelError(f"custom_kernel {fname}: arguments {[k for k, m in enumerate(sharded) if not m]} "
                                "are not sharded like the others; shard or replicate every argument")  # fmt: skip
    placeholders = []
    for slot, t in enumerate(tensors):
        # a sharded argument: the kernel runs on each device over its shard (fxn sees the shard's shape)
        shape = t.uop.shards[0].shape if isinstance(t.uop, MultiUOp) else t.shape
        if not all(isinstance(s, int) for s in shape):
            raise CustomKernelError(f"custom_kernel {fname}: argument {slot} has symbolic shape {t.shape}; custom "
                                    "kernels need concrete shapes")  # fmt: skip
        placeholders.append(UOp.placeholder(shape, t.dtype, slot))
    sink = fxn(*placeholders)
    if not isinstance(sink, UOp) or sink.op is not Ops.SINK:
        got = f"a {sink.op} UOp" if isinstance(sink, UOp) else type(sink).__name__
        raise CustomKernelError(f"custom_kernel {fname} must return a SINK UOp (e.g. C[i].store(v).end(i).sink()), "
                                f"got {got}")  # fmt: skip
    ast, writes = lower_custom_kernel(sink, fname)
    ck = CustomKernel(ast, writes, grad_fxn)
    if all(sharded):
        return _per_shard(tensors, ck)
    call = UOp(Ops.KERNEL, dtypes.void, tuple(t.uop for t in tensors), ck)
    outs = [t._new(UOp(Ops.AFTER, t.dtype, (t.uop, call))) for t in tensors]

    for out in outs:
        override_gradient(out.uop, call.src, _gradient_rule(call, ck))
    return outs


def _per_shard(tensors: Sequence[Tensor], ck: CustomKernel) -> list[Tensor]:
    """The kernel run on each device over that device's shards (one KERNEL per device); each result is sharded like
    its argument. Gradients are per shard too: grad_fxn gets each device's call."""
    ms = [cast(MultiUOp, t.uop) for t in tensors]
    n = len(ms[0].shards)
    if any(len(m.shards) != n or m.device != ms[0].device for m in ms):
        raise CustomKernelError(f"custom_kernel {ck.name}: the arguments are sharded over different devices "
                                f"({sorted({m.device for m in ms})}); shard them over the same ones")  # fmt: skip
    calls = [UOp(Ops.KERNEL, dtypes.void, tuple(m.shards[d] for m in ms), ck) for d in range(n)]
    outs = []
    for k, m in enumerate(ms):
        out = MultiUOp.make(Ops.AFTER, tuple(ms), None, [UOp(Ops.AFTER, m.dtype, (c.src[k], c)) for c in calls], m.axis,
                            m.device)  # fmt: skip
        override_gradient(out, tuple(ms), _sharded_gradient_rule(calls, ck, ms, out))
        outs.append(tensors[k]._new(out))
    return outs


def _sharded_gradient_rule(calls: list[UOp], ck: CustomKernel, ms: list[MultiUOp],
                           out: MultiUOp) -> Callable[[UOp], tuple[UOp | None, ...]]:  # fmt: skip
    """grad_fxn applied on each device to that device's shard of the gradient and its call, the results gathered
    into one sharded gradient per argument (laid out like the argument)."""
    rules = [_gradient_rule(c, ck) for c in calls]

    def rule(grad: UOp) -> tuple[UOp | None, ...]:
        grad = _as_multi(grad, out.device)
        if grad.axis is None and out.axis is not None:  # replicated (a sum's broadcast seed): each device's piece
            a, size = out.axis, out.shards[0].shape[out.axis]
            pieces = [g.shrink(tuple((d * size, (d + 1) * size) if i == a else (0, s) for i, s in enumerate(g.shape)))
                      for d, g in enumerate(grad.shards)]  # fmt: skip
            grad = MultiUOp.leaf(pieces, a, out.device)
        if grad.axis != out.axis or grad.shards[0].shape != out.shards[0].shape:
            raise CustomKernelError(f"custom kernel {ck.name}: the gradient of its sharded output arrives laid out "
                                    "unlike the output; shard it the same way (.shard_like(out))")  # fmt: skip
        per = [r(g) for r, g in zip(rules, grad.shards)]
        grads: list[UOp | None] = []
        for k, m in enumerate(ms):
            parts = [p[k] for p in per]
            grads.append(None if any(p is None for p in parts) else MultiUOp.leaf(cast(list[UOp], parts), m.axis,
                                                                                  m.device))  # fmt: skip
        return tuple(grads)

    return rule


def _check_arity(fxn: Callable[..., Any], fname: str, n: int) -> None:
    try:
        sig = inspect.signature(fxn)
    except (TypeError, ValueError):  # builtins and C callables: let the call itself complain
        return
    try:
        sig.bind(*range(n))
    except TypeError:
        raise CustomKernelError(f"custom_kernel {fname}{sig} can't take the {n} UOp(s) it gets: fxn receives one "
                                "placeholder per tensor argument, in order") from None  # fmt: skip


def _gradient_rule(call: UOp, ck: CustomKernel) -> Callable[[UOp], tuple[UOp | None, ...]]:
    def rule(grad: UOp) -> tuple[UOp | None, ...]:
        if ck.grad_fxn is None:
            raise CustomKernelError(f"custom kernel {ck.name} has no grad_fxn: pass grad_fxn=(grad, call) -> one "
                                    "gradient (or None) per argument to differentiate through it")  # fmt: skip
        got = ck.grad_fxn(grad, call)
        return user_gradients(got, call.src, f"grad_fxn of custom kernel {ck.name}", CustomKernelError)

    return rule


# ---------------- lowering: the user's SINK -> a kernel AST ----------------
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP, Ops.EXPAND, Ops.PAD})
_VIEW = UOp(Ops.NOOP, dtypes.void, (), "custom_kernel view")  # marks nodes that are buffer views, not values
_STORAGE = (Ops.PARAM, Ops.DEFINE_REG)  # an argument's buffer, or registers (placeholder(addrspace=REG))


def _is_view(u: UOp) -> bool:
    return isinstance(u.dtype, PtrDType) and (u.op in _VIEW_OPS or u.op is Ops.AFTER or u.op in _STORAGE)


def _is_element(u: UOp) -> bool:
    """An indexed element `C[i, j]` (an INDEX of a buffer view whose dtype is the element's, not a pointer)."""
    return u.op is Ops.INDEX and not isinstance(u.dtype, PtrDType) and _is_view(u.src[0])


class _Lowering:
    def __init__(self, kname: str) -> None:
        self.kname = kname
        self.low: dict[UOp, UOp] = {}
        self.writes: set[int] = set()

    def pointer(self, elem: UOp) -> tuple[UOp, int | None]:
        """INDEX(PARAM.after(*deps), flat index) of an element, with its argument slot (None for registers).
        Movement views map the index down to the placeholder's row-major layout; AFTERs on the way keep their
        ordering."""
        view, idx = elem.src[0], [self.low[i] for i in elem.src[1:]]
        self.check_bounds(idx, view.shape, elem)
        deps: list[UOp] = []
        gates: list[UOp] = []
        u = view
        while u.op not in _STORAGE:
            if u.op is Ops.AFTER:
                deps += [self.low[d] for d in u.src[1:]]
            else:
                idx = _view_index(u, idx, gates)
            u = u.src[0]
        if type(u.arg) is not tuple:
            raise CustomKernelError(f"custom kernel {self.kname}: index a placeholder (a PARAM with a shape), not a "
                                    f"bare PARAM {u.arg}")  # fmt: skip
        slot, shape = u.arg
        self.check_bounds(idx, shape, elem, gated=bool(gates))
        flat = _row_major(idx, shape).simplify()
        if gates:
            cond = gates[0]
            for g in gates[1:]:
                cond = cond & g
            flat = flat.valid(cond)
        buf = UOp(u.op, u.dtype, (), int(slot))
        return (buf.after(*deps) if deps else buf).index(flat), int(slot) if u.op is Ops.PARAM else None

    def check_bounds(self, idx: list[UOp], shape: tuple[Any, ...], elem: UOp, gated: bool = False) -> None:
        """An index whose bounds (over the ranges it is built from) leave the dim is an error at build time."""
        if gated:
            return
        for d, (i, s) in enumerate(zip(idx, shape)):
            if any(n.op in (Ops.LOAD, Ops.INDEX) for n in i.toposort()):
                continue  # read from memory: nothing is known about it before the kernel runs
            lo, hi = i.vmin, i.vmax
            if isinstance(lo, int) and isinstance(hi, int) and isinstance(s, int) and (lo < 0 or hi >= s):
                raise CustomKernelError(
                    f"custom kernel {self.kname} indexes dim {d} of a buffer view of shape {tuple(shape)} with "
                    f"{i.render()}, which ranges over [{lo}, {hi}]: outside [0, {s - 1}]. Check the range sizes "
                    "and index arithmetic"
                )

    def effects(self, view: UOp) -> list[UOp]:
        """The writes a buffer view was taken after (what `C.end(i)` or a SINK of `C` stands for)."""
        out: list[UOp] = []
        u = view
        while u.op not in _STORAGE:
            if u.op is Ops.AFTER:
                out += [self.low[d] for d in u.src[1:] if d.op is not Ops.RANGE]
            u = u.src[0]
        return out

    def node(self, u: UOp) -> UOp:
        low = self.low
        if u.op in _STORAGE and type(u.arg) is tuple:  # a placeholder read through .index() by hand
            return UOp(u.op, u.dtype, (), int(u.arg[0]))
        if u.op in _VIEW_OPS and _is_view(u) or u.op is Ops.AFTER and low[u.src[0]] is _VIEW:
            return _VIEW
        if _is_element(u):
            ptr, _ = self.pointer(u)
            return ptr.load()
        if u.op is Ops.LOAD and _is_element(u.src[0]):
            return UOp(Ops.LOAD, u.dtype, (self.pointer(u.src[0])[0], *[low[s] for s in u.src[1:]]))
        if u.op is Ops.STORE:
            tgt = u.src[0]
            if _is_element(tgt):
                ptr, slot = self.pointer(tgt)
                if slot is not None:
                    self.writes.add(slot)
            else:
                ptr = low[tgt]
                base = ptr.src[0] if ptr.op is Ops.INDEX else ptr
                while base.op is Ops.AFTER:
                    base = base.src[0]
                if base.op not in _STORAGE:
                    raise CustomKernelError(f"custom kernel {self.kname}: STORE into a {tgt.op}; store into an "
                                            "indexed buffer element, e.g. C[i].store(v)")  # fmt: skip
                if base.op is Ops.PARAM:
                    self.writes.add(int(base.arg if isinstance(base.arg, int) else base.arg[0]))
            return UOp(Ops.STORE, u.dtype, (ptr, *[low[s] for s in u.src[1:]]))
        if u.op is Ops.END and _is_view(u.src[0]):
            body = self.effects(u.src[0])
            if not body:
                raise CustomKernelError(f"custom kernel {self.kname}: .end() of a buffer nothing was stored into")
            return UOp.group(*body).end(*[low[r] for r in u.src[1:]])
        srcs = tuple(low[s] for s in u.src)
        if any(s is _VIEW for s in srcs):
            raise CustomKernelError(f"custom kernel {self.kname}: a {u.op} uses a whole buffer view; index it "
                                    "(C[i, j]) to read an element")  # fmt: skip
        return u if all(a is b for a, b in zip(srcs, u.src)) else u.replace(src=srcs)


def lower_custom_kernel(sink: UOp, kname: str = "custom_kernel") -> tuple[UOp, frozenset[int]]:
    """The kernel AST of a hand-written SINK and the PARAM slots it stores to. Raises CustomKernelError for a SINK
    with no stores, an index whose bounds leave its buffer's shape, or a range that is never closed."""
    info = sink.arg
    if info is None:
        info = KernelInfo(name=kname)
    elif isinstance(info, str):
        info = KernelInfo(name=info)
    elif not isinstance(info, KernelInfo):
        raise CustomKernelError(f"custom kernel {kname}: the SINK's arg must be a KernelInfo, got {info!r}")
    lw = _Lowering(info.name)
    for u in sink.toposort():
        if u is not sink:
            lw.low[u] = lw.node(u)
    effects: list[UOp] = []
    for s in sink.src:
        effects += lw.effects(s) if _is_view(s) else [lw.low[s]]
    if not lw.writes:
        raise CustomKernelError(f"custom kernel {info.name} stores nothing: its SINK has no STORE into an argument; "
                                "write outputs with C[i].store(value) (or C[i].set(value))")  # fmt: skip
    ast = UOp.sink(*effects, arg=info)
    if open_ranges := RangeScope().open_ranges(ast):
        names = ", ".join(f"axis {r.arg[0]} (size {r.src[0].render()})" for r in sorted(open_ranges, key=str))
        raise CustomKernelError(f"custom kernel {info.name}: {names} never closed; end the stores inside a range "
                                "with .end(range) (or reduce/contract over it)")  # fmt: skip
    # stores read back through AFTER depend on the order the kernel was written in: keep the loops as written
    if not info.opts and any(u.op is Ops.AFTER for u in ast.toposort()):
        ast = ast.replace(arg=info.replace(dont_opt=True))
    return ast, frozenset(lw.writes)


def _row_major(idx: list[UOp], shape: tuple[Any, ...]) -> UOp:
    return contiguous_index(tuple(idx), shape)


def _view_index(u: UOp, idx: list[UOp], gates: list[UOp]) -> list[UOp]:
    """Indices into u.src[0] of the element at idx of the movement view u (a pad adds a validity gate)."""
    src_shape = u.src[0].shape
    if u.op is Ops.RESHAPE:
        return list(_reshape_index(tuple(idx), tuple(u.shape), tuple(src_shape)))
    if u.op is Ops.PERMUTE:
        out = list(idx)
        for j, p in enumerate(u.arg):
            out[p] = idx[j]
        return out
    if u.op is Ops.SHRINK:
        return [i + b if not (isinstance(b, int) and b == 0) else i for i, (b, _) in zip(idx, u.arg)]
    if u.op is Ops.FLIP:
        return [(s - 1 - i) if f else i for i, s, f in zip(idx, src_shape, u.arg)]
    if u.op is Ops.EXPAND:
        zero = UOp.const(dtypes.weakint, 0)
        return [zero if s == 1 and n != 1 else i for i, s, n in zip(idx, src_shape, u.arg)]
    assert u.op is Ops.PAD, u.op
    out = []
    for i, s, (b, _) in zip(idx, src_shape, u.arg):
        ni = i - b if b else i
        gates.append((ni >= 0) & (ni < s))
        out.append(ni)
    return out


# ---------------- scheduling ----------------
def schedule_custom_kernel(sched: Scheduler, u: UOp) -> UOp:
    """Schedule the KERNEL behind `u = AFTER(argument, KERNEL)` (once per call) and return u's buffer view."""
    call = u.src[1]
    ck: CustomKernel = call.arg
    bufs: list[UOp] = []
    for slot, src in enumerate(call.src):
        whole = _whole_buffer(src, base_buffer, view_offset)
        if slot in ck.writes:
            if _read_elsewhere(sched, src, call) or whole is None and sched.materialized(src) is not None:
                # something else in this schedule reads the value it would overwrite: write into a copy instead
                src, whole = UOp(Ops.CONTIGUOUS, src.dtype, (src,), "clone", ("custom_kernel", id(call), slot)), None
            elif whole is not None and whole in buffer_map:
                realized_cache.clear()  # written in place: values computed from its old contents are stale
        if whole is None:
            view = sched.realize(src)
            if (whole := _whole_buffer(view, base_buffer, view_offset)) is None:  # a strided or offset view
                copy = UOp(Ops.CONTIGUOUS, view.dtype, (view,), "clone", ("custom_kernel", id(call), slot))
                whole = base_buffer(sched.materialize(copy))
        assert whole is not None
        bufs.append(whole)
    devices = {buffer_device(b) for b in bufs}
    if len(devices) != 1:
        raise CustomKernelError(f"custom kernel {ck.name}: its buffers are on several devices {sorted(devices)}")
    sched.items.append(ScheduleItem(ck.ast, tuple(bufs)))
    for src, b in zip(call.src, bufs):
        shape = src.shape
        sched.done[UOp(Ops.AFTER, src.dtype, (src, call))] = b.reshape(shape) if shape != (b.arg,) else b
    return sched.done[u]


def _read_elsewhere(sched: Scheduler, src: UOp, call: UOp) -> bool:
    """Whether the graphs this schedule realizes read src (or, through views, its buffer) other than through this
    call (the KERNEL, once per argument slot src fills, and src's AFTER result are its expected consumers)."""
    n, expected = src, call.src.count(src) + (UOp(Ops.AFTER, src.dtype, (src, call)) in sched._counted)
    while True:
        if sched._uses.get(n, 0) > expected:
            return True
        if n.op not in _VIEW_OPS and n.op is not Ops.DETACH or not n.src:
            return False  # a buffer, or a computation that gets a buffer of its own
        n, expected = n.src[0], 1


def _whole_buffer(view: UOp, base_buffer: Any, view_offset: Any) -> UOp | None:
    """The BUFFER when view is all of it, row-major from element 0 (what a kernel parameter points at)."""
    bb = base_buffer(view)
    if bb is None or not isinstance(bb.arg, int) or bb.arg != int(prod(view.shape)) or view_offset(view) != 0:
        return None
    return bb  # type: ignore[no-any-return]


register_schedule_rule(Ops.AFTER, schedule_custom_kernel)
