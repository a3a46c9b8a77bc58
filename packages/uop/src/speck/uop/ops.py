"""The operation set of the IR (`Ops`) and the groups passes use to classify them (`GroupOp`)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any


class Ops(enum.Enum):
    """Every UOp operation. Declaration order is the stable sort order used by linearization tie-breaks."""

    # members are singletons compared by identity: hash them by identity in C (Enum's own __hash__ is Python code
    # hashing the name, paid on every UOp created)
    __hash__ = object.__hash__

    # ---- graph structure ----
    SINK = enum.auto()  # root: sources are the things that must happen
    GROUP = enum.auto()  # several effects treated as one
    AFTER = enum.auto()  # src[0] viewed after src[1:] happened (ordering without data flow)
    END = enum.auto()  # closes RANGEs: src[0] = the effect inside, src[1:] = the ranges closed
    BARRIER = enum.auto()
    NOOP = enum.auto()
    KERNEL = enum.auto()  # tensor level: a call of a kernel AST (arg) on buffers (src)

    # ---- definitions ----
    PARAM = enum.auto()  # kernel parameter: arg = slot index; dtype a PtrDType (buffer) or a scalar (by value)
    DEFINE_VAR = enum.auto()  # symbolic variable: arg = (name, min, max)
    DEFINE_LOCAL = enum.auto()
    DEFINE_REG = enum.auto()
    SPECIAL = enum.auto()  # hardware index (thread/core id): arg = name, src[0] = size
    RANGE = enum.auto()  # loop index: src[0] = end; arg = (axis id, AxisType)
    CONST = enum.auto()  # arg = the value
    STACK = enum.auto()  # vector built from scalar sources
    GEP = enum.auto()  # element(s) of a vector: arg = tuple of lane indices
    UNIQUE = enum.auto()  # makes otherwise-equal tensor buffers distinct
    DEVICE = enum.auto()  # arg = device name
    BUFFER = enum.auto()  # tensor level: src = (UNIQUE, DEVICE), arg = size in elements
    BIND = enum.auto()  # DEFINE_VAR bound to a CONST value

    # ---- memory ----
    INDEX = enum.auto()  # pointer arithmetic: src = (buffer, index[, gate])
    LOAD = enum.auto()  # src = (index[, alt value])
    STORE = enum.auto()  # src = (index, value)

    # ---- tensor-level movement and buffering ----
    RESHAPE = enum.auto()
    PERMUTE = enum.auto()
    EXPAND = enum.auto()
    PAD = enum.auto()
    SHRINK = enum.auto()
    FLIP = enum.auto()
    COPY = enum.auto()
    CONTIGUOUS = enum.auto()
    DETACH = enum.auto()
    ASSIGN = enum.auto()
    BUFFERIZE = enum.auto()  # materialize src[0] into a buffer over ranges src[1:]
    REDUCE_AXIS = enum.auto()  # tensor level: arg = (Ops, axes)
    REDUCE = enum.auto()  # kernel level: src = (value, *ranges reduced), arg = Ops (ADD/MUL/MAX)

    # ---- casts ----
    CAST = enum.auto()
    BITCAST = enum.auto()

    # ---- unary ALU ----
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    SQRT = enum.auto()
    RECIPROCAL = enum.auto()
    NEG = enum.auto()
    TRUNC = enum.auto()

    # ---- binary ALU ----
    ADD = enum.auto()
    MUL = enum.auto()
    SUB = enum.auto()
    FDIV = enum.auto()
    CDIV = enum.auto()  # integer division truncating toward zero (C semantics)
    CMOD = enum.auto()  # remainder with the sign of the dividend (C semantics)
    MAX = enum.auto()
    POW = enum.auto()
    CMPLT = enum.auto()
    CMPNE = enum.auto()
    CMPEQ = enum.auto()
    XOR = enum.auto()
    OR = enum.auto()
    AND = enum.auto()
    SHL = enum.auto()
    SHR = enum.auto()
    THREEFRY = enum.auto()

    # ---- ternary ALU ----
    WHERE = enum.auto()
    MULACC = enum.auto()

    # ---- machine level ----
    INS = enum.auto()  # a machine instruction of an ISA backend: arg = (opcode, extra)
    CUSTOM = enum.auto()  # renderer-specific text: arg = format string
    # ---- appended (Ops pickle by value: a new member goes last, so stored graphs keep their meaning) ----
    # tensor level: src[0]'s value unchanged, each element checked against the bounds in arg; a violation is
    # recorded in src[1], a BUFFER (speck.tensor.bounds)
    CHECK = enum.auto()

    IDIV = CDIV  # tinygrad-compatible aliases
    MOD = CMOD

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    # identity hashing in C: Ops are dict keys and set members on every rewrite step
    __hash__ = object.__hash__

    def __lt__(self, other: Ops) -> bool:
        return self.value < other.value


class GroupOp:
    """Sets of Ops that passes treat alike."""

    Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC})
    Binary = frozenset(
        {
            Ops.ADD,
            Ops.MUL,
            Ops.SUB,
            Ops.FDIV,
            Ops.CDIV,
            Ops.CMOD,
            Ops.MAX,
            Ops.POW,
            Ops.CMPLT,
            Ops.CMPNE,
            Ops.CMPEQ,
            Ops.XOR,
            Ops.OR,
            Ops.AND,
            Ops.SHL,
            Ops.SHR,
            Ops.THREEFRY,
        }
    )
    Ternary = frozenset({Ops.WHERE, Ops.MULACC})
    ALU = Unary | Binary | Ternary
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.AND, Ops.OR})
    Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
    Idempotent = frozenset({Ops.OR, Ops.AND, Ops.MAX})
    # f(x, 0) == x for these, and f(Invalid, ...) is Invalid
    Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Buffer = frozenset({Ops.LOAD, Ops.STORE, Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG})
    Defines = frozenset({Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG})
    Irreducible = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.RANGE})
    # ops whose result is unchanged when a source is Invalid-poisoned -> stays Invalid
    Elementwise = ALU | frozenset({Ops.CAST, Ops.BITCAST})
    # integer ops that need the floating point unit to be exact
    UnsafePad = frozenset({Ops.RECIPROCAL, Ops.LOG2, Ops.EXP2, Ops.FDIV, Ops.CDIV, Ops.POW})
    All = frozenset(Ops)


class _OpsMirror(type):
    """The metaclass of `FastOps`: everything but reading a member (iterating, `Ops(value)`, `Ops["NAME"]`,
    isinstance) goes to `Ops` itself. It defines no `__getattr__`, so reading a member stays a plain class lookup."""

    def __iter__(cls) -> Any:
        return iter(Ops)

    def __len__(cls) -> int:
        return len(Ops)

    def __contains__(cls, x: object) -> bool:
        return isinstance(x, Ops)

    def __getitem__(cls, name: str) -> Ops:
        return Ops[name]

    def __call__(cls, value: object) -> Ops:
        return Ops(value)

    def __instancecheck__(cls, x: object) -> bool:
        return isinstance(x, Ops)

    @property
    def __members__(cls) -> Any:
        return Ops.__members__


# `Ops`' members on a plain class. On Python 3.11 reading `Ops.X` costs ~0.18 us against ~0.04 us for a plain class
# attribute: enum's metaclass defines `__getattr__`, so every class attribute read goes through a slot that calls
# `type.__getattribute__` as a Python-level method. The lowering pipeline reads members ~1.4M times for a cold CNN
# training step's 104 kernels (`u.op is Ops.RANGE` in every walk): its hot modules import `FastOps as Ops` (the
# same member objects; for type checkers it is `Ops`).
if TYPE_CHECKING:
    FastOps = Ops
else:
    FastOps = _OpsMirror("FastOps", (), {"__doc__": "Ops' members on a plain class", **Ops.__members__})
