"""End to end: hand-built kernels on virtual registers -> allocate -> encode -> ELF -> gcc -shared -> ctypes -> numpy.

Kernels follow CPU_ABI.md: `void k(T0 *data0, ..., int32 var0, ..., int32 core_start, int32 core_end)`, looping the
outermost global index over [core_start, core_end); each test also splits the range across several calls the way the
runtime's worker threads would.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from speck.codegen.regalloc import VReg
from speck.codegen.x86.alloc import Item, LoopBegin, LoopEnd, allocate_function, build_object
from speck.codegen.x86.assembler import assemble
from speck.codegen.x86.elf_object import ConstPool
from speck.codegen.x86.objdump import disassemble_object, normalise, parse_objdump
from speck.codegen.x86.operands import Imm, IncomingStackArg, Inst, Label, Mem, Sym, rodata
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.regs import CALL_CLOBBERS, arg_vreg

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to link the object for ctypes")

P = ctypes.c_void_p
I32 = ctypes.c_int32


def G(i: int, size: int = 8) -> VReg:
    return VReg(i, "gpr", size)


def V(i: int, size: int = 32) -> VReg:
    return VReg(i, "vec", size)


def ins(op: O, *ops: object, **kw: object) -> Inst:
    return Inst(op, tuple(ops), **kw)  # type: ignore[arg-type]


def link(tmp_path: Path, name: str, items: list[Item], argtypes: list[type], rodata_bytes: bytes = b"") -> Callable:
    """Build the object, check objdump agrees with our listing, link it into a shared object, return the function."""
    obj, asm = build_object(name, items, rodata_bytes)
    dis = parse_objdump(disassemble_object(obj))
    ours = [(line.offset, normalise(line.text)) for line in asm.lines if line.raw]
    assert [d[0] for d in dis] == [o[0] for o in ours]
    for (_off, theirs), (_, mine) in zip(dis, ours):
        if mine.split()[0].startswith(("j", "call")):  # object-mode objdump prints targets without 0x
            assert theirs.split()[0] == mine.split()[0] and int(theirs.split()[1], 16) == int(mine.split()[1], 16)
        else:
            assert theirs == mine
    (tmp_path / f"{name}.o").write_bytes(obj)
    so = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-o", str(so), str(tmp_path / f"{name}.o"), "-lm"], check=True)
    fn = getattr(ctypes.CDLL(str(so)), name)
    fn.argtypes = argtypes
    fn.restype = None
    return fn  # type: ignore[no-any-return]


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data  # type: ignore[no-any-return]


def slices(n: int, parts: int) -> list[tuple[int, int]]:
    cuts = [n * k // parts for k in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def elementwise_add() -> list[Item]:
    """out[i] = a[i] + b[i]: AVX2 loop 8 floats at a time, then a scalar tail."""
    args = [arg_vreg(k, 100 + k) for k in range(5)]
    out, pa, pb, i, end, lim = G(1), G(2), G(3), G(4), G(5), G(6)
    x, s = V(10), V(11, 16)
    return [
        ins(O.MOV, out, args[0]), ins(O.MOV, pa, args[1]), ins(O.MOV, pb, args[2]),
        ins(O.MOVSXD, i, args[3].sized(4)), ins(O.MOVSXD, end, args[4].sized(4)),
        ins(O.LEA, lim, Mem(end, disp=-7)),
        LoopBegin(), Label("vec"), ins(O.CMP, i, lim), ins(O.JGE, Label("vec_done")),
        ins(O.VMOVUPS, x, Mem(pa, i, 4)), ins(O.VADDPS, x, x, Mem(pb, i, 4)), ins(O.VMOVUPS, Mem(out, i, 4), x),
        ins(O.ADD, i, Imm(8)), ins(O.JMP, Label("vec")), LoopEnd(), Label("vec_done"),
        LoopBegin(), Label("tail"), ins(O.CMP, i, end), ins(O.JGE, Label("done")),
        ins(O.VMOVSS, s, Mem(pa, i, 4)), ins(O.VADDSS, s, s, Mem(pb, i, 4)), ins(O.VMOVSS, Mem(out, i, 4), s),
        ins(O.ADD, i, Imm(1)), ins(O.JMP, Label("tail")), LoopEnd(), Label("done"),
        ins(O.RET),
    ]  # fmt: skip


@pytest.mark.parametrize("n", [1, 7, 8, 9, 100, 1027])
def test_elementwise_add(tmp_path: Path, n: int) -> None:
    fn = link(tmp_path, "add_kernel", elementwise_add(), [P, P, P, I32, I32])
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    out = np.full(n, np.nan, dtype=np.float32)
    for start, end in slices(n, 3):
        fn(ptr(out), ptr(a), ptr(b), start, end)
    np.testing.assert_array_equal(out, a + b)


def row_sum() -> list[Item]:
    """out[r] = sum(inp[r, :]) over int64, rows sliced by core_start/core_end, ncols a by-value variable."""
    args = [arg_vreg(k, 100 + k) for k in range(5)]
    out, inp, ncols, r, rend, acc, rowp, c = (G(k) for k in range(1, 9))
    return [
        ins(O.MOV, out, args[0]), ins(O.MOV, inp, args[1]), ins(O.MOVSXD, ncols, args[2].sized(4)),
        ins(O.MOVSXD, r, args[3].sized(4)), ins(O.MOVSXD, rend, args[4].sized(4)),
        LoopBegin(), Label("rows"), ins(O.CMP, r, rend), ins(O.JGE, Label("done")),
        ins(O.XOR, acc.sized(4), acc.sized(4)),
        ins(O.MOV, rowp, r), ins(O.IMUL, rowp, ncols), ins(O.LEA, rowp, Mem(inp, rowp, 8)),
        ins(O.XOR, c, c),
        LoopBegin(), Label("cols"), ins(O.CMP, c, ncols), ins(O.JGE, Label("cols_done")),
        ins(O.ADD, acc, Mem(rowp, c, 8)), ins(O.INC, c), ins(O.JMP, Label("cols")), LoopEnd(), Label("cols_done"),
        ins(O.MOV, Mem(out, r, 8), acc), ins(O.ADD, r, Imm(1)), ins(O.JMP, Label("rows")), LoopEnd(), Label("done"),
        ins(O.RET),
    ]  # fmt: skip


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 0), (7, 13), (33, 64)])
def test_int64_row_sum(tmp_path: Path, rows: int, cols: int) -> None:
    fn = link(tmp_path, "row_sum", row_sum(), [P, P, I32, I32, I32])
    rng = np.random.default_rng(rows * 100 + cols)
    inp = rng.integers(-(2**62), 2**62, size=(rows, cols), dtype=np.int64)
    out = np.zeros(rows, dtype=np.int64)
    for start, end in slices(rows, 2):
        fn(ptr(out), ptr(inp), cols, start, end)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, inp.sum(axis=1, dtype=np.int64))


NACC = 20  # more loop-carried accumulators than the 13 allocatable general registers
INVARIANTS = [0x1234_5678_9ABC_DEF1, -0x0FED_CBA9_8765_4321, 0x7FFF_FFFF_0000_0001, 3]


def int_pressure() -> list[Item]:
    """acc[j] = (acc[j] * 3 + x + inv[j % 4]) for every x in inp[0:n]; out[j] = acc[j]. Forces loop-carried spills."""
    args = [arg_vreg(k, 100 + k) for k in range(3)]
    out, inp, n, t, x = G(1), G(2), G(3), G(4), G(5)
    accs = [G(10 + j) for j in range(NACC)]
    invs = [G(40 + j) for j in range(len(INVARIANTS))]
    items: list[Item] = [ins(O.MOV, out, args[0]), ins(O.MOV, inp, args[1]), ins(O.MOVSXD, n, args[2].sized(4))]
    items += [ins(O.MOV, acc, Imm(1000 * j + 1)) for j, acc in enumerate(accs)]
    items += [ins(O.MOVABS, inv, Imm(v)) for inv, v in zip(invs, INVARIANTS)]
    items += [ins(O.XOR, t.sized(4), t.sized(4)), LoopBegin(), Label("loop"), ins(O.CMP, t, n),
              ins(O.JGE, Label("done")), ins(O.MOV, x, Mem(inp, t, 8))]  # fmt: skip
    for j, acc in enumerate(accs):
        items += [ins(O.IMUL, acc, acc, Imm(3)), ins(O.ADD, acc, x), ins(O.ADD, acc, invs[j % len(invs)])]
    items += [ins(O.INC, t), ins(O.JMP, Label("loop")), LoopEnd(), Label("done")]
    items += [ins(O.MOV, Mem(out, disp=8 * j), acc) for j, acc in enumerate(accs)]
    return items + [ins(O.RET)]


def test_int_register_pressure_spills(tmp_path: Path) -> None:
    items = int_pressure()
    fn_alloc = allocate_function(items)
    spilled = [vid for vid, home in fn_alloc.allocation.home.items() if isinstance(home, int)]
    assert len(spilled) >= NACC + len(INVARIANTS) - 13 and any(10 <= v < 10 + NACC for v in spilled)
    fn = link(tmp_path, "pressure", items, [P, P, I32])
    for n in (0, 1, 5, 40):
        inp = np.random.default_rng(n).integers(-(2**40), 2**40, size=n, dtype=np.int64)
        out = np.zeros(NACC, dtype=np.int64)
        fn(ptr(out), ptr(inp), n)
        want = []
        for j in range(NACC):
            acc = 1000 * j + 1
            for x in inp.tolist():
                acc = (acc * 3 + x + INVARIANTS[j % len(INVARIANTS)]) & (2**64 - 1)
            want.append(acc - 2**64 if acc >= 2**63 else acc)
        assert out.tolist() == want


NVEC = 18


def vec_pressure(pool: ConstPool) -> list[Item]:
    """acc[j] = acc[j] * 0.5 + inp[t, :] (8 floats) over t < n, acc[j] starting at j + 1; 18 live ymm accumulators."""
    args = [arg_vreg(k, 100 + k) for k in range(3)]
    out, inp, n, t = G(1), G(2), G(3), G(4)
    half, x = V(5), V(6)
    accs = [V(10 + j) for j in range(NVEC)]
    items: list[Item] = [ins(O.MOV, out, args[0]), ins(O.MOV, inp, args[1]), ins(O.MOVSXD, n, args[2].sized(4))]
    items += [ins(O.VBROADCASTSS, acc, rodata(pool.add(struct.pack("<f", j + 1.0), 4))) for j, acc in enumerate(accs)]
    items += [ins(O.VBROADCASTSS, half, rodata(pool.add(struct.pack("<f", 0.5), 4)))]
    items += [ins(O.XOR, t, t), ins(O.MOV, G(7), inp), LoopBegin(), Label("loop"), ins(O.CMP, t, n),
              ins(O.JGE, Label("done")), ins(O.VMOVUPS, x, Mem(G(7)))]  # fmt: skip
    for acc in accs:
        items += [ins(O.VMULPS, acc, acc, half), ins(O.VADDPS, acc, acc, x)]
    items += [ins(O.ADD, G(7), Imm(32)), ins(O.INC, t), ins(O.JMP, Label("loop")), LoopEnd(), Label("done")]
    items += [ins(O.VMOVUPS, Mem(out, disp=32 * j), acc) for j, acc in enumerate(accs)]
    return items + [ins(O.RET)]


def test_vector_register_pressure_spills(tmp_path: Path) -> None:
    pool = ConstPool()
    items = vec_pressure(pool)
    fn = link(tmp_path, "vpressure", items, [P, P, I32], bytes(pool.data))
    for n in (0, 1, 9):
        inp = np.random.default_rng(n).standard_normal((n, 8), dtype=np.float32)
        out = np.zeros((NVEC, 8), dtype=np.float32)
        fn(ptr(out), ptr(inp), n)
        want = np.repeat(np.arange(1, NVEC + 1, dtype=np.float32)[:, None], 8, axis=1)
        for row in inp:
            want = want * np.float32(0.5) + row
        np.testing.assert_array_equal(out, want)


def fixed_constraints(pool: ConstPool) -> list[Item]:
    """out[i] = expf(a[i]) + float((x[i] / 7) << ((x[i] % 7) & 3)) + 0.5: idiv (rax/rdx), shift by cl, a libm call."""
    args = [arg_vreg(k, 100 + k) for k in range(5)]
    out, pa, px, i, end = G(1), G(2), G(3), G(4), G(5)
    num, hi, q, rem = (
        VReg(20, "gpr", 4, "rax"),
        VReg(21, "gpr", 4, "rdx"),
        VReg(22, "gpr", 4, "rax"),
        VReg(23, "gpr", 4, "rdx"),
    )
    div, shifted, count = G(24, 4), G(25, 4), VReg(26, "gpr", 4, "rcx")
    farg, fret, conv, res = VReg(30, "vec", 16, "xmm0"), VReg(31, "vec", 16, "xmm0"), V(32, 16), V(33, 16)
    half = rodata(pool.add(struct.pack("<f", 0.5), 4))
    return [
        ins(O.MOV, out, args[0]), ins(O.MOV, pa, args[1]), ins(O.MOV, px, args[2]),
        ins(O.MOVSXD, i, args[3].sized(4)), ins(O.MOVSXD, end, args[4].sized(4)),
        LoopBegin(), Label("loop"), ins(O.CMP, i, end), ins(O.JGE, Label("done")),
        ins(O.MOV, num, Mem(px, i, 4)), ins(O.CDQ, implicit_uses=(num,), implicit_defs=(hi,)),
        ins(O.MOV, div, Imm(7)), ins(O.IDIV, div, implicit_uses=(num, hi), implicit_defs=(q, rem)),
        ins(O.MOV, shifted, q), ins(O.MOV, count, rem), ins(O.AND, count, Imm(3)), ins(O.SHL, shifted, count.sized(1)),
        ins(O.VMOVSS, farg, Mem(pa, i, 4)),
        ins(O.CALL, Sym("expf"), implicit_uses=(farg,), implicit_defs=(fret,), clobbers=CALL_CLOBBERS),
        ins(O.VXORPS, conv, conv, conv), ins(O.VCVTSI2SS, conv, conv, shifted),
        ins(O.VADDSS, res, fret, conv), ins(O.VADDSS, res, res, half), ins(O.VMOVSS, Mem(out, i, 4), res),
        ins(O.INC, i), ins(O.JMP, Label("loop")), LoopEnd(), Label("done"),
        ins(O.RET),
    ]  # fmt: skip


def test_fixed_registers_division_shift_and_call(tmp_path: Path) -> None:
    pool = ConstPool()
    items = fixed_constraints(pool)
    alloc = allocate_function(items)
    assert alloc.pushed, "values live across the call must sit in callee-saved registers"
    fn = link(tmp_path, "constrained", items, [P, P, P, I32, I32], bytes(pool.data))
    n = 37
    rng = np.random.default_rng(0)
    a = rng.uniform(-3, 3, n).astype(np.float32)
    x = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    x[:4] = [0, -1, 2**31 - 1, -(2**31)]
    out = np.zeros(n, dtype=np.float32)
    for start, end in slices(n, 4):
        fn(ptr(out), ptr(a), ptr(x), start, end)
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    want = []
    for ai, xi in zip(a.tolist(), x.tolist()):
        q = -(-xi // 7) if xi < 0 else xi // 7  # C truncating division
        r = xi - 7 * q
        s = (q << (r & 3)) & 0xFFFFFFFF
        s = s - 2**32 if s >= 2**31 else s
        want.append(np.float32(libm.expf(ai)) + np.float32(s) + np.float32(0.5))
    np.testing.assert_array_equal(out, np.array(want, dtype=np.float32))


def five_way_sum() -> list[Item]:
    """out[i] = a[i] + b[i] + c[i] + d[i] + e[i]: 8 arguments, so core_start/core_end arrive on the stack."""
    args = [arg_vreg(k, 100 + k) for k in range(6)]
    ptrs = [G(k) for k in range(1, 7)]
    i, end, acc = G(10), G(11), V(12, 16)
    items: list[Item] = [ins(O.MOV, p, a) for p, a in zip(ptrs, args)]
    items += [ins(O.MOVSXD, i, IncomingStackArg(6, 4)), ins(O.MOVSXD, end, IncomingStackArg(7, 4))]
    items += [LoopBegin(), Label("loop"), ins(O.CMP, i, end), ins(O.JGE, Label("done")),
              ins(O.VMOVSS, acc, Mem(ptrs[1], i, 4))]  # fmt: skip
    items += [ins(O.VADDSS, acc, acc, Mem(p, i, 4)) for p in ptrs[2:]]
    items += [ins(O.VMOVSS, Mem(ptrs[0], i, 4), acc), ins(O.INC, i), ins(O.JMP, Label("loop")), LoopEnd()]
    return items + [Label("done"), ins(O.RET)]


def test_stack_passed_arguments(tmp_path: Path) -> None:
    fn = link(tmp_path, "five_way", five_way_sum(), [P] * 6 + [I32, I32])
    n = 29
    rng = np.random.default_rng(5)
    srcs = [rng.standard_normal(n, dtype=np.float32) for _ in range(5)]
    out = np.zeros(n, dtype=np.float32)
    for start, end in slices(n, 3):
        fn(ptr(out), *map(ptr, srcs), start, end)
    want = srcs[0] + srcs[1] + srcs[2] + srcs[3] + srcs[4]
    np.testing.assert_array_equal(out, want)


GOLDEN = Path(__file__).parent / "golden" / "x86"


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("elementwise_add", elementwise_add),
        ("row_sum", row_sum),
        ("division_shift_call", lambda: fixed_constraints(ConstPool())),
    ],
)
def test_golden_listing(name: str, build: Callable[[], list[Item]]) -> None:
    """The allocated, encoded listing of the hand-built kernels, reviewed by a person whenever it changes.

    Regenerate with SPECK_UPDATE_GOLDEN=1 after checking the new code is intended (it is also checked against objdump
    by the tests above).
    """
    listing = assemble(allocate_function(build()).items).listing
    path = GOLDEN / f"{name}.lst"
    if os.environ.get("SPECK_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(listing)
    assert path.exists(), f"missing golden file {path}; create it with SPECK_UPDATE_GOLDEN=1 and review it"
    assert listing == path.read_text()
