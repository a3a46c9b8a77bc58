"""Parallel ranges -> hardware indexes, for renderers that launch a grid of workgroups (`Renderer.has_local`).

On a GPU the output ranges are not loops: every (workgroup, work-item) pair of the launch grid runs the kernel
once. This stage replaces each GLOBAL range by a workgroup id `SPECIAL("gidx<d>")` and each LOCAL or GROUP_REDUCE
range (after lower/group_reduce.py) by a work-item id `SPECIAL("lidx<d>")` (d = 0, 1, 2 for x, y, z; src[0] is the
dimension's size), and drops those ranges from the ENDs that closed them. The last range by axis id (for work-items:
the last split the optimizer made, which the GPU heuristic makes the one along which accesses are contiguous)
becomes x, so neighbouring lanes of a wave touch neighbouring addresses. More ranges than the
grid has dimensions, or a dimension larger than the renderer's `global_max`/`local_max` allows, are folded
together: one id then covers several ranges, recovered by division and remainder.

The launch is then `global_size` workgroups of `local_size` work-items (speck.codegen.program.launch_size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.errors import UnsupportedOpError
from speck.uop import AxisType, Ops, UOp, dtypes, sint

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer

GRID_DIMS = 3
# which ranges become which kind of hardware id: the prefix of its SPECIAL's name, and the renderer's limit on it
_KINDS: tuple[tuple[tuple[AxisType, ...], str, str], ...] = (
    ((AxisType.GLOBAL,), "gidx", "global_max"),
    ((AxisType.LOCAL, AxisType.GROUP_REDUCE), "lidx", "local_max"),
)


def _size(r: UOp) -> sint:
    e = r.src[0]
    return int(e.arg) if e.op is Ops.CONST and isinstance(e.arg, int) else e


def _limit(limits: tuple[int, ...] | None, d: int) -> int | None:
    return None if limits is None or d >= len(limits) else limits[d]


def _fits(group: list[UOp], limit: int | None) -> bool:
    n = 1
    for r in group:
        s = _size(r)
        if not isinstance(s, int):
            return True  # a symbolic size is checked at launch (the runtime refuses a grid it can't run)
        n *= s
    return limit is None or n <= limit


def _group(ranges: list[UOp], limits: tuple[int, ...] | None, prefix: str, renderer: Renderer) -> list[list[UOp]]:
    """Ranges (outermost first) grouped into at most three dimensions, x first: each group's ranges share one id."""
    groups = [[r] for r in reversed(ranges)]  # x = innermost
    while len(groups) > GRID_DIMS:  # the outermost ranges share the last dimension
        extra = groups.pop()
        groups[-1] = extra + groups[-1]
    for d in range(len(groups) - 1, 0, -1):  # a y/z dimension over its limit moves into x
        if not _fits(groups[d], _limit(limits, d)):
            groups[0] = groups.pop(d) + groups[0]
    if not _fits(groups[0], _limit(limits, 0)):
        raise UnsupportedOpError(renderer.name, Ops.SPECIAL, dtypes.int32,
                                 f"the {prefix} dimension x needs {' * '.join(str(_size(r)) for r in groups[0])} ids, "
                                 f"more than the renderer's limit {_limit(limits, 0)}")  # fmt: skip
    return groups


def gpu_dims(sink: UOp, renderer: Renderer) -> UOp:
    """Replace GLOBAL/LOCAL ranges by SPECIAL hardware ids (see the module docstring); a no-op without them."""
    nodes = sink.toposort()
    sub: dict[UOp, UOp] = {}
    for types, prefix, limit_name in _KINDS:
        ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[-1] in types), key=lambda r: r.arg[:-1])
        if not ranges:
            continue
        for d, group in enumerate(_group(ranges, getattr(renderer, limit_name), prefix, renderer)):
            size: sint = _size(group[0])
            for r in group[1:]:
                size = size * _size(r)
            sp = UOp.special(size, f"{prefix}{d}")
            stride: sint = 1
            for r in reversed(group):  # the group's last range is its fastest-moving part
                v = sp if stride == 1 else sp // stride
                sub[r] = v % _size(r) if r is not group[0] else v
                stride = stride * _size(r)
    if not sub:
        return sink
    return _replace(sink, nodes, sub)


def _replace(sink: UOp, nodes: list[UOp], sub: dict[UOp, UOp]) -> UOp:
    """Substitute the ranges' ids in values and drop the ranges from END (an END left with none is its effect)."""
    new: dict[UOp, UOp] = dict(sub)
    for u in nodes:
        if u in new:
            continue
        srcs = tuple(new.get(s, s) for s in u.src)
        if u.op is Ops.END:
            kept = tuple(r for r in u.src[1:] if r not in sub)
            if not kept:
                new[u] = srcs[0]
                continue
            srcs = (srcs[0], *kept)
        new[u] = u.replace(src=srcs) if srcs != u.src else u
    return new[sink]


__all__ = ["GRID_DIMS", "gpu_dims"]
