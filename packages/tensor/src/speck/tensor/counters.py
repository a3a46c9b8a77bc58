"""GlobalCounters (tinygrad's `helpers.GlobalCounters`): speck.hcq's counters, which its runner keeps."""

from speck.hcq.counters import GlobalCounters

__all__ = ["GlobalCounters"]
