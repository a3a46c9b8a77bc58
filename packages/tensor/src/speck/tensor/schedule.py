"""The scheduler: a lazy tensor-level UOp graph becomes a list of kernel ASTs (KERNEL_CONTRACT section 1).

Lowering walks from each value that must be materialised down to realized buffers, carrying an index expression per
dimension: movement ops rewrite those indices (pads add a validity gate), elementwise ops keep them, and a reduction
opens fresh REDUCE ranges. A node is materialised into its own buffer (its own kernel) when it is an explicit
CONTIGUOUS, when it is a reduction seen through a broadcast (recomputing it per broadcast element would multiply the
work) or nested inside another reduction, and when it is a large value (fusion.SHARED_FUSE_LIMIT) that another
kernel computed fused already (an unrolled recurrence's state). Everything else fuses into the kernel that consumes
it; speck.tensor.fusion holds these rules."""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from speck.codegen.kernel_info import KernelInfo
from speck.tensor.counters import GlobalCounters
from speck.tensor.device import default_device, file_backed, two_devices_error
from speck.tensor.errors import KernelCountException as KernelCountException
from speck.tensor.errors import TensorRuntimeError, TensorValueError
from speck.tensor.fusion import ELEMENTWISE as _ELEMENTWISE
from speck.tensor.fusion import MOVEMENT as _MOVEMENT
from speck.tensor.fusion import RECOMPUTE_LIMIT, FusionRules
from speck.tensor.metadata import node_metadata_data
from speck.tensor.pyutils import Metadata
from speck.uop import AxisType, Ops, UOp, dtypes, sint
from speck.uop.affine import linear_terms
from speck.uop.helpers import prod
from speck.uop.symbolic import sym_infer
from speck.uop.uop import buffers as uop_buffers

# ---------------- realized buffers ----------------
_unique_counter = itertools.count()
# BUFFER UOp -> device buffer object (speck.hcq Buffer): speck.uop's table, which UOp.buffer/realized read. Weak on
# the key: a buffer dies with the last graph using it. Never iterated: the warm realize path's keys drop their entries
# with the dict's own pop (see realize._unmap)
buffer_map: weakref.WeakKeyDictionary[UOp, Any] = uop_buffers
# tensor-level UOp -> the buffer view holding its value (so a graph realized once is not recomputed by later users)
realized_cache: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# `.contiguous()` nodes, and intermediates, a Scheduler gave a buffer of their own -> that buffer's view; when the
# kernel filling it runs (speck.tensor.realize.execute), the node goes into realized_cache, so a later realize of
# another graph holding it reads the buffer instead of computing it again (tinygrad realizes a contiguous() into a
# buffer its tensors keep)
contiguous_made: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# `.contiguous()` nodes a rewrite made for its own intermediates (speck.tensor.winograd): no later graph needs them
# read back, so they go unremembered, and a multi-target realize may place their buffers in shared memory
# (speck.tensor.engine.memory; a later realize holding one computes it again)
scratch_nodes: weakref.WeakSet[UOp] = weakref.WeakSet()
# BUFFERs over memory speck doesn't own (Tensor.from_blob): its owner may change it at any time, so no value computed
# from it is remembered (realize.remembered)
external_buffers: weakref.WeakSet[UOp] = weakref.WeakSet()
_external_data: set[weakref.ref[UOp]] = external_buffers.data  # type: ignore[attr-defined]
# Tensor(ndarray) wraps the array without copying it (tinygrad's documented behaviour): BUFFER -> the array, until the
# buffer gets its storage (realize.get_buffer copies the array in then: at the first kernel, copy or read using it,
# or when the tensor itself is realized). Writes to the array before that are seen, later ones are not.
host_arrays: weakref.WeakKeyDictionary[UOp, Any] = weakref.WeakKeyDictionary()
# realize.get_buffer, registered by realize.py (a module above this one): makes a BUFFER's storage
storage_maker: list[Callable[[UOp], Any]] = []


def take_host_array(buf: UOp) -> None:
    """Copy the array a BUFFER wraps (host_arrays) into its storage now, if it still wraps one."""
    if host_arrays and buf in host_arrays:
        storage_maker[0](buf)


# a graph -> the graphs made together with it (the gradients one backward() made): while one of them is not computed
# yet, a realize of another keeps the intermediates it computes (Scheduler.kept), which they share
sibling_graphs: weakref.WeakKeyDictionary[UOp, list[weakref.ref[UOp]]] = weakref.WeakKeyDictionary()


def add_siblings(graphs: list[UOp]) -> None:
    """Note graphs made together (autograd.backward's gradients), which are likely realized one at a time."""
    group = [weakref.ref(g) for g in graphs]
    for g in graphs:
        sibling_graphs[g] = group


def has_pending_siblings(u: UOp, computed_now: Collection[UOp] = ()) -> bool:
    """Whether a graph made together with u is alive (not computed yet: a computed one's tensor holds a buffer),
    other than those in computed_now (the other targets of the same realize)."""
    group = sibling_graphs.get(u)
    return group is not None and any((g := r()) is not None and g is not u and g not in computed_now for r in group)


def reads_external(u: UOp) -> bool:
    """u's graph reads memory speck doesn't own (an external BUFFER)."""
    if not _external_data:  # (the WeakSet's backing set: its __len__ is Python code, and this runs per realize)
        return False
    return any(n.op is Ops.BUFFER and n in external_buffers for n in u.toposort())


def _backing_dict(d: weakref.WeakKeyDictionary[UOp, Any]) -> dict[weakref.ref[UOp], Any]:
    """The dict a WeakKeyDictionary keeps its entries in, keyed by weak references (CPython's `.data`)."""
    data = getattr(d, "data", None)
    if not isinstance(data, dict):
        raise TensorRuntimeError("speck.tensor needs CPython's WeakKeyDictionary (its entries in a .data dict)")
    return data


# the dicts behind them: the per-op hot paths look keys up as `data.get(weakref.ref(u))`, which is what the
# WeakKeyDictionary methods do, without their Python frames (a UOp's plain weak reference exists already: hash-consing
# holds one, so ref(u) returns it)
buffer_map_data: dict[weakref.ref[UOp], Any] = _backing_dict(buffer_map)
realized_data: dict[weakref.ref[UOp], UOp] = _backing_dict(realized_cache)


def new_buffer_uop(device: str, size: int, dtype: Any) -> UOp:
    """A fresh BUFFER node (distinct from every other through its UNIQUE source)."""
    if (dev := _device_uops.get(device)) is None:
        dev = _device_uops[device] = UOp(Ops.DEVICE, arg=device)
    return UOp.buffer_node(dev, size, dtype, next(_unique_counter))


def device_node(device: str) -> UOp:
    """The DEVICE node of a device name (the one new_buffer_uop puts under its BUFFERs)."""
    if (dev := _device_uops.get(device)) is None:
        dev = _device_uops[device] = UOp(Ops.DEVICE, arg=device)
    return dev


def next_unique() -> Callable[[], int]:
    """The counter numbering new BUFFERs' UNIQUE nodes, as a C callable (the warm realize path calls it)."""
    return _unique_counter.__next__


# enum members and dtypes the per-op paths use, as module constants (in Python 3.11 each `Ops.X` is an attribute
# lookup through the enum's metaclass, about 70 ns)
_BUFFER, _UNIQUE, _DETACH, _COPY, _VOID = Ops.BUFFER, Ops.UNIQUE, Ops.DETACH, Ops.COPY, dtypes.void


# device name -> its DEVICE node, kept alive so making a BUFFER does not rebuild (and re-hash-cons) it every time
_device_uops: dict[str, UOp] = {}

# ops whose nodes are scheduled by the module that makes them (AFTER: speck.tensor.custom_kernel, which sits above
# this module and registers its rule when imported; making an AFTER node imports it)
_SCHEDULE_RULES: dict[Ops, Callable[[Scheduler, UOp], UOp]] = {}


def register_schedule_rule(op: Ops, rule: Callable[[Scheduler, UOp], UOp]) -> None:
    """Schedule `op` nodes with rule(scheduler, node) -> the node's buffer view (a module above the scheduler)."""
    _SCHEDULE_RULES[op] = rule


def _schedule_rule(op: Ops) -> Callable[[Scheduler, UOp], UOp]:
    if (rule := _SCHEDULE_RULES.get(op)) is None:
        raise TensorRuntimeError(f"no schedule rule for {op}: the module that makes such nodes registers one when "
                                 "imported (import speck.tensor.custom_kernel for AFTER)")  # fmt: skip
    return rule


# BUFFER -> (base BUFFER, byte offset): a buffer that is a region of another one's memory (an allreduce writes each
# reduced chunk straight into its place in the result; a DISK bitcast views a file's bytes as another dtype)
buffer_views: weakref.WeakKeyDictionary[UOp, tuple[UOp, int]] = weakref.WeakKeyDictionary()


def view_buffer_uop(base: UOp, offset: int, size: int) -> UOp:
    """A new BUFFER naming elements [offset, offset + size) of base's memory."""
    buf = new_buffer_uop(buffer_device(base), size, base.dtype)
    buffer_views[buf] = (base, offset * base.dtype.itemsize)
    return buf


def buffer_device(buf: UOp) -> str:
    return str(buf.src[1].arg)


_file_backed: dict[str, bool] = {}  # device name -> file_backed(name) (asked once per name: a kind never changes)


def _one_device(bufs: list[UOp], device: str) -> None:
    """A kernel runs on one device that runs kernels and reads only its buffers: operands on two devices (`a + b`
    with b on CPU:1) or computing on DISK are clear errors here, not a failed compile or launch later."""
    if (fb := _file_backed.get(device)) is None:
        fb = _file_backed[device] = file_backed(device)
    if fb:
        raise two_devices_error(device, device)
    for b in bufs:
        if (d := buffer_device(b)) != device:
            raise two_devices_error(device, d)


def base_buffer(u: UOp) -> UOp | None:
    """The BUFFER under a chain of movement ops, or None when u is not a pure view of a realized buffer."""
    while u.op in _MOVEMENT or u.op is _DETACH:
        u = u.src[0]
    return u if u.op is _BUFFER else None


def staged(view: UOp) -> UOp:
    """Host data (a list or numpy array) already copied into its device buffer, shown as the pending copy it is
    until realized (tinygrad: `Tensor(data).uop.is_realized` is False before `.realize()`). The marker is a COPY to
    the buffer's own device: realizing it takes the buffer itself (no kernel, no copy, no counters)."""
    bb = base_buffer(view)
    assert bb is not None, "staged() wraps a view of a BUFFER"
    dev = buffer_device(bb)
    return UOp(Ops.COPY, view.dtype, (view, UOp(Ops.DEVICE, arg=dev)), dev)


def is_staged(u: UOp) -> bool:
    """A staged() marker: a COPY of a realized buffer's view to the buffer's own device (nothing else makes one)."""
    if u.op is not _COPY:
        return False
    bb = base_buffer(u.src[0])
    return bb is not None and buffer_device(bb) == u.arg


def unstage(u: UOp) -> UOp:
    """u with a staged() marker under its movement ops replaced by the buffer view it marks (u itself otherwise):
    realizing a view of staged data is the same view of its buffer."""
    chain = []
    x = u
    while x.op in _MOVEMENT or x.op is _DETACH:
        chain.append(x)
        x = x.src[0]
    if not is_staged(x):
        return u
    out = x.src[0]
    if host_arrays:  # the tensor is realized: the array it wraps is copied in now (later writes to it are not seen)
        take_host_array(base_buffer(out))  # type: ignore[arg-type]
    for m in reversed(chain):
        out = m.replace(src=(out, *m.src[1:]))
    return out


# the ops of a node that may be a realized buffer's view or staged host data (base_buffer, unstage): any other node
# is a computation still to run
MAY_HOLD_DATA = _MOVEMENT | {Ops.DETACH, Ops.BUFFER, Ops.COPY}


# ---------------- the schedule ----------------
@dataclass
class ScheduleItem:
    """One call: a kernel `ast` over `bufs` (BUFFER UOps in PARAM slot order), or a copy (ast None, bufs=(dst, src))."""

    ast: UOp | None
    bufs: tuple[UOp, ...]
    var_vals: dict[str, int] = field(default_factory=dict)
    copy_offset: int = 0  # element offset into the source buffer of a copy
    # the Tensor ops fused into the kernel (speck.tensor.metadata; () when unknown: copies, replayed cached plans)
    metadata: tuple[Metadata, ...] = ()


def contiguous_index(idx: tuple[UOp, ...], shape: tuple[sint, ...]) -> UOp:
    """Row-major linear index of idx in shape."""
    out: UOp = UOp.const(dtypes.weakint, 0)
    stride: sint = 1
    for i, s in reversed(list(zip(idx, shape))):
        out = out + i * stride
        stride = stride * s if isinstance(stride, int) and isinstance(s, int) else _u(stride) * _u(s)
    return out


def canonical_index(x: UOp) -> UOp:
    """Rebuild an index expression as sum(term * coeff) + const (sorted terms), then simplify (skipped when every
    term is a plain range or variable: the rebuilt sum is already canonical)."""
    if x.dtype != dtypes.weakint:
        return x.simplify()
    terms, const = linear_terms(x)
    if all(t.op in (Ops.RANGE, Ops.DEFINE_VAR) for t in terms):
        out0: UOp | None = None
        for t, k in sorted(terms.items(), key=lambda tk: (str(tk[0].arg), tk[1])):
            term = t if k == 1 else t * k
            out0 = term if out0 is None else out0 + term
        if out0 is None:
            return UOp.const(dtypes.weakint, const)
        return out0 + const if const else out0
    out: UOp | None = None
    for t, k in sorted(terms.items(), key=lambda tk: (tk[0].op is not Ops.RANGE, str(tk[0].arg), tk[1])):
        term = t if k == 1 else t * k
        out = term if out is None else out + term
    if out is None:
        return UOp.const(dtypes.weakint, const)
    return (out + const if const else out).simplify()


def _u(x: sint) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.weakint, x)


def _check_bind(var_vals: dict[str, int], name: str, val: int) -> str:
    """name, after checking it is not bound to another value in the same kernel (a kernel takes one value per
    name: the two binds would silently share the last one)."""
    if var_vals.get(name, val) != val:
        raise TensorValueError(f"Variable {name!r} is bound to {var_vals[name]} and to {val} in one computation; a "
                               "kernel takes one value per name: give the Variables different names")  # fmt: skip
    return name


def _unbind_shape(x: sint, var_vals: dict[str, int]) -> sint:
    """Replace BINDs in a symbolic dim by their variables (recording the values) so kernels stay value-free."""
    if not isinstance(x, UOp):
        return x
    subs: dict[UOp, UOp] = {}
    for n in x.toposort():
        if n.op is Ops.BIND:
            var, val = n.unbind()
            var_vals[_check_bind(var_vals, var.arg[0], val)] = val
            subs[n] = var
    # simplified: 2*n and n*2 become one node, so a RANGE's end matches the one a later simplify of its users builds
    return x.substitute(subs).simplify()


def concrete_dim(x: sint, var_vals: dict[str, int] | None = None) -> int:
    """The int value of a (possibly symbolic) dim under its bound values."""
    if isinstance(x, int):
        return x
    vv = dict(var_vals or {})
    for n in x.toposort():
        if n.op is Ops.BIND:
            vv[n.src[0].arg[0]] = n.src[1].arg
    return int(sym_infer(x, vv))


def max_dim(x: sint) -> int:
    """Upper bound of a dim (used to size buffers that hold symbolic shapes)."""
    if isinstance(x, int):
        return x
    return int(_unbind_shape(x, {}).vmax)  # type: ignore[union-attr]


_REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1}
I32_MAX = 2**31 - 1


def fold_one_hot_sum(val: UOp, rngs: list[UOp], rop: Ops) -> UOp | None:
    """sum over r of (e == r ? x(r) : 0), with e not depending on r, is x(e) when 0 <= e < len(r), else 0: integer
    tensor indexing (a one-hot compare against an arange, summed) becomes one load at a computed address instead of
    a pass over the whole indexed axis (a batch drawn from a 60000-image dataset: 2.4 s -> microseconds). The
    condition may be several such compares joined by AND (several index tensors): each folds its own range."""
    if rop is not Ops.ADD or val.op is not Ops.WHERE:
        return None
    cond, x, zero = val.src
    if zero.op is not Ops.CONST or zero.arg != 0:
        return None
    conjuncts: list[UOp] = []
    stack = [cond]
    while stack:
        c = stack.pop()
        if c.op is Ops.AND and c.dtype == dtypes.bool:
            stack.extend(c.src)
        else:
            conjuncts.append(c)
    for c in conjuncts:
        if c.op is not Ops.CMPEQ:
            continue
        for e, rc in (c.src, c.src[::-1]):
            r = rc.src[0] if rc.op is Ops.CAST else rc
            if r not in rngs or r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST or not dtypes.is_int(e.dtype):
                continue
            if rc.op is Ops.CAST and rc.dtype != e.dtype or r in e.toposort():
                continue
            ok = (e < r.src[0].arg) & (e < 0).ne(True)
            at = e.cast(dtypes.weakint)
            new = x.substitute({r: at})
            # every load whose address now depends on e is gated by the bounds check (an out-of-range e reads nothing)
            gated = {
                ix: ix.replace(src=(ix.src[0], ix.src[1].valid(ok), *ix.src[2:]))
                for ix in new.toposort() if ix.op is Ops.INDEX and at in ix.src[1].toposort()
            }  # fmt: skip
            keep = ok
            for d in conjuncts:
                if d is not c:
                    keep = keep & d.substitute({r: at})
            out: UOp = keep.where(new.substitute(gated) if gated else new, zero)
            rest = [q for q in rngs if q is not r]
            if not rest:
                return out
            folded = fold_one_hot_sum(out, rest, rop)
            return folded if folded is not None else out.reduce(*rest, op=rop)
    return None


def _free_ranges(u: UOp) -> list[UOp]:
    """The RANGEs u depends on that no REDUCE inside u closes, in toposort order: the loops u's value varies over."""
    free: dict[UOp, dict[UOp, None]] = {}
    for n in u.toposort():
        if n.op is Ops.RANGE:
            free[n] = {n: None}
            continue
        acc: dict[UOp, None] = {}
        for s in n.src:
            acc.update(free.get(s, {}))
        if n.op is Ops.REDUCE:
            for r in n.src[1:]:
                acc.pop(r, None)
        free[n] = acc
    return list(free[u])


class _Kernel:
    """Builds one kernel: lowers tensor-level nodes at index expressions into a kernel value."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.serial = next(sched.kernel_serial)  # (an int, not the kernel: the scheduler holds no cycle through it)
        self.bufs: list[UOp] = []
        self.axis = itertools.count()
        self.memo: dict[tuple[Any, ...], UOp] = {}
        self.has_reduce = False
        self.reduce_dims: list[sint] = []
        self.var_vals: dict[str, int] = {}
        self.root: UOp | None = None  # the value this kernel stores (never re-materialized from inside)
        self.meta: dict[Metadata, None] = {}  # the Tensor ops of the nodes fused into this kernel, in order
        # index bounds checks met (speck.tensor.bounds): (lowered index, its validity gate) -> the CHECK node
        self.checks: dict[tuple[UOp, UOp | None], UOp] = {}

    def param(self, buf: UOp) -> UOp:
        if buf not in self.bufs:
            self.bufs.append(buf)
        size = buf.arg if isinstance(buf.arg, int) else max_dim(buf.arg)
        return UOp.param(self.bufs.index(buf), buf.dtype.ptr(size))

    def lower(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, bcast: bool, in_reduce: bool) -> UOp:
        key = (u, idx, valid, bcast, in_reduce)
        if (r := self.memo.get(key)) is not None:
            return r
        r = self._lower(u, idx, valid, bcast, in_reduce)
        self.memo[key] = r
        self.sched.lowered_in.setdefault(u, self.serial)
        # a node computed here (not read from a buffer of its own) names its Tensor op, sources first
        if node_metadata_data and (m := node_metadata_data.get(weakref.ref(u))) is not None and m not in self.meta \
                and self.sched.materialized(u) is None:  # fmt: skip
            self.meta[m] = None
        return r

    def _lower(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, bcast: bool, in_reduce: bool) -> UOp:
        op = u.op
        if op is Ops.BUFFER:
            assert len(idx) == 1, f"BUFFER indexed with {len(idx)} indices"
            i = canonical_index(idx[0])
            return UOp(Ops.LOAD, u.dtype, (self.param(u).index(i if valid is None else i.valid(valid)),))
        if (view := self.sched.materialized(u)) is not None:
            return self.lower(view, idx, valid, bcast, in_reduce)
        if u is not self.root and self.sched.shared_reduce(u):
            # fusing a value with several consumers that contains a reduction would redo the reduction in each
            return self.lower(self.sched.materialize(u), idx, valid, bcast, in_reduce)
        if op is Ops.CONST:
            return UOp.const(u.dtype, u.arg)
        if op is Ops.BIND:
            var, bound = u.unbind()
            self.var_vals[_check_bind(self.var_vals, var.arg[0], bound)] = bound
            return var.cast(u.dtype) if u.dtype != var.dtype else var
        if op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN, Ops.AFTER) or (op is Ops.REDUCE_AXIS and (bcast or in_reduce)):
            view = self.sched.materialize(u)
            return self.lower(view, idx, valid, bcast, in_reduce)
        if op in (Ops.DETACH,):
            return self.lower(u.src[0], idx, valid, bcast, in_reduce)
        if op is Ops.CHECK:  # the index itself; the check becomes a guarded store of this kernel (check_effects)
            v = self.lower(u.src[0], idx, valid, bcast, in_reduce)
            self.checks.setdefault((v, valid), u)
            return v
        if op in _ELEMENTWISE:
            if u is not self.root and self.sched.recomputed_large(u, self.serial):
                self.sched.disown(u)  # (the kernel materializing u computes its graph afresh, not again)
                return self.lower(self.sched.materialize(u), idx, valid, bcast, in_reduce)
            # (float values only: an integer index and its bool compare are what fold_one_hot_sum turns into a
            # direct load)
            if bcast and in_reduce and dtypes.is_float(u.dtype) and self.sched.recompute_cost(u) >= RECOMPUTE_LIMIT:
                # a reduction reads each element of an expanded (broadcast or windowed) value many times: compute
                # a costly elementwise value once into a buffer rather than once per read
                return self.lower(self.sched.materialize(u), idx, valid, bcast, in_reduce)
            srcs = tuple(self.lower(s, idx, valid, bcast, in_reduce) for s in u.src)
            return UOp(op, u.dtype, srcs, u.arg)
        if op is Ops.REDUCE_AXIS:
            rop, axes = u.arg
            in_shape = u.src[0].shape
            nidx: list[UOp] = list(idx)
            rngs: list[UOp] = []
            for a in axes:
                end = _unbind_shape(in_shape[a], self.var_vals)
                r = UOp.range(end, next(self.axis), AxisType.REDUCE)
                rngs.append(r)
                self.reduce_dims.append(in_shape[a])
                nidx[a] = r
            self.has_reduce = True
            val = self.lower(u.src[0], tuple(nidx), valid, False, True)
            if (direct := fold_one_hot_sum(val, rngs, rop)) is not None:
                return direct
            return val.reduce(*rngs, op=rop)
        if op in _MOVEMENT:
            return self._movement(u, idx, valid, bcast, in_reduce)
        raise TensorRuntimeError(f"scheduler can't lower a {op} node (dtype {u.dtype}); this is a bug in speck.tensor")

    def check_effects(self, live: list[UOp]) -> list[UOp]:
        """The kernel's bounds checks as effects beside its store: where an index is out of range and the record is
        still empty (read once per kernel run: the first violation recorded stays), (op, index, low, high, dim)
        goes into the device's record buffer. Each check sits in the kernel's loop nest (placed in the loops its index
        depends on); an index read inside a reduction gets loops of its own over copies of the reduced ranges (a
        range has exactly one END)."""
        out: list[UOp] = []
        zero = UOp.const(dtypes.weakint, 0)
        for (v, valid), c in self.checks.items():
            _, low, high, _, allow = c.arg
            dt = v.dtype
            bad: UOp | None = None
            if low > dtypes.min(dt):
                bad = v < UOp.const(dt, low)
            if high <= dtypes.max(dt):
                over = v >= UOp.const(dt, high)
                bad = over if bad is None else bad | over
            if bad is None:
                continue
            if allow is not None and dtypes.min(dt) <= allow <= dtypes.max(dt):
                bad = bad & v.ne(UOp.const(dt, allow))
            if valid is not None:
                bad = bad & valid
            rec = self.param(c.src[1])
            bad = bad & UOp(Ops.LOAD, dtypes.int32, (rec.index(zero),)).eq(UOp.const(dtypes.int32, 0))
            used = _free_ranges(bad)  # (a range an inner REDUCE closes, e.g. an argmax index's, is not a loop here)
            inner = {r: UOp.range(r.src[0], next(self.axis), AxisType.LOOP) for r in used if r not in live}
            if inner:
                bad, v = bad.substitute(inner), v.substitute(inner)
            # the record's int32 slots: op code, the index found, low, high, dim
            code, _, _, dim, _ = c.arg
            vals = [UOp.const(dtypes.int32, x) for x in (code, low, high, dim)]
            i32 = v
            if dtypes.max(dt) > I32_MAX:  # a wider index is recorded clamped to int32 (the message says "or more")
                i32 = i32.minimum(UOp.const(dt, I32_MAX))
            if dtypes.min(dt) < -I32_MAX - 1:
                i32 = i32.maximum(UOp.const(dt, -I32_MAX - 1))
            vals.insert(1, i32.cast(dtypes.int32))
            eff = UOp.group(*[rec.index(UOp.const(dtypes.weakint, j).valid(bad)).store(x) for j, x in enumerate(vals)])
            if inner:
                eff = eff.end(*inner.values())
            # in the store's own loop nest (the linearizer merges ENDs of one range; a subset would be a second nest)
            out.append(eff.end(*live) if live else eff)
        return out

    def _movement(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, bcast: bool, in_reduce: bool) -> UOp:
        op, src = u.op, u.src[0]
        vv = self.var_vals
        if op is Ops.RESHAPE:
            if src.op is Ops.NOOP and src.arg == "iota":
                return idx[0].cast(src.dtype)  # (int64 for an iota longer than int32 can count)
            new_shape = tuple(_unbind_shape(s, vv) for s in u.arg)
            if src.op is Ops.BUFFER:
                return self.lower(src, (contiguous_index(idx, new_shape),), valid, bcast, in_reduce)
            old_shape = tuple(_unbind_shape(s, vv) for s in src.shape)
            nidx = _reshape_index(idx, new_shape, old_shape)
            return self.lower(src, nidx, valid, bcast, in_reduce)
        if op is Ops.PERMUTE:
            nidx_l: list[UOp] = [idx[0]] * len(idx)
            for j, p in enumerate(u.arg):
                nidx_l[p] = idx[j]
            return self.lower(src, tuple(nidx_l), valid, bcast, in_reduce)
        if op is Ops.EXPAND:
            ss = src.shape
            nidx = tuple(
                UOp.const(dtypes.weakint, 0) if (isinstance(s, int) and s == 1 and not (isinstance(n, int) and n == 1))
                else i for i, s, n in zip(idx, ss, u.arg)
            )  # fmt: skip
            grew = any(isinstance(s, int) and s == 1 and n != 1 for s, n in zip(ss, u.arg))
            return self.lower(src, nidx, valid, bcast or grew, in_reduce)
        if op is Ops.SHRINK:
            nidx = tuple(i + _unbind_shape(b, vv) if not (isinstance(b, int) and b == 0) else i
                         for i, (b, _) in zip(idx, u.arg))  # fmt: skip
            return self.lower(src, nidx, valid, bcast, in_reduce)
        if op is Ops.FLIP:
            ss = src.shape
            nidx = tuple((_unbind_shape(s, vv) - 1 - i) if f else i for i, s, f in zip(idx, ss, u.arg))
            return self.lower(src, nidx, valid, bcast, in_reduce)
        if op is Ops.PAD:
            ss = src.shape
            conds: list[UOp] = []
            pidx: list[UOp] = []
            for i, s, (b, a) in zip(idx, ss, u.arg):
                if isinstance(b, int) and isinstance(a, int) and b == 0 and a == 0:
                    pidx.append(i)
                    continue
                before = not (isinstance(b, int) and b == 0)
                ni = i - _unbind_shape(b, vv) if before else i
                pidx.append(ni)
                if before:
                    conds.append(ni >= 0)
                conds.append(ni < _unbind_shape(s, vv))
            if not conds:
                return self.lower(src, tuple(pidx), valid, bcast, in_reduce)
            cond = conds[0]
            for c in conds[1:]:
                cond = cond & c
            cond = cond.simplify()
            if cond.op is Ops.CONST:
                if cond.arg:
                    return self.lower(src, tuple(pidx), valid, bcast, in_reduce)
                return UOp.const(u.dtype, 0)
            nvalid = cond if valid is None else (valid & cond)
            inner = self.lower(src, tuple(pidx), nvalid, bcast, in_reduce)
            return cond.where(inner, UOp.const(u.dtype, 0))
        raise AssertionError(op)


def _reshape_index(idx: tuple[UOp, ...], new_shape: tuple[sint, ...], old_shape: tuple[sint, ...]) -> tuple[UOp, ...]:
    """Indices into old_shape for the element at idx of the reshaped tensor (through the flat row-major position).
    Leading/trailing size-1 dims are matched directly so common reshapes stay free of div/mod."""
    if tuple(s for s in new_shape if s != 1) == tuple(s for s in old_shape if s != 1):
        kept = [i for i, s in zip(idx, new_shape) if s != 1]
        out = []
        for s in old_shape:
            out.append(UOp.const(dtypes.weakint, 0) if s == 1 else kept.pop(0))
        return tuple(out)
    flat = contiguous_index(idx, new_shape).simplify()
    out2: list[UOp] = []
    stride: sint = 1
    for s in reversed(old_shape):
        if isinstance(s, int) and s == 1:
            out2.append(UOp.const(dtypes.weakint, 0))
        else:
            out2.append(((flat // stride) % s).simplify())
        stride = stride * s if isinstance(stride, int) and isinstance(s, int) else _u(stride) * _u(s)
    return tuple(reversed(out2))


def _kernel_name(reduce: bool, shape: tuple[sint, ...], rdims: list[sint]) -> str:
    dims = "_".join(str(s) if isinstance(s, int) else "n" for s in shape) or "1"
    if reduce:
        return "r_" + dims + "_" + "_".join(str(s) if isinstance(s, int) else "n" for s in rdims)
    return "E_" + dims


class Scheduler(FusionRules):
    """Turns tensor-level UOps into ScheduleItems. `realize(u)` returns the buffer view that will hold u's value.

    `custom` maps the type of a CONTIGUOUS node's arg to a function (scheduler, node) -> view that schedules that
    node itself (speck.tensor.allreduce registers the allreduce of sharded tensors)."""

    custom: dict[type, Any] = {}

    def __init__(self, device: str | None = None) -> None:
        self.items: list[ScheduleItem] = []
        self.device = device  # where new buffers go when the graph itself names no device
        self.done: dict[UOp, UOp] = {}
        self.target: UOp | None = None  # the node realize() was last asked for (its caller remembers it)
        self.kept: list[tuple[UOp, UOp]] = []  # the intermediates put in contiguous_made, with their views
        # keep intermediates for later realizes (only while a graph made with the target is still to be read: an
        # intermediate kept is one the memory planner can't share, so a training step keeping all of them touched
        # and held 2.5x the fresh memory)
        self.keep = False
        super().__init__()
        self.kernel_serial = itertools.count()

    def forget(self, k: _Kernel) -> None:
        """Kernel k was dropped unscheduled: the nodes it computed first count as not computed."""
        for key in k.memo:
            if self.lowered_in.get(key[0]) == k.serial:
                del self.lowered_in[key[0]]

    def materialized(self, u: UOp) -> UOp | None:
        if (v := self.done.get(u)) is not None:
            return v
        return realized_cache.get(u)

    def realize(self, u: UOp) -> UOp:
        """Schedule u (if needed) and return a view over realized buffers with u's shape and value."""
        if base_buffer(u) is not None:
            return u
        if (v := self.materialized(u)) is not None:
            return v
        if (v := unstage(u)) is not u:
            return v
        self.count_uses(u)
        self.target = u
        if u.op is Ops.RESHAPE and u.src[0].op is Ops.CONTIGUOUS and type(u.src[0].arg) in self.custom:
            return self.materialize(u.src[0]).reshape(u.shape)  # (a reshaped allreduce result: its buffer, viewed)
        return self.materialize(u)

    def materialize(self, u: UOp, into: UOp | None = None) -> UOp:
        """Schedule u into a buffer of its own (or into the given BUFFER `into`, of u's size) and return the view
        holding its value."""
        if (v := self.materialized(u)) is not None:
            return v if into is None else self._copy_into(v, into)
        if u.op is Ops.CONTIGUOUS and (custom := self.custom.get(type(u.arg))) is not None:
            assert into is None, "custom nodes choose their own buffers"
            view: UOp = custom(self, u)
            return view
        src = unstage(u.src[0]) if u.op is Ops.CONTIGUOUS else u
        # a contiguous view of a realized buffer (reshape, contiguous shrink) is free
        if (
            u.op is Ops.CONTIGUOUS
            and u.arg != "clone"
            and into is None
            and base_buffer(src) is not None
            and view_offset(src) is not None
        ):
            self.done[u] = src
            return src
        if u.op is Ops.CONTIGUOUS and u.arg != "clone" and (v := self.materialized(src)) is not None:
            self.done[u] = v if into is None else self._copy_into(v, into)
            return self.done[u]
        if u.op is Ops.COPY:
            return self._copy(u, into)
        if u.op is Ops.CONTIGUOUS and u.arg != "clone" and src.op is Ops.COPY and into is None:
            # a copy lands in a fresh row-major buffer already: no kernel (assign from another device needs none)
            self.done[u] = v = self.materialize(src)
            return v
        if u.op is Ops.ASSIGN:
            return self._scatter(u)
        if u.op is Ops.AFTER:  # an argument after a custom kernel ran on it: the kernel gets a schedule item
            if u.src[1].op is not Ops.KERNEL:  # `x.after(*deps)`: x's value, once the dependencies are computed
                for dep in u.src[1:]:
                    if dep.op is Ops.STORE and dep.src[0].has_shape:  # `x.after(x.store(v))`: write v into x first
                        self._store(dep)
                    elif dep.has_shape:
                        self.realize(dep)
                v = self.done[u] = self.realize(u.src[0])
            else:
                v = _schedule_rule(u.op)(self, u)
            return v if into is None else self._copy_into(v, into)
        shape = u.shape
        device = self.device if self.device is not None else self._device_of(u)
        size = prod(max_dim(s) for s in shape)
        out = into if into is not None else new_buffer_uop(device, int(size), u.dtype)
        view = out.reshape(shape) if shape != (size,) else out
        if size != 0:
            self.cut_deep(src)
            k = _Kernel(self)
            k.root = src
            k.bufs.append(out)  # the output takes slot 0
            kshape = tuple(_unbind_shape(s, k.var_vals) for s in shape)
            rngs = [
                UOp.range(s, next(k.axis), AxisType.GLOBAL) if not (isinstance(s, int) and s == 1) else None
                for s in kshape
            ]
            idx = tuple(r if r is not None else UOp.const(dtypes.weakint, 0) for r in rngs)
            val = k.lower(src, idx, None, False, False)
            store = k.param(out).index(canonical_index(contiguous_index(idx, kshape))).store(val)
            live = [r for r in rngs if r is not None]
            effects = k.check_effects(live) if k.checks else []
            ast = UOp.sink(store.end(*live), *effects,
                           arg=_kernel_info(_kernel_name(k.has_reduce, shape, k.reduce_dims)))  # fmt: skip
            item_vals: dict[str, int] = {}
            if k.var_vals:
                kernel_vars = {v.arg[0] for v in ast.variables()}
                item_vals = {k_: v_ for k_, v_ in k.var_vals.items() if k_ in kernel_vars}
            _one_device(k.bufs, buffer_device(k.bufs[0]))
            self.items.append(ScheduleItem(ast, tuple(k.bufs), item_vals, metadata=tuple(k.meta)))
        self.done[u] = view
        if self.keep and into is None and u is not self.target and u.op is not Ops.CONTIGUOUS:
            # an intermediate with a kernel of its own: once it has run, later realizes of other graphs holding u
            # (the other gradients of one backward, read one at a time) read its buffer instead of computing it
            # again; the entry (and the buffer) goes when the last graph holding u dies, or a write makes it stale
            contiguous_made[u] = view
            self.kept.append((u, view))
        if u.op is Ops.CONTIGUOUS and u.arg != "clone":
            # the buffer holds src's value too: a consumer reading src directly must not compute it again
            self.done[src] = view
            if u.arg is None and into is None and u not in scratch_nodes:
                contiguous_made[u] = view  # a user's .contiguous(): later realizes read it (once it has run)
        return view

    def _copy_into(self, v: UOp, into: UOp) -> UOp:
        """A value already scheduled (view v), copied into the BUFFER `into` on its device."""
        off, bb = view_offset(v), base_buffer(v)
        if off is None or bb is None:
            return self.materialize(UOp(Ops.CONTIGUOUS, v.dtype, (v,), "clone", next(_unique_counter)), into)
        if int(into.arg):
            self.items.append(ScheduleItem(None, (into, bb), copy_offset=off))
        return into.reshape(v.shape) if v.shape != (into.arg,) else into

    def _scatter(self, u: UOp) -> UOp:
        """ASSIGN(base, pos, value, arg=reduce): base's value with value's elements stored (or combined) at the
        positions pos holds, in index order: a fresh buffer gets base's value, then a scatter kernel writes it."""
        base, pos, value = u.src
        view = self.materialize(UOp(Ops.CONTIGUOUS, base.dtype, (base,), "clone", ("scatter", id(u))))
        out = base_buffer(view)
        assert out is not None and view_offset(view) == 0
        self.write(out, value, pos=pos, reduce=u.arg, op_meta=node_metadata_data.get(weakref.ref(u)))
        self.done[u] = view
        return view

    def _store(self, st: UOp) -> None:
        """A tensor-level STORE(target, value): value written through the view `target` of a realized buffer."""
        target, value = st.src[0], st.src[1]
        while target.op is Ops.AFTER:
            target = target.src[0]
        buf = base_buffer(target)
        if buf is None:
            raise TensorRuntimeError(f"STORE: the target must be (a view of) a realized buffer, got a {target.op} "
                                     "computation; realize it first")  # fmt: skip
        if value.shape != target.shape or value.dtype != target.dtype:
            raise TensorRuntimeError(f"STORE: value {value.shape} {value.dtype} doesn't match the target "
                                     f"{target.shape} {target.dtype}; broadcast and cast it first")  # fmt: skip
        self.write(buf, value, target=target)
        realized_cache.clear()  # values computed from buf's old contents are stale

    def write(self, buf: UOp, value: UOp, target: UOp | None = None, pos: UOp | None = None,
              reduce: str | None = None, op_meta: Metadata | None = None) -> None:  # fmt: skip
        """Schedule a kernel that stores `value` into the realized `buf` in place: through the view chain `target`
        over buf (parallel: a view without broadcasts writes each element once), or at the 1-based positions `pos`
        (0: skip) in index order on one thread (so the last duplicate wins), combining with the old contents when
        `reduce` names a SCATTER_REDUCE op (`op_meta`: the Tensor op the write implements, first in the kernel's
        metadata). Values that read buf at another place than they write are computed
        into a buffer of their own first, so no element is read after this kernel overwrote it."""
        shape = value.shape
        if any(isinstance(s, int) and s == 0 for s in shape):
            return
        for src_first in (False, True):
            if src_first:
                value = self.materialize(UOp(Ops.CONTIGUOUS, value.dtype, (value,), "clone", ("wsrc", id(value))))
                if pos is not None and buf in _loaded_params(self, pos, buf):
                    pos = self.materialize(UOp(Ops.CONTIGUOUS, pos.dtype, (pos,), "clone", ("wpos", id(pos))))
            k = _Kernel(self)
            k.bufs.append(buf)  # the written buffer takes slot 0
            kshape = tuple(_unbind_shape(s, k.var_vals) for s in shape)
            axis = AxisType.GLOBAL if pos is None else AxisType.LOOP
            rngs = [UOp.range(s, next(k.axis), axis) if not (isinstance(s, int) and s == 1) else None for s in kshape]
            idx = tuple(r if r is not None else UOp.const(dtypes.weakint, 0) for r in rngs)
            param = k.param(buf)
            if target is not None:
                loads = [n for n in k.lower(target, idx, None, False, False).toposort() if n.op is Ops.LOAD]
                assert len(loads) == 1 and loads[0].src[0].src[0] is param, "a write target must be a view of buf"
                at = loads[0].src[0]
            else:
                assert pos is not None
                p = k.lower(pos, idx, None, False, False)
                a = p.cast(dtypes.weakint) - 1
                at = param.index(a.valid((p > 0) & (a < int(buf.arg))))
            val = k.lower(value, idx, None, False, False)
            own = [n for n in val.toposort() if n.op is Ops.INDEX and n.src[0] is param]
            if target is not None and pos is None:
                clash = any(n is not at for n in own)  # reading exactly the element this thread writes is fine
            else:
                clash = bool(own) or any(n.op is Ops.INDEX and n.src[0] is param for n in at.src[1].toposort())
            if clash and not src_first:
                self.forget(k)
                continue
            assert not clash, "a write's value still reads the written buffer after it was copied"
            if reduce is not None:
                val = _COMBINE[reduce](UOp(Ops.LOAD, buf.dtype, (at,)), val)
            store = at.store(val)
            live = [r for r in rngs if r is not None]
            name = ("S_" if pos is not None else "W_") + "_".join(str(s) if isinstance(s, int) else "n" for s in shape)
            effects = k.check_effects(live) if k.checks else []
            ast = UOp.sink(store.end(*live), *effects, arg=_kernel_info(name))
            item_vals: dict[str, int] = {}
            if k.var_vals:
                kernel_vars = {v.arg[0] for v in ast.variables()}
                item_vals = {k_: v_ for k_, v_ in k.var_vals.items() if k_ in kernel_vars}
            meta = tuple(k.meta) if op_meta is None else (op_meta, *[m for m in k.meta if m != op_meta])
            _one_device(k.bufs, buffer_device(k.bufs[0]))
            self.items.append(ScheduleItem(ast, tuple(k.bufs), item_vals, metadata=meta))
            return

    def _copy(self, u: UOp, into: UOp | None = None) -> UOp:
        if into is None and is_staged(u):
            if host_arrays:
                take_host_array(base_buffer(u.src[0]))  # type: ignore[arg-type]
            self.done[u] = u.src[0]
            return u.src[0]
        outer, self.device = self.device, self._device_of(u.src[0])
        try:
            src_view = self.realize(u.src[0])
        finally:
            self.device = outer
        off = view_offset(src_view)
        if off is None:
            outer, self.device = self.device, self._device_of(u.src[0])
            try:
                src_view = self.materialize(UOp(Ops.CONTIGUOUS, src_view.dtype, (src_view,)))
            finally:
                self.device = outer
            off = view_offset(src_view)
            assert off is not None
        bb = base_buffer(src_view)
        assert bb is not None
        shape = u.shape
        size = int(prod(max_dim(s) for s in shape))
        out = into if into is not None else new_buffer_uop(str(u.arg), size, u.dtype)
        if size:
            self.items.append(ScheduleItem(None, (out, bb), copy_offset=off))
        view = out.reshape(shape) if shape != (size,) else out
        self.done[u] = view
        return view

    def _device_of(self, u: UOp) -> str:
        for n in u.toposort(gate=lambda x: x.op not in (Ops.BUFFER, Ops.COPY)):
            if n.op is Ops.BUFFER:
                return buffer_device(n)
            if n.op is Ops.COPY:
                return str(n.arg)
            if n.op is Ops.DEVICE:
                return str(n.arg)
        return default_device()


# how a scatter combines the element already in the buffer (a) with the scattered value (b)
_COMBINE: dict[str, Any] = {
    "sum": lambda a, b: a + b,
    "prod": lambda a, b: a * b,
    "amax": lambda a, b: a.maximum(b),
    "amin": lambda a, b: a.minimum(b),
}


def _loaded_params(sched: Scheduler, u: UOp, buf: UOp) -> set[UOp]:
    """The BUFFERs a lazy graph reads directly (not through values already materialized)."""
    return {n for n in u.toposort(gate=lambda x: sched.materialized(x) is None) if n.op is Ops.BUFFER}


def _kernel_info(name: str) -> Any:
    """codegen's KernelInfo (the SINK arg it expects)."""
    return KernelInfo(name=name)


def view_offset(u: UOp) -> int | None:
    """Element offset when u is a contiguous (row-major, no gaps) view of its base buffer, else None."""
    bb = base_buffer(u)
    if bb is None:
        return None
    if u is bb:
        return 0
    x = u
    while x.op in (Ops.RESHAPE, Ops.DETACH):
        x = x.src[0]
    if x is bb:
        return 0  # only reshapes: the buffer itself, row-major (the common case: no index math to build)
    shape = u.shape
    if not all(isinstance(s, int) for s in shape):
        return None
    k = _Kernel(Scheduler())
    rngs = tuple(
        UOp.range(s, i, AxisType.GLOBAL) if s != 1 else UOp.const(dtypes.weakint, 0) for i, s in enumerate(shape)
    )
    try:
        val = k.lower(u, rngs, None, False, False)
    except RuntimeError:
        return None
    if val.op is not Ops.LOAD or len(val.src[0].src) != 2:
        return None
    terms, const = linear_terms(val.src[0].src[1] - contiguous_index(rngs, shape))
    return const if not terms else None


def _chain(u: UOp) -> Iterator[UOp]:
    while u.op in _MOVEMENT:
        yield u
        u = u.src[0]


# ---------------- kernel counting for tests ----------------
@contextlib.contextmanager
def assert_kernel_count(n: int) -> Iterator[None]:
    """Context manager: the block must run exactly n kernels (raises KernelCountException(expected, got))."""
    before = GlobalCounters.kernel_count
    yield
    got = GlobalCounters.kernel_count - before
    if got != n:
        raise KernelCountException(n, got)
