"""Reduction loops bounded by their gates: a sum whose every term reads a zero-padded operand skips the taps that
read only padding.

A transposed convolution (a convolution's input gradient) pads its operand by k-1 on each side of a dimension it
doesn't materialize; its window load is then gated by `lo <= y + ky < hi` and the sum over ky adds zeros wherever
the gate is false. For a 5x5 kernel over a 20-row gradient that is 1 - 20/24 of the taps. When a loop range `r`
of a REDUCE(ADD) is gated that way, with `y` a loop-invariant expression of the ranges outside the reduction,
the loop runs over

    r = lo' + r',  r' in [0, hi' - lo'),  lo' = max(0, lo - y),  hi' = min(end, hi - y)

and the clauses it was bounded by are dropped (they hold by construction). The skipped terms are products with a
padding zero, so the sum is unchanged (as in any convolution, padding contributes no term even where the other
factor is inf or NaN). Output rows that vector lanes cover (UPCAST ranges) are left alone: their lanes would each
need different bounds."""

from __future__ import annotations

from speck.uop import AxisType, InvalidType, Ops, UOp, dtypes
from speck.uop.symbolic import conjuncts
from speck.uop.uop import add_terms

_LOOP_AXES = (AxisType.GLOBAL, AxisType.LOCAL, AxisType.THREAD, AxisType.LOOP)


def _gate_of_term(v: UOp, seen: set[UOp] | None = None) -> UOp | None:
    """The gate outside which the reduced term v is zero: that of a load reading 0 where its index is invalid,
    through casts and products. `seen`: the products already searched (x ** 2**70 is 70 squarings MUL(s, s): walked
    as a tree, 2**70 visits, a hang)."""
    if v.op is Ops.CAST:
        return _gate_of_term(v.src[0], seen)
    if v.op is Ops.MUL:
        seen = set() if seen is None else seen
        if v in seen:
            return None
        seen.add(v)
        for s in v.src:
            if (g := _gate_of_term(s, seen)) is not None:
                return g
        return None
    if v.op is Ops.LOAD and v.src[0].op is Ops.INDEX:
        idx = v.src[0]
        zero_alt = len(v.src) == 1 or (v.src[1].op is Ops.CONST and v.src[1].arg == 0)
        if not zero_alt:
            return None
        if len(idx.src) == 3:
            return idx.src[2]
        i = idx.src[1]
        if i.op is Ops.WHERE and i.src[2].op is Ops.CONST and isinstance(i.src[2].arg, InvalidType):
            return i.src[0]
    return None


def _invariant(e: UOp, red: UOp) -> bool:
    """e is the same on every iteration of red's loops and on every vector lane: it reads only loop ranges
    outside the reduction (and kernel variables)."""
    for u in e.toposort():
        if u.op is Ops.RANGE and (u in red.src[1:] or u.arg[-1] not in _LOOP_AXES):
            return False
        if u.op in (Ops.LOAD, Ops.SPECIAL):
            return False
    return True


def _bound(clause: UOp, r: UOp, red: UOp) -> tuple[str, UOp] | None:
    """('hi', h) for a clause meaning r < h, ('lo', l) for one meaning r >= l, where the clause compares r + e (e
    invariant over red) with a constant: `r + e < c`, `!(r + e < c)`, `c < r + e`, `!(c < r + e)`."""
    neg = clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True
    cmp = clause.src[0] if neg else clause
    if cmp.op is not Ops.CMPLT:
        return None
    a, b = cmp.src
    const_right = b.op is Ops.CONST
    lhs, c = (a, b) if const_right else (b, a)
    if c.op is not Ops.CONST or type(c.arg) is not int:
        return None
    terms = add_terms(lhs)
    if sum(t is r for t in terms) != 1:
        return None
    rest = [t for t in terms if t is not r]
    e: UOp | None = None
    for t in rest:
        e = t if e is None else e + t
    if e is not None and not _invariant(e, red):  # (e can't read r: r is one of red's ranges)
        return None
    base = UOp.const(r.dtype, c.arg) if e is None else UOp.const(r.dtype, c.arg) - e
    if const_right:  # r + e < c: r < c - e;  !(r + e < c): r >= c - e
        return ("lo", base) if neg else ("hi", base)
    # c < r + e: r >= c - e + 1;  !(c < r + e): r < c - e + 1
    return ("hi", base + 1) if neg else ("lo", base + 1)


def _minimum(a: UOp, b: UOp) -> UOp:
    return (a < b).where(a, b)


def _maximum(a: UOp, b: UOp) -> UOp:
    return (a < b).where(b, a)


def _tighten_one(sink: UOp) -> UOp | None:
    nodes = sink.toposort()
    for red in nodes:
        if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or red.dtype.count != 1:
            continue
        gate = _gate_of_term(red.src[0])
        if gate is None:
            continue
        body = set(red.src[0].toposort())
        for r in red.src[1:]:
            if r.op is not Ops.RANGE or r.arg[-1] is not AxisType.REDUCE or r.src[0].op is not Ops.CONST:
                continue
            # r must be used by this reduction only (its body and its range list)
            if any(r in u.src for u in nodes if u not in body and u is not red):
                continue
            bounds = [(cl, b) for cl in conjuncts(gate) if (b := _bound(cl, r, red)) is not None]
            los = [(cl, v) for cl, (k, v) in bounds if k == "lo"]
            his = [(cl, v) for cl, (k, v) in bounds if k == "hi"]
            if not los and not his:
                continue
            zero, end = UOp.const(r.dtype, 0), r.src[0]
            lo = _maximum(zero, los[0][1]) if los else zero
            hi = _minimum(end, his[0][1]) if his else end
            n = _maximum(zero, hi - lo)
            used = {cl for cl, _ in los[:1] + his[:1]}
            new_r = UOp(Ops.RANGE, r.dtype, (n,), r.arg, r.tag)
            true = UOp.const(dtypes.bool, True)
            new_body = red.src[0].substitute({cl: true for cl in used})
            new_body = new_body.substitute({r: new_r + lo})
            new_red = red.replace(src=(new_body, *[new_r if x is r else x for x in red.src[1:]]))
            return sink.substitute({red: new_red})
    return None


def tighten_gated_reductions(sink: UOp) -> UOp:
    """Bound every eligible reduction range by the gate of the operand it multiplies (see the module docstring);
    returns the rewritten kernel (the same graph when nothing applies)."""
    for _ in range(16):  # one range per round; a kernel has a handful of reduction ranges
        new = _tighten_one(sink)
        if new is None:
            break
        sink = new
    return sink
