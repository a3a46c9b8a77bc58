"""The x86-64 machine instructions the backend can emit, as an enum (one member per mnemonic).

Condition-code families (Jcc, SETcc, CMOVcc) get one member per condition so that instruction selection tables can name
them directly; `COND_CODE` maps each to its 4-bit condition field (Intel SDM vol. 2, appendix B.1.4.7, table B-10).
The enum values are the mnemonics objdump prints in Intel syntax.
"""

from __future__ import annotations

from enum import Enum

from speck.codegen.errors import CodegenValueError


class X86Op(Enum):
    """One x86-64 machine instruction mnemonic (value = the Intel-syntax mnemonic)."""

    # members are singletons compared by identity: hash them by identity too (C speed) instead of Enum's
    # Python-level hash of the name - every set/table membership test in selection, allocation and encoding pays it
    __hash__ = object.__hash__

    # integer data movement and arithmetic
    MOV = "mov"
    MOVABS = "movabs"
    MOVZX = "movzx"
    MOVSX = "movsx"
    MOVSXD = "movsxd"
    LEA = "lea"
    ADD = "add"
    SUB = "sub"
    AND = "and"
    OR = "or"
    XOR = "xor"
    CMP = "cmp"
    TEST = "test"
    IMUL = "imul"
    NOT = "not"
    NEG = "neg"
    MUL = "mul"
    DIV = "div"
    IDIV = "idiv"
    INC = "inc"
    DEC = "dec"
    SHL = "shl"
    SHR = "shr"
    SAR = "sar"
    ROL = "rol"
    ROR = "ror"
    CDQ = "cdq"
    CQO = "cqo"
    PUSH = "push"
    POP = "pop"
    # control flow
    JMP = "jmp"
    CALL = "call"
    RET = "ret"
    NOP = "nop"
    # condition-code families
    JO = "jo"
    JNO = "jno"
    JB = "jb"
    JAE = "jae"
    JE = "je"
    JNE = "jne"
    JBE = "jbe"
    JA = "ja"
    JS = "js"
    JNS = "jns"
    JP = "jp"
    JNP = "jnp"
    JL = "jl"
    JGE = "jge"
    JLE = "jle"
    JG = "jg"
    SETO = "seto"
    SETNO = "setno"
    SETB = "setb"
    SETAE = "setae"
    SETE = "sete"
    SETNE = "setne"
    SETBE = "setbe"
    SETA = "seta"
    SETS = "sets"
    SETNS = "setns"
    SETP = "setp"
    SETNP = "setnp"
    SETL = "setl"
    SETGE = "setge"
    SETLE = "setle"
    SETG = "setg"
    CMOVO = "cmovo"
    CMOVNO = "cmovno"
    CMOVB = "cmovb"
    CMOVAE = "cmovae"
    CMOVE = "cmove"
    CMOVNE = "cmovne"
    CMOVBE = "cmovbe"
    CMOVA = "cmova"
    CMOVS = "cmovs"
    CMOVNS = "cmovns"
    CMOVP = "cmovp"
    CMOVNP = "cmovnp"
    CMOVL = "cmovl"
    CMOVGE = "cmovge"
    CMOVLE = "cmovle"
    CMOVG = "cmovg"
    # SSE/AVX/AVX2/FMA3 (always VEX-encoded)
    VMOVSS = "vmovss"
    VMOVSD = "vmovsd"
    VMOVUPS = "vmovups"
    VMOVUPD = "vmovupd"
    VMOVAPS = "vmovaps"
    VMOVAPD = "vmovapd"
    VMOVDQU = "vmovdqu"
    VMOVD = "vmovd"
    VMOVQ = "vmovq"
    VADDSS = "vaddss"
    VADDSD = "vaddsd"
    VADDPS = "vaddps"
    VADDPD = "vaddpd"
    VSUBSS = "vsubss"
    VSUBSD = "vsubsd"
    VSUBPS = "vsubps"
    VSUBPD = "vsubpd"
    VMULSS = "vmulss"
    VMULSD = "vmulsd"
    VMULPS = "vmulps"
    VMULPD = "vmulpd"
    VDIVSS = "vdivss"
    VDIVSD = "vdivsd"
    VDIVPS = "vdivps"
    VDIVPD = "vdivpd"
    VMAXSS = "vmaxss"
    VMAXSD = "vmaxsd"
    VMAXPS = "vmaxps"
    VMAXPD = "vmaxpd"
    VMINSS = "vminss"
    VMINSD = "vminsd"
    VMINPS = "vminps"
    VMINPD = "vminpd"
    VSQRTSS = "vsqrtss"
    VSQRTSD = "vsqrtsd"
    VSQRTPS = "vsqrtps"
    VSQRTPD = "vsqrtpd"
    VANDPS = "vandps"
    VANDPD = "vandpd"
    VANDNPS = "vandnps"
    VANDNPD = "vandnpd"
    VORPS = "vorps"
    VORPD = "vorpd"
    VXORPS = "vxorps"
    VXORPD = "vxorpd"
    VCMPSS = "vcmpss"
    VCMPSD = "vcmpsd"
    VCMPPS = "vcmpps"
    VCMPPD = "vcmppd"
    VBLENDVPS = "vblendvps"
    VBLENDVPD = "vblendvpd"
    VUCOMISS = "vucomiss"
    VUCOMISD = "vucomisd"
    VCVTSI2SS = "vcvtsi2ss"
    VCVTSI2SD = "vcvtsi2sd"
    VCVTTSS2SI = "vcvttss2si"
    VCVTTSD2SI = "vcvttsd2si"
    VCVTSS2SD = "vcvtss2sd"
    VCVTSD2SS = "vcvtsd2ss"
    VCVTDQ2PS = "vcvtdq2ps"
    VCVTTPS2DQ = "vcvttps2dq"
    VBROADCASTSS = "vbroadcastss"
    VPBROADCASTD = "vpbroadcastd"
    VINSERTPS = "vinsertps"
    VPERMILPS = "vpermilps"
    VMOVMSKPS = "vmovmskps"
    VPACKSSDW = "vpackssdw"
    VPACKSSWB = "vpacksswb"
    VPABSB = "vpabsb"
    VPMOVZXBD = "vpmovzxbd"
    VEXTRACTPS = "vextractps"
    VPINSRD = "vpinsrd"
    VPEXTRD = "vpextrd"
    VINSERTF128 = "vinsertf128"
    VEXTRACTF128 = "vextractf128"
    VPADDD = "vpaddd"
    VPSUBD = "vpsubd"
    VPMULLD = "vpmulld"
    VPAND = "vpand"
    VPANDN = "vpandn"
    VPOR = "vpor"
    VPXOR = "vpxor"
    VPCMPEQD = "vpcmpeqd"
    VPCMPGTD = "vpcmpgtd"
    VPSLLD = "vpslld"
    VPSRLD = "vpsrld"
    VPSRAD = "vpsrad"
    VFMADD231SS = "vfmadd231ss"
    VFMADD231SD = "vfmadd231sd"
    VFMADD231PS = "vfmadd231ps"
    VFMADD231PD = "vfmadd231pd"
    VROUNDSS = "vroundss"
    VROUNDSD = "vroundsd"
    VROUNDPS = "vroundps"
    VROUNDPD = "vroundpd"
    VZEROUPPER = "vzeroupper"
    # AVX-512F (EVEX-encoded; KMOVW is VEX-encoded): zmm-only logic, opmask moves/tests, 256/128-bit lane moves
    VBLENDMPS = "vblendmps"
    VPXORD = "vpxord"
    VPANDD = "vpandd"
    VPANDND = "vpandnd"
    VPORD = "vpord"
    VPTESTMD = "vptestmd"
    VPCMPD = "vpcmpd"
    VRNDSCALEPS = "vrndscaleps"
    VEXTRACTF64X4 = "vextractf64x4"
    VINSERTF64X4 = "vinsertf64x4"
    VEXTRACTF32X4 = "vextractf32x4"
    KMOVW = "kmovw"


CONDITIONS: tuple[str, ...] = ("o", "no", "b", "ae", "e", "ne", "be", "a", "s", "ns", "p", "np", "l", "ge", "le", "g")
"""Condition suffixes in condition-field order (tttn = index)."""

COND_CODE: dict[X86Op, int] = {
    op: CONDITIONS.index(op.value[len(prefix) :])
    for op in X86Op
    for prefix in ("j", "set", "cmov")
    if op.value.startswith(prefix) and op.value[len(prefix) :] in CONDITIONS and op is not X86Op.JMP
}
"""Condition field (0..15) of every Jcc/SETcc/CMOVcc member."""

JCC_OPS: frozenset[X86Op] = frozenset(op for op in COND_CODE if op.value.startswith("j"))
SETCC_OPS: frozenset[X86Op] = frozenset(op for op in COND_CODE if op.value.startswith("set"))
CMOVCC_OPS: frozenset[X86Op] = frozenset(op for op in COND_CODE if op.value.startswith("cmov"))

_INVERSE = {"o": "no", "b": "ae", "e": "ne", "be": "a", "s": "ns", "p": "np", "l": "ge", "le": "g"}
_INVERSE.update({v: k for k, v in list(_INVERSE.items())})


def invert_condition(op: X86Op) -> X86Op:
    """The same family member with the opposite condition (JL -> JGE, SETE -> SETNE)."""
    for prefix in ("cmov", "set", "j"):
        if op in COND_CODE and op.value.startswith(prefix):
            return X86Op(prefix + _INVERSE[op.value[len(prefix) :]])
    raise CodegenValueError(f"invert_condition: expected a Jcc/SETcc/CMOVcc op, got {op.name}")
