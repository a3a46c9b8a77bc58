"""REDUCE -> accumulator registers (KERNEL_CONTRACT.md section 2).

    REDUCE(value, r...) with op  becomes
      acc  = DEFINE_REG(dt.ptr(lanes, REG))
      init = STORE(INDEX(AFTER(acc, outer ranges...), 0), identity)        # before the reduce loops open
      upd  = STORE(INDEX(a1, 0), LOAD(INDEX(a1, 0)) op value)   a1 = AFTER(acc, init, r...)   # inside them
      result = LOAD(INDEX(AFTER(acc, END(upd, r...)), 0))                  # after they close

The AFTER nodes carry only ordering (the linearizer places each node inside the ranges its sources are in and
drops AFTER from the final list). `outer ranges` are the ranges the reduced value depends on besides its own, so
the accumulator restarts exactly when they advance. Two REDUCEs over the same RANGE get private copies of it:
every loop has exactly one END."""

from __future__ import annotations

from speck.codegen.lower.ranges import RangeScope
from speck.codegen.numeric import identity_element
from speck.uop import AddrSpace, PatternMatcher, UOp, UPat, dtypes
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)


class ReduceLowering:
    """State of the pass: a counter for register ids and fresh axis ids, which ranges are already owned."""

    def __init__(self, sink: UOp) -> None:
        rs = [u for u in sink.toposort() if u.op in (Ops.RANGE, Ops.DEFINE_REG, Ops.REDUCE)]
        self.has_reduce = any(u.op is Ops.REDUCE for u in rs)  # else the pass has nothing to do
        self.next_axis = 1 + max([a for u in rs if u.op is Ops.RANGE for a in u.arg[:-1]], default=-1)
        self.next_reg = 1 + max([u.arg for u in rs if u.op is Ops.DEFINE_REG], default=-1)
        self.owned: set[UOp] = set()
        self.scope = RangeScope()

    def fresh_range(self, r: UOp) -> UOp:
        nr = UOp(Ops.RANGE, r.dtype, r.src, (self.next_axis, r.arg[-1]))
        self.next_axis += 1
        return nr


def lower_reduce(ctx: ReduceLowering, red: UOp) -> UOp:
    value, rngs = red.src[0], list(red.src[1:])
    # a range some other REDUCE already loops over gets a private copy, so each loop has exactly one END
    sub = {r: ctx.fresh_range(r) for r in rngs if r in ctx.owned}
    if sub:
        value = value.substitute(sub)
        rngs = [sub.get(r, r) for r in rngs]
    ctx.owned.update(rngs)
    dt = red.dtype
    lanes = dt.count
    acc = UOp(Ops.DEFINE_REG, dt.scalar().ptr(lanes, AddrSpace.REG), (), ctx.next_reg)
    ctx.next_reg += 1
    outer = sorted(ctx.scope.open_ranges(value) - set(rngs), key=lambda r: r.arg)
    zero = UOp.const(dtypes.weakint, 0)
    ident = UOp.const(dt, identity_element(red.arg, dt))
    init = acc.after(*outer).index(zero).store(ident)
    a1 = acc.after(init, *rngs)
    cur = a1.index(zero).load(dtype=dt)
    upd = a1.index(zero).store(cur.alu(red.arg, value))
    done = upd.end(*rngs)
    return acc.after(done).index(zero).load(dtype=dt)


pm_lower_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), lower_reduce)])
