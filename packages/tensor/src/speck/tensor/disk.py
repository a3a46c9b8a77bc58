"""DISK tensors without a compute renderer: the file is storage only, so whatever must be computed from or for it
(a strided view, a constant written into a slice, a value built on the disk's device) is computed on CPU.

`host_graph(u)` rebuilds a graph for CPU: every contiguous view of a DISK buffer becomes a read of those bytes (a
COPY to CPU, which the DISK device serves from the file), movement ops above it are applied on CPU, constants named on
DISK are made on CPU, and a copy onto a DISK device is the value copied. Reads, `.to()` and writes into DISK use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.tensor.device import file_backed
from speck.tensor.schedule import base_buffer, buffer_device, view_offset
from speck.uop import GroupOp, Ops, UOp

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

HOST = "CPU"


def is_disk(device: object) -> bool:
    """A DEVICE node's or tensor's device that keeps its buffers in a file (speck.tensor.device.file_backed)."""
    return isinstance(device, str) and file_backed(device)


def is_view(u: UOp) -> bool:
    """u only views a buffer (movement ops over it): reading it is reading the buffer's bytes, in some order."""
    return base_buffer(u) is not None


def needs_host(u: UOp) -> bool:
    """u reads a DISK buffer other than as one contiguous range, or names the DISK device for a computation: it can
    only be computed on the host."""
    if (bb := base_buffer(u)) is not None:
        return is_disk(buffer_device(bb)) and view_offset(u) is None
    return any(n.op is Ops.DEVICE and is_disk(n.arg) for n in u.toposort())


def host_graph(u: UOp) -> UOp:
    """u computed on CPU, reading the DISK ranges it needs (see the module docstring)."""
    memo: dict[UOp, UOp] = {}

    def go(n: UOp) -> UOp:
        if (hit := memo.get(n)) is not None:
            return hit
        out = n
        if n.op is Ops.DEVICE and is_disk(n.arg):
            out = UOp(Ops.DEVICE, arg=HOST)
        elif n.op is Ops.COPY and is_disk(n.arg):
            out = go(n.src[0])  # a copy onto the disk: the value being copied
        elif (n.op is Ops.BUFFER or n.op in GroupOp.Movement) and (bb := base_buffer(n)) is not None:
            if is_disk(buffer_device(bb)) and view_offset(n) is not None:  # one contiguous range: read from the file
                out = UOp(Ops.COPY, n.dtype, (n, UOp(Ops.DEVICE, arg=HOST)), HOST)
            elif n.src:
                out = n.replace(src=tuple(go(s) for s in n.src))
        elif n.src:
            out = n.replace(src=tuple(go(s) for s in n.src))
        memo[n] = out
        return out

    return go(u)


def write_pending_copy(t: Tensor) -> None:
    """t (a tensor on a file) viewing a copy onto the file that hasn't run (`x.to("disk:...")[10:20]`): run the copy
    (the file gets the bytes) so t is a view of the file, which reads need (the file's device computes nothing)."""
    u = t.uop
    while u.op in GroupOp.Movement:
        u = u.src[0]
    if u.op is Ops.COPY and is_disk(u.arg) and base_buffer(u) is None:
        whole = type(t)(u, device=t.device)
        whole.realize()
        t.uop = t.uop.substitute({u: whole.uop})
