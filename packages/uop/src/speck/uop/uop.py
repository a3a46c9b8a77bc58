"""`UOp`: the immutable, hash-consed node of every speck graph (tensor graphs, kernel ASTs, programs).

Building the same (op, dtype, src, arg, tag) twice returns the same object, so graphs share structure and tests
compare nodes with `is`. Nothing here recurses on the Python stack: traversals use explicit stacks."""

from __future__ import annotations

import enum
import functools
import hashlib
import struct
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Union

from speck.uop.alu import exec_alu as exec_alu
from speck.uop.alu import fold_bitcast as fold_bitcast
from speck.uop.alu import python_alu as python_alu
from speck.uop.alu import threefry2x32 as threefry2x32
from speck.uop.bounds import _compute_bounds
from speck.uop.dtype import (
    AddrSpace,
    ConstType,
    DType,
    Invalid,
    InvalidType,
    PtrDType,
    cast_value,
    dtypes,
)
from speck.uop.errors import ImmutableError, UOpIndexError, UOpStateError, UOpTypeError, UOpValueError
from speck.uop.helpers import all_int, prod
from speck.uop.operators import UOpOperators
from speck.uop.ops import GroupOp, Ops


class Rules(Protocol):
    """What `UOp.rewrite` applies: a `speck.uop.upat.PatternMatcher` (named by what it does, so that the node does not
    import the matcher built over it)."""

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None: ...


sint = Union[int, "UOp"]

# Graph rewriting (speck.uop.rewrite), the symbolic rules (speck.uop.symbolic) and rendering (speck.uop.render) are
# built on UOp, so they sit above this module. Each registers what UOp.simplify/rewrite/render call when it is
# imported, and speck.uop's __init__ imports all three: the methods work whichever module was imported first.
_SERVICES: dict[str, Any] = {}


def register_service(name: str, value: Any) -> None:
    """Provide `name` (graph_rewrite, symbolic, symbolic_simple, render_uop; uop_shard from the layer that owns
    devices) to UOp's methods."""
    _SERVICES[name] = value


def _service(name: str) -> Any:
    if (value := _SERVICES.get(name)) is None:
        raise UOpStateError(f"UOp needs {name!r}, which is registered on import: import speck.uop (not only "
                            "speck.uop.uop) before using UOp.simplify/rewrite/render, and speck.tensor before "
                            "UOp.shard")  # fmt: skip
    return value


# BUFFER node -> the device buffer behind it, an object of the layer that owns memory (speck.tensor attaches its
# speck.hcq Buffer when it allocates, fills or realizes the node). UOp.buffer/realized only read it: speck.uop never
# makes buffers and asks no layer above for one. Weak on the key: the entry dies with the node. The owner may write
# the backing dict (`.data`, keyed by the node's weak reference) directly on its per-op paths.
buffers: weakref.WeakKeyDictionary[UOp, Any] = weakref.WeakKeyDictionary()


class AxisType(enum.Enum):
    """What a RANGE becomes: a parallel global/local/thread index, a loop, a reduction, or lanes of a vector."""

    GLOBAL = 1
    LOCAL = 2
    THREAD = 3
    LOOP = 4
    GROUP_REDUCE = 5
    REDUCE = 6
    UPCAST = 7
    UNROLL = 8

    def __repr__(self) -> str:
        return f"AxisType.{self.name}"

    def __lt__(self, other: AxisType) -> bool:
        return self.value < other.value


def _argkey(arg: Any) -> Any:
    """Hash-consing key of an arg: floats by their bits (so 0.0 and -0.0 differ and NaN equals NaN), and values
    qualified by type (so True, 1 and 1.0 never share a node)."""
    t = type(arg)
    if t is float:
        return (float, struct.pack("<d", arg))
    if t is tuple:  # ints inline: lane lists and axis ids are the common tuples
        return tuple([(int, a) if type(a) is int else _argkey(a) for a in arg])
    if t is bool or t is int:
        return (t, arg)
    return arg


def validate_shape(shape: Sequence[Any], what: str = "shape") -> tuple[sint, ...]:
    """Check every dim is an int (not a float, not even 2.0) or an integer UOp; raise RuntimeError otherwise."""
    out: list[sint] = []
    for d in shape:
        if isinstance(d, UOp):
            if not (dtypes.is_int(d.dtype) and d.dtype.count == 1):
                raise UOpTypeError(f"{what} must be int, got a {d.dtype} UOp in {tuple(shape)}")
            out.append(d)
        elif isinstance(d, int) and not isinstance(d, bool):
            out.append(d)
        elif not isinstance(d, bool) and hasattr(type(d), "__index__") and not isinstance(d, float):
            try:
                out.append(int(d.__index__()))  # a numpy int is a size as numpy and torch take it
            except TypeError:  # (a numpy array of several values)
                raise UOpTypeError(f"{what} must be int, got {type(d).__name__} {d!r:.40} in a shape") from None
        else:
            raise UOpTypeError(f"{what} must be int, got {d!r} ({type(d).__name__}) in {tuple(shape)}")
    return tuple(out)


def resolve(x: sint | bool, default: bool = True) -> bool:
    """Decide a symbolic condition from bounds; `default` when the bounds don't decide it."""
    if isinstance(x, UOp):
        if x.vmin == x.vmax and not isinstance(x.vmin, InvalidType):
            return bool(x.vmin)
        return default
    return bool(x)


def smax(*xs: sint) -> sint:
    out: sint = xs[0]
    for x in xs[1:]:
        out = x if (isinstance(out, int) and isinstance(x, int) and x > out) else out
        if isinstance(out, UOp) or isinstance(x, UOp):
            out = UOp.maximum(_as_uop(out), _as_uop(x)).simplify()
    return out


def _as_uop(x: sint) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.weakint, x)


def ssimplify(x: sint) -> sint:
    """Simplify a symbolic int; a UOp that folds to a constant becomes a Python int."""
    if isinstance(x, UOp):
        s = x.simplify()
        return s.arg if s.op is Ops.CONST and type(s.arg) is int else s
    return x


_int = int
_UNIQUE, _BUFFER, _VOID = Ops.UNIQUE, Ops.BUFFER, dtypes.void

_PLAIN_BINARY = frozenset(GroupOp.Binary - GroupOp.Comparison - {Ops.THREEFRY})


class _Slots:
    """The storage of a UOp. A node is born as a `_Fresh` (plain attribute writes, the fastest way CPython fills
    slots) and becomes a `UOp`, whose __setattr__ refuses every write, by a class switch: same layout."""

    __slots__ = ("op", "dtype", "src", "arg", "tag", "_ck", "_bounds", "_shape", "_topo", "__weakref__")
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    tag: Any
    _ck: tuple[Any, ...]
    _bounds: tuple[Any, Any] | None  # (vmin, vmax), computed on first use
    _shape: Any  # 0: not computed yet; None: no tensor shape; else the shape tuple
    _topo: tuple[Any, ...] | None  # a SINK's toposort without itself, computed on first use (see UOp.toposort)


class _Fresh(_Slots):
    __slots__ = ()


class _instance_or_class:
    """A method that is static when called on the class (`UOp.sink(a, b)`) and takes the instance as its first
    positional argument when called on one (`a.sink(b)` == `UOp.sink(a, b)`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, owner: type | None = None) -> Callable[..., Any]:
        return self.fn if obj is None else functools.partial(self.fn, obj)


def _int_arg(v: Any) -> Any:
    """A numpy (or other __index__) integer as a Python int; anything else (bool and float included) as it is."""
    if isinstance(v, (bool, int, float)) or not hasattr(type(v), "__index__"):
        return v
    return int(v.__index__())


# the hash-consing table (UOp._cache), also bound here: the constructor and finalizer, run ~100k times for a cold
# training step's lowering, read a module global instead of a class attribute
_HC: dict[tuple[Any, ...], weakref.ReferenceType[Any]] = {}
_wref = weakref.ref


class UOp(_Slots, UOpOperators["UOp"]):
    """A node: `op` with result `dtype`, sources `src`, a static `arg`, and an optional `tag` (pass-private mark).

    Construct with `UOp(op, dtype, src, arg)` or the helper constructors; the result is hash-consed."""

    __slots__ = ()
    _cache: dict[tuple[Any, ...], weakref.ReferenceType[UOp]] = _HC

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
                tag: Any = None) -> UOp:  # fmt: skip
        # (an int arg keyed inline: BUFFER sizes and UNIQUE ids, made on every realize, skip _argkey's frame)
        ck = (op, dtype, src, arg if arg is None else (_int, arg) if arg.__class__ is _int else _argkey(arg), tag)
        ref = _HC.get(ck)
        if ref is not None and (ret := ref()) is not None:
            return ret  # type: ignore[no-any-return]
        fresh = object.__new__(_Fresh)
        fresh.op, fresh.dtype, fresh.src, fresh.arg, fresh.tag = op, dtype, src, arg, tag
        fresh._ck, fresh._bounds, fresh._shape, fresh._topo = ck, None, 0, None
        fresh.__class__ = UOp  # type: ignore[assignment]
        self: UOp = fresh  # type: ignore[assignment]
        _HC[ck] = _wref(self)
        return self

    @staticmethod
    def buffer_node(device: UOp, size: int, dtype: DType, unique: int) -> UOp:
        """`UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, dtypes.void, (), unique), device), size)` in one call: the same
        two nodes, hash-consed as the constructor does (a realize makes one per output buffer, so the two
        constructor calls are inlined here)."""
        cache = UOp._cache
        ck: tuple[Any, ...] = (_UNIQUE, _VOID, (), (_int, unique), None)
        ref = cache.get(ck)
        uq = ref() if ref is not None else None
        if uq is None:
            fresh = object.__new__(_Fresh)
            fresh.op, fresh.dtype, fresh.src, fresh.arg, fresh.tag = _UNIQUE, _VOID, (), unique, None
            fresh._ck, fresh._bounds, fresh._shape, fresh._topo = ck, None, 0, None
            fresh.__class__ = UOp  # type: ignore[assignment]
            made: UOp = fresh  # type: ignore[assignment]
            cache[ck] = weakref.ref(made)
            uq = made
        src: tuple[UOp, ...] = (uq, device)
        ck = (_BUFFER, dtype, src, (_int, size) if size.__class__ is _int else _argkey(size), None)
        ref = cache.get(ck)
        if ref is not None and (ret := ref()) is not None:
            return ret
        fresh = object.__new__(_Fresh)
        fresh.op, fresh.dtype, fresh.src, fresh.arg, fresh.tag = _BUFFER, dtype, src, size, None
        fresh._ck, fresh._bounds, fresh._shape, fresh._topo = ck, None, 0, None
        fresh.__class__ = UOp  # type: ignore[assignment]
        self: UOp = fresh  # type: ignore[assignment]
        cache[ck] = weakref.ref(self)
        return self

    def __del__(self) -> None:
        # the finalizer runs before the weak reference is cleared; no other node with this key can exist while this
        # one lived, so the entry is ours to drop
        try:
            _HC.pop(self._ck, None)
        except Exception:  # interpreter shutdown: module globals may already be gone
            pass

    def __setattr__(self, name: str, value: Any) -> None:
        raise ImmutableError(f"UOp is immutable: can't set {name!r}; use .replace(...) to build a new node")

    def __reduce__(self) -> tuple[Any, ...]:
        # the whole graph as a flat table (sources by position), so deep graphs pickle without recursion; unpickling
        # rebuilds through the constructor, so hash-consing holds across a round trip
        nodes = self.toposort()
        pos = {u: i for i, u in enumerate(nodes)}
        flat = tuple((u.op, u.dtype, tuple(pos[s] for s in u.src), u.arg, u.tag) for u in nodes)
        return (_uop_from_flat, (flat,))

    def replace(self, **kwargs: Any) -> UOp:
        """A node like this one with some of op/dtype/src/arg/tag replaced (returns self when nothing changes)."""
        op = kwargs.get("op", self.op)
        dtype = kwargs.get("dtype", self.dtype)
        src = kwargs.get("src", self.src)
        arg = kwargs.get("arg", self.arg)
        tag = kwargs.get("tag", self.tag)
        if op is self.op and dtype is self.dtype and src is self.src and arg is self.arg and tag is self.tag:
            return self
        return UOp(op, dtype, tuple(src), arg, tag)

    # ---------------- traversal ----------------
    def toposort(self, gate: Callable[[UOp], bool] | None = None) -> list[UOp]:
        """Every node reachable from self, sources before users (deterministic order). `gate(u)` False stops the
        walk below u (u itself is still included). A SINK keeps its full order: the lowering pipeline asks a kernel's
        SINK for it dozens of times (opt heuristics, stage checks), and the graph below a node never changes. The
        cache leaves the SINK itself out, so it holds no reference cycle."""
        if gate is None and self.op is Ops.SINK:
            if (below := self._topo) is None:
                below = tuple(self._toposort(None)[:-1])
                object.__setattr__(self, "_topo", below)
            return [*below, self]
        return self._toposort(gate)

    def _toposort(self, gate: Callable[[UOp], bool] | None) -> list[UOp]:
        out: dict[UOp, None] = {}
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            u, visited = stack.pop()
            if u in out:
                continue
            if visited:
                out[u] = None
                continue
            stack.append((u, True))
            if gate is None or gate(u):
                for s in reversed(u.src):
                    if s not in out:
                        stack.append((s, False))
        return list(out)

    def sparents(self) -> list[UOp]:
        return self.toposort()

    def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
        """Replace nodes by the mapping, rebuilding everything above them (no pattern matching)."""
        if not mapping:
            return self
        new: dict[UOp, UOp] = {}
        for u in self.toposort():
            if u in mapping:
                new[u] = mapping[u]
                continue
            nsrc = tuple(new[s] for s in u.src)
            new[u] = u if all(a is b for a, b in zip(nsrc, u.src)) else u.replace(src=nsrc)
        return new[self]

    def variables(self) -> list[UOp]:
        """The DEFINE_VARs this graph uses (bound ones included through BIND), sorted by name."""
        vs = {u.src[0] if u.op is Ops.BIND else u for u in self.toposort() if u.op in (Ops.DEFINE_VAR, Ops.BIND)}
        return sorted(vs, key=lambda v: v.arg)

    def ranges(self) -> list[UOp]:
        return [u for u in self.toposort() if u.op is Ops.RANGE]

    def simplify(self, full: bool = True) -> UOp:
        """Rewrite with the symbolic rules to a fixed point; equal expressions become the same canonical node."""
        rules = _service("symbolic" if full else "symbolic_simple")
        return _service("graph_rewrite")(self, rules, name="simplify")  # type: ignore[no-any-return]

    def rewrite(self, pm: Rules, ctx: Any = None) -> UOp:
        return _service("graph_rewrite")(self, pm, ctx)  # type: ignore[no-any-return]

    # ---------------- constructors ----------------
    @staticmethod
    def const(dtype: DType, b: ConstType | InvalidType | tuple[Any, ...], src: tuple[UOp, ...] = (),
              device: str | None = None, shape: tuple[sint, ...] | None = None) -> UOp:  # fmt: skip
        """A constant of dtype. A tuple builds a STACK of consts; the value is truncated to dtype exactly. With
        `device` it is a tensor-level constant on that device, broadcast to `shape` when given."""
        if device is not None or shape is not None:
            c = UOp.const(dtype, b, (UOp(Ops.DEVICE, arg=device),) if device is not None else src)
            return c if not shape else c.reshape((1,) * len(shape)).expand(tuple(shape))
        if dtype is dtypes.weakint and type(b) is int:  # index arithmetic: the common case
            return UOp(Ops.CONST, dtype, src, b)
        if isinstance(b, tuple):
            return UOp.stack(*[UOp.const(dtype.scalar(), x) for x in b])
        if isinstance(b, UOp):
            raise UOpTypeError(f"UOp.const expects a Python value, got a UOp {b.op}")
        if dtype.count > 1 and not isinstance(dtype, PtrDType):
            return UOp.stack(*[UOp.const(dtype.scalar(), b)] * dtype.count)
        if not isinstance(b, InvalidType):
            b = cast_value(b, dtype) if not dtype.is_weak else (int(b) if dtype == dtypes.weakint else float(b))
        return UOp(Ops.CONST, dtype, src, b)

    @staticmethod
    def cconst(b: ConstType, dtype: DType) -> UOp:
        """The casted const `CAST(dtype, CONST(b, from_py(b)))`: the width lives on the CAST, the value on a weak
        CONST. Every literal in a program takes this form."""
        if isinstance(b, float) and dtypes.is_int(dtype):
            raise UOpTypeError(f"cconst: float literal {b!r} for int dtype {dtype}; convert the value first")
        if not isinstance(b, bool) and dtype.scalar() == dtypes.bool:
            b = bool(b)
        if dtypes.is_float(dtype) and isinstance(b, int) and not isinstance(b, bool):
            b = float(b)
        inner = UOp(Ops.CONST, dtypes.from_py(b), (), b)
        return UOp(Ops.CAST, dtype, (inner,))

    @staticmethod
    def stack(*srcs: UOp) -> UOp:
        """A vector of the sources (all of one scalar dtype); one source is itself."""
        if len(srcs) == 1:
            return srcs[0]
        if not srcs:
            raise UOpValueError("UOp.stack needs at least one source")
        dt = srcs[0].dtype
        if any(s.dtype != dt for s in srcs):
            raise UOpTypeError(f"UOp.stack sources must share a dtype, got {[s.dtype for s in srcs]}")
        return UOp(Ops.STACK, dt.vec(len(srcs)) if not isinstance(dt, PtrDType) else dt.vec(len(srcs)), srcs)

    @staticmethod
    def range(end: sint, axis_id: int | tuple[int, ...], axis_type: AxisType = AxisType.LOOP,
              dtype: DType = dtypes.weakint) -> UOp:  # fmt: skip
        """A loop index over [0, end)."""
        ids = axis_id if isinstance(axis_id, tuple) else (axis_id,)
        return UOp(Ops.RANGE, dtype, (_as_uop(end),), (*ids, axis_type))

    @staticmethod
    def special(end: sint, name: str, dtype: DType = dtypes.weakint) -> UOp:
        """A hardware index (e.g. 'gidx0', 'core_id') over [0, end)."""
        return UOp(Ops.SPECIAL, dtype, (_as_uop(end),), name)

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.weakint) -> UOp:
        """A symbolic integer variable with inclusive bounds."""
        if not isinstance(name, str):  # (rendered into kernel source and signatures as text)
            raise UOpTypeError(f"a variable's name must be a str, got {type(name).__name__} {name!r:.40}")
        min_val, max_val = _int_arg(min_val), _int_arg(max_val)  # (numpy ints were refused)
        if not (isinstance(min_val, int) and isinstance(max_val, int)) or min_val > max_val:
            raise UOpValueError(f"variable {name!r} needs int bounds with min <= max, got [{min_val!r}, {max_val!r}]")
        if (
            dtypes.is_int(dtype)
            and not dtype.is_weak
            and not dtypes.min(dtype) <= min_val <= max_val <= dtypes.max(dtype)
        ):
            raise UOpValueError(
                f"variable {name!r}: bounds [{min_val}, {max_val}] don't fit {dtype} "
                f"([{dtypes.min(dtype)}, {dtypes.max(dtype)}]); pick a wider dtype or narrower bounds"
            )
        return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))

    def bind(self, val: int) -> UOp:
        """Bind a DEFINE_VAR to a value within its bounds."""
        if self.op is not Ops.DEFINE_VAR:
            raise UOpValueError(f"only a variable can be bound, not {self.op}")
        name, lo, hi = self.arg
        val = _int_arg(val)
        if not isinstance(val, int):  # ("value '3' ... is outside its bounds" named the wrong problem)
            raise UOpTypeError(f"variable {name!r} is bound to an int, got {type(val).__name__} {val!r:.40}")
        if not lo <= val <= hi:
            raise UOpValueError(f"value {val!r} for variable {name!r} is outside its bounds [{lo}, {hi}]")
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, val)))

    def unbind(self) -> tuple[UOp, int]:
        if self.op is not Ops.BIND:
            raise UOpValueError(f"unbind needs a BIND, got {self.op}")
        return self.src[0], self.src[1].arg

    @property
    def val(self) -> int:
        """The value a bound variable (a BIND) holds: `Variable("i", 1, 9).bind(3).val == 3`."""
        return int(self.unbind()[1])

    @property
    def expr(self) -> str:
        if self.op is not Ops.DEFINE_VAR:
            raise UOpValueError(f"expr is the name of a variable, this is {self.op}")
        return str(self.arg[0])

    @staticmethod
    def param(slot: int, dtype: DType, shape: tuple[int, ...] | None = None) -> UOp:
        """Kernel parameter `slot`: a buffer when dtype is a pointer, else a by-value scalar."""
        return UOp(Ops.PARAM, dtype, (), slot if shape is None else (slot, shape))

    @_instance_or_class
    def sink(*srcs: UOp, arg: Any = None) -> UOp:
        """SINK of srcs: `UOp.sink(a, b)`, or on an instance `a.sink(b)` (a first)."""
        return UOp(Ops.SINK, dtypes.void, tuple(srcs), arg)

    @staticmethod
    def group(*srcs: UOp) -> UOp:
        return srcs[0] if len(srcs) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(srcs))

    def index(self, *idx: UOp | int, gate: UOp | None = None) -> UOp:
        """On a buffer: INDEX (pointer arithmetic). On a STACK with a constant index: that element, at construction.
        On a vector value: GEP of the lane."""
        if self.op is Ops.STACK and len(idx) == 1 and isinstance(idx[0], int):
            return self.src[idx[0]]
        if self.op is Ops.STACK and len(idx) == 1 and isinstance(idx[0], UOp) and idx[0].op is Ops.CONST:
            return self.src[int(idx[0].arg)]
        if not isinstance(self.dtype, PtrDType) and self.dtype.count > 1:
            if not all(isinstance(i, int) for i in idx):
                raise UOpValueError("indexing a vector value needs constant lane numbers")
            return self.gep(*[int(i) for i in idx])  # type: ignore[arg-type]
        srcs = [self] + [_as_uop(i) for i in idx] + ([gate] if gate is not None else [])
        dt = self.dtype
        return UOp(Ops.INDEX, dt, tuple(srcs))

    def gep(self, *lanes: int) -> UOp:
        """Lane(s) of a vector value; folds through STACK at construction."""
        if self.dtype.count == 1 and lanes == (0,):
            return self
        if self.op is Ops.STACK:
            return UOp.stack(*[self.src[i] for i in lanes])
        dt = self.dtype.scalar()
        return UOp(Ops.GEP, dt.vec(len(lanes)) if not isinstance(dt, PtrDType) else dt, (self,), tuple(lanes))

    def valid(self, cond: UOp) -> UOp:
        """A gated index value: self where cond holds, Invalid elsewhere (loads from it read the alternative)."""
        return cond.where(self, UOp.const(self.dtype, Invalid))

    def load(self, *src: UOp, dtype: DType | None = None) -> UOp:
        if dtype is None:
            dtype = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
        return UOp(Ops.LOAD, dtype, (self, *src))

    def store(self, val: UOp | ConstType, *extra: UOp) -> UOp:
        v = val if isinstance(val, UOp) else UOp.const(self.dtype.base if isinstance(self.dtype, PtrDType) else
                                                       self.dtype, val)  # fmt: skip
        return UOp(Ops.STORE, dtypes.void, (self, v, *extra))

    def end(self, *ranges: UOp) -> UOp:
        """Close `ranges` around the effect self (a STORE or group of them)."""
        return self if not ranges else UOp(Ops.END, dtypes.void, (self, *ranges))

    def after(self, *deps: UOp) -> UOp:
        return self if not deps else UOp(Ops.AFTER, self.dtype, (self, *deps))

    def reduce(self, *ranges: UOp, op: Ops = Ops.ADD) -> UOp:
        """Kernel-level reduction of self over `ranges` with op (ADD, MUL or MAX)."""
        if op not in (Ops.ADD, Ops.MUL, Ops.MAX):
            raise UOpValueError(f"reduce op must be ADD, MUL or MAX, got {op}")
        return self if not ranges else UOp(Ops.REDUCE, self.dtype, (self, *ranges), op)

    def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
        """Tensor-level reduction over axes (keeps reduced dims as 1)."""
        if op not in (Ops.ADD, Ops.MUL, Ops.MAX):
            raise UOpValueError(f"reduce op must be ADD, MUL or MAX, got {op}")
        axes = tuple(sorted(set(a for a in axes if resolve(self.shape[a] != 1 if isinstance(self.shape[a], int)
                                                            else True))))  # fmt: skip
        return self if not axes else UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))

    def bufferize(self, *ranges: UOp, arg: Any = None) -> UOp:
        return UOp(Ops.BUFFERIZE, self.dtype, (self, *ranges), arg)

    # ---------------- kernels written by hand (Tensor.custom_kernel) ----------------
    @staticmethod
    def placeholder(shape: tuple[sint, ...], dtype: DType, slot: int, addrspace: AddrSpace = AddrSpace.GLOBAL) -> UOp:
        """Buffer parameter `slot` viewed with `shape` (row-major): what a hand-written kernel indexes as C[i, j].
        addrspace=REG makes register storage number `slot` instead (an accumulator local to the kernel)."""
        sh = validate_shape(shape, "placeholder shape")
        if not all_int(sh):
            raise UOpValueError(f"placeholder shape must be concrete ints, got {sh}")
        op = Ops.DEFINE_REG if addrspace is AddrSpace.REG else Ops.PARAM
        return UOp(op, dtype.ptr(int(prod(sh)), addrspace), (), (slot, sh))

    def __getitem__(self, idx: Any) -> UOp:
        """Index a buffer view (a placeholder, or a movement/AFTER view of one). One int or UOp per dim gives the
        element: usable as a value (it is loaded) and as the target of `.store(v)` / `.set(v)`. Slices (step 1)
        keep their dims and give a smaller view, e.g. `src[g, :]`."""
        if not isinstance(self.dtype, PtrDType) or not self.has_shape:
            raise UOpValueError(f"only a buffer view (a placeholder with a shape) can be indexed, not a {self.op} "
                                f"of dtype {self.dtype}")  # fmt: skip
        shape = self.shape
        idxs = idx if isinstance(idx, tuple) else (idx,)
        if len(idxs) > len(shape):
            raise UOpIndexError(f"{len(idxs)} indices for a buffer view of shape {shape}")
        idxs = idxs + (slice(None),) * (len(shape) - len(idxs))
        fixed: list[UOp | slice] = []
        for i, d in zip(idxs, shape):
            if isinstance(i, slice):
                fixed.append(i)
            elif isinstance(i, UOp):
                if not dtypes.is_int(i.dtype):
                    raise UOpIndexError(f"buffer index must be an int UOp, got dtype {i.dtype}")
                fixed.append(i)
            elif isinstance(i, int) and not isinstance(i, bool):
                n = i + d if i < 0 and isinstance(d, int) else i
                if isinstance(d, int) and not 0 <= n < d:
                    raise UOpIndexError(f"index {i} is out of bounds for a dim of size {d} (view shape {shape})")
                fixed.append(_as_uop(n))
            else:
                raise UOpIndexError(f"buffer index must be an int, a UOp or a slice, got {i!r} ({type(i).__name__})")
        if not any(isinstance(i, slice) for i in fixed):
            return UOp(Ops.INDEX, self.dtype.base, (self, *fixed))  # type: ignore[arg-type]
        bounds: list[tuple[sint, sint]] = []
        keep: list[sint] = []
        for i, d in zip(fixed, shape):
            if isinstance(i, slice):
                if not isinstance(d, int):
                    raise UOpIndexError(f"slicing needs concrete dims, got {d}")
                start, stop, step = i.indices(d)
                if step != 1:
                    raise UOpIndexError(f"buffer views slice with step 1 only, got step {step}")
                bounds.append((start, max(start, stop)))
                keep.append(max(0, stop - start))
            else:
                bounds.append((i, i + 1))
        return self.shrink(tuple(bounds)).reshape(tuple(keep))

    def __iter__(self) -> Any:
        raise UOpTypeError("a UOp is not iterable (indexing a buffer view gives elements, not a sequence)")

    def set(self, val: UOp | ConstType, end: UOp | tuple[UOp, ...] | list[UOp] = ()) -> UOp:
        """On an indexed element `C[i]`: store val there (closing the ranges in `end` around the store) and return
        the buffer view after that store, so later reads see it: `C = C[i].set(C.after(r)[i] + x, end=r)`."""
        if self.op is not Ops.INDEX or isinstance(self.dtype, PtrDType):
            raise UOpValueError(f"set() stores into an indexed buffer element (C[i].set(v)), not a {self.op}")
        ends = tuple(end) if isinstance(end, (tuple, list)) else (end,)
        return self.src[0].after(self.store(val).end(*ends))

    def contract(self, *ranges: UOp) -> UOp:
        """The vector of self's values over every value of `ranges` (constant-size RANGEs, the first one
        outermost): lane k of `x[i, j].contract(j)` is x[i, k]. Built here by substituting each value."""
        lanes = [self]
        for r in ranges:
            if r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST:
                raise UOpValueError(f"contract needs RANGEs of constant size, got {r.op}")
            lanes = [x.substitute({r: UOp.const(r.dtype, v)}) for x in lanes for v in range(int(r.src[0].arg))]
        return UOp.stack(*lanes)

    def flatten(self) -> UOp:
        """A buffer view (or tensor-level node) reshaped to one dim."""
        return self.reshape((prod(self.shape),))

    def cast(self, dtype: DType) -> UOp:
        if self.dtype == dtype:
            return self
        if self.dtype.count > 1 and dtype.count == 1 and not isinstance(dtype, PtrDType):
            dtype = dtype.vec(self.dtype.count)
        return UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        if self.dtype == dtype:
            return self
        return UOp(Ops.BITCAST, dtype, (self,))

    # ---------------- ALU ----------------
    def alu(self, op: Ops, *src: UOp | ConstType) -> UOp:
        """Apply ALU op to self and src (Python scalars become consts of self's dtype)."""
        if len(src) == 1 and op in _PLAIN_BINARY:  # the hot path of every rewrite rule
            y = src[0]
            if type(y) is not UOp:
                y = self._const_like(y)  # type: ignore[arg-type]
            return UOp(op, y.dtype, (self, y))
        srcs = (self,) + tuple(s if isinstance(s, UOp) else self._const_like(s) for s in src)
        if op is Ops.WHERE:
            dt = srcs[1].dtype
        elif op in GroupOp.Comparison:
            dt = dtypes.bool.vec(self.dtype.count) if self.dtype.count > 1 else dtypes.bool
        else:
            dt = srcs[-1].dtype if op is not Ops.THREEFRY else dtypes.uint64
        return UOp(op, dt, srcs)

    def _const_like(self, b: ConstType) -> UOp:
        dt = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
        return UOp.const(dt, b)

    def ufix(self, x: UOp | ConstType) -> UOp:
        return x if isinstance(x, UOp) else self._const_like(x)

    def __bool__(self) -> bool:
        # a condition its bounds decide has that truth value (`if start_pos > 0:` with a Variable bound to 1..8)
        if self.dtype.scalar() in (dtypes.bool, dtypes.weakint) or dtypes.is_int(self.dtype.scalar()):
            # a bound Variable counts with its whole range, not the value bound now (a TinyJit replay binds others)
            binds = {u: u.src[0] for u in self.toposort() if u.op is Ops.BIND}
            u = self.substitute(binds) if binds else self
            lo, hi = u.vmin, u.vmax
            if lo == hi and not isinstance(lo, InvalidType):
                return bool(lo)
        raise UOpTypeError(
            f"a {self.op} UOp has no truth value its bounds decide; use resolve(x, default) to pick one, or build a "
            "comparison UOp"
        )

    def where(self, a: UOp | ConstType, b: UOp | ConstType) -> UOp:
        """Select a where self is true, else b (a Python scalar takes the other branch's dtype)."""
        if not isinstance(a, UOp) and not isinstance(b, UOp):
            raise UOpValueError("where needs at least one UOp branch to take a dtype from")
        ua = a if isinstance(a, UOp) else b.ufix(a)  # type: ignore[union-attr]
        ub = b if isinstance(b, UOp) else ua.ufix(b)
        return UOp(Ops.WHERE, ua.dtype, (self, ua, ub))

    def threefry(self, key: UOp) -> UOp:
        return UOp(Ops.THREEFRY, dtypes.uint64, (self, key))

    # ---------------- tensor-level movement ----------------
    def reshape(self, shape: tuple[sint, ...]) -> UOp:
        return UOp(Ops.RESHAPE, self.dtype, (self,), validate_shape(shape))

    def permute(self, order: tuple[int, ...]) -> UOp:
        return UOp(Ops.PERMUTE, self.dtype, (self,), tuple(order))

    def expand(self, shape: tuple[sint, ...]) -> UOp:
        return UOp(Ops.EXPAND, self.dtype, (self,), validate_shape(shape))

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        return UOp(Ops.PAD, self.dtype, (self,), tuple(tuple(p) for p in arg))

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        return UOp(Ops.SHRINK, self.dtype, (self,), tuple(tuple(p) for p in arg))

    def flip(self, axes: tuple[bool, ...]) -> UOp:
        return UOp(Ops.FLIP, self.dtype, (self,), tuple(axes))

    # ---------------- shapes (tensor graphs) ----------------
    @property
    def shape(self) -> tuple[sint, ...]:
        """The tensor shape of a tensor-level node (RuntimeError for nodes that have none)."""
        s = self._shape
        if s == 0:
            s = _compute_shapes(self)
        if s is None:
            raise UOpValueError(f"{self.op} node has no tensor shape")
        return s  # type: ignore[no-any-return]

    @property
    def has_shape(self) -> bool:
        if self._shape == 0:
            _compute_shapes(self)
        return self._shape is not None

    @property
    def size(self) -> sint:
        out: sint = prod(self.shape)
        return out

    # ---------------- tensor-level access (what a tinygrad user reads on `t.uop`) ----------------
    @property
    def base(self) -> UOp:
        """The node under this one's chain of movement ops (a view's BUFFER, or the computation it views)."""
        u = self
        while u.op in GroupOp.Movement:
            u = u.src[0]
        return u

    @property
    def device(self) -> Any:
        """The device (str) a tensor-level node lives on: the nearest BUFFER's device or COPY's target below it, or None
        when the graph names no device (device-less constants)."""
        stack, seen = [self], set()
        while stack:
            u = stack.pop()
            if u.op is Ops.BUFFER and len(u.src) > 1:
                return str(u.src[1].arg)
            if u.op in (Ops.COPY, Ops.DEVICE):
                return str(u.arg)
            for s in reversed(u.src):
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return None

    def shard(self, devices: tuple[str, ...], axis: int | None = None) -> UOp:
        """This tensor-level node split over `devices` along `axis` (None: replicated), as Tensor.shard does (the
        layer that owns devices provides it: service 'uop_shard')."""
        out: UOp = _service("uop_shard")(self, tuple(devices), axis)
        return out

    def has_buffer_identity(self) -> bool:
        """This node names storage of its own: (a view of) a BUFFER, or a node that gets a buffer of its own when
        realized (a contiguous copy, a clone, a write's result)."""
        b = self.base
        return b.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.AFTER)

    @property
    def buf_uop(self) -> UOp:
        """The BUFFER node a realized (view) node reads; RuntimeError for a pending computation."""
        if (b := self.base).op is not Ops.BUFFER:
            raise UOpValueError(f"UOp.buf_uop: this node is a pending {b.op} computation, not a view of a buffer; "
                               "realize the tensor first")  # fmt: skip
        return b

    @property
    def is_realized(self) -> bool:
        """True when this node is (a view of) a BUFFER: its value is storage, not a pending computation."""
        return self.base.op is Ops.BUFFER

    @property
    def realized(self) -> Any:
        """The device buffer attached to this node's BUFFER (`buffers`), or None: a pending computation, or a
        BUFFER no storage was attached to yet (`Tensor.empty`'s, before it is realized or written)."""
        b = self.base
        return buffers.get(b) if b.op is Ops.BUFFER else None

    @property
    def buffer(self) -> Any:
        """The device buffer behind a realized node; RuntimeError for a pending computation or a BUFFER no storage
        was attached to yet."""
        b = self.base
        if b.op is not Ops.BUFFER:
            raise UOpStateError(f"UOp.buffer: this node is not realized (its base is a {b.op} computation); "
                                "realize the tensor first, or read t.uop.realized (None here)")  # fmt: skip
        if (out := buffers.get(b)) is None:
            raise UOpStateError(f"UOp.buffer: this {b.dtype} BUFFER of {b.arg} elements has no storage attached yet "
                                "(Tensor.empty and views of other buffers get theirs when realized); call .realize() "
                                "on the tensor first, or read t.uop.realized (None here)")  # fmt: skip
        return out

    # ---------------- bounds ----------------
    @property
    def vmin(self) -> Any:
        """Exact lower bound of the value (ints and bools; floats give -inf when unknown)."""
        b = self._bounds
        if b is None:
            b = _compute_bounds(self)
        return b[0]

    @property
    def vmax(self) -> Any:
        """Exact upper bound of the value."""
        b = self._bounds
        if b is None:
            b = _compute_bounds(self)
        return b[1]

    # ---------------- identity and printing ----------------
    @property
    def key(self) -> bytes:
        """A stable content hash (same across processes) for caches."""
        memo: dict[UOp, bytes] = {}
        for u in self.toposort():
            h = hashlib.sha256(f"{u.op.name}|{u.dtype!r}|{u.arg!r}|{u.tag!r}".encode())
            for s in u.src:
                h.update(memo[s])
            memo[u] = h.digest()
        return memo[self]

    def __repr__(self) -> str:
        nodes = self.toposort()
        if len(nodes) == 1:
            return (
                f"UOp({self.op!r}, {self.dtype!r}, arg={self.arg!r}{'' if self.tag is None else f', tag={self.tag!r}'})"
            )
        ids = {u: i for i, u in enumerate(nodes)}
        lines = []
        for u in nodes:
            srcs = ", ".join(f"%{ids[s]}" for s in u.src)
            tag = "" if u.tag is None else f" tag={u.tag!r}"
            arg = "" if u.arg is None else f" {u.arg!r}"
            lines.append(f"%{ids[u]} = {u.op.name} {u.dtype!r}{arg}{tag}" + (f" ({srcs})" if srcs else ""))
        return "\n".join(lines)

    def render(self, simplify: bool = True) -> str:
        """A Python-like string of the expression (used in error messages, names and tests)."""
        return _service("render_uop")(self.simplify() if simplify else self)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return self.__repr__()


def _uop_from_flat(flat: tuple[tuple[Any, ...], ...]) -> UOp:
    built: list[UOp] = []
    for op, dtype, srcs, arg, tag in flat:
        built.append(UOp(op, dtype, tuple(built[i] for i in srcs), arg, tag))
    return built[-1]


# ---------------- shapes ----------------
_SHAPE_PASSTHROUGH = frozenset(
    {Ops.CAST, Ops.COPY, Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN, Ops.AFTER, Ops.BITCAST, Ops.CHECK} | GroupOp.ALU
)


# `set_shape(node, shape)`: a tensor-level builder that has just made a node whose shape it knows (what `.shape` would
# compute from the node's sources and arg: an elementwise op over operands of that shape, a RESHAPE or EXPAND to its
# arg) records it, so the next op's shape test needs no walk. The slot's own setter (C), past UOp's __setattr__
_SHAPE_SLOT: Any = vars(_Slots)["_shape"]
set_shape: Callable[[UOp, tuple[sint, ...]], None] = _SHAPE_SLOT.__set__


def _compute_shapes(u: UOp) -> tuple[sint, ...] | None:
    for s in u.src:
        if s._shape == 0:
            break
    else:  # every source's shape is known (a node just built over shaped operands): u's own, without the walk
        object.__setattr__(u, "_shape", sh := _shape_of(u))
        return sh
    for n in u.toposort(gate=lambda x: x._shape == 0):
        if n._shape == 0:
            object.__setattr__(n, "_shape", _shape_of(n))
    return u._shape  # type: ignore[no-any-return]


def _shape_of(u: UOp) -> tuple[sint, ...] | None:
    op, arg = u.op, u.arg
    if op is Ops.BUFFER:
        return (arg,)
    if (op is Ops.PARAM or op is Ops.DEFINE_REG) and type(arg) is tuple:  # a placeholder: (slot, shape)
        return tuple(arg[1])
    if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND):
        return () if not u.src or u.src[0].op is not Ops.DEVICE else ()
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return tuple(arg)
    if not u.src or u.src[0]._shape is None:
        return None
    ps: tuple[sint, ...] = u.src[0]._shape
    if op is Ops.PERMUTE:
        return tuple(ps[i] for i in arg)
    if op is Ops.PAD:
        return tuple(_sadd(s, b, a) for s, (b, a) in zip(ps, arg))
    if op is Ops.SHRINK:
        return tuple(_ssub(e, b) for b, e in arg)
    if op is Ops.FLIP:
        return ps
    if op is Ops.REDUCE_AXIS:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(ps))
    if op in _SHAPE_PASSTHROUGH:
        if op is Ops.WHERE or op in GroupOp.ALU:
            shapes = [s._shape for s in u.src if s._shape is not None and s._shape != ()]
            return shapes[0] if shapes else ps
        if op is Ops.BITCAST and ps and u.dtype.itemsize != u.src[0].dtype.itemsize:
            last = ps[-1]
            if isinstance(last, int):
                return (*ps[:-1], last * u.src[0].dtype.itemsize // u.dtype.itemsize)
        return ps
    return None


def _sadd(*xs: sint) -> sint:
    if all_int(xs):
        return sum(xs)
    return _canonical_sum(ssimplify(sum((_as_uop(x) for x in xs[1:]), _as_uop(xs[0]))))


def _ssub(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    # as linear combinations of their terms first: (i-1) - (i-3) is 2 (the simplifier leaves (i+-3)*-1 alone)
    la, lb = _linear(a), _linear(b)
    if la is not None and lb is not None:
        coeffs = dict(la[0])
        for t, c in lb[0].items():
            coeffs[t] = coeffs.get(t, 0) - c
        const = la[1] - lb[1]
        if not any(coeffs.values()):
            return const
    return _canonical_sum(ssimplify(_as_uop(a) - _as_uop(b)))


def _linear(x: sint) -> tuple[dict[UOp, int], int] | None:
    """x as (term -> int coefficient, int constant) when it is a sum of int multiples of terms, else None."""
    if isinstance(x, int):
        return {}, x
    coeffs: dict[UOp, int] = {}
    const = 0
    for t in add_terms(x):
        if t.op is Ops.CONST and type(t.arg) is int:
            const += t.arg
        elif t.op is Ops.MUL and t.src[1].op is Ops.CONST and type(t.src[1].arg) is int:
            inner = _linear(t.src[0])
            if inner is None:
                return None
            for u, c in inner[0].items():
                coeffs[u] = coeffs.get(u, 0) + c * t.src[1].arg
            const += inner[1] * t.src[1].arg
        else:
            coeffs[t] = coeffs.get(t, 0) + 1
    return coeffs, const


def add_terms(u: UOp) -> list[UOp]:
    """The operands of a tree of ADDs (u itself when it is not an ADD)."""
    out: list[UOp] = []
    stack = [u]
    while stack:
        t = stack.pop()
        if t.op is Ops.ADD:
            stack.extend(t.src)
        else:
            out.append(t)
    return out


def _canonical_sum(x: sint) -> sint:
    """A symbolic dim that is a sum, with its terms in one order (by their text, constant last): i+j and j+i are the
    same dim, and shapes compare structurally (broadcasting, cat of symbolic parts)."""
    if isinstance(x, int) or x.op is not Ops.ADD:
        return x
    terms = add_terms(x)
    terms.sort(key=lambda t: (t.op is Ops.CONST, t.render()))
    out = terms[0]
    for t in terms[1:]:
        out = UOp(Ops.ADD, out.dtype, (out, t))
    return out
