"""Tables and small helpers shared by the x86-64 selection rules (select.py, select_cast.py, select_vector.py)."""

from __future__ import annotations

from speck.codegen.x86.operands import Mem
from speck.codegen.x86.ops import X86Op as O
from speck.uop import DType, Ops, UOp

FLOAT_OPS: dict[tuple[str, int], O] = {
    ("mov", 4): O.VMOVSS, ("mov", 8): O.VMOVSD, ("max", 4): O.VMAXSS, ("max", 8): O.VMAXSD,
    ("cmp", 4): O.VCMPSS, ("cmp", 8): O.VCMPSD, ("blend", 4): O.VBLENDVPS, ("blend", 8): O.VBLENDVPD,
    ("ucomi", 4): O.VUCOMISS, ("ucomi", 8): O.VUCOMISD, ("sqrt", 4): O.VSQRTSS, ("sqrt", 8): O.VSQRTSD,
    ("round", 4): O.VROUNDSS, ("round", 8): O.VROUNDSD, ("xor", 4): O.VXORPS, ("xor", 8): O.VXORPD,
    ("and", 4): O.VANDPS, ("and", 8): O.VANDPD, ("cvtsi", 4): O.VCVTSI2SS, ("cvtsi", 8): O.VCVTSI2SD,
    ("cvtt", 4): O.VCVTTSS2SI, ("cvtt", 8): O.VCVTTSD2SI,
}  # fmt: skip
"""Scalar float instructions by (role, operand bytes)."""

VCMP_UNORD, ROUND_TRUNC = 3, 3
"""imm8 of vcmpss/vcmpps for 'unordered' and of vroundss/vroundps for 'truncate'."""


def osize(dt: DType) -> int:
    """The register width an integer/bool operation on dt uses (narrow types compute in 32 bits)."""
    return 8 if dt.itemsize == 8 else 4


def is_cconst(u: UOp) -> bool:
    """A casted const CAST(dt, CONST(v))."""
    return u.op is _CAST and u.src[0].op is _CONST


# (module constants: in Python 3.11 each `Ops.X` goes through the enum metaclass's __getattr__ hook, several times the
# cost of reading a global)
_CAST, _CONST = Ops.CAST, Ops.CONST


def vec_bytes(count: int) -> int:
    """Register width of a float32 vector: xmm up to 4 lanes, ymm up to 8, zmm (AVX-512) for 16."""
    return 16 if count <= 4 else 32 if count <= 8 else 64


def mem_at(mem: Mem, offset: int, size: int | None) -> Mem:
    """mem moved by `offset` bytes, accessing `size` bytes."""
    return Mem(mem.base, mem.index, mem.scale, mem.disp + offset, size, mem.symbol, mem.broadcast)
