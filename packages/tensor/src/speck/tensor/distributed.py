"""Data-parallel training across processes and hosts over MPI.

speck ships no network transport of its own: this module drives MPI through mpi4py, with an MPI library installed
from PyPI (`pip install 'speck-tensor[mpi]'` brings mpi4py and Open MPI). Start one process per host (or per
device) with the MPI launcher, e.g. `mpiexec -n 2 speck-train --distributed`.

    from speck.tensor import distributed
    distributed.init()
    distributed.broadcast_(params)                       # every rank starts from rank 0's weights
    ...
    loss.backward()
    distributed.allreduce_([p.grad for p in params], op="mean")
    opt.step()

Tensors travel as raw memory: MPI's own Allreduce/Bcast run on the buffers of realized CPU tensors through the
buffer protocol (no pickling; a tensor that travels alone is reduced in place, without a copy). Tensors smaller
than a bucket (SPECK_MPI_BUCKET_BYTES, 4 MiB) are packed into buckets that travel together, so a model's many
small gradients cost a few messages, not one each. Inside a TinyJit-captured step the collective is recorded and
replayed on the same buffers.

Failures never hang: MPI's error handler is set to return errors, and every collective runs on a worker thread
that the caller waits for with a deadline (SPECK_MPI_TIMEOUT seconds, default 120, or init(timeout=...)). (The
blocking collectives, on that thread: MPI's nonblocking ones are much slower here, Open MPI's libnbc at 0.6x.) A
lost rank raises DistributedError naming it: at once when the MPI reports process failures (Open MPI's
`mpiexec --with-ft ulfm`), else when the deadline passes (a rank on this host that is gone or stopped is named as
such). After a DistributedError end the process with `abort()`: MPI_Finalize would wait for the lost rank."""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import realize
from speck.tensor.device import Device
from speck.tensor.dims import as_int
from speck.tensor.errors import DistributedError as DistributedError
from speck.tensor.errors import TensorValueError
from speck.tensor.multi import MultiUOp
from speck.tensor.realize import host_array
from speck.tensor.schedule import base_buffer, realized_cache, view_offset
from speck.tensor.settings import MPI_BUCKET_BYTES, MPI_TIMEOUT
from speck.tensor.tensor import Tensor

if TYPE_CHECKING:
    from speck.uop import UOp

BUCKET_BYTES = int(MPI_BUCKET_BYTES.value)


@dataclass
class _World:
    MPI: Any  # the mpi4py.MPI module
    comm: Any
    rank: int
    size: int
    peers: list[tuple[str, int]]  # (host, pid) of every rank
    timeout: float


_world: _World | None = None


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            "speck.tensor.distributed needs mpi4py and an MPI library: pip install 'speck-tensor[mpi]' (mpi4py "
            f"with Open MPI, from PyPI), then start the processes with mpiexec ({e})"
        ) from e
    return MPI


def init(timeout: float | None = None) -> None:
    """Join the MPI job this process was started in (mpiexec); idempotent. `timeout`: seconds a collective may
    take before the other ranks are declared unresponsive (default SPECK_MPI_TIMEOUT, else 120)."""
    global _world
    if _world is not None:
        if timeout is not None:
            _world.timeout = timeout
        return
    MPI = _mpi()
    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)  # an error comes back as an exception instead of aborting the job
    limit = float(MPI_TIMEOUT.value) if timeout is None else timeout
    w = _World(MPI, comm, comm.Get_rank(), comm.Get_size(), [], limit)
    me = np.array([os.getpid()], dtype=np.int64)
    pids = np.zeros(w.size, dtype=np.int64)
    host = np.frombuffer(socket.gethostname().encode()[:255].ljust(256, b"\0"), dtype=np.uint8)
    hosts = np.zeros((w.size, 256), dtype=np.uint8)
    _call(w, lambda: (comm.Allgather(me, pids), comm.Allgather(host, hosts)), "the start-up exchange of host names")
    w.peers = [(bytes(h).rstrip(b"\0").decode(errors="replace"), int(p)) for h, p in zip(hosts, pids)]
    _world = w


def _get() -> _World:
    if _world is None:
        raise DistributedError("speck.tensor.distributed is not initialized: call distributed.init() first")
    return _world


def is_initialized() -> bool:
    return _world is not None


def rank() -> int:
    """This process's rank in the job (0 .. world_size()-1)."""
    return _get().rank


def world_size() -> int:
    """The number of processes in the job."""
    return _get().size


def barrier() -> None:
    """Wait until every rank reaches this point (with the same deadline and failure reports as the collectives)."""
    w = _get()
    _call(w, w.comm.Barrier, "a barrier")


def abort(code: int = 1) -> None:
    """End this process now (after a DistributedError): flush output and exit without MPI_Finalize, which would
    wait for the lost rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------- collectives on tensors ----------------
def allreduce_(tensors: Sequence[Tensor], op: str = "sum") -> list[Tensor]:
    """Sum (op="sum") or average (op="mean") each tensor across all ranks, in place: afterwards every rank holds
    the same values. Tensors are realized first; each must be on one host-visible device (CPU). Returns them."""
    if op not in ("sum", "mean"):
        raise TensorValueError(f"allreduce_ op must be 'sum' or 'mean', got {op!r}")
    return _collective(tensors, "allreduce", op, 0)


def broadcast_(tensors: Sequence[Tensor], root: int = 0) -> list[Tensor]:
    """Overwrite each tensor with rank `root`'s values, in place (parameters at the start of training)."""
    w = _get()
    if not 0 <= root < w.size:
        raise TensorValueError(f"broadcast_ root must be a rank in [0, {w.size}), got {root}")
    return _collective(tensors, "broadcast", "", root)


def _collective(tensors: Sequence[Tensor], kind: str, op: str, root: int) -> list[Tensor]:
    w = _get()
    ts = list(tensors)
    if not ts:
        return ts
    Tensor.realize_all(*ts)
    places = [pl for pl in (_place(t, kind) for t in ts) if pl[2] > 0]
    # a runner Host call (recorded for TinyJit: replays run the collective on the same buffers)
    realize.host_call(_runner(w, kind, op, root, places), [b for b, _, _ in places], kind)
    realized_cache.clear()  # values computed from the old contents are stale
    return ts


def _place(t: Tensor, kind: str) -> tuple[UOp, int, int]:
    """(BUFFER, element offset, element count) of a realized tensor's contiguous memory."""
    if isinstance(t.uop, MultiUOp):
        raise DistributedError(
            f"{kind} takes tensors on one device, got one sharded over {t.uop.device}; a sharded tensor is reduced "
            "across its devices by its own allreduce: gather it with .to(device) first"
        )
    dev = Device[t.device]
    if not dev.host_visible or not dev.backend_name:
        raise DistributedError(f"{kind} needs tensors in host memory (CPU), got one on {t.device}; .to('CPU') it")
    if t.dtype.fmt is None:
        raise DistributedError(f"{kind} can't send {t.dtype} tensors (MPI has no such type); cast to float32 first")
    bb, off = base_buffer(t.uop), view_offset(t.uop)
    if bb is None or off is None:  # not a contiguous view of a buffer: give it one of its own
        t.replace(t.contiguous().realize())
        bb, off = base_buffer(t.uop), view_offset(t.uop)
    assert bb is not None and off is not None
    return bb, off, as_int(t.numel())


def _runner(w: _World, kind: str, op: str, root: int, places: list[tuple[UOp, int, int]]) -> Callable[..., None]:
    """The collective as a runner Host function of the places' hcq Buffers (TinyJit maps inputs to new ones)."""
    offs = [(off, n, b.dtype) for b, off, n in places]
    MPI = w.MPI

    def run(bufs: list[Any], var_vals: Any = None) -> None:
        views = [host_array(b, dt)[off : off + n] for b, (off, n, dt) in zip(bufs, offs)]
        buckets = _buckets(views)
        packed = [np.concatenate(b) if len(b) > 1 else b[0] for b in buckets]

        def send() -> None:
            for p in packed:
                if kind == "allreduce":
                    w.comm.Allreduce(MPI.IN_PLACE, p, op=MPI.SUM)
                else:
                    w.comm.Bcast(p, root=root)

        nbytes = sum(p.nbytes for p in packed)
        _call(w, send, f"{kind} of {len(views)} tensors ({nbytes} bytes in {len(packed)} messages)")
        for b, p in zip(buckets, packed):
            if op == "mean":
                if not np.issubdtype(p.dtype, np.floating):
                    raise DistributedError(f"allreduce_ op='mean' needs float tensors, got {p.dtype}")
                p *= p.dtype.type(1.0 / w.size)
            if len(b) > 1:
                pos = 0
                for v in b:
                    v[...] = p[pos : pos + v.size]
                    pos += v.size
            elif p is not b[0]:
                b[0][...] = p

    return run


def _buckets(views: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Views grouped into messages: one of BUCKET_BYTES or more travels alone (in place); smaller ones of one dtype
    are packed together, in order, up to BUCKET_BYTES per bucket."""
    out: list[list[np.ndarray]] = []
    open_: dict[Any, tuple[list[np.ndarray], int]] = {}
    for v in views:
        if v.nbytes >= BUCKET_BYTES:
            out.append([v])
            continue
        cur, size = open_.get(v.dtype, ([], 0))
        if cur and size + v.nbytes > BUCKET_BYTES:
            out.append(cur)
            cur, size = [], 0
        cur.append(v)
        open_[v.dtype] = (cur, size + v.nbytes)
    out += [b for b, _ in open_.values() if b]
    return out


# ---------------- waiting, with failures named ----------------
_jobs: queue.Queue[tuple[Callable[[], Any], threading.Event, list[BaseException]]] = queue.Queue()
_thread: threading.Thread | None = None


def _serve() -> None:
    while True:
        fn, done, error = _jobs.get()
        try:
            fn()
        except BaseException as e:  # handed to the caller
            error.append(e)
        done.set()


def _call(w: _World, fn: Callable[[], Any], what: str) -> None:
    """Run the MPI calls `fn` makes on the worker thread; raise DistributedError when they fail or take longer
    than the deadline (the worker may then be stuck in MPI for good: the process must end, abort())."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name="speck-mpi", daemon=True)
        _thread.start()
    done, error = threading.Event(), []  # type: ignore[var-annotated]
    _jobs.put((fn, done, error))
    if not done.wait(w.timeout):
        raise DistributedError(_timeout_message(w, what))
    if error:
        if isinstance(error[0], w.MPI.Exception):
            raise DistributedError(_failure_message(w, what, error[0])) from error[0]
        raise error[0]


def _who(w: _World, r: int) -> str:
    host, pid = w.peers[r] if r < len(w.peers) else ("?", 0)
    return f"rank {r} (pid {pid} on {host})"


def _failure_message(w: _World, what: str, e: Any) -> str:
    lost: list[int] = []
    try:  # ULFM (Open MPI's --with-ft ulfm): the processes this rank knows to have failed
        group = w.comm.Get_failed()
        lost = [r for r in group.Translate_ranks(list(range(group.Get_size())), w.comm.Get_group()) if r >= 0]
    except Exception:  # no fault-tolerance support in this MPI: name what the host can see
        lost = [r for r in range(w.size) if r != w.rank and _local_state(w, r) in ("gone", "stopped")]
    names = ", ".join(_who(w, r) for r in lost) if lost else "an unidentified rank"
    return (
        f"rank {w.rank}: {what} failed: lost {names}; MPI error {e.Get_error_class()}: {e.Get_error_string()}. "
        "The job can't continue: end it with distributed.abort() and restart from a checkpoint"
    )


def _timeout_message(w: _World, what: str) -> str:
    states = {r: _local_state(w, r) for r in range(w.size) if r != w.rank}
    bad = [f"{_who(w, r)} is {s}" for r, s in states.items() if s in ("gone", "stopped")]
    detail = "; ".join(bad) if bad else "no other rank on this host is gone or stopped (a remote rank may be)"
    return (
        f"rank {w.rank}: {what} did not complete within {w.timeout:g} s (SPECK_MPI_TIMEOUT): {detail}. "
        "Start the job with `mpiexec --with-ft ulfm` to have lost ranks reported at once"
    )


def _local_state(w: _World, r: int) -> str:
    """'gone', 'stopped', 'running' for a rank on this host; 'remote' otherwise."""
    host, pid = w.peers[r] if r < len(w.peers) else ("", 0)
    if host != socket.gethostname() or pid <= 0:
        return "remote"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "running"
        return "running"
    return {"Z": "gone", "X": "gone", "T": "stopped", "t": "stopped"}.get(state, "running")
