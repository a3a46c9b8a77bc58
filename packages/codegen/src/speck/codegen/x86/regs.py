"""x86-64 glue for the target-independent register allocator: register classes, System V roles, name lookup.

Allocator register names are the 64-bit GPR names and xmm0..xmm31 (16..31 in the AVX-512 class "zvec"); `phys`
turns a name and an operand width into the encoder's `Reg` (rax at 4 bytes is eax, xmm3 at 32 bytes is ymm3).
Scratch registers are kept out of allocation so a spilled operand can always be reloaded; r10/r11 are chosen because
no System V role (arguments, returns, division, shift count) ever pins them.
"""

from __future__ import annotations

from speck.codegen.errors import CodegenValueError
from speck.codegen.regalloc import RegClass, RegTarget, VReg
from speck.codegen.x86.operands import GPR64, Reg

GPR = RegClass(
    "gpr",
    # caller-saved first: they cost no save/restore in the prologue
    allocatable=("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "rbx", "r12", "r13", "r14", "r15", "rbp"),
    scratch=("r11", "r10"),
    slot_size=8,
)
VEC = RegClass(
    "vec", allocatable=tuple(f"xmm{i}" for i in range(13)), scratch=("xmm13", "xmm14", "xmm15"), slot_size=32
)
# AVX-512: zmm values live in the 16 registers only EVEX can name, so a zmm value never shares a register with the
# VEX-encoded xmm/ymm code (whose instructions have no EVEX form) and both classes allocate independently
ZVEC = RegClass("zvec", allocatable=tuple(f"xmm{i}" for i in range(16, 30)), scratch=("xmm30", "xmm31"), slot_size=64)

CALLEE_SAVED = frozenset({"rbx", "rbp", "r12", "r13", "r14", "r15"})
X86_64_SYSV = RegTarget({"gpr": GPR, "vec": VEC, "zvec": ZVEC}, CALLEE_SAVED)

ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
"""System V integer/pointer argument registers, in argument order."""
FLOAT_ARG_REGS = tuple(f"xmm{i}" for i in range(8))
CALL_CLOBBERS = frozenset(set(GPR.allocatable + GPR.scratch) - CALLEE_SAVED) | frozenset(f"xmm{i}" for i in range(32))
"""Registers a System V call may destroy (all vector registers, the caller-saved GPRs)."""


def phys(name: str, size: int) -> Reg:
    """The encoder register for allocator register `name` used at `size` bytes."""
    # called for every register operand after allocation: Regs are immutable, so each (name, size) is built once
    r = _PHYS.get((name, size))
    if r is None:
        if name.startswith("xmm"):
            r = Reg("vec", int(name[3:]), size)
        elif name not in GPR64:
            raise CodegenValueError(
                f"phys: unknown x86-64 register {name!r}; expected a 64-bit GPR name or xmm0..xmm31"
            )
        else:
            r = Reg("gpr", GPR64.index(name), size)
        _PHYS[(name, size)] = r
    return r


_PHYS: dict[tuple[str, int], Reg] = {}


class SizedRegs(dict[int, Reg]):
    """One allocator register at every operand width: size -> Reg (filled on first use of each width)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __missing__(self, size: int) -> Reg:
        r = self[size] = phys(self.name, size)
        return r


def sized_regs(name: str) -> SizedRegs:
    """The width -> Reg table of allocator register `name` (one per register and process: Regs are immutable)."""
    t = _SIZED.get(name)
    if t is None:
        t = _SIZED[name] = SizedRegs(name)
    return t


_SIZED: dict[str, SizedRegs] = {}


def arg_vreg(index: int, vid: int, size: int = 8) -> VReg:
    """A virtual register pinned to the System V register of integer argument `index` (0..5)."""
    if not 0 <= index < len(ARG_REGS):
        raise CodegenValueError(
            f"arg_vreg: integer argument {index} is not passed in a register (only 0..5 are); "
            "load it with IncomingStackArg"
        )
    return VReg(vid, "gpr", size, ARG_REGS[index])
