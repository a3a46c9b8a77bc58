"""The weak registry of live Tensor objects.

Some behaviour depends on which tensor *objects* exist, not only on the graph: `backward()` fills `.grad` of every
live tensor its root depends on, and writes or realizations can be made visible to every tensor holding a node.
Every Tensor registers itself here when it is made (`track`); `tensors()` yields the ones still alive.

Registration is on the per-op hot path, so it is one weak reference appended to a list (no callback, no hashing);
dead references are swept out when the list has doubled since the last sweep, which keeps it amortized O(1) and its
size within twice the number of live tensors."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

_refs: list[weakref.ref[Tensor]] = []
_wref = weakref.ref  # (a module constant: track runs per op)
_MIN_SWEEP = 4096
_sweep_at = _MIN_SWEEP


def track(t: Tensor) -> None:
    """Register a new tensor object (called by Tensor construction)."""
    _refs.append(_wref(t))
    if len(_refs) > _sweep_at:
        _sweep()


def _sweep() -> None:
    global _sweep_at
    n = len(_refs)  # (in place over the entries seen: tensors another thread registers meanwhile are kept)
    _refs[:n] = [r for r in _refs[:n] if r() is not None]
    _sweep_at = max(_MIN_SWEEP, 2 * len(_refs))


def tensors() -> Iterator[Tensor]:
    """Every live registered tensor, oldest first (a snapshot: tensors made while iterating are not included)."""
    for r in list(_refs):
        # (a tensor another thread is still constructing has no graph yet: not yielded)
        if (t := r()) is not None and hasattr(t, "_uop"):
            yield t


def untrack(t: Tensor) -> None:
    """Forget a tensor (it stays usable but no registry-driven behaviour reaches it; unpickled tensors use this)."""
    n = len(_refs)
    _refs[:n] = [r for r in _refs[:n] if r() is not None and r() is not t]


def count() -> int:
    """Live registered tensors (sweeps dead references first)."""
    _sweep()
    return len(_refs)


class LiveTensors:
    """tinygrad's `all_tensors` (a dict keyed by weak references to every live Tensor, values None) as a read-only
    view of this registry: iterating yields a weak reference per live tensor, oldest first; `len()` counts them."""

    def __iter__(self) -> Iterator[weakref.ref[Tensor]]:
        return (weakref.ref(t) for t in tensors())

    def __len__(self) -> int:
        return count()

    def __contains__(self, ref: object) -> bool:
        target = ref() if isinstance(ref, weakref.ref) else ref
        return target is not None and any(t is target for t in tensors())

    def keys(self) -> Iterator[weakref.ref[Tensor]]:
        return iter(self)

    def values(self) -> Iterator[None]:
        return (None for _ in tensors())

    def items(self) -> Iterator[tuple[weakref.ref[Tensor], None]]:
        return ((r, None) for r in self)
