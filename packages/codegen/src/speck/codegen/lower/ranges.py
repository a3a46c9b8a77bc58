"""Which RANGEs a node sits inside: the ranges its value depends on, minus those closed below it (by END, by a
REDUCE over them, or by the accumulator pattern AFTER(reg, END)). Used by reduce lowering and linearization."""

from __future__ import annotations

from speck.uop import Ops, UOp


class RangeScope:
    """Memoised `open_ranges(u)`; safe across rewrites because UOps are immutable and hash-consed."""

    def __init__(self) -> None:
        self.memo: dict[UOp, frozenset[UOp]] = {}

    def open_ranges(self, root: UOp) -> frozenset[UOp]:
        memo = self.memo
        if root in memo:
            return memo[root]
        for u in root.toposort(gate=lambda x: x not in memo):
            if u in memo:
                continue
            s: frozenset[UOp] = frozenset().union(*[memo[x] for x in u.src]) if u.src else frozenset()
            if u.op is Ops.RANGE:
                s = s | {u}
            elif u.op in (Ops.END, Ops.REDUCE):
                s = s - frozenset(u.src[1:])
            memo[u] = s
        return memo[root]
