"""Operands of x86-64 instructions: physical registers, memory references, immediates, labels and external symbols.

Virtual registers (`speck.codegen.regalloc.VReg`) may appear wherever a register may before register allocation; the
encoder only accepts physical `Reg`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from speck.codegen.errors import CodegenValueError
from speck.codegen.x86.ops import X86Op

if TYPE_CHECKING:
    from speck.codegen.regalloc import RAInstr, VReg

GPR64 = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi") + tuple(f"r{i}" for i in range(8, 16))
GPR32 = ("eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi") + tuple(f"r{i}d" for i in range(8, 16))
GPR16 = ("ax", "cx", "dx", "bx", "sp", "bp", "si", "di") + tuple(f"r{i}w" for i in range(8, 16))
GPR8 = ("al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil") + tuple(f"r{i}b" for i in range(8, 16))
GPR_NAMES: dict[int, tuple[str, ...]] = {1: GPR8, 2: GPR16, 4: GPR32, 8: GPR64}


@dataclass(frozen=True)
class Reg:
    """A physical register: kind "gpr" (size 1/2/4/8 bytes, number 0..15), "vec" (size 16 = xmm, 32 = ymm,
    64 = zmm; number 0..31, where zmm and 16..31 exist only in AVX-512's EVEX encoding) or "k" (an AVX-512 opmask
    register k0..k7, size 8)."""

    kind: str
    num: int
    size: int

    def __post_init__(self) -> None:
        if self.kind == "gpr":
            ok = self.size in GPR_NAMES and 0 <= self.num < 16
        elif self.kind == "k":
            ok = self.size == 8 and 0 <= self.num < 8
        else:
            ok = self.kind == "vec" and self.size in (16, 32, 64) and 0 <= self.num < 32
        if not ok:
            raise CodegenValueError(
                f"Reg: expected kind 'gpr' with size 1/2/4/8 and num 0..15, 'vec' with size 16/32/64 and num "
                f"0..31, or 'k' with size 8 and num 0..7, got kind={self.kind!r} num={self.num} size={self.size}"
            )

    @property
    def name(self) -> str:
        """The Intel-syntax register name (eax, r9b, xmm12, ymm3)."""
        if self.kind == "gpr":
            return GPR_NAMES[self.size][self.num]
        if self.kind == "k":
            return f"k{self.num}"
        return ("xmm" if self.size == 16 else "ymm" if self.size == 32 else "zmm") + str(self.num)

    def __hash__(self) -> int:
        # equal registers have equal (kind, num, size); mixing the small ints directly is about twice as fast as the
        # generated hash of a field tuple, and instruction encodings are looked up by hashing their operands
        return self.num | self.size << 5 | (self.kind == "vec") << 12 | (self.kind == "k") << 13

    def sized(self, size: int) -> Reg:
        """The same register viewed at another width (eax.sized(8) is rax, xmm3.sized(32) is ymm3)."""
        return Reg(self.kind, self.num, size)

    @property
    def evex_only(self) -> bool:
        """zmm, or a vector register numbered 16..31: only an EVEX (AVX-512) encoding can name it."""
        return (self.kind == "vec" and (self.size == 64 or self.num >= 16)) or self.kind == "k"

    @property
    def ext(self) -> int:
        """Bit 3 of the register number (goes into REX/VEX R, X or B)."""
        return self.num >> 3

    @property
    def low3(self) -> int:
        """The low three bits of the register number (goes into ModRM/SIB or the opcode)."""
        return self.num & 7

    def __repr__(self) -> str:
        return self.name


def gpr(name: str) -> Reg:
    """Look up a general-purpose register by name (rax, r10d, sil, r15w)."""
    for size, names in GPR_NAMES.items():
        if name in names:
            return Reg("gpr", names.index(name), size)
    raise CodegenValueError(f"gpr: unknown register name {name!r}; expected one of {', '.join(GPR64 + GPR32)}, ...")


def xmm(num: int) -> Reg:
    """The 128-bit vector register xmm<num>."""
    return Reg("vec", num, 16)


def ymm(num: int) -> Reg:
    """The 256-bit vector register ymm<num>."""
    return Reg("vec", num, 32)


def zmm(num: int) -> Reg:
    """The 512-bit vector register zmm<num> (AVX-512, 0..31)."""
    return Reg("vec", num, 64)


def kreg(num: int) -> Reg:
    """The AVX-512 opmask register k<num> (0..7; k0 as a mask means "no mask")."""
    return Reg("k", num, 8)


@dataclass(frozen=True)
class Opmask:
    """AVX-512 write masking of an EVEX instruction, given as its last operand: lanes where opmask register k
    (k1..k7) is clear keep the destination's old value, or become zero when `zero` ({z}; registers only).
    The register is physical: selection uses opmasks only between adjacent instructions, so they need no
    allocation."""

    k: int
    zero: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.k < 8:
            raise CodegenValueError(f"Opmask: k must be 1..7 (k0 encodes 'no mask'), got {self.k}")


RSP = gpr("rsp")
CL = gpr("cl")

AnyReg = Union[Reg, "VReg"]


@dataclass(frozen=True, slots=True, init=False)
class Mem:
    """A memory operand [base + index*scale + disp], or RIP-relative [symbol + disp] when `symbol` is set.

    `size` is the access width in bytes; it is needed only when no register operand implies it (e.g. `add DWORD PTR
    [rdi], 1`) and for instructions whose memory width depends on it (vcvtsi2ss from memory).
    `broadcast`: AVX-512 embedded broadcast - one float32 read and repeated in every lane (`DWORD PTR [rdi]{1to16}`);
    only an EVEX encoding has it.
    """

    base: AnyReg | None = None
    index: AnyReg | None = None
    scale: int = 1
    disp: int = 0
    size: int | None = None
    symbol: str | None = None
    broadcast: bool = False

    def __init__(
        self, base: AnyReg | None = None, index: AnyReg | None = None, scale: int = 1, disp: int = 0,
        size: int | None = None, symbol: str | None = None, broadcast: bool = False,
    ) -> None:  # fmt: skip
        if scale not in (1, 2, 4, 8):
            raise CodegenValueError(f"Mem: scale must be 1, 2, 4 or 8, got {scale}")
        if not -(2**31) <= disp < 2**31:
            raise CodegenValueError(
                f"Mem: displacement {disp} does not fit a signed 32-bit field; materialise it in a "
                "register and use it as the index"
            )
        if symbol is not None and (base is not None or index is not None):
            raise CodegenValueError(
                "Mem: a RIP-relative reference (symbol set) cannot also have a base or index register"
            )
        if symbol is None and base is None and index is None:
            raise CodegenValueError("Mem: expected a base register, an index register or a symbol; got none of them")
        # frozen: written through the slots' descriptors, as Inst.__init__ does
        _set_base(self, base)
        _set_index(self, index)
        _set_scale(self, scale)
        _set_disp(self, disp)
        _set_size(self, size)
        _set_symbol(self, symbol)
        _set_broadcast(self, broadcast)

    def with_size(self, size: int | None) -> Mem:
        """The same address with another access width."""
        return Mem(self.base, self.index, self.scale, self.disp, size, self.symbol, self.broadcast)


_set_base, _set_index, _set_scale, _set_disp, _set_size, _set_symbol, _set_broadcast = (
    Mem.__dict__[name].__set__ for name in ("base", "index", "scale", "disp", "size", "symbol", "broadcast")
)


def rodata(offset: int, size: int | None = None) -> Mem:
    """A RIP-relative reference to byte `offset` of the object's .rodata section (becomes an R_X86_64_PC32)."""
    return Mem(disp=offset, size=size, symbol=".rodata")


@dataclass(frozen=True)
class Imm:
    """An immediate integer; the encoder picks the narrowest encoding the instruction form allows."""

    value: int


@dataclass(frozen=True)
class Label:
    """A position in the instruction stream: appears alone in the stream to define it, or as a jump target."""

    name: str


@dataclass(frozen=True)
class Sym:
    """An external (or other-section) symbol used as a call target; becomes an R_X86_64_PLT32 relocation."""

    name: str


@dataclass(frozen=True)
class IncomingStackArg:
    """Integer argument `index` (>= 6), which System V passes on the stack; register allocation turns it into an
    rsp-relative Mem once the frame size is known."""

    index: int
    size: int = 8


Operand = Union[Reg, "VReg", Mem, Imm, Label, Sym, IncomingStackArg, Opmask]


@dataclass(frozen=True, slots=True, init=False)
class Inst:
    """One machine instruction: an op and its operands in Intel order (destination first).

    `implicit_uses`/`implicit_defs` name registers the instruction reads/writes without spelling them (idiv's rax/rdx,
    cqo's rdx), `clobbers` names physical registers it destroys (a call's caller-saved set, by allocator register name).
    They matter only to register allocation; the encoder ignores them.
    """

    op: X86Op
    operands: tuple[Operand, ...] = ()
    implicit_uses: tuple[AnyReg, ...] = ()
    implicit_defs: tuple[AnyReg, ...] = ()
    clobbers: frozenset[str] = frozenset()
    # the register allocator's view (defs, uses, copy), filled in on first use by `alloc.ra_view`: the peephole
    # and the allocator both ask for every instruction. Not part of the value (no equality, hash or repr).
    _roles: RAInstr | None = field(default=None, init=False, compare=False, hash=False, repr=False)

    def __init__(
        self, op: X86Op, operands: tuple[Operand, ...] = (), implicit_uses: tuple[AnyReg, ...] = (),
        implicit_defs: tuple[AnyReg, ...] = (), clobbers: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        # the generated frozen __init__ writes each field through object.__setattr__; the slots' own descriptors do
        # the same write at half the cost, and an Inst is built for every instruction selected and allocated
        _set_op(self, op)
        _set_operands(self, operands)
        _set_implicit_uses(self, implicit_uses)
        _set_implicit_defs(self, implicit_defs)
        _set_clobbers(self, clobbers)
        _set_roles(self, None)

    def __repr__(self) -> str:
        return f"{self.op.value} {', '.join(map(repr, self.operands))}"


_set_op, _set_operands, _set_implicit_uses, _set_implicit_defs, _set_clobbers, _set_roles = (
    Inst.__dict__[name].__set__ for name in ("op", "operands", "implicit_uses", "implicit_defs", "clobbers", "_roles")
)


_NEW = object.__new__
_NO_CLOBBERS: frozenset[str] = frozenset()


def plain_inst(op: X86Op, operands: tuple[Operand, ...]) -> Inst:
    """Inst(op, operands): no implicit registers or clobbers. Selection and allocation build one per instruction:
    this fills the slots without the call through the class and its __init__ (about a quarter of the cost)."""
    i: Inst = _NEW(Inst)
    _set_op(i, op)
    _set_operands(i, operands)
    _set_implicit_uses(i, ())
    _set_implicit_defs(i, ())
    _set_clobbers(i, _NO_CLOBBERS)
    _set_roles(i, None)
    return i


def ins(op: X86Op, *operands: Operand) -> Inst:
    """Shorthand for Inst(op, operands)."""
    return Inst(op, tuple(operands))
