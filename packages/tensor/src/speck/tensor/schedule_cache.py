"""The schedule cache. Realizing the same computation again on other buffers (a training step, `(a+b).realize()` in a
loop) rebuilds an identical graph up to which BUFFERs it reads. The cache keys a graph by its structure with buffers
numbered in order of appearance, and replays the kernel list with fresh output/intermediate buffers."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from weakref import ref as _wref

from speck.tensor.schedule import (
    ScheduleItem,
    Scheduler,
    base_buffer,
    buffer_device,
    buffer_map,
    buffer_views,
    contiguous_made,
    has_pending_siblings,
    new_buffer_uop,
    realized_data,
)
from speck.tensor.settings import PROGRAM_CACHE, SCACHE
from speck.uop import Ops, UOp


@dataclass(eq=False)
class CachedSchedule:
    """A cached schedule: kernels and copies as (ast, buffer refs, var_vals, copy offset in elements, device,
    bytes copied, the copy source's item size), the fresh buffers to make as (device, size, dtype), the output's ref
    and the output's shape. A ref >= 0 is an input position, ~ref (< 0) a fresh buffer. `plan` and `generation`
    belong to the realize engine (the runner Plan of this schedule, made on first use, and the program-cache
    generation its programs come from; `warm`: what its warm runs need that does not change, worked out once;
    `keys`: per input, the weak reference its last run found the input's buffer_map entry by). `keeps`: the
    intermediates the schedule gives buffers that later realizes of other graphs holding them read (Scheduler.kept),
    as (the node's number in the graph walk, its fresh buffer, its shape): an instance keeps them too."""

    recipe: tuple[tuple[UOp | None, tuple[int, ...], dict[str, int], int, str, int, int], ...]
    fresh: tuple[tuple[str, Any, Any], ...]
    out_ref: int
    shape: Any
    ninputs: int
    plan: Any = None
    generation: int = -1
    warm: Any = None
    keys: Any = None
    keeps: tuple[tuple[int, int, Any], ...] = ()

    def instantiate(self, inputs: list[UOp], nodes: dict[UOp, int] | None = None) -> tuple[list[ScheduleItem], UOp]:
        """The schedule items over `inputs` and fresh buffers, and the view of the output. `nodes`: the graph's
        nodes by walk number (_signature), whose kept intermediates go into contiguous_made as the cold run's did."""
        fresh = [new_buffer_uop(d, n, dt) for d, n, dt in self.fresh]
        if self.keeps and nodes is not None:
            walk = {i: n for n, i in nodes.items()}
            for nid, k, shape in self.keeps:
                contiguous_made[walk[nid]] = fresh[k].reshape(shape) if shape != (fresh[k].arg,) else fresh[k]
        items = [
            ScheduleItem(ast, tuple([inputs[r] if r >= 0 else fresh[~r] for r in refs]), dict(vv) if vv else {}, off)
            for ast, refs, vv, off, _, _, _ in self.recipe
        ]
        return items, self.output_view(fresh[~self.out_ref])

    def output_view(self, out_buf: UOp) -> UOp:
        return out_buf.reshape(self.shape) if self.shape != (out_buf.arg,) else out_buf


class _LRU(OrderedDict[Any, CachedSchedule]):
    """The schedule cache: at most `size` schedules, the least recently used dropped first (with the programs only
    its plan still held). `get` is OrderedDict's own (C): cached_plan marks a hit most recently used."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, key: Any, value: CachedSchedule) -> None:
        super().__setitem__(key, value)
        _newest[0] = _wref(value)
        while len(self) > max(self.size, 1):
            self.popitem(last=False)


def _nothing() -> None:
    return None


# a weak reference to the schedule last put at the LRU's end (inserted or touched): a hit on it is already the most
# recently used, so cached_plan leaves the order as it is (a removed schedule is never a hit; under threads a stale
# one only leaves the order a little off, never a result)
_newest: list[Any] = [_nothing]


_schedule_cache = _LRU(int(PROGRAM_CACHE.value))
_get, _touch = _schedule_cache.get, _schedule_cache.move_to_end
# enum members as module constants: in Python 3.11 each `Ops.X` is an attribute lookup through the enum's metaclass
_BUFFER, _UNIQUE, _RESHAPE = Ops.BUFFER, Ops.UNIQUE, Ops.RESHAPE


def _signature(u: UOp) -> tuple[Any, list[UOp], dict[UOp, int]] | None:
    """(structural key, input BUFFERs in order, every node's walk number) of a tensor graph; None when the graph
    reads a cached realization held in part of a buffer (a realized node held whole in a buffer is an input). Nodes
    come in u.toposort() order, not walking below BUFFERs (an inlined walk: this runs on every realize). A node's
    arg enters the key as hash-consing keys it (`_ck[3]`: a float by its bits, so 0.0 and -0.0 differ, and a value
    qualified by its type), with its tag."""
    ids: dict[UOp, int] = {}
    inputs: list[UOp] = []
    parts: list[Any] = []
    buffer, unique, rc, ref = _BUFFER, _UNIQUE, realized_data, _wref
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:
        n, visited = stack.pop()
        if n in ids:
            continue
        if n.op is buffer:
            parts.append(("B", n.dtype, n.arg, n.src[1].arg, len(inputs)))
            inputs.append(n)
            ids[n] = len(ids)
        elif visited:
            ck, srcs = n._ck, tuple(map(ids.__getitem__, n.src))
            parts.append((n.op, n.dtype, ck[3] if n.op is not unique else None, ck[4], srcs))
            ids[n] = len(ids)
        elif (v := rc.get(ref(n))) is not None:  # a realized value: an input, its buffer seen through v's view
            b = v if v.op is buffer else v.src[0] if v.op is _RESHAPE and v.src[0].op is buffer else None
            if n is u or b is None or b in ids:  # (u itself: nothing to plan; a region of a buffer, or one buffer
                # twice: not worth keying)
                return None
            parts.append(("R", n.dtype, v.shape, b.dtype, b.arg, b.src[1].arg, len(inputs)))
            inputs.append(b)
            ids[b] = ids[n] = len(ids)
        else:
            for s in n.src:
                if s not in ids and s.op is not buffer:
                    break
            else:  # every source is a BUFFER or seen: number them and n now, in the order the stack would
                for s in n.src:
                    if s not in ids:
                        parts.append(("B", s.dtype, s.arg, s.src[1].arg, len(inputs)))
                        inputs.append(s)
                        ids[s] = len(ids)
                ck, srcs = n._ck, tuple(map(ids.__getitem__, n.src))
                parts.append((n.op, n.dtype, ck[3] if n.op is not unique else None, ck[4], srcs))
                ids[n] = len(ids)
                continue
            stack.append((n, True))
            for s in reversed(n.src):
                if s not in ids:
                    stack.append((s, False))
    return tuple(parts), inputs, ids


Found = tuple[Any, list[UOp], "CachedSchedule | None", "dict[UOp, int] | None"]


def cached_plan(u: UOp, device: str, unrealized: bool = False) -> Found | None:
    """(cache key, input BUFFERs, the cached plan or None, the graph's nodes by walk number or None for a one-op
    graph) for realizing u on device; None when u can't be cached.
    `unrealized`: the caller has just found u not in realized_cache (a binary node is not looked up again)."""
    if not SCACHE.value:
        return None
    src = u.src
    if len(src) == 2 and src[0].op is _BUFFER and src[1].op is _BUFFER:  # a binary op over BUFFERs (per-op case):
        a, b = src  # _one_op_signature inlined
        if not unrealized and _wref(u) in realized_data:
            return None
        ck = u._ck
        # one flat tuple (fewer tuples to make and hash than the walk's nested key; its first item, an Ops member,
        # tells it from the walk's (signature, device) keys): the op, each input's dtype, size and DEVICE node (one
        # node per device name), whether it is one input twice, and the device
        inputs = [a] if a is b else [a, b]
        key: Any = (u.op, u.dtype, ck[3], ck[4], a.dtype, a.arg, a.src[1], b.dtype, b.arg, b.src[1], a is b, device)
        got: CachedSchedule | None = _get(key)
        if got is not None and _newest[0]() is not got:
            _touch(key)
            _newest[0] = _wref(got)
        return key, inputs, got, None
    sig: tuple[Any, ...] | None
    for s in src:
        if s.op is not _BUFFER:
            sig = _signature(u)
            break
    else:  # one op over BUFFERs (a node without sources, a UNIQUE maybe, takes the walk)
        sig = _one_op_signature(u) if src else _signature(u)
    if sig is None:
        return None
    key = (sig[0], device)
    got = _get(key)
    if got is not None and _newest[0]() is not got:
        _touch(key)
        _newest[0] = _wref(got)
    return key, sig[1], got, sig[2] if len(sig) > 2 else None


def _one_op_signature(u: UOp) -> tuple[Any, list[UOp]] | None:
    """_signature of a node whose sources are all BUFFERs (the same key): the walk's first step is all of it."""
    if _wref(u) in realized_data:
        return None
    inputs: list[UOp] = []
    parts: list[Any] = []
    pos: list[int] = []
    for s in u.src:
        if s in inputs:  # (a source used twice: a + a)
            pos.append(inputs.index(s))
            continue
        pos.append(len(inputs))
        parts.append(("B", s.dtype, s.arg, s.src[1].arg, len(inputs)))
        inputs.append(s)
    ck = u._ck
    parts.append((u.op, u.dtype, ck[3], ck[4], tuple(pos)))  # (u has sources: it is no UNIQUE)
    return tuple(parts), inputs


def schedule_with_cache(u: UOp, device: str, found: Found | None = None) -> tuple[list[ScheduleItem], UOp]:
    """Schedule u (a graph not already realized) reusing the kernel list of a structurally identical graph.
    `found` is cached_plan(u, device) when the caller already looked it up."""
    if found is None:
        found = cached_plan(u, device)
    if found is not None and found[2] is not None:
        return found[2].instantiate(found[1], found[3])
    sched = Scheduler(device)
    sched.keep = has_pending_siblings(u)
    view = sched.realize(u)
    if found is not None and SCACHE.value and view.op in (Ops.RESHAPE, Ops.BUFFER):
        out_buf = view if view.op is Ops.BUFFER else view.src[0]
        in_pos = {b: i for i, b in enumerate(found[1])}
        made: dict[UOp, int] = {}
        specs: list[tuple[str, Any, Any]] = []
        ok = out_buf.op is Ops.BUFFER and out_buf not in in_pos

        def ref(b: UOp) -> int:
            nonlocal ok
            if b in in_pos:
                return in_pos[b]
            if b.op is not Ops.BUFFER or b in buffer_map or b in buffer_views:  # an older buffer, or a region of
                ok = False  # another: the plan can't make it anew
            if b not in made:
                made[b] = len(made)
                specs.append((buffer_device(b), b.arg, b.dtype))
            return ~made[b]

        recipe = tuple((it.ast, tuple(ref(b) for b in it.bufs), it.var_vals, it.copy_offset, buffer_device(it.bufs[0]),
                        int(it.bufs[0].arg) * it.bufs[0].dtype.itemsize, it.bufs[-1].dtype.itemsize)
                       for it in sched.items)  # fmt: skip
        if ok and sched.items:  # (out_buf is a BUFFER when ok: a view of a view is not planned)
            out_ref = ref(out_buf)
            if ok:
                keeps = _keeps(sched, made, found[3])
                _schedule_cache[found[0]] = CachedSchedule(recipe, tuple(specs), out_ref, view.shape, len(found[1]),
                                                           keeps=keeps)  # fmt: skip
    return sched.items, view


def _keeps(sched: Scheduler, made: dict[UOp, int], nodes: dict[UOp, int] | None) -> tuple[tuple[int, int, Any], ...]:
    """CachedSchedule.keeps of a cold schedule: its kept intermediates held whole in one of its fresh buffers."""
    out = []
    for n, view in sched.kept:
        bb = base_buffer(view)
        if nodes is None or (nid := nodes.get(n)) is None or bb is None or (k := made.get(bb)) is None:
            continue
        if view is bb or (view.op is Ops.RESHAPE and view.src[0] is bb):
            out.append((nid, k, view.shape))
    return tuple(out)
