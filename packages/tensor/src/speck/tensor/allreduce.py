"""Allreduce across the devices of a sharded tensor, built from ordinary tensor-level UOps: COPY nodes (one
device-to-device copy each when scheduled) and elementwise ops (kernels on the receiving device).

Three algorithms, for N devices (speck's copy-count contract, checked by the tests):

| algorithm | device-to-device copies | distinct (src, dst) pairs |
|---|---|---|
| naive   | N*(N-1)   | every ordered pair: each device copies every other device's partial and reduces all of it |
| ring    | 2*N*(N-1) | N, a ring i -> i+1: reduce-scatter of N chunks of the flattened data, then all-gather |
| all2all | 2*N*(N-1) | every ordered pair: device c reduces chunk c from everyone, then sends it to everyone |

Selection (tinygrad's rule): all2all when ALL2ALL >= 2, or ALL2ALL >= 1 with more than two devices and more than
RING_ALLREDUCE_THRESHOLD elements; else ring when RING >= 2, or RING >= 1 with more than two devices and more than
RING_ALLREDUCE_THRESHOLD elements; else naive. Symbolic sizes, and data smaller than one element per device, use
naive. Every device reduces in the same order, so the replicas of the result are bitwise identical."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from speck.tensor.nodes import copy_uop
from speck.tensor.schedule import Scheduler, max_dim, new_buffer_uop, view_buffer_uop
from speck.tensor.settings import ALL2ALL, RING, RING_ALLREDUCE_THRESHOLD
from speck.uop import DType, Ops, UOp, sint
from speck.uop.helpers import prod


def choose_algorithm(ndev: int, numel: sint) -> str:
    """The algorithm ("naive", "ring" or "all2all") for numel elements over ndev devices (see the module doc)."""
    if not isinstance(numel, int) or numel < ndev:
        return "naive"
    big = ndev > 2 and numel > int(RING_ALLREDUCE_THRESHOLD.value)
    if ALL2ALL.value >= 2 or (ALL2ALL.value >= 1 and big):
        return "all2all"
    if RING.value >= 2 or (RING.value >= 1 and big):
        return "ring"
    return "naive"


class AllreduceArg(NamedTuple):
    """The arg of device `at`'s result node: CONTIGUOUS(partial[at], partial[at+1], ...) (its own partial
    first, so the node's device and shape are those of its first source)."""

    op: Ops
    algo: str
    at: int  # the device whose result this node is
    devices: tuple[str, ...]
    wire: DType | None  # ALLREDUCE_CAST: partials of an upcast half/bfloat16 value travel in that dtype


def allreduce(op: Ops, partials: Sequence[UOp], devices: Sequence[str], wire: DType | None = None) -> list[UOp]:
    """The reduction (ADD, MUL or MAX) of the per-device `partials` (equal shapes, partials[i] on devices[i]): one
    node per device whose value is the whole reduction. The scheduler schedules all of them at once
    (schedule_allreduce), each device's result in one buffer its kernels and copies write chunk by chunk. `wire`:
    the partials cross devices in this narrower dtype and are widened on arrival (every device then reduces the
    same rounded values, so the replicas stay identical)."""
    n = len(partials)
    algo = choose_algorithm(n, prod(partials[0].shape))
    spec = AllreduceArg(op, algo, 0, tuple(devices), wire)
    return [_node(spec._replace(at=j), partials) for j in range(n)]


def _node(spec: AllreduceArg, partials: Sequence[UOp]) -> UOp:
    n = len(partials)
    return UOp(Ops.CONTIGUOUS, partials[0].dtype, tuple(partials[(spec.at + k) % n] for k in range(n)), spec)


def schedule_allreduce(sched: Scheduler, node: UOp) -> UOp:
    """Schedule every device's result of the allreduce `node` belongs to: copies between devices and kernels on
    the receiving devices, step by step for all devices (the copies of a step go first, so they overlap with the
    kernels of the devices they are not for); returns node's view."""
    spec: AllreduceArg = node.arg
    op, devices, n = spec.op, spec.devices, len(spec.devices)
    partials = [node.src[(i - spec.at) % n] for i in range(n)]
    shape, dtype = partials[0].shape, partials[0].dtype
    numel = int(prod(max_dim(s) for s in shape))  # a symbolic shape (naive only): buffers of its largest size
    outs = [new_buffer_uop(d, numel, dtype) for d in devices]

    def on(i: int, u: UOp, into: UOp | None = None) -> UOp:
        outer, sched.device = sched.device, devices[i]
        try:
            return sched.materialize(u, into) if into is not None or u.op is Ops.COPY else sched.realize(u)
        finally:
            sched.device = outer

    wire = spec.wire

    def send(v: UOp, j: int, i: int) -> UOp:
        """v (on device i) as received on device j (in the wire dtype, widened there)."""
        if wire is None:
            return on(j, copy_uop(v, devices[j], devices[i]))
        return on(j, copy_uop(on(i, v.cast(wire)), devices[j], devices[i])).cast(dtype)

    def send_into(v: UOp, j: int, i: int, into: UOp) -> None:
        """send(v, j, i) written into the BUFFER `into` on device j (a copy straight into it, without a wire dtype)."""
        if wire is None:
            on(j, copy_uop(v, devices[j], devices[i]), into)
        else:
            on(j, send(v, j, i), into)

    def rounded(v: UOp) -> UOp:  # what a device keeps of a value the others receive through the wire
        return v if wire is None else v.cast(wire).cast(dtype)

    if spec.algo == "naive":  # every device copies every other partial and reduces all of them in one kernel
        if wire is None:
            pv = [on(i, p) for i, p in enumerate(partials)]
            copies = [[send(pv[i], j, i) if i != j else pv[i] for i in range(n)] for j in range(n)]
        else:  # the partial kernels write the wire dtype (no kernel of its own to narrow them); all widen it
            narrowed = [p.cast(wire) for p in partials]
            for p, nw in zip(partials, narrowed):
                sched.only_consumer(nw, p)  # (each result node lists every partial: only the narrowing reads them)
            pw = [on(i, nw) for i, nw in enumerate(narrowed)]
            copies = [[(on(j, copy_uop(pw[i], devices[j], devices[i])) if i != j else pw[i]).cast(dtype)
                       for i in range(n)] for j in range(n)]  # fmt: skip
        for j in range(n):
            total = copies[j][0]
            for i in range(1, n):
                total = total.alu(op, copies[j][i])
            on(j, total, outs[j])
    else:
        pv = [on(i, p) for i, p in enumerate(partials)]
        bounds = [(numel * c // n, numel * (c + 1) // n) for c in range(n)]
        chunk = [[v.reshape((numel,)).shrink((b,)) for b in bounds] for v in pv]  # chunk[device][chunk]
        region = [[view_buffer_uop(o, lo, hi - lo) for lo, hi in bounds] for o in outs]
        if spec.algo == "ring":
            # reduce-scatter: at step s device i sends its running reduction of chunk i-s to device i+1, which adds
            # its own piece; after N-1 steps device i holds the whole reduction of chunk i+1 (in its result).
            # all-gather: at step s device i passes the reduced chunk i+1-s on to device i+1, into its result.
            # Each copy is scheduled right after the kernel that made what it sends, so it runs (on the receiver's
            # copy engine) while the kernels of the other devices run; the all-gather copies wait for one another
            # through their signals, not through this thread.
            acc = [row[:] for row in chunk]
            got = [send(acc[i][i], (i + 1) % n, i) for i in range(n)]  # step 0's copies, by sender
            for s in range(n - 1):
                last, sent = s == n - 2, got[:]
                for i in range(n):
                    j, c = (i + 1) % n, (i - s) % n
                    total = sent[i].alu(op, acc[j][c])
                    acc[j][c] = on(j, rounded(total) if last else total, region[j][c] if last else None)
                    if not last:  # j sends on what it just reduced (step s+1 moves chunk j-(s+1) = c from j)
                        got[j] = send(acc[j][c], (j + 1) % n, j)
                    else:  # j's chunk c = j+1 is complete: the first all-gather step passes it on
                        send_into(region[j][c], (j + 1) % n, j, region[(j + 1) % n][c])
            for s in range(1, n - 1):
                for i in range(n):
                    c, j = (i + 1 - s) % n, (i + 1) % n
                    send_into(region[i][c], j, i, region[j][c])
        else:  # all2all: device c reduces chunk c from every device, then sends it to every device
            recv = [[send(chunk[i][c], c, i) for i in range(n)] for c in range(n)]
            for c in range(n):
                total = recv[c][0]
                for i in range(1, n):
                    total = total.alu(op, recv[c][i])
                on(c, rounded(total), region[c][c])
            for c in range(n):
                for j in range(n):
                    if j != c:
                        on(j, send(region[c][c], j, c), region[j][c])
    for j in range(n):
        sched.done[_node(spec._replace(at=j), partials)] = outs[j].reshape(shape) if shape != (numel,) else outs[j]
    return sched.done[node]


Scheduler.custom[AllreduceArg] = schedule_allreduce
