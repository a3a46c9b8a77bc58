"""The realize engine: runs a schedule (kernels and copies) on speck.hcq buffers and keeps the counters.

Each kernel AST is compiled once per (device, AST key) through speck.codegen's `to_program` and the device's
runtime. A kernel codegen can't compile is an error; with SPECK_NUMPY_FALLBACK=1 it runs instead through codegen's
reference interpreter (speck.codegen.interpret.eval_ast) on zero-copy views of the same buffers (a debugging aid)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from weakref import ref as _ref

import numpy as np

from speck.codegen.interpret import eval_ast
from speck.codegen.kernel_info import kernel_name
from speck.codegen.numeric import storage_np
from speck.hcq.buffer import Buffer as _HcqBuffer
from speck.tensor import profile
from speck.tensor.counters import GlobalCounters
from speck.tensor.errors import DeviceUsageError as DeviceUsageError
from speck.tensor.schedule import (
    ScheduleItem,
    buffer_device,
    buffer_map,
    buffer_map_data,
    buffer_views,
    new_buffer_uop,
)
from speck.tensor.schedule_cache import Plan, cached_plan, schedule_with_cache
from speck.tensor.settings import ALLOW_DEVICE_USAGE, CAPTURING
from speck.uop import DEBUG, GroupOp, Ops, UOp, getenv
from speck.uop.helpers import prod
from speck.uop.uop import register_service


# ---------------- buffers ----------------
def get_buffer(buf: UOp) -> Any:
    """The hcq Buffer behind a BUFFER UOp (created on first use)."""
    b = buffer_map_data.get(_ref(buf))
    if b is None:
        global _Buffer
        if _Buffer is None:
            from speck.hcq import Buffer

            _Buffer = Buffer
        if (region := buffer_views.get(buf)) is not None:  # a region of another buffer's memory
            base, offset = region
            b = get_buffer(base).view(int(buf.arg), buf.dtype, offset)
        else:
            dev = buffer_device(buf)  # speck dtype below: what codegen's BufferArgs name
            b = _Buffer(dev, int(buf.arg), buf.dtype, _disk_options(dev)) if dev[:5] == "DISK:" else \
                _Buffer(dev, int(buf.arg), buf.dtype)  # fmt: skip
        buffer_map[buf] = b
    return b


_Buffer: Any = None  # speck.hcq.Buffer, imported on first use (a function-level import costs on every call)
register_service("uop_buffer", get_buffer)  # UOp.buffer: the hcq Buffer behind a realized tensor's BUFFER


def _disk_options(device: str) -> Any:
    """A DISK tensor's existing file is mapped read-only: reading never changes it, and a file shorter than the tensor
    (truncated since it was opened) is an error, not extended with zeros. A file the tensor creates is mapped
    read-write. Writes (`.to("disk:...")`, assign) map the file read-write first: `writable_disk`."""
    from speck.hcq import BufferOptions

    return BufferOptions(writable=not os.path.exists(device[5:]))


def writable_disk(b: Any) -> None:
    """Before a write into DISK buffer b (a copy or an assign): its file mapped read-write (extended to the buffer's
    size if shorter: the write makes it that long)."""
    from speck.hcq import BufferOptions

    base = b.base
    if not base.is_allocated:
        base.options = BufferOptions(writable=True)
    elif not base.opaque.writable:
        base.opaque.make_writable()


def buffer_numpy(buf: UOp) -> np.ndarray:
    """A flat numpy view (zero-copy on host-visible devices) of a BUFFER's memory."""
    b = get_buffer(buf)
    b.ensure_allocated()
    arr = b.numpy()
    out: np.ndarray = arr.view(storage_np(buf.dtype)) if arr.dtype != np.dtype(storage_np(buf.dtype)) else arr
    return out


# ---------------- compilation ----------------
# keyed by the AST node itself: ASTs are hash-consed, so rebuilding the same kernel gives the same object and the
# lookup is a dict hit (the cache keeps the AST alive); the content hash `ast.key` is for on-disk caches
_program_cache: dict[tuple[str, UOp], Any] = {}
# 1: when codegen can't compile a kernel, run it through the numpy evaluator instead of raising. Off by default so
# a codegen gap is a visible error, never a silently slow (or differently rounded) result.
COMPILE_FALLBACK = getenv("SPECK_NUMPY_FALLBACK", 0)
USE_CODEGEN = getenv("SPECK_CODEGEN", 1)
NUMPY_FALLBACK_LIMIT = getenv("SPECK_NUMPY_FALLBACK_LIMIT", 1 << 27)  # grid points the evaluator may materialise


class _NumpyProgram:
    """Fallback 'program': codegen's reference interpreter on the AST."""

    def __init__(self, ast: UOp, reason: str) -> None:
        self.ast, self.reason, self.name = ast, reason, kernel_name(ast)

    def run(self, bufs: Sequence[UOp], var_vals: dict[str, int]) -> float:
        from speck.uop.symbolic import sym_infer

        grid = prod(int(sym_infer(r.src[0], var_vals)) for r in self.ast.toposort() if r.op is Ops.RANGE)
        if grid > NUMPY_FALLBACK_LIMIT:
            raise RuntimeError(
                f"kernel {self.name} has {grid} iterations, too many for the numpy fallback (limit "
                f"{NUMPY_FALLBACK_LIMIT}); codegen could not compile it: {self.reason}"
            )
        t0 = time.perf_counter()
        eval_ast(self.ast, [buffer_numpy(b) for b in bufs], var_vals)
        return time.perf_counter() - t0


class _CompiledProgram:
    """A codegen ProgramSpec loaded on an hcq device."""

    def __init__(self, spec: Any, prog: Any, device: Any) -> None:
        self.spec, self.prog, self.device, self.name = spec, prog, device, spec.name
        self._est: tuple[int, int] | None = None  # (ops, bytes) per run, filled by _cached_estimate
        # derived once per program, not per call: the buffer slots it uses (a load folded to a constant drops
        # its param, so pass exactly those, in its order) and, when no variable shapes it, the launch size
        self.slots: tuple[int, ...] = tuple(int(a.slot) if hasattr(a, "slot") else int(a[0]) for a in spec.buffers)
        self.static_gs: tuple[int, ...] | None = (
            tuple(int(g) for g in spec.global_size)
            if not spec.vars and not any(isinstance(g, UOp) for g in spec.global_size)
            else None
        )

    def _launch(self, var_vals: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(global size, variable values) of a launch."""
        gs = self.static_gs
        if gs is not None:
            return gs, ()
        from speck.uop.symbolic import sym_infer

        gs = tuple(int(sym_infer(g, var_vals)) if isinstance(g, UOp) else int(g) for g in self.spec.global_size)
        return gs, tuple(var_vals[v.arg[0]] if isinstance(v, UOp) else var_vals[v[0]] for v in self.spec.vars)

    def run(self, bufs: Sequence[UOp], var_vals: dict[str, int]) -> float:
        gs, vals = self._launch(var_vals)
        # (an hcq program call gives buffers without memory their memory)
        t = self.prog(*[get_buffer(bufs[s]) for s in self.slots], global_size=gs, vals=vals, wait=True)
        return float(t) if t is not None else 0.0

    def submit(self, bufs: Sequence[UOp], var_vals: dict[str, int], waits: Sequence[tuple[Any, int]]) -> None:
        """Queue the kernel on its device's compute engine thread after the signals `waits` (copies into its
        buffers) without waiting for it: a schedule over several devices runs their kernels side by side."""
        gs, vals = self._launch(var_vals)
        prog, dev = self.prog, self.device
        hb = [get_buffer(bufs[s]) for s in self.slots]
        prog.check_args(hb, vals)
        q = dev.hw_queue()
        for sig, value in waits:
            q.wait(sig, value)
        q.exec(prog, prog.raw_args(hb, vals), gs, dev.choose_threads(prog, hb)).submit(dev, background=True)


def _compile(ast: UOp, device: str) -> Any:
    key = (device, ast)
    if (p := _program_cache.get(key)) is not None:
        return p
    if device not in _KERNEL_DEVICES:
        _check_runs_kernels(device, ast)  # before the numpy fallback could compute it on the host
    prog: Any = None
    if USE_CODEGEN:
        try:
            prog = _compile_codegen(ast, device)
        except Exception as e:  # opt-in fallback (SPECK_NUMPY_FALLBACK=1), said under DEBUG
            if not COMPILE_FALLBACK:
                raise
            if DEBUG >= 1:
                print(f"speck.tensor: codegen could not compile {kernel_name(ast)} for {device}: {e!r}; using numpy")
            prog = _NumpyProgram(ast, repr(e))
    else:
        prog = _NumpyProgram(ast, "SPECK_CODEGEN=0")
    if DEBUG >= 3:
        print(ast)
    if DEBUG >= 4 and isinstance(prog, _CompiledProgram):
        print(prog.spec.src)  # the program source (C, LLVM IR, or the x86 backend's program text)
        if DEBUG >= 7 and prog.spec.lib is not None:  # the machine code, from the device's compiler
            from speck.hcq import Device

            print(Device[device].compiler.disassemble(prog.spec.lib))
    _program_cache[key] = prog
    return prog


def _compile_codegen(ast: UOp, device: str) -> _CompiledProgram:
    from speck.hcq import Device

    dev = Device[device]
    ahead = _ahead.pop((device, ast), None)
    if ahead is not None:  # lowered by _compile_ahead; its object comes from the compile thread
        spec, fut = ahead
        spec.lib = fut.result()  # a compile error raises here, where the kernel is needed, as a serial compile would
    else:
        spec = dev.backend.to_program(ast, **_beam_args(dev))
    prog = dev.load_program(spec)
    return _CompiledProgram(spec, prog, dev)


def _beam_args(dev: Any) -> dict[str, Any]:
    """With BEAM>=1, kernels are searched by timing candidates on their own device (Device.time_program), cached on
    disk under the device's name and architecture."""
    from speck.codegen.opt import BEAM

    return {"beam_timer": dev.time_program, "beam_tag": f"{dev.name}|{dev.arch}"} if BEAM >= 1 else {}


# ---------------- devices that run no kernels ----------------
# devices that passed the check below: one set lookup per kernel item of a schedule
_KERNEL_DEVICES: set[str] = set()
_VALUE_OPS = GroupOp.Elementwise | {Ops.REDUCE}


def _check_runs_kernels(device: str, ast: UOp) -> None:
    """A device that refuses every kernel (it defines `kernel_error(what) -> Exception`; USB, whose GPU is not
    brought up) raises that error naming the kernel and the ops it computes (index arithmetic left out)."""
    from speck.hcq import Device

    refuse = getattr(Device[device], "kernel_error", None)
    if refuse is None:
        _KERNEL_DEVICES.add(device)
        return
    value = next(n for n in ast.toposort() if n.op is Ops.STORE).src[1]
    ops = sorted({f"REDUCE {n.arg.name}" if n.op is Ops.REDUCE else n.op.name
                  for n in value.toposort(gate=lambda x: x.op is not Ops.INDEX) if n.op in _VALUE_OPS})  # fmt: skip
    raise refuse(f"kernel {kernel_name(ast)} ({', '.join(ops) if ops else 'data movement: a copy in another layout'})")


def _check_schedule_devices(items: list[ScheduleItem]) -> None:
    """Every kernel's device is checked before the first item of a schedule runs (a copy to USB followed by a kernel
    on USB must not do the copy and then fail)."""
    ok = _KERNEL_DEVICES
    for it in items:
        if it.ast is not None and (d := it.bufs[0].src[1].arg) not in ok:
            _check_runs_kernels(str(d), it.ast)


# ---------------- compiling ahead ----------------
# A schedule's uncached kernels are lowered up front on the calling thread and their sources compiled meanwhile by
# a speck.codegen CompilePool: lowering is Python (it holds the GIL), and LLVM compiles in worker processes, one per
# core, so it neither waits for the GIL nor for llvmlite's one-call-at-a-time lock (a cold CNN training step: ~2 s
# of lowering, ~3 s of LLVM CPU for 103 kernels; one in-process LLVM thread was the critical path). gcc/clang compile
# on the pool's threads. SPECK_COMPILE_THREADS sets the lanes (default: one per core, at most 4); 0 compiles each
# kernel when it is first run instead.
COMPILE_THREADS = getenv("SPECK_COMPILE_THREADS", -1)
_ahead: dict[tuple[str, UOp], tuple[Any, Any]] = {}  # (device, ast) -> (ProgramSpec without lib, Future of lib)
_compile_pool: Any = None


def _compile_ahead(items: list[ScheduleItem]) -> None:
    """Lower every kernel of `items` that has no program yet, in order, and queue its compile on the compile
    thread; `_compile_codegen` picks the results up when the kernels run. Does nothing unless two or more kernels
    need compiling. A kernel whose lowering fails is left to `_compile`, so its error (or the numpy fallback)
    happens where it would without compiling ahead."""
    global _compile_pool
    todo: dict[tuple[str, UOp], None] = {}
    for it in items:
        if it.ast is not None:
            key = (str(it.bufs[0].src[1].arg), it.ast)
            if key not in _program_cache and key not in _ahead:
                todo[key] = None
    if len(todo) < 2 or not USE_CODEGEN:
        return
    from speck.hcq import Device

    if _compile_pool is None:
        from speck.codegen.compiler.pool import CompilePool

        _compile_pool = CompilePool(None if COMPILE_THREADS < 0 else COMPILE_THREADS)
    inflight: dict[tuple[int, str], Any] = {}  # two ASTs rendering the same source compile once
    for device, ast in todo:
        try:
            dev = Device[device]
            spec = dev.backend.to_program(ast, compile=False, **_beam_args(dev))
            compiler = dev.backend.compiler_for(spec)
        except Exception:  # _compile reports it when the kernel runs
            continue
        fut = inflight.get((id(compiler), spec.src))
        if fut is None:
            fut = inflight[(id(compiler), spec.src)] = _compile_pool.submit(compiler, spec.src)
        _ahead[(device, ast)] = (spec, fut)


def compile_pool_stats() -> dict[str, float]:
    """What the compile-ahead pool did so far (speck.codegen's CompilePool.stats; empty before its first use)."""
    return {} if _compile_pool is None else dict(_compile_pool.stats())


def compiled_program_count() -> int:
    """Programs compiled so far (tests check one compile serves many symbolic values)."""
    return len(_program_cache)


# ---------------- running ----------------
def _cached_estimate(prog: Any, it: ScheduleItem) -> tuple[int, int]:
    """(ops, bytes) of one run from codegen's estimates of the program (ProgramSpec.estimates): fixed per program
    unless variables change the loop sizes. The numpy fallback has no program and counts nothing."""
    est = prog._est if isinstance(prog, _CompiledProgram) else None
    if est is None or it.var_vals:
        if not isinstance(prog, _CompiledProgram):
            return 0, 0
        from speck.uop.symbolic import sym_infer

        e = prog.spec.estimates
        ops, mem = (v if isinstance(v, int) else int(sym_infer(v, it.var_vals)) for v in (e.ops, e.mem))
        est = (ops, mem)
        if not it.var_vals:
            prog._est = est
    return est


# TinyJit sets this to a list while it captures: every call run_schedule makes is recorded for replay, Tensor.assign
# records its buffer swaps as ("assign", (dst, src)), and host work on buffers (speck.tensor.distributed's MPI
# collectives) as ("host", (fn, buffers)): replays call fn(buffers)
CAPTURE: list[tuple[str, Any]] | None = None


def recording() -> list[tuple[str, Any]] | None:
    """The list a TinyJit capture records calls into, or None when nothing records (no capture, or CAPTURING=0)."""
    return CAPTURE if CAPTURE is not None and CAPTURING.value else None


def _reads_unchecked(what: str) -> None:
    """Until speck.tensor.jit registers its check (nothing captures before it is imported)."""


# TinyJit's check of a data read (numpy/tolist/item/data) during a capture: speck.tensor.jit, which sits above this
# module and tensor.py, registers it on import; Tensor reads call it while a capture records
_read_check: list[Callable[[str], None]] = [_reads_unchecked]


def register_read_check(check: Callable[[str], None]) -> None:
    _read_check[0] = check


def check_read_allowed(what: str) -> None:
    _read_check[0](what)


def run_schedule(items: list[ScheduleItem]) -> None:
    """Execute the schedule in order, updating GlobalCounters and printing DEBUG=2 lines."""
    if items and not ALLOW_DEVICE_USAGE.value:
        names = ", ".join(kernel_name(it.ast) if it.ast is not None else "copy" for it in items[:4])
        raise DeviceUsageError(f"running {len(items)} kernel(s)/copies ({names}) is not allowed while "
                               "ALLOW_DEVICE_USAGE=0 (an @function body is traced, not run)")  # fmt: skip
    if len(items) > 1:
        _check_schedule_devices(items)
        if COMPILE_THREADS:
            _compile_ahead(items)
    capture = recording()
    queued = _side_by_side(items)  # devices whose kernels this schedule queues without waiting for them
    for it in items:
        if it.ast is None:
            if capture is not None:
                capture.append(("copy", it))
            if queued and it.bufs[0].src[1].arg == it.bufs[1].src[1].arg:  # a copy within a device runs here
                _wait_compute(queued)
            _run_copy(it)
            continue
        device = str(it.bufs[0].src[1].arg)  # buffer_device, inlined: this loop is the per-op hot path
        prog = _program_cache.get((device, it.ast))
        if prog is None:
            prog = _compile(it.ast, device)
        if capture is not None:
            for b in it.bufs:  # a replay maps these buffers: have them all exist now
                get_buffer(b)
            capture.append(("kernel", (prog, it)))
        t0 = 0
        if queued is not None and type(prog) is _CompiledProgram:
            queued.add(prog.device)
            prog.submit(it.bufs, it.var_vals, [_inflight[d][:2] for d in _copies_into(it.bufs)] if _inflight else ())
            t = 0.0  # (not timed: it runs on the device's engine thread while this thread goes on)
        else:
            if queued:  # a kernel run here reads what the queued kernels of its device write
                _wait_compute(queued)
            if _inflight:
                wait_copies(it.bufs)
            t0 = profile.now_ns() if profile.enabled() else 0
            t = prog.run(it.bufs, it.var_vals)
        ops, mem = _cached_estimate(prog, it)
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += ops
        GlobalCounters.global_mem += mem
        GlobalCounters.time_sum_s += t
        if t0:
            profile.record("kernel", prog.name, device, t0, profile.now_ns(), ops, mem)
        if DEBUG.value >= 2:
            _debug_line(device, prog.name, len(it.bufs), t, ops, mem)
    if queued:
        _wait_compute(queued, raise_errors=True)
    if _inflight:
        wait_copies()


def _side_by_side(items: list[ScheduleItem]) -> set[Any] | None:
    """An empty set to collect devices in when the schedule's kernels should be queued on their devices' engines
    rather than run one by one on this thread: kernels on several devices that all run on host memory (an allreduce:
    each device's kernels then run beside the others' and beside the copies), and nothing that times each kernel
    (DEBUG>=2, PROFILE). Else None."""
    if DEBUG.value >= 2 or profile.enabled():
        return None
    first: Any = None
    for it in items:
        if it.ast is not None:
            d = it.bufs[0].src[1].arg
            if first is None:
                first = d
            elif d != first:
                break
    else:
        return None
    for it in items:
        for b in it.bufs:
            if not _host_kernel_device(str(b.src[1].arg)):
                return None
    return set()


def _host_kernel_device(name: str) -> bool:
    """name runs compiled kernels on host memory (a CPU device)."""
    if (ok := _host_kernel_devices.get(name)) is None:
        from speck.hcq import Device

        dev = Device[name]
        ok = _host_kernel_devices[name] = bool(dev.backend_name) and dev.host_visible and "compute" in dev.engines
    return ok


_host_kernel_devices: dict[str, bool] = {}


def _wait_compute(devices: set[Any], raise_errors: bool = False) -> None:
    """Wait until the kernels queued on `devices` (by a schedule run side by side) have run; raise_errors: a failed
    one's error (the engine latched it), after waiting for every device."""
    for dev in devices:
        eng = dev.engines["compute"]
        if eng.timeline.mem[0] < eng.submitted:
            eng.timeline.wait(eng.submitted)
    if raise_errors:
        for dev in devices:
            if dev.engines["compute"].error is not None:
                dev.synchronize()  # raises it


# ---------------- the warm path ----------------
# Realizing a graph whose structure was scheduled before (a cached Plan, see schedule.schedule_with_cache) with every
# kernel compiled is the per-op hot path: `(a+b).realize()` again and again, a training step's ops. It skips building
# ScheduleItems and run_schedule's per-item work: each kernel's hcq program, static launch size, buffer slots in launch
# order and estimates are looked up once per plan, and its kernels are submitted back to back with one synchronize
# at the end (the general path waits for every kernel to time it), or - small kernels, from the plan's second run -
# as one device graph whose argument table gets the buffers' addresses. Kernel time is only measured where it is shown
# (DEBUG>=2, PROFILE), and those - like a TinyJit capture, ALLOW_DEVICE_USAGE=0, copies in flight, plans with copies
# or variables, or a program cache that no longer holds the plan's programs - take the general path.
class _FastPlan:
    __slots__ = ("device", "fresh", "graph", "kernels", "lock", "out_ref", "out_shape", "plan", "runs")

    def __init__(self, plan: Plan, kernels: list[tuple[tuple[str, UOp], Any, Any, tuple[int, ...], int, int]]):
        self.plan, self.fresh, self.out_ref = plan, plan.fresh, plan.out_ref
        # (program cache key, program, its hcq program, buffer refs in launch order, ops, bytes) per kernel
        self.kernels = tuple(kernels)
        self.device = kernels[-1][2].device  # the hcq device they run on (a plan without copies stays on one)
        out_size = plan.fresh[~plan.out_ref][1]
        self.out_shape = None if plan.shape == (out_size,) else plan.shape  # the output's view: a reshape or none
        # from the second run on, plans of single-threaded kernels launch as one device graph (one native call with
        # one argument, where a kernel's own launch converts every address through ctypes): (graph, its argument
        # table, the table index of each kernel's buffers); False when the plan can't have one. `lock`: one thread
        # rewrites the table at a time (another one meanwhile launches kernel by kernel)
        self.graph: tuple[Any, Any, tuple[tuple[int, ...], ...]] | bool | None = None
        self.lock = threading.Lock()
        self.runs = 0


def _fast_plan(plan: Plan, inputs: list[UOp]) -> _FastPlan | bool:
    """The warm-path form of a plan; False when the plan can never take it, True when not yet (a program is not
    compiled)."""
    items, _ = plan.instantiate(inputs)
    kernels: list[tuple[tuple[str, UOp], Any, Any, tuple[int, ...], int, int]] = []
    for it, (_, refs, _, _) in zip(items, plan.recipe):
        if it.ast is None or it.var_vals:
            return False
        key = (str(it.bufs[0].src[1].arg), it.ast)
        prog = _program_cache.get(key)
        if prog is None:
            return True
        if not isinstance(prog, _CompiledProgram) or prog.static_gs is None:
            return False
        ops, mem = _cached_estimate(prog, it)
        kernels.append((key, prog, prog.prog, tuple(refs[s] for s in prog.slots), ops, mem))
    return _FastPlan(plan, kernels) if kernels else False


def _run_fast(fp: _FastPlan, inputs: list[UOp]) -> UOp | None:
    """Run a plan's kernels on `inputs` and fresh buffers; returns the output's view, or None (nothing run) when the
    program cache no longer holds the plan's programs."""
    cache = _program_cache
    for key, prog, _, _, _, _ in fp.kernels:
        if cache.get(key) is not prog:
            fp.plan.fast = None  # rebuilt from the programs there now on the next hit
            return None
    fresh, fresh_bufs = [], []
    for d, n, dt in fp.fresh:  # new BUFFERs and their (not yet allocated) hcq Buffers
        u = new_buffer_uop(d, n, dt)
        buffer_map[u] = fb = _HcqBuffer(d, n, dt)
        fresh.append(u)
        fresh_bufs.append(fb)
    bm, gc = buffer_map_data, GlobalCounters
    calls = []
    for _, _, _, refs, _, _ in fp.kernels:
        hb = []
        for r in refs:
            if r < 0:
                hb.append(fresh_bufs[~r])
            elif (b := bm.get(_ref(inputs[r]))) is not None:
                hb.append(b)
            else:
                hb.append(get_buffer(inputs[r]))
        calls.append(hb)
    g = fp.graph
    if g is not None and g is not False and fp.lock.acquire(blocking=False):
        try:
            graph, table, where = g  # type: ignore[misc]
            for (_, _, hcq_prog, _, _, _), hb, slots in zip(fp.kernels, calls, where):
                hcq_prog.check_args(hb, ())  # what each launch checks (a buffer's storage may be anything)
                for k, b in zip(slots, hb):
                    table[k] = b.ptr  # (.ptr gives a buffer without memory its memory)
            graph.replay()  # (waits for the graph) the schedule is done when realize returns
        finally:
            fp.lock.release()
    else:
        for (_, prog, hcq_prog, _, _, _), hb in zip(fp.kernels, calls):
            hcq_prog.enqueue(hb, prog.static_gs)  # (a call gives buffers without memory their memory)
        fp.device.synchronize()  # (cheap when the engine ran them inline) the schedule is done when realize returns
        fp.runs += 1
        if g is None and fp.runs >= 2:
            fp.graph = _plan_graph(fp, calls)
    for _, _, _, _, ops, mem in fp.kernels:
        gc.kernel_count += 1
        gc.global_ops += ops
        gc.global_mem += mem
    out = fresh[~fp.out_ref]
    return out if fp.out_shape is None else out.reshape(fp.out_shape)


def _plan_graph(fp: _FastPlan, calls: list[list[Any]]) -> tuple[Any, Any, tuple[tuple[int, ...], ...]] | bool:
    """A device graph of a plan's kernels on the buffers they just ran on; False when the device has no graph class,
    a kernel would split across workers (its own launch picks the split), or building fails."""
    dev = fp.device
    graph_cls = getattr(dev, "graph", None)
    if graph_cls is None or not hasattr(graph_cls, "replay") or not hasattr(graph_cls, "prepare"):
        return False
    for (_, _, hcq_prog, _, _, _), hb in zip(fp.kernels, calls):
        if not graph_cls.supports(hcq_prog, len(hb)) or dev.choose_threads(hcq_prog, hb) != 1:
            return False
    try:
        graph = graph_cls(dev, name=f"plan[{len(fp.kernels)}]")
        where = []
        for (_, prog, hcq_prog, _, _, _), hb in zip(fp.kernels, calls):
            cmd = graph.add_exec(hcq_prog, hb, prog.static_gs, threads=1)
            where.append(tuple(graph.arg_index(cmd, j) for j in range(len(hb))))
        graph.prepare()  # (an interpreter that can't be built fails here, not in a later realize)
        table = graph.args  # (built now: no command is added later, so the table stays this one)
    except Exception as e:  # e.g. no llvmlite for the graph interpreter: the kernels keep launching one by one
        if DEBUG >= 1:
            print(f"speck.tensor: the warm path launches {len(fp.kernels)} kernel(s) one by one: {e!r}")
        return False
    return graph, table, tuple(where)


def realize_graph(u: UOp, device: str) -> UOp:
    """Compute u (a single-device graph, not realized yet) on `device`; returns the view of the buffer holding it."""
    found = cached_plan(u, device)
    if (
        found is not None
        and (plan := found[2]) is not None
        and CAPTURE is None
        and ALLOW_DEVICE_USAGE.value  # (run_schedule raises DeviceUsageError)
        and not _inflight
        and DEBUG.value < 2
        and not profile.enabled()
    ):
        fp = plan.fast
        if fp is None or fp is True:
            fp = plan.fast = _fast_plan(plan, found[1])
        if isinstance(fp, _FastPlan) and (view := _run_fast(fp, found[1])) is not None:
            return view
    items, view = schedule_with_cache(u, device, found)
    run_schedule(items)
    return view


def _debug_line(device: str, name: str, nbufs: int, t: float, ops: int, mem: int) -> None:
    gflops = ops / t * 1e-9 if t > 0 else 0.0
    gbs = mem / t * 1e-9 if t > 0 else 0.0
    print(
        f"*** {device:7s} {GlobalCounters.kernel_count:4d} {name:36s} arg {nbufs:3d} "
        f"mem {GlobalCounters.mem_used_bytes() / 1e9:7.3f} GB "
        f"tm {t * 1e6:10.2f}us/{GlobalCounters.time_sum_s * 1e3:9.2f}ms "
        f"({gflops:9.2f} GFLOPS {gbs:7.2f} GB/s)"
    )


def replay(kind: str, item: Any, mapping: dict[UOp, UOp]) -> None:
    """Run one captured call again with some BUFFERs swapped (TinyJit replays). An "assign" (dst, src) item copies
    src's contents into dst, which is what Tensor.assign's buffer swap did during the capture."""
    if _inflight:  # a replayed call reads (or overwrites) what a copy in flight may still be writing
        wait_copies(
            [mapping.get(b, b) for b in item[1].bufs] if kind == "kernel"
            else [mapping.get(item.bufs[0], item.bufs[0])] if kind == "copy" else None
        )  # fmt: skip
    if kind == "host":  # a host function recorded with the buffers it works on (an MPI collective)
        fn, bufs = item
        fn([mapping.get(b, b) for b in bufs])
        return
    if kind == "assign":
        dst, src = (mapping.get(b, b) for b in item)
        get_buffer(dst).copy_from(get_buffer(src))
        return
    if kind == "copy":
        it = item
        _run_copy(ScheduleItem(None, tuple(mapping.get(b, b) for b in it.bufs), it.var_vals, it.copy_offset)
                  if any(b in mapping for b in it.bufs) else it)  # fmt: skip
        return
    prog, it = item
    t0 = profile.now_ns() if profile.enabled() else 0
    t = prog.run([mapping.get(b, b) for b in it.bufs], it.var_vals)
    ops, mem = _cached_estimate(prog, it)
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += ops
    GlobalCounters.global_mem += mem
    GlobalCounters.time_sum_s += t
    if t0:
        profile.record("kernel", prog.name, buffer_device(it.bufs[0]), t0, profile.now_ns(), ops, mem)
    if DEBUG >= 2:
        _debug_line(buffer_device(it.bufs[0]), prog.name, len(it.bufs), t, ops, mem)


# ---------------- copies between devices ----------------
# A copy from one device to another is a command on the destination's HCQ copy engine, run on that engine's own
# thread (a memmove without the GIL on CPU devices), so it overlaps with the kernels the schedule runs next on
# this thread. It waits for the work that produced its data (the source device's kernels, copies into the source's
# memory); a kernel, a replayed call or a host read that needs the copied memory waits on the copy engine's timeline
# for it (any copy in flight that writes part of it: _copies_into). Every schedule and
# TinyJit replay ends with its copies complete, so nothing outlives the call that started it.
_inflight: dict[UOp, tuple[Any, int, UOp, int, int]] = {}  # destination BUFFER -> (copy engine's timeline signal,
# value, and the memory the copy writes as _extent gives it)


def _extent(b: UOp) -> tuple[UOp, int, int]:
    """(root BUFFER, first byte, end byte) of the memory BUFFER b names: a region of another buffer's (an
    allreduce's chunks, schedule.view_buffer_uop), or all of its own."""
    lo, n = 0, int(b.arg) * b.dtype.itemsize
    while (region := buffer_views.get(b)) is not None:
        b, off = region
        lo += off
    return b, lo, lo + n


def _copies_into(bufs: Sequence[UOp]) -> list[UOp]:
    """The destinations of copies in flight that write memory of any of `bufs` (the same buffer, a region of it, or
    a buffer it is a region of)."""
    ext = [_extent(b) for b in bufs]
    return [d for d, (_, _, root, lo, hi) in _inflight.items()
            if any(r is root and a < hi and lo < e for r, a, e in ext)]  # fmt: skip


def wait_copies(bufs: Sequence[UOp] | None = None) -> None:
    """Wait for the copies in flight into `bufs` (every copy when None)."""
    for b in list(_inflight) if bufs is None else _copies_into(bufs):
        if (w := _inflight.pop(b, None)) is not None:
            sig, value = w[0], w[1]
            sig.wait(value)
            if sig.error is not None:
                raise RuntimeError(f"a copy into {b.src[1].arg} failed: {sig.error}") from sig.error


def wait_copies_into(device: str) -> None:
    """Wait for the copies in flight into buffers of `device` (before a batch of its kernels runs)."""
    wait_copies([b for b in _inflight if buffer_device(b) == device])


def _async_copy(dst: UOp, src: UOp, sb: Any, db: Any, offset: int) -> bool:
    """Submit dst <- src[offset:] (elements) to dst's device's copy engine; False when the devices can't (a
    device whose memory the host can't map, DISK). The copy waits for the source device's kernels and for the
    copies in flight into the source's memory only: waiting for all the source device's copies would chain the
    copies of one ring step one after another (each device receives while it sends)."""
    sdev, ddev = sb.dev, db.dev
    if not (sdev.backend_name and ddev.backend_name and sdev.host_visible == ddev.host_visible):
        return False
    nbytes = int(dst.arg) * dst.dtype.itemsize
    sb.ensure_allocated()
    db.ensure_allocated()
    view = sb if offset == 0 and sb.nbytes == nbytes else sb.view(int(dst.arg), sb.dtype, offset * src.dtype.itemsize)
    q = ddev.hw_queue("copy")
    for eng in (sdev.engines["compute"], ddev.engines["compute"]):  # kernels that write the source or may use dst
        if eng.timeline.mem[0] < eng.submitted:
            q.wait(eng.timeline, eng.submitted)
    if _inflight:
        for d in _copies_into((src,)):
            q.wait(_inflight[d][0], _inflight[d][1])
    engine = ddev.engines["copy"]
    q.copy(db, view, nbytes).submit(ddev, background=True)
    _inflight[dst] = (engine.timeline, engine.submitted, *_extent(dst))
    return True


def _run_copy(it: ScheduleItem) -> None:
    dst, src = it.bufs
    t0, p0 = time.perf_counter(), (profile.now_ns() if profile.enabled() else 0)
    n = int(dst.arg)
    sb, db = get_buffer(src), get_buffer(dst)
    if sb.dev is not db.dev:  # a device-to-device copy: counted (a kernel of the schedule, and a copy)
        GlobalCounters.kernel_count += 1
        GlobalCounters.copy_count += 1
        if _async_copy(dst, src, sb, db, it.copy_offset):
            if p0:  # (the submission; the copy itself runs on the copy engine, which PROFILE also records)
                profile.record("copy", f"copy {n * dst.dtype.itemsize}B", buffer_device(dst), p0, profile.now_ns(),
                               nbytes=n * dst.dtype.itemsize)  # fmt: skip
            if DEBUG >= 2:
                _debug_line(buffer_device(dst), f"copy {n * dst.dtype.itemsize}B from {buffer_device(src)}", 2,
                            time.perf_counter() - t0, 0, 0)  # fmt: skip
            return
    if buffer_device(dst)[:5] == "DISK:":
        writable_disk(db)
    # a device that moves data itself (USB: its copy queue) defines transfer(dest, src) and does copies to or from it
    transfer = getattr(db.dev, "transfer", None) or getattr(sb.dev, "transfer", None)
    if transfer is not None:
        whole = it.copy_offset == 0 and int(src.arg) == n
        transfer(db, sb if whole else sb.view(n, src.dtype, it.copy_offset * src.dtype.itemsize))
    elif it.copy_offset == 0 and int(src.arg) == n:
        db.copy_from(sb)
    else:
        data = np.ascontiguousarray(buffer_numpy(src)[it.copy_offset : it.copy_offset + n])
        db.copyin(data)
    if p0:
        profile.record("copy", f"copy {n * dst.dtype.itemsize}B", buffer_device(dst), p0, profile.now_ns(),
                       nbytes=n * dst.dtype.itemsize)  # fmt: skip
    if DEBUG >= 2:
        _debug_line(buffer_device(dst), f"copy {n * dst.dtype.itemsize}B", 2, time.perf_counter() - t0, 0, 0)
