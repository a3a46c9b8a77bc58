"""Index dtype lowering: every weakint node (ranges, variables, index arithmetic, index constants) gets a concrete
width, int32 unless its bounds need int64 or the renderer asks for 64-bit index math (`Renderer.index_int64`); a
by-value variable is always int32 (the CPU ABI passes int32)."""

from __future__ import annotations

from speck.codegen.errors import ProgramFormError
from speck.uop import DType, GroupOp, PatternMatcher, UOp, UPat, dtypes
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


class IndexLowering:
    """Carries the renderer's int64 capability and preference and remembers nothing else (rules are pure).
    `prefer_int64` (with `allow_int64`) gives index math int64 even where int32 holds every value."""

    def __init__(self, allow_int64: bool, renderer_name: str, prefer_int64: bool = False) -> None:
        self.allow_int64, self.renderer_name = allow_int64, renderer_name
        self.prefer_int64 = prefer_int64 and allow_int64

    def pick(self, u: UOp, lo: int, hi: int) -> DType:
        if _I32_MIN <= lo and hi <= _I32_MAX and not self.prefer_int64:
            return dtypes.int32
        if not self.allow_int64:
            raise ProgramFormError(
                f"index expression {u.op.name} spans [{lo}, {hi}], beyond int32, and renderer "
                f"{self.renderer_name!r} has no int64; split the buffer or use a renderer with int64 support"
            )
        return dtypes.int64


def _widest(*dts: DType) -> DType:
    return dtypes.int64 if any(d == dtypes.int64 for d in dts) else dtypes.int32


def _lower_node(ctx: IndexLowering, u: UOp) -> UOp | None:
    if u.dtype != dtypes.weakint:
        if u.op in GroupOp.Comparison and u.src[0].dtype in (dtypes.int32, dtypes.int64) and u.src[0].dtype != \
                u.src[1].dtype and u.src[1].dtype in (dtypes.int32, dtypes.int64):  # fmt: skip
            w = _widest(u.src[0].dtype, u.src[1].dtype)
            return u.replace(src=tuple(s.cast(w) for s in u.src))
        return None
    if u.op is Ops.CONST:
        v = u.arg
        return UOp.const(ctx.pick(u, v, v), v)
    if u.op is Ops.DEFINE_VAR:
        name, lo, hi = u.arg
        if not (_I32_MIN <= lo and hi <= _I32_MAX):
            raise ProgramFormError(f"variable {name!r} has bounds [{lo}, {hi}]; by-value variables must fit int32")
        return u.replace(dtype=dtypes.int32)
    if u.op is Ops.RANGE:
        return u.replace(dtype=ctx.pick(u, 0, int(u.src[0].vmax)), src=(u.src[0],))
    if u.op is Ops.SPECIAL:  # a GPU's workgroup and work-item ids are 32-bit registers
        return u.replace(dtype=dtypes.int32)
    if u.op is Ops.CAST:  # a cast to weakint of a concrete int: keep its value, at the width its bounds need
        return u.src[0].cast(dtypes.int64 if ctx.prefer_int64 else ctx.pick(u, int(u.vmin), int(u.vmax)))
    if u.op in GroupOp.ALU:
        if any(s.dtype == dtypes.weakint for s in u.src[1 if u.op is Ops.WHERE else 0 :]):
            return None  # sources not lowered yet
        # (int64 by preference needs no bounds: computing them for every index node was most of this stage)
        if ctx.prefer_int64:
            dt = dtypes.int64
        else:
            dt = _widest(ctx.pick(u, u.vmin, u.vmax), *[s.dtype for s in u.src[1 if u.op is Ops.WHERE else 0 :]])
        srcs = tuple(s if (u.op is Ops.WHERE and i == 0) or s.dtype == dt else s.cast(dt) for i, s in enumerate(u.src))
        return UOp(u.op, dt, srcs, u.arg)
    return None


def _range_end(r: UOp) -> UOp | None:
    """A RANGE's end has the range's own dtype."""
    if r.dtype in (dtypes.int32, dtypes.int64) and r.src[0].dtype != r.dtype and r.src[0].dtype != dtypes.weakint:
        return r.replace(src=(r.src[0].cast(r.dtype),))
    return None


pm_lower_index_dtype = PatternMatcher([(UPat(name="u"), _lower_node), (UPat(Ops.RANGE, name="r"), _range_end)])
