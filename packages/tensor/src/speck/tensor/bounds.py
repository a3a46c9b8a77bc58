"""Bounds checks of index tensors, run on the device (CHECK_OOB, on by default).

An op that reads or writes at the positions an index tensor holds (getitem and setitem with tensors, gather,
scatter, one_hot, Embedding, sparse_categorical_crossentropy and nll_loss labels) marks the index with
`checked(...)`: a CHECK node whose value is the index itself and whose arg names the op and the valid range. The
scheduler lowers it to nothing in the value path and adds, to the same kernel, a store guarded by "index outside
[low, high) and the record still empty" of (op, index, low, high, dim) into a small record buffer per device
(`_Kernel.check_effects`). So the check adds no kernel, no synchronization and no host round-trip; the cost is a
compare per index element.

The record is looked at where the kernels are known to have run: every data read (numpy/tolist/item/data), the
end of a realize (Tensor.realize / realize_all, outside a TinyJit capture) or TinyJit replay on a host-visible device
(no wait: the host's kernels ran when the call returns; a GPU's record waits for the next read or synchronize), and
`Device[...].synchronize()` (speck.hcq's SYNC_CHECKS; speck's own waits inside a realize do not look, so a realize
never stops half-way). A violation found there raises
IndexOutOfBoundsError (an IndexError) naming the op, the index and the bound, and clears the record.

A sharded index (a MultiUOp) is checked shard by shard: each shard's CHECK records into its own device's record."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from speck.hcq.device import SYNC_CHECKS, DeviceBase
from speck.tensor.device import Device, canonical
from speck.tensor.errors import IndexOutOfBoundsError
from speck.tensor.multi import MultiUOp, _plain_to_shards
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import buffer_device, new_buffer_uop
from speck.tensor.settings import CHECK_OOB
from speck.uop import Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

# the ops that check their indices, by the code stored in the record (code = position + 1; 0: nothing recorded)
OPS = ("getitem", "setitem", "gather", "scatter", "Embedding", "one_hot", "sparse_categorical_crossentropy", "nll_loss")
# int32 slots of a record: op code, the index found, low, high, dim (-1: none) (speck.tensor.schedule writes it)
RECORD = 8

_records: dict[str, UOp] = {}  # device -> the BUFFER of its record (created with the first check on the device)
records = _records  # (Tensor.realize tests it before calling raise_recorded: empty until a kernel checks bounds)
_views: dict[str, np.ndarray] = {}  # device -> a zero-copy view of the record, on host-visible devices


def checked(
    t: Tensor,
    op: str,
    low: int,
    high: int,
    dim: int | None = None,
    allow: int | None = None,
    device: str | tuple[str, ...] | None = None,
) -> Tensor:
    """t (an int tensor of indices) marked to be checked where a kernel reads it: every element must be in
    [low, high) (or equal `allow`: sparse_categorical_crossentropy's ignore_index) or the next data read raises
    IndexOutOfBoundsError naming `op`, the index and the bound. `device`: where the indexed data lives (a
    device-less index, `Tensor(5)`, is checked there; on sharded data, replicated onto its devices). t itself when
    CHECK_OOB=0 or nothing can be out of range (the dtype's values all fit) or nothing would check it: an index on
    a device that runs no kernels (a file, USB)."""
    if not CHECK_OOB.value or not dtypes.is_int(t.dtype):
        return t
    dev = t._device if t._device is not None else device
    devices = dev if isinstance(dev, tuple) else (dev,)
    if not all(isinstance(d, str) and Device[d].runs_kernels for d in devices):  # (a record there: a copy per read)
        return t
    if t.dtype.is_weak:  # a Python int index (weakint): checked at the default int
        t = t.cast(dtypes.default_int)
    dt = t.dtype
    if low <= dtypes.min(dt) and high > dtypes.max(dt):
        return t
    arg = (OPS.index(op) + 1, low, high, -1 if dim is None else dim, allow)
    if isinstance(dev, str):
        return t._new(UOp(Ops.CHECK, dt, (t.uop, record_buffer(dev)), arg))
    m = t.uop
    if isinstance(m, MultiUOp):
        pieces, axis, on = m.shards, m.axis, m.device
    else:  # a device-less index (constants only) into sharded data: checked on every device it meets the data on
        on = tuple(canonical(d) for d in devices)
        pieces, axis = tuple(_plain_to_shards(m, None, on)), None
    shards = [UOp(Ops.CHECK, dt, (s, record_buffer(d)), arg) for s, d in zip(pieces, on, strict=True)]
    return t._new(MultiUOp.make(Ops.CHECK, (m,), arg, shards, axis, on))


def record_buffer(device: str) -> UOp:
    """The BUFFER a device's kernels record the first violation in (zeroed; one per device, kept for the process)."""
    if (buf := _records.get(device)) is None:
        buf = new_buffer_uop(device, RECORD, dtypes.int32)
        hb = get_buffer(buf)
        hb.ensure_allocated()
        hb.copyin(np.zeros(RECORD, np.int32))
        _records[device] = buf
        if _check_after_synchronize not in SYNC_CHECKS:  # (registered with the first record: until then a
            SYNC_CHECKS.append(_check_after_synchronize)  # synchronize() has nothing of ours to look at)
        if hb.dev.host_visible:
            _views[device] = hb.numpy()
    return buf


def forget(device: str) -> None:
    """Drop a device's record (its memory is gone: the device was reopened); the next check makes a new one."""
    _records.pop(device, None)
    _views.pop(device, None)


def is_record(buf: UOp) -> bool:
    """buf is a device's record buffer (pickles as a reference to the loading process's own)."""
    return _records.get(buffer_device(buf)) is buf


def raise_recorded(host_only: bool = False, device: str | None = None) -> None:
    """Raise IndexOutOfBoundsError if a kernel recorded an out-of-range index since the last look (clearing every
    device's record). `host_only`: look only at devices whose memory the host maps (no copy, no wait); `device`:
    look only at that device's record."""
    if not _records:
        return
    for dev, buf in _records.items() if device is None else ((device, _records[device]),):
        view = _views.get(dev)
        if view is not None:
            if not view[0]:
                continue
            rec = [int(x) for x in view[:5]]
        elif host_only:
            continue
        else:
            rec = [int(x) for x in get_buffer(buf).numpy()[:5]]
            if not rec[0]:
                continue
        for other in _records.values():  # every device's: a replicated index recorded the same violation on each
            get_buffer(other).copyin(np.zeros(RECORD, np.int32))
        raise IndexOutOfBoundsError(describe(rec, dev))


def _check_after_synchronize(device: DeviceBase) -> None:
    """Device[...].synchronize() raises what the device's kernels recorded (its work is done: the record is final)."""
    if device.name in _records:
        raise_recorded(device=device.name)


def describe(rec: list[int], device: str) -> str:
    """The message of a record: which op, which index, which bound."""
    code, index, low, high, dim = rec
    shown = f"{index} or more" if index == 2**31 - 1 else f"{index} or less" if index == -(2**31) else str(index)
    op = OPS[code - 1] if 0 < code <= len(OPS) else f"op #{code}"
    where = f"dim {dim} with size {high}" if dim >= 0 else f"size {high}"
    if op in ("sparse_categorical_crossentropy", "nll_loss"):
        what, where = "label", f"{high} classes"
    elif op == "one_hot":
        what, where = "class index", f"num_classes={high}"
    else:
        what = "index"
    return (f"{op}: {what} {shown} is out of bounds for {where} (valid: {low}..{high - 1}) on {device}; found by the "
            "device-side index check in a kernel run since the last data read or synchronize. Fix the index "
            "tensor (CHECK_OOB=0 turns the check off: out-of-range indices then read 0 and writes to them are "
            "dropped)")  # fmt: skip
