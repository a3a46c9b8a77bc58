"""In-place writes - `Tensor.assign`, `__setitem__` on realized tensors - with numpy's ("eager") ordering.

Model. A realized tensor is a view of a BUFFER node, and the BUFFER is the identity of that memory: every view of it
(movement ops, detach, same-size bitcast) aliases it, and TinyJit captures name it. A write to a BUFFER is recorded
here and runs at the next realize, after every write recorded before it (program order).

A lazy graph built *before* a write must keep the value of its time. Each tensor carries the write epoch its graph
was built at (`Tensor._ver`, counted by EPOCH below); when a tensor older than a write to a buffer its graph reads is
used again, the graph is rebound to that write's snapshot: a BUFFER that receives the buffer's old contents when the
write runs - if, and only if, a live graph can still read them. Pure views are never rebound: they see every write.

Running a write: a whole-buffer value is computed into a new buffer whose memory then becomes the target's (the old
memory is handed to the snapshot at no cost); a value that already lives in another buffer is copied in. A partial
write (through a slice, stride, permute, flip, pad, reshape or bitcast view, or setitem with index tensors) stores
in place, through the view's index expression or, for index tensors, through a scatter kernel whose loop runs over
the k written elements in order (so the last duplicate wins); the old contents are copied to the snapshot first only
when a live graph still reads them. DISK buffers are written immediately."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import realize
from speck.tensor.bounds import checked
from speck.tensor.device import Device, default_device, file_backed
from speck.tensor.disk import HOST, host_graph, needs_host
from speck.tensor.elementwise import broadcast_shape, scalar_op
from speck.tensor.errors import (
    ShardingError,
    TensorNotImplementedError,
    TensorOverflowError,
    TensorRuntimeError,
    TensorTypeError,
    TensorValueError,
)
from speck.tensor.fusion import MOVEMENT as _MOVEMENT
from speck.tensor.live import tensors
from speck.tensor.multi import MultiUOp
from speck.tensor.nodes import _iota_uop
from speck.tensor.realize import buffer_numpy, copy_entry, get_buffer, writable_disk
from speck.tensor.schedule import (
    ScheduleItem,
    Scheduler,
    buffer_device,
    buffer_map,
    buffer_views,
    new_buffer_uop,
    realized_cache,
    realized_data,
    take_host_array,
    unstage,
    view_offset,
)
from speck.tensor.settings import ALLOW_DEVICE_USAGE
from speck.uop import Ops, UOp, dtypes, least_upper_dtype
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


@dataclass(eq=False)
class Write:
    """One recorded write to `buf`. `value` is what gets stored (buf's dtype). Exactly one of: `target` (a view
    chain over buf: store value through it), `pos` (int32 positions, 1 + flat index into buf, 0 skips: a scatter in
    index order, combining with `reduce`), or neither (value is the whole buffer's new contents)."""

    epoch: int
    cls: type[Tensor]  # the class of the tensor written through (a DISK write computes its value with it)
    buf: UOp
    snap: UOp
    value: UOp
    target: UOp | None = None
    pos: UOp | None = None
    reduce: str | None = None
    ran: bool = False  # run (no longer pending in its thread)
    owner: threading.Thread = field(default_factory=threading.current_thread)  # the thread that recorded it


def live() -> list[Tensor]:
    """Every live tensor (speck.tensor.live's registry): the writes need to know which graphs still read old
    values."""
    return list(tensors())


class _ThreadWrites(threading.local):
    """What one thread has recorded and not run yet. Per thread: a realize runs its own thread's writes (program
    order is a thread's order), so another thread's writes never run - or get recorded - inside this thread's
    TinyJit capture."""

    def __init__(self) -> None:
        self.pending: list[Write] = []  # recorded, not run yet, in program order
        # in-place updates waiting for the next realize (Tensor.assign_deferred): id(target) -> (target, new value)
        self.deferred: dict[int, tuple[Tensor, Tensor]] = {}
        # TinyJit captures: (the capture, position in it, snapshot, buffer) of each snapshot filled by handing it the
        # buffer's old memory, which a replay would not do again
        self.capture_snaps: list[tuple[list[Any], int, UOp, UOp]] = []


_thread = _ThreadWrites()
thread_writes = _thread  # (Tensor.realize reads `.pending` on its per-op path: an attribute, not a pending() call)
# the write epoch: how many in-place writes have been recorded (all threads). Each tensor holds the epoch its graph
# was set at (`_ver`); one older than a write to a buffer its graph reads is rebound to the value that buffer had
# (numpy order: reads see the value of their time). A one-element list, so Tensor.uop's check is a global read and
# an index (that check runs on every op).
EPOCH = [0]
_log: list[Write] = []  # writes that a live tensor built before them may still be rebound for, by epoch (all threads)
_epoch_lock = threading.Lock()  # (write epochs are unique across threads)
# graph node -> the BUFFERs it reads (graphs are immutable, so this never goes stale)
_reads: weakref.WeakKeyDictionary[UOp, frozenset[UOp]] = weakref.WeakKeyDictionary()
_EMPTY: frozenset[UOp] = frozenset()


# deferred updates waiting in all threads: hot paths test `DEFERRED_ANY[0] and _DEFERRED` (no per-thread lookup
# when no thread has any, the common case)
DEFERRED_ANY = [0]
_deferred_lock = threading.Lock()


def _count_deferred(n: int) -> None:
    with _deferred_lock:
        DEFERRED_ANY[0] += n


class _ThreadDeferred(MutableMapping[int, "tuple[Tensor, Tensor]"]):
    """The running thread's deferred updates (a dict per thread, read through this one object)."""

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        return _thread.deferred[k]

    def __setitem__(self, k: int, v: tuple[Tensor, Tensor]) -> None:
        d = _thread.deferred
        if k not in d:
            _count_deferred(1)
        d[k] = v

    def __delitem__(self, k: int) -> None:
        del _thread.deferred[k]
        _count_deferred(-1)

    def __iter__(self) -> Iterator[int]:
        return iter(_thread.deferred)

    def __len__(self) -> int:
        return len(_thread.deferred)

    def __bool__(self) -> bool:
        return DEFERRED_ANY[0] != 0 and bool(_thread.deferred)

    def __contains__(self, k: object) -> bool:
        return k in _thread.deferred

    def put(self, target: Tensor, value: Tensor) -> None:
        """Queue target's update and mark target (see epoch_of): a graph built from it applies the update first."""
        self[id(target)] = (target, value)
        target._ver = -1 - epoch_of(target)

    def take(self) -> list[tuple[Tensor, Tensor]]:
        """Every (target, new value), removed; the targets are unmarked (see epoch_of): until their assigns,
        reads see their old values."""
        updates = list(_thread.deferred.values())
        self.clear()
        for target, _ in updates:
            target._ver = epoch_of(target)
        return updates

    def clear(self) -> None:
        d = _thread.deferred
        n = len(d)
        d.clear()
        if n:
            _count_deferred(-n)


# in-place updates waiting for the next realize (Tensor.assign_deferred), this thread's: id(target) -> (target, value)
_DEFERRED = _ThreadDeferred()
# the graph of a bitcast to another item size (a computation over its source's bits) -> the source it reads, so an
# assign through it writes the source (x.bitcast(int64).assign(v) on a uint8 buffer stores v's bytes)
RESIZED_BITCASTS: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


# ---------------- graph queries ----------------
def view_base(u: UOp) -> UOp | None:
    """The BUFFER under a chain of views (movement ops, detach, same-size bitcast), or None."""
    while u.op in _MOVEMENT or u.op is Ops.DETACH or (u.op is Ops.BITCAST and u.dtype.itemsize ==
                                                       u.src[0].dtype.itemsize):  # fmt: skip
        u = u.src[0]
    return u if u.op is Ops.BUFFER else None


def is_view(u: UOp) -> bool:
    """u is a pure view of a buffer (every shard of a sharded u is): it sees every write, never rebound."""
    if isinstance(u, MultiUOp):
        return all(view_base(s) is not None for s in u.shards)
    return view_base(u) is not None


def chain(u: UOp) -> list[UOp]:
    """u and the nodes it is a view of, down to the first one that is not a view (a BUFFER, or a lazy value)."""
    out = [u]
    while u.op in _MOVEMENT or u.op is Ops.DETACH or (u.op is Ops.BITCAST and u.dtype.itemsize ==
                                                       u.src[0].dtype.itemsize):  # fmt: skip
        u = u.src[0]
        out.append(u)
    return out


def buffers_read(u: UOp) -> frozenset[UOp]:
    """Every BUFFER u's graph reads (memoized per node; a sharded node reads what its shards read)."""
    if (r := _reads.get(u)) is not None:
        return r
    if isinstance(u, MultiUOp):  # (its src is the logical graph: the shards are what runs)
        parts = [buffers_read(s) for s in u.shards]
        return frozenset().union(*parts) if parts else _EMPTY
    if u.op is Ops.BUFFER:
        return frozenset((u,))
    # (a BUFFER's own entry is never stored: its value would hold its weak key alive, and the buffer with it)
    reads, bufs = _reads, {}
    for n in u.toposort(gate=lambda x: x not in reads and x.op is not Ops.BUFFER):
        if n.op is Ops.BUFFER:
            bufs[n] = frozenset((n,))
            continue
        if n in reads:
            continue
        parts = [r for c in n.src if (r := bufs[c] if c.op is Ops.BUFFER else reads[c])]
        reads[n] = _EMPTY if not parts else parts[0] if len(parts) == 1 else frozenset().union(*parts)
    return reads[u]


def substitute(u: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """u with the nodes of mapping replaced; a sharded node gets its shards substituted (UOp.substitute would walk
    its logical graph, which does not run)."""
    if isinstance(u, MultiUOp):
        shards = [s.substitute(mapping) for s in u.shards]
        if all(a is b for a, b in zip(shards, u.shards)):
            return u
        return MultiUOp.make(u.op, u.src, u.arg, shards, u.axis, u.device)
    return u.substitute(mapping)


# ---------------- rebinding stale graphs ----------------
def epoch_of(t: Tensor) -> int:
    """The write epoch t's graph was set at. Tensor.assign_deferred marks its target by storing it as -1 - epoch
    (negative: never the current epoch, so the next read of the target goes through Tensor.uop, which applies the
    pending update first)."""
    v = t._ver
    return v if v >= 0 else -1 - v


def refresh(t: Tensor) -> UOp:
    """t's graph with every buffer written since the graph was built replaced by that write's snapshot (the value
    t had when it was made). Called by Tensor.uop when a write happened since t's graph was set."""
    u: UOp = t._uop
    ver, t._ver = epoch_of(t), EPOCH[0]
    if not _log or _log[-1].epoch <= ver or is_view(u):
        return u
    reads = buffers_read(u)
    if not reads:
        return u
    mapping: dict[UOp, UOp] = {}
    for w in _log:
        if w.epoch > ver and w.buf in reads and w.buf not in mapping:
            mapping[w.buf] = w.snap
    if mapping:
        u = substitute(u, mapping)
        t._uop = u
    return u


def rebinding(t: Tensor) -> dict[UOp, UOp]:
    """The buffer -> snapshot swaps refresh(t) would make, found without rebuilding t's graph (empty: t.uop is
    t's graph as built). For questions about the buffers t reads: the rebuild walks and reinterns the whole graph."""
    u, ver = t._uop, epoch_of(t)
    if not _log or _log[-1].epoch <= ver or is_view(u):
        return {}
    reads = buffers_read(u)
    swap: dict[UOp, UOp] = {}
    for w in _log:
        if w.epoch > ver and w.buf in reads and w.buf not in swap:
            swap[w.buf] = w.snap
    return swap


def _affected(t: Tensor, epoch: int) -> bool:
    """t (built before `epoch`) reads a buffer some logged write since its graph was built changes."""
    u = t._uop
    if is_view(u):
        return False
    reads = buffers_read(u)
    ver = epoch_of(t)
    return bool(reads) and any(w.epoch > ver and w.buf in reads for w in _log if w.epoch <= epoch)


# ---------------- recording ----------------
def record(cls: type[Tensor], buf: UOp, value: UOp, target: UOp | None = None, pos: UOp | None = None,
           reduce: str | None = None) -> None:  # fmt: skip
    """Queue a write to buf (see Write) through a tensor of class cls. Graphs built before it now read the old
    value (through refresh)."""
    with _epoch_lock:
        EPOCH[0] += 1
        epoch = EPOCH[0]
    snap = new_buffer_uop(buffer_device(buf), int(buf.arg), buf.dtype)
    w = Write(epoch, cls, buf, snap, value, target, pos, reduce)
    _log.append(w)
    _thread.pending.append(w)
    # DISK writes happen at once; past _MAX_PENDING the queue runs too: a write nothing reads would otherwise wait
    # (holding its buffer, whose tensor may be gone) until a realize that needs a later one, or a TinyJit call.
    # So does a write in a thread other than the main one (not while an @function body is traced, whose writes
    # become values of its graph): no other thread can run it, and a worker that ends, or waits, without a realize
    # after it left the tensor's readers the old value (and graphs built before it an unfilled snapshot: zeros)
    if file_backed(buffer_device(buf)) or len(_thread.pending) > _MAX_PENDING or \
            (w.owner is not _MAIN and ALLOW_DEVICE_USAGE.value):  # fmt: skip
        flush()


_MAX_PENDING = 32
_MAIN = threading.main_thread()


def check_foreign(t: Tensor, what: str) -> None:
    """Before t's data is read: TensorRuntimeError when t's graph reads a buffer another thread wrote (assign,
    setitem) without realizing since. That write runs at its own thread's next realize, so this read would see
    the old value (or, for a graph built before the write, a snapshot not filled yet)."""
    if not _log:
        return
    me = threading.current_thread()
    foreign = [w for w in list(_log) if not w.ran and w.owner is not me]
    if not foreign:
        return
    reads = buffers_read(t.uop)
    for w in foreign:
        if w.buf in reads or w.snap in reads:
            raise TensorRuntimeError(
                f"{what}: the tensor reads a buffer thread {w.owner.name!r} wrote (assign/setitem) and has not "
                "realized since; a write runs at its own thread's next realize, so this thread would read the old "
                f"value. Realize in that thread after the write (e.g. Tensor.realize_all()) before other threads "
                f"read it{'' if w.owner.is_alive() else ' (it has ended: its write can no longer run)'}"
            )


def pending() -> bool:
    return bool(_thread.pending)


def take_since(epoch: int) -> list[Write]:
    """Remove and return (in program order) this thread's writes recorded after `epoch` that have not run: an
    @function body's, which its trace turns into values of its graph instead (speck.tensor.function)."""
    mine = [w for w in _thread.pending if w.epoch > epoch]
    if mine:
        ids = {id(w) for w in mine}
        _thread.pending[:] = [w for w in _thread.pending if id(w) not in ids]
        _log[:] = [w for w in _log if id(w) not in ids]
    return mine


def _needed(targets: Sequence[Tensor]) -> int:
    """How many of the pending writes (a prefix, so program order holds) must run before `targets` are computed:
    through the last one whose buffer or snapshot a target reads. The writes after it touch nothing the targets
    read, so they stay pending (like tinygrad, where an assign runs when something that depends on it is
    realized). A sharded target counts as needing them all, and so does a realize of nothing (`realize_all()`: run
    what is pending)."""
    pend = _thread.pending
    if not targets:
        return len(pend)
    reads: set[UOp] = set()
    for t in targets:
        u = t._uop
        if isinstance(u, MultiUOp):
            return len(pend)
        reads |= buffers_read(u)
    if not reads:
        return 0
    for i in range(len(pend) - 1, -1, -1):
        w = pend[i]
        if w.buf in reads or w.snap in reads:
            return i + 1
    return 0


def flush(targets: Sequence[Tensor] = (), needed_only: bool = False) -> None:
    """Run the recorded writes in order: all of them, or with `needed_only` the prefix `targets` depend on (see
    _needed). Each of `targets` (tensors about to be realized) that was made before a write and reads what it
    writes is computed just before that write, from the buffers as they are then - so it needs no snapshot, and a
    TinyJit capture of it reads the live buffers."""
    early = [t for t in targets if epoch_of(t) < EPOCH[0] and not is_view(t._uop)]
    _pending = _thread.pending
    todo = _needed(targets) if needed_only else len(_pending)
    if todo == 0:
        return
    while _pending and todo > 0:
        todo -= 1
        w = _pending[0]
        due = [t for t in early if epoch_of(t) < w.epoch and _reads_write(t._uop, w)]
        if due:
            back = {p.snap: p.buf for p in _pending}  # a graph already rebound to a pending write's snapshot
            for t in due:
                t.uop = substitute(t._uop, back)
            type(due[0])._realize_now(due)
            done = {id(t) for t in due}
            early = [t for t in early if id(t) not in done]
        _pending.pop(0)
        w.ran = True
        _run(w)
    _collect()


def schedule_pending(targets: Sequence[UOp]) -> list[ScheduleItem]:
    """The items computing the pending writes to the buffers `targets` read, without running or dropping them
    (Tensor.schedule's view of them: a kernel per write, as tinygrad lists an assign's). Running these items
    changes no buffer a tensor holds: a whole-buffer write computes its new value into a buffer of its own, a
    partial one (slice, setitem) stores into a scratch buffer of the target's size; the write itself still happens
    when it is realized."""
    bufs = frozenset().union(*(buffers_read(u) for u in targets)) if targets else frozenset()
    items: list[ScheduleItem] = []
    for w in _thread.pending:
        if w.buf not in bufs or file_backed(buffer_device(w.buf)):
            continue
        if w.target is not None or w.pos is not None:
            scratch = new_buffer_uop(buffer_device(w.buf), int(w.buf.arg), w.buf.dtype)
            sched = Scheduler(buffer_device(w.buf))
            target = w.target.substitute({w.buf: scratch}) if w.target is not None else None
            sched.write(scratch, w.value, target=target, pos=w.pos, reduce=w.reduce)
            items += sched.items
            continue
        if (src := _whole_source(w.value, w.buf)) is not None:
            items.append(ScheduleItem(None, (new_buffer_uop(buffer_device(w.buf), int(w.buf.arg), w.buf.dtype), src)))
            continue
        sched = Scheduler(buffer_device(w.buf))
        sched.materialize(UOp(Ops.CONTIGUOUS, w.value.dtype, (w.value,), "clone", _fresh()))
        items += sched.items
    return items


def _reads_write(u: UOp, w: Write) -> bool:
    reads = buffers_read(u)
    return w.buf in reads or w.snap in reads


def finish_capture(calls: list[tuple[Any, tuple[UOp, ...]]]) -> None:
    """Make a capture replay the snapshots it reads: a snapshot that a captured call reads gets a captured copy
    from its buffer at the point of its write (one that nothing reads needs none)."""
    snaps = _thread.capture_snaps
    for capture, at, snap, buf in reversed(snaps):
        if capture is calls and any(snap in bufs for _, bufs in calls[at:]):
            calls.insert(at, copy_entry(snap, buf))
    snaps.clear()


def _snapshot_needed(w: Write) -> bool:
    """Can anything still read buf's contents from before w: a live graph built before w that reads buf, a graph
    already rebound to w's snapshot, or a later pending write reading the snapshot."""
    snap = w.snap
    for t in live():
        u = t._uop
        if is_view(u):
            continue
        reads = buffers_read(u)
        if snap in reads or (epoch_of(t) < w.epoch and w.buf in reads):
            return True
    return any(snap in buffers_read(p.value) or (p.pos is not None and snap in buffers_read(p.pos))
               for p in _thread.pending)  # fmt: skip


def _collect() -> None:
    """Forget logged writes no live tensor can be rebound for any more (their snapshots then live only as long as
    graphs that read them). Tensors no write affects are marked current, so a tensor that lives long (a lazy
    constant) does not keep old snapshots alive."""
    epoch = EPOCH[0]
    if not _log:
        return
    oldest = epoch
    for t in live():
        if (ver := epoch_of(t)) >= epoch:
            continue
        if _affected(t, epoch):
            oldest = min(oldest, ver)
        else:
            t._ver = epoch if t._ver >= 0 else -1 - epoch  # (a deferred update's mark stays)
    # (in place over the entries seen, so entries another thread appends meanwhile are kept)
    n = len(_log)
    _log[:n] = [w for w in _log[:n] if w.epoch > oldest or not w.ran]


# ---------------- running a write ----------------
def _run(w: Write) -> None:
    buf = w.buf
    take_host_array(buf)  # (a Tensor(ndarray)'s buffer gets the array's values before anything writes it)
    dev = buffer_device(buf)
    if file_backed(dev):
        _run_disk(w)
        return
    keep_old = _snapshot_needed(w)
    sched = Scheduler(dev)
    if w.target is None and w.pos is None:
        src = _whole_source(w.value, buf)
        if src is not None and src is not buf and (buf in replay_written or src in replay_written):
            src = None  # a TinyJit replay writes one of them in place, past _unshare: copy instead of sharing
        if src is buf:  # the buffer's own contents: only a snapshot may need them as they are
            if keep_old:
                realize.execute([ScheduleItem(None, (w.snap, buf))])
            return
        if src is not None:  # the value already lives in a buffer of its own: share its memory (no copy)
            if keep_old and buf in buffer_map:
                _hand_over(w, realize.recording())
            _map(buf, realize.get_buffer(src), src)
            for a, b in ((buf, src), (src, buf)):  # until one of them is written in place (_unshare)
                _shared.setdefault(a, []).append(weakref.ref(b))
            realize.record(*realize.copy_entry(buf, src))  # TinyJit replays this as a copy src -> buf
        else:
            view = sched.realize(w.value)
            new = view if view.op is Ops.BUFFER else view.src[0]
            if new.op is not Ops.BUFFER or view_offset(view) != 0 or all(it.bufs[0] is not new for it in sched.items):
                # the value is (a view of) memory that exists already: compute a copy of its own
                sched = Scheduler(dev)
                view = sched.materialize(UOp(Ops.CONTIGUOUS, w.value.dtype, (w.value,), "clone", _fresh()))
                new = view if view.op is Ops.BUFFER else view.src[0]
            realize.execute(sched.items)
            assert new.op is Ops.BUFFER and int(new.arg) == int(buf.arg)
            if _take_memory(buf, new, w if keep_old else None):
                return
            if keep_old and buf in buffer_map:
                _hand_over(w, realize.recording())
            _map(buf, realize.get_buffer(new), new)
            # TinyJit replays this swap as a copy new -> buf (it gives `new` storage of its own again)
            realize.record(*realize.copy_entry(buf, new))
    else:
        _unshare(buf)
        if keep_old:
            sched.items.append(ScheduleItem(None, (w.snap, buf)))
        sched.write(buf, w.value, target=w.target, pos=w.pos, reduce=w.reduce)
        realize.execute(sched.items)
    _invalidate(buf)  # cached graph values held in this buffer, or read from it, are stale


_INVALIDATE_SCAN_LIMIT = 4096  # a bigger cache is cleared (the scan would cost more than recomputing)


def _invalidate(buf: UOp) -> None:
    """Drop the cached realized values a write to buf makes stale: those read from buf, or held in it (or in a region
    of its memory). The others stay: a chain of writes reusing one shared value (an LLM's KV-cache updates fed by
    one projection) computes it once."""
    data = realized_data
    if len(data) > _INVALIDATE_SCAN_LIMIT:
        realized_cache.clear()
        return
    for r, v in list(data.items()):
        u = r()
        if u is None:
            continue
        touched = buffers_read(u) | buffers_read(v)
        if buf in touched or any((reg := buffer_views.get(b)) is not None and reg[0] is buf for b in touched):
            data.pop(r, None)


# BUFFERs a TinyJit capture writes: its replays write their memory directly, without _unshare, so a whole-buffer
# assign never makes one of them share memory (DQN's `target.assign(online)` between jitted steps would otherwise
# have the next replay's update of `online` show through `target`)
replay_written: weakref.WeakKeyDictionary[UOp, None] = weakref.WeakKeyDictionary()

# BUFFER -> BUFFERs a whole-buffer assign made it share memory with (x.assign(y) of a realized y costs no copy)
_shared: weakref.WeakKeyDictionary[UOp, list[weakref.ReferenceType[UOp]]] = weakref.WeakKeyDictionary()


def _unshare(buf: UOp) -> None:
    """Before an in-place write to buf: if another live BUFFER still shares its memory, give buf a copy of its own
    (the other tensor keeps its values)."""
    mem = buffer_map.get(buf)
    refs = [*_shared.pop(buf, []), *(_holders.get(mem, ()) if mem is not None else ())]
    others = [o for r in refs if (o := r()) is not None and o is not buf and buffer_map.get(o) is mem]
    if mem is None or not others:
        return
    held = new_buffer_uop(buffer_device(buf), int(buf.arg), buf.dtype)
    _map(held, mem)
    buffer_map.pop(buf)
    realize.execute([ScheduleItem(None, (buf, held))])


# device Buffer object -> the BUFFER nodes the writes made name it (besides the one it was made for): a whole write
# moves new memory into a Buffer object only when no other BUFFER names it
_holders: weakref.WeakKeyDictionary[Any, list[weakref.ReferenceType[UOp]]] = weakref.WeakKeyDictionary()


def _map(u: UOp, mem: Any, *also: UOp) -> None:
    """buffer_map[u] = mem, remembering that u (and `also`, which name mem already) hold it."""
    buffer_map[u] = mem
    _holders.setdefault(mem, []).extend(weakref.ref(x) for x in (u, *also))


def _take_memory(buf: UOp, new: UOp, snap_for: Write | None) -> bool:
    """buf takes the memory its new value was computed into, keeping its device Buffer object (what
    `t.uop.base.realized` returns stays the same after `t.assign(...)`, as tinygrad's users check); the value's
    BUFFER then names that object too, and the old memory goes to the snapshot (if one is needed) or is freed.
    Not while a TinyJit captures (its replay re-creates the hand-over with a copy) or when the memory can't move."""
    old = buffer_map.get(buf)
    if old is None or realize.recording() is not None:
        return False
    if any((o := r()) is not None and o is not buf and buffer_map.get(o) is old for r in _holders.get(old, ())):
        return False  # another BUFFER names this memory object (x.assign(y) of a realized y, a snapshot): it keeps
        # what it holds now
    fresh = realize.get_buffer(new)
    if fresh is old or old.base is not old or fresh.base is not fresh or not old.is_allocated:
        return False
    if (old.dev, old.nbytes, old.options) != (fresh.dev, fresh.nbytes, fresh.options):
        return False
    old.exchange_memory(fresh)  # fresh now holds buf's old contents
    if snap_for is not None:
        _map(snap_for.snap, fresh)
    _map(new, old, buf)
    for a, b in ((buf, new), (new, buf)):  # shared until one of them is written (as a whole: _take_memory; in place:
        _shared.setdefault(a, []).append(weakref.ref(b))  # _unshare)
    realized_cache.clear()
    return True


def _hand_over(w: Write, capture: list[tuple[str, Any]] | None) -> None:
    """The buffer's old memory becomes the snapshot's (no copy)."""
    _map(w.snap, buffer_map[w.buf], w.buf)
    if capture is not None:
        _thread.capture_snaps.append((capture, len(capture), w.snap, w.buf))


_clone_ids = iter(range(1 << 62))


def _fresh() -> int:
    return -1 - next(_clone_ids)  # clone tags of their own (Tensor.clone counts up from 0)


def _whole_source(value: UOp, buf: UOp) -> UOp | None:
    """The buffer holding `value` when it is a whole, row-major realized buffer of buf's size, else None (host data
    staged into a buffer counts: its buffer is taken as it is)."""
    u = unstage(value)
    while u.op in (Ops.RESHAPE, Ops.DETACH):
        u = u.src[0]
    if u.op is Ops.BUFFER and int(u.arg) == int(buf.arg) and u.dtype == buf.dtype:
        return u
    return None


def _run_disk(w: Write) -> None:
    """DISK memory is the file: compute the value on its own device, then write the bytes through the view."""
    cls = w.cls
    value = w.value
    while value.op in (Ops.COPY,) and file_backed(str(value.arg)):
        value = value.src[0]  # a copy onto the disk: take what is copied
    # (computed where it is; a value the disk device would have to compute - a constant, a strided read of the
    # file - is computed on the host)
    data = (cls(host_graph(value), device=HOST) if needs_host(value) else cls(value, device=_device_of(value))
            ).numpy()  # fmt: skip
    writable_disk(get_buffer(w.buf))
    mem = buffer_numpy(w.buf)
    if w.target is None and w.pos is None:
        mem[:] = data.reshape(-1).view(mem.dtype)
        return
    pos_graph = w.pos if w.pos is not None else positions(w.target, w.buf, "CPU")  # type: ignore[arg-type]
    pos = cls(pos_graph, device="CPU").numpy().reshape(-1).astype(np.int64)
    vals = data.reshape(-1).view(mem.dtype)
    ok = pos > 0
    mem[pos[ok] - 1] = vals[ok]


def _device_of(u: UOp) -> str:
    return Scheduler()._device_of(u)


# ---------------- positions of a view's elements ----------------
def positions(view: UOp, buf: UOp, device: str) -> UOp:
    """A lazy int32 graph shaped like `view` (a chain of views over buf): 1 + the flat index in buf of each
    element, 0 where the view has no element (padding)."""
    nodes: list[UOp] = []
    u = view
    while u is not buf:
        nodes.append(u)
        u = u.src[0]
    p = scalar_op(Ops.ADD, _iota_uop(int(buf.arg), device), device, 1)
    for n in reversed(nodes):
        if n.op in _MOVEMENT:
            p = UOp(n.op, dtypes.int32, (p,), n.arg)
    return p


def has_broadcast(view: UOp) -> bool:
    """The view repeats elements (an expand that grows a dim): a write through it has no single meaning."""
    u = view
    while u.op is not Ops.BUFFER:
        if u.op is Ops.EXPAND and any(s != n for s, n in zip(u.src[0].shape, u.arg)):
            return True
        u = u.src[0]
    return False


def is_whole(view: UOp, buf: UOp) -> bool:
    """The view covers buf exactly in row-major order (reshapes, detach, same-size bitcasts only)."""
    u = view
    while u.op in (Ops.RESHAPE, Ops.DETACH, Ops.BITCAST):
        u = u.src[0]
    return u is buf and int(prod(view.shape)) == int(buf.arg)


# ---------------- lazy targets ----------------
def _lazy_base(t: Tensor) -> UOp | None:
    """The node of t's (lazy) view chain that a write through t must reach: the lowest one that another live
    tensor is (or is a view of). None when t shares its value with no other tensor."""
    nodes = chain(t._uop)
    if nodes[-1].op is Ops.CONST:
        return None  # a view of a lazy constant: equal constants are one graph node, not one array
    others = [c for o in live() if o is not t for c in [chain(o._uop)]]
    top = nodes[0]
    for n in reversed(nodes):
        if n is top:
            # t's own node: only tensors that view it (not other tensors that merely equal it) share it
            if any(n in c[1:] for c in others):
                return n
        elif any(c[0] is n for c in others):
            return n
    return None


def _realize_base(cls: type[Tensor], base: UOp, device: str) -> None:
    """Give a lazy value that tensors view memory of its own and rebind every tensor viewing it to the same view
    of that memory, so a write through one of them is seen by all (as with numpy arrays)."""
    holders = [o for o in live() if base in chain(o._uop)]
    view = cls(_clone(base), device=device).realize().uop
    for o in holders:
        o.uop = o._uop.substitute({base: view})


def _clone(u: UOp) -> UOp:
    """A lazy copy of u that is realized into a buffer of its own (never shared with an equal graph)."""
    return UOp(Ops.CONTIGUOUS, u.dtype, (u,), "clone", _fresh())


# ---------------- the Tensor entry points ----------------
def storable(t: Tensor, value: Any) -> None:
    """Refuse host values numpy can't store into t's dtype (setitem and assign): None anywhere, NaN, infinity or a
    float outside the range into an int tensor (x[0] = float("nan") or t.assign(1e30) stored 0 where numpy raises).
    Host values only: a Tensor value is a cast."""
    if value is None:
        raise TensorTypeError(f"can't store None into a {t.dtype} tensor; pass a number, a sequence or a Tensor")
    if not dtypes.is_int(t.dtype) or not isinstance(value, (float, np.floating, list, tuple, np.ndarray)):
        return  # (a bool tensor takes NaN as True, as numpy does)
    arr = np.asarray(value, dtype=object if isinstance(value, (list, tuple)) else None)
    if arr.dtype == object:
        if any(v is None for v in arr.flat):
            raise TensorTypeError(f"can't store None into a {t.dtype} tensor; pass numbers or a Tensor")
        if not all(isinstance(v, (bool, int, np.integer)) for v in arr.flat):
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):  # ragged or not numbers: setitem says what is wrong with it
                return
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        raise TensorValueError(f"can't store NaN or infinity into a {t.dtype} tensor (numpy refuses too: no "
                               "integer is either); replace them first (nan_to_num) or use a float tensor")  # fmt: skip
    if arr.dtype.kind == "f" and arr.size:  # (x[0] = 1e30 into int32 stored 0 where numpy raises OverflowError)
        lo, hi = dtypes.min(t.dtype), dtypes.max(t.dtype)
        whole_part = np.trunc(arr)
        if (out := (whole_part < lo) | (whole_part >= float(hi + 1))).any():
            bad = float(arr[out].flat[0])
            raise TensorOverflowError(f"can't store {bad!r} into a {t.dtype} tensor: it is outside [{lo}, {hi}] "
                                      "(numpy refuses too); clip it first or use a wider dtype")  # fmt: skip


def _value(t: Tensor, x: Any, what: str) -> Tensor:
    """x as a tensor of t's dtype and device, broadcast to `shape` (spec: dtype and device must match, a weak
    dtype is cast, non-tensors are converted)."""
    if not isinstance(x, type(t)):
        storable(t, x)
        if isinstance(x, (int, float, bool)):
            return t._const_like(x)
        if file_backed(t.device):  # (staged on the host: a buffer on the file's device would be the file itself)
            return type(t)(x, device=HOST, dtype=t.dtype).to(t.device)
        made: Tensor = type(t)(x, device=t.device, dtype=t.dtype)
        return made
    if x.dtype != t.dtype:
        # a literal's (weak) value is converted when it joins into the target's dtype (weakfloat -> float32);
        # anything else is a mismatch (weakfloat -> int8 would drop the fraction)
        if not x.dtype.is_weak or least_upper_dtype(x.dtype, t.dtype) != t.dtype:
            raise TensorTypeError(f"{what} dtype mismatch: the target is {t.dtype}, the value is {x.dtype}; cast the "
                                  f"value with .cast({t.dtype}) first")  # fmt: skip
        x = x._joined(t.dtype)
    if x.device is None:
        x = x._on_device_of(t)
    elif x.device != t.device and (_storage_only(t.device) or _storage_only(x.device)):
        x = x.to(t.device)  # to or from storage (a file, USB memory): a copy, the bytes written or read
    elif x.device != t.device:
        raise TensorValueError(f"{what} device mismatch: the target is on {t.device}, the value on {x.device}; move "
                               f"the value with .to({t.device!r}) first")  # fmt: skip
    out: Tensor = x
    return out


def _broadcast(x: Tensor, shape: tuple[Any, ...], what: str) -> Tensor:
    if x.shape == shape:
        return x
    try:
        ok = broadcast_shape(x.shape, shape) == tuple(shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise TensorValueError(f"{what}: a value of shape {x.shape} can't be broadcast to the target's shape {shape}")
    return x._broadcast_to(shape)


def _writable(t: Tensor, what: str) -> tuple[UOp, UOp]:
    """(t's view, its BUFFER) for a write through t. A broadcast view repeats elements, so a write through it has
    no single meaning: an error when another tensor views the same memory unbroadcast (an explicit expand of it);
    otherwise t is a realized constant stored compressed, and gets memory of its own first."""
    u = t.uop
    buf = view_base(u)
    assert buf is not None
    if has_broadcast(u):
        if any(o is not t and view_base(o._uop) is buf and not has_broadcast(o._uop) for o in live()):
            raise TensorValueError(f"{what} through a broadcast (expanded) view: several of its elements are one "
                                   "element of the buffer; write to the tensor that was expanded instead")  # fmt: skip
        t.uop = type(t)(_clone(u), device=t.device).realize().uop
        u = t.uop
        buf = view_base(u)
        assert buf is not None
    return u, buf


def _storage_only(device: object) -> bool:
    """A device that stores and copies but runs no kernels (DISK): data reaches it only by copies, so an assign
    from another device is one."""
    return isinstance(device, str) and (file_backed(device) or not Device[device].backend_name)


def _give_storage(t: Tensor) -> None:
    """A write target that is a literal (weak) or device-less becomes a concrete tensor first: the default dtype, on
    the default device."""
    if t.device is None or t.dtype.is_weak:
        m = t._materialized(default_device())
        t.uop, t._device = m.uop, m.device


def assign(t: Tensor, x: Any) -> Tensor:
    """Tensor.assign (see its docstring and the module docstring)."""
    if id(x) == id(t):  # self-assign: nothing changes
        return t
    if (src := RESIZED_BITCASTS.get(t.uop)) is not None:  # through a bitcast to another item size: into its source
        source = t._new(src)
        assign(source, _broadcast(_value(t, x, "assign"), t.shape, "assign").bitcast(src.dtype))
        t.uop = source.bitcast(t.dtype).uop  # (built after the write: reads the new bits)
        return t
    _give_storage(t)
    xt = _broadcast(_value(t, x, "assign"), t.shape, "assign")
    u = t.uop
    buf = view_base(u)
    if buf is None:
        base = _lazy_base(t)
        if base is None:
            t.uop = _clone(xt.uop)  # a lazy tensor that shares its value with nothing simply takes the new one
            return t
        _realize_base(type(t), base, t.device)  # views of a lazy value: give it memory the write can go through
    u, buf = _writable(t, "can't assign")
    if xt.uop is u:  # the view's own current contents (`x[i] += 1` stores x[i] back into itself): nothing to write
        return t
    value = xt.uop if xt.dtype == buf.dtype else xt.uop.bitcast(buf.dtype)
    if is_whole(u, buf) and _scatter_in_place(type(t), value, buf):
        return t
    if is_whole(u, buf):
        record(type(t), buf, value)
    else:
        record(type(t), buf, value, target=u)
    return t


def _scatter_in_place(cls: type[Tensor], value: UOp, buf: UOp) -> bool:
    """x.assign(x.scatter(...)) (scatters on top of the buffer's own contents): record the scatters as in-place
    writes instead of a copy of the whole buffer plus the scatters."""
    scatters: list[UOp] = []
    while value.op is Ops.ASSIGN and len(value.src) == 3:
        scatters.append(value)
        value = value.src[0]
    base = value
    while base.op in (Ops.RESHAPE, Ops.DETACH):
        base = base.src[0]
    if not scatters or base is not buf or base.dtype != value.dtype:
        return False
    for s in reversed(scatters):
        record(cls, buf, s.src[2], pos=s.src[1], reduce=s.arg)
    return True


def _advanced(t: Tensor, idx: Any) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, (list, np.ndarray, type(t))) for i in items)


def _row_positions(t: Tensor, idx: Any) -> Tensor | None:
    """The common `x[index_tensor] = v` on a whole buffer: the positions of the selected rows by arithmetic (a few
    ops instead of getitem's one-hot gather, which folds to the same loads but costs more to build). None for
    any other index."""
    if isinstance(idx, (list, np.ndarray)):
        arr = np.asarray(idx)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            return None
        idx = type(t)(arr.astype(np.int32), device=t.device)
    if not isinstance(idx, type(t)) or not dtypes.is_int(idx.dtype) or idx.device != t.device or t.ndim == 0:
        return None
    n0, rest = t.shape[0], tuple(t.shape[1:])
    if not isinstance(n0, int) or not all(isinstance(d, int) for d in rest):
        return None
    inner = int(prod(rest))

    w = checked(idx, "setitem", -n0, n0, 0, device=t.device).cast(dtypes.int32)
    w = (w < 0).where(w + n0, w)
    ok = w.cast(dtypes.uint32) < n0  # 0 <= w < n0 in one compare (a negative w is a huge unsigned one)
    first = ok.where(w * inner + 1, 0)  # 1-based position of each selected row's first element, 0: out of range
    if not rest:
        return first
    ones = (1,) * len(rest)
    ar = type(t).arange(inner, device=t.device).reshape(rest)
    okb = ok.reshape(*idx.shape, *ones)
    pos: Tensor = okb.where(first.reshape(*idx.shape, *ones) + ar, 0)
    return pos


def setitem(t: Tensor, idx: Any, v: Any) -> None:
    """Tensor.__setitem__: basic indices write through the view t[idx]; index tensors write the k selected
    elements with a scatter kernel (last duplicate wins) - in place for a realized t, else t becomes the merged
    value."""
    if t.dtype.is_weak:
        raise TensorTypeError(f"can't setitem on a tensor of weak dtype {t.dtype}; cast it to a concrete dtype first")
    if isinstance(t.device, tuple):
        raise ShardingError(f"setitem on a tensor sharded over {t.device} is not supported; gather it with "
                            ".to(device), write there and shard again (or build the new value and assign "
                            "it)")  # fmt: skip
    _give_storage(t)
    val = _value(t, v, "setitem")
    u = t.uop
    buf = view_base(u)
    if buf is None and file_backed(t.device):  # (a lazy copy onto a file: the file is written, then through views)
        t.realize()
        u = t.uop
        buf = view_base(u)
    if file_backed(t.device) and _advanced(t, idx):
        raise TensorNotImplementedError(
            f"setitem with index tensors or lists on {t.device} is not supported (a file is written "
            "through views: slices, ints, reshapes); move it to a device, write there and assign back"
        )
    if buf is not None and not _advanced(t, idx):
        view = t[idx]
        view.assign(_broadcast(val, view.shape, "setitem"))
        return
    if buf is None:  # an unrealized target becomes the merged value (a scatter node: computed when realized)
        n = int(prod(t.shape))
        own = (type(t)(_iota_uop(n, t.device), device=t.device) + 1).reshape(t.shape)._getitem(idx, "setitem")
        vb = _broadcast(val, own.shape, "setitem")
        t.uop = UOp(Ops.ASSIGN, t.dtype, (t.uop, own.uop, vb.uop), None)
        return
    u, buf = _writable(t, "can't setitem")
    sel = _row_positions(t, idx) if is_whole(u, buf) else None
    if sel is None:
        sel = type(t)(positions(u, buf, t.device), device=t.device)._getitem(idx, "setitem")
    vb = _broadcast(val, sel.shape, "setitem")
    value = vb.uop if vb.dtype == buf.dtype else vb.uop.bitcast(buf.dtype)
    record(type(t), buf, value, pos=sel.uop)
