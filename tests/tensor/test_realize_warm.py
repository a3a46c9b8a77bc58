"""The warm eager realize (issue 30, erun's pass) against the general path it shortens: a warm plan finds its inputs'
buffer_map entries by the keys its last run noted (buffer_map's own weak references, checked to still name the same
node), keeps its output as (node, key), skips the realized_cache lookup its caller just made, and the runner binds an
unchanged argument table without Batch.bind's frame. Every result is compared with numpy, counters with the general
path's (DEBUG=2: every call timed one by one), and buffers for reuse without aliasing."""

from __future__ import annotations

import gc
import sys
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.hcq import Device
from speck.tensor import Context, GlobalCounters, Tensor, schedule_cache
from speck.tensor.schedule import base_buffer, buffer_map, buffer_map_data, realized_cache


def _hb(t: Tensor) -> object:
    """The hcq Buffer holding a realized tensor."""
    u = base_buffer(t.uop)
    assert u is not None
    return buffer_map[u]


def _plan_of(t: Tensor) -> schedule_cache.CachedSchedule:
    found = schedule_cache.cached_plan(t.uop, t.device)
    assert found is not None and found[2] is not None
    return found[2]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=12))
def test_warm_runs_over_changing_inputs_match_numpy(picks: list[tuple[int, int]]) -> None:
    """A warm plan run over any sequence of input pairs (repeats, a tensor twice, inputs that change every run: the
    noted keys miss, the runner's table is pointed at other addresses) gives numpy's values each time."""
    xs = [np.arange(4, dtype=np.float32) * (i + 1) - i for i in range(4)]
    ts = [Tensor(x).realize() for x in xs]
    (ts[0] + ts[1]).realize()  # (the plan exists: every run below is warm)
    for i, j in picks:
        np.testing.assert_array_equal((ts[i] + ts[j]).realize().numpy(), xs[i] + xs[j])


def test_a_replaced_entry_is_read_through_the_noted_key() -> None:
    """After an input's buffer_map entry is replaced (the same node now names another Buffer) or dropped and made
    again, the warm run reads the new storage: the noted key is only a faster way to the current entry."""
    x = np.arange(4, dtype=np.float32)
    a, b, c = Tensor(x).realize(), Tensor(x + 10).realize(), Tensor(x * 7).realize()
    for _ in range(3):
        np.testing.assert_array_equal((a + b).realize().numpy(), x + x + 10)
    plan = _plan_of(a + b)
    assert all(k is not None and k() is n for k, n in zip(plan.keys, (a.uop, b.uop)))  # the keys were noted
    anode = base_buffer(a.uop)
    assert anode is not None
    buffer_map[anode] = _hb(c)  # (the dict keeps the key object: a new value under the noted key)
    np.testing.assert_array_equal((a + b).realize().numpy(), x * 7 + x + 10)
    buffer_map.pop(anode)  # dropped and made again: a new key object, the noted one still finds it
    buffer_map[anode] = _hb(b)
    np.testing.assert_array_equal((a + b).realize().numpy(), x + 10 + x + 10)


def test_warm_counters_match_the_general_path() -> None:
    """kernel_count, global_ops and global_mem grow by what the general path (every call timed) adds."""
    a, b = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.ones(4, np.float32) * 2).realize()

    def counted() -> tuple[int, int, int]:
        k, o, m = GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem
        (a + b).realize()
        Device["CPU"].synchronize()
        return GlobalCounters.kernel_count - k, GlobalCounters.global_ops - o, GlobalCounters.global_mem - m

    first, warm, warm2 = counted(), counted(), counted()
    with Context(DEBUG=2):
        general = counted()
    assert warm == warm2 == first == general and warm[0] == 1


def test_a_live_previous_output_is_never_the_next_output() -> None:
    """Outputs kept alive get Buffers of their own (no aliasing: each keeps its values after later runs); once the
    previous output is gone its node and Buffer are the next run's output (reuse)."""
    x = np.arange(4, dtype=np.float32)
    a, b = Tensor(x).realize(), Tensor(x * 3).realize()
    (a + b).realize()
    kept = [(a + b).realize() for _ in range(4)]
    assert len({id(_hb(t)) for t in kept}) == 4
    for t in kept:
        np.testing.assert_array_equal(t.numpy(), x * 4)
    last = (a * b).realize()  # (another plan: its own output)
    np.testing.assert_array_equal(last.numpy(), x * x * 3)
    first = (a + b).realize()
    first_node = weakref.ref(base_buffer(first.uop))  # type: ignore[arg-type]  # (weak: holding it keeps it busy)
    del first
    gc.collect()
    again = (a + b).realize()
    assert base_buffer(again.uop) is first_node()  # the spare came back (its node, with its entry and Buffer)
    for t in kept:  # (the kept ones were not touched)
        np.testing.assert_array_equal(t.numpy(), x * 4)
    np.testing.assert_array_equal(again.numpy(), x * 4)


def test_an_output_whose_entry_was_dropped_is_not_taken_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept output whose buffer_map entry someone dropped fails the spare's check: the next run makes a new output
    (the old node's Buffer is not reused through a stale key), values are numpy's, and the old node dies without its
    key's callback complaining (the key is let go before the node)."""
    complaints: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", complaints.append)
    x = np.arange(4, dtype=np.float32)
    a, b = Tensor(x).realize(), Tensor(x + 1).realize()
    (a + b).realize()
    out = (a + b).realize()
    node = weakref.ref(base_buffer(out.uop))  # type: ignore[arg-type]  # (weak: the plan's spare is its only holder)
    assert node() is not None
    buffer_map.pop(node())
    del out
    gc.collect()
    again = (a + b).realize()
    assert node() is None and base_buffer(again.uop) is not None  # (the old node died in that run)
    np.testing.assert_array_equal(again.numpy(), x + x + 1)
    assert [k for k in list(buffer_map_data) if k() is None] == []
    assert complaints == []


def test_a_realized_node_shared_by_two_tensors_is_computed_once() -> None:
    """Tensor.realize skips its realized_cache lookup only when the cache is empty: a node another tensor realized
    (and cached) is read, not computed again."""
    x = np.arange(4, dtype=np.float32)
    a, b = Tensor(x).realize(), Tensor(x + 2).realize()
    (a + b).realize()
    t1 = a + b
    t2 = a + b  # the same hash-consed node
    assert t1.uop is t2.uop
    t1.realize()
    assert len(realized_cache) > 0  # (t2 still holds the node: its realization is cached)
    k = GlobalCounters.kernel_count
    t2.realize()
    assert GlobalCounters.kernel_count == k and _hb(t2) is _hb(t1)
    np.testing.assert_array_equal(t2.numpy(), x + x + 2)
