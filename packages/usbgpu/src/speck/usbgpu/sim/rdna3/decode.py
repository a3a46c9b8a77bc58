"""Decoding a word stream into instructions: which encoding a dword starts, and a per-address cache.

Encodings are told apart by their leading bits (RDNA3 ISA chapter 15): VOP2 [31]=0; VOP1 [31:25]=0111111;
VOPC [31:25]=0111110; SOP2 [31:30]=10 (but SOPK [31:28]=1011 and SOP1/SOPC/SOPP [31:23]=1011111xx); SMEM
[31:26]=111101; VOP3 110101; VOP3P [31:24]=11001100; VOPD [31:26]=110010; DS 110110; FLAT/GLOBAL/SCRATCH 110111;
MUBUF 111000.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from speck.usbgpu.sim.rdna3.codeobject import parse_code_object
from speck.usbgpu.sim.rdna3.inst import Inst, unimplemented
from speck.usbgpu.sim.rdna3.scalar import decode_smem, decode_sop1, decode_sop2, decode_sopc, decode_sopk, decode_sopp
from speck.usbgpu.sim.rdna3.vector import decode_vop1, decode_vop2, decode_vop3, decode_vop3p, decode_vopc, decode_vopd
from speck.usbgpu.sim.rdna3.vmem import decode_ds, decode_flat, decode_mubuf

Fetch = Callable[[int], int]
Decoder = Callable[[int, Fetch], Inst]
_BY_TOP6: dict[int, Decoder] = {
    0x3D: decode_smem,
    0x35: decode_vop3,
    0x32: decode_vopd,
    0x36: decode_ds,
    0x37: decode_flat,
    0x38: decode_mubuf,
}
_UNSUPPORTED_TOP6 = {0x3A: "MTBUF", 0x3C: "MIMG", 0x3E: "EXP", 0x33: "VINTERP"}


def encoding_decoder(w: int) -> Decoder | str:
    """The decoder for an instruction whose first dword is `w`, or the name of an unsupported encoding."""
    if w >> 31 == 0:
        top7 = w >> 25
        return decode_vop1 if top7 == 0x3F else decode_vopc if top7 == 0x3E else decode_vop2
    if w >> 30 == 2:
        top9 = w >> 23
        if top9 == 0x17D:
            return decode_sop1
        if top9 == 0x17E:
            return decode_sopc
        if top9 == 0x17F:
            return decode_sopp
        return decode_sopk if w >> 28 == 0xB else decode_sop2
    if w >> 24 == 0xCC:
        return decode_vop3p
    top6 = w >> 26
    if top6 in _BY_TOP6:
        return _BY_TOP6[top6]
    return _UNSUPPORTED_TOP6.get(top6, "unknown")


def decode(pc: int, fetch: Fetch) -> Inst:
    """Decode the instruction at `pc`; fetch(k) returns its k-th dword."""
    dec = encoding_decoder(fetch(0))
    if isinstance(dec, str):
        w = fetch(0)
        name = f"<{dec} encoding>"
        return Inst(pc, (w,), dec, 0, name, "", "nop", unimplemented(name, f" (word {w:#010x})"))
    return dec(pc, fetch)


@lru_cache(maxsize=1 << 16)
def decode_words(pc: int, words: tuple[int, ...]) -> Inst:
    """Decode from known words (cached: a kernel dispatched many times is decoded once)."""

    def fetch(k: int) -> int:
        if k >= len(words):
            raise _NeedMore(k)
        return words[k]

    return decode(pc, fetch)


class _NeedMore(Exception):
    """The decoder needs `k` more instruction words (internal: caught by decode, which fetches them)."""

    def __init__(self, k: int) -> None:
        self.k = k


# decoded instructions by (pc, first dword), for decode_at: a kernel dispatched again is not decoded again (the
# remaining dwords are compared before a hit is used, so new code at the same address is decoded afresh)
_DECODED: dict[tuple[int, int], tuple[tuple[int, ...], Inst]] = {}
_DECODED_MAX = 1 << 16


def decode_at(pc: int, read_word: Callable[[int], int]) -> Inst:
    """Decode the instruction at `pc`, reading only the dwords it needs through read_word(address)."""
    w0 = read_word(pc)
    hit = _DECODED.get((pc, w0))
    if hit is not None and all(read_word(pc + 4 * k) == w for k, w in enumerate(hit[0]) if k):
        return hit[1]
    words: list[int] = [w0]

    def fetch(k: int) -> int:
        while len(words) <= k:
            words.append(read_word(pc + 4 * len(words)))
        return words[k]

    inst = decode(pc, fetch)
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.clear()
    _DECODED[(pc, w0)] = (tuple(words), inst)  # every dword the decoder read, not only inst.words
    return inst


def disassemble(code: bytes, base: int = 0) -> list[Inst]:
    """Every instruction of a code blob (from `base`), in order; trailing s_code_end padding included."""
    out: list[Inst] = []
    pc = 0
    n = len(code) // 4
    read = lambda a: int.from_bytes(code[a - base : a - base + 4], "little") if a - base < 4 * n else 0
    while pc < 4 * n:
        inst = decode_at(base + pc, read)
        out.append(inst)
        pc += inst.size
    return out


def disassemble_kernel(code_object: bytes, kernel: str) -> list[Inst]:
    """The instructions of `kernel` in an HSA code object: from its entry to the s_code_end padding LLVM puts after
    the text (or the end of the image)."""
    co = parse_code_object(code_object)
    entry, _ = co.kernel(kernel)
    out = []
    for inst in disassemble(co.image[entry:], entry):
        if inst.name == "s_code_end":
            break
        out.append(inst)
    return out
