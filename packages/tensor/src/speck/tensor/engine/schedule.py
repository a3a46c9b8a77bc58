"""The scheduler under tinygrad's module name; the code is in speck.tensor.schedule."""

from speck.tensor.schedule import ScheduleItem, Scheduler

__all__ = ["ScheduleItem", "Scheduler"]
