"""`ProgramSpec` (what a runtime needs to run one kernel) and `to_program` (kernel AST -> ProgramSpec)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speck.codegen import lowered_cache
from speck.codegen.errors import ProgramFormError
from speck.codegen.kernel_info import Estimates, KernelInfo
from speck.codegen.renderer.common import outer_global_range
from speck.uop import AxisType, GroupOp, PtrDType, UOp, dtypes, sint
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_ACCESS = frozenset({Ops.LOAD, Ops.STORE})  # (a set: a tuple of members would be built per uop)

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


@dataclass(frozen=True)
class BufferArg:
    """One buffer parameter: slot (argument position), element dtype, size in elements, role "in"/"out"/"inout"."""

    slot: int
    dtype: Any
    size: int
    role: str

    def __iter__(self) -> Any:  # (index, dtype, size, role) tuple view, as CPU_ABI.md lists it
        return iter((self.slot, self.dtype, self.size, self.role))


@dataclass
class ProgramSpec:
    """A lowered, rendered (and optionally compiled) kernel: everything a runtime needs to launch it.

    global_size[0] is the extent of the outermost GLOBAL range, the dimension the CPU ABI slices across workers
    (ints, or weakint UOps of variables); local_size is None on CPUs. A GPU program launches global_size
    workgroups (x, y, z) of local_size work-items each (see `launch_size`). vars are the DEFINE_VAR UOps in argument
    order (by name); buffers are ordered by slot."""

    name: str
    src: str
    uops: list[UOp]
    global_size: tuple[sint, ...]
    local_size: tuple[int, ...] | None
    buffers: list[BufferArg]
    vars: list[UOp]
    estimates: Estimates
    renderer: str
    lib: bytes | None = None
    applied_opts: tuple[Any, ...] = ()
    ast: UOp | None = field(default=None, repr=False)

    def launch_dims(self, var_vals: dict[str, int] | None = None) -> tuple[int, ...]:
        """global_size with variables substituted."""
        from speck.uop.symbolic import sym_infer

        return tuple(d if isinstance(d, int) else int(sym_infer(d, var_vals or {})) for d in self.global_size)

    @property
    def var_names(self) -> list[str]:
        return [v.arg[0] for v in self.vars]

    # tinygrad's ProgramSpec names for what `buffers` holds: argument slots, those written, those read
    @property
    def globals(self) -> list[int]:
        return [b.slot for b in self.buffers]

    @property
    def outs(self) -> list[int]:
        return [b.slot for b in self.buffers if b.role in ("out", "inout")]

    @property
    def ins(self) -> list[int]:
        return [b.slot for b in self.buffers if b.role in ("in", "inout")]

    @property
    def function_name(self) -> str:
        """The symbol the rendered source defines (the kernel's name)."""
        return self.name


def buffer_args(uops: list[UOp]) -> list[BufferArg]:
    """Buffer parameters of a program with their roles (stored to -> out, loaded -> in, both -> inout)."""
    params = {u: u for u in uops if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType)}
    loaded: set[int] = set()
    stored: set[int] = set()
    for u in uops:
        if u.op in _ACCESS and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.PARAM:
            slot = _slot(u.src[0].src[0])
            (stored if u.op is Ops.STORE else loaded).add(slot)
    out = []
    for p in sorted(params, key=_slot):
        s = _slot(p)
        assert isinstance(p.dtype, PtrDType)
        role = "inout" if s in loaded and s in stored else "out" if s in stored else "in"
        out.append(BufferArg(s, p.dtype.base, p.dtype.size, role))
    return out


def _slot(p: UOp) -> int:
    return int(p.arg if isinstance(p.arg, int) else p.arg[0])


def reads_only_where_it_stores(ast: UOp, store_slot: int, read_slot: int) -> bool:
    """Whether the kernel `ast` stays exact with buffer `read_slot` passed as its output `store_slot` too (written
    in place): it has one STORE, into `store_slot`, and reads `read_slot` only by LOADs at that STORE's very index
    (the same UOp), so each element is read only while computing the element stored over it, before that store
    (the stored value depends on the load). A kernel that reads the buffer anywhere else (a shifted or transposed
    element, or through a gather) is not."""
    nodes = ast.toposort()
    stores = [u for u in nodes if u.op is Ops.STORE]
    if len(stores) != 1 or stores[0].src[0].op is not Ops.INDEX or len(stores[0].src[0].src) < 2:
        return False
    sidx = stores[0].src[0]
    if sidx.src[0].op is not Ops.PARAM or _slot(sidx.src[0]) != store_slot:
        return False
    reads: set[UOp] = set()  # the INDEX nodes over read_slot
    for u in nodes:
        for s in u.src:
            if s.op is Ops.PARAM and _slot(s) == read_slot:
                if u.op is not Ops.INDEX or s is not u.src[0] or len(u.src) < 2 or u.src[1] is not sidx.src[1]:
                    return False
                reads.add(u)
    # (each such INDEX feeds LOADs only: no store through it, no other use of the address)
    return all(u.op is Ops.LOAD for u in nodes for s in u.src if s in reads)


def estimate(uops: list[UOp]) -> Estimates:
    """Count ALU ops and loaded bytes (lds), multiplying by the trip counts of enclosing loops (symbolic when a
    loop end is a variable expression). `mem` is the global memory a run touches: per buffer, its loads and its
    stores each count at most the part of the buffer their indices reach (a matmul reads each input once as far as
    memory traffic goes, as tinygrad's estimate says: GlobalCounters.global_mem is proportional to the data, not to
    the loop nest)."""
    mult: sint = 1
    stack: list[sint] = []
    ops: sint = 0
    lds: sint = 0
    touched: dict[tuple[int, Ops], sint] = {}
    cap: dict[tuple[int, Ops], int] = {}
    span: dict[tuple[int, Ops], tuple[int, int]] = {}
    esz: dict[tuple[int, Ops], int] = {}
    # address arithmetic is not the kernel's work (tinygrad's estimate leaves it out too): ALU ops that only feed an
    # INDEX (or a gate) are not counted
    # (one walk with a shared visited set: a gated toposort per access re-walked the shared index math each time)
    dont_count: set[UOp] = set()
    todo = [u.src[0] for u in uops if u.op in _ACCESS and u.src[0].op is Ops.INDEX]
    while todo:
        x = todo.pop()
        if x in dont_count:
            continue
        dont_count.add(x)
        if x.op is not Ops.LOAD and x.op is not Ops.RANGE:
            todo.extend(x.src)

    def mul(a: sint, b: sint) -> sint:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        return _wi(a) * _wi(b)

    def add(a: sint, b: sint) -> sint:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        return _wi(a) + _wi(b)

    # a GPU program's GLOBAL/LOCAL ranges became SPECIAL ids (speck.codegen.lower.gpudims): every op runs once per
    # id, so the whole program counts launch-size times (without this an AMD kernel counted one work-item's work)
    for sp in {u.arg: u for u in uops if u.op is Ops.SPECIAL}.values():
        mult = mul(mult, _trip(sp))
    for u in uops:
        if u.op is Ops.RANGE:
            stack.append(mult)
            mult = mul(mult, _trip(u))
        elif u.op is Ops.END:
            mult = stack.pop()
        elif u.op in GroupOp.ALU and u not in dont_count:
            ops = add(ops, mul(mult, u.dtype.count))
        elif u.op in _ACCESS:
            dt = u.dtype if u.op is Ops.LOAD else u.src[1].dtype
            nbytes = dt.itemsize * dt.count
            if u.src[0].op is Ops.INDEX and (p := u.src[0].src[0]).op is Ops.PARAM:
                key: tuple[int, Ops] = (_slot(p), u.op)
                touched[key] = add(touched.get(key, 0), mul(mult, nbytes))
                if isinstance(p.dtype, PtrDType) and p.dtype.size > 0:
                    cap.setdefault(key, p.dtype.size * p.dtype.base.itemsize)
                    esz[key] = p.dtype.base.itemsize
                # the elements the index can reach (a view's part of a bigger buffer reads only that part)
                idx = u.src[0].src[1] if len(u.src[0].src) > 1 else None
                lo, hi = (idx.vmin, idx.vmax) if idx is not None else (None, None)
                if type(lo) is int and type(hi) is int:
                    r = span.get(key)
                    span[key] = (lo, hi + dt.count - 1) if r is None else (min(r[0], lo), max(r[1], hi + dt.count - 1))
            if u.op is Ops.LOAD:
                lds = add(lds, mul(mult, nbytes))
    mem: sint = 0
    for k, n in touched.items():
        if isinstance(n, int) and k in cap:
            if (r := span.get(k)) is not None:
                cap[k] = min(cap[k], (r[1] - r[0] + 1) * esz[k])
            n = min(n, cap[k])
        mem = add(mem, n)
    return Estimates(_simp(ops), _simp(mem), _simp(lds))


def _wi(x: sint) -> UOp:
    if isinstance(x, UOp):
        return x.cast(dtypes.weakint) if x.dtype != dtypes.weakint else x
    return UOp.const(dtypes.weakint, x)


def _simp(x: sint) -> sint:
    from speck.uop import ssimplify

    return ssimplify(x) if isinstance(x, UOp) else x


def _trip(r: UOp) -> sint:
    """The trip count of a program RANGE: an int, or a weakint expression of the variables."""
    end = r.src[0]
    v = _const_value(end)
    if v is not None:
        return int(v)
    if any(n.op is Ops.RANGE for n in end.toposort()):
        # a loop bounded by an enclosing loop's index (bounded tap loops): its largest trip count, so the estimate
        # stays an upper bound that needs no loop index to evaluate
        return int(end.vmax)
    return _as_weak_expr(end)


def _const_value(u: UOp) -> Any:
    if u.op is Ops.CAST and u.src[0].op is Ops.CONST:
        return u.src[0].arg
    if u.op is Ops.CONST:
        return u.arg
    return None


def _as_weak_expr(u: UOp) -> UOp:
    """Rebuild a program int expression (casted consts, int32 variables) as a weakint expression."""
    memo: dict[UOp, UOp] = {}
    for n in u.toposort():
        if n.op is Ops.CAST and n.src[0].op is Ops.CONST:
            memo[n] = UOp.const(dtypes.weakint, int(n.src[0].arg))
        elif n.op is Ops.CONST:
            memo[n] = UOp.const(dtypes.weakint, int(n.arg))
        elif n.op is Ops.DEFINE_VAR:
            memo[n] = n.replace(dtype=dtypes.weakint)
        elif n.op is Ops.CAST:
            memo[n] = memo[n.src[0]]
        elif n.op in GroupOp.ALU:
            memo[n] = UOp(n.op, dtypes.weakint if n.dtype != dtypes.bool else n.dtype, tuple(memo[s] for s in n.src))
        else:
            memo[n] = n
    return memo[u]


def global_size(uops: list[UOp]) -> tuple[sint, ...]:
    """global_size[0] = extent of the outermost GLOBAL range (the dimension CPU workers split), then the other
    GLOBAL ranges in order; padded with 1s to three dimensions."""
    outer = outer_global_range(uops)
    dims: list[sint] = []
    if outer is not None:
        dims.append(_trip(outer))
    for u in uops:
        if u.op is Ops.RANGE and u.arg[-1] is AxisType.GLOBAL and u is not outer:
            dims.append(_trip(u))
    dims += [1] * (3 - len(dims))
    return tuple(dims)


def launch_size(uops: list[UOp], gpu: bool) -> tuple[tuple[sint, ...], tuple[int, ...] | None]:
    """(global_size, local_size) of a program. A GPU program (`gpu`: lowered for a renderer with workgroups; its ids
    are SPECIALs, speck.codegen.lower.gpudims) launches global_size workgroups (x, y, z) of local_size work-items: the
    sizes of its gidx<d> and lidx<d> ids (1 for a dimension without one). A CPU program has no local size; its
    global_size is `global_size(uops)`."""
    if not gpu:
        return global_size(uops), None
    specials = {u.arg: u for u in uops if u.op is Ops.SPECIAL}

    def dims(prefix: str) -> list[sint]:
        return [_trip(specials[f"{prefix}{d}"]) if f"{prefix}{d}" in specials else 1 for d in range(3)]

    local = [x for x in dims("lidx") if isinstance(x, int)]
    if len(local) != 3:
        raise ProgramFormError(f"a GPU program's workgroup size must be constant, got {dims('lidx')}")
    return tuple(dims("gidx")), tuple(local)


_gc_pause_lock = threading.Lock()
_YOUNG_MANY = 20_000  # allocations pending when a pause ends beyond which the young survivors are collected at once
_gc_pause_depth = [0, False]  # open gc_paused() blocks, and whether the outermost one found collection on


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Lowering builds tens of thousands of short-lived nodes, and the cyclic collector's passes over them (and over
    every live object, for the oldest generation) took ~8% of a cold CNN step's lowering while freeing nothing: UOp
    graphs are acyclic and die by reference counting. Collection resumes (if it was on) when the outermost block
    ends: a caller lowering a batch of kernels wraps the whole batch, so the collector runs once after it instead of
    after every kernel (each of those passes walked every node the kernels before had left alive)."""
    with _gc_pause_lock:
        if _gc_pause_depth[0] == 0:
            _gc_pause_depth[1] = gc.isenabled()
            gc.disable()
        _gc_pause_depth[0] += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pause_depth[0] -= 1
            resume = _gc_pause_depth[0] == 0 and _gc_pause_depth[1]
            if resume:
                gc.enable()
        if resume and gc.get_count()[0] > _YOUNG_MANY:
            # what the block left alive (programs, memos: ~250k objects after a cold CNN step's batch) goes to the
            # oldest generation in one pass; the collector on its own walks it twice (young, then middle generation)
            gc.collect(1)


def to_program(ast: UOp, renderer: Renderer, compiler: Any = None, optimize: bool = True,
               beam_timer: Any = None, beam_tag: str = "") -> ProgramSpec:  # fmt: skip
    """Lower a kernel AST for `renderer`, render it, and compile it when `compiler` is given (anything with a
    `compile(src) -> bytes` method). The result carries name, source, object bytes, launch sizes, buffer roles,
    variables and estimates. `beam_timer(spec) -> seconds` times BEAM candidates (BEAM>=1) on a device."""
    import time

    from speck.codegen.pipeline import full_rewrite_to_sink
    from speck.uop import DEBUG

    t0 = time.perf_counter()
    # a warm cache hands back the rendered program without lowering (speck.codegen.lowered_cache)
    cached = lowered_cache.usable(beam_timer)
    key = lowered_cache.lowered_key(ast, renderer, optimize) if cached and lowered_cache.may_hold(renderer) else ""
    hit = lowered_cache.get(key, renderer) if key else None
    if hit is not None:
        name, src, uops, gsize, lsize, bufs, kvars, est, applied = hit
        t1 = t2 = time.perf_counter()
    else:
        # BEAM times a candidate kernel by rendering it (with its opts fixed) and handing the ProgramSpec to beam_timer
        kernel_timer = (lambda cand: float(beam_timer(to_program(cand, renderer)))) if beam_timer is not None else None
        with gc_paused():
            uops = full_rewrite_to_sink(ast, renderer, optimize=optimize, beam_timer=kernel_timer, beam_tag=beam_tag)
            t1 = time.perf_counter()
            src = renderer.render(uops)
        t2 = time.perf_counter()
        info = uops[-1].arg if isinstance(uops[-1].arg, KernelInfo) else KernelInfo()
        name, applied = info.name, info.applied_opts
        (gsize, lsize), bufs, est = launch_size(uops, renderer.has_local), buffer_args(uops), estimate(uops)
        kvars = sorted([u for u in uops if u.op is Ops.DEFINE_VAR], key=lambda v: v.arg[0])
        if cached:
            entry = (name, src, uops, gsize, lsize, bufs, kvars, est, applied)
            if key:
                lowered_cache.put(key, renderer, entry)
            else:  # a cold cache: the key's hashing is left to the write
                lowered_cache.put_later(ast, renderer, optimize, entry)
    lib = compiler.compile(src) if compiler is not None else None
    t3 = time.perf_counter()
    if DEBUG >= 2:
        print(f"to_program {name}: lower {1e3 * (t1 - t0):.2f} ms{' (cached)' if hit is not None else ''}, render "
              f"{1e3 * (t2 - t1):.2f} ms, compile {1e3 * (t3 - t2):.2f} ms")  # fmt: skip
    return ProgramSpec(
        name=name,
        src=src,
        uops=uops,
        global_size=gsize,
        local_size=lsize,
        buffers=bufs,
        vars=kvars,
        estimates=est,
        renderer=renderer.name,
        lib=lib,
        applied_opts=applied,
        ast=ast,
    )


__all__ = [
    "BufferArg",
    "ProgramSpec",
    "buffer_args",
    "estimate",
    "gc_paused",
    "global_size",
    "launch_size",
    "reads_only_where_it_stores",
    "to_program",
]
