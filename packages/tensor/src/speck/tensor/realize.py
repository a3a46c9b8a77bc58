"""Realizing: schedules become plans, plans run through speck.hcq's runner.

Every path to a device goes through here, top to bottom:
1. `lower(item)`: a ScheduleItem becomes one call of speck.hcq.runner (an Exec of the kernel's compiled program, a
   Copy, or - where codegen can't compile a kernel and SPECK_NUMPY_FALLBACK=1 - a Host call of codegen's reference
   interpreter) over the item's BUFFERs. Programs come from the program cache, compiled once per (device, AST).
2. `link(entries)`: calls over BUFFERs become one Plan over numbered slots, and the BUFFERs bound to the slots.
3. `execute(items)`: lower, link, record for a TinyJit capture, and run through the runner.
The warm path (`realize_graph`) runs the Plan cached for a graph's structure on new buffers, and a TinyJit replay
runs the Plan of its capture: all three differ only in where the buffers come from."""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from sys import getrefcount as _getrefcount
from typing import Any
from weakref import getweakrefs as _getweakrefs
from weakref import ref as _ref

import numpy as np

from speck.codegen.errors import CompileRefused
from speck.codegen.interpret import eval_ast
from speck.codegen.kernel_info import kernel_name
from speck.codegen.numeric import storage_np
from speck.codegen.program import gc_paused
from speck.hcq import Buffer as _HcqBuffer
from speck.hcq import Device
from speck.hcq import runner as _runner
from speck.hcq.allocator import SpareBuffers
from speck.hcq.counters import COUNTS
from speck.hcq.runner import Copy, Exec, Host, Plan
from speck.hcq.settings import LRU as _KEEP_FREED
from speck.tensor.engine.memory import plan_memory
from speck.tensor.errors import DeviceUsageError as DeviceUsageError
from speck.tensor.errors import TensorRuntimeError, TensorValueError
from speck.tensor.metadata import node_metadata_data
from speck.tensor.schedule import (
    ScheduleItem,
    Scheduler,
    base_buffer,
    buffer_device,
    buffer_map,
    buffer_map_data,
    buffer_views,
    contiguous_made,
    device_node,
    has_pending_siblings,
    host_arrays,
    next_unique,
    reads_external,
    realized_cache,
    sibling_graphs,
    storage_maker,
)
from speck.tensor.schedule_cache import CachedSchedule, cached_plan, schedule_with_cache
from speck.tensor.schedule_cache import _get as _plan_get
from speck.tensor.schedule_cache import _newest as _plan_newest
from speck.tensor.schedule_cache import _touch as _plan_touch
from speck.tensor.settings import (
    ALLOW_DEVICE_USAGE,
    CAPTURING,
    COMPILE_THREADS,
    MAX_BUFFER_SIZE,
    NUMPY_FALLBACK,
    NUMPY_FALLBACK_LIMIT,
    PLAN_MEMORY,
    PROGRAM_CACHE,
    SCACHE,
    USE_CODEGEN,
)
from speck.uop import DEBUG, GroupOp, Ops, UOp
from speck.uop.helpers import prod
from speck.uop.symbolic import sym_infer


# ---------------- buffers ----------------
def get_buffer(buf: UOp) -> Any:
    """The hcq Buffer behind a BUFFER UOp (created on first use)."""
    b = buffer_map_data.get(_ref(buf))
    if b is None:
        if (region := buffer_views.get(buf)) is not None:  # a region of another buffer's memory
            base, offset = region
            b = get_buffer(base).view(int(buf.arg), buf.dtype, offset)
        else:
            dev = buffer_device(buf)  # speck dtype below: what codegen's BufferArgs name
            if MAX_BUFFER_SIZE.value:
                check_buffer_size(int(buf.arg), buf.dtype, dev)
            b = _HcqBuffer(dev, int(buf.arg), buf.dtype, _file_options(dev))
            if host_arrays and (arr := host_arrays.pop(buf, None)) is not None:  # Tensor(ndarray): its data, now
                b.copyin(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        buffer_map[buf] = b
    return b


storage_maker.append(get_buffer)


def check_buffer_size(n: int, dtype: Any, device: str) -> None:
    if n > (limit := int(MAX_BUFFER_SIZE.value)) > 0:
        raise TensorValueError(f"a buffer of {n} {dtype} elements on {device} is larger than MAX_BUFFER_SIZE={limit}; "
                               "raise MAX_BUFFER_SIZE (0: no limit) or compute in smaller pieces")  # fmt: skip


def attach_storage(view: UOp) -> None:
    """Give the BUFFER a realized view reads its hcq Buffer now if it has none yet (a Tensor.empty's, a region of
    another buffer's memory), so `t.uop.buffer` (which only reads speck.uop's table, buffer_map) finds it."""
    if (b := view.base).op is Ops.BUFFER and _ref(b) not in buffer_map_data:
        get_buffer(b)


_buffer_node, _next_unique = UOp.buffer_node, next_unique()
# the largest fresh buffer (bytes) a warm plan keeps from one run to the next (speck.hcq.allocator.SpareBuffers): a
# small op's output Buffer and allocation cost more than its kernel; a big one's memory is not kept beside the LRU
SPARE_MAX_BYTES = 1 << 16
_OUT: Any = object()  # (marks the output's place among a warm plan's fresh buffers: its spare is its node)
# the death callback of a warm output's buffer_map key: the dict's own pop (C, no Python frame per op) rather than
# WeakKeyDictionary's remove. Safe because only the dict and the warm plan's kept (node, key) pair hold that weak
# reference (TinyJit's _stored_key and a plan's noted input keys keep those carrying buffer_map's own callback, not
# this one), so it fires only while it is the entry's key, and nothing iterates buffer_map (a removal during
# WeakKeyDictionary iteration is what its remove defers). The pair lets the next run find the entry by the key itself;
# as _unmap raises for an entry already gone, the key must never outlive its node once the entry was dropped by hand:
# a dropped pair frees the key first (a tuple drops its items last to first; a failed check clears `key` before
# `out`), so such a key dies before the node, its callback never run.
_unmap = buffer_map_data.pop


def _tolerant_key(b: UOp) -> Any:
    """The weak reference buffer_map's dict holds as b's key when it carries buffer_map's own removal callback (which
    tolerates an entry already gone, so a warm plan may keep it between runs), else None."""
    if (remove := _remove) is None:
        return None
    for r in _getweakrefs(b):
        if r.__callback__ is remove:
            return r
    return None


_remove = getattr(buffer_map, "_remove", None)


def _file_options(device: str) -> Any:
    """A file-backed tensor's existing file is mapped read-only: reading never changes it, and a file shorter than the
    tensor (truncated since it was opened) is an error, not extended with zeros. A file the tensor creates is mapped
    read-write. Writes (`.to("disk:...")`, assign) map the file read-write first (Buffer.make_writable; the runner
    does it before a copy into a file-backed buffer). None for devices that are not file-backed."""
    if not Device[device].file_backed:
        return None
    from speck.hcq import BufferOptions

    return BufferOptions(writable=not os.path.exists(device.partition(":")[2]))


def writable_disk(b: Any) -> None:
    """Before a write into a file-backed buffer b: its file mapped read-write (speck.hcq's Buffer.make_writable)."""
    b.make_writable()


def host_array(b: Any, dtype: Any) -> np.ndarray:
    """A flat numpy view (zero-copy on host-visible devices) of an hcq Buffer's memory as `dtype`."""
    b.ensure_allocated()
    arr = b.numpy()
    out: np.ndarray = arr.view(storage_np(dtype)) if arr.dtype != np.dtype(storage_np(dtype)) else arr
    return out


def buffer_numpy(buf: UOp) -> np.ndarray:
    """A flat numpy view (zero-copy on host-visible devices) of a BUFFER's memory."""
    return host_array(get_buffer(buf), buf.dtype)


# ---------------- programs ----------------
# SPECK_NUMPY_FALLBACK=1: when codegen can't compile a kernel, run it through the reference interpreter instead of
# raising. Off by default so a codegen gap is a visible error, never a silently slow (or differently rounded) result.


class Kernel:
    """A kernel AST compiled and loaded on a device: its hcq Program, the PARAM slots it takes in argument order (a
    load folded to a constant drops its param), the slots it stores to, and codegen's estimates."""

    def __init__(self, spec: Any, prog: Any, ast: UOp) -> None:
        self.spec, self.prog, self.name, self.ast = spec, prog, spec.name, ast
        self.slots: tuple[int, ...] = tuple(int(a.slot) if hasattr(a, "slot") else int(a[0]) for a in spec.buffers)
        written = _kernel_writes(ast)
        self.writes = frozenset(j for j, s in enumerate(self.slots) if s in written)
        self.var_names = tuple(v.arg[0] if isinstance(v, UOp) else v[0] for v in spec.vars)
        e = spec.estimates
        self.ops: Any = e.ops if e is not None else 0  # (ints, or UOps of the variables)
        self.mem: Any = e.mem if e is not None else 0

    def call(self, it: ScheduleItem) -> tuple[Exec, tuple[UOp, ...]]:
        """The Exec running this kernel on it's buffers, and those buffers in argument order."""
        try:
            vals = tuple((k, int(it.var_vals[k])) for k in self.var_names)
        except KeyError as e:  # (a bare KeyError 'i'; no cost on the path where every variable is bound)
            raise _unbound(self.name, e.args[0]) from None
        return Exec(self.prog, tuple(range(len(self.slots))), vals, None, None, self.ops, self.mem,
                    self.writes), tuple(it.bufs[s] for s in self.slots)  # fmt: skip


def _unbound(kernel: str, name: Any) -> TensorValueError:
    return TensorValueError(f"kernel {kernel} needs a value for the Variable {name!r}, which nothing in the graph "
                            f"binds; bind it where it sets a size: Variable({name!r}, lo, hi).bind(n)")  # fmt: skip


class Interpret:
    """codegen's reference interpreter standing in for a kernel it could not compile (SPECK_NUMPY_FALLBACK=1): a
    runner Host call over the kernel's buffers."""

    def __init__(self, ast: UOp, reason: str) -> None:
        self.ast, self.reason, self.name = ast, reason, kernel_name(ast)
        params = sorted((u for u in ast.toposort() if u.op is Ops.PARAM), key=lambda p: int(p.arg))
        self.dtypes = tuple(getattr(p.dtype, "base", p.dtype) for p in params)

    def __call__(self, bufs: list[Any], var_vals: Mapping[str, int]) -> None:
        grid = prod(int(sym_infer(r.src[0], dict(var_vals))) for r in self.ast.toposort() if r.op is Ops.RANGE)
        if grid > NUMPY_FALLBACK_LIMIT.value:
            raise TensorRuntimeError(
                f"kernel {self.name} has {grid} iterations, too many for the numpy fallback (limit "
                f"{NUMPY_FALLBACK_LIMIT.value}); codegen could not compile it: {self.reason}"
            )
        arrays = [host_array(b, dt) for b, dt in zip(bufs, self.dtypes)]
        eval_ast(self.ast, arrays, dict(var_vals))
        for i in _kernel_writes(self.ast):  # a device the host cannot map (USB) gave copies: write the results back
            if not bufs[i].dev.host_visible:
                bufs[i].copyin(arrays[i])

    def call(self, it: ScheduleItem) -> tuple[Host, tuple[UOp, ...]]:
        return Host(self, tuple(range(len(it.bufs))), self.name, kernel=True), tuple(it.bufs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Interpret, (self.ast, self.reason))


class ProgramCache(OrderedDict[tuple[str, UOp], Any]):
    """The loaded programs by (device, kernel AST), least recently used first, at most `size` of them: eager code
    with ever new kernels (a new Python scalar in each op) reaches a steady state. An evicted program's memory is
    unmapped when the last plan holding it is gone. `generation` counts clears: plans cached by structure hold
    programs of one generation and fetch them again after a clear (tinygrad's `method_cache.clear()`)."""

    _generations = itertools.count()  # (unique across caches: a cache put in another's place is another generation)

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.generation = size, next(ProgramCache._generations)

    def get(self, key: tuple[str, UOp], default: Any = None) -> Any:
        p = super().get(key, default)
        if p is not default:
            self.move_to_end(key)
        return p

    def __setitem__(self, key: tuple[str, UOp], value: Any) -> None:
        super().__setitem__(key, value)
        while len(self) > max(self.size, 1):
            self.popitem(last=False)

    def clear(self) -> None:
        super().clear()
        self.generation = next(ProgramCache._generations)


# keyed by the AST node itself: ASTs are hash-consed, so rebuilding the same kernel gives the same object and the
# lookup is a dict hit (the cache keeps the AST alive); the content hash `ast.key` is for on-disk caches
_program_cache = ProgramCache(int(PROGRAM_CACHE.value))


def program(device: str, ast: UOp) -> Kernel | Interpret:
    """The compiled kernel of `ast` on `device` (compiled and loaded on first use, then cached)."""
    key = (device, ast)
    if (p := _program_cache.get(key)) is not None:
        return p  # type: ignore[no-any-return]
    if device not in _KERNEL_DEVICES:
        _check_runs_kernels(device, ast)  # before the numpy fallback could compute it on the host
    prog: Kernel | Interpret
    if USE_CODEGEN.value:
        try:
            prog = _compile_codegen(ast, device)
        except Exception as e:  # opt-in fallback (SPECK_NUMPY_FALLBACK=1), said under DEBUG
            if not NUMPY_FALLBACK.value:
                raise
            if DEBUG >= 1:
                print(f"speck.tensor: codegen could not compile {kernel_name(ast)} for {device}: {e!r}; using numpy")
            prog = Interpret(ast, repr(e))
    else:
        prog = Interpret(ast, "SPECK_CODEGEN=0")
    if DEBUG >= 3:
        print(ast)
    if DEBUG >= 4 and isinstance(prog, Kernel):
        print(prog.spec.src)  # the program source (C, LLVM IR, or the x86 backend's program text)
        if DEBUG >= 7 and prog.spec.lib is not None:  # the machine code, from the device's compiler
            print(Device[device].compiler.disassemble(prog.spec.lib))
    _program_cache[key] = prog
    return prog


def _compile_codegen(ast: UOp, device: str) -> Kernel:
    dev = Device[device]
    ahead = _ahead.pop((device, ast), None)
    if ahead is not None:  # lowered by _compile_ahead; its object comes from the compile pool
        spec, fut = ahead
        try:
            # (a compile no lane has started is done here; an error raises here, where the kernel is needed, as a
            # serial compile's would)
            spec.lib = _compile_pool.result(fut) if _compile_pool is not None else fut.result()
        except CompileRefused as e:  # the compiler refused it late: the registry renders it with the fallback
            spec = dev.backend.refused(ast, e, **_beam_args(dev))
    else:
        spec = dev.backend.to_program(ast, **_beam_args(dev))
    return Kernel(spec, dev.load_program(spec), ast)


def _beam_args(dev: Any) -> dict[str, Any]:
    """With BEAM>=1, kernels are searched by timing candidates on their own device (Device.time_program), cached on
    disk under the device's name and architecture."""
    from speck.codegen.settings import BEAM

    return {"beam_timer": dev.time_program, "beam_tag": f"{dev.name}|{dev.arch}"} if BEAM >= 1 else {}


def compiled_program_count() -> int:
    """Programs in the program cache now (tests check one compile serves many symbolic values)."""
    return len(_program_cache)


def _kernel_writes(ast: UOp) -> frozenset[int]:
    """The PARAM slots a kernel stores to."""
    slots = set()
    for u in ast.toposort():
        if u.op is Ops.STORE:
            slots |= {int(p.arg) for p in u.src[0].toposort() if p.op is Ops.PARAM}
    return frozenset(slots)


# ---------------- devices that run no kernels ----------------
# devices that passed the check below: one set lookup per kernel item of a schedule
_KERNEL_DEVICES: set[str] = set()
_VALUE_OPS = GroupOp.Elementwise | {Ops.REDUCE}


def _check_runs_kernels(device: str, ast: UOp) -> None:
    """A device that refuses every kernel (it defines `kernel_error(what) -> Exception`; no built-in device does)
    raises that error naming the kernel and the ops it computes (index arithmetic left out)."""
    refuse = getattr(Device[device], "kernel_error", None)
    if refuse is None:
        _KERNEL_DEVICES.add(device)
        return
    value = next(n for n in ast.toposort() if n.op is Ops.STORE).src[1]
    ops = sorted({f"REDUCE {n.arg.name}" if n.op is Ops.REDUCE else n.op.name
                  for n in value.toposort(gate=lambda x: x.op is not Ops.INDEX) if n.op in _VALUE_OPS})  # fmt: skip
    raise refuse(f"kernel {kernel_name(ast)} ({', '.join(ops) if ops else 'data movement: a copy in another layout'})")


# ---------------- compiling ahead ----------------
# A schedule's uncached kernels are lowered up front on the calling thread and their sources compiled meanwhile by
# a speck.codegen CompilePool: lowering is Python (it holds the GIL), and LLVM compiles in worker processes, one per
# core, so it neither waits for the GIL nor for llvmlite's one-call-at-a-time lock (a cold CNN training step: ~2 s
# of lowering, ~3 s of LLVM CPU for 103 kernels; one in-process LLVM thread was the critical path). gcc/clang compile
# on the pool's threads. SPECK_COMPILE_THREADS sets the lanes (default: one per core but this thread's, at least 1 and
# at most 4: once it has lowered the batch, this thread compiles the kernels it waits for that no lane has started,
# so on 2 cores one worker process runs beside the lowering instead of two competing with it for the cores);
# 0 compiles each kernel when it is first run instead.
_ahead: dict[tuple[str, UOp], tuple[Any, Any]] = {}  # (device, ast) -> (ProgramSpec without lib, Future of lib)
_compile_pool: Any = None


def _compile_ahead(kernels: Iterable[tuple[str, UOp]]) -> None:
    """Lower every (device, kernel AST) that has no program yet, in order, and queue its compile on the compile
    pool; `_compile_codegen` picks the results up when the kernels are lowered. Does nothing unless two or more
    kernels need compiling (or SPECK_COMPILE_THREADS=0). A kernel whose lowering fails is left to `program`, so its
    error (or the numpy fallback) happens where it would without compiling ahead."""
    global _compile_pool
    todo = {key: None for key in kernels if key not in _program_cache and key not in _ahead}
    if len(todo) < 2 or not USE_CODEGEN.value or not COMPILE_THREADS.value:
        return
    if _compile_pool is None:
        from speck.codegen.compiler.pool import CompilePool, default_lanes

        lanes = COMPILE_THREADS.value
        _compile_pool = CompilePool(default_lanes(spare_caller=True) if lanes < 0 else int(lanes))
    inflight: dict[tuple[int, str], Any] = {}  # two ASTs rendering the same source compile once
    with gc_paused():  # the collector runs once after the batch, not after each kernel
        for device, ast in todo:
            try:
                dev = Device[device]
                spec = dev.backend.to_program(ast, compile=False, **_beam_args(dev))
                compiler = dev.backend.compiler_for(spec)
            except Exception:  # program() reports it when the kernel is lowered
                continue
            fut = inflight.get((id(compiler), spec.src))
            if fut is None:
                fut = inflight[(id(compiler), spec.src)] = _compile_pool.submit(compiler, spec.src)
            _ahead[(device, ast)] = (spec, fut)


def compile_pool_stats() -> dict[str, float]:
    """What the compile-ahead pool did so far (speck.codegen's CompilePool.stats; empty before its first use)."""
    return {} if _compile_pool is None else dict(_compile_pool.stats())


# ---------------- lowering and linking ----------------
Entry = tuple[Any, tuple[UOp, ...]]  # a runner call whose slots index the BUFFERs beside it


def lower(it: ScheduleItem) -> Entry:
    """The runner call of one scheduled item, over its own BUFFERs."""
    if it.ast is None:
        dst, src = it.bufs
        return copy_entry(dst, src, it.copy_offset * src.dtype.itemsize)
    return program(str(it.bufs[0].src[1].arg), it.ast).call(it)


def copy_entry(dst: UOp, src: UOp, offset: int = 0) -> Entry:
    """A copy of all of dst's bytes from src (from byte `offset` on)."""
    return Copy(0, 1, offset, int(dst.arg) * dst.dtype.itemsize), (dst, src)


def link(entries: Sequence[Entry], slots: dict[UOp, int] | None = None) -> tuple[list[Any], list[UOp]]:
    """The calls of `entries` over one numbering of their BUFFERs (first appearance first, after those already in
    `slots`), and the BUFFERs in slot order."""
    slot = dict(slots) if slots is not None else {}
    uops = list(slot)
    calls: list[Any] = []
    for call, bufs in entries:
        mine = []
        for b in bufs:
            if (s := slot.get(b)) is None:
                s = slot[b] = len(uops)
                uops.append(b)
            mine.append(s)
        if type(call) is Copy:
            calls.append(call._replace(dst=mine[call.dst], src=mine[call.src]))
        else:
            calls.append(call._replace(args=tuple(mine[a] for a in call.args)))
    return calls, uops


def check_device_usage(items: Sequence[ScheduleItem]) -> None:
    if items and not ALLOW_DEVICE_USAGE.value:
        names = ", ".join(kernel_name(it.ast) if it.ast is not None else "copy" for it in items[:4])
        raise DeviceUsageError(f"running {len(items)} kernel(s)/copies ({names}) is not allowed while "
                               "ALLOW_DEVICE_USAGE=0 (an @function body is traced, not run)")  # fmt: skip


def execute(items: Sequence[ScheduleItem]) -> None:
    """Run a schedule: every item lowered (kernels compiled, a device that runs none refusing them before anything
    runs), linked into one plan, recorded when a TinyJit captures, and run through the runner."""
    if not items:
        return
    check_device_usage(items)
    if len(items) > 1:
        for it in items:
            if it.ast is not None and (d := str(it.bufs[0].src[1].arg)) not in _KERNEL_DEVICES:
                _check_runs_kernels(d, it.ast)
        _compile_ahead((str(it.bufs[0].src[1].arg), it.ast) for it in items if it.ast is not None)
    entries = [lower(it) for it in items]
    run_entries(entries)
    if contiguous_made:
        _remember_contiguous(items)


def _remember_contiguous(items: Sequence[ScheduleItem]) -> None:
    """The `.contiguous()` nodes whose buffers these items filled read those buffers from now on (realized_cache)."""
    written = {it.bufs[0] for it in items if it.bufs}
    capturing = recording() is not None  # (a TinyJit replay refills a capture's buffers: they hold no fixed value)
    for u, view in list(contiguous_made.items()):
        if base_buffer(view) in written:
            del contiguous_made[u]
            if not capturing and not reads_external(u) and not is_const_graph(u):
                realized_cache[u] = view


def run_entries(entries: Sequence[Entry], var_vals: Mapping[str, int] | None = None) -> None:
    """Link calls over BUFFERs into a plan and run it (recorded when a TinyJit captures)."""
    if (rec := recording()) is not None:
        rec.extend(entries)
        _note_fresh(entries)
    calls, uops = link(entries)
    _runner.run(Plan(calls, len(uops), name=f"{len(calls)} calls"), [get_buffer(u) for u in uops], var_vals)


# ---------------- the warm path ----------------
def _runnable(sched: CachedSchedule) -> Plan | None:
    """The Plan of a cached schedule (its inputs first, then its fresh buffers), built once per program-cache
    generation; None when a kernel of it can't be a kernel call (the general path then runs it)."""
    got = sched.plan
    if got is not None and sched.generation == _program_cache.generation:
        return got  # type: ignore[no-any-return]
    nin = sched.ninputs
    if any(Device[d].file_backed for d, _, _ in sched.fresh):
        return None  # (a file's buffer is mapped as it can be written: get_buffer decides at each run)
    calls: list[Any] = []
    _compile_ahead((device, ast) for ast, _, _, _, device, _, _ in sched.recipe if ast is not None)
    for ast, refs, vv, off, device, nbytes, src_itemsize in sched.recipe:
        slots = [r if r >= 0 else nin + ~r for r in refs]
        if ast is None:
            calls.append(Copy(slots[0], slots[1], off * src_itemsize, nbytes))
            continue
        if device not in _KERNEL_DEVICES:
            return None  # (the general path raises the device's refusal)
        k = program(device, ast)
        if not isinstance(k, Kernel):
            return None
        vals = tuple((n, int(vv[n])) for n in k.var_names)
        calls.append(Exec(k.prog, tuple(slots[s] for s in k.slots), vals, None, None, k.ops, k.mem, k.writes))
    plan = sched.plan = Plan(calls, nin + len(sched.fresh), name=f"{len(calls)} calls")
    sched.generation = _program_cache.generation
    d, n, dt = sched.fresh[~sched.out_ref]
    # (the fresh buffers to make, the output's slot, its BUFFER node's device node, size and dtype, and the shape
    # to view it as when that is not its flat size)
    view = None if sched.shape == (n,) else sched.shape
    # each small fresh buffer's spare: the Buffer (and memory) of the previous run, taken again when nothing holds
    # it any more (SPARE_MAX_BYTES: a bigger buffer's allocation costs little beside its kernel, and is not kept)
    # The output's spare is its BUFFER node (with the Buffer buffer_map gives it): a node nothing holds any more is
    # the output again, with its entry, so no node, UNIQUE or entry is made and collected per op either
    keep = [int(size) * dtype.itemsize <= SPARE_MAX_BYTES for _, size, dtype in sched.fresh]
    out_spare = SpareBuffers() if keep[~sched.out_ref] else None
    keep[~sched.out_ref] = False
    made = tuple((dev, size, dtype, _OUT if k == ~sched.out_ref else SpareBuffers() if kept else None)
                 for k, ((dev, size, dtype), kept) in enumerate(zip(sched.fresh, keep)))  # fmt: skip
    spares = tuple((nin + k, m[3]) for k, m in enumerate(made) if isinstance(m[3], SpareBuffers))
    # (realize_binary's case: two inputs, the output the one fresh buffer, kept, and viewed as it is)
    binary = out_spare if nin == 2 and len(made) == 1 and view is None else None
    sched.warm = (made, nin + ~sched.out_ref, device_node(d), n, dt, view, spares, out_spare, binary)
    sched.keys = [None] * nin
    return plan


def realize_graph(u: UOp, device: str, unrealized: bool = False) -> UOp:
    """Compute u (a single-device graph, not realized yet) on `device`; returns the view of the buffer holding it.
    A graph of a structure scheduled before runs that schedule's plan on its own input buffers and new ones.
    `unrealized`: the caller found u not in realized_cache just now (cached_plan need not look again)."""
    found = cached_plan(u, device, unrealized)
    # (a plan keeping intermediates the other gradients of one backward read takes schedule_with_cache, which names
    # their nodes)
    if found is not None and (sched := found[2]) is not None and _capture_state.calls is None \
            and ALLOW_DEVICE_USAGE.value and not (sched.keeps and has_pending_siblings(u)):  # fmt: skip
        plan = sched.plan if sched.generation == _program_cache.generation else None
        if plan is not None or (plan := _runnable(sched)) is not None:
            data = buffer_map_data
            keys = sched.keys
            bufs = []
            for i, b in enumerate(found[1]):
                # (the input's entry by the key object buffer_map's dict holds, found again through the last run's
                # note: a lookup by identity, without the weak reference made and compared through UOp's __eq__)
                if (k := keys[i]) is None or k() is not b:
                    k = _ref(b)
                    keys[i] = _tolerant_key(b) or k
                if (hb := data.get(k)) is None:  # (no storage yet: get_buffer makes its entry, found next time)
                    hb, keys[i] = get_buffer(b), None
                bufs.append(hb)
            fresh, out_slot, dev_node, n, dt, shape, spares, out_spare, _ = sched.warm
            if MAX_BUFFER_SIZE.value:
                for d, size, dtype, _ in fresh:
                    check_buffer_size(size, dtype, d)
            out = None
            if out_spare:  # the previous run's output node, when nothing holds it or its Buffer any more
                try:
                    out, key = out_spare.pop()  # (the node and its entry's key: see _unmap)
                except IndexError:  # (another thread took it)
                    pass
                else:  # (out, out_hb and the arguments; out_hb's third: buffer_map's entry, which out keeps)
                    out_hb = data.get(key)
                    if _getrefcount(out) != 2 or type(out_hb) is not _HcqBuffer or _getrefcount(out_hb) != 3:
                        key = out = None  # (the key first: see _unmap)
                    elif len(fresh) == 1:  # (the output is the one fresh buffer: nothing else to make)
                        bufs.append(out_hb)
            for d, size, dtype, spare in fresh if out is None or len(fresh) > 1 else ():
                if spare:
                    if spare is _OUT:
                        if out is not None:
                            bufs.append(out_hb)
                            continue
                    else:  # the previous run's Buffer, when nothing else holds it any more
                        try:
                            hb = spare.pop()
                        except IndexError:  # (another thread took it)
                            pass
                        else:
                            if _getrefcount(hb) == 2:  # (hb and the argument: its tensor and views of it are gone)
                                bufs.append(hb)
                                continue
                bufs.append(_HcqBuffer(d, size, dtype))
            _runner.run(plan, bufs)
            if out is None:
                out = _buffer_node(dev_node, n, dt, _next_unique())  # (new_buffer_uop, inlined)
                key = _ref(out, _unmap)
                data[key] = bufs[out_slot]  # (buffer_map[out] = ..., inlined)
            if _KEEP_FREED.value:  # (LRU=0: memory goes back when its tensor dies, not kept by the plan either)
                if out_spare is not None:
                    out_spare.append((out, key))
                for k, spare in spares:
                    spare.append(bufs[k])
            return out if shape is None else out.reshape(shape)  # (sched.output_view(out), inlined)
    items, view = schedule_with_cache(u, device, found)
    execute(items)
    attach_storage(view)
    return view


def realize_binary(u: UOp, a: UOp, b: UOp, device: str, kept: list[Any] | tuple[()] = ()) -> UOp:
    """realize_graph(u, device, True) of one op over two different BUFFERs a and b (u's sources, u not in
    realized_cache: `(x + y).realize()`). The warm run of a plan whose one fresh buffer is its output, taken from the
    output's spare, is done here in one frame: cached_plan's flat key and LRU touch and realize_graph's warm body,
    without `found`'s tuple and list, the loops over inputs and fresh buffers, or the general branches. Anything
    else (a cold or other plan, a capture, MAX_BUFFER_SIZE, no spare to take) goes to realize_graph, having changed
    nothing but what realize_graph would (the LRU order, the inputs' noted keys, a spare it drops as well).
    kept: KEPT_NODE[-1:] as the caller read it. When u is the kept node, its keep notes (by the same weak reference
    the LRU's `_newest` holds: one basic weak reference per object) the schedule this route ran it with; while that
    is still the newest, it is in the cache under u's key and already most recently used: the key is neither built
    nor looked up. (A schedule is put in the cache once, under one key; only an insert evicts, and it makes the
    inserted one the newest.)"""
    if SCACHE.value and a is not b and _capture_state.calls is None and ALLOW_DEVICE_USAGE.value \
            and not MAX_BUFFER_SIZE.value:  # fmt: skip
        rec = kept[0] if kept else None
        if rec is not None and rec[0] is u and rec[3] is device and rec[2] is _plan_newest[0] \
                and (sched := rec[2]()) is not None:  # fmt: skip
            rec = None  # (noted already)
        else:
            ck = u._ck
            # (cached_plan's key for a binary node over two BUFFERs, item for item)
            sched = _plan_get((u.op, u.dtype, ck[3], ck[4], a.dtype, a.arg, a.src[1], b.dtype, b.arg, b.src[1], False,
                               device))  # fmt: skip
            if sched is not None and _plan_newest[0]() is not sched:  # (cached_plan's LRU touch)
                _plan_touch((u.op, u.dtype, ck[3], ck[4], a.dtype, a.arg, a.src[1], b.dtype, b.arg, b.src[1], False,
                             device))  # fmt: skip
                _plan_newest[0] = _ref(sched)
        if sched is not None:
            if (plan := sched.plan) is not None and sched.generation == _program_cache.generation \
                    and not sched.keeps and (out_spare := sched.warm[8]) is not None:  # fmt: skip
                data, keys = buffer_map_data, sched.keys
                if (k := keys[0]) is None or k() is not a:  # (realize_graph's input loop, unrolled)
                    k = _ref(a)
                    keys[0] = _tolerant_key(a) or k
                ha = data.get(k)
                if (k := keys[1]) is None or k() is not b:
                    k = _ref(b)
                    keys[1] = _tolerant_key(b) or k
                hb = data.get(k)
                if ha is not None and hb is not None:
                    try:
                        out, key = out_spare.pop()
                    except IndexError:  # (none kept, or another thread took it)
                        pass
                    else:
                        out_hb = data.get(key)
                        if _getrefcount(out) == 2 and type(out_hb) is _HcqBuffer and _getrefcount(out_hb) == 3:
                            _runner.run(plan, [ha, hb, out_hb])  # (inputs, then the one fresh slot: the output)
                            if _KEEP_FREED.value:
                                out_spare.append((out, key))
                            # (u kept, its keep unchanged since: it notes the schedule u ran with)
                            if rec is not None and rec[0] is u and (now := KEPT_NODE[-1:]) and now[0] is rec:
                                KEPT_NODE[-1:] = [(u, rec[1], _ref(sched), device)]
                            return out  # type: ignore[no-any-return]
                        key = out = None  # (the key first: see _unmap; realize_graph makes a new output)
    return realize_graph(u, device, True)


_RUN_COUNTERS = ("kernel_count", "copy_count", "global_ops", "global_mem", "time_sum_s")


def without_run_counts(fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) leaving GlobalCounters' run totals as they were (Tensor.realize's do_update_stats=False)."""
    saved = [getattr(COUNTS, k) for k in _RUN_COUNTERS]
    try:
        fn(*args)
    finally:
        for k, v in zip(_RUN_COUNTERS, saved):
            setattr(COUNTS, k, v)


# The node of the last per-op `(x + y).realize()` (one op over two small BUFFERs) that nothing else held once it was
# realized. Kept, the next `x + y` of the same inputs gets it again from hash-consing (a node is its structure), so
# that op makes and finalizes no node, and metadata.record finds the entry the node already has instead of walking
# the stack for a new one: about a fifth of the warm op. A kept node is nobody's: Tensor.realize counts this
# reference out before it decides whether someone else holds the node (realized_cache), Tensor._realize_now drops it
# first, and it is a parked spare (SpareBuffers): mem_used readers and an allocation that runs short release it, and
# with it the small input buffers it reads. One node: a keep is only a cache (dropping it is always safe), so
# threads racing on it can only lose it or keep one a little longer.
KEPT_NODE = SpareBuffers()
_sibling_data: dict[Any, Any] = sibling_graphs.data  # type: ignore[attr-defined]  # (its backing dict: see schedule)


def keep_node(kept: list[tuple[UOp, bool, Any, Any]], u: UOp, a: UOp, b: UOp) -> None:
    """Keep u (just realized by Tensor.realize, nobody else holding it) in `kept` (KEPT_NODE), in place of the one
    kept before, when the keep is allowed: not in a capture, LRU on, inputs a and b small, no gradient graph (a live
    sibling reads as one still to be computed: has_pending_siblings), no external memory read."""
    if _capture_state.calls is None and _KEEP_FREED.value and a.arg * a.dtype.itemsize <= SPARE_MAX_BYTES \
            and b.arg * b.dtype.itemsize <= SPARE_MAX_BYTES and (not _sibling_data or _ref(u) not in _sibling_data) \
            and not reads_external(u):  # fmt: skip
        # (with whether u has its metadata entry: then metadata.record(u) has nothing to do, and _binary skips it)
        kept.append((u, _ref(u) in node_metadata_data, None, None))  # (realize_binary notes u's schedule: [2], [3])
        del kept[:-1]  # (the older one goes; a slice, which another thread emptying the list cannot make fail)


# ---------------- TinyJit captures ----------------
# TinyJit sets a list while it captures: every call `execute` runs is recorded as an Entry (a runner call and its
# BUFFERs), Tensor.assign records its buffer swaps as copies, host work on buffers (speck.tensor.distributed's MPI
# collectives) as Host calls. Per thread: a capture records the realizations of the thread that runs the jitted
# function only (another thread's realizations run, unrecorded, while it captures)
class _CaptureState(threading.local):
    calls: list[Entry] | None = None
    # BUFFERs that had no memory when a recorded call first wrote them: their contents are made by the capture
    # (TinyJit's free_intermediates may give their memory back between replays)
    fresh: set[UOp] | None = None


_capture_state = _CaptureState()
capture_state = _capture_state  # (Tensor.realize reads `.calls` on its per-op path: capture() without the frame)


def capture() -> list[Entry] | None:
    """The list this thread's TinyJit capture records into (None when this thread captures nothing)."""
    return _capture_state.calls


def set_capture(calls: list[Entry] | None, fresh: set[UOp] | None = None) -> None:
    """Start (a list, and the set to note fresh outputs in) or end (None) this thread's capture (TinyJit only)."""
    _capture_state.calls, _capture_state.fresh = calls, fresh


def _note_fresh(entries: Sequence[Entry]) -> None:
    """Note the BUFFERs these recorded calls write that hold no memory yet (before they run)."""
    fresh = _capture_state.fresh
    if fresh is None:
        return
    data = buffer_map_data
    for call, bufs in entries:
        for i in _runner.reads_writes(call)[1]:
            hb = data.get(_ref(bufs[i]))
            if hb is None or (type(hb) is _HcqBuffer and not hb.is_allocated):
                fresh.add(bufs[i])


def recording() -> list[Entry] | None:
    """The list this thread's TinyJit capture records calls into, or None when nothing records (no capture in this
    thread, or CAPTURING=0)."""
    calls = _capture_state.calls
    return calls if calls is not None and CAPTURING.value else None


def record(call: Any, bufs: Sequence[UOp]) -> None:
    """Record a call made outside `execute` (a buffer swap, host work) for TinyJit replays, if a capture records."""
    if (rec := recording()) is not None:
        rec.append((call, tuple(bufs)))
        _note_fresh(rec[-1:])


def _reads_unchecked(what: str) -> None:
    """Until speck.tensor.jit registers its check (nothing captures before it is imported)."""


# TinyJit's check of a data read (numpy/tolist/item/data) during a capture: speck.tensor.jit, which sits above this
# module and tensor.py, registers it on import; Tensor reads call it while a capture records
_read_check: list[Callable[[str], None]] = [_reads_unchecked]


def register_read_check(check: Callable[[str], None]) -> None:
    _read_check[0] = check


def check_read_allowed(what: str) -> None:
    _read_check[0](what)


def host_call(fn: Callable[[list[Any], Mapping[str, int]], None], bufs: Sequence[UOp], name: str) -> None:
    """Run host work over BUFFERs as a runner Host call (waiting for what writes them first; recorded for TinyJit)."""
    run_entries([(Host(fn, tuple(range(len(bufs))), name), tuple(bufs))])


# ---------------- the driving loop ----------------
def schedule_targets(targets: Sequence[tuple[UOp, str]]) -> tuple[list[ScheduleItem], list[UOp]]:
    """One schedule computing every (graph, device) target, work they share computed once: its items, and the view
    of the buffer that will hold each target."""
    first_unique = _next_unique()  # (buffers numbered from here on are this schedule's own)
    sched = Scheduler()
    computed_now = {u for u, _ in targets}
    sched.keep = any(has_pending_siblings(u, computed_now) for u in computed_now)
    for u, _ in targets:
        sched.count_uses(u)
    views = []
    for u, d in targets:
        sched.device = d
        views.append(sched.realize(u))
    if PLAN_MEMORY.value:  # intermediates share memory (speck.tensor.engine.memory)
        plan_memory(sched.items, [*views, *contiguous_made.values()], first_unique)
    return sched.items, views


def realize_targets(targets: Sequence[tuple[UOp, str]]) -> list[UOp]:
    """Compute every (graph, device) target and return the views holding them; later graphs holding a target read
    its buffer (realized_cache). One single-device graph goes through the structural schedule cache."""
    if len(targets) == 1 and realized_cache.get(targets[0][0]) is None:
        u, device = targets[0]
        items, view = schedule_with_cache(u, device)
        views = [view]
    else:
        items, views = schedule_targets(targets)
    execute(items)
    for (u, _), v in zip(targets, views):
        attach_storage(v)
        if u is not v and not is_const_graph(u) and not reads_external(u):
            realized_cache[u] = v
    return views


def is_const_graph(u: UOp) -> bool:
    """A graph computed from constants alone (no BUFFER: `Tensor.zeros(3)`, `Tensor.ones(3) * 2`, an arange on a
    device, and a contiguous() of those): hash-consing makes every such node shared by all graphs building that
    value, so a realization of it must not be remembered (the buffer belongs to one tensor, the node to everybody:
    `Tensor.zeros(3).contiguous()` made twice is one node, realized for two tensors). The walk stops at the first
    BUFFER, which most graphs meet within a few nodes."""
    while (u.op in _VIEW_OPS or (u.op is Ops.CONTIGUOUS and u.arg is None)) and u.src:
        u = u.src[0]
    if u.op is Ops.CONST:
        return True
    seen, stack = {u}, [u]
    while stack:
        n = stack.pop()
        if n.op is Ops.BUFFER or n.op is Ops.DEFINE_VAR or (n.op is Ops.CONTIGUOUS and n.arg is not None):
            return False  # (a Variable's value or a clone's tag make the node no shared constant)
        for s in n.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return True


_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})
