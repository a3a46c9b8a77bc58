"""The scheduler's fusion decisions: which tensor-level nodes fuse into the kernel consuming them and which get a
buffer (a kernel) of their own. The limits are data here; speck.tensor.schedule's lowering asks these rules per node.

A node gets a buffer of its own, rather than being recomputed by each kernel reading it, when
- it has several consumers and computing it runs a reduction (shared_reduce: each consumer would redo it),
- a reduction reads it through an expand and it costs RECOMPUTE_LIMIT elementwise ops or more (recompute_cost),
- it is a large value (SHARED_FUSE_LIMIT) that another kernel computed fused already (recomputed_large),
- the fused graph above a buffer grows deeper than FUSE_DEPTH_LIMIT levels (cut_deep)."""

from __future__ import annotations

from collections.abc import Callable

from speck.uop import Ops, UOp, dtypes

MOVEMENT = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
ELEMENTWISE = frozenset(
    {
        Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC, Ops.ADD, Ops.MUL, Ops.SUB,
        Ops.FDIV, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.OR, Ops.AND,
        Ops.SHL, Ops.SHR, Ops.THREEFRY, Ops.WHERE, Ops.MULACC, Ops.CAST, Ops.BITCAST,
    }
)  # fmt: skip

# elementwise ops per element from which a value a reduction reads through an expand is realized first (2: a
# convolution over relu(x + bias) reads its input 800 times per output; one op, like a scale, stays fused)
RECOMPUTE_LIMIT = 2
# elementwise nodes (distinct, down to buffers and values with buffers of their own) from which a float value that one
# kernel computed already gets a buffer of its own when another kernel reaches it, instead of being computed again: an
# unrolled recurrence's state (an LSTM's c_t, read by c_{t+1}, h_t and many gradient terms, each in another kernel)
# would otherwise be recomputed, with the whole chain below it, in every kernel reaching it (kernels growing
# quadratically with the number of steps). Smaller values (x*scale read twice, softmax's and Adam's pieces) stay
# fused in each consumer.
SHARED_FUSE_LIMIT = 24
# graph levels one kernel fuses at most: lowering recurses once per level (three Python frames), so a deeper chain
# (an unrolled recurrence, 200 layers of `(z*a).sin() + z`) is cut into kernels of at most this depth first
FUSE_DEPTH_LIMIT = 256


class FusionRules:
    """The consumer counts of the graphs a scheduler realizes and the fusion decisions drawn from them. A Scheduler
    is one: it provides `materialized` (the view holding a node's value, if scheduled) and `materialize`."""

    materialized: Callable[[UOp], UOp | None]
    materialize: Callable[[UOp], UOp]

    def __init__(self) -> None:
        self._cost: dict[UOp, int] = {}
        self._uses: dict[UOp, int] = {}  # consumers of each node in the graphs this scheduler realizes
        self._counted: set[UOp] = set()
        self._has_reduce: dict[UOp, bool] = {}
        # node -> the first kernel that computed it fused (recomputed_large: who else reaches it recomputes it)
        self.lowered_in: dict[UOp, int] = {}

    def count_uses(self, u: UOp) -> None:
        """Add u's graph to the consumer counts (realize() does it per target; call it for every target first when
        realizing several, so a value they share is seen as shared by the first one)."""
        counted = self._counted
        for x in u.toposort(gate=lambda y: y not in counted):  # a counted node's graph is counted already
            if x not in counted:
                counted.add(x)
                for s in x.src:
                    self._uses[s] = self._uses.get(s, 0) + 1

    def only_consumer(self, consumer: UOp, u: UOp) -> None:
        """`consumer` (about to be realized) is the one kernel reading u, whatever else lists u as a source (a
        custom node's views of it): u is fused into it like a value with one consumer."""
        self.count_uses(consumer)
        self._uses[u] = 1

    def shared_reduce(self, u: UOp) -> bool:
        """u has more than one consumer and computing it (fused) runs a reduction that isn't realized yet."""
        if self._uses.get(u, 0) < 2 or u.op not in ELEMENTWISE and u.op not in MOVEMENT and u.op is not \
                Ops.REDUCE_AXIS:  # fmt: skip
            return False
        return self._reduces(u)

    def _reduces(self, u: UOp) -> bool:
        if (r := self._has_reduce.get(u)) is not None:
            return r
        # iterative post-order: graphs are deep (a training step's chain of ops)
        stack: list[tuple[UOp, bool]] = [(u, False)]
        while stack:
            x, done = stack.pop()
            if x in self._has_reduce:
                continue
            # a reduction read through an EXPAND gets a kernel of its own anyway (the bcast rule of _Kernel._lower)
            fusable = x.op in ELEMENTWISE or x.op in MOVEMENT and x.op is not Ops.EXPAND or x.op is Ops.REDUCE_AXIS \
                or x.op is Ops.CHECK  # fmt: skip
            if not fusable or self.materialized(x) is not None:
                self._has_reduce[x] = False
            elif done:
                # a shared source with a reduction is realized on its own, so it doesn't count here
                self._has_reduce[x] = x.op is Ops.REDUCE_AXIS or any(
                    self._has_reduce[s] and self._uses.get(s, 0) < 2 for s in x.src
                )
            else:
                stack.append((x, True))
                stack.extend((s, False) for s in x.src if s not in self._has_reduce)
        return self._has_reduce[u]

    def fused_ops(self, u: UOp, limit: int) -> int:
        """The elementwise ops of u's fused graph (down to buffers, realized values and nodes that get kernels of
        their own), counted up to `limit`."""
        seen: set[UOp] = set()
        stack = [u]
        n = 0
        while stack and n < limit:
            x = stack.pop()
            if x in seen or x.op not in ELEMENTWISE and x.op not in MOVEMENT or self.materialized(x) is not None:
                continue
            seen.add(x)
            n += x.op in ELEMENTWISE
            stack.extend(x.src)
        return n

    def recompute_cost(self, u: UOp) -> int:
        """How many elementwise ops computing one element of u takes when fused, capped at RECOMPUTE_LIMIT."""
        if (c := self._cost.get(u)) is None:
            c = self._cost[u] = self.fused_ops(u, RECOMPUTE_LIMIT)
        return c

    def recomputed_large(self, u: UOp, serial: int) -> bool:
        """Kernel number `serial` is about to compute the float value u fused, which another kernel computed fused
        already, and u's fused graph has SHARED_FUSE_LIMIT elementwise nodes or more: it should rather get a buffer
        of its own (from now on: the first kernel keeps its copy)."""
        first = self.lowered_in.get(u)
        if first is None or first == serial or self._uses.get(u, 0) < 2 or not dtypes.is_float(u.dtype):
            return False
        return self.fused_ops(u, SHARED_FUSE_LIMIT) >= SHARED_FUSE_LIMIT

    def disown(self, u: UOp) -> None:
        """u's fused graph counts as computed by no kernel yet (u is about to get a kernel of its own)."""
        for x in u.toposort(gate=lambda y: self.materialized(y) is None and y in self.lowered_in):
            self.lowered_in.pop(x, None)

    def cut_deep(self, root: UOp) -> None:
        """Materialize elementwise nodes below root (sources first) wherever the fused graph above a buffer grows
        deeper than FUSE_DEPTH_LIMIT levels, so lowering root, and each cut, recurses a bounded depth."""
        depth: dict[UOp, int] = {}
        # (the walk stays inside what fuses into root's kernel: a COPY's source lives on another device)
        fused = ELEMENTWISE | MOVEMENT | {Ops.REDUCE_AXIS, Ops.DETACH}
        for n in root.toposort(gate=lambda x: self.materialized(x) is None and (x is root or x.op in fused)):
            d = 1 + max((depth.get(s, 0) for s in n.src), default=0) if self.materialized(n) is None else 0
            if d > FUSE_DEPTH_LIMIT and n is not root and n.op in ELEMENTWISE:
                self.materialize(n)  # (its own sources are cut already: toposort gives them first)
                d = 0
            depth[n] = d
