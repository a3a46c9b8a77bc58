"""PROFILE: every kernel, copy and graph replay recorded, written as Chrome trace-event JSON."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys

import numpy as np

from speck.tensor import Context, Tensor, TinyJit, profile


def _run_net() -> Tensor:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((16, 8), dtype=np.float32))
    w = Tensor(rng.standard_normal((8, 4), dtype=np.float32))
    h = (a @ w).relu()
    return (h - h.max(axis=1, keepdim=True)).exp().sum(axis=1).to("CPU:1")


def test_trace_has_one_complete_event_per_kernel_with_debug_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    profile.clear()
    out = io.StringIO()
    with Context(PROFILE=1, DEBUG=2), contextlib.redirect_stdout(out):
        got = _run_net().numpy()
    assert got.shape == (16,)
    debug_names = re.findall(r"^\*\*\* \S+\s+\d+ (\S+(?: \S+B)?)", out.getvalue(), re.M)
    doc = json.loads(open(profile.save(tmp_path / "trace.json")).read())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in events] == debug_names  # one event per line DEBUG=2 printed, same names, same order
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert kernels and all(e["args"]["ops"] > 0 and e["args"]["bytes"] > 0 for e in kernels)
    assert any(e["cat"] == "copy" for e in events)
    # every event lies on a named device process and queue thread; per queue, events don't overlap or go back
    names = {(m["pid"], m["tid"]) for m in doc["traceEvents"] if m["ph"] == "M" and m["name"] == "thread_name"}
    by_queue: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        assert (e["pid"], e["tid"]) in names and e["dur"] >= 0
        by_queue.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by_queue.values():
        for prev, nxt in zip(evs, evs[1:]):
            assert prev["ts"] + prev["dur"] <= nxt["ts"] + 1e-3


def test_nothing_is_recorded_without_profile() -> None:
    profile.clear()
    with Context(PROFILE="0"):
        _run_net().numpy()
    assert profile.EVENTS == []


def test_jit_graph_replays_are_recorded() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return ((x + 1).contiguous() * 2).contiguous()

    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    for _ in range(3):
        f(x)
    profile.clear()
    with Context(PROFILE=1):
        np.testing.assert_array_equal(f(x).numpy(), (np.arange(8) + 1) * 2)
    kinds = {e.kind for e in profile.EVENTS}
    assert kinds & {"graph", "kernel"}
    graphs = [e for e in profile.EVENTS if e.kind == "graph"]
    assert all(g.kernels >= 1 for g in graphs)


def test_profile_path_writes_the_trace_at_exit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "exit.json"
    code = "from speck.tensor import Tensor; (Tensor([1.0, 2.0]) * 3).realize()"
    proc = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "PROFILE": str(path)},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(path.read_text())
    assert any(e["ph"] == "X" and e["cat"] == "kernel" for e in doc["traceEvents"])
