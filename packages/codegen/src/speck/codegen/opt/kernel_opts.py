"""Optimizer actions (`Opt`) and `apply_opts`, which rewrites a kernel AST's ranges to carry them out.

Axis numbering: `axis` of UPCAST/THREAD/PADTO/SWAP/LOCAL counts the kernel's output-side ranges (GLOBAL/THREAD/
LOOP, by axis id); `axis` of UNROLL/GROUP/GROUPTOP counts its REDUCE ranges (by axis id). An amount of 0 means
"the whole range". Every action is a range split `r -> outer*amt + inner` (the inner part gets the new type), a
reordering, or padding; the expander later turns UPCAST/UNROLL parts into vector lanes."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from speck.codegen.errors import OptError
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.lower.expander import index_offset
from speck.codegen.lower.gates import and_gate
from speck.codegen.lower.simplify import pm_simplify
from speck.uop import AxisType, UOp, dtypes, graph_rewrite
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


class OptOps(enum.Enum):
    """The optimizer's actions (those that fit CPU targets are implemented; LOCAL/GROUP need local memory)."""

    UPCAST = 1  # split an output range, the inner part becomes vector lanes
    UNROLL = 2  # split a reduce range, the inner part becomes vector lanes reduced horizontally
    LOCAL = 3  # split an output range into workgroup-local threads (needs Renderer.has_local)
    THREAD = 4  # split an output range: the outer part becomes the outermost GLOBAL range CPU workers slice
    GROUP = 5  # split a reduce range across local threads (needs Renderer.has_local)
    GROUPTOP = 6
    PADTO = 7  # round an output range up to a multiple, gating loads and the store
    SWAP = 8  # exchange the loop order of two output ranges
    NOLOCALS = 9  # forbid LOCAL/GROUP later in the list (a no-op on CPUs)

    def __repr__(self) -> str:
        return f"OptOps.{self.name}"


@dataclass(frozen=True, order=True)
class Opt:
    """One optimizer action: op, axis (see module docstring), arg (amount, or the other axis for SWAP)."""

    op: OptOps
    axis: int | None = None
    arg: int | None = None

    def __repr__(self) -> str:
        return f"Opt({self.op.name}, {self.axis}, {self.arg})"

    def to_json(self) -> list[Any]:
        return [self.op.name, self.axis, self.arg]

    @staticmethod
    def from_json(x: list[Any]) -> Opt:
        return Opt(OptOps[x[0]], x[1], x[2])


_OUTPUT_TYPES = (AxisType.GLOBAL, AxisType.THREAD, AxisType.LOOP, AxisType.LOCAL)


def output_axes(sink: UOp) -> list[UOp]:
    """The output-side ranges opts can address, in axis-id order."""
    return sorted({u for u in sink.toposort() if u.op is Ops.RANGE and u.arg[-1] in _OUTPUT_TYPES},
                  key=lambda r: r.arg[:-1])  # fmt: skip


def reduce_axes(sink: UOp) -> list[UOp]:
    return sorted({u for u in sink.toposort() if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE},
                  key=lambda r: r.arg[:-1])  # fmt: skip


def stride(idx: UOp, r: UOp) -> int | None:
    """d idx / d r as a constant, or None when it isn't one."""
    return index_offset(idx, idx.substitute({r: r + 1}))


def pow2_amount(n: int, limit: int) -> int:
    """The largest power of two dividing n, at most `limit`."""
    amt = 1
    while amt * 2 <= limit and n % (amt * 2) == 0:
        amt *= 2
    return amt


def unmasked_index(ix: UOp) -> UOp:
    """The index expression of INDEX ix without its validity gate."""
    i = ix.src[1]
    return i.src[1] if i.op is Ops.WHERE else i


def const_size(r: UOp) -> int | None:
    e = r.src[0]
    return int(e.arg) if e.op is Ops.CONST and isinstance(e.arg, int) else None


def _next_axis(sink: UOp) -> int:
    return 1 + max([a for u in sink.toposort() if u.op is Ops.RANGE for a in u.arg[:-1]], default=-1)


def replace_range(sink: UOp, r: UOp, parts: list[UOp], expr: UOp) -> UOp:
    """Replace RANGE r by `expr` in values and by `parts` (in order) in END/REDUCE range lists."""
    new: dict[UOp, UOp] = {r: expr}
    for u in sink.toposort():
        if u is r or u in new:
            continue
        srcs: list[UOp] = []
        for i, s in enumerate(u.src):
            if s is r and u.op in (Ops.END, Ops.REDUCE) and i > 0:
                srcs.extend(parts)
            else:
                srcs.append(new.get(s, s))
        new[u] = u.replace(src=tuple(srcs)) if tuple(srcs) != u.src else u
    return new[sink]


def _split(sink: UOp, r: UOp, amt: int, inner_type: AxisType, outer_first: bool = True,
           outer_type: AxisType | None = None) -> UOp:  # fmt: skip
    n = const_size(r)
    if n is None:
        raise OptError(f"axis {r.arg} has a symbolic size; only constant-size ranges can be split")
    amt = n if amt == 0 else amt
    if amt <= 1 or n % amt != 0:
        raise OptError(f"amount {amt} does not split axis {r.arg} of size {n}")
    nid = _next_axis(sink)
    wi = dtypes.weakint
    if outer_first:  # r = outer*amt + inner: the inner part is the new (fast) axis
        inner = UOp.range(amt, nid, inner_type, wi)
        outer = UOp.range(n // amt, r.arg[:-1], r.arg[-1] if outer_type is None else outer_type, wi)
        expr = outer * amt + inner
        parts = [outer, inner]
    else:  # r = new*(n/amt) + rest: the new part is the outer (slow) axis
        new = UOp.range(amt, nid, inner_type, wi)
        rest = UOp.range(n // amt, r.arg[:-1], r.arg[-1] if outer_type is None else outer_type, wi)
        expr = new * (n // amt) + rest
        parts = [new, rest]
    return replace_range(sink, r, parts, expr)


def _padto(sink: UOp, r: UOp, amt: int) -> UOp:
    n = const_size(r)
    if n is None or amt <= 1:
        raise OptError(f"PADTO needs a constant-size axis and an amount > 1, got axis {r.arg} amount {amt}")
    m = -(-n // amt) * amt
    if m == n:
        raise OptError(f"axis {r.arg} of size {n} is already a multiple of {amt}")
    nr = UOp.range(m, r.arg[:-1], r.arg[-1], r.dtype)
    return _gate_indexes(replace_range(sink, r, [nr], nr), {nr}, nr < n)


def _gate_indexes(sink: UOp, ranges: set[UOp], ok: UOp) -> UOp:
    """Every INDEX whose address depends on one of `ranges` gated by `ok` as well (loads read 0, stores skip)."""
    new: dict[UOp, UOp] = {}
    for u in sink.toposort():
        nu = u.replace(src=tuple(new.get(s, s) for s in u.src)) if any(s in new for s in u.src) else u
        if nu.op is Ops.INDEX and len(nu.src) == 2 and ranges & set(nu.src[1].toposort()):
            nu = nu.replace(src=(nu.src[0], and_gate(nu.src[1], ok)))
        if nu is not u:
            new[u] = nu
    return new.get(sink, sink)


def _split_symbolic(sink: UOp, r: UOp, amt: int, inner_type: AxisType) -> UOp:
    """Split a range of symbolic size n into ceil(n / amt) * amt: r = outer*amt + inner, every access gated by
    r < n (the work-items past the end of a GPU's last workgroup do nothing)."""
    if amt <= 1:
        raise OptError(f"amount {amt} does not split axis {r.arg} of symbolic size {r.src[0]}")
    n, wi = r.src[0], dtypes.weakint
    inner = UOp.range(amt, _next_axis(sink), inner_type, wi)
    outer = UOp.range((n + (amt - 1)) // amt, r.arg[:-1], r.arg[-1], wi)
    expr = outer * amt + inner
    return _gate_indexes(replace_range(sink, r, [outer, inner], expr), {outer, inner}, expr < n)


def _swap(sink: UOp, a: UOp, b: UOp) -> UOp:
    new: dict[UOp, UOp] = {}
    for u in sink.toposort():
        srcs = tuple(new.get(s, s) for s in u.src)
        if u.op is Ops.END and a in srcs[1:] and b in srcs[1:]:
            srcs = tuple(b if s is a else a if s is b else s for s in srcs)
        if srcs != u.src:
            new[u] = u.replace(src=srcs)
    return new.get(sink, sink)


def apply_opt(sink: UOp, opt: Opt, renderer: Renderer | None = None) -> UOp:
    """Apply one Opt to a kernel AST; raises OptError when it doesn't apply."""
    outs, reds = output_axes(sink), reduce_axes(sink)

    def pick(axes: list[UOp], i: int | None) -> UOp:
        if i is None or not 0 <= i < len(axes):
            raise OptError(f"{opt}: axis {i} out of range (kernel has {len(axes)} such axes)")
        return axes[i]

    amt = int(opt.arg or 0)
    if opt.op is OptOps.UPCAST:
        return _split(sink, pick(outs, opt.axis), amt, AxisType.UPCAST)
    if opt.op is OptOps.UNROLL:
        return _split(sink, pick(reds, opt.axis), amt, AxisType.UNROLL)
    if opt.op is OptOps.THREAD:
        r = pick(outs, opt.axis)
        if r.arg[-1] is not AxisType.GLOBAL:
            raise OptError(f"{opt}: THREAD splits a GLOBAL axis, axis {r.arg} is {r.arg[-1].name}")
        return _split(sink, r, amt, AxisType.GLOBAL, outer_first=False, outer_type=AxisType.LOOP)
    if opt.op is OptOps.PADTO:
        return _padto(sink, pick(outs, opt.axis), amt)
    if opt.op is OptOps.SWAP:
        return _swap(sink, pick(outs, opt.axis), pick(outs, opt.arg))
    if opt.op is OptOps.NOLOCALS:
        return sink
    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
        if renderer is None or not renderer.has_local:
            raise OptError(f"{opt}: {opt.op.name} needs local memory; renderer "
                           f"{getattr(renderer, 'name', None)!r} has none (CPU targets use THREAD/UPCAST)")  # fmt: skip
        if opt.op is OptOps.LOCAL:
            r = pick(outs, opt.axis)
            if r.arg[-1] is not AxisType.GLOBAL:
                raise OptError(f"{opt}: LOCAL splits a GLOBAL axis, axis {r.arg} is {r.arg[-1].name}")
            split = _split if const_size(r) is not None else _split_symbolic  # a symbolic size: gated work-items
            sink = split(sink, r, amt, AxisType.LOCAL)
        else:
            sink = _split(sink, pick(reds, opt.axis), amt, AxisType.GROUP_REDUCE, outer_first=opt.op is OptOps.GROUP)
        _check_workgroup(sink, opt, renderer)
        return sink
    raise OptError(f"unknown opt {opt}")


def workgroup_size(sink: UOp) -> int:
    """Work-items per workgroup: the product of the LOCAL and GROUP_REDUCE ranges (each is a work-item id)."""
    n = 1
    for u in sink.toposort():
        if u.op is Ops.RANGE and u.arg[-1] in (AxisType.LOCAL, AxisType.GROUP_REDUCE):
            n *= const_size(u) or 1
    return n


def _check_workgroup(sink: UOp, opt: Opt, renderer: Renderer) -> None:
    limit = getattr(renderer, "max_workgroup_size", None)
    if limit is not None and (n := workgroup_size(sink)) > limit:
        raise OptError(f"{opt}: the workgroup would have {n} work-items; renderer {renderer.name!r} allows {limit}")


def apply_opts(sink: UOp, opts: tuple[Opt, ...] | list[Opt], renderer: Renderer | None = None) -> UOp:
    """Apply opts in order (after each one ranges are re-simplified) and record them as KernelInfo.applied_opts."""
    info = sink.arg if isinstance(sink.arg, KernelInfo) else KernelInfo()
    for o in opts:
        sink = graph_rewrite(apply_opt(sink, o, renderer), pm_simplify, name=f"opt {o}")
    return sink.replace(arg=info.replace(applied_opts=info.applied_opts + tuple(opts)))
