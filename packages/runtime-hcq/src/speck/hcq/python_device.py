"""The PYTHON device: runs programs through speck.codegen.interpret (slow, exact: the semantic reference).

Buffers are host memory like the CPU's. Programs are loaded from a ProgramSpec (`load_program(spec)`; the
interpreter executes the spec's UOps, so raw bytes alone are not enough) and each call runs
`speck.codegen.interpret.run_program(spec, buffers, var_vals, core_range)` on the buffers' memoryviews, once per
worker slice of global_size[0], as the CPU would."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from speck.codegen.compiler import Compiler
from speck.hcq.allocator import HostAllocator, available_ram
from speck.hcq.device import DeviceBase
from speck.hcq.errors import DeviceUnavailableError, HCQError
from speck.hcq.program import Program

INTERPRETER = "speck.codegen.interpret"


def interpreter() -> Any:
    """The speck.codegen.interpret module; DeviceUnavailableError saying what is missing when it cannot be used."""
    try:
        mod = importlib.import_module(INTERPRETER)
    except ImportError as e:
        raise DeviceUnavailableError(
            f"the PYTHON device runs programs through {INTERPRETER}, which is not available yet ({e}); use CPU"
        ) from None
    if not hasattr(mod, "run_program"):
        raise DeviceUnavailableError(f"the PYTHON device needs {INTERPRETER}.run_program, which it does not define")
    return mod


class PythonCompiler(Compiler):
    """The identity compiler: the program's bytes are its rendered Python source."""

    name = "python"

    def compile(self, src: str) -> bytes:
        return src.encode()

    def compile_uncached(self, src: str) -> bytes:
        return src.encode()

    def disassemble(self, lib: bytes) -> str:
        return lib.decode(errors="replace")


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
        run = interpreter().run_program
        t = max(1, min(1 if threads is None else threads, n))
        for k in range(t):  # slices like the CPU's workers (run one after the other: exact, not fast)
            run(self.spec, list(args[0]), args[1], (n * k // t, n * (k + 1) // t) if t > 1 else None)


class PythonDevice(DeviceBase):
    """Host memory plus the reference interpreter."""

    renderer_name = "python"

    def __init__(self) -> None:
        super().__init__("PYTHON", HostAllocator("PYTHON", limit=available_ram()))

    def _make_compiler(self) -> Compiler:
        return PythonCompiler()

    def runtime(self, name: str, lib: bytes, **spec: Any) -> PythonProgram:
        """A program for `spec` (keyword `spec=`, a ProgramSpec: its UOps are what the interpreter runs)."""
        interpreter()  # fail at load time, not at the first call
        if spec.get("spec") is None:
            raise HCQError(
                f"PYTHON runs programs from their ProgramSpec (the interpreter executes its UOps): use "
                f"Device['PYTHON'].load_program(spec) for {name!r}"
            )
        return PythonProgram(self, name, bytes(lib), **spec)
