"""Devectorization: vector values wider than the renderer's registers (any vector, for renderers without vectors)
are split into chunks the renderer supports; for renderers whose vector types need a power-of-two lane count
(`Renderer.pow2_vectors`, C's vector_size), a 5-lane value becomes a 4-lane and a 1-lane part. ALU/CAST/BITCAST run
per chunk on GEPs of their sources; vector LOAD/STORE become one access per chunk at idx + chunk offset (same gate);
the chunks are reassembled with a STACK that only GEPs consume, and GEP-of-STACK folding removes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.uop import DType, GroupOp, PatternMatcher, PtrDType, UOp, UPat, dtypes
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


class Devectorizer:
    """The renderer's width limit per scalar dtype, and whether its vectors need a power-of-two lane count."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.pow2 = renderer.pow2_vectors
        self._widths: dict[DType, int] = {}  # scalar dtype -> lanes (asked for every vector node of the kernel)

    def width(self, u: UOp) -> int:
        s = u.dtype.scalar()
        w = self._widths.get(s)
        if w is None:
            w = self._widths[s] = self.renderer.max_vec_lanes(s)
        return w

    def fits(self, n: int, w: int) -> bool:
        """A vector of n lanes renders as is (n <= w, and a power of two where the renderer needs one)."""
        return n <= w and (not self.pow2 or n & (n - 1) == 0)

    def chunks(self, n: int, w: int) -> list[tuple[int, ...]]:
        """Lane groups of at most w lanes (each a power of two when the renderer needs that), in order."""
        out, i = [], 0
        while i < n:
            k = min(w, n - i)
            if self.pow2:
                k = 1 << (k.bit_length() - 1)
            out.append(tuple(range(i, i + k)))
            i += k
        return out


def _lanes(x: UOp, lanes: tuple[int, ...]) -> UOp:
    if x.dtype.count == 1:
        return x
    if x.op is Ops.STACK and len(lanes) > 1:
        # a source split earlier is a STACK of GEPs of its parts: when the lanes are exactly one part, take it
        # (what gep + stack_of_geps would reach, without building the STACK in between)
        first = x.src[lanes[0]]
        if first.op is Ops.GEP and first.arg == (0,) and (p := first.src[0]).dtype.count == len(lanes):
            if all((g := x.src[i]).op is Ops.GEP and g.src[0] is p and g.arg == (k,) for k, i in enumerate(lanes)):
                return p
    return x.gep(*lanes)


def _reassemble(parts: list[UOp]) -> UOp:
    return UOp.stack(*[p.gep(i) for p in parts for i in range(p.dtype.count)])


def split_alu(ctx: Devectorizer, x: UOp) -> UOp | None:
    n = x.dtype.count
    if n <= 1:  # (most nodes: no width to look up)
        return None
    w = ctx.width(x) if x.op not in GroupOp.Comparison else min(ctx.width(x), ctx.width(x.src[0]))
    if x.op is Ops.CAST or x.op is Ops.BITCAST:
        w = min(w, ctx.width(x.src[0]))
    if n <= 1 or ctx.fits(n, w) or isinstance(x.dtype, PtrDType):
        return None
    parts = []
    for ch in ctx.chunks(n, w):
        srcs = tuple(_lanes(s, ch) for s in x.src)
        dt = x.dtype.scalar().vec(len(ch))
        parts.append(UOp(x.op, dt, srcs, x.arg))
    return _reassemble(parts)


def _offset(idx: UOp, k: int) -> UOp:
    if k == 0:
        return idx
    buf, i = idx.src[0], idx.src[1]
    return UOp(Ops.INDEX, idx.dtype, (buf, i + k, *idx.src[2:]))


def split_load(ctx: Devectorizer, ld: UOp) -> UOp | None:
    n, w = ld.dtype.count, ctx.width(ld)
    if ctx.fits(n, w):
        return None
    parts = []
    for ch in ctx.chunks(n, w):
        extra = tuple(_lanes(s, ch) for s in ld.src[1:])
        parts.append(UOp(Ops.LOAD, ld.dtype.scalar().vec(len(ch)), (_offset(ld.src[0], ch[0]), *extra), ld.arg))
    return _reassemble(parts)


def split_store(ctx: Devectorizer, st: UOp) -> UOp | None:
    val = st.src[1]
    n, w = val.dtype.count, ctx.width(val)
    if ctx.fits(n, w):
        return None
    stores = [UOp(Ops.STORE, dtypes.void, (_offset(st.src[0], ch[0]), _lanes(val, ch), *st.src[2:]), st.arg)
              for ch in ctx.chunks(n, w)]  # fmt: skip
    return UOp(Ops.GROUP, dtypes.void, tuple(stores))


def gep_through(g: UOp) -> UOp | None:
    """GEP(STACK) picks sources, GEP(GEP) composes, a full identity GEP is its source."""
    x = g.src[0]
    if x.op is Ops.STACK:
        return UOp.stack(*[x.src[i] for i in g.arg])
    if x.op is Ops.GEP:
        return x.src[0].gep(*[x.arg[i] for i in g.arg])
    if g.arg == tuple(range(x.dtype.count)):
        return x
    return None


def stack_of_geps(s: UOp) -> UOp | None:
    """STACK(GEP(x,0), GEP(x,1), ...) covering x in order is x."""
    first = s.src[0]
    if first.op is not Ops.GEP or len(first.arg) != 1:
        return None
    x = first.src[0]
    if x.dtype.count != len(s.src):
        return None
    if all(p.op is Ops.GEP and p.src[0] is x and p.arg == (i,) for i, p in enumerate(s.src)):
        return x
    return None


pm_gep_fold = PatternMatcher(
    [
        (UPat(Ops.GEP, name="g"), gep_through),
        (UPat(Ops.STACK, name="s"), stack_of_geps),
    ]
)

pm_devectorize = pm_gep_fold + PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), split_alu),
        (UPat(Ops.LOAD, name="ld"), split_load),
        (UPat(Ops.STORE, name="st"), split_store),
    ]
)
