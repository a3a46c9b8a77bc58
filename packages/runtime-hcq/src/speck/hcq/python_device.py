"""The PYTHON device: runs programs through speck.codegen.interpret (slow, exact: the semantic reference).

Buffers are host memory like the CPU's. A program's "lib" is its rendered source (the PythonCompiler passes it
through); a call hands the interpreter the source, the kernel name, the buffers as memoryviews, the global size
and the variable values: `speck.codegen.interpret.run_program(src, name, buffers, global_size, vals)`."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from speck.codegen.compiler import Compiler
from speck.hcq.allocator import HostAllocator, available_ram
from speck.hcq.device import DeviceBase
from speck.hcq.errors import DeviceUnavailableError
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
        return (tuple(b.as_memoryview(raw=True) for b in bufs), tuple(vals))

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        interpreter().run_program(self.lib.decode(), self.name, list(args[0]), tuple(global_size), args[1])


class PythonDevice(DeviceBase):
    """Host memory plus the reference interpreter."""

    renderer_name = "python"

    def __init__(self) -> None:
        super().__init__("PYTHON", HostAllocator("PYTHON", limit=available_ram()))

    def _make_compiler(self) -> Compiler:
        return PythonCompiler()

    def runtime(self, name: str, lib: bytes, **spec: Any) -> PythonProgram:
        interpreter()  # fail at load time, not at the first call
        return PythonProgram(self, name, bytes(lib), **spec)
