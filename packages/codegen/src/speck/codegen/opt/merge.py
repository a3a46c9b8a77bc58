"""Range merging: two adjacent GLOBAL ranges, or two adjacent REDUCE ranges of the same reduction, a (outer, size Na)
and b (inner, size Nb) that every expression uses only as the combination Nb*a + b become one range m of size Na*Nb.
One long loop gives the CPU worker split and vector upcasts more room and removes a loop level (a sum over an image's
20x20 rows and columns becomes one contiguous run of 400 that vectorizes by 8). The check is exact: every maximal
linear expression that mentions a or b must have coeff(a) == Nb * coeff(b); then substituting a -> 0, b -> m
preserves every value."""

from __future__ import annotations

from speck.uop import AxisType, UOp
from speck.uop.affine import linear_terms
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_LINEAR = (Ops.ADD, Ops.SUB, Ops.MUL)


def _is_linear_node(u: UOp) -> bool:
    if u.op in (Ops.ADD, Ops.SUB):
        return True
    return u.op is Ops.MUL and any(s.op is Ops.CONST and isinstance(s.arg, int) for s in u.src)


def _mergeable(sink: UOp, a: UOp, b: UOp, nb: int) -> bool:
    nodes = sink.toposort()
    reach: dict[UOp, bool] = {}  # does the node's subgraph contain a or b (one pass, sources first)
    for u in nodes:
        reach[u] = u is a or u is b or any(reach[s] for s in u.src)
    for u in nodes:
        if u.op in (Ops.END, Ops.REDUCE) or _is_linear_node(u):
            continue
        for s in u.src:
            if s is not a and s is not b and not (_is_linear_node(s) and s.dtype == a.dtype):
                continue
            if not reach[s]:
                continue
            terms, _ = linear_terms(s)
            if terms.get(a, 0) != nb * terms.get(b, 0):
                return False
            if any(t is not a and t is not b and _reaches(reach, t, a, b) for t in terms):
                return False
    return True


def _reaches(reach: dict[UOp, bool], t: UOp, a: UOp, b: UOp) -> bool:
    r = reach.get(t)  # terms are nodes of the graph; the walk is only a guard
    return r if r is not None else any(x is a or x is b for x in t.toposort())


def merge_ranges(sink: UOp) -> UOp:
    """Merge adjacent GLOBAL ranges of the kernel's ENDs, and adjacent REDUCE ranges of a REDUCE, wherever that is
    exact (see the module docstring)."""
    changed = True
    while changed:
        changed = False
        closers = [u for u in sink.toposort() if u.op in (Ops.END, Ops.REDUCE)]
        for e in closers:
            rs = e.src[1:]
            kind = AxisType.GLOBAL if e.op is Ops.END else AxisType.REDUCE
            for a, b in zip(rs, rs[1:]):
                if not all(r.op is Ops.RANGE and r.arg[-1] is kind and r.src[0].op is Ops.CONST for r in (a, b)):
                    continue
                users = [x for x in closers if a in x.src[1:] or b in x.src[1:]]
                if any(_adjacent(x.src[1:], a, b) is False for x in users):
                    continue
                nb = int(b.src[0].arg)
                if not _mergeable(sink, a, b, nb):
                    continue
                m = UOp.range(int(a.src[0].arg) * nb, a.arg[:-1], kind, a.dtype)
                sink = _substitute_merge(sink, a, b, m)
                changed = True
                break
            if changed:
                break
    return sink


def _adjacent(rs: tuple[UOp, ...], a: UOp, b: UOp) -> bool:
    return any(x is a and y is b for x, y in zip(rs, rs[1:]))


def _substitute_merge(sink: UOp, a: UOp, b: UOp, m: UOp) -> UOp:
    zero = UOp.const(a.dtype, 0)
    new: dict[UOp, UOp] = {a: zero, b: m}
    for u in sink.toposort():
        if u is a or u is b:
            continue
        if u.op in (Ops.END, Ops.REDUCE):
            srcs = [new.get(u.src[0], u.src[0])]
            for r in u.src[1:]:
                if r is a:
                    continue
                srcs.append(m if r is b else new.get(r, r))
            nu = u.replace(src=tuple(srcs))
        else:
            nu = u.replace(src=tuple(new.get(s, s) for s in u.src))
        if nu is not u:
            new[u] = nu
    return new.get(sink, sink)
