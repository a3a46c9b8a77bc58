"""Which RANGEs a node sits inside: the ranges its value depends on, minus those closed below it (by END, by a
REDUCE over them, or by the accumulator pattern AFTER(reg, END)). Used by reduce lowering and linearization."""

from __future__ import annotations

from speck.uop import UOp
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_CLOSERS = frozenset({Ops.END, Ops.REDUCE})  # (a set: a tuple of members would be built per node)

_NONE: frozenset[UOp] = frozenset()


class RangeScope:
    """Memoised `open_ranges(u)`; safe across rewrites because UOps are immutable and hash-consed."""

    def __init__(self) -> None:
        self.memo: dict[UOp, frozenset[UOp]] = {}

    def open_ranges(self, root: UOp) -> frozenset[UOp]:
        memo = self.memo
        if root in memo:
            return memo[root]
        self.fill(root.toposort(gate=lambda x: x not in memo))
        return memo[root]

    def fill(self, order: list[UOp]) -> None:
        """Compute the open ranges of every node of `order`, a toposort (sources first)."""
        memo = self.memo
        for u in order:
            if u in memo:
                continue
            src = u.src
            # the union of the sources' sets, sharing a source's set when the others add nothing (the usual case)
            s = memo[src[0]] if src else _NONE
            for x in src[1:]:
                t = memo[x]
                if t is not s and t:
                    s = t if not s else s | t
            if u.op is Ops.RANGE:
                s = s | {u}
            elif u.op in _CLOSERS:
                s = s - frozenset(src[1:])
            memo[u] = s
