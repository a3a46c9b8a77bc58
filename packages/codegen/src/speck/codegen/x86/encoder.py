"""x86-64 machine-code encoder: REX/VEX prefixes, ModRM/SIB, displacements, immediates and jump encodings.

`encode` turns one `Inst` with physical operands into bytes, an objdump-identical listing line and, for RIP-relative
data references and calls to external symbols, a relocation; branches are encoded at a given address against known
label addresses (`speck.codegen.x86.assembler` does the layout). The per-instruction encodings are data at the end of
the module (`GPR_TABLE`, `VEX_TABLE`), each row citing the Intel SDM volume 2 opcode it implements. Everything but a
branch encodes the same wherever it is placed, so `encode` keeps those encodings in a bounded cache of the forms it
has seen (`encode_uncached` builds one from scratch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from speck.codegen.errors import EncodingError
from speck.codegen.x86.listing import CMP_PREDICATES, format_instruction, format_mem, format_operand, listing_body
from speck.codegen.x86.operands import CL, Imm, Inst, Label, Mem, Operand, Opmask, Reg, Sym
from speck.codegen.x86.ops import CMOVCC_OPS, COND_CODE, JCC_OPS, SETCC_OPS, X86Op


@dataclass(frozen=True)
class Relocation:
    """A 32-bit PC-relative field at `offset` (from the start of the code) to be filled with S + addend - P."""

    offset: int
    kind: str  # "PC32" (data reference) or "PLT32" (call to a function)
    symbol: str
    addend: int


@dataclass(frozen=True)
class Encoded:
    """One encoded instruction: its bytes, listing text, and an optional relocation (offset relative to the start)."""

    raw: bytes
    text: str
    comment: str = ""
    reloc: Relocation | None = None
    # the listing line after its address (`bytes<TAB>text comment`), formatted once: an encoding comes from the
    # cache far more often than it is built, and every render lists every instruction
    body: str = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", listing_body(self.raw, self.text, self.comment))


# ---------------------------------------------------------------------------------------------------------------
# ModRM / SIB / displacement (Intel SDM vol. 2A, section 2.1.5 and 2.2.1)

_SCALE_BITS = {1: 0, 2: 1, 4: 2, 8: 3}


def _addr_reg(r: object, what: str, inst: Inst) -> Reg:
    if not isinstance(r, Reg) or r.kind != "gpr" or r.size != 8:
        raise EncodingError(
            f"{inst!r}: memory {what} must be a 64-bit physical register, got {r!r}"
            + ("; run register allocation first" if not isinstance(r, Reg) else "")
        )
    return r


def _modrm(reg_field: int, rm: Reg | Mem, inst: Inst) -> tuple[int, int, bytes, int | None]:
    """Encode ModRM (+SIB +disp) for `rm`; returns (REX.X bit, REX.B bit, bytes, offset of a RIP disp32 or None).

    Two irregular cases come from how the fields were reused: rm=100 means "a SIB follows", so rsp/r12 as a base
    always need a SIB; mod=00 rm=101 means RIP-relative (and SIB base=101 means "no base"), so rbp/r13 as a base always
    need a displacement, encoded as disp8 = 0 when the offset is zero.
    """
    reg3 = (reg_field & 7) << 3
    if isinstance(rm, Reg):
        return 0, rm.ext, bytes([0xC0 | reg3 | rm.low3]), None
    if rm.symbol is not None:
        return 0, 0, bytes([0x00 | reg3 | 0b101]) + b"\0\0\0\0", 1
    disp = rm.disp
    if rm.base is None:
        index = _addr_reg(rm.index, "index", inst)
        if index.num == 4:
            raise EncodingError(f"{inst!r}: rsp cannot be an index register")
        sib = (_SCALE_BITS[rm.scale] << 6) | (index.low3 << 3) | 0b101
        return index.ext, 0, bytes([reg3 | 0b100, sib]) + disp.to_bytes(4, "little", signed=True), None
    base = _addr_reg(rm.base, "base", inst)
    if disp == 0 and base.low3 != 5:
        mod, disp_bytes = 0b00, b""
    elif -128 <= disp < 128:
        mod, disp_bytes = 0b01, disp.to_bytes(1, "little", signed=True)
    else:
        mod, disp_bytes = 0b10, disp.to_bytes(4, "little", signed=True)
    if rm.index is None and base.low3 != 4:
        return 0, base.ext, bytes([(mod << 6) | reg3 | base.low3]) + disp_bytes, None
    x = 0
    index_bits = 0b100  # "no index"
    if rm.index is not None:
        index = _addr_reg(rm.index, "index", inst)
        if index.num == 4:
            raise EncodingError(f"{inst!r}: rsp cannot be an index register")
        x, index_bits = index.ext, index.low3
    scale_bits = _SCALE_BITS[rm.scale] if rm.index is not None else 0  # scale without an index is meaningless
    sib = (scale_bits << 6) | (index_bits << 3) | base.low3
    return x, base.ext, bytes([(mod << 6) | reg3 | 0b100, sib]) + disp_bytes, None


def _finish(inst: Inst, head: bytes, modrm: bytes, rip_at: int | None, imm: bytes, text: str) -> Encoded:
    raw = head + modrm + imm
    comment = ""
    reloc = None
    if rip_at is not None:
        mem = next(o for o in inst.operands if isinstance(o, Mem))
        assert mem.symbol is not None
        offset = len(head) + rip_at
        # the CPU adds the displacement to the address of the NEXT instruction, the linker computes S + A - P with P
        # the address of the field: A = disp - (bytes from the field to the end of the instruction)
        reloc = Relocation(offset, "PC32", mem.symbol, mem.disp - (len(raw) - offset))
        comment = f"# <{mem.symbol}{mem.disp:+#x}>"
    return Encoded(raw, text, comment, reloc)


def _legacy(
    inst: Inst, opcode: bytes, reg_field: int, rm: Reg | Mem, size: int, imm: bytes, text: str, w: bool | None = None
) -> Encoded:
    """Legacy/REX encoding: [66] [REX] opcode ModRM [SIB] [disp] [imm]; REX.W for 64-bit operand size."""
    x, b, modrm, rip_at = _modrm(reg_field, rm, inst)
    rex_w = size == 8 if w is None else w
    r = reg_field >> 3
    rex = 0x40 | (rex_w << 3) | (r << 2) | (x << 1) | b
    # spl/bpl/sil/dil exist only with a REX prefix (without one, 4..7 name ah/ch/dh/bh)
    need_rex = rex != 0x40 or any(
        isinstance(o, Reg) and o.kind == "gpr" and o.size == 1 and 4 <= o.num < 8 for o in inst.operands
    )
    head = (b"\x66" if size == 2 else b"") + (bytes([rex]) if need_rex else b"") + opcode
    return _finish(inst, head, modrm, rip_at, imm, text)


def _vex(
    inst: Inst, pp: int, mmmmm: int, w: int, vl: int, opcode: int, reg_field: int, vvvv: int, rm: Reg | Mem,
    imm: bytes, text: str,
) -> Encoded:  # fmt: skip
    """VEX encoding (Intel SDM vol. 2A, section 2.3): the 2-byte C5 form when X, B and W are clear and the map is 0F."""
    x, b, modrm, rip_at = _modrm(reg_field, rm, inst)
    r = reg_field >> 3
    tail = ((~vvvv & 15) << 3) | (vl << 2) | pp
    if x == 0 and b == 0 and w == 0 and mmmmm == 1:
        head = bytes([0xC5, ((r ^ 1) << 7) | tail, opcode])
    else:
        head = bytes([0xC4, ((r ^ 1) << 7) | ((x ^ 1) << 6) | ((b ^ 1) << 5) | mmmmm, (w << 7) | tail, opcode])
    return _finish(inst, head, modrm, rip_at, imm, text)


# ---------------------------------------------------------------------------------------------------------------
# general-purpose instructions


def fits_signed(value: int, bits: int) -> bool:
    """Whether `value` is representable as a `bits`-bit two's-complement integer."""
    return -(1 << (bits - 1)) <= value < (1 << (bits - 1))


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _check_imm(inst: Inst, value: int, size: int) -> None:
    lo, hi = (-(2**31), 2**31) if size == 8 else (-(1 << (8 * size - 1)), 1 << (8 * size))
    if not lo <= value < hi:
        raise EncodingError(
            f"{inst!r}: immediate {value} does not fit a {8 * min(size, 4)}-bit field for a "
            f"{8 * size}-bit operation (range [{lo}, {hi})); use MOVABS into a register"
        )


def _gpr_size(inst: Inst, regs: Sequence[Operand]) -> int:
    """Operand size: from the register operands, or from the memory operand's size when there is no register."""
    sizes = {o.size for o in regs if isinstance(o, Reg)}
    for o in regs:
        if isinstance(o, Reg) and o.kind != "gpr":
            raise EncodingError(f"{inst!r}: expected general-purpose registers, got {o.name}")
    if len(sizes) > 1:
        raise EncodingError(f"{inst!r}: register operands have different sizes {sorted(sizes)}; they must match")
    if sizes:
        return sizes.pop()
    mem = next((o for o in inst.operands if isinstance(o, Mem)), None)
    if mem is None or mem.size not in (1, 2, 4, 8):
        raise EncodingError(f"{inst!r}: cannot tell the operand size; give the Mem operand size=1/2/4/8")
    return mem.size


def _is_rm(o: Operand) -> bool:
    return isinstance(o, Mem) or (isinstance(o, Reg) and o.kind == "gpr")


_PHYSICAL = (Reg, Mem, Imm, Label, Sym, Opmask)
_LISTED = (Reg, Mem, Imm, Label, Sym)  # operands listed on their own (an Opmask follows its destination)


def _require(inst: Inst, ok: bool, expected: str) -> None:
    for o in inst.operands:
        if not isinstance(o, _PHYSICAL):
            raise EncodingError(
                f"{inst!r}: operand {o!r} is not physical (a virtual register or stack argument); "
                "run register allocation first"
            )
        if isinstance(o, Mem) and not (
            (o.base is None or isinstance(o.base, Reg)) and (o.index is None or isinstance(o.index, Reg))
        ):
            raise EncodingError(f"{inst!r}: {o!r} uses a virtual register; run register allocation first")
    if not ok:
        found = ", ".join(type(o).__name__ + ("" if not isinstance(o, Reg) else f"({o.name})") for o in inst.operands)
        raise EncodingError(f"{inst.op.name}: expected operands {expected}, got ({found})")


def _text(inst: Inst, mem_size: int | None, imm_bits: int) -> str:
    ops = [format_operand(o, mem_size, imm_bits) for o in inst.operands if isinstance(o, _LISTED)]
    return format_instruction(inst.op.value, ops)


def _rm(o: Operand) -> Reg | Mem:
    assert isinstance(o, (Reg, Mem)), o
    return o


def _reg(o: Operand) -> Reg:
    assert isinstance(o, Reg), o
    return o


def _imm_bytes(value: int, nbytes: int) -> bytes:
    return (value & ((1 << (8 * nbytes)) - 1)).to_bytes(nbytes, "little")


def _encode_alu_like(inst: Inst, kind: str, param: int) -> Encoded:
    """ALU ops, MOV and TEST: (r/m, r), (r, m) and (r/m, imm) at 8/16/32/64 bits."""
    ops = inst.operands
    ok = len(ops) == 2 and _is_rm(ops[0]) and (_is_rm(ops[1]) or isinstance(ops[1], Imm))
    _require(inst, ok and not (isinstance(ops[0], Mem) and isinstance(ops[1], Mem)), "(r/m, r), (r, r/m) or (r/m, imm)")
    dst, src = _rm(ops[0]), ops[1]
    size = _gpr_size(inst, [o for o in ops if isinstance(o, Reg)])
    text = _text(inst, size, 8 * size)
    if isinstance(src, Imm):
        _check_imm(inst, src.value, size)
        if kind == "alu" and size > 1 and fits_signed(_signed(src.value, 8 * size), 8):
            return _legacy(inst, b"\x83", param, dst, size, _imm_bytes(src.value, 1), text)
        imm = _imm_bytes(src.value, min(size, 4))
        if kind == "mov" and isinstance(dst, Reg) and size < 8:  # B0+rb / B8+rd: one byte shorter than C6/C7
            rex = 0x40 | dst.ext
            byte_reg = size == 1 and 4 <= dst.num < 8
            head = (b"\x66" if size == 2 else b"") + (bytes([rex]) if rex != 0x40 or byte_reg else b"")
            return Encoded(head + bytes([(0xB0 if size == 1 else 0xB8) + dst.low3]) + imm, text)
        opc = {"alu": (0x80, 0x81), "mov": (0xC6, 0xC7), "test": (0xF6, 0xF7)}[kind][size > 1]
        return _legacy(inst, bytes([opc]), param if kind == "alu" else 0, dst, size, imm, text)
    base = {"alu": param * 8, "mov": 0x88, "test": 0x84}[kind]
    if isinstance(dst, Reg) and isinstance(src, Mem):
        if kind == "test":  # test is symmetric: encode as (r/m, r)
            return _legacy(inst, bytes([base + (size > 1)]), dst.num, src, size, b"", text)
        return _legacy(inst, bytes([base + 2 + (size > 1)]), dst.num, src, size, b"", text)
    return _legacy(inst, bytes([base + (size > 1)]), _reg(src).num, dst, size, b"", text)


def _encode_imul(inst: Inst) -> Encoded:
    """IMUL in its one- (rdx:rax), two- and three-operand forms."""
    ops = inst.operands
    n = len(ops)
    if n == 1:
        return _encode_gpr(inst, "unary", 5)
    _require(
        inst,
        n in (2, 3) and isinstance(ops[0], Reg) and _is_rm(ops[1]) and (n == 2 or isinstance(ops[2], Imm)),
        "(r/m), (r, r/m) or (r, r/m, imm)",
    )
    dst, src = _reg(ops[0]), _rm(ops[1])
    size = _gpr_size(inst, ops[:2])
    if size == 1:
        raise EncodingError(f"{inst!r}: two/three-operand imul has no 8-bit form; widen to 32 bits")
    text = _text(inst, size, 8 * size)
    if n == 2:
        return _legacy(inst, b"\x0f\xaf", dst.num, src, size, b"", text)
    imm = ops[2]
    assert isinstance(imm, Imm)
    _check_imm(inst, imm.value, size)
    if fits_signed(_signed(imm.value, 8 * size), 8):
        return _legacy(inst, b"\x6b", dst.num, src, size, _imm_bytes(imm.value, 1), text)
    return _legacy(inst, b"\x69", dst.num, src, size, _imm_bytes(imm.value, min(size, 4)), text)


def _encode_extend(inst: Inst, kind: str, param: int) -> Encoded:
    """MOVZX/MOVSX from 8/16 bits and MOVSXD from 32 bits."""
    ops = inst.operands
    _require(inst, len(ops) == 2 and isinstance(ops[0], Reg) and _is_rm(ops[1]), "(r, r/m)")
    dst, src = _reg(ops[0]), _rm(ops[1])
    src_size = src.size
    if kind == "movsxd":
        if dst.size != 8 or src_size not in (4, None):
            raise EncodingError(f"{inst!r}: movsxd takes a 64-bit destination and a 32-bit source")
        return _legacy(inst, b"\x63", dst.num, src, 8, b"", _text(inst, 4, 8))
    if src_size not in (1, 2) or dst.size <= src_size or dst.kind != "gpr":
        raise EncodingError(
            f"{inst!r}: {inst.op.value} takes an 8/16-bit source (Mem size=1 or 2) and a wider "
            f"general-purpose destination"
        )
    return _legacy(inst, bytes([0x0F, param + (src_size == 2)]), dst.num, src, dst.size, b"", _text(inst, src_size, 8))


def _encode_gpr(inst: Inst, kind: str, param: int) -> Encoded:
    ops = inst.operands
    n = len(ops)
    if kind == "fixed":
        _require(inst, n == 0, "()")
        return Encoded(bytes.fromhex(FIXED_BYTES[inst.op]), inst.op.value)
    if kind in ("alu", "mov", "test"):
        return _encode_alu_like(inst, kind, param)
    if kind == "imul":
        return _encode_imul(inst)
    if kind in ("movzx", "movsx", "movsxd"):
        return _encode_extend(inst, kind, param)
    if kind == "unary":  # F6/F7 group 3, FE/FF group 4/5
        _require(inst, n == 1 and _is_rm(ops[0]), "(r/m)")
        size = _gpr_size(inst, ops)
        group = (0xFE, 0xFF) if inst.op in (X86Op.INC, X86Op.DEC) else (0xF6, 0xF7)
        return _legacy(inst, bytes([group[size > 1]]), param, _rm(ops[0]), size, b"", _text(inst, size, 8))
    if kind == "shift":
        _require(
            inst, n == 2 and _is_rm(ops[0]) and (ops[1] == CL or isinstance(ops[1], Imm)), "(r/m, cl) or (r/m, imm8)"
        )
        size = _gpr_size(inst, ops[:1])
        text = _text(inst, size, 8)
        count = ops[1]
        if isinstance(count, Imm):
            if not 0 <= count.value < 256:
                raise EncodingError(f"{inst!r}: shift count {count.value} must be in [0, 256)")
            return _legacy(inst, bytes([0xC0 + (size > 1)]), param, _rm(ops[0]), size, bytes([count.value]), text)
        return _legacy(inst, bytes([0xD2 + (size > 1)]), param, _rm(ops[0]), size, b"", text)
    if kind == "lea":
        _require(inst, n == 2 and isinstance(ops[0], Reg) and isinstance(ops[1], Mem), "(r, m)")
        size = _gpr_size(inst, ops[:1])
        if size == 1:
            raise EncodingError(f"{inst!r}: lea has no 8-bit form")
        return _legacy(inst, b"\x8d", _reg(ops[0]).num, _rm(ops[1]), size, b"", _text(inst, None, 8))
    if kind == "setcc":
        _require(inst, n == 1 and _is_rm(ops[0]), "(r/m8)")
        if _gpr_size(inst, ops) != 1:
            raise EncodingError(f"{inst!r}: set{inst.op.value[3:]} writes an 8-bit register or BYTE memory")
        return _legacy(inst, bytes([0x0F, 0x90 + COND_CODE[inst.op]]), 0, _rm(ops[0]), 1, b"", _text(inst, 1, 8))
    if kind == "cmovcc":
        _require(inst, n == 2 and isinstance(ops[0], Reg) and _is_rm(ops[1]), "(r, r/m)")
        size = _gpr_size(inst, ops)
        if size == 1:
            raise EncodingError(f"{inst!r}: cmov has no 8-bit form")
        opc = bytes([0x0F, 0x40 + COND_CODE[inst.op]])
        return _legacy(inst, opc, _reg(ops[0]).num, _rm(ops[1]), size, b"", _text(inst, size, 8))
    if kind == "movabs":
        _require(inst, n == 2 and isinstance(ops[0], Reg) and ops[0].kind == "gpr" and ops[0].size == 8
                 and isinstance(ops[1], Imm), "(r64, imm64)")  # fmt: skip
        dst, imm = _reg(ops[0]), ops[1]
        assert isinstance(imm, Imm)
        if not -(2**63) <= imm.value < 2**64:
            raise EncodingError(f"{inst!r}: immediate {imm.value} does not fit 64 bits")
        raw = bytes([0x48 | dst.ext, 0xB8 + dst.low3]) + _imm_bytes(imm.value, 8)
        return Encoded(raw, _text(inst, None, 64))
    if kind in ("push", "pop"):
        _require(inst, n == 1 and isinstance(ops[0], Reg) and ops[0].kind == "gpr" and ops[0].size == 8, "(r64)")
        r = _reg(ops[0])
        return Encoded((b"\x41" if r.ext else b"") + bytes([param + r.low3]), _text(inst, None, 8))
    raise AssertionError(kind)


# ---------------------------------------------------------------------------------------------------------------
# VEX-encoded vector instructions


@dataclass(frozen=True)
class VexForm:
    """One VEX encoding: Intel's operand-encoding column (openc), operand kinds, and the VEX fields.

    Operand kinds: x vector register of the instruction's width, X xmm, Y ymm, m memory, xm/Xm register or memory,
    g general-purpose register (32-bit when W=0, 64-bit when W=1), gm gpr or memory, i imm8. `w=None` takes W from the
    gpr operand's size, `vl=None` takes VEX.L from the vector width, `mem` is the memory access width ("v": vector
    width, "g": gpr width).
    """

    openc: str
    sig: tuple[str, ...]
    pp: int
    mmmmm: int
    opcode: int
    w: int | None = 0
    vl: int | None = None
    mem: int | str = "v"
    ext: int = 0
    ref: str = ""


def _kind_ok(tok: str, o: Operand) -> bool:
    if isinstance(o, Reg):
        if o.kind == "vec":
            return tok in _VEC_TOKENS or (tok in _XMM_TOKENS and o.size == 16) or (tok == "Y" and o.size == 32)
        return o.kind == "gpr" and tok in _GPR_TOKENS
    if isinstance(o, Mem):
        return tok in _MEM_TOKENS
    return tok == "i" and isinstance(o, Imm)


# operand kinds (see VexForm) each operand type satisfies; X/Xm also need an xmm, Y a ymm
_VEC_TOKENS = frozenset({"x", "xm"})
_XMM_TOKENS = frozenset({"X", "Xm"})
_GPR_TOKENS = frozenset({"g", "gm"})
_MEM_TOKENS = frozenset({"m", "xm", "Xm", "gm"})


def _encode_vex(inst: Inst, forms: tuple[VexForm, ...]) -> Encoded:
    _require(inst, True, "")
    ops = inst.operands
    for f in forms:
        if len(f.sig) == len(ops) and all(_kind_ok(t, o) for t, o in zip(f.sig, ops)):
            break
    else:
        expected = " or ".join("(" + ", ".join(f.sig) + ")" for f in forms)
        found = ", ".join(o.name if isinstance(o, Reg) else type(o).__name__ for o in ops)
        raise EncodingError(
            f"{inst.op.name}: expected operands {expected} (x/X/Y: vector/xmm/ymm register, "
            f"m: memory, g: general register, i: imm8), got ({found})"
        )
    widths = {o.size for t, o in zip(f.sig, ops) if t in ("x", "xm") and isinstance(o, Reg)}
    if len(widths) > 1:
        raise EncodingError(f"{inst!r}: vector operands mix xmm and ymm; use one width")
    vl = f.vl if f.vl is not None else int(widths == {32})
    gprs = [o for t, o in zip(f.sig, ops) if t in ("g", "gm") and isinstance(o, Reg)]
    mem = next((o for o in ops if isinstance(o, Mem)), None)
    gsize = gprs[0].size if gprs else (mem.size if mem is not None and "gm" in f.sig else None)
    if f.w is None:
        if gsize not in (4, 8):
            raise EncodingError(f"{inst!r}: the integer operand must be 32 or 64 bits (give Mem size=4 or 8)")
        w = int(gsize == 8)
    else:
        w = f.w
        if gsize is not None and gsize != (8 if w else 4):
            raise EncodingError(f"{inst!r}: the general-purpose operand must be {'64' if w else '32'}-bit")
    mem_size = {"v": 16 << vl, "v/4": 4 << vl, "g": gsize}.get(f.mem, f.mem) if isinstance(f.mem, str) else f.mem
    imm = b""
    imm_op = next((o for o in ops if isinstance(o, Imm)), None)
    if imm_op is not None:
        if not -128 <= imm_op.value < 256:
            raise EncodingError(f"{inst!r}: imm8 {imm_op.value} out of range [-128, 256)")
        imm = bytes([imm_op.value & 0xFF])
    mnemonic = inst.op.value
    text_ops = list(ops)
    if inst.op in (X86Op.VCMPSS, X86Op.VCMPSD, X86Op.VCMPPS, X86Op.VCMPPD):
        assert imm_op is not None
        if not 0 <= imm_op.value < 32:
            raise EncodingError(f"{inst!r}: compare predicate must be in [0, 32), got {imm_op.value}")
        mnemonic = "vcmp" + CMP_PREDICATES[imm_op.value] + mnemonic[4:]
        text_ops = text_ops[:-1]
    text = format_instruction(mnemonic, [format_operand(o, mem_size, 8) for o in text_ops])  # type: ignore[arg-type]

    def num(o: Operand) -> int:
        assert isinstance(o, Reg)
        return o.num

    enc = f.openc
    if enc == "ZO":
        return Encoded(bytes([0xC5, 0xF8, f.opcode]), text)
    if enc in ("RM", "RMI"):
        reg, vvvv, rm = num(ops[0]), 0, ops[1]
    elif enc in ("MR", "MRI"):
        reg, vvvv, rm = num(ops[1]), 0, ops[0]
    elif enc in ("RVM", "RVMI", "RVMR"):
        reg, vvvv, rm = num(ops[0]), num(ops[1]), ops[2]
        if enc == "RVMR":
            imm = bytes([num(ops[3]) << 4])
    elif enc == "VMI":
        reg, vvvv, rm = f.ext, num(ops[0]), ops[1]
    else:
        raise AssertionError(enc)
    assert isinstance(rm, (Reg, Mem))
    return _vex(inst, f.pp, f.mmmmm, w, vl, f.opcode, reg, vvvv, rm, imm, text)


# ---------------------------------------------------------------------------------------------------------------
# public API


def encode(inst: Inst, pc: int = 0, labels: dict[str, int] | None = None, long_jump: bool = True) -> Encoded:
    """Encode one instruction at address `pc`; jump targets are looked up in `labels` (name -> address).

    Jumps and calls to labels use rel8 unless `long_jump` (calls are always rel32); calls to a `Sym` produce a
    PLT32 relocation. Raises EncodingError for operands no form of the op accepts. Every other instruction's
    encoding depends on nothing but the instruction, so it comes from a cache of the forms seen before (see
    `encode_uncached`, which is what the cache holds).
    """
    if inst.op in _BRANCH_OPS:
        return _encode_branch(inst, pc, labels, long_jump)
    key = (inst.op, inst.operands)  # all the encoding depends on (implicit registers and clobbers do not matter)
    enc = _ENCODED.get(key)
    if enc is None:
        enc = encode_uncached(inst)  # raises for bad operands: nothing is cached then
        if len(_ENCODED) >= ENCODE_CACHE_LIMIT:
            _ENCODED.clear()  # crude but bounded; kernels refill the few hundred forms they use at once
        _ENCODED[key] = enc
    return enc


# Encodings of position-independent instructions by op and operands. Kernels are made of a few hundred recurring
# forms (`add r15d,0x1`, `vmovss xmm2,DWORD PTR [rsi+rbp*4]`, the prologue's pushes): a lookup (hashing the op and
# the immutable operands) costs a fraction of choosing the form and building prefixes, ModRM/SIB and the listing text
# again. Encoded is immutable, so a shared entry can be handed out any number of times. A few thousand entries (a
# few MB at most) hold every form of many kernels; when full the cache starts over.
ENCODE_CACHE_LIMIT = 16384
_ENCODED: dict[tuple[X86Op, tuple[Operand, ...]], Encoded] = {}
_BRANCH_OPS = JCC_OPS | {X86Op.JMP, X86Op.CALL}


def encode_uncached(inst: Inst) -> Encoded:
    """Encode one non-branch instruction from scratch (what `encode` caches). Raises EncodingError for operands no
    form of the op accepts, and for jumps/calls, which need `encode`'s address and labels."""
    op = inst.op
    if op in _EVEX_ONLY or any((type(o) is Reg and o.evex_only) or (type(o) is Mem and o.broadcast)
                               or type(o) is Opmask for o in inst.operands):  # fmt: skip
        return _encode_evex(inst)
    if op in VEX_TABLE:
        return _encode_vex(inst, VEX_TABLE[op])
    if op in SETCC_OPS:
        return _encode_gpr(inst, "setcc", 0)
    if op in CMOVCC_OPS:
        return _encode_gpr(inst, "cmovcc", 0)
    if op in GPR_TABLE:
        kind, param, _ref = GPR_TABLE[op]
        return _encode_gpr(inst, kind, param)
    if op in _BRANCH_OPS:
        raise EncodingError(f"{inst!r}: a jump or call is encoded at its address: use encode(inst, pc, labels)")
    raise EncodingError(f"{op.name}: no encoding for this op in GPR_TABLE/VEX_TABLE")


def _encode_branch(inst: Inst, pc: int, labels: dict[str, int] | None, long_jump: bool) -> Encoded:
    """Jcc/JMP/CALL to a label at address `pc` (rel8 or rel32), or a call to an external symbol (PLT32)."""
    op = inst.op
    if len(inst.operands) != 1 or not isinstance(inst.operands[0], (Label, Sym)):
        raise EncodingError(f"{inst!r}: expected one Label (or Sym for call) operand")
    target = inst.operands[0]
    if isinstance(target, Sym):
        if op is not X86Op.CALL:
            raise EncodingError(f"{inst!r}: only call may target an external symbol")
        return Encoded(
            b"\xe8\0\0\0\0", f"{'call':<6} {pc + 5:#x}", f"<{target.name}>", Relocation(1, "PLT32", target.name, -4)
        )
    if labels is None or target.name not in labels:
        raise EncodingError(f"{inst!r}: label {target.name!r} is not defined")
    dest = labels[target.name]
    long_jump = long_jump or op is X86Op.CALL
    if op is X86Op.CALL:
        opc = b"\xe8"
    elif op is X86Op.JMP:
        opc = b"\xe9" if long_jump else b"\xeb"
    else:
        opc = bytes([0x0F, 0x80 + COND_CODE[op]]) if long_jump else bytes([0x70 + COND_CODE[op]])
    size = len(opc) + (4 if long_jump else 1)
    rel = dest - (pc + size)
    if not fits_signed(rel, 32 if long_jump else 8):
        raise EncodingError(f"{inst!r}: jump distance {rel} does not fit rel{32 if long_jump else 8}")
    raw = opc + rel.to_bytes(4 if long_jump else 1, "little", signed=True)
    return Encoded(raw, f"{op.value:<6} {dest:#x}", f"<{target.name}>")


# ---------------------------------------------------------------------------------------------------------------
# Encoding tables (Intel 64 and IA-32 Architectures Software Developer's Manual, volume 2 "Instruction Set
# Reference"; opcodes as printed in each instruction's opcode table).

FIXED_BYTES: dict[X86Op, str] = {
    X86Op.RET: "c3",  # vol. 2B RET: C3
    X86Op.CDQ: "99",  # vol. 2A CWD/CDQ/CQO: 99
    X86Op.CQO: "48 99",  # vol. 2A CWD/CDQ/CQO: REX.W + 99
    X86Op.NOP: "90",  # vol. 2B NOP: NP 90
}

# op -> (encoder kind, parameter: ModRM.reg extension or opcode base, SDM reference)
GPR_TABLE: dict[X86Op, tuple[str, int, str]] = {
    X86Op.ADD: ("alu", 0, "vol. 2A ADD: 00/01 /r, 02/03 /r, 80/81 /0 ib/iz, 83 /0 ib"),
    X86Op.OR: ("alu", 1, "vol. 2B OR: 08/09 /r, 0A/0B /r, 80/81 /1, 83 /1 ib"),
    X86Op.AND: ("alu", 4, "vol. 2A AND: 20/21 /r, 22/23 /r, 80/81 /4, 83 /4 ib"),
    X86Op.SUB: ("alu", 5, "vol. 2B SUB: 28/29 /r, 2A/2B /r, 80/81 /5, 83 /5 ib"),
    X86Op.XOR: ("alu", 6, "vol. 2D XOR: 30/31 /r, 32/33 /r, 80/81 /6, 83 /6 ib"),
    X86Op.CMP: ("alu", 7, "vol. 2A CMP: 38/39 /r, 3A/3B /r, 80/81 /7, 83 /7 ib"),
    X86Op.MOV: ("mov", 0, "vol. 2B MOV: 88/89 /r, 8A/8B /r, C6/C7 /0 ib/iz"),
    X86Op.TEST: ("test", 0, "vol. 2B TEST: 84/85 /r, F6/F7 /0 ib/iz"),
    X86Op.NOT: ("unary", 2, "vol. 2B NOT: F6/F7 /2"),
    X86Op.NEG: ("unary", 3, "vol. 2B NEG: F6/F7 /3"),
    X86Op.MUL: ("unary", 4, "vol. 2B MUL: F6/F7 /4"),
    X86Op.DIV: ("unary", 6, "vol. 2A DIV: F6/F7 /6"),
    X86Op.IDIV: ("unary", 7, "vol. 2A IDIV: F6/F7 /7"),
    X86Op.INC: ("unary", 0, "vol. 2A INC: FE/FF /0"),
    X86Op.DEC: ("unary", 1, "vol. 2A DEC: FE/FF /1"),
    X86Op.IMUL: ("imul", 0, "vol. 2A IMUL: F6/F7 /5, 0F AF /r, 6B /r ib, 69 /r iz"),
    X86Op.ROL: ("shift", 0, "vol. 2B RCL/RCR/ROL/ROR: C0/C1 /0 ib, D2/D3 /0"),
    X86Op.ROR: ("shift", 1, "vol. 2B RCL/RCR/ROL/ROR: C0/C1 /1 ib, D2/D3 /1"),
    X86Op.SHL: ("shift", 4, "vol. 2B SAL/SAR/SHL/SHR: C0/C1 /4 ib, D2/D3 /4"),
    X86Op.SHR: ("shift", 5, "vol. 2B SAL/SAR/SHL/SHR: C0/C1 /5 ib, D2/D3 /5"),
    X86Op.SAR: ("shift", 7, "vol. 2B SAL/SAR/SHL/SHR: C0/C1 /7 ib, D2/D3 /7"),
    X86Op.MOVZX: ("movzx", 0xB6, "vol. 2B MOVZX: 0F B6 /r, 0F B7 /r"),
    X86Op.MOVSX: ("movsx", 0xBE, "vol. 2B MOVSX: 0F BE /r, 0F BF /r"),
    X86Op.MOVSXD: ("movsxd", 0x63, "vol. 2B MOVSXD: REX.W + 63 /r"),
    X86Op.LEA: ("lea", 0x8D, "vol. 2A LEA: 8D /r"),
    X86Op.MOVABS: ("movabs", 0xB8, "vol. 2B MOV: REX.W + B8+rd io"),
    X86Op.PUSH: ("push", 0x50, "vol. 2B PUSH: 50+rd"),
    X86Op.POP: ("pop", 0x58, "vol. 2B POP: 58+rd"),
    **{op: ("fixed", 0, "see FIXED_BYTES") for op in FIXED_BYTES},
}
# SETcc (vol. 2B: 0F 90+cc /0), CMOVcc (vol. 2A: 0F 40+cc /r), Jcc (vol. 2A: 70+cc cb, 0F 80+cc cd),
# JMP (vol. 2A: EB cb, E9 cd), CALL (vol. 2A: E8 cd) are encoded from COND_CODE in `encode`.

_PP = {"66": 1, "F3": 2, "F2": 3}
_MAP = {"0F": 1, "0F38": 2, "0F3A": 3}


def _vex_form(openc: str, operands: str, opcode: str, mem: int | str) -> VexForm:
    """Build a VexForm from the opcode column as the SDM prints it, e.g. "VEX.LIG.F3.0F.WIG 51 /r".

    Fields: 128/256/LIG fix VEX.L (128/256 means the operands decide), NP/66/F3/F2 give VEX.pp, 0F/0F38/0F3A the map,
    W0/W1/WIG VEX.W (W0/W1: the general-purpose operand's width decides), "/digit" a ModRM.reg extension.
    """
    vex, byte, *rest = opcode.split()
    pp, mmmmm, vl = 0, 1, None
    w_opt: int | None = 0
    for field in vex.split(".")[1:]:
        if field in ("128", "LIG"):
            vl = 0
        elif field == "256":
            vl = 1
        elif field in _PP:
            pp = _PP[field]
        elif field in _MAP:
            mmmmm = _MAP[field]
        elif field == "W1":
            w_opt = 1
        elif field == "W0/W1":
            w_opt = None
        else:
            assert field in ("128/256", "NP", "W0", "WIG"), field
    ext = next((int(r[1]) for r in rest if r[:1] == "/" and r[1:].isdigit()), 0)
    return VexForm(openc, tuple(operands.split(",")) if operands else (), pp, mmmmm, int(byte, 16), w_opt, vl, mem, ext,
                   ref=opcode)  # fmt: skip


def _vex_table(rows: list[tuple[X86Op, str, str, str, int | str]]) -> dict[X86Op, tuple[VexForm, ...]]:
    table: dict[X86Op, tuple[VexForm, ...]] = {}
    for op, openc, operands, opcode, mem in rows:
        table[op] = table.get(op, ()) + (_vex_form(openc, operands, opcode, mem),)
    return table


# Operand kinds: x vector register (xmm or ymm, all alike), X xmm, Y ymm, m memory, xm/Xm register or memory, g general
# register, gm general register or memory, i imm8. Memory width: "v" the vector width, "g" the general operand's width.
# Forms are tried in order; the first whose operand kinds match is used.
# fmt: off
VEX_TABLE: dict[X86Op, tuple[VexForm, ...]] = _vex_table([
    # op                 Op/En   operands     opcode (Intel SDM vol. 2)             memory width
    (X86Op.VADDPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 58 /r",        "v"),
    (X86Op.VADDPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 58 /r",        "v"),
    (X86Op.VADDSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 58 /r",            4),
    (X86Op.VADDSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 58 /r",            8),
    (X86Op.VSUBPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 5C /r",        "v"),
    (X86Op.VSUBPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 5C /r",        "v"),
    (X86Op.VSUBSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 5C /r",            4),
    (X86Op.VSUBSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 5C /r",            8),
    (X86Op.VMULPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 59 /r",        "v"),
    (X86Op.VMULPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 59 /r",        "v"),
    (X86Op.VMULSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 59 /r",            4),
    (X86Op.VMULSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 59 /r",            8),
    (X86Op.VDIVPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 5E /r",        "v"),
    (X86Op.VDIVPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 5E /r",        "v"),
    (X86Op.VDIVSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 5E /r",            4),
    (X86Op.VDIVSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 5E /r",            8),
    (X86Op.VMAXPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 5F /r",        "v"),
    (X86Op.VMAXPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 5F /r",        "v"),
    (X86Op.VMAXSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 5F /r",            4),
    (X86Op.VMAXSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 5F /r",            8),
    (X86Op.VMINPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 5D /r",        "v"),
    (X86Op.VMINPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 5D /r",        "v"),
    (X86Op.VMINSS,       "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 5D /r",            4),
    (X86Op.VMINSD,       "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 5D /r",            8),
    (X86Op.VSQRTPS,      "RM",   "x,xm",      "VEX.128/256.NP.0F.WIG 51 /r",        "v"),
    (X86Op.VSQRTPD,      "RM",   "x,xm",      "VEX.128/256.66.0F.WIG 51 /r",        "v"),
    (X86Op.VSQRTSS,      "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 51 /r",            4),
    (X86Op.VSQRTSD,      "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 51 /r",            8),
    (X86Op.VANDPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 54 /r",        "v"),
    (X86Op.VANDPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 54 /r",        "v"),
    (X86Op.VANDNPS,      "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 55 /r",        "v"),
    (X86Op.VANDNPD,      "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 55 /r",        "v"),
    (X86Op.VORPS,        "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 56 /r",        "v"),
    (X86Op.VORPD,        "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 56 /r",        "v"),
    (X86Op.VXORPS,       "RVM",  "x,x,xm",    "VEX.128/256.NP.0F.WIG 57 /r",        "v"),
    (X86Op.VXORPD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 57 /r",        "v"),
    (X86Op.VPADDD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG FE /r",        "v"),
    (X86Op.VPSUBD,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG FA /r",        "v"),
    (X86Op.VPMULLD,      "RVM",  "x,x,xm",    "VEX.128/256.66.0F38.WIG 40 /r",      "v"),
    (X86Op.VPAND,        "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG DB /r",        "v"),
    (X86Op.VPANDN,       "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG DF /r",        "v"),
    (X86Op.VPOR,         "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG EB /r",        "v"),
    (X86Op.VPXOR,        "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG EF /r",        "v"),
    (X86Op.VPCMPEQD,     "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 76 /r",        "v"),
    (X86Op.VPCMPGTD,     "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 66 /r",        "v"),
    (X86Op.VPSLLD,       "VMI",  "x,x,i",     "VEX.128/256.66.0F.WIG 72 /6 ib",     "v"),
    (X86Op.VPSRLD,       "VMI",  "x,x,i",     "VEX.128/256.66.0F.WIG 72 /2 ib",     "v"),
    (X86Op.VPSRAD,       "VMI",  "x,x,i",     "VEX.128/256.66.0F.WIG 72 /4 ib",     "v"),
    (X86Op.VFMADD231PS,  "RVM",  "x,x,xm",    "VEX.128/256.66.0F38.W0 B8 /r",       "v"),
    (X86Op.VFMADD231PD,  "RVM",  "x,x,xm",    "VEX.128/256.66.0F38.W1 B8 /r",       "v"),
    (X86Op.VFMADD231SS,  "RVM",  "X,X,Xm",    "VEX.LIG.66.0F38.W0 B9 /r",           4),
    (X86Op.VFMADD231SD,  "RVM",  "X,X,Xm",    "VEX.LIG.66.0F38.W1 B9 /r",           8),
    (X86Op.VMOVUPS,      "RM",   "x,xm",      "VEX.128/256.NP.0F.WIG 10 /r",        "v"),
    (X86Op.VMOVUPS,      "MR",   "m,x",       "VEX.128/256.NP.0F.WIG 11 /r",        "v"),
    (X86Op.VMOVUPD,      "RM",   "x,xm",      "VEX.128/256.66.0F.WIG 10 /r",        "v"),
    (X86Op.VMOVUPD,      "MR",   "m,x",       "VEX.128/256.66.0F.WIG 11 /r",        "v"),
    (X86Op.VMOVAPS,      "RM",   "x,xm",      "VEX.128/256.NP.0F.WIG 28 /r",        "v"),
    (X86Op.VMOVAPS,      "MR",   "m,x",       "VEX.128/256.NP.0F.WIG 29 /r",        "v"),
    (X86Op.VMOVAPD,      "RM",   "x,xm",      "VEX.128/256.66.0F.WIG 28 /r",        "v"),
    (X86Op.VMOVAPD,      "MR",   "m,x",       "VEX.128/256.66.0F.WIG 29 /r",        "v"),
    (X86Op.VMOVDQU,      "RM",   "x,xm",      "VEX.128/256.F3.0F.WIG 6F /r",        "v"),
    (X86Op.VMOVDQU,      "MR",   "m,x",       "VEX.128/256.F3.0F.WIG 7F /r",        "v"),
    (X86Op.VMOVSS,       "RM",   "X,m",       "VEX.LIG.F3.0F.WIG 10 /r",            4),
    (X86Op.VMOVSS,       "MR",   "m,X",       "VEX.LIG.F3.0F.WIG 11 /r",            4),
    (X86Op.VMOVSS,       "RVM",  "X,X,X",     "VEX.LIG.F3.0F.WIG 10 /r",            4),
    (X86Op.VMOVSD,       "RM",   "X,m",       "VEX.LIG.F2.0F.WIG 10 /r",            8),
    (X86Op.VMOVSD,       "MR",   "m,X",       "VEX.LIG.F2.0F.WIG 11 /r",            8),
    (X86Op.VMOVSD,       "RVM",  "X,X,X",     "VEX.LIG.F2.0F.WIG 10 /r",            8),
    (X86Op.VMOVD,        "RM",   "X,gm",      "VEX.128.66.0F.W0 6E /r",             4),
    (X86Op.VMOVD,        "MR",   "gm,X",      "VEX.128.66.0F.W0 7E /r",             4),
    (X86Op.VMOVQ,        "RM",   "X,gm",      "VEX.128.66.0F.W1 6E /r",             8),
    (X86Op.VMOVQ,        "MR",   "gm,X",      "VEX.128.66.0F.W1 7E /r",             8),
    (X86Op.VCMPPS,       "RVMI", "x,x,xm,i",  "VEX.128/256.NP.0F.WIG C2 /r ib",     "v"),
    (X86Op.VCMPPD,       "RVMI", "x,x,xm,i",  "VEX.128/256.66.0F.WIG C2 /r ib",     "v"),
    (X86Op.VCMPSS,       "RVMI", "X,X,Xm,i",  "VEX.LIG.F3.0F.WIG C2 /r ib",         4),
    (X86Op.VCMPSD,       "RVMI", "X,X,Xm,i",  "VEX.LIG.F2.0F.WIG C2 /r ib",         8),
    (X86Op.VBLENDVPS,    "RVMR", "x,x,xm,x",  "VEX.128/256.66.0F3A.W0 4A /r /is4",  "v"),
    (X86Op.VBLENDVPD,    "RVMR", "x,x,xm,x",  "VEX.128/256.66.0F3A.W0 4B /r /is4",  "v"),
    (X86Op.VUCOMISS,     "RM",   "X,Xm",      "VEX.LIG.NP.0F.WIG 2E /r",            4),
    (X86Op.VUCOMISD,     "RM",   "X,Xm",      "VEX.LIG.66.0F.WIG 2E /r",            8),
    (X86Op.VCVTSI2SS,    "RVM",  "X,X,gm",    "VEX.LIG.F3.0F.W0/W1 2A /r",          "g"),
    (X86Op.VCVTSI2SD,    "RVM",  "X,X,gm",    "VEX.LIG.F2.0F.W0/W1 2A /r",          "g"),
    (X86Op.VCVTTSS2SI,   "RM",   "g,Xm",      "VEX.LIG.F3.0F.W0/W1 2C /r",          4),
    (X86Op.VCVTTSD2SI,   "RM",   "g,Xm",      "VEX.LIG.F2.0F.W0/W1 2C /r",          8),
    (X86Op.VCVTSS2SD,    "RVM",  "X,X,Xm",    "VEX.LIG.F3.0F.WIG 5A /r",            4),
    (X86Op.VCVTSD2SS,    "RVM",  "X,X,Xm",    "VEX.LIG.F2.0F.WIG 5A /r",            8),
    (X86Op.VCVTDQ2PS,    "RM",   "x,xm",      "VEX.128/256.NP.0F.WIG 5B /r",        "v"),
    (X86Op.VCVTTPS2DQ,   "RM",   "x,xm",      "VEX.128/256.F3.0F.WIG 5B /r",        "v"),
    (X86Op.VBROADCASTSS, "RM",   "x,Xm",      "VEX.128/256.66.0F38.W0 18 /r",       4),
    (X86Op.VPBROADCASTD, "RM",   "x,Xm",      "VEX.128/256.66.0F38.W0 58 /r",       4),
    (X86Op.VINSERTPS,    "RVMI", "X,X,Xm,i",  "VEX.128.66.0F3A.WIG 21 /r ib",       4),
    (X86Op.VPERMILPS,    "RMI",  "x,xm,i",    "VEX.128/256.66.0F3A.W0 04 /r ib",    "v"),
    (X86Op.VMOVMSKPS,    "RM",   "g,x",       "VEX.128/256.NP.0F.WIG 50 /r",        "v"),
    (X86Op.VPACKSSDW,    "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 6B /r",        "v"),
    (X86Op.VPACKSSWB,    "RVM",  "x,x,xm",    "VEX.128/256.66.0F.WIG 63 /r",        "v"),
    (X86Op.VPABSB,       "RM",   "x,xm",      "VEX.128/256.66.0F38.WIG 1C /r",      "v"),
    (X86Op.VPMOVZXBD,    "RM",   "x,Xm",      "VEX.128/256.66.0F38.WIG 31 /r",      "v/4"),
    (X86Op.VEXTRACTPS,   "MRI",  "gm,X,i",    "VEX.128.66.0F3A.WIG 17 /r ib",       4),
    (X86Op.VPINSRD,      "RVMI", "X,X,gm,i",  "VEX.128.66.0F3A.W0 22 /r ib",        4),
    (X86Op.VPEXTRD,      "MRI",  "gm,X,i",    "VEX.128.66.0F3A.W0 16 /r ib",        4),
    (X86Op.VINSERTF128,  "RVMI", "Y,Y,Xm,i",  "VEX.256.66.0F3A.W0 18 /r ib",        16),
    (X86Op.VEXTRACTF128, "MRI",  "Xm,Y,i",    "VEX.256.66.0F3A.W0 19 /r ib",        16),
    (X86Op.VROUNDPS,     "RMI",  "x,xm,i",    "VEX.128/256.66.0F3A.WIG 08 /r ib",   "v"),
    (X86Op.VROUNDPD,     "RMI",  "x,xm,i",    "VEX.128/256.66.0F3A.WIG 09 /r ib",   "v"),
    (X86Op.VROUNDSS,     "RVMI", "X,X,Xm,i",  "VEX.LIG.66.0F3A.WIG 0A /r ib",       4),
    (X86Op.VROUNDSD,     "RVMI", "X,X,Xm,i",  "VEX.LIG.66.0F3A.WIG 0B /r ib",       8),
    (X86Op.VZEROUPPER,   "ZO",   "",          "VEX.128.0F.WIG 77",                  "v"),
])
# fmt: on


# ---------------------------------------------------------------------------------------------------------------
# AVX-512 (EVEX, Intel SDM vol. 2A, section 2.7): float32 zmm forms, the 32 vector registers, embedded broadcast and
# opmask write masking (an `Opmask` last operand: `{k1}`, `{k1}{z}`). Used for any instruction naming zmm,
# xmm16..31/ymm16..31, an opmask register or operand, or a broadcast memory operand. AVX-512F only (no DQ/BW/VL
# extension is needed by any form here, apart from the xmm/ymm widths of the 128/256-bit forms, which are AVX512VL
# and are used only by register numbers 16..31 of the narrow forms).


@dataclass(frozen=True)
class EvexForm:
    """One EVEX form: operand encoding (openc, below), prefix fields (pp: 0 none, 1 66, 2 F3; mm: 1 0F, 2 0F38,
    3 0F3A), opcode, W, whether the r/m memory operand may be a broadcast, the width in bytes of a part operand
    (insert/extract/down-convert: 16 or 32; 4 for vbroadcastss' scalar source), and a ModRM.reg extension (VMI).

    Operand encodings (Intel order; an Imm and then an Opmask may follow):
      RVM: vec dst (reg), vec src1 (vvvv), vec/mem src2 (r/m)     RM: vec dst, vec/mem src     MR: mem dst, vec src
      KVM: k dst (reg), vec src1 (vvvv), vec/mem src2             VMI: vec dst (vvvv), vec/mem src (r/m), imm8
      PRT: part reg/mem dst (r/m), vec src (reg) - extract, down-convert
      INS: vec dst, vec src1 (vvvv), part reg/mem src2 (r/m)      BC: vec dst, xmm/m32 src (vbroadcastss)
    """

    openc: str
    pp: int
    mm: int
    opcode: int
    broadcast: bool = True
    w: int = 0
    part: int = 0
    ext: int = 0


_E = EvexForm
# op -> its forms, tried in order: the first whose operand kinds fit (a store names memory first)
EVEX_TABLE: dict[X86Op, tuple[EvexForm, ...]] = {
    X86Op.VADDPS: (_E("RVM", 0, 1, 0x58),),  # EVEX.512.0F.W0 58 /r
    X86Op.VSUBPS: (_E("RVM", 0, 1, 0x5C),),
    X86Op.VMULPS: (_E("RVM", 0, 1, 0x59),),
    X86Op.VDIVPS: (_E("RVM", 0, 1, 0x5E),),
    X86Op.VMAXPS: (_E("RVM", 0, 1, 0x5F),),
    X86Op.VMINPS: (_E("RVM", 0, 1, 0x5D),),
    X86Op.VSQRTPS: (_E("RM", 0, 1, 0x51),),
    X86Op.VFMADD231PS: (_E("RVM", 1, 2, 0xB8),),  # EVEX.512.66.0F38.W0 B8 /r
    X86Op.VBLENDMPS: (_E("RVM", 1, 2, 0x65),),  # EVEX.512.66.0F38.W0 65 /r
    X86Op.VPXORD: (_E("RVM", 1, 1, 0xEF),),  # EVEX.512.66.0F.W0 EF /r
    X86Op.VPANDD: (_E("RVM", 1, 1, 0xDB),),  # EVEX.512.66.0F.W0 DB /r
    X86Op.VPANDND: (_E("RVM", 1, 1, 0xDF),),  # EVEX.512.66.0F.W0 DF /r
    X86Op.VPORD: (_E("RVM", 1, 1, 0xEB),),  # EVEX.512.66.0F.W0 EB /r
    X86Op.VCMPPS: (_E("KVM", 0, 1, 0xC2),),  # EVEX.512.0F.W0 C2 /r ib: k1 {k2}, zmm, zmm/m512/m32bcst, imm8
    X86Op.VPTESTMD: (_E("KVM", 1, 2, 0x27),),  # EVEX.512.66.0F38.W0 27 /r
    X86Op.VPCMPD: (_E("KVM", 1, 3, 0x1F),),  # EVEX.512.66.0F3A.W0 1F /r ib
    X86Op.VRNDSCALEPS: (_E("RM", 1, 3, 0x08),),  # EVEX.512.66.0F3A.W0 08 /r ib
    X86Op.VPSRLD: (_E("VMI", 1, 1, 0x72, ext=2),),  # EVEX.512.66.0F.W0 72 /2 ib
    X86Op.VPSLLD: (_E("VMI", 1, 1, 0x72, ext=6),),  # EVEX.512.66.0F.W0 72 /6 ib
    X86Op.VMOVUPS: (_E("RM", 0, 1, 0x10, False), _E("MR", 0, 1, 0x11, False)),
    X86Op.VMOVAPS: (_E("RM", 0, 1, 0x28, False), _E("MR", 0, 1, 0x29, False)),
    X86Op.VBROADCASTSS: (_E("BC", 1, 2, 0x18, False, part=4),),  # EVEX.512.66.0F38.W0 18 /r: zmm, xmm/m32
    X86Op.VEXTRACTF64X4: (_E("PRT", 1, 3, 0x1B, False, 1, 32),),  # EVEX.512.66.0F3A.W1 1B /r ib
    X86Op.VINSERTF64X4: (_E("INS", 1, 3, 0x1A, False, 1, 32),),  # EVEX.512.66.0F3A.W1 1A /r ib
    X86Op.VEXTRACTF32X4: (_E("PRT", 1, 3, 0x19, False, 0, 16),),  # EVEX.512.66.0F3A.W0 19 /r ib
}  # fmt: skip

_CMP_OPS = frozenset({X86Op.VCMPPS})
INT_CMP_PREDICATES = ("eq", "lt", "le", "", "neq", "nlt", "nle", "")  # vpcmpd imm8 (signed dword compare)
_EVEX_ONLY = frozenset(EVEX_TABLE) - frozenset(VEX_TABLE) | {X86Op.KMOVW}  # AVX-512 instructions at any width
# (reg field, vvvv, r/m, the operand whose width is the vector length) by operand encoding; None: not present
_EVEX_SLOTS: dict[str, tuple[int | None, int | None, int, int]] = {
    "RVM": (0, 1, 2, 0), "KVM": (0, 1, 2, 1), "RM": (0, None, 1, 0), "MR": (1, None, 0, 1), "VMI": (None, 0, 1, 0),
    "PRT": (1, None, 0, 1), "INS": (0, 1, 2, 0), "BC": (0, None, 1, 0),
}  # fmt: skip


def _evex_vec(inst: Inst, o: Operand, what: str) -> Reg:
    if not isinstance(o, Reg) or o.kind != "vec":
        raise EncodingError(f"{inst!r}: the {what} operand of an EVEX form must be a vector register, got {o!r}")
    return o


def _evex_form(inst: Inst, ops: tuple[Operand, ...], forms: tuple[EvexForm, ...]) -> EvexForm:
    store = bool(ops) and isinstance(ops[0], Mem)
    for f in forms:
        n = 3 if f.openc in ("RVM", "KVM", "INS") else 2
        if (f.openc == "MR") == store or f.openc == "PRT":
            if len(ops) == n:
                return f
    raise EncodingError(f"{inst!r}: expected {' or '.join(f.openc for f in forms)} operands for the EVEX form")


def _encode_evex(inst: Inst) -> Encoded:
    if inst.op is X86Op.KMOVW:
        return _encode_kmov(inst)
    forms = EVEX_TABLE.get(inst.op)
    if forms is None:
        known = ", ".join(o.name for o in EVEX_TABLE)
        raise EncodingError(f"{inst!r}: zmm, xmm16-31/ymm16-31, opmasks and broadcast memory need an EVEX (AVX-512) "
                            f"form; {inst.op.name} has none (EVEX forms: {known})")  # fmt: skip
    ops = inst.operands
    mask = ops[-1] if ops and isinstance(ops[-1], Opmask) else None
    if mask is not None:
        ops = ops[:-1]
    imm_op = ops[-1] if ops and isinstance(ops[-1], Imm) else None
    if imm_op is not None:
        ops = ops[:-1]
    f = _evex_form(inst, ops, forms)
    wants_imm = f.openc in ("VMI",) or inst.op in (X86Op.VCMPPS, X86Op.VPCMPD, X86Op.VRNDSCALEPS, X86Op.VEXTRACTF64X4,
                                                   X86Op.VINSERTF64X4, X86Op.VEXTRACTF32X4)  # fmt: skip
    if wants_imm != (imm_op is not None):
        raise EncodingError(f"{inst!r}: {inst.op.name} {'takes' if wants_imm else 'takes no'} imm8 operand")
    reg_i, vvvv_i, rm_i, len_i = _EVEX_SLOTS[f.openc]
    vec = _evex_vec(inst, ops[len_i], "vector")
    width = vec.size
    reg_o: Reg | None = None
    if reg_i is not None:
        o = ops[reg_i]
        if f.openc == "KVM" and not (isinstance(o, Reg) and o.kind == "k"):
            raise EncodingError(f"{inst!r}: the destination of {inst.op.name} must be an opmask register k0..k7")
        reg_o = o if f.openc == "KVM" else _evex_vec(inst, o, "register")  # type: ignore[assignment]
    vvvv_o = _evex_vec(inst, ops[vvvv_i], "first source") if vvvv_i is not None else None
    rm = ops[rm_i]
    if vvvv_o is not None and vvvv_o.size != width:
        raise EncodingError(f"{inst!r}: vector operands mix widths; use one of xmm/ymm/zmm throughout")
    part = f.part
    if f.openc in ("PRT", "INS"):
        if width != 64 or isinstance(rm, Reg) and (rm.kind != "vec" or rm.size != part):
            raise EncodingError(f"{inst!r}: {inst.op.name} moves a {8 * part}-bit part of a zmm register")
        if reg_o is not None and f.openc == "INS" and reg_o.size != 64:
            raise EncodingError(f"{inst!r}: vector operands mix widths; the destination must be a zmm register")
    elif f.openc == "BC" and isinstance(rm, Reg):  # vbroadcastss zmm, xmm: the source is an xmm at any width
        if rm.kind != "vec" or rm.size != 16:
            raise EncodingError(f"{inst!r}: the broadcast source must be an xmm register or a 32-bit memory operand")
    elif isinstance(rm, Reg) and (rm.kind != "vec" or rm.size != width) or reg_o is not None and (
            f.openc != "KVM" and reg_o.size != width):  # fmt: skip
        raise EncodingError(f"{inst!r}: vector operands mix widths; use one of xmm/ymm/zmm throughout")
    if not isinstance(rm, (Reg, Mem)):
        raise EncodingError(f"{inst!r}: expected a vector register or memory operand, got {rm!r}")
    _require(inst, True, "")
    bcast = isinstance(rm, Mem) and rm.broadcast
    if bcast and not f.broadcast:
        raise EncodingError(f"{inst!r}: {inst.op.name} has no embedded-broadcast form")
    if mask is not None and mask.zero and isinstance(ops[0], Mem):
        raise EncodingError(f"{inst!r}: a store takes merge masking only ({{k}}, not {{z}})")
    if mask is not None and f.openc == "KVM" and mask.zero:
        raise EncodingError(f"{inst!r}: a compare into an opmask register takes no {{z}}")
    ll = {16: 0, 32: 1, 64: 2}[width]
    mem_size = 4 if bcast else part or width
    rnum = f.ext if reg_o is None else reg_o.num
    x, b, modrm, rip_at = _evex_modrm(rnum, rm, mem_size, inst)
    r, r_hi = (rnum >> 3) & 1, rnum >> 4
    v = vvvv_o.num if vvvv_o is not None else 0
    aaa = mask.k if mask is not None else 0
    z = int(mask is not None and mask.zero)
    p0 = ((r ^ 1) << 7) | ((x ^ 1) << 6) | ((b ^ 1) << 5) | ((r_hi ^ 1) << 4) | f.mm
    p1 = (f.w << 7) | ((~v & 15) << 3) | 0b100 | f.pp
    p2 = (z << 7) | (ll << 5) | (bcast << 4) | (((v >> 4) ^ 1) << 3) | aaa
    head = bytes([0x62, p0, p1, p2, f.opcode])
    imm = b""
    mnemonic = inst.op.value
    if imm_op is not None:
        if not -128 <= imm_op.value < 256:
            raise EncodingError(f"{inst!r}: imm8 {imm_op.value} out of range [-128, 256)")
        imm = bytes([imm_op.value & 0xFF])
        if inst.op in _CMP_OPS:
            if not 0 <= imm_op.value < 32:
                raise EncodingError(f"{inst!r}: compare predicate must be in [0, 32), got {imm_op.value}")
            mnemonic = "vcmp" + CMP_PREDICATES[imm_op.value] + mnemonic[4:]
        elif inst.op is X86Op.VPCMPD:
            if not 0 <= imm_op.value < 8:
                raise EncodingError(f"{inst!r}: integer compare predicate must be in [0, 8), got {imm_op.value}")
            if INT_CMP_PREDICATES[imm_op.value]:  # objdump folds all but 'false'/'true' into the mnemonic
                mnemonic = "vpcmp" + INT_CMP_PREDICATES[imm_op.value] + "d"
    # objdump (binutils 2.40) spells a broadcast element `DWORD BCST [..]` and the mask after the destination
    text_ops = []
    for o in ops:
        assert isinstance(o, (Reg, Mem))  # (checked above: the forms take registers and memory only)
        text_ops.append("DWORD BCST " + format_mem(o, None) if isinstance(o, Mem) and bcast else
                        format_operand(o, mem_size, 8))  # fmt: skip
    if mask is not None:
        text_ops[0] += f"{{k{mask.k}}}" + ("{z}" if mask.zero else "")
    if imm_op is not None and not (inst.op in _CMP_OPS or (inst.op is X86Op.VPCMPD and mnemonic != "vpcmpd")):
        text_ops.append(format_operand(imm_op, None, 8))
    return _finish(inst, head, modrm, rip_at, imm, format_instruction(mnemonic, text_ops))


def _encode_kmov(inst: Inst) -> Encoded:
    """KMOVW k, r32 (VEX.L0.0F.W0 92 /r) and KMOVW r32, k (VEX.L0.0F.W0 93 /r): a 16-lane mask to and from the low 16
    bits of a general register."""
    ops = inst.operands
    _require(inst, len(ops) == 2 and all(isinstance(o, Reg) for o in ops), "(k, r32) or (r32, k)")
    dst, src = _reg(ops[0]), _reg(ops[1])
    if dst.kind == "k" and src.kind == "gpr" and src.size == 4:
        return _vex(inst, 0, 1, 0, 0, 0x92, dst.num, 0, src, b"", _text(inst, None, 8))
    if dst.kind == "gpr" and dst.size == 4 and src.kind == "k":
        return _vex(inst, 0, 1, 0, 0, 0x93, dst.num, 0, src, b"", _text(inst, None, 8))
    raise EncodingError(f"{inst!r}: kmovw moves between an opmask register and a 32-bit general register")


def _evex_modrm(reg_num: int, rm: Reg | Mem, n: int, inst: Inst) -> tuple[int, int, bytes, int | None]:
    """(X, B, ModRM+SIB+disp, RIP disp offset) as `_modrm`, with EVEX's compressed displacement: a disp8 counts
    units of `n` bytes, so a displacement that is not a multiple of n (or too far) takes the disp32 form. A register
    r/m numbered 16..31 puts its bit 4 in X."""
    if isinstance(rm, Reg):
        return rm.num >> 4, (rm.num >> 3) & 1, bytes([0xC0 | (reg_num & 7) << 3 | (rm.num & 7)]), None
    if rm.symbol is not None or rm.base is None:
        return _modrm(reg_num & 7, rm, inst)  # RIP-relative and index-only addresses always carry a disp32
    base = _addr_reg(rm.base, "base", inst)
    disp = rm.disp
    short = disp % n == 0 and -128 <= disp // n < 128
    if disp == 0 and base.low3 != 5:
        mod, disp_bytes = 0b00, b""
    elif short:
        mod, disp_bytes = 0b01, (disp // n).to_bytes(1, "little", signed=True)
    else:
        mod, disp_bytes = 0b10, disp.to_bytes(4, "little", signed=True)
    reg3 = (reg_num & 7) << 3
    if rm.index is None and base.low3 != 4:
        return 0, base.ext, bytes([(mod << 6) | reg3 | base.low3]) + disp_bytes, None
    x, index_bits = 0, 0b100
    if rm.index is not None:
        index = _addr_reg(rm.index, "index", inst)
        if index.num == 4:
            raise EncodingError(f"{inst!r}: rsp cannot be an index register")
        x, index_bits = index.ext, index.low3
    sib = ((_SCALE_BITS[rm.scale] if rm.index is not None else 0) << 6) | (index_bits << 3) | base.low3
    return x, base.ext, bytes([(mod << 6) | reg3 | 0b100, sib]) + disp_bytes, None
