"""The NULL device: accepts buffers and programs and runs nothing (for counting kernels and scheduling tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speck.hcq.allocator import NullAllocator
from speck.hcq.device import DeviceBase
from speck.hcq.program import Program
from speck.hcq.registry import register_device


class NullProgram(Program):
    """A program that records how often it was launched and does nothing else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launches = 0

    def raw_args(self, bufs: Sequence[Any], vals: Sequence[int] = ()) -> tuple[Any, ...]:
        for b in bufs:  # a call gives its buffers memory, as on every device (NULL memory is free)
            b.ensure_allocated()
        return ()

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        self.launches += 1


class NullDevice(DeviceBase):
    """Every allocation succeeds without memory; copies and kernels do nothing. Renders C (the cheapest renderer)."""

    backend_name = "NULL"
    host_visible = False
    any_renderer = True

    def __init__(self, name: str = "NULL") -> None:
        super().__init__(name, NullAllocator(name, limit=None))

    def runtime(self, name: str, lib: bytes, **spec: Any) -> NullProgram:
        return NullProgram(self, name, lib, **spec)

    def _copy(self, dest: Any, src: Any, nbytes: int) -> None:
        pass


register_device("NULL", NullDevice)
