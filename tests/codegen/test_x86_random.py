"""Random integer programs on virtual registers, run natively and in a Python model of the same instructions.

Each program loads K values, runs a loop body of random ALU / shift / multiply / divide / compare-and-move / lea
instructions a given number of times (so values are carried around the back edge, and with K large enough, spilled),
then stores all K values. It goes through the whole backend (allocation with fixed registers for idiv and shifts by
cl, encoding, ELF, gcc link) and every result must match the model bit for bit.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.regalloc import VReg
from speck.codegen.x86.alloc import Item, LoopBegin, LoopEnd, build_object
from speck.codegen.x86.operands import Imm, Inst, Label, Mem
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.regs import arg_vreg

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to link the object for ctypes")

M64 = (1 << 64) - 1


def s64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def G(i: int, size: int = 8) -> VReg:
    return VReg(i, "gpr", size)


Model = Callable[[list[int]], None]


def random_body(rnd: random.Random, k: int, fresh: Callable[[], int]) -> tuple[list[Item], list[Model]]:
    """Random instructions over values 0..k-1 (vreg ids 1..k) and, for each, its effect on a Python list."""
    items: list[Item] = []
    model: list[Model] = []
    for _ in range(rnd.randint(1, 14)):
        d, s = rnd.randrange(k), rnd.randrange(k)
        vd, vs = G(d + 1), G(s + 1)
        kind = rnd.choice(["alu", "alu32", "imul", "imul3", "shift", "shift_cl", "unary", "imm", "movabs", "lea",
                           "cmov", "idiv"])  # fmt: skip
        if kind == "alu":
            op, fn = rnd.choice([(O.ADD, lambda a, b: a + b), (O.SUB, lambda a, b: a - b), (O.XOR, lambda a, b: a ^ b),
                                 (O.AND, lambda a, b: a & b), (O.OR, lambda a, b: a | b)])  # fmt: skip
            items.append(Inst(op, (vd, vs)))
            model.append(lambda v, d=d, s=s, fn=fn: v.__setitem__(d, s64(fn(v[d], v[s]))))
        elif kind == "alu32":  # 32-bit ops zero-extend into the full register
            items.append(Inst(O.ADD, (vd.sized(4), vs.sized(4))))
            model.append(lambda v, d=d, s=s: v.__setitem__(d, (v[d] + v[s]) & 0xFFFFFFFF))
        elif kind == "imul":
            items.append(Inst(O.IMUL, (vd, vs)))
            model.append(lambda v, d=d, s=s: v.__setitem__(d, s64(v[d] * v[s])))
        elif kind == "imul3":
            c = rnd.choice([rnd.randint(-128, 127), rnd.randint(-(2**31), 2**31 - 1)])
            items.append(Inst(O.IMUL, (vd, vs, Imm(c))))
            model.append(lambda v, d=d, s=s, c=c: v.__setitem__(d, s64(v[s] * c)))
        elif kind == "shift":
            c = rnd.randrange(64)
            op, fn = rnd.choice([(O.SHL, lambda a, c: a << c), (O.SHR, lambda a, c: (a & M64) >> c),
                                 (O.SAR, lambda a, c: a >> c)])  # fmt: skip
            items.append(Inst(op, (vd, Imm(c))))
            model.append(lambda v, d=d, c=c, fn=fn: v.__setitem__(d, s64(fn(v[d], c))))
        elif kind == "shift_cl":
            cnt = VReg(fresh(), "gpr", 8, "rcx")
            items += [Inst(O.MOV, (cnt, vs)), Inst(O.SAR, (vd, cnt.sized(1)))]
            model.append(lambda v, d=d, s=s: v.__setitem__(d, v[d] >> (v[s] & 63)))
        elif kind == "unary":
            op, fn = rnd.choice([(O.NEG, lambda a: -a), (O.NOT, lambda a: ~a), (O.INC, lambda a: a + 1)])
            items.append(Inst(op, (vd,)))
            model.append(lambda v, d=d, fn=fn: v.__setitem__(d, s64(fn(v[d]))))
        elif kind == "imm":
            c = rnd.randint(-(2**31), 2**31 - 1)
            items.append(Inst(O.MOV, (vd, Imm(c))))
            model.append(lambda v, d=d, c=c: v.__setitem__(d, c))
        elif kind == "movabs":
            c = rnd.randint(-(2**63), 2**63 - 1)
            items.append(Inst(O.MOVABS, (vd, Imm(c))))
            model.append(lambda v, d=d, c=c: v.__setitem__(d, c))
        elif kind == "lea":
            b, scale, disp = rnd.randrange(k), rnd.choice([1, 2, 4, 8]), rnd.randint(-(2**31), 2**31 - 1)
            items.append(Inst(O.LEA, (vd, Mem(G(b + 1), vs, scale, disp))))
            model.append(lambda v, d=d, s=s, b=b, sc=scale, c=disp: v.__setitem__(d, s64(v[b] + v[s] * sc + c)))
        elif kind == "cmov":  # d = s if v[b] < v[s] (signed) else d
            b = rnd.randrange(k)
            items += [Inst(O.CMP, (G(b + 1), vs)), Inst(O.CMOVL, (vd, vs))]
            model.append(lambda v, d=d, s=s, b=b: v.__setitem__(d, v[s] if v[b] < v[s] else v[d]))
        else:  # signed division by a constant through rax/rdx
            c = rnd.choice([3, 7, -5, 1 << 20, 255])
            num, hi = VReg(fresh(), "gpr", 8, "rax"), VReg(fresh(), "gpr", 8, "rdx")
            q, r, div = VReg(fresh(), "gpr", 8, "rax"), VReg(fresh(), "gpr", 8, "rdx"), G(fresh())
            items += [
                Inst(O.MOV, (num, vs)), Inst(O.CQO, implicit_uses=(num,), implicit_defs=(hi,)),
                Inst(O.MOV, (div, Imm(c))), Inst(O.IDIV, (div,), implicit_uses=(num, hi), implicit_defs=(q, r)),
                Inst(O.MOV, (vd, q if rnd.random() < 0.5 else r)),
            ]  # fmt: skip
            wants_q = items[-1].operands[1] is q

            def divide(v: list[int], d: int = d, s: int = s, c: int = c, wants_q: bool = wants_q) -> None:
                quot = abs(v[s]) // abs(c) * (1 if (v[s] >= 0) == (c > 0) else -1)  # C truncating division
                v[d] = quot if wants_q else v[s] - quot * c

            model.append(divide)
    return items, model


def build(seed: int) -> tuple[list[Item], list[Model], int]:
    rnd = random.Random(seed)
    k = rnd.choice([3, 8, 20])  # 20 values force spills (13 allocatable registers, 15 without spills)
    counter = [1000]

    def fresh() -> int:
        counter[0] += 1
        return counter[0]

    out, inp, n, t = G(900), G(901), G(902), G(903)
    items: list[Item] = [Inst(O.MOV, (out, arg_vreg(0, 910))), Inst(O.MOV, (inp, arg_vreg(1, 911))),
                         Inst(O.MOVSXD, (n, arg_vreg(2, 912, 4)))]  # fmt: skip
    items += [Inst(O.MOV, (G(j + 1), Mem(inp, disp=8 * j))) for j in range(k)]
    body, model = random_body(rnd, k, fresh)
    items += [Inst(O.XOR, (t, t)), LoopBegin(), Label("top"), Inst(O.CMP, (t, n)), Inst(O.JGE, (Label("end"),))]
    items += body + [Inst(O.INC, (t,)), Inst(O.JMP, (Label("top"),)), LoopEnd(), Label("end")]
    items += [Inst(O.MOV, (Mem(out, disp=8 * j), G(j + 1))) for j in range(k)] + [Inst(O.RET)]
    return items, model, k


@settings(max_examples=max(5, settings.default.max_examples // 3))
@given(seed=st.integers(0, 2**64 - 1), iters=st.integers(0, 3))
def test_random_program_matches_model(tmp_path_factory: pytest.TempPathFactory, seed: int, iters: int) -> None:
    items, model, k = build(seed)
    obj, _asm = build_object("prog", items)
    tmp: Path = tmp_path_factory.mktemp("prog")
    (tmp / "prog.o").write_bytes(obj)
    subprocess.run(["gcc", "-shared", "-o", str(tmp / "prog.so"), str(tmp / "prog.o")], check=True)
    fn = ctypes.CDLL(str(tmp / "prog.so")).prog
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32], None
    rnd = random.Random(seed ^ 0x5EED)
    values = [rnd.choice([0, 1, -1, 2**63 - 1, -(2**63), rnd.randint(-(2**63), 2**63 - 1)]) for _ in range(k)]
    inp = np.array(values, dtype=np.int64)
    out = np.zeros(k, dtype=np.int64)
    fn(out.ctypes.data, inp.ctypes.data, iters)
    for _ in range(iters):
        for step in model:
            step(values)
    assert out.tolist() == values
