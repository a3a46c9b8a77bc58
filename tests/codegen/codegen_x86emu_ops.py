"""Machine state, operand model and the integer/control-flow semantics of the x86-64 emulator (codegen_x86emu.py).

Semantics follow the Intel SDM vol. 2 instruction pages; each rule is a builder registered under its mnemonic(s) in
RULES: it receives one decoded instruction (`Decoded`: mnemonic, parsed operands, opmask decoration) and returns the
closure the run loop calls with the `Machine` - operands are bound once at decode time, so executing an instruction is
one Python call. A closure returns None to fall through or the absolute address to continue at (jumps, call, ret).
Vector rules live in codegen_x86emu_vec.py (arithmetic, compares, conversions, moves) and codegen_x86emu_lanes.py
(shuffles, permutes, broadcasts, gathers, opmasks); they register into the same table.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

M8, M16, M32, M64 = 0xFF, 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
MASK = {1: M8, 2: M16, 4: M32, 8: M64}
PARITY = [bin(i).count("1") % 2 == 0 for i in range(256)]  # PF: set when the low byte has an even number of ones
STOP = -1  # returned by `ret` to the sentinel address: the emulated function has returned


class EmulationError(RuntimeError):
    """The emulator met something it cannot (or must not) do: unknown instruction form, external call, fault."""


# ---------------------------------------------------------------------------------------------------------------------
# memory: mapped regions at fake addresses


class Region:
    __slots__ = ("start", "end", "buf", "arr", "name", "writable")

    def __init__(self, start: int, data: bytes | bytearray, name: str, writable: bool) -> None:
        self.start, self.end, self.name, self.writable = start, start + len(data), name, writable
        self.buf = bytearray(data)
        self.arr = np.frombuffer(self.buf, np.uint8) if len(data) else np.zeros(0, np.uint8)


class Memory:
    """A sparse flat address space: regions mapped at fixed addresses; any access outside them is an error."""

    def __init__(self) -> None:
        self.regions: list[Region] = []
        self._starts: list[int] = []

    def map(self, start: int, data: bytes | bytearray, name: str, writable: bool = True) -> Region:
        r = Region(start, data, name, writable)
        for o in self.regions:
            if start < o.end and o.start < r.end:
                raise ValueError(f"Memory.map: {name} [{start:#x}, {r.end:#x}) overlaps {o.name}")
        self.regions.append(r)
        self.regions.sort(key=lambda x: x.start)
        self._starts = [x.start for x in self.regions]
        return r

    def find(self, addr: int, n: int, write: bool = False) -> tuple[Region, int]:
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            r = self.regions[i]
            if addr + n <= r.end:
                if write and not r.writable:
                    raise EmulationError(f"write of {n} bytes at {addr:#x} into read-only {r.name}")
                return r, addr - r.start
        near = min(self.regions, key=lambda x: min(abs(addr - x.start), abs(addr - x.end)), default=None)
        where = f"; nearest region {near.name} [{near.start:#x}, {near.end:#x})" if near else ""
        raise EmulationError(f"{'write' if write else 'read'} of {n} bytes at {addr:#x} outside mapped memory{where}")

    def read_int(self, addr: int, n: int) -> int:
        r, o = self.find(addr, n)
        return int.from_bytes(r.buf[o : o + n], "little")

    def write_int(self, addr: int, n: int, v: int) -> None:
        r, o = self.find(addr, n, True)
        r.buf[o : o + n] = (v & MASK[n]).to_bytes(n, "little")

    def read(self, addr: int, n: int) -> np.ndarray:
        r, o = self.find(addr, n)
        return r.arr[o : o + n].copy()

    def write(self, addr: int, data: np.ndarray) -> None:
        r, o = self.find(addr, data.nbytes, True)
        r.arr[o : o + data.nbytes] = data.view(np.uint8)


class Machine:
    """Architectural state: 16 GPRs (unsigned 64-bit ints), 32 x 512-bit vector registers (one uint8 row each),
    opmasks k0..k7, the arithmetic flags, and memory."""

    __slots__ = ("gpr", "vec", "k", "cf", "zf", "sf", "of", "pf", "mem")

    def __init__(self, mem: Memory) -> None:
        self.gpr = [0] * 16
        self.vec = np.zeros((32, 64), np.uint8)
        self.k = [0] * 8
        self.cf = self.zf = self.sf = self.of = self.pf = False
        self.mem = mem


# ---------------------------------------------------------------------------------------------------------------------
# operands


class Gpr:
    __slots__ = ("num", "size", "name")

    def __init__(self, num: int, size: int, name: str) -> None:
        self.num, self.size, self.name = num, size, name

    def get(self, m: Machine) -> int:
        return m.gpr[self.num] & MASK[self.size]

    def set(self, m: Machine, v: int) -> None:
        """A 32-bit write zero-extends into the full register; 8/16-bit writes keep the other bits (SDM 3.4.1.1)."""
        n, s = self.num, self.size
        if s >= 4:
            m.gpr[n] = v & MASK[s]
        else:
            m.gpr[n] = (m.gpr[n] & ~MASK[s] & M64) | (v & MASK[s])


class Imm:
    __slots__ = ("value", "size")

    def __init__(self, value: int) -> None:
        self.value, self.size = value, None

    def get(self, m: Machine) -> int:
        return self.value


class Mem:
    """[base + index*scale + disp] (or next_ip + disp for RIP-relative: `rip` holds the resolved absolute address);
    size = the access width in bytes (None for lea's untyped operand); bcast = an EVEX embedded broadcast element."""

    __slots__ = ("base", "index", "scale", "disp", "size", "rip", "bcast", "vindex")

    def __init__(self, base: int | None, index: int | None, scale: int, disp: int, size: int | None,
                 rip: int | None, bcast: bool, vindex: int | None = None) -> None:  # fmt: skip
        self.base, self.index, self.scale, self.disp, self.size, self.rip, self.bcast = (
            base, index, scale, disp, size, rip, bcast)  # fmt: skip
        self.vindex = vindex  # VSIB (gathers): the number of the vector register holding the indices

    def ea(self, m: Machine) -> int:
        if self.vindex is not None:
            raise EmulationError("a vector-indexed (VSIB) address is only valid in a gather")
        if self.rip is not None:
            return self.rip
        a = self.disp
        if self.base is not None:
            a += m.gpr[self.base]
        if self.index is not None:
            a += m.gpr[self.index] * self.scale
        return a & M64

    def get(self, m: Machine) -> int:
        assert self.size is not None
        return m.mem.read_int(self.ea(m), self.size)

    def set(self, m: Machine, v: int) -> None:
        assert self.size is not None
        m.mem.write_int(self.ea(m), self.size, v)


class VecReg:
    __slots__ = ("num", "size")

    def __init__(self, num: int, size: int) -> None:
        self.num, self.size = num, size


class KReg:
    __slots__ = ("num", "size")

    def __init__(self, num: int) -> None:
        self.num, self.size = num, None


class Target:
    """A direct branch/call target (absolute address); `symbol` names an external one (a relocation to it)."""

    __slots__ = ("addr", "symbol", "size")

    def __init__(self, addr: int, symbol: str | None = None) -> None:
        self.addr, self.symbol, self.size = addr, symbol, None


Operand = Gpr | Imm | Mem | VecReg | KReg | Target
Run = Callable[[Machine], "int | None"]


@dataclass
class Decoded:
    """One instruction as objdump printed it, with parsed operands; `mask`/`zero` are the destination's {k}/{z}."""

    addr: int
    next_addr: int
    text: str
    mn: str
    ops: list[Operand]
    mask: int = 0
    zero: bool = False
    form: str = ""
    run: Run | None = field(default=None, repr=False)

    def fail(self, why: str) -> EmulationError:
        return EmulationError(f"{why}: `{self.text}` at {self.addr:#x}")


RULES: dict[str, Callable[[Decoded], Run]] = {}


def rule(*mnemonics: str) -> Callable[[Callable[[Decoded], Run]], Callable[[Decoded], Run]]:
    def reg(fn: Callable[[Decoded], Run]) -> Callable[[Decoded], Run]:
        for mn in mnemonics:
            assert mn not in RULES, mn
            RULES[mn] = fn
        return fn

    return reg


def op_size(d: Decoded, *ops: Operand) -> int:
    for o in ops or d.ops:
        if isinstance(o, (Gpr, Mem)) and o.size:
            return o.size
    raise d.fail("cannot tell the operand size")


def need(d: Decoded, n: int, *kinds: type) -> None:
    if len(d.ops) != n or any(not isinstance(o, k) for o, k in zip(d.ops, kinds)):
        raise d.fail(f"unsupported operand form for {d.mn} (expected {n} operands: "
                     f"{', '.join(k.__name__ for k in kinds)})")  # fmt: skip
    if d.mask:
        raise d.fail(f"{d.mn} takes no opmask")


def _sx(v: int, size: int) -> int:
    b = size * 8
    return v - (1 << b) if v >> (b - 1) & 1 else v


# ---------------------------------------------------------------------------------------------------------------------
# flags and conditions (SDM vol. 1 3.4.3.1, vol. 2 appendix B.1.4.7)


def _szp(m: Machine, r: int, size: int) -> None:
    m.zf = r == 0
    m.sf = bool(r >> (size * 8 - 1))
    m.pf = PARITY[r & 0xFF]


CONDITIONS: dict[str, Callable[[Machine], bool]] = {
    "o": lambda m: m.of, "no": lambda m: not m.of, "b": lambda m: m.cf, "ae": lambda m: not m.cf,
    "e": lambda m: m.zf, "ne": lambda m: not m.zf, "be": lambda m: m.cf or m.zf, "a": lambda m: not (m.cf or m.zf),
    "s": lambda m: m.sf, "ns": lambda m: not m.sf, "p": lambda m: m.pf, "np": lambda m: not m.pf,
    "l": lambda m: m.sf != m.of, "ge": lambda m: m.sf == m.of, "le": lambda m: m.zf or m.sf != m.of,
    "g": lambda m: not m.zf and m.sf == m.of,
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# integer ALU


def _binary(d: Decoded) -> tuple[Gpr | Mem, Gpr | Mem | Imm, int]:
    if len(d.ops) != 2 or not isinstance(d.ops[0], (Gpr, Mem)) or not isinstance(d.ops[1], (Gpr, Mem, Imm)):
        raise d.fail(f"unsupported operand form for {d.mn}")
    dst, src = d.ops
    return dst, src, op_size(d)


@rule("add", "sub", "cmp")
def _add_sub(d: Decoded) -> Run:
    dst, src, size = _binary(d)
    mask, sb, sub, write = MASK[size], size * 8 - 1, d.mn != "add", d.mn != "cmp"
    get_d, get_s = dst.get, src.get

    def run(m: Machine) -> None:
        a, b = get_d(m), get_s(m) & mask
        if sub:
            r = (a - b) & mask
            m.cf, m.of = a < b, bool(((a ^ b) & (a ^ r)) >> sb & 1)
        else:
            r = (a + b) & mask
            m.cf, m.of = a + b > mask, bool(((a ^ r) & (b ^ r)) >> sb & 1)
        m.zf, m.sf, m.pf = r == 0, bool(r >> sb), PARITY[r & 0xFF]
        if write:
            dst.set(m, r)

    return run


_LOGIC = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "test": lambda a, b: a & b}


@rule(*_LOGIC)
def _logic(d: Decoded) -> Run:
    dst, src, size = _binary(d)
    mask, sb, fn, write = MASK[size], size * 8 - 1, _LOGIC[d.mn], d.mn != "test"
    get_d, get_s = dst.get, src.get

    def run(m: Machine) -> None:
        r = fn(get_d(m), get_s(m) & mask)
        m.cf = m.of = False
        m.zf, m.sf, m.pf = r == 0, bool(r >> sb), PARITY[r & 0xFF]
        if write:
            dst.set(m, r)

    return run


@rule("inc", "dec", "neg", "not")
def _unary(d: Decoded) -> Run:
    if len(d.ops) != 1 or not isinstance(d.ops[0], (Gpr, Mem)):
        raise d.fail(f"unsupported operand form for {d.mn}")
    dst = d.ops[0]
    size = op_size(d)
    mask, top, mn = MASK[size], 1 << (size * 8 - 1), d.mn

    def run(m: Machine) -> None:
        a = dst.get(m)
        if mn == "not":
            dst.set(m, ~a & mask)  # flags unaffected
            return
        if mn == "neg":
            r = -a & mask
            m.cf, m.of = a != 0, a == top
        else:
            r = (a + (1 if mn == "inc" else -1)) & mask  # CF unaffected
            m.of = r == (top if mn == "inc" else top - 1)
        _szp(m, r, size)
        dst.set(m, r)

    return run


@rule("imul")
def _imul(d: Decoded) -> Run:
    if len(d.ops) == 1:
        return _widening_mul(d)
    if len(d.ops) == 2:
        dst, a, b = d.ops[0], d.ops[0], d.ops[1]
    elif len(d.ops) == 3:
        dst, a, b = d.ops
    else:
        raise d.fail("imul with an unexpected number of operands")
    if not isinstance(dst, Gpr) or not isinstance(a, (Gpr, Mem)) or not isinstance(b, (Gpr, Mem, Imm)):
        raise d.fail("unsupported operand form for imul")
    size = dst.size
    mask = MASK[size]

    def run(m: Machine) -> None:
        full = _sx(a.get(m), size) * _sx(b.get(m) & mask, size)
        r = full & mask
        m.cf = m.of = _sx(r, size) != full
        _szp(m, r, size)  # SF/ZF/PF are undefined after imul; these are what current CPUs produce
        dst.set(m, r)

    return run


_RAX, _RDX = Gpr(0, 8, "rax"), Gpr(2, 8, "rdx")


@rule("mul")
def _widening_mul(d: Decoded) -> Run:
    """mul/imul r/m: rdx:rax (edx:eax) = rax * r/m, CF=OF = the high half is significant."""
    if len(d.ops) != 1 or not isinstance(d.ops[0], (Gpr, Mem)):
        raise d.fail(f"unsupported operand form for {d.mn}")
    src, size, signed = d.ops[0], op_size(d), d.mn == "imul"
    if size < 4:
        raise d.fail("8/16-bit widening multiply is not supported")
    lo, hi, mask, bits = Gpr(0, size, "a"), Gpr(2, size, "d"), MASK[size], size * 8

    def run(m: Machine) -> None:
        a, b = lo.get(m), src.get(m)
        full = _sx(a, size) * _sx(b, size) if signed else a * b
        r_lo, r_hi = full & mask, (full >> bits) & mask
        m.cf = m.of = (_sx(r_lo, size) != full) if signed else r_hi != 0
        lo.set(m, r_lo)
        hi.set(m, r_hi)

    return run


@rule("div", "idiv")
def _div(d: Decoded) -> Run:
    if len(d.ops) != 1 or not isinstance(d.ops[0], (Gpr, Mem)):
        raise d.fail(f"unsupported operand form for {d.mn}")
    src, size, signed = d.ops[0], op_size(d), d.mn == "idiv"
    if size < 4:
        raise d.fail("8/16-bit division is not supported")
    lo, hi, bits = Gpr(0, size, "a"), Gpr(2, size, "d"), size * 8

    def run(m: Machine) -> None:
        dividend, divisor = hi.get(m) << bits | lo.get(m), src.get(m)
        if signed:
            dividend, divisor = _sx(dividend, 2 * size), _sx(divisor, size)
        if divisor == 0:
            raise EmulationError(f"{d.mn}: division by zero (#DE)")
        q = abs(dividend) // abs(divisor) * (1 if (dividend < 0) == (divisor < 0) else -1)  # truncating
        r = dividend - q * divisor
        if (signed and not -(1 << (bits - 1)) <= q < 1 << (bits - 1)) or (not signed and q >> bits):
            raise EmulationError(f"{d.mn}: quotient {q} does not fit {bits} bits (#DE)")
        lo.set(m, q)
        hi.set(m, r)

    return run


@rule("cdq", "cqo", "cdqe", "cwde")
def _sign_extend_acc(d: Decoded) -> Run:
    size = {"cdq": 4, "cqo": 8, "cdqe": 4, "cwde": 2}[d.mn]
    into_rdx = d.mn in ("cdq", "cqo")

    def run(m: Machine) -> None:
        v = _sx(m.gpr[0] & MASK[size], size)
        if into_rdx:
            Gpr(2, size, "d").set(m, -1 if v < 0 else 0)
        else:
            Gpr(0, size * 2, "a").set(m, v)

    return run


@rule("shl", "sal", "shr", "sar", "rol", "ror")
def _shift(d: Decoded) -> Run:
    if len(d.ops) == 1:
        d.ops.append(Imm(1))
    dst, cnt = d.ops[0], d.ops[1]
    if not isinstance(dst, (Gpr, Mem)) or not (isinstance(cnt, Imm) or (isinstance(cnt, Gpr) and cnt.name == "cl")):
        raise d.fail(f"unsupported operand form for {d.mn}")
    size = op_size(d, dst)
    mask, bits, mn = MASK[size], size * 8, d.mn

    def run(m: Machine) -> None:
        c = cnt.get(m) & (0x3F if size == 8 else 0x1F)
        if c == 0:
            return  # count 0: neither the destination nor the flags change
        a = dst.get(m)
        if mn in ("shl", "sal"):
            r = (a << c) & mask
            m.cf = bool(a >> (bits - c) & 1) if c <= bits else False
            m.of = bool(r >> (bits - 1)) != m.cf
        elif mn == "shr":
            r = a >> c
            m.cf, m.of = bool(a >> (c - 1) & 1), bool(a >> (bits - 1))
        elif mn == "sar":
            r = (_sx(a, size) >> c) & mask
            m.cf, m.of = bool(_sx(a, size) >> (c - 1) & 1), False
        else:
            c %= bits
            r = ((a << c) | (a >> (bits - c))) & mask if mn == "rol" else ((a >> c) | (a << (bits - c))) & mask
            if mn == "rol":
                m.cf = bool(r & 1)
                m.of = bool(r >> (bits - 1)) != m.cf
            else:
                m.cf = bool(r >> (bits - 1))
                m.of = bool(r >> (bits - 1)) != bool(r >> (bits - 2) & 1)
            dst.set(m, r)
            return
        _szp(m, r, size)
        dst.set(m, r)

    return run


# ---------------------------------------------------------------------------------------------------------------------
# data movement


@rule("mov", "movabs")
def _mov(d: Decoded) -> Run:
    dst, src, size = _binary(d)
    mask = MASK[size]
    get = src.get
    if isinstance(dst, Gpr) and size >= 4:  # the hot case: a register write without the merge
        n = dst.num

        def run_reg(m: Machine) -> None:
            m.gpr[n] = get(m) & mask

        return run_reg
    put = dst.set

    def run(m: Machine) -> None:
        put(m, get(m) & mask)

    return run


@rule("movzx", "movsx", "movsxd")
def _movx(d: Decoded) -> Run:
    need(d, 2, Gpr, (Gpr, Mem))  # type: ignore[arg-type]
    dst, src = d.ops
    assert isinstance(dst, Gpr)
    ssize = op_size(d, src)
    signed = d.mn != "movzx"

    def run(m: Machine) -> None:
        v = src.get(m)  # type: ignore[union-attr]
        dst.set(m, _sx(v, ssize) if signed else v)

    return run


@rule("lea")
def _lea(d: Decoded) -> Run:
    need(d, 2, Gpr, Mem)
    dst, src = d.ops
    assert isinstance(dst, Gpr) and isinstance(src, Mem)

    def run(m: Machine) -> None:
        dst.set(m, src.ea(m))

    return run


def _push_value(m: Machine, v: int) -> None:
    m.gpr[4] = (m.gpr[4] - 8) & M64
    m.mem.write_int(m.gpr[4], 8, v)


def _pop_value(m: Machine) -> int:
    v = m.mem.read_int(m.gpr[4], 8)
    m.gpr[4] = (m.gpr[4] + 8) & M64
    return v


@rule("push")
def _push(d: Decoded) -> Run:
    src = d.ops[0] if len(d.ops) == 1 else None
    if not isinstance(src, (Gpr, Imm, Mem)) or (src.size or 8) != 8:
        raise d.fail("push takes one 64-bit register, memory or immediate operand")
    get = src.get

    def run(m: Machine) -> None:
        _push_value(m, get(m) & M64)

    return run


@rule("pop")
def _pop(d: Decoded) -> Run:
    dst = d.ops[0] if len(d.ops) == 1 else None
    if not isinstance(dst, (Gpr, Mem)) or dst.size != 8:
        raise d.fail("pop takes one 64-bit register or memory operand")

    def run(m: Machine) -> None:
        dst.set(m, _pop_value(m))

    return run


def _conditional(family: str) -> Callable[[Decoded], Run]:
    def build(d: Decoded) -> Run:
        cond = CONDITIONS[d.mn[len(family) :]]
        if family == "j":
            need(d, 1, Target)
            target = d.ops[0].addr  # type: ignore[union-attr]
            return lambda m: target if cond(m) else None
        if family == "set":
            need(d, 1, (Gpr, Mem))  # type: ignore[arg-type]
            dst = d.ops[0]
            if op_size(d) != 1:
                raise d.fail("setcc writes a byte")

            def run_set(m: Machine) -> None:
                dst.set(m, 1 if cond(m) else 0)  # type: ignore[union-attr]

            return run_set
        need(d, 2, Gpr, (Gpr, Mem))  # type: ignore[arg-type]
        dst, src = d.ops

        def run_cmov(m: Machine) -> None:
            # the source is read (and may fault) whatever the condition; a 32-bit cmov always zero-extends
            v = src.get(m)  # type: ignore[union-attr]
            dst.set(m, v if cond(m) else dst.get(m))  # type: ignore[union-attr]

        return run_cmov

    return build


for _cc in CONDITIONS:
    for _family in ("j", "set", "cmov"):
        RULES[_family + _cc] = _conditional(_family)


@rule("jmp")
def _jmp(d: Decoded) -> Run:
    if len(d.ops) != 1 or isinstance(d.ops[0], (Imm, VecReg, KReg)):
        raise d.fail("unsupported jmp form")
    t = d.ops[0]
    if isinstance(t, Target):
        addr = t.addr
        return lambda m: addr
    get = t.get
    return lambda m: get(m) & M64  # indirect


@rule("call")
def _call(d: Decoded) -> Run:
    if len(d.ops) != 1 or not isinstance(d.ops[0], Target):
        raise d.fail("only direct calls are supported")
    t, ret = d.ops[0], d.next_addr

    def run(m: Machine) -> int:
        if t.symbol is not None:
            raise EmulationError(f"call to external symbol {t.symbol!r}: the emulator runs code of this object only")
        _push_value(m, ret)
        return t.addr

    return run


@rule("ret")
def _ret(d: Decoded) -> Run:
    if d.ops:
        raise d.fail("ret imm16 is not supported")
    return _pop_value  # the loop maps the popped address (or the sentinel) to the next instruction


@rule("nop", "vzeroupper", "endbr64")
def _nop(d: Decoded) -> Run:
    if d.mn == "vzeroupper":

        def run(m: Machine) -> None:
            m.vec[:16, 16:] = 0  # bits 511:128 of zmm0-15 (SDM: VZEROUPPER)

        return run
    return lambda m: None
