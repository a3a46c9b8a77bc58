"""The realize engine under tinygrad's module name; the code is in speck.tensor.realize."""

from speck.tensor.realize import get_buffer, run_schedule

__all__ = ["get_buffer", "run_schedule"]
