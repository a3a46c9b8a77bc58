"""dtypes: scalar, vector and pointer types of the IR, the weak literal types, exact value truncation, bit casts and
the promotion lattice that tensor ops use. Standard library only."""

from __future__ import annotations

import builtins
import enum
import functools
import math
import struct
import sys
from typing import Any, Final, Literal, NamedTuple

from speck.uop.errors import ImmutableError, SettingError, UOpTypeError, UOpValueError
from speck.uop.errors import UnknownDTypeError as UnknownDTypeError
from speck.uop.helpers import ContextVar
from speck.uop.settings import declare

ConstType = float | int | bool


class AddrSpace(enum.Enum):
    """Where a pointer points: device memory, workgroup-local memory, registers, or a by-value kernel argument."""

    GLOBAL = 1
    LOCAL = 2
    REG = 3
    ALU = 4

    def __repr__(self) -> str:
        return f"AddrSpace.{self.name}"


class DType:
    """A scalar or vector value type. `count` > 1 is a vector of `scalar()`.

    DTypes are interned (one object per distinct type), so they compare and hash by identity, which keeps the
    hash-consing of UOps fast. Build them only through `dtypes`, `.vec()` and `.ptr()`."""

    __slots__ = ("priority", "itemsize", "name", "fmt", "count", "_scalar", "__weakref__")
    priority: int  # order in the promotion lattice tie-break
    itemsize: int  # bytes of one element (weak types report 8)
    name: str
    fmt: str | None  # struct/numpy format character, None where there is none (bfloat16, fp8, weak)
    count: int
    _scalar: DType | None

    def __init__(self, priority: int, itemsize: int, name: str, fmt: str | None, count: int = 1,
                 _scalar: DType | None = None) -> None:  # fmt: skip
        for k, v in (("priority", priority), ("itemsize", itemsize), ("name", name), ("fmt", fmt), ("count", count),
                     ("_scalar", _scalar)):  # fmt: skip
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise ImmutableError(f"DType is immutable: can't set {name!r}; build another dtype (dtype.vec(n), dtype.ptr())")

    def __reduce__(self) -> tuple[Any, ...]:
        if self._scalar is not None:
            return (_vec_cache, (self._scalar, self.count))
        return (to_dtype, (self.name,))

    def __lt__(self, other: DType) -> bool:
        return (self.priority, self.itemsize, self.name, self.count) < (other.priority, other.itemsize, other.name,
                                                                         other.count)  # fmt: skip

    def __repr__(self) -> str:
        base = f"dtypes.{self.short_name}"
        return base if self.count == 1 else f"{base}.vec({self.count})"

    @property
    def short_name(self) -> str:
        """The scalar type's attribute name on `dtypes` ("float", "uchar", "fp8e4m3"): what repr shows, and an
        identifier renderers can build helper names from (`name` is the C-like spelling, with spaces)."""
        s = self.scalar().name
        return _ATTR_OF_NAME.get(s, s)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole (possibly vector) value."""
        return self.itemsize * self.count

    @property
    def min(self) -> ConstType:
        """The smallest value of the type (`dtypes.min(self)`): an int, -inf, or False."""
        return dtypes.min(self)

    @property
    def max(self) -> ConstType:
        """The largest value of the type (`dtypes.max(self)`): an int, inf, or True."""
        return dtypes.max(self)

    def vec(self, count: int) -> DType:
        """The vector type of `count` elements of this scalar type (count 1 is the scalar itself)."""
        if type(count) is not int or not 1 <= count <= MAX_VEC_COUNT:
            count = _lane_count(f"{self!r}.vec", count)
        if self.count != 1:
            raise UOpValueError(f"can't vectorize {self}: it is already a vector")
        if count == 1:
            return self
        if self.name == "void":
            raise UOpValueError(f"can't vectorize {self}: void has no values")
        return _vec_cache(self, count)

    def scalar(self) -> DType:
        return self._scalar if self._scalar is not None else self

    def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
        """A pointer to `size` elements of this type (-1: unknown size) in `addrspace`."""
        if type(size) is not int or size < -1 or type(addrspace) is not AddrSpace:
            size = _ptr_size(self, size, addrspace)
        return _ptr_cache(self, addrspace, 1, size)

    @property
    def is_weak(self) -> bool:
        """A Python-literal dtype (weakint, weakfloat): no storage width, it adopts the dtype it meets."""
        return (self._scalar or self) in WEAK_DTYPES

    @property
    def bitsize(self) -> int:
        """Bits of one element: 1 for bool (stored in a byte), else 8 * itemsize."""
        return 1 if self.name == "bool" else 8 * self.itemsize


MAX_VEC_COUNT: Final = 1 << 16  # far beyond any backend's vector width: a larger count is a mistake, not a vector


def _lane_count(what: str, count: Any) -> int:
    """count as a vector's lane count (an int, or an integer-like such as numpy's, in [1, MAX_VEC_COUNT]);
    UOpTypeError/UOpValueError naming what was given otherwise."""
    if isinstance(count, bool) or not hasattr(type(count), "__index__"):
        raise UOpTypeError(f"{what}: the lane count must be an int, got {count!r} ({type(count).__name__})")
    n = count.__index__()
    if not 1 <= n <= MAX_VEC_COUNT:
        raise UOpValueError(f"{what}: the lane count must be between 1 and {MAX_VEC_COUNT}, got {n}; a vector has at "
                            "least one lane (count 1 is the scalar itself)")  # fmt: skip
    return int(n)


def _ptr_size(base: DType, size: Any, addrspace: Any) -> int:
    """size as a pointer's element count (an int or integer-like >= -1); raises for anything else, or for an
    addrspace that is no AddrSpace."""
    if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise UOpTypeError(f"{base!r}.ptr: size must be an int element count (-1: unknown), got {size!r} "
                           f"({type(size).__name__})")  # fmt: skip
    if (n := size.__index__()) < -1:
        raise UOpValueError(f"{base!r}.ptr: size must be an element count >= 0, or -1 for unknown; got {n}")
    if not isinstance(addrspace, AddrSpace):
        raise UOpTypeError(f"{base!r}.ptr: addrspace must be an AddrSpace (e.g. AddrSpace.GLOBAL), got {addrspace!r}")
    return int(n)


@functools.cache
def _vec_cache(scalar: DType, count: int) -> DType:
    return DType(scalar.priority, scalar.itemsize, f"{scalar.name}{count}", None, count, scalar)


@functools.cache
def _ptr_cache(base: DType, addrspace: AddrSpace, v: int, size: int) -> PtrDType:
    return PtrDType(base, addrspace, v, size)


class PtrDType(DType):
    """Pointer to `base` elements; `v` > 1 is a vector of pointers, `size` the element count (-1 unknown)."""

    __slots__ = ("base", "addrspace", "v", "size")
    base: DType
    addrspace: AddrSpace
    v: int
    size: int

    def __init__(self, base: DType, addrspace: AddrSpace, v: int, size: int) -> None:
        super().__init__(base.priority, 8, base.name, None, v, None)
        for k, val in (("base", base), ("addrspace", addrspace), ("v", v), ("size", size)):
            object.__setattr__(self, k, val)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ptr_cache, (self.base, self.addrspace, self.v, self.size))

    def __repr__(self) -> str:
        sz = "" if self.size == -1 else f"size={self.size}, "
        return f"{self.base!r}.ptr({sz}addrspace={self.addrspace!r})" + (f".vec({self.v})" if self.v != 1 else "")

    def vec(self, count: int) -> DType:
        if type(count) is not int or not 1 <= count <= MAX_VEC_COUNT:
            count = _lane_count(f"{self!r}.vec", count)
        if self.v != 1:
            raise UOpValueError(f"can't vectorize {self}: it is already a vector of pointers")
        return self if count == 1 else _ptr_cache(self.base, self.addrspace, count, self.size)

    def scalar(self) -> PtrDType:
        return self if self.v == 1 else _ptr_cache(self.base, self.addrspace, 1, self.size)

    @property
    def is_weak(self) -> bool:
        return self.base.is_weak

    @property
    def nbytes(self) -> int:
        return 8 * self.v


class InvalidType:
    """The poison value of gated indexing. Any ALU op on Invalid is Invalid (Invalid // 0 is Invalid, not an error)."""

    _instance: InvalidType | None = None

    def __new__(cls) -> InvalidType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "Invalid"

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (InvalidType, ())


Invalid: Final = InvalidType()


def _d(priority: int, itemsize: int, name: str, fmt: str | None) -> DType:
    return DType(priority, itemsize, name, fmt)


class _DtypesMeta(type):
    """`dtypes.default_float` / `dtypes.default_int` read the DEFAULT_FLOAT / DEFAULT_INT settings live; assigning
    them writes the setting."""

    @property
    def default_float(cls) -> DType:
        return _default_setting(DEFAULT_FLOAT, "float")

    @default_float.setter
    def default_float(cls, dt: DType) -> None:
        DEFAULT_FLOAT.value = to_dtype(dt).name

    @property
    def default_int(cls) -> DType:
        return _default_setting(DEFAULT_INT, "int")

    @default_int.setter
    def default_int(cls, dt: DType) -> None:
        DEFAULT_INT.value = to_dtype(dt).name


def setting_dtype(cv: ContextVar, kind: str = "") -> DType:
    """The dtype a dtype-name setting (DEFAULT_FLOAT, OPTIM_DTYPE...) names; a SettingError naming the setting when
    it names none (the lookup's own UnknownDTypeError didn't say where the name came from)."""
    v = cv.value
    try:
        return v if isinstance(v, DType) else to_dtype(str(v).lower())
    except UnknownDTypeError:
        raise SettingError(f"{cv.key}={v!r} names no dtype; set it to a {kind + ' ' if kind else ''}dtype name such "
                           f"as {cv.default}, or unset it") from None  # fmt: skip


def _default_setting(cv: ContextVar, kind: str) -> DType:
    v = cv.value
    dt = setting_dtype(cv, kind)
    if (kind == "float") != dtypes.is_float(dt) or dt.is_weak or dt == dtypes.bool:
        raise SettingError(f"{cv.key}={v!r} is not a concrete {kind} dtype; use e.g. {cv.default}")
    return dt


# dtype names (any alias, any case) for Python float/int literals and lists, rand, arange and weak values
DEFAULT_FLOAT = declare(
    "DEFAULT_FLOAT", "float32", "speck.uop", ("speck.uop.dtype",), "the dtype of float literals and lists"
)
DEFAULT_INT = declare("DEFAULT_INT", "int32", "speck.uop", ("speck.uop.dtype",), "the dtype of int literals and lists")


class dtypes(metaclass=_DtypesMeta):
    """Namespace of every dtype plus the helpers that classify and convert between them."""

    void: Final = _d(-1, 0, "void", None)
    bool: Final = _d(0, 1, "bool", "?")
    weakint: Final = _d(1, 8, "weakint", None)
    int8: Final = _d(2, 1, "signed char", "b")
    uint8: Final = _d(3, 1, "unsigned char", "B")
    int16: Final = _d(4, 2, "short", "h")
    uint16: Final = _d(5, 2, "unsigned short", "H")
    int32: Final = _d(6, 4, "int", "i")
    uint32: Final = _d(7, 4, "unsigned int", "I")
    int64: Final = _d(8, 8, "long", "q")
    uint64: Final = _d(9, 8, "unsigned long", "Q")
    weakfloat: Final = _d(10, 8, "weakfloat", None)
    fp8e4m3: Final = _d(11, 1, "float8_e4m3", None)
    fp8e5m2: Final = _d(12, 1, "float8_e5m2", None)
    fp8e4m3fnuz: Final = _d(13, 1, "float8_e4m3fnuz", None)
    fp8e5m2fnuz: Final = _d(14, 1, "float8_e5m2fnuz", None)
    float16: Final = _d(15, 2, "half", "e")
    bfloat16: Final = _d(16, 2, "__bf16", None)
    float32: Final = _d(17, 4, "float", "f")
    float64: Final = _d(18, 8, "double", "d")

    # aliases users expect
    half = float16
    float = float32
    double = float64
    uchar = uint8
    ushort = uint16
    uint = uint32
    ulong = uint64
    char = int8
    short = int16
    int = int32
    long = int64

    # ---- groups (tuples, in tinygrad's order) ----
    fp8_ocp: Final = (fp8e4m3, fp8e5m2)
    fp8_fnuz: Final = (fp8e4m3fnuz, fp8e5m2fnuz)
    fp8s: Final = fp8_ocp + fp8_fnuz
    floats: Final = fp8s + (float16, bfloat16, float32, float64)
    uints: Final = (uint8, uint16, uint32, uint64)
    sints: Final = (int8, int16, int32, int64)
    ints: Final = uints + sints
    int8s: Final = (uint8, int8)
    int16s: Final = (uint16, int16)
    int32s: Final = (uint32, int32)
    int64s: Final = (uint64, int64)
    weaks: Final = (weakint, weakfloat)
    all: Final = floats + ints + (bool,)

    # ---- classification ----
    @staticmethod
    def is_float(x: DType) -> builtins.bool:
        return x.scalar() in _FLOATS

    @staticmethod
    def is_int(x: DType) -> builtins.bool:
        return x.scalar() in _INTS

    @staticmethod
    def is_unsigned(x: DType) -> builtins.bool:
        return x.scalar() in _UINTS

    @staticmethod
    def is_bool(x: DType) -> builtins.bool:
        return x.scalar() == dtypes.bool

    @staticmethod
    def is_fp8(x: DType) -> builtins.bool:
        return x.scalar() in FP8_FORMATS

    @staticmethod
    def from_py(x: Any) -> DType:
        """The dtype of a Python literal: bool for bools, weakint for ints, weakfloat for floats.

        Tuples/lists give the strongest element kind made concrete (default_int/default_float; empty: default_float),
        the dtype a tensor built from them gets."""
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.weakint
        if isinstance(x, float):
            return dtypes.weakfloat
        if isinstance(x, InvalidType):
            return dtypes.weakint
        if isinstance(x, (list, tuple)):
            return dtypes.as_concrete(max((dtypes.from_py(e) for e in x), default=dtypes.weakfloat))
        raise UOpTypeError(f"can't infer a dtype from {type(x).__name__} value {x!r}; expected bool, int or float")

    @staticmethod
    def from_np(x: Any) -> DType:
        """The dtype of a numpy dtype or scalar type (`dtypes.from_np(np.float32) == dtypes.float32`; tinygrad's
        older API). numpy is read from the caller's import (speck.uop does not depend on it)."""
        np = sys.modules.get("numpy")
        if np is None:
            raise UOpTypeError(f"dtypes.from_np({x!r}): expected a numpy dtype, but numpy is not imported")
        try:
            name = np.dtype(x).name
        except TypeError as e:
            raise UOpTypeError(f"dtypes.from_np({x!r}): expected a numpy dtype or scalar type ({e})") from None
        dt = _BY_NAME.get(name)
        if dt is None or dt.is_weak:
            raise UOpTypeError(f"dtypes.from_np: numpy dtype {name!r} has no speck equivalent; use a bool, int, "
                               "uint or float dtype")  # fmt: skip
        return dt

    @staticmethod
    def as_const(val: Any, dtype: DType) -> Any:
        """val as the Python value a constant of dtype holds: bool, int or float (a tuple converts each element).
        Ints and floats are converted, not wrapped or rounded to the width (that is `truncate`)."""
        if isinstance(val, tuple):
            return tuple(dtypes.as_const(x, dtype) for x in val)
        if isinstance(val, InvalidType):
            return val
        s = dtype.scalar()
        return bool(val) if s == dtypes.bool else int(val) if s in _INTS else float(val)

    @staticmethod
    def min(dt: DType) -> ConstType:
        """Smallest value of dt (-inf for floats; weak types are unbounded and report -inf)."""
        s = dt.scalar()
        if s == dtypes.bool:
            return False
        if s in _INTS and s != dtypes.weakint:
            return 0 if s in _UINTS else -(2 ** (8 * s.itemsize - 1))
        return -math.inf

    @staticmethod
    def max(dt: DType) -> ConstType:
        """Largest value of dt (inf for floats; weak types are unbounded and report inf)."""
        s = dt.scalar()
        if s == dtypes.bool:
            return True
        if s in _INTS and s != dtypes.weakint:
            return int(2 ** (8 * s.itemsize) - 1 if s in _UINTS else 2 ** (8 * s.itemsize - 1) - 1)
        return math.inf

    @staticmethod
    def finfo(dt: DType) -> tuple[builtins.int, builtins.int]:
        """(exponent bits, mantissa bits) of a float dtype; ValueError for anything else."""
        table = {
            dtypes.float16: (5, 10),
            dtypes.bfloat16: (8, 7),
            dtypes.float32: (8, 23),
            dtypes.float64: (11, 52),
            **{d: (f.ebits, f.mbits) for d, f in FP8_FORMATS.items()},
        }
        if dt.scalar() not in table:
            raise UOpValueError(f"finfo needs a concrete float dtype, got {dt}")
        return table[dt.scalar()]

    @staticmethod
    def fields() -> dict[str, DType]:
        """Every named dtype (aliases included), for lookups by name."""
        return dict(_BY_NAME)

    @staticmethod
    def as_concrete(dt: DType) -> DType:
        """Replace a weak dtype by the default concrete one (weakint -> default_int, weakfloat -> default_float)."""
        s = dt.scalar()
        c = dtypes.default_int if s == dtypes.weakint else dtypes.default_float if s == dtypes.weakfloat else s
        return c.vec(dt.count) if not isinstance(dt, PtrDType) else dt


_INTS = frozenset(
    [
        dtypes.weakint,
        dtypes.int8,
        dtypes.uint8,
        dtypes.int16,
        dtypes.uint16,
        dtypes.int32,
        dtypes.uint32,
        dtypes.int64,
        dtypes.uint64,
    ]
)
WEAK_DTYPES: frozenset[DType] = frozenset((dtypes.weakint, dtypes.weakfloat))
_UINTS = frozenset([dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64])
_FLOATS = frozenset(
    [
        dtypes.weakfloat,
        dtypes.fp8e4m3,
        dtypes.fp8e5m2,
        dtypes.fp8e4m3fnuz,
        dtypes.fp8e5m2fnuz,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float32,
        dtypes.float64,
    ]
)
_BY_NAME = {k: v for k, v in vars(dtypes).items() if isinstance(v, DType) and not k.startswith("default")}
# `name` is the C-like type name ("float", "unsigned char", "__bf16"); repr shows the short attribute a user types
_ATTR_OF_NAME = {
    "signed char": "char", "unsigned char": "uchar", "unsigned short": "ushort", "unsigned int": "uint",
    "unsigned long": "ulong", "__bf16": "bfloat16", **{f"float8_{k[3:]}": k for k in _BY_NAME if k.startswith("fp8")},
}  # fmt: skip
_BY_C_NAME = {v.name: v for v in _BY_NAME.values()}


ALL_SCALARS: tuple[DType, ...] = tuple(sorted(set(_BY_NAME.values()) - {dtypes.void}))
CONCRETE_SCALARS: tuple[DType, ...] = tuple(d for d in ALL_SCALARS if not d.is_weak)


def to_dtype(x: DType | str) -> DType:
    """Accept a DType, an attribute name of `dtypes` in any case ('float32', 'HALF', ...) or a C-like `DType.name`
    ('unsigned char')."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and (dt := _BY_NAME.get(x) or _BY_NAME.get(x.lower()) or _BY_C_NAME.get(x)) is not None:
        return dt
    raise UnknownDTypeError(f"unknown dtype {x!r}; expected one of {', '.join(sorted(_BY_NAME))}")


# ---------------- promotion lattice ----------------
# Each dtype lists the dtypes directly above it. weakint sits just above bool (a Python int adopts the tensor's int
# type); weakfloat sits above every int and below every float (a Python float adopts the tensor's float type, and
# turns an int tensor into the default float).
_PROMO: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.weakint,),
    dtypes.weakint: (dtypes.int8, dtypes.uint8),
    dtypes.int8: (dtypes.int16,),
    dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,),
    dtypes.int64: (dtypes.weakfloat,),
    dtypes.uint8: (dtypes.int16, dtypes.uint16),
    dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64),
    dtypes.uint64: (dtypes.weakfloat,),
    dtypes.weakfloat: (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz),
    dtypes.fp8e4m3: (dtypes.float16, dtypes.bfloat16),
    dtypes.fp8e5m2: (dtypes.float16, dtypes.bfloat16),
    dtypes.fp8e4m3fnuz: (dtypes.float16, dtypes.bfloat16),
    dtypes.fp8e5m2fnuz: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,),
    dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


@functools.cache
def _upper_set(dt: DType) -> frozenset[DType]:
    out = {dt}
    for parent in _PROMO[dt]:
        out |= _upper_set(parent)
    return frozenset(out)


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every argument promotes to (the tensor-op promotion rule).

    Weak dtypes lose to concrete ones: least_upper_dtype(int8, weakint) is int8, and (int32, weakfloat) is weakfloat,
    which `least_upper_float`/`as_concrete` turn into the default float."""
    if len(ds) == 2:  # every binary op joins its operands' dtypes: answered from a table after the first time
        return _join2(ds[0].scalar(), ds[1].scalar())
    if not ds:
        raise UOpValueError("least_upper_dtype needs at least one dtype")
    return _join(frozenset(d.scalar() for d in ds))


@functools.cache
def _join2(a: DType, b: DType) -> DType:
    return _join(frozenset((a, b)))


@functools.cache
def _join(ds: frozenset[DType]) -> DType:
    common = set.intersection(*[set(_upper_set(d)) for d in ds])
    # the least element of the common set is the one whose own upper set contains all the others
    for cand in sorted(common, key=lambda d: len(_upper_set(d)), reverse=True):
        if all(c in _upper_set(cand) for c in common):
            return cand
    # two fp8 formats have two minimal common bounds (float16 and bfloat16, both exact for either): take the
    # lower priority one, float16
    minimal = [c for c in common if not any(o is not c and c in _upper_set(o) for o in common)]
    return min(minimal, key=lambda d: d.priority)


def strong_dtype(dt: DType) -> DType:
    """The concrete dtype a weak one materializes as: weakint -> dtypes.default_int, weakfloat ->
    dtypes.default_float (read when called); any other dtype is itself."""
    return dtypes.as_concrete(dt) if dt.is_weak else dt


def weak_dtype(dt: DType) -> DType:
    """The weak (literal) kind of dt: a float dtype -> weakfloat, an int dtype -> weakint, anything else itself."""
    s = dt.scalar()
    if isinstance(dt, PtrDType) or s == dtypes.bool:
        return dt
    weak = dtypes.weakfloat if s in _FLOATS else dtypes.weakint if s in _INTS else None
    return dt if weak is None else weak.vec(dt.count)


def least_upper_float(dt: DType) -> DType:
    """The float dtype an op like sqrt/exp produces from dt (ints and weak floats become the default float)."""
    return dt if dtypes.is_float(dt) and not dt.is_weak else least_upper_dtype(dt, dtypes.weakfloat, dtypes.float32)


def sum_acc_dtype(dt: DType) -> DType:
    """Accumulator dtype of a sum: small ints widen to int32/uint32, half floats to float32."""
    if dtypes.is_unsigned(dt):
        return least_upper_dtype(dt, dtypes.uint32)
    if dtypes.is_int(dt) or dt == dtypes.bool:
        return least_upper_dtype(dt, dtypes.int32)
    return least_upper_dtype(dt, dtypes.float32)


# ---------------- exact values ----------------
def _f16(x: float) -> float:
    try:
        return float(struct.unpack("<e", struct.pack("<e", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def _f32(x: float) -> float:
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def _bf16_bits(x: float) -> int:
    """float -> bfloat16 bit pattern, round to nearest even (via float32 first, as hardware converts)."""
    (u,) = struct.unpack("<I", struct.pack("<f", _f32(x)))
    if math.isnan(x):
        return 0x7FC0 | ((int(u) >> 16) & 0x8000)
    return ((int(u) + 0x7FFF + ((int(u) >> 16) & 1)) >> 16) & 0xFFFF


def _bf16(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<I", _bf16_bits(x) << 16))[0])


def truncate_fp16(x: float) -> float:
    """x rounded to the nearest float16 value (round to nearest even; beyond float16's range -> +-inf)."""
    return _f16(float(x))


def float_to_bf16(x: float) -> float:
    """x rounded to the nearest bfloat16 value (round to nearest even via float32; inf and NaN kept)."""
    return _bf16(float(x))


# the same conversions under the other names tinygrad's dtype module has for them
float_to_fp16 = truncate_fp16
truncate_bf16 = float_to_bf16


class Fp8Format(NamedTuple):
    """An 8-bit float layout: sign, `ebits` exponent bits with `bias`, `mbits` mantissa bits (subnormals at e == 0).

    kind "fn" (OCP e4m3): no infinities, NaN is S.1111.111. "ieee" (OCP e5m2): all-ones exponent is inf (m == 0) or
    NaN. "fnuz": no infinities and no negative zero; the one NaN is 0x80. Converting to fp8 rounds to nearest even and
    saturates finite overflow to +-max; an infinity stays one only where the format has it, else becomes NaN."""

    ebits: int
    mbits: int
    bias: int
    kind: Literal["fn", "ieee", "fnuz"]
    max: float  # largest finite magnitude
    max_bits: int  # bit pattern of +max
    nan_bits: int  # bit pattern produced for NaN (and for inf where the format has none)
    inf_bits: int | None  # bit pattern of +inf, None where the format has no infinity


FP8_FORMATS: dict[DType, Fp8Format] = {
    dtypes.fp8e4m3: Fp8Format(4, 3, 7, "fn", 448.0, 0x7E, 0x7F, None),
    dtypes.fp8e5m2: Fp8Format(5, 2, 15, "ieee", 57344.0, 0x7B, 0x7E, 0x7C),
    dtypes.fp8e4m3fnuz: Fp8Format(4, 3, 8, "fnuz", 240.0, 0x7F, 0x80, None),
    dtypes.fp8e5m2fnuz: Fp8Format(5, 2, 16, "fnuz", 57344.0, 0x7F, 0x80, None),
}
"""Every fp8 dtype's layout: the one table the constant folder, numpy emulation and renderers' helpers read."""


def _fp8_round(x: float, f: Fp8Format) -> float:
    """x rounded to the fp8 format f (see Fp8Format for overflow, infinities and zero)."""
    if math.isnan(x) or (math.isinf(x) and f.inf_bits is None):
        return math.nan
    if math.isinf(x):
        return x
    ax = abs(x)
    e = max(math.frexp(ax)[1] - 1, 1 - f.bias) if ax else 1 - f.bias
    step = 2.0 ** (e - f.mbits)
    q = ax / step
    r = math.floor(q)
    if q - r > 0.5 or (q - r == 0.5 and r % 2 == 1):
        r += 1
    v = min(r * step, f.max)
    return 0.0 if v == 0 and f.kind == "fnuz" else math.copysign(v, x)


def _wrap_int(bits: int, signed: bool) -> Any:
    mask = (1 << bits) - 1

    def f(x: Any) -> int:
        v = int(x) & mask
        return v - (1 << bits) if signed and v >> (bits - 1) else v

    return f


def _float_to_int(x: float) -> float | int:
    if math.isnan(x) or math.isinf(x):
        return 0  # out-of-range float->int is undefined in C; fold deterministically
    return math.trunc(x)


truncate: dict[DType, Any] = {
    dtypes.bool: bool,
    dtypes.weakint: lambda x: x,
    dtypes.weakfloat: float,
    dtypes.float16: _f16,
    dtypes.bfloat16: _bf16,
    dtypes.float32: _f32,
    dtypes.float64: float,
    **{d: functools.partial(lambda x, f: _fp8_round(float(x), f), f=f) for d, f in FP8_FORMATS.items()},
    **{d: _wrap_int(8 * d.itemsize, d not in _UINTS) for d in _INTS if d != dtypes.weakint},
}
"""`truncate[dt](v)` wraps (two's complement) or rounds (IEEE, round-to-nearest-even) a Python value to dt."""


def cast_value(v: ConstType, dt: DType) -> ConstType:
    """The value of `CAST(dt, v)`: float->int truncates toward zero, int->float rounds, anything->bool is v != 0."""
    s = dt.scalar()
    if s == dtypes.bool:
        return bool(v)
    if s in _INTS:
        if isinstance(v, float):
            v = _float_to_int(v)
        out: ConstType = truncate[s](int(v))
        return out
    res: ConstType = truncate[s](float(v))
    return res


def _fp8_bits(x: float, f: Fp8Format) -> int:
    x = _fp8_round(x, f)
    if math.isnan(x):
        return f.nan_bits
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        assert f.inf_bits is not None
        return sign | f.inf_bits
    ax = abs(x)
    if ax == 0:
        return sign
    e = math.frexp(ax)[1] - 1
    if e < 1 - f.bias:  # subnormal
        return sign | int(round(ax / 2.0 ** (1 - f.bias - f.mbits)))
    m = int(round((ax / 2.0**e - 1) * (1 << f.mbits)))
    return sign | ((e + f.bias) << f.mbits) | m


def _fp8_from_bits(b: int, f: Fp8Format) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> f.mbits) & ((1 << f.ebits) - 1), b & ((1 << f.mbits) - 1)
    if f.kind == "fnuz" and b == 0x80 or f.kind == "fn" and (b & 0x7F) == 0x7F:
        return math.nan
    if f.kind == "ieee" and e == (1 << f.ebits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - f.bias - f.mbits)
    return sign * (1 + m / (1 << f.mbits)) * 2.0 ** (e - f.bias)


def to_bits(v: ConstType, dt: DType) -> int:
    """The unsigned bit pattern of value v stored as dt (v is truncated to dt first)."""
    s = dt.scalar()
    v = truncate[s](v) if s not in (dtypes.weakint, dtypes.weakfloat) else v
    if s == dtypes.bool:
        return int(bool(v))
    if s in _INTS:
        return int(v) & ((1 << (8 * s.itemsize)) - 1)
    if s == dtypes.bfloat16:
        return _bf16_bits(float(v))
    if s in FP8_FORMATS:
        return _fp8_bits(float(v), FP8_FORMATS[s])
    assert s.fmt is not None
    fmt = s.fmt
    return int.from_bytes(struct.pack("<" + fmt, float(v)), "little")


def from_bits(bits: int, dt: DType) -> ConstType:
    """The value of dt whose bit pattern is `bits`."""
    s = dt.scalar()
    if s == dtypes.bool:
        return bool(bits & 1)
    if s in _INTS:
        iv: ConstType = truncate[s](bits)
        return iv
    if s == dtypes.bfloat16:
        return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])
    if s in FP8_FORMATS:
        return _fp8_from_bits(bits & 0xFF, FP8_FORMATS[s])
    assert s.fmt is not None
    return float(struct.unpack("<" + s.fmt, (bits & ((1 << (8 * s.itemsize)) - 1)).to_bytes(s.itemsize, "little"))[0])


def storage_fmt_for_dtype(dt: DType) -> str | None:
    """The struct format a dtype's values are stored with: its own `fmt`, or the unsigned int of its width for the
    formats struct has none for (bfloat16 'H', fp8 'B'); None for weak dtypes and void."""
    s = dt.scalar()
    if s.fmt is not None or s.is_weak or s == dtypes.void:
        return s.fmt
    return {1: "B", 2: "H"}[s.itemsize]


def to_storage_scalar(x: ConstType, dt: DType) -> ConstType:
    """x as stored under storage_fmt_for_dtype(dt): the bit pattern (an int) for bfloat16 and fp8, else x."""
    s = dt.scalar()
    return to_bits(x, s) if s.fmt is None and not s.is_weak and s != dtypes.void else x


def from_storage_scalar(x: ConstType, dt: DType) -> ConstType:
    """The inverse of to_storage_scalar: the value of a stored bfloat16/fp8 bit pattern, else x."""
    s = dt.scalar()
    return from_bits(int(x), s) if s.fmt is None and not s.is_weak and s != dtypes.void else x


def bitcast(v: ConstType, from_dt: DType, to_dt: DType) -> ConstType:
    """Reinterpret the bits of v (of from_dt) as to_dt. The source value is truncated to its own dtype first:
    int32 3000000000 -> uint32 3000000000; int16 70000 -> uint16 4464; uint32 -5 -> int32 -5."""
    if from_dt.scalar().itemsize != to_dt.scalar().itemsize or from_dt.is_weak or to_dt.is_weak:
        raise UOpValueError(f"bitcast needs concrete dtypes of equal size, got {from_dt} -> {to_dt}")
    return from_bits(to_bits(v, from_dt), to_dt)


def can_lossless_cast(dt0: DType, dt1: DType) -> bool:
    """True if every value of dt0 is exactly representable in dt1."""
    s0, s1 = dt0.scalar(), dt1.scalar()
    if s0 == s1 or s0 == dtypes.bool:
        return True
    if s1 == dtypes.weakint:
        return s0 in _INTS
    if s1 == dtypes.weakfloat:
        return s0 in _INTS or s0 in _FLOATS
    if s0 in _INTS and s1 in _INTS:
        if s0 == dtypes.weakint:
            return False
        if s0 in _UINTS:
            return s1.itemsize > s0.itemsize or (s1 in _UINTS and s1.itemsize >= s0.itemsize)
        return s1 not in _UINTS and s1.itemsize >= s0.itemsize
    if s0 in _INTS and s1 in _FLOATS:
        if s0 == dtypes.weakint or s1 == dtypes.weakfloat:
            return False
        mant = dtypes.finfo(s1)[1] + 1
        return 8 * s0.itemsize - (0 if s0 in _UINTS else 1) <= mant
    if s0 in _FLOATS and s1 in _FLOATS:
        if s0 == dtypes.weakfloat:
            return s1 == dtypes.float64
        if s0 in FP8_FORMATS and s1 in FP8_FORMATS:
            return False  # distinct fp8 formats differ in range (bias) or in their special values
        e0, m0 = dtypes.finfo(s0)
        e1, m1 = dtypes.finfo(s1)
        return e1 >= e0 and m1 >= m0
    return False


SCALAR_KIND = Literal["bool", "int", "uint", "float"]


def scalar_kind(dt: DType) -> SCALAR_KIND:
    if dtypes.is_bool(dt):
        return "bool"
    if dtypes.is_unsigned(dt):
        return "uint"
    if dtypes.is_int(dt):
        return "int"
    return "float"
