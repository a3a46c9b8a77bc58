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

from speck.tensor.multi import copy_uop
from speck.tensor.settings import ALL2ALL, RING, RING_ALLREDUCE_THRESHOLD
from speck.uop import Ops, UOp, sint
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


def allreduce(op: Ops, partials: Sequence[UOp], devices: Sequence[str]) -> list[UOp]:
    """The reduction (ADD, MUL or MAX) of the per-device `partials` (equal shapes, partials[i] on devices[i]),
    as one graph per device whose value is the whole reduction."""
    n = len(partials)
    shape = partials[0].shape
    numel = prod(shape)
    algo = choose_algorithm(n, numel)
    if algo == "naive":
        out = []
        for d in devices:
            total = copy_uop(partials[0], d, devices[0])
            for i in range(1, n):
                total = total.alu(op, copy_uop(partials[i], d, devices[i]))
            out.append(total)
        return out
    assert isinstance(numel, int)
    bounds = [(numel * c // n, numel * (c + 1) // n) for c in range(n)]
    chunks = [[p.reshape((numel,)).shrink((b,)) for b in bounds] for p in partials]  # chunks[device][chunk]
    full: list[list[UOp | None]] = [[None] * n for _ in range(n)]  # full[device][chunk]: the reduced chunk there
    if algo == "ring":
        # reduce-scatter: at step s device i sends its running sum of chunk i-s to device i+1, which adds its own
        # piece; after N-1 steps device i holds the whole reduction of chunk i+1
        acc = [row[:] for row in chunks]
        for s in range(n - 1):
            sent = [(i, (i - s) % n, acc[i][(i - s) % n]) for i in range(n)]
            for i, c, v in sent:
                j = (i + 1) % n
                acc[j][c] = copy_uop(v, devices[j], devices[i]).alu(op, acc[j][c])
        for i in range(n):
            full[i][(i + 1) % n] = acc[i][(i + 1) % n]
        # all-gather: at step s device i passes on the reduced chunk i+1-s it has to device i+1
        for s in range(n - 1):
            for i in range(n):
                c, j = (i + 1 - s) % n, (i + 1) % n
                have = full[i][c]
                assert have is not None
                full[j][c] = copy_uop(have, devices[j], devices[i])
    else:
        # all2all: device c reduces chunk c from every device, then sends it to every device
        for c in range(n):
            red = copy_uop(chunks[0][c], devices[c], devices[0])
            for i in range(1, n):
                red = red.alu(op, copy_uop(chunks[i][c], devices[c], devices[i]))
            for j in range(n):
                full[j][c] = copy_uop(red, devices[j], devices[c])
    out = []
    for j in range(n):
        joined: UOp | None = None
        for (lo, hi), part in zip(bounds, full[j]):
            assert part is not None
            padded = part.pad(((lo, numel - hi),))
            joined = padded if joined is None else joined.alu(Ops.OR if part.dtype.name == "bool" else Ops.ADD, padded)
        assert joined is not None
        out.append(joined.reshape(shape))
    return out
