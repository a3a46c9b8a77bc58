"""`UPat` patterns over UOps and the `PatternMatcher` that applies rule tables, in two agreeing modes.

The interpreted matcher walks a pattern against a node and returns every binding (in a fixed order). The compiled
matcher generates one specialised Python function per rule that performs the same checks inline and tries the
bindings in the same order, so both modes return the same rewrite on every input."""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import pickle
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from speck.uop.dtype import ConstType, DType
from speck.uop.errors import UOpStateError, UOpValueError
from speck.uop.helpers import PMCOMPILE
from speck.uop.ops import GroupOp, Ops
from speck.uop.uop import UOp

Store = dict[str, UOp]
RuleFn = Callable[..., Any]  # returns a UOp or None (specs return verdicts)


class UPat:
    """A pattern: optional op set, dtype set, sources, arg and a capture name.

    `src` as a tuple matches sources in order (and in swapped order for commutative ops); as a list it matches any
    permutation; as a single UPat it must match every source. `allow_any_len` lets a tuple match a prefix."""

    __slots__ = ("op", "dtype", "src", "src_orders", "src_repeat", "arg", "name", "allow_any_len")

    def __init__(
        self,
        op: Ops | tuple[Ops, ...] | frozenset[Ops] | set[Ops] | None = None,
        dtype: DType | tuple[DType, ...] | None = None,
        src: UPat | tuple[UPat, ...] | list[UPat] | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
    ) -> None:
        self.op: tuple[Ops, ...] | None = (op,) if isinstance(op, Ops) else (tuple(sorted(op)) if op else None)
        self.dtype: tuple[DType, ...] | None = (dtype,) if isinstance(dtype, DType) else dtype
        self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
        if name == "ctx":
            raise UOpValueError("a UPat can't be named 'ctx': that name is reserved for the rewrite context")
        self.src = src
        self.src_repeat: UPat | None = src if isinstance(src, UPat) else None
        self.src_orders: list[tuple[UPat, ...]] | None = None
        if isinstance(src, list):
            self.src_orders = [tuple(p) for p in itertools.permutations(src)]
        elif isinstance(src, tuple):
            self.src_orders = [src]
            if len(src) == 2 and self.op is not None and all(o in GroupOp.Commutative for o in self.op):
                if src[0] is not src[1]:
                    self.src_orders.append((src[1], src[0]))

    # ---------------- construction helpers ----------------
    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """Any node, captured as `name`."""
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """A CONST, captured as `name`."""
        return UPat(Ops.CONST, dtype, name=name)

    @staticmethod
    def const(dtype: DType | tuple[DType, ...] | None, b: ConstType) -> UPat:
        """A CONST with value b."""
        return UPat(Ops.CONST, dtype, arg=b)

    @staticmethod
    def any(*pats: UPat) -> UPat:
        """Matches if any of pats matches (bindings tried in argument order)."""
        return UPatAny(pats)

    def named(self, name: str) -> UPat:
        return UPat(self.op, self.dtype, self.src, self.arg, name, self.allow_any_len)

    def cast(self, dtype: DType | tuple[DType, ...] | None = None, name: str | None = None) -> UPat:
        return UPat(Ops.CAST, dtype, (self,), name=name)

    def bitcast(self, dtype: DType | None = None, name: str | None = None) -> UPat:
        return UPat(Ops.BITCAST, dtype, (self,), name=name)

    def or_casted(self, name: str | None = None) -> UPat:
        """This pattern, or a CAST of it (the cast captured as `name` when given)."""
        return UPat.any(self if name is None else self.named(name), UPat(Ops.CAST, name=name, src=(self,)))

    def alu(self, op: Ops, *src: UPat | ConstType) -> UPat:
        srcs = (self,) + tuple(s if isinstance(s, UPat) else UPat.const(None, s) for s in src)
        return UPat(op, None, srcs)

    def __add__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.ADD, x)

    def __radd__(self, x: ConstType) -> UPat:
        return self.alu(Ops.ADD, x)

    def __mul__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.MUL, x)

    def __rmul__(self, x: ConstType) -> UPat:
        return self.alu(Ops.MUL, x)

    def __floordiv__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.CDIV, x)

    def __mod__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.CMOD, x)

    def __truediv__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.FDIV, x)

    def __lt__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.CMPLT, x)

    def __and__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.AND, x)

    def __or__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.OR, x)

    def __xor__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.XOR, x)

    def __lshift__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.SHL, x)

    def __rshift__(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.SHR, x)

    def eq(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.CMPEQ, x)

    def ne(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.CMPNE, x)

    def maximum(self, x: UPat | ConstType) -> UPat:
        return self.alu(Ops.MAX, x)

    def where(self, a: UPat | ConstType, b: UPat | ConstType) -> UPat:
        return self.alu(Ops.WHERE, a, b)

    def reciprocal(self) -> UPat:
        return self.alu(Ops.RECIPROCAL)

    def index(self, idx: UPat, gate: UPat | None = None, name: str | None = None) -> UPat:
        return UPat(Ops.INDEX, None, (self, idx) if gate is None else (self, idx, gate), name=name)

    def load(self, *src: UPat, name: str | None = None, dtype: DType | None = None) -> UPat:
        return UPat(Ops.LOAD, dtype, (self, *src), name=name)

    def store(self, val: UPat, name: str | None = None) -> UPat:
        return UPat(Ops.STORE, None, (self, val), name=name, allow_any_len=True)

    def __repr__(self) -> str:
        parts = []
        if self.op is not None:
            parts.append("|".join(o.name for o in self.op))
        if self.dtype is not None:
            parts.append(str(self.dtype))
        if self.arg is not None:
            parts.append(f"arg={self.arg!r}")
        if self.name is not None:
            parts.append(f"name={self.name!r}")
        if self.src is not None:
            parts.append(f"src={self.src!r}")
        return f"UPat({', '.join(parts)})"

    # ---------------- interpreted matching ----------------
    def match(self, u: UOp, store: Store) -> list[Store]:
        """Every binding of this pattern against u extending `store`, in the matcher's fixed order."""
        if self.op is not None and u.op not in self.op:
            return []
        if self.name is not None:
            prev = store.get(self.name)
            if prev is not None and prev is not u:
                return []
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype:
            return []
        if self.arg is not None and self.arg != u.arg:
            return []
        if self.name is not None and self.name not in store:
            store = {**store, self.name: u}
        if self.src is None:
            return [store]
        return self._match_src(u, store)

    def _match_src(self, u: UOp, store: Store) -> list[Store]:
        if self.src_repeat is not None:
            stores = [store]
            for s in u.src:
                stores = [r for st in stores for r in self.src_repeat.match(s, st)]
                if not stores:
                    return []
            return stores
        out: list[Store] = []
        assert self.src_orders is not None
        for order in self.src_orders:
            if len(u.src) != len(order) and not (self.allow_any_len and len(u.src) >= len(order)):
                continue
            stores = [store]
            for p, s in zip(order, u.src):
                stores = [r for st in stores for r in p.match(s, st)]
                if not stores:
                    break
            out.extend(stores)
        return out

    def names(self) -> list[str]:
        """Capture names in this pattern, in first-binding order."""
        out: dict[str, None] = {}
        stack: list[UPat] = [self]
        while stack:
            p = stack.pop()
            if isinstance(p, UPatAny):
                stack.extend(reversed(p.alternatives))
                continue
            if p.name is not None:
                out[p.name] = None
            if p.src_repeat is not None:
                stack.append(p.src_repeat)
            elif p.src_orders:
                stack.extend(reversed(p.src_orders[0]))
        return list(out)


class UPatAny(UPat):
    """Alternatives: bindings of the first alternative come first."""

    __slots__ = ("alternatives",)

    def __init__(self, pats: Sequence[UPat]) -> None:
        super().__init__()
        self.alternatives = tuple(pats)

    def match(self, u: UOp, store: Store) -> list[Store]:
        return [r for p in self.alternatives for r in p.match(u, store)]

    def __repr__(self) -> str:
        return f"UPat.any({', '.join(map(repr, self.alternatives))})"


# ---------------- compiled matching ----------------
class _Codegen:
    """Generates `def rule(u, ctx)` for one (pattern, fn): nested ifs in continuation-passing style, one block per
    source ordering or alternative, calling fn at the innermost level in the same order the interpreter would."""

    def __init__(self, fn: RuleFn, wants_ctx: bool, env: dict[str, Any] | None = None, fn_name: str = "_fn") -> None:
        self.env: dict[str, Any] = {} if env is None else env
        self.env[fn_name] = fn
        self.fn_name = fn_name
        self.n = 0
        self.wants_ctx = wants_ctx
        # (variable, pattern) pairs whose op an enclosing check already tested: keyed by the pattern too, because a
        # root source variable (_s0...) is shared by every source order and UPat.any alternative of a rule
        self.op_checked: set[tuple[str, int]] = set()
        self.root_locals = False  # the function prologue binds _n, _s0.. for the root's sources

    def const(self, v: Any) -> str:
        name = f"_k{len(self.env)}"
        self.env[name] = v
        return name

    def fresh(self) -> str:
        self.n += 1
        return f"v{self.fn_name}_{self.n}"

    def finish(self, bound: dict[str, str]) -> list[str]:
        args = [f"{k}={v}" for k, v in bound.items()] + (["ctx=ctx"] if self.wants_ctx else [])
        return [f"_r = {self.fn_name}({', '.join(args)})", "if _r is not None and _r is not u: return _r"]

    def gen(self, pat: UPat, var: str, bound: dict[str, str], cont: Callable[[dict[str, str]], list[str]]) -> list[str]:
        if isinstance(pat, UPatAny):
            out: list[str] = []
            for alt in pat.alternatives:
                out += self.gen(alt, var, bound, cont)
            return out
        conds: list[str] = []
        if pat.op is not None and (var, id(pat)) not in self.op_checked:
            conds.append(self.op_cond(pat.op, var))
        nb = bound
        if pat.name is not None and pat.name in bound:
            conds.append(f"{var} is {bound[pat.name]}")
        if pat.dtype is not None:
            d = self.const(frozenset(pat.dtype))
            conds.append(f"({var}.dtype in {d} or {var}.dtype.scalar() in {d})")
        if pat.arg is not None:
            conds.append(f"not ({self.const(pat.arg)} != {var}.arg)")
        if pat.name is not None and pat.name not in bound:
            nb = {**bound, pat.name: var}
        if pat.src is None:
            inner = cont(nb)
        elif pat.src_repeat is not None and _simple(pat.src_repeat):
            # a name-free, source-free repeated pattern is a plain predicate on every source
            sv = self.fresh()
            pc = self.conds(pat.src_repeat, sv)
            if pc:
                # the first source is checked inline: most nodes fail there without starting a generator
                first = " and ".join(c.replace(sv, f"{var}.src[0]") for c in pc)
                test = f"(not {var}.src or ({first})) and all({' and '.join(pc)} for {sv} in {var}.src[1:])"
            else:
                test = "True"
            inner = [f"if {test}:"] + _indent(cont(nb))
        elif pat.src_repeat is not None:
            # a repeated source pattern: defer to the interpreter for this subtree (same order of bindings)
            st = self.fresh()
            names = [n for n in pat.src_repeat.names() if n not in nb]
            dict_expr = "{" + ", ".join(f"{k!r}: {v}" for k, v in nb.items()) + "}"
            after = {**nb, **{n: f"{st}[{n!r}]" for n in names}}
            inner = [f"for {st} in {self.const(pat)}._match_src({var}, {dict_expr}):"] + _indent(cont(after))
        else:
            inner = []
            assert pat.src_orders is not None
            for order in pat.src_orders:
                op = ">=" if pat.allow_any_len else "=="
                # early rejection: the ops of the direct sources are checked together with the source count; the
                # root's sources and their ops are read once into locals by the function's prologue
                root = var == "u" and self.root_locals and len(order) <= _PROLOGUE
                vs = [f"_s{i}" for i in range(len(order))] if root else [self.fresh() for _ in order]
                early = [f"{'_n' if root else f'len({var}.src)'} {op} {len(order)}"]
                for i, (p, v) in enumerate(zip(order, vs)):
                    if not isinstance(p, UPatAny) and p.op is not None:
                        early.append(self.op_cond(p.op, f"_s{i}" if root else f"{var}.src[{i}]"))
                        self.op_checked.add((v, id(p)))
                body = [] if root else [f"{v} = {var}.src[{i}]" for i, v in enumerate(vs)]
                body += self.chain(list(zip(order, vs)), nb, cont)
                inner += [f"if {' and '.join(early)}:"] + _indent(body)
        if not conds:
            return inner
        return [f"if {' and '.join(conds)}:"] + _indent(inner or ["pass"])

    def op_cond(self, ops: tuple[Ops, ...], var: str) -> str:
        return f"{var}.op is {self.const(ops[0])}" if len(ops) == 1 else f"{var}.op in {self.const(frozenset(ops))}"

    def conds(self, pat: UPat, var: str) -> list[str]:
        conds: list[str] = []
        if pat.op is not None:
            conds.append(f"{var}.op is {self.const(pat.op[0])}" if len(pat.op) == 1 else
                         f"{var}.op in {self.const(frozenset(pat.op))}")  # fmt: skip
        if pat.dtype is not None:
            d = self.const(frozenset(pat.dtype))
            conds.append(f"({var}.dtype in {d} or {var}.dtype.scalar() in {d})")
        if pat.arg is not None:
            conds.append(f"not ({self.const(pat.arg)} != {var}.arg)")
        return conds

    def chain(self, items: list[tuple[UPat, str]], bound: dict[str, str],
              cont: Callable[[dict[str, str]], list[str]]) -> list[str]:  # fmt: skip
        if not items:
            return cont(bound)
        (p, v), rest = items[0], items[1:]
        return self.gen(p, v, bound, lambda b: self.chain(rest, b, cont))


_PROLOGUE = 3  # sources of the root bound to locals in a compiled op function


def _simple(p: UPat) -> bool:
    return not isinstance(p, UPatAny) and p.name is None and p.src is None


def _indent(lines: list[str]) -> list[str]:
    return ["  " + ln for ln in lines]


def compile_rule(pat: UPat, fn: RuleFn, wants_ctx: bool) -> Callable[[UOp, Any], UOp | None]:
    """The compiled form of one rule: a function (u, ctx) -> rewritten node or None."""
    cg = _Codegen(fn, wants_ctx)
    body = cg.gen(pat, "u", {}, cg.finish)
    src = "\n".join(["def _rule(u, ctx):"] + _indent(body + ["return None"]))
    exec(compile(src, f"<upat {pat!r:.60}>", "exec"), cg.env)
    rule: Callable[[UOp, Any], UOp | None] = cg.env["_rule"]
    rule.__doc__ = src  # the generated source, for debugging
    return rule


def compile_op_rules(rules: Sequence[tuple[UPat, RuleFn, bool]], op: Ops | None = None
                     ) -> Callable[[UOp, Any], UOp | None]:  # fmt: skip
    """All rules of one root op compiled into a single function (u, ctx) -> rewritten node or None: the rules' checks
    run inline one after the other, in table order, so a node that no rule matches costs one call."""
    env: dict[str, Any] = {}
    body: list[str] = []
    for i, (pat, fn, wants) in enumerate(rules):
        cg = _Codegen(fn, wants, env, f"_fn{i}")
        cg.root_locals = True
        if op is not None and not isinstance(pat, UPatAny) and pat.op is not None and op in pat.op:
            cg.op_checked.add(("u", id(pat)))  # the table dispatches on u.op already
        body += [f"# rule {i}: {pat!r:.100}"] + cg.gen(pat, "u", {}, cg.finish)
    prologue = ["_src = u.src", "_n = len(_src)"]
    for i in range(_PROLOGUE):
        prologue.append(f"_s{i} = _src[{i}] if _n > {i} else None")
    src = "\n".join(["def _match(u, ctx):"] + _indent(prologue + body + ["return None"]))
    exec(compile(src, f"<rules {rules[0][0]!r:.60}>", "exec"), env)
    matcher: Callable[[UOp, Any], UOp | None] = env["_match"]
    matcher.__doc__ = src
    return matcher


def _wants_ctx(fn: RuleFn) -> bool:
    try:
        return "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class PatternMatcher:
    """An ordered table of (UPat, fn) rules. `rewrite(u, ctx)` returns the first non-None fn result whose pattern
    matches u (fn gets the captures as keyword arguments, plus ctx if it asks for it). `pm1 + pm2` concatenates.

    `pure=True` declares that every rule's result depends only on the node it is given (its subgraph: op, dtype,
    sources, arg, tag, bounds) and not on a ctx or any other state. graph_rewrite then keeps, across calls, what each
    node it rewrote (without ctx) became, so later rewrites skip subgraphs already done (`memo`); a sum is pure when
    both parts are."""

    MEMO_LIMIT = 50_000  # entries a pure matcher remembers before starting afresh (they keep their nodes alive;
    # the CNN training step leaves about 12k in symbolic's)

    def __init__(self, patterns: Sequence[tuple[UPat, RuleFn]], compiled: bool | None = None,
                 pure: bool = False) -> None:  # fmt: skip
        self.patterns = list(patterns)
        self.compiled = bool(PMCOMPILE) if compiled is None else compiled
        self.pure = pure
        self._memo: dict[UOp, UOp] = {}
        self.pdict: dict[Ops, list[tuple[UPat, RuleFn, bool]]] = {}
        for pat, fn in self.patterns:
            wants = _wants_ctx(fn)
            ops = _root_ops(pat)
            for op in ops:
                self.pdict.setdefault(op, []).append((pat, fn, wants))
        self._compiled: dict[Ops, Callable[[UOp, Any], UOp | None]] | None = None
        self._modes: dict[bool, PatternMatcher] = {}

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.patterns + other.patterns, self.compiled and other.compiled,
                              self.pure and other.pure)  # fmt: skip

    def memo(self) -> dict[UOp, UOp]:
        """node -> what a ctx-free fixed-point rewrite turned it into, shared by graph_rewrite calls (pure matchers
        only). A full memo is replaced by an empty one, never cleared in place: a rewrite running on another thread
        keeps using the dict it started with."""
        if len(self._memo) > self.MEMO_LIMIT:
            self._memo = {}
        return self._memo

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference to the module-level name bound to it: rules are lambdas, which don't pickle."""
        hints = [getattr(fn, "__module__", None) for _, fn in self.patterns]
        mods = [sys.modules[m] for m in dict.fromkeys(hints) if m in sys.modules] + list(sys.modules.values())
        for mod in mods:
            for name, val in list(getattr(mod, "__dict__", {}).items()):
                if val is self:
                    return (_pattern_matcher_named, (mod.__name__, name))
        raise pickle.PicklingError(f"can't pickle a PatternMatcher of {len(self.patterns)} rules that no module-level "
                                   "name refers to: it pickles by reference (module, name); bind it to a global of an "
                                   "importable module")  # fmt: skip

    def with_mode(self, compiled: bool) -> PatternMatcher:
        """The same rules in the given matching mode (cached, so compiling happens once)."""
        if compiled == self.compiled:
            return self
        other = self._modes.get(compiled)
        if other is None:
            other = self._modes[compiled] = PatternMatcher(self.patterns, compiled, self.pure)
            other._modes[self.compiled] = self
        return other

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        if self.compiled:
            return self.rewrite_compiled(u, ctx)
        return self.rewrite_interpreted(u, ctx)

    def rewrite_interpreted(self, u: UOp, ctx: Any = None) -> UOp | None:
        for pat, fn, wants in self.pdict.get(u.op, ()):
            for store in pat.match(u, {}):
                ret = fn(ctx=ctx, **store) if wants else fn(**store)
                if ret is not None and ret is not u:
                    return ret  # type: ignore[no-any-return]
        return None

    def compiled_table(self) -> dict[Ops, Callable[[UOp, Any], UOp | None]]:
        """op -> the compiled matcher of every rule for that op (built on first use, then cached)."""
        table = self._compiled
        if table is None:
            table = self._compiled = {op: compile_op_rules(rules, op) for op, rules in self.pdict.items()}
        return table

    def interpreted_table(self) -> dict[Ops, Callable[[UOp, Any], UOp | None]]:
        """op -> a function applying that op's rules with the interpreted matcher."""
        return {op: functools.partial(_interpret, rules) for op, rules in self.pdict.items()}

    def op_table(self) -> dict[Ops, Callable[[UOp, Any], UOp | None]]:
        """op -> matcher function in this matcher's mode; graph_rewrite dispatches through it."""
        return self.compiled_table() if self.compiled else self.interpreted_table()

    def rewrite_compiled(self, u: UOp, ctx: Any = None) -> UOp | None:
        f = self.compiled_table().get(u.op)
        return None if f is None else f(u, ctx)

    def rules_for(self, op: Ops) -> Iterator[tuple[UPat, RuleFn]]:
        for p, f, _ in self.pdict.get(op, ()):
            yield p, f


def _interpret(rules: list[tuple[UPat, RuleFn, bool]], u: UOp, ctx: Any) -> UOp | None:
    for pat, fn, wants in rules:
        for store in pat.match(u, {}):
            ret = fn(ctx=ctx, **store) if wants else fn(**store)
            if ret is not None and ret is not u:
                return ret  # type: ignore[no-any-return]
    return None


def _root_ops(pat: UPat) -> tuple[Ops, ...]:
    if isinstance(pat, UPatAny):
        out: dict[Ops, None] = {}
        for a in pat.alternatives:
            out.update(dict.fromkeys(_root_ops(a)))
        return tuple(out)
    return pat.op if pat.op is not None else tuple(Ops)


def _pattern_matcher_named(module: str, name: str) -> PatternMatcher:
    pm = getattr(importlib.import_module(module), name, None)
    if not isinstance(pm, PatternMatcher):
        raise UOpStateError(
            f"unpickling a PatternMatcher: {module}.{name} is {type(pm).__name__}, not a PatternMatcher"
        )
    return pm
