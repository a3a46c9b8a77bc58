"""x86-64 instruction selection: a legalized linear program -> `Inst`s on virtual registers (+ labels, loop markers).

Selection walks the program in order and looks each UOp up in `SELECTION_TABLE` by (op, operand class); the entry
names the rule that emits its instructions. This module holds the `Selector` (registers, constants, operands), the
control flow (RANGE/END) and memory rules (INDEX/LOAD/STORE, gated accesses); the ALU rules are functions of
(selector, uop) in modules by operand family, each with its opcode tables: select_int.py (scalar ints and bools),
select_float.py (scalar floats), select_cast.py (CAST/BITCAST), select_vector.py (float32 vectors), select_mask.py
(bool lane masks) and select_zmm.py (AVX-512). A UOp with no entry raises SelectionError (an X86UnsupportedError,
so an UnsupportedOpError) naming the op, the dtype and the kernel.

Value conventions (what every rule may assume about its sources and must guarantee for its result):
- integers and bools live in general-purpose registers. A value of 1, 2 or 4 bytes is held in the low 32 bits,
  sign-extended (signed types) or zero-extended (unsigned, bool = 0/1) to 32 bits, with the upper 32 bits zero; so
  32-bit compare/divide/shift work unchanged on narrow types and a non-negative index is already a valid 64-bit
  index. 8-byte values use the whole register. Pointers are 64-bit.
- float32/float64 scalars live in the low lane of an xmm register; float32 vectors in xmm/ymm registers (class
  "vec"), 16-lane ones (AVX-512) in zmm16..31 (class "zvec", select_zmm.py); bool vectors as lane masks alike.
- literals appear only as casted consts and are never computed: they become imm8/imm32 operands where an
  instruction form takes one (int64 fitting int32 -> imm32, uint64 fitting uint32 -> imm32, else MOVABS into a
  register), float literals are RIP-relative .rodata operands; RANGE bounds are immediates.
- the CPU ABI: `kernel(ptr data0.., int32 vars.., int32 core_start, int32 core_end)`; the outermost GLOBAL range
  loops core_start..core_end, other ranges 0..end.
Exact semantics follow the reference interpreter (speck.codegen.numeric): integer ops wrap, x/0 == x%0 == 0 and
MIN/-1 wraps (no trap), out-of-range shifts give 0 (-1 for >> of a negative), MAX propagates NaN, float -> int
truncates and wraps modulo 2**64 (NaN/inf -> 0), int64 -> float32 rounds through float64.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speck.codegen.errors import ProgramFormError, SelectionError
from speck.codegen.regalloc import VReg
from speck.codegen.renderer.common import kernel_signature
from speck.codegen.x86 import select_cast as sc
from speck.codegen.x86 import select_float as sf
from speck.codegen.x86 import select_int as si
from speck.codegen.x86 import select_mask as sm
from speck.codegen.x86 import select_vector as sv
from speck.codegen.x86 import select_zmm as sz
from speck.codegen.x86.alloc import Item, LoopBegin, LoopEnd
from speck.codegen.x86.elf_object import ConstPool
from speck.codegen.x86.operands import RSP, Imm, IncomingStackArg, Inst, Label, Mem, Operand, plain_inst, rodata
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.peephole import fold_copies
from speck.codegen.x86.regs import arg_vreg
from speck.codegen.x86.select_common import FLOAT_OPS, is_cconst, mem_at, osize, vec_bytes
from speck.uop import AddrSpace, DType, GroupOp, Ops, PtrDType, UOp, cast_value, dtypes

# the scratch slot of gated accesses: in the System V red zone below rsp (kernels are leaf functions, the allocator
# keeps its spill slots at non-negative rsp offsets, so nothing else ever uses these bytes)
SCRATCH = Mem(RSP, disp=-64)

# ops tested per UOp, as module constants: in Python 3.11 each `Ops.X` / `O.X` goes through the enum metaclass's
# __getattr__ hook, several times the cost of reading a global
_ADD, _MUL, _SUB, _LOAD, _STORE, _STACK, _GEP, _INDEX, _WHERE = (
    Ops.ADD, Ops.MUL, Ops.SUB, Ops.LOAD, Ops.STORE, Ops.STACK, Ops.GEP, Ops.INDEX, Ops.WHERE)  # fmt: skip
_MOV, _VMOVAPS = O.MOV, O.VMOVAPS

MEM_FORM_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.AND, Ops.OR, Ops.XOR})
"""Ops whose second source may be a memory operand (integer ALU r, r/m; VEX float op x, x, x/m)."""


def op_class(u: UOp) -> str:
    """The operand class a selection rule is keyed on: int, bool, float, or none (non-value ops)."""
    dt = u.src[0].dtype if u.op in GroupOp.Comparison else (u.src[1].dtype if u.op is _WHERE else u.dtype)
    cls = _CLASS_OF.get(dt)
    if cls is None:
        cls = _CLASS_OF[dt] = _dtype_class(dt)
    return cls


_CLASS_OF: dict[DType, str] = {}  # DTypes are interned and immutable: classify each one once


def _dtype_class(dt: DType) -> str:
    if isinstance(dt, PtrDType) or dt == dtypes.void:
        return "none"
    s = dt.scalar()
    if dt.count > 1:
        if dt.count > 8 and s in (dtypes.float32, dtypes.bool):  # AVX-512: a zmm register
            return "zvec" if s == dtypes.float32 else "kvec"
        return "fvec" if s == dtypes.float32 else "bvec" if s == dtypes.bool else "vec"
    return "bool" if s == dtypes.bool else "float" if dtypes.is_float(s) else "int"


@dataclass
class _Loop:
    counter: VReg
    end: Operand
    head: Label
    exit: Label
    size: int


_MISSING = object()
# op sets are frozensets, never tuples: Ops hash by identity, but `==` between two different members goes through
# Python-level comparison slots, so a tuple membership test costs a few hundred ns per element
_ARGUMENTS = frozenset({Ops.PARAM, Ops.DEFINE_VAR})  # selected up front, as the function's arguments
_NOT_COMMUTATIVE = frozenset({Ops.SUB, Ops.FDIV})
_BARRIERS = frozenset({Ops.STORE, Ops.RANGE, Ops.END})  # a load read later as a memory operand may not cross these


def _barrier(u: UOp) -> bool:
    """A store to memory or a loop boundary (stores to accumulator registers touch no memory)."""
    if u.op is _STORE:
        buf = u.src[0].src[0].dtype
        return not (isinstance(buf, PtrDType) and buf.addrspace is AddrSpace.REG)
    return u.op in _BARRIERS


_VECTOR_SCALARS = frozenset({dtypes.float32, dtypes.bool})  # the dtypes whose vectors have vector registers
_USERS_ASKED = frozenset(
    {Ops.ADD, Ops.LOAD, Ops.MUL, Ops.STACK, *GroupOp.Comparison}
)  # the UOps whose users selection asks about


class Selector:
    """Selects one kernel. `run()` returns the instruction list (ending in RET) and the .rodata bytes."""

    def __init__(self, uops: list[UOp], kernel: str, fp_contract: bool = False) -> None:
        self.uops, self.kernel = uops, kernel
        self.items: list[Item] = []
        self.val: dict[UOp, VReg] = {}
        self.pool = ConstPool()
        self.nid = 0
        self.nlabel = 0
        self.slots: dict[tuple[UOp, int], VReg] = {}
        self.slot_count: dict[tuple[UOp, int], int] = {}
        self.loops: dict[UOp, _Loop] = {}
        # one walk gives each UOp's position and last use, and the users of the ADDs and LOADs (the only users asked
        # for: whether an ADD folds into addresses, whether a LOAD folds into its user as a memory operand)
        self.pos: dict[UOp, int] = {}
        self.last_use: dict[UOp, int] = {}
        users: dict[UOp, list[UOp]] = {}
        adds: list[UOp] = []
        self.loads: list[UOp] = []  # (the passes below look at these ops only)
        self.stacks: list[UOp] = []
        of_op = {_ADD: adds, _LOAD: self.loads, _STACK: self.stacks}
        for i, u in enumerate(uops):
            self.pos[u] = i
            if (bucket := of_op.get(u.op)) is not None:
                bucket.append(u)
            for s in u.src:
                self.last_use[s] = i
                if s.op in _USERS_ASKED:
                    users.setdefault(s, []).append(u)
        self.outer: UOp | None = None  # the RANGE sliced across cores (known once run() reads the signature)
        # ADD(x, const) used only as global indices: folded into the addressing mode's displacement
        self.folded = {u for u in adds if dtypes.is_int(u.dtype) and is_cconst(u.src[1])
                       and users.get(u) and all(x.op is _INDEX and x.src[1] is u and x.src[0] is not u
                       and isinstance(x.src[0].dtype, PtrDType) and x.src[0].dtype.addrspace is not AddrSpace.REG
                       for x in users[u])}  # fmt: skip
        # ADD(acc, MUL(b, c)) -> acc + b*c in one FMA (rounded once) when fp_contract allows it: ADD -> (acc, MUL)
        self.fma: dict[UOp, tuple[UOp, UOp]] = self._fusable_adds(adds, users) if fp_contract else {}
        self.fused_muls = {m for _, m in self.fma.values()}
        self.mem_operands = self._foldable_loads(users)
        self.bcast_loads = self._broadcast_loads(users)
        self.bcast_stacks = self._embedded_broadcasts(users)
        self.kfused = sz.fused_compares(uops, users)  # 16-lane compares selected at their WHERE (into k1)
        self.entry = 0  # where loop-invariant zmm constants go (after the arguments are read), see reg
        self.hoisted: dict[UOp, VReg] = {}
        self.core: tuple[VReg, VReg] | None = None
        self.consts: dict[UOp, Any] = {}
        self.stores_at: dict[tuple[UOp, ...], list[int]] | None = None  # see next_store
        self.views: dict[tuple[int, int], VReg] = {}  # see at_size

    def _fusable_adds(self, adds: list[UOp], users: dict[UOp, list[UOp]]) -> dict[UOp, tuple[UOp, UOp]]:
        """Float ADDs one of whose operands is a MUL used only there (float32/float64 scalars, float32 vectors of a
        whole register): the MUL is not selected, the ADD becomes a vfmadd231 of the MUL's operands."""
        out: dict[UOp, tuple[UOp, UOp]] = {}
        for u in adds:
            if not dtypes.is_float(u.dtype) or (u.dtype.count > 1 and u.dtype.count not in (4, 8, 16)):
                continue
            for m, acc in ((u.src[1], u.src[0]), (u.src[0], u.src[1])):
                if m.op is _MUL and m is not acc and users.get(m) == [u] and m not in out:
                    out[u] = (acc, m)
                    break
        return out

    def _broadcast_loads(self, users: dict[UOp, list[UOp]]) -> set[UOp]:
        """Global, ungated float32 vector LOADs read only lane by lane (GEPs repeating one lane: the expander's
        broadcasts of a short-span load): never loaded whole, each GEP reads its lane from memory (vbroadcastss /
        vmovss), with no store, loop boundary or other effect between the load and that GEP."""
        out: set[UOp] = set()
        for u in self.loads:
            if u.dtype.count == 1 or len(u.src) != 1 or len(u.src[0].src) != 2:
                continue
            buf = u.src[0].src[0]
            if u.dtype.scalar() != dtypes.float32:
                continue
            if not isinstance(buf.dtype, PtrDType) or buf.dtype.addrspace is AddrSpace.REG:
                continue
            us = users.get(u, [])
            if not us or not all(g.op is _GEP and len(set(g.arg)) == 1 for g in us):
                continue
            lo = self.pos[u]
            if any(_barrier(x) for x in self.uops[lo + 1 : max(self.pos[g] for g in us)]):
                continue
            out.add(u)
        return out

    def _embedded_broadcasts(self, users: dict[UOp, list[UOp]]) -> set[UOp]:
        """16-lane STACKs repeating one global, ungated float32 LOAD read only there, whose users are all 16-lane
        MULs (fused into an FMA or not): each MUL reads the element as an AVX-512 embedded broadcast
        (`vfmadd231ps zmm, zmm, DWORD BCST [..]`), so neither the load nor the broadcast is an instruction of its own;
        no store, loop boundary or other effect lies between the load and the last of those reads."""
        out: set[UOp] = set()
        for u in self.stacks:
            if u.dtype != dtypes.float32.vec(16) or any(x is not u.src[0] for x in u.src):
                continue
            ld = u.src[0]
            if ld.op is not _LOAD or len(ld.src) != 1 or len(ld.src[0].src) != 2 or ld.dtype != dtypes.float32:
                continue
            buf = ld.src[0].src[0].dtype
            if not isinstance(buf, PtrDType) or buf.addrspace is AddrSpace.REG or set(users.get(ld, [])) != {u}:
                continue
            us = set(users.get(u, []))
            if not us or any(m.op is not _MUL or m.src[0] is m.src[1] for m in us):
                continue
            # the MUL's other operand must be a register: an instruction has one r/m operand
            if any((m.src[1] if m.src[0] is u else m.src[0]) in self.mem_operands | out for m in us):
                continue
            last = max(max(self.pos[a] for a in users[m]) if m in self.fused_muls else self.pos[m] for m in us)
            if any(_barrier(x) for x in self.uops[self.pos[ld] + 1 : last]):
                continue
            out.add(u)
        return out

    def bcast_operand(self, u: UOp) -> Mem:
        """The memory operand of an embedded-broadcast STACK (see _embedded_broadcasts): its element, {1to16}."""
        m = self.address(u.src[0].src[0])
        return Mem(m.base, m.index, m.scale, m.disp, None, m.symbol, True)

    def _foldable_loads(self, users: dict[UOp, list[UOp]]) -> set[UOp]:
        """Global, ungated LOADs whose only user is a two-operand ALU op that can read them as its memory operand
        (`add eax, DWORD PTR [..]`, `vaddps ymm0, ymm1, YMMWORD PTR [..]`), with no store, loop boundary or other
        effect between the load and that op (so reading later reads the same value)."""
        out: set[UOp] = set()
        taken: set[UOp] = set()  # users that already read one load from memory (an instruction has one r/m operand)
        for u in self.loads:
            if len(u.src) != 1 or len(idx_src := u.src[0].src) != 2:
                continue
            if not isinstance(idx_src[0].dtype, PtrDType) or idx_src[0].dtype.addrspace is AddrSpace.REG:
                continue
            us = users.get(u, [])
            if len(us) != 1 or us[0].op not in MEM_FORM_OPS or u not in us[0].src[:2] or us[0].src[0] is us[0].src[1]:
                continue
            if us[0] in self.fma:  # a fused ADD reads its accumulator from a register
                continue
            dt = u.dtype
            if dt.count > 1:
                ok = dt.scalar() == dtypes.float32 and dt.count in (4, 8, 16)
            else:
                ok = dt.itemsize in (4, 8) and dt != dtypes.bool
            if us[0].op is Ops.MUL and dtypes.is_int(dt):
                ok = False  # imul's memory form works, but the immediate form is the common one; keep it simple
            other = us[0].src[1] if u is us[0].src[0] else us[0].src[0]
            if not ok or is_cconst(other) or (u is us[0].src[0] and us[0].op in _NOT_COMMUTATIVE):
                continue  # (an immediate or literal operand wins the r/m slot)
            lo, hi = self.pos[u], self.pos[us[0]]
            if us[0] in self.fused_muls:  # read by the FMA at its ADD
                hi = max(self.pos[a] for a in users[us[0]])
            if us[0] in taken or any(_barrier(x) for x in self.uops[lo + 1 : hi]):
                continue
            out.add(u)
            taken.add(us[0])
        return out

    def mem_operand(self, u: UOp) -> Mem:
        """The folded address of a LOAD selected as a memory operand, sized to the access."""
        return self.address(u.src[0]).with_size(u.dtype.itemsize * u.dtype.count)

    # ---- small helpers ----------------------------------------------------------------------------------------
    def fail(self, u: UOp, why: str = "") -> SelectionError:
        dt = u.src[0].dtype if u.op in GroupOp.Comparison and u.src else u.dtype
        return SelectionError(
            f"x86 backend: no selection rule for {u.op.name} on {dt} in kernel {self.kernel!r}"
            + (f" ({why})" if why else "")
            + "; run it on the CPU (LLVM) device or add a rule to speck.codegen.x86.select.SELECTION_TABLE",
            u.op,
            dt,
        )

    def gpr(self) -> VReg:
        self.nid += 1
        return VReg(self.nid, "gpr", 8)

    def pinned(self, phys: str) -> VReg:
        """A fresh 64-bit register the allocator places in `phys` (rax/rdx around a division, rcx for a shift count)."""
        self.nid += 1
        return VReg(self.nid, "gpr", 8, phys)

    def vec(self, size: int = 16) -> VReg:
        """A fresh vector register: xmm/ymm of class "vec", or a zmm (size 64) of the AVX-512 class "zvec"."""
        self.nid += 1
        return VReg(self.nid, "zvec" if size == 64 else "vec", size)

    def label(self) -> Label:
        self.nlabel += 1
        return Label(f".L{self.nlabel}")

    def emit(self, op: O, *operands: Operand, **kw: object) -> None:
        self.items.append(Inst(op, operands, **kw) if kw else plain_inst(op, operands))  # type: ignore[arg-type]

    def const_value(self, u: UOp) -> Any:
        """The exact value of a casted const in its dtype (wrapped/rounded as the CAST defines)."""
        # a literal is asked for at each of its uses (an index stride, a loop bound): convert it once
        v = self.consts.get(u, _MISSING)
        if v is _MISSING:
            v = self.consts[u] = cast_value(u.src[0].arg, u.dtype.scalar())
        return v

    def int_bits(self, u: UOp) -> int:
        """A casted int/bool const as the bits of its register (narrow types extended, see the module docstring)."""
        return int(self.const_value(u))

    def imm(self, u: UOp, size: int) -> Imm | None:
        """u as an immediate for a `size`-byte operation, when it is a casted const that fits the instruction's imm32
        (sign-extended to 64 bits for 8-byte operations)."""
        if not is_cconst(u) or dtypes.is_float(u.dtype):
            return None
        v = self.int_bits(u)
        if size == 8:
            if u.dtype.scalar() == dtypes.uint64 and v >= 2**63:
                v -= 2**64
            return Imm(v) if -(2**31) <= v < 2**31 else None
        return Imm(v) if -(2**31) <= v < 2**32 else None

    def fconst(self, u: UOp) -> Mem:
        """A float casted const as a RIP-relative .rodata operand."""
        s = u.dtype.scalar()
        v = float(self.const_value(u))
        raw = struct.pack("<f" if s == dtypes.float32 else "<d", v)
        return rodata(self.pool.add(raw, s.itemsize), s.itemsize)

    def rconst(self, fmt: str, *vals: object, align: int = 16) -> Mem:
        raw = struct.pack(fmt, *vals)
        return rodata(self.pool.add(raw, align), len(raw))

    def reg(self, u: UOp) -> VReg:
        """u's value in a register (casted consts are materialised into a fresh one at each use; a zmm literal once,
        before any loop)."""
        known = self.val.get(u)
        if known is not None:
            return known
        if is_cconst(u):
            if u.dtype.count > 1:  # a vector literal with one value (legalize's 1.0 of a vector RECIPROCAL)
                if u.dtype.scalar() != dtypes.float32:
                    raise self.fail(u, "only float32 vectors have vector registers")
                d = self.hoisted.get(u) or self.vec(vec_bytes(u.dtype.count))
                if d.size == 64 and u not in self.hoisted:  # (zmm: 14 registers of its own) once, at the entry
                    self.items.insert(self.entry, Inst(O.VBROADCASTSS, (d, self.fconst(u))))
                    self.hoisted[u] = d
                elif d.size < 64:
                    self.emit(O.VBROADCASTSS, d, self.fconst(u))
                return d
            if dtypes.is_float(u.dtype):
                d = self.vec()
                self.emit(FLOAT_OPS[("mov", u.dtype.itemsize)], d, self.fconst(u))
                return d
            d = self.gpr()
            v = self.int_bits(u)
            if v == 0:
                self.emit(O.XOR, d.sized(4), d.sized(4))
            elif -(2**31) <= v < 2**32 and (u.dtype.itemsize < 8 or 0 <= v < 2**32):
                self.emit(O.MOV, d.sized(4), Imm(v))
            elif -(2**31) <= v < 2**31:
                self.emit(O.MOV, d, Imm(v))
            else:
                self.emit(O.MOVABS, d, Imm(v))
            return d
        raise ProgramFormError(f"x86 backend: {u.op.name} ({u.dtype}) is used before it is defined in kernel "
                               f"{self.kernel!r}; the program is not in linear order")  # fmt: skip

    def ioperand(self, u: UOp, size: int) -> Operand:
        """u as the source operand of an integer op: an immediate when possible, else a register."""
        i = self.imm(u, size)
        return i if i is not None else self.at_size(self.reg(u), size)

    def at_size(self, v: VReg, size: int) -> VReg:
        """v used at `size` bytes. Selection asks for the same few views of each value over and over (the 64-bit
        copy, the 32-bit operand): v itself when it already has that width, else one VReg per (value, width)."""
        if v.size == size:
            return v
        view = self.views.get((v.id, size))
        if view is None:
            view = self.views[(v.id, size)] = v.sized(size)
        return view

    def copy(self, dst: VReg, src: VReg) -> None:
        if dst.cls != "gpr":
            self.emit(_VMOVAPS, dst, self.at_size(src, dst.size))
        else:
            self.emit(_MOV, self.at_size(dst, 8), self.at_size(src, 8))

    def extend(self, d: VReg, dt: DType) -> None:
        """Re-establish the register convention of a narrow integer after a 32-bit op (sign/zero-extend)."""
        s = dt.scalar()
        if s.itemsize in (1, 2):
            op = O.MOVZX if dtypes.is_unsigned(s) or s == dtypes.bool else O.MOVSX
            self.emit(op, d.sized(4), d.sized(s.itemsize))

    def setcc(self, cc: O) -> VReg:
        d = self.gpr()
        self.emit(cc, d.sized(1))
        self.emit(O.MOVZX, d.sized(4), d.sized(1))
        return d

    # ---- driver -------------------------------------------------------------------------------------------------
    def run(self) -> tuple[list[Item], bytes]:
        """Select the whole kernel."""
        sig = kernel_signature(self.uops, "x86")
        self.outer = sig.sliced
        nargs = len(sig.buffers) + len(sig.variables) + 2
        args: list[VReg] = []
        for k in range(nargs):
            is_ptr = k < len(sig.buffers)
            d = self.gpr()
            if k < 6:
                a = arg_vreg(k, 1_000_000 + k)
                self.emit(O.MOV, d if is_ptr else d.sized(4), a if is_ptr else a.sized(4))
            else:
                self.emit(O.MOV, d if is_ptr else d.sized(4), IncomingStackArg(k, 8 if is_ptr else 4))
            args.append(d)
        for b, a in zip(sig.buffers, args):
            self.val[b] = a
        for v, a in zip(sig.variables, args[len(sig.buffers) :]):
            self.val[v] = a
        self.core = (args[-2], args[-1])
        self.entry = len(self.items)
        skipped = self.folded | self.fused_muls | self.bcast_loads | self.bcast_stacks | self.kfused
        skipped |= {x.src[0] for x in self.bcast_stacks}
        for u in self.uops:
            if (u.op in _ARGUMENTS and u in self.val) or u in skipped:
                continue
            rule = SELECTION_TABLE.get((u.op, op_class(u)))
            if rule is None:
                raise self.fail(u)
            rule(self, u)
        return fold_copies(self.items), bytes(self.pool.data)

    # ---- structure ------------------------------------------------------------------------------------------------
    def sel_nothing(self, u: UOp) -> None:
        """CONST, casted consts (materialised at their uses), DEFINE_REG, NOOP: no code."""

    def sel_sink(self, u: UOp) -> None:
        self.emit(O.RET)

    def sel_range(self, u: UOp) -> None:
        size = osize(u.dtype)
        i = self.gpr()
        end: Operand
        if u is self.outer:
            assert self.core is not None
            start, end_r = self.core
            if size == 8:
                self.emit(O.MOVSXD, i, start.sized(4))
                e = self.gpr()
                self.emit(O.MOVSXD, e, end_r.sized(4))
                end = e
            else:
                self.emit(O.MOV, i.sized(4), start.sized(4))
                end = end_r.sized(4)
        else:
            self.emit(O.XOR, i.sized(4), i.sized(4))
            end = self.ioperand(u.src[0], size)
        loop = _Loop(i, end, self.label(), self.label(), size)
        self.loops[u] = loop
        self.val[u] = i
        self.emit(O.CMP, i.sized(size), end)
        self.emit(O.JGE, loop.exit)
        self.items.append(LoopBegin())
        self.items.append(loop.head)

    def sel_end(self, u: UOp) -> None:
        r = u.src[-1]
        loop = self.loops[r]
        self.emit(O.ADD, loop.counter.sized(loop.size), Imm(1))
        self.emit(O.CMP, loop.counter.sized(loop.size), loop.end)
        self.emit(O.JL, loop.head)
        self.items.append(LoopEnd())
        self.items.append(loop.exit)

    # ---- memory -------------------------------------------------------------------------------------------------
    def address(self, idx: UOp) -> Mem:
        """The folded address [base + index*scale + disp] of a global INDEX."""
        buf, i = idx.src[0], idx.src[1]
        assert isinstance(buf.dtype, PtrDType)
        scale = buf.dtype.base.itemsize
        base = self.reg(buf)
        if is_cconst(i):
            disp = self.int_bits(i) * scale
            if -(2**31) <= disp < 2**31:
                return Mem(base, disp=disp)
        disp = 0
        if i in self.folded:
            d = self.int_bits(i.src[1]) * scale
            if -(2**31) <= d < 2**31:
                i, disp = i.src[0], d
            elif i not in self.val:  # the displacement does not fit: compute the index after all
                si.sel_int_binary(self, i)
        x = self.reg(i)
        if i.dtype.itemsize < 8 and not _nonneg(i):
            t = self.gpr()
            self.emit(O.MOVSXD, t, x.sized(4))
            x = t
        if scale in (1, 2, 4, 8):
            return Mem(base, x.sized(8), scale, disp)
        t = self.gpr()
        self.emit(O.IMUL, t, x.sized(8), Imm(scale))
        return Mem(base, t, 1, disp)

    def gated_address(self, idx: UOp, alt: UOp | None, dt: DType | None) -> Mem:
        """The address of a gated INDEX: the real one when the gate holds, else the scratch slot (which a load first
        fills with its alternative value, so the load itself yields it)."""
        gate = idx.src[2]
        mem = self.address(idx)
        if is_cconst(gate) and self.const_value(gate):
            return mem
        if dt is not None:  # a load: the scratch slot holds the value it reads when gated off
            self.store_value(SCRATCH, alt, dt)
        if is_cconst(gate):
            return SCRATCH
        p, s = self.gpr(), self.gpr()
        self.emit(O.LEA, p, mem)
        self.emit(O.LEA, s, SCRATCH)
        g = self.reg(gate)
        self.emit(O.TEST, g.sized(4), g.sized(4))
        self.emit(O.CMOVE, p, s)
        return Mem(p)

    def store_value(self, mem: Mem, v: UOp | None, dt: DType) -> None:
        """Store v (None: zero) of dtype dt to mem (a float32 vector stores its lanes contiguously)."""
        s = dt.scalar()
        if dt.count > 1:
            if v is None:
                r = self.vec(vec_bytes(dt.count))
                self.emit(O.VPXORD if r.size == 64 else O.VXORPS, r, r, r)
            else:
                r = sm.mask(self, v) if s == dtypes.bool else self.reg(v)
            if s == dtypes.bool:
                sm.store_mask(self, mem, r, dt.count)
            else:
                self.store_lanes(mem, r, dt.count)
            return
        if v is None or is_cconst(v):
            bits = 0
            if v is not None:
                cv = self.const_value(v)
                if dtypes.is_float(s):
                    fmt = "<f" if s == dtypes.float32 else "<d"
                    bits = int.from_bytes(struct.pack(fmt, float(cv)), "little")
                else:
                    bits = int(cv)
                bits &= (1 << (8 * s.itemsize)) - 1
            if s.itemsize < 8 or bits < 2**31 or bits >= 2**64 - 2**31:
                self.emit(O.MOV, mem.with_size(s.itemsize), Imm(bits - 2**64 if bits >= 2**63 else bits))
                return
            t = self.gpr()
            self.emit(O.MOVABS, t, Imm(bits))
            self.emit(O.MOV, mem.with_size(8), t)
            return
        r = self.reg(v)
        if dtypes.is_float(s):
            self.emit(FLOAT_OPS[("mov", s.itemsize)], mem.with_size(s.itemsize), r)
        else:
            self.emit(O.MOV, mem.with_size(s.itemsize), r.sized(s.itemsize))

    def load_value(self, mem: Mem, dt: DType) -> VReg:
        s = dt.scalar()
        if dt.count > 1:  # float32 vector: count contiguous floats, unaligned; bools: a lane mask
            return sm.load_mask(self, mem, dt.count) if s == dtypes.bool else self.load_lanes(mem, dt.count)
        if dtypes.is_float(s):
            d = self.vec()
            self.emit(FLOAT_OPS[("mov", s.itemsize)], d, mem.with_size(s.itemsize))
            return d
        d = self.gpr()
        if s.itemsize == 8:
            self.emit(O.MOV, d, mem.with_size(8))
        elif s.itemsize == 4:
            self.emit(O.MOV, d.sized(4), mem.with_size(4))
        else:
            op = O.MOVZX if dtypes.is_unsigned(s) or s == dtypes.bool else O.MOVSX
            self.emit(op, d.sized(4), mem.with_size(s.itemsize))
        return d

    def load_lanes(self, mem: Mem, count: int) -> VReg:
        """`count` contiguous float32s from mem into a fresh register, reading exactly those bytes (3, 5, 6 and 7
        lanes are put together from an xmm, a pair and a single)."""
        d = self.vec(vec_bytes(count))
        if count in (4, 8, 16):
            self.emit(O.VMOVUPS, d, mem.with_size(None))
        elif count <= 2:
            self.emit(O.VMOVSS if count == 1 else O.VMOVSD, d, mem.with_size(4 * count))
        elif count == 3:
            self.emit(O.VMOVSD, d, mem.with_size(8))
            self.emit(O.VINSERTPS, d, d, mem_at(mem, 8, 4), Imm(2 << 4))
        else:
            lo = self.vec(16)
            self.emit(O.VMOVUPS, lo, mem.with_size(None))
            hi = self.load_lanes(mem_at(mem, 16, None), count - 4)
            self.emit(O.VINSERTF128, d, lo.sized(32), hi, Imm(1))
        return d

    def store_lanes(self, mem: Mem, r: VReg, count: int) -> None:
        """Store lanes 0..count-1 of r to `count` contiguous float32s at mem, writing exactly those bytes."""
        if count in (4, 8, 16):
            self.emit(O.VMOVUPS, mem.with_size(None), r.sized(vec_bytes(count)))
        elif count <= 2:
            self.emit(O.VMOVSS if count == 1 else O.VMOVSD, mem.with_size(4 * count), r.sized(16))
        elif count == 3:
            self.emit(O.VMOVSD, mem.with_size(8), r.sized(16))
            self.emit(O.VEXTRACTPS, mem_at(mem, 8, 4), r.sized(16), Imm(2))
        else:
            self.emit(O.VMOVUPS, mem.with_size(None), r.sized(16))
            hi = self.vec(16)
            self.emit(O.VEXTRACTF128, hi, r.sized(32), Imm(1))
            self.store_lanes(mem_at(mem, 16, None), hi, count - 4)

    def reg_slot(self, idx: UOp, dt: DType) -> VReg:
        """The virtual register holding the accumulator elements an access of dtype dt at a DEFINE_REG index covers
        (a vector access is one vreg of its width)."""
        acc, i = idx.src[0], idx.src[1]
        if not is_cconst(i):
            raise self.fail(idx, "accumulator registers are indexed by constants only")
        key = (acc, self.int_bits(i))
        if key not in self.slots:
            assert isinstance(acc.dtype, PtrDType)
            self.slots[key] = self.vec(vec_bytes(dt.count)) if dtypes.is_float(dt) or dt.count > 1 else self.gpr()
            self.slot_count[key] = dt.count
        if self.slot_count[key] != dt.count:
            raise self.fail(idx, f"accumulator element {key[1]} accessed with {self.slot_count[key]} and "
                            f"{dt.count} lanes")  # fmt: skip
        return self.slots[key]

    def next_store(self, idx: UOp, after: int) -> int:
        """Position of the first STORE through an INDEX with idx's sources after position `after` (len(uops) if
        none). The stores are indexed once per kernel: scanning ahead at every register read would be quadratic in
        kernels with many accumulators."""
        if self.stores_at is None:
            self.stores_at = {}
            for j, x in enumerate(self.uops):
                if x.op is _STORE:
                    self.stores_at.setdefault(x.src[0].src, []).append(j)
        where = self.stores_at.get(idx.src, [])
        k = bisect_right(where, after)
        return where[k] if k < len(where) else len(self.uops)

    def sel_index(self, u: UOp) -> None:
        """INDEX is folded into the LOAD/STORE that uses it."""

    def sel_load(self, u: UOp) -> None:
        idx = u.src[0]
        if u in self.mem_operands or u in self.bcast_loads:  # read by its user(s) from memory
            return
        if u.dtype.count != 1 and u.dtype.scalar() not in _VECTOR_SCALARS:
            raise self.fail(u, "only float32 and bool vectors have vector registers (the renderer declares 1 lane "
                            "for others)")  # fmt: skip
        assert isinstance(idx.src[0].dtype, PtrDType)
        if idx.src[0].dtype.addrspace is AddrSpace.REG:
            slot = self.reg_slot(idx, u.dtype)
            # reading the register directly is safe while no store to it comes before the value's last use
            if self.last_use.get(u, 0) <= self.next_store(idx, self.pos[u]):
                self.val[u] = slot
            else:
                d = self.vec(slot.size) if slot.cls != "gpr" else self.gpr()
                self.copy(d, slot)
                self.val[u] = d
            return
        if len(idx.src) > 2 and u.dtype.count > 8 and not is_cconst(idx.src[2]):  # AVX-512: an opmask gate
            self.val[u] = sz.gated_load(self, self.address(idx), idx.src[2], u.src[1] if len(u.src) > 1 else None)
            return
        if len(idx.src) > 2:
            mem = self.gated_address(idx, u.src[1] if len(u.src) > 1 else None, u.dtype)
        else:
            mem = self.address(idx)
        self.val[u] = self.load_value(mem, u.dtype)

    def sel_store(self, u: UOp) -> None:
        idx, v = u.src[0], u.src[1]
        if v.dtype.count != 1 and v.dtype.scalar() not in _VECTOR_SCALARS:
            raise self.fail(u, "only float32 and bool vectors have vector registers (the renderer declares 1 lane "
                            "for others)")  # fmt: skip
        assert isinstance(idx.src[0].dtype, PtrDType)
        if idx.src[0].dtype.addrspace is AddrSpace.REG:
            slot = self.reg_slot(idx, v.dtype)
            self.copy(slot, self.reg(v))
            return
        mem = self.gated_address(idx, None, None) if len(idx.src) > 2 else self.address(idx)
        self.store_value(mem, v, v.dtype)


def _nonneg(u: UOp) -> bool:
    try:
        lo = u.vmin
    except Exception:  # bounds of an unusual node: assume it may be negative
        return False
    return isinstance(lo, int) and lo >= 0


Rule = Callable[[Selector, UOp], None]
_I, _B, _F, _N, _V, _M, _Z, _K = "int", "bool", "float", "none", "fvec", "bvec", "zvec", "kvec"
SELECTION_TABLE: dict[tuple[Ops, str], Rule] = {
    **{(op, c): Selector.sel_nothing for op in (Ops.CONST, Ops.DEFINE_REG, Ops.NOOP, Ops.BARRIER, Ops.GROUP)
       for c in (_I, _B, _F, _N)},
    (Ops.SINK, _N): Selector.sel_sink,
    (Ops.RANGE, _I): Selector.sel_range,
    (Ops.END, _N): Selector.sel_end,
    (Ops.INDEX, _N): Selector.sel_index,
    **{(Ops.LOAD, c): Selector.sel_load for c in (_I, _B, _F)},
    (Ops.STORE, _N): Selector.sel_store,
    **{(op, c): si.sel_int_binary for op in si.INT_ALU for c in (_I, _B)},
    (Ops.NEG, _I): si.sel_int_neg, (Ops.NEG, _B): si.sel_int_neg,
    (Ops.MAX, _I): si.sel_int_max,
    **{(op, c): si.sel_int_cmp for op in GroupOp.Comparison for c in (_I, _B)},
    (Ops.WHERE, _I): si.sel_int_where, (Ops.WHERE, _B): si.sel_int_where,
    (Ops.CDIV, _I): si.sel_int_divmod, (Ops.CMOD, _I): si.sel_int_divmod,
    (Ops.SHL, _I): si.sel_int_shift, (Ops.SHR, _I): si.sel_int_shift,
    **{(op, _F): sf.sel_float_binary for op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV)},
    **{(op, _F): sf.sel_float_unary for op in (Ops.NEG, Ops.SQRT, Ops.TRUNC)},
    (Ops.MAX, _F): sf.sel_float_max,
    **{(op, _F): sf.sel_float_cmp for op in GroupOp.Comparison},
    (Ops.WHERE, _F): sf.sel_float_where,
    **{(Ops.CAST, c): sc.sel_cast for c in (_I, _B, _F)},
    **{(Ops.BITCAST, c): sc.sel_bitcast for c in (_I, _F)},
    # float32 vectors (select_vector.py); other vectors exist only as STACKs of bools feeding a vector WHERE
    (Ops.LOAD, _V): Selector.sel_load,
    **{(op, _V): sv.sel_vec_binary for op in sv.PACKED},
    **{(op, _V): sv.sel_vec_unary for op in (Ops.NEG, Ops.SQRT, Ops.TRUNC)},
    (Ops.MAX, _V): sv.sel_vec_max, (Ops.WHERE, _V): sv.sel_vec_where,
    (Ops.STACK, _V): sv.sel_stack, (Ops.STACK, "vec"): Selector.sel_nothing,
    (Ops.GEP, _F): sz.sel_any_gep, (Ops.GEP, _V): sz.sel_any_gep, (Ops.CAST, _V): sv.sel_vec_cast,
    **{(op, _V): sm.sel_fvec_cmp for op in GroupOp.Comparison},
    # bool vectors as lane masks (select_mask.py)
    (Ops.LOAD, _M): Selector.sel_load, (Ops.STACK, _M): sm.sel_mask_stack, (Ops.GEP, _M): sz.sel_any_gep,
    (Ops.GEP, _B): sz.sel_any_gep, (Ops.WHERE, _M): sm.sel_mask_where, (Ops.NEG, _M): sm.sel_mask_not,
    (Ops.CAST, _M): sm.sel_mask_from_float,
    **{(op, _M): sm.sel_mask_logic for op in sm.MASK_LOGIC},
    **{(op, _M): sm.sel_mask_cmp for op in GroupOp.Comparison},
    # 16-lane float32 and bool vectors in zmm registers (AVX-512, select_zmm.py)
    (Ops.LOAD, _Z): Selector.sel_load, **{(op, _Z): sv.sel_vec_binary for op in sv.PACKED},
    **{(op, _Z): sz.sel_zunary for op in (Ops.NEG, Ops.SQRT, Ops.TRUNC)},
    (Ops.MAX, _Z): sz.sel_zmax, (Ops.WHERE, _Z): sz.sel_zwhere, (Ops.WHERE, _K): sz.sel_zwhere,
    (Ops.STACK, _Z): sz.sel_zstack, (Ops.GEP, _Z): sz.sel_any_gep, (Ops.CAST, _Z): sz.sel_zcast,
    **{(op, _Z): sz.sel_zcmp for op in GroupOp.Comparison},
    **{(op, _K): sz.sel_klogic for op in (*sz.MASK_LOGIC, Ops.CMPNE, Ops.CMPLT)},
    (Ops.NEG, _K): sz.sel_knot, (Ops.CAST, _K): sz.sel_kfrom_float, (Ops.STACK, _K): sz.sel_kstack,
}  # fmt: skip
"""(op, operand class) -> the rule selecting it. Anything missing raises SelectionError (an UnsupportedOpError)."""


def select(uops: list[UOp], kernel: str, fp_contract: bool = False) -> tuple[list[Item], bytes]:
    """Select a legalized linear program: (instruction list on virtual registers, .rodata bytes). `fp_contract`:
    a float ADD of a MUL used only there becomes one fused multiply-add."""
    return Selector(uops, kernel, fp_contract).run()


zmm_refusal = sz.zmm_refusal
signed_magic32 = si.signed_magic32

__all__ = ["SELECTION_TABLE", "SelectionError", "Selector", "op_class", "select", "signed_magic32", "zmm_refusal"]
