"""The PYTHON device: runs programs through speck.codegen.interpret (slow, exact: the semantic reference).

Buffers are host memory like the CPU's. Programs are loaded from a ProgramSpec (`load_program(spec)`; the
interpreter executes the spec's UOps, so raw bytes alone are not enough) and each call runs
`speck.codegen.interpret.run_program(spec, buffers, var_vals, core_range)` on the buffers' memoryviews, once per
worker slice of global_size[0], as the CPU would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speck.codegen.interpret import run_program
from speck.hcq.allocator import HostAllocator, available_ram
from speck.hcq.device import DeviceBase
from speck.hcq.errors import HCQError
from speck.hcq.program import Program
from speck.hcq.registry import register_device


class PythonProgram(Program):
    """A program executed by the reference interpreter."""

    def raw_args(self, bufs: Sequence[Any], vals: Sequence[int] = ()) -> tuple[Any, ...]:
        # the interpreter indexes buffers by PARAM slot; calls pass them in the program's order (CPU_ABI)
        views: list[Any] = [b.as_memoryview(raw=True) for b in bufs]
        if self.params is not None and any(p.index != i for i, p in enumerate(self.params)):
            by_slot: list[Any] = [None] * (max(p.index for p in self.params) + 1)
            for p, v in zip(self.params, views):
                by_slot[p.index] = v
            views = by_slot
        return (tuple(views), self.var_vals(vals))

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        n = global_size[0] if global_size else 1
        run = run_program
        t = max(1, min(1 if threads is None else threads, n))
        for k in range(t):  # slices like the CPU's workers (run one after the other: exact, not fast)
            run(self.spec, list(args[0]), args[1], (n * k // t, n * (k + 1) // t) if t > 1 else None)


class PythonDevice(DeviceBase):
    """Host memory plus the reference interpreter."""

    backend_name = "PYTHON"

    def __init__(self, name: str = "PYTHON") -> None:
        super().__init__(name, HostAllocator(name, limit=available_ram()))

    def runtime(self, name: str, lib: bytes, **spec: Any) -> PythonProgram:
        """A program for `spec` (keyword `spec=`, a ProgramSpec: its UOps are what the interpreter runs)."""
        if spec.get("spec") is None:
            raise HCQError(
                f"PYTHON runs programs from their ProgramSpec (the interpreter executes its UOps): use "
                f"Device['PYTHON'].load_program(spec) for {name!r}"
            )
        return PythonProgram(self, name, bytes(lib), **spec)


register_device("PYTHON", PythonDevice)
