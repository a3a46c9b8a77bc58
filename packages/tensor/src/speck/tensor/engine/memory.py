"""tinygrad.engine.memory: `memory_planner`. speck has no schedule-level memory planner (buffers are reused through
each device allocator's LRU cache as they are freed), so the planner returns the schedule unchanged."""

from __future__ import annotations

from speck.tensor.schedule import ScheduleItem


def memory_planner(schedule: list[ScheduleItem]) -> list[ScheduleItem]:
    """The schedule with buffers reassigned for reuse: speck plans none (its allocators' caches reuse memory at run
    time), so this is `schedule` itself, unchanged."""
    return schedule


__all__ = ["memory_planner"]
