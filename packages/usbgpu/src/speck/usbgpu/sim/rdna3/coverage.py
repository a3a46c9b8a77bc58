"""Which mnemonics the emulator implements, found by decoding one instance of every opcode of every table (so the
answer comes from the executors themselves), and the closing figure: implemented / seen in a corpus."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache

from speck.usbgpu.sim.rdna3 import salu, scalar, valu, vmem
from speck.usbgpu.sim.rdna3.decode import decode_words
from speck.usbgpu.sim.rdna3.inst import Unimplemented, base_mnemonic

# field values for the synthetic instances: v1/v2/v3 sources, v2 (or s2) destinations, sbase s[2:3], saddr off
_V3 = (0x103 << 18) | (0x102 << 9) | 0x101


def _instances() -> Iterator[tuple[str, tuple[int, ...]]]:
    """(family, words) for one instance of each opcode the tables know."""
    for op in salu.SOP2:
        yield "SOP2", (0x80000000 | op << 23 | 2 << 16 | 3 << 8 | 4, 0)
    for op in salu.SOP1:
        yield "SOP1", (0xBE800000 | 2 << 16 | op << 8 | 4, 0)
    for op in salu.SOPC:
        yield "SOPC", (0xBF000000 | op << 16 | 3 << 8 | 4, 0)
    for op in salu.SOPK:
        yield "SOPK", (0xB0000000 | op << 23 | 124 << 16, 0)
    for op in salu.SOPP:
        yield "SOPP", (0xBF800000 | op << 16,)
    # s_sendmsg is implemented for the one message LLVM sends (before s_endpgm): the others raise EmulationError
    yield "SOPP", (0xBF800000 | 54 << 16 | scalar.MSG_DEALLOC_VGPRS,)
    for op in scalar.SMEM:
        yield "SMEM", (0xF4000000 | op << 18 | 2 << 6 | 1, 0xF8000000)
    for op in valu.VOP1:
        yield "VOP1", (0x7E000000 | 2 << 17 | op << 9 | 0x101, 0)
    for op in valu.VOP2:
        yield "VOP2", (op << 25 | 2 << 17 | 3 << 9 | 0x101, 0)
    for op in valu.VOPC:
        yield "VOPC", (0x7C000000 | op << 17 | 3 << 9 | 0x101, 0)
    for op in valu.VOP3:
        yield "VOP3", (0xD4000000 | op << 16 | 2, _V3, 0)
    for op in valu.VOP3P:
        yield "VOP3P", (0xCC000000 | op << 16 | 1 << 14 | 2, 3 << 27 | _V3, 0)
    for opx in valu.VOPD_X:
        yield "VOPD", (0xC8000000 | opx << 22 | 4 << 17 | 3 << 9 | 0x101, 8 << 24 | 3 << 17 | 5 << 9 | 0x104, 0)
    for opy in valu.VOPD_Y:
        yield "VOPD", (0xC8000000 | 4 << 22 | opy << 17 | 3 << 9 | 0x101, 8 << 24 | 3 << 17 | 5 << 9 | 0x104, 0)
    for op in {**vmem.DS_OPS, **vmem.DS_OTHER}:
        yield "DS", (0xD8000000 | op << 18, 5 << 24 | 3 << 8 | 2)
    for seg in vmem.SEGMENTS:
        atomics = vmem.FLAT_ATOMICS if vmem.SEGMENTS[seg] != "scratch" else {}  # scratch has no atomics
        for op in {**vmem.FLAT_OPS, **atomics}:
            yield "FLAT", (0xDC000000 | op << 18 | seg << 16, 5 << 24 | 0x7C << 16 | 3 << 8 | 2)
    for op in vmem.MUBUF_NOPS:
        yield "MUBUF", (0xE0000000 | op << 18, 0)


@cache
def coverage() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Per encoding family: (mnemonics implemented, mnemonics known by name but not implemented)."""
    done: dict[str, set[str]] = {}
    todo: dict[str, set[str]] = {}
    for family, words in _instances():
        inst = decode_words(0, words)
        name = base_mnemonic(inst.name)
        if inst.name.startswith("v_dual_"):  # a VOPD instance names both halves
            names = [base_mnemonic(part.split()[0]) for part in inst.text.split(" :: ")]
        else:
            names = [name]
        missing = isinstance(inst.run, Unimplemented)
        for n in names:
            (todo if missing else done).setdefault(family, set()).add(n)
    families = sorted(set(done) | set(todo))
    return {f: (frozenset(done.get(f, set())), frozenset(todo.get(f, set()) - done.get(f, set()))) for f in families}


def implemented() -> frozenset[str]:
    return frozenset().union(*(d for d, _ in coverage().values()))


def coverage_of(mnemonics: Iterable[str]) -> tuple[int, int, list[str]]:
    """(implemented, seen, the missing ones) for the mnemonics a corpus contains (encoding suffixes ignored)."""
    seen = {base_mnemonic(m) for m in mnemonics}
    missing = sorted(seen - implemented())
    return len(seen) - len(missing), len(seen), missing
