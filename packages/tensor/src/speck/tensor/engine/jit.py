"""`from tinygrad.engine.jit import TinyJit, JitError` works here; the code is in speck.tensor.jit. Also tinygrad's
graph-runner names: `graph_class(device)` is the device's batching class (what a JIT replay groups kernels into,
None where a device has none); `GraphRunner`/`MultiGraphRunner` are the Runner kinds for one-device and
cross-device batches (speck's device graphs are hcq classes, so they are not subclasses of these)."""

from __future__ import annotations

from typing import Any

from speck.tensor.engine.realize import Runner
from speck.tensor.jit import CapturedJit, JitError, TinyJit


class GraphRunner(Runner):
    """A batch of kernel calls on one device, replayed as one launch."""


class MultiGraphRunner(GraphRunner):
    """A batch spanning several devices (copies between them included)."""


def graph_class(dev: Any) -> Any:
    """The batching class of a device object (`Device[name]`), or None."""
    return getattr(dev, "graph", None)


__all__ = ["CapturedJit", "GraphRunner", "JitError", "MultiGraphRunner", "TinyJit", "graph_class"]
