"""A decoded instruction: its encoding, mnemonic, LLVM-syntax disassembly and a closure that executes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from speck.usbgpu.errors import EmulationError

if TYPE_CHECKING:
    from speck.usbgpu.sim.rdna3.wave import Waves

# instruction classes counted in Stats (a cycle model weighs them): scalar ALU, vector ALU, transcendental VALU,
# scalar memory, vector memory, LDS, branches, waits, barriers, end of program, no-ops
KINDS = ("salu", "valu", "trans", "smem", "vmem", "lds", "branch", "wait", "barrier", "end", "nop")


@dataclass(eq=False)
class Inst:
    """One instruction at `pc`. `run(w)` executes it for a group of waves (ordinary instructions); control flow
    (`kind` branch/barrier/end/wait) is carried out by the dispatcher from `target`, `cond` and `run`."""

    pc: int
    words: tuple[int, ...]
    enc: str
    op: int
    name: str
    operands: str
    kind: str
    run: Callable[[Waves], None] | None = None
    vregs: frozenset[int] = frozenset()  # VGPRs read or written (checked against outstanding loads)
    sregs: frozenset[int] = frozenset()
    target: int | None = None  # branch target
    cond: Callable[[Waves], np.ndarray] | None = None  # per-wave "taken" for conditional branches
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return 4 * len(self.words)

    @property
    def text(self) -> str:
        return f"{self.name} {self.operands}".rstrip()

    def __str__(self) -> str:
        words = " ".join(f"{x:08X}" for x in self.words)
        return f"{self.text:60s} // {self.pc:012X}: {words}"


class Unimplemented:
    """The executor of an instruction the emulator does not implement: it stops the dispatch (never a skip)."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name, self.detail = name, detail

    def __call__(self, w: Waves) -> None:
        raise EmulationError(f"{self.name} is not implemented by the RDNA3 emulator{self.detail}", mnemonic=self.name)


def unimplemented(name: str, detail: str = "") -> Callable[[Waves], None]:
    return Unimplemented(name, detail)


def base_mnemonic(name: str) -> str:
    """The mnemonic without LLVM's encoding suffix (v_add_f32_e32 -> v_add_f32)."""
    for suffix in ("_e64_dpp", "_dpp", "_e32", "_e64"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def vgpr_range(r: int, count: int) -> frozenset[int]:
    return frozenset(range(r, r + count))
