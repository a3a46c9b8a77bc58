"""Deterministic linearization: a lowered graph (SINK of END/STORE effects, accumulators ordered with AFTER) becomes
the linear UOp list of KERNEL_CONTRACT.md section 2, with every RANGE before its body and its END after it.

Placement: each node goes into the innermost loop among the ranges it depends on (`RangeScope.open_ranges`); a
loop's own nest is the ranges open around its END. Order: within one loop body, nodes follow the deterministic
toposort of the graph, and a nested loop is emitted whole (RANGE, body, END) where its END falls in that order.
Finally AFTER and GROUP (ordering-only nodes) are dropped and the nodes that referenced them rebuilt."""

from __future__ import annotations

from speck.codegen.errors import ProgramFormError
from speck.codegen.lower.ranges import RangeScope
from speck.uop import PatternMatcher, UOp, UPat, graph_rewrite
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_ARGS = frozenset({Ops.PARAM, Ops.DEFINE_VAR})  # (a set: a tuple of members would be built per node)


# ---------------- pre-linearize shaping: one range per END, one END per range ----------------
def _split_end(e: UOp) -> UOp | None:
    """END(x, r0, r1) -> END(END(x, r1), r0): the first listed range is the outermost loop."""
    if len(e.src) <= 2:
        return None
    return UOp(Ops.END, e.dtype, (e.replace(src=(e.src[0], *e.src[2:])), e.src[1]))


pm_split_ends = PatternMatcher([(UPat(Ops.END, name="e"), _split_end)])


def merge_ends(effects: list[UOp]) -> list[UOp]:
    """Effects that END the same range share one loop: END(a, r), END(b, r) -> END(GROUP(a, b), r), recursively."""
    out: list[UOp] = []
    by_range: dict[UOp, list[UOp]] = {}
    for e in _ungroup(effects):
        if e.op is Ops.END:
            if e.src[1] not in by_range:
                by_range[e.src[1]] = []
                out.append(e)
            by_range[e.src[1]].append(e.src[0])
        else:
            out.append(e)
    res: list[UOp] = []
    for e in out:
        if e.op is Ops.END:
            inner = merge_ends(by_range[e.src[1]])
            body = inner[0] if len(inner) == 1 else UOp(Ops.GROUP, inner[0].dtype, tuple(inner))
            res.append(UOp(Ops.END, e.dtype, (body, e.src[1])))
        else:
            res.append(e)
    return res


def _ungroup(effects: list[UOp]) -> list[UOp]:
    """The effects with GROUPs replaced by their members, in order (a GROUP may hold ENDs to merge with others)."""
    out: list[UOp] = []
    stack = list(reversed(effects))
    while stack:
        e = stack.pop()
        if e.op is Ops.GROUP:
            stack.extend(reversed(e.src))
        else:
            out.append(e)
    return out


def prepare_for_linearize(sink: UOp) -> UOp:
    """Split multi-range ENDs and merge ENDs of the same range (at the SINK level)."""
    return _prepare(sink, sink.toposort())[0]


def _prepare(sink: UOp, order: list[UOp]) -> tuple[UOp, list[UOp]]:
    """prepare_for_linearize given the sink's toposort; returns the new sink and its toposort (the one given when
    nothing changed: about half of all kernels have no END of several ranges, and their walk is skipped)."""
    if any(u.op is Ops.END and len(u.src) > 2 for u in order):
        sink = graph_rewrite(sink, pm_split_ends, name="split_ends")
    new = sink.replace(src=tuple(merge_ends(list(sink.src))))
    return new, (order if new is sink and sink is order[-1] else new.toposort())


# ---------------- placement and emission ----------------
def linearize(sink: UOp) -> list[UOp]:
    """Return the program's linear UOp list (SINK last). Raises RuntimeError naming the range when the loop nests
    are inconsistent (one RANGE closed in two different nests)."""
    sink, order = _prepare(sink, sink.toposort())
    scope = RangeScope()
    scope.fill(order)  # one walk fills the memo for every node (a call per node would walk each again)
    ctx = scope.memo
    ends: dict[UOp, UOp] = {}
    for u in order:
        if u.op is Ops.END:
            r = u.src[1]
            if r in ends and ends[r] is not u:
                raise ProgramFormError(f"linearize: RANGE axis {r.arg} is closed by two different ENDs; each loop "
                                       "needs exactly one END (merge the effects into one END)")  # fmt: skip
            ends[r] = u
    for u in order:
        if u.op is Ops.RANGE and u not in ends:
            raise ProgramFormError(
                f"linearize: RANGE axis {u.arg} is used but never closed by an END (stage linearize)"
            )
    # path of each range = its enclosing loops, outermost first
    path: dict[UOp, tuple[UOp, ...]] = {}

    visiting: set[UOp] = set()

    def range_path(r: UOp) -> tuple[UOp, ...]:  # recursion depth = loop nesting depth
        if r in path:
            return path[r]
        if r in visiting:
            raise ProgramFormError(f"linearize: RANGE axis {r.arg} and an enclosing range are nested in both orders")
        visiting.add(r)
        outer = (ctx[ends[r].src[0]] | ctx[r]) - {r}
        path[r] = _chain(r, outer, {o: range_path(o) for o in outer}) + (r,)
        visiting.discard(r)
        return path[r]

    chains: dict[frozenset[UOp], tuple[UOp, ...]] = {}  # the nest depends only on the set of ranges

    def block_of(u: UOp) -> tuple[UOp, ...]:
        if u.op is Ops.RANGE:
            return range_path(u)[:-1]
        if u.op is Ops.END:
            return range_path(u.src[1])[:-1]
        c = ctx[u]
        if not c:
            return ()
        chain = chains.get(c)
        if chain is None:
            chain = chains[c] = _chain(u, c, {r: range_path(r) for r in c})
        return chain

    blocks: dict[tuple[UOp, ...], list[UOp]] = {}
    for u in order:
        if u.op is Ops.SINK:
            continue
        blocks.setdefault(block_of(u), []).append(u)
    out: list[UOp] = []

    def emit(blk: tuple[UOp, ...]) -> None:  # recursion depth = loop nesting depth
        for u in blocks.get(blk, []):
            if u.op is Ops.RANGE:
                continue  # emitted by its END, in front of the body
            if u.op is Ops.END:
                r = u.src[1]
                out.append(r)
                emit(range_path(r))
                out.append(u)
            else:
                out.append(u)

    emit(())
    # arguments first, in ABI order: buffers by slot, then variables by name
    args = sorted((u for u in out if u.op is Ops.PARAM), key=lambda p: p.arg if isinstance(p.arg, int) else p.arg[0])
    args += sorted((u for u in out if u.op is Ops.DEFINE_VAR), key=lambda v: v.arg[0])
    out = args + [u for u in out if u.op not in _ARGS]
    return _finish(out, sink)


def _chain(u: UOp, rs: frozenset[UOp], path: dict[UOp, tuple[UOp, ...]]) -> tuple[UOp, ...]:
    """The loop nest of a node depending on ranges `rs`: the path of the deepest one, which must contain the rest."""
    if not rs:
        return ()
    deepest = max(rs, key=lambda r: (len(path[r]), r.arg))
    p = path[deepest]
    if not rs <= set(p):
        names = sorted(str(r.arg) for r in rs - set(p))
        raise ProgramFormError(f"linearize: {u.op.name} depends on ranges {names} that are not loops around its "
                               f"innermost range {deepest.arg}; ranges from sibling loops can't meet")  # fmt: skip
    return p


def _finish(seq: list[UOp], sink: UOp) -> list[UOp]:
    """Drop AFTER/GROUP and rebuild users against the nodes they stood for. Nodes that become structurally equal
    (e.g. the INDEX of one accumulator inside and after its loop) are kept distinct with a position tag."""
    new: dict[UOp, UOp] = {}
    out: list[UOp] = []
    seen: set[UOp] = set()

    for u in seq + [sink]:
        if u.op is Ops.AFTER:
            new[u] = new.get(u.src[0], u.src[0])
            continue
        if u.op is Ops.GROUP:
            new[u] = new[u.src[-1]]
            continue
        src = u.src
        nsrc = tuple([new.get(s, s) for s in src])
        nu = u if nsrc == src else UOp(u.op, u.dtype, nsrc, u.arg, u.tag)
        if nu in seen:
            nu = nu.replace(tag=("lin", len(out)))
        seen.add(nu)
        new[u] = nu
        out.append(nu)
    return out
