"""Seeing where time goes: with `PROFILE=1` (or `Context(PROFILE=1)`) every kernel, device copy and graph replay the
realize engine runs is recorded with its device, queue, start and end time and estimated ops and bytes;
`save(path)` writes the record as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
`PROFILE=<path>` (any value other than 0/1) also writes the trace to that path when the process exits.

    with Context(PROFILE=1):
        model(x).realize()
    speck.tensor.profile.save("trace.json")

Event names are the ones `DEBUG=2` prints (the kernel's name, `copy <n>B`); each device is a process of the trace
and each of its queues (compute, copy) a thread."""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import Any

from speck.hcq.runner import EVENTS, Event, tracing
from speck.hcq.settings import PROFILE
from speck.tensor.pyutils import atomic_file


def enabled() -> bool:
    """Whether the PROFILE setting asks for recording (any value but "" and "0")."""
    return tracing()


def clear() -> None:
    EVENTS.clear()


def trace(events: list[Event] | None = None) -> dict[str, Any]:
    """The events as a Chrome trace-event document: complete ("X") events in microseconds from the first event,
    one process per device and one thread per queue, with metadata events naming them."""
    evs = sorted(EVENTS if events is None else events, key=lambda e: e.start_ns)
    t0 = evs[0].start_ns if evs else 0
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any]] = []
    for e in evs:
        pid = pids.setdefault(e.device, len(pids) + 1)
        tid = tids.setdefault((e.device, e.queue), len([k for k in tids if k[0] == e.device]) + 1)
        dur_us = (e.end_ns - e.start_ns) / 1e3
        args: dict[str, Any] = {"ops": e.ops, "bytes": e.nbytes}
        if dur_us > 0:
            args["GFLOPS"] = round(e.ops / dur_us * 1e-3, 3)
            args["GB/s"] = round(e.nbytes / dur_us * 1e-3, 3)
        if e.kind == "graph":
            args["kernels"] = e.kernels
        out.append({"name": e.name, "cat": e.kind, "ph": "X", "ts": (e.start_ns - t0) / 1e3, "dur": dur_us,
                    "pid": pid, "tid": tid, "args": args})  # fmt: skip
    meta = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": dev}} for dev, pid in pids.items()
    ]
    meta += [{"name": "thread_name", "ph": "M", "pid": pids[dev], "tid": tid, "args": {"name": q}}
             for (dev, q), tid in tids.items()]  # fmt: skip
    return {"traceEvents": meta + out, "displayTimeUnit": "ns", "otherData": {"producer": "speck.tensor.profile"}}


def save(path: str | os.PathLike[str]) -> str:
    """Write the recorded events as Chrome trace JSON to `path` (atomically); returns the path."""
    path = os.fspath(path)
    with atomic_file(path, "saving the profile") as f:
        f.write(json.dumps(trace()).encode())
    return path


def now_ns() -> int:
    return time.perf_counter_ns()


@atexit.register
def _save_at_exit() -> None:
    v = str(PROFILE.value)
    if v not in ("", "0", "1") and EVENTS:
        try:
            save(v)
        except OSError as e:
            print(f"speck.tensor.profile: could not write the trace to PROFILE={v!r}: {e}")
