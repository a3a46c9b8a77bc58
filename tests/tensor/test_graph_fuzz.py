"""Differential fuzzing of whole op graphs: hypothesis draws a random program of 3-10 ops (elementwise, movement,
reductions, contiguous, writes into an input) over 1-3 input arrays, and a tiny interpreter runs it with speck and
with numpy side by side. Every CPU backend, TinyJit (fresh inputs each call) and NOOPT on/off must give numpy's
result: a miscompile in the scheduler, fusion, the optimizer or a backend shows as a mismatch.

The program is drawn while numpy evaluates it, so each op is chosen knowing its operands' shapes and values: ops
whose result would be huge or not finite are redrawn, and values that came through a rounding op (div, exp, log,
sqrt, mean) are marked inexact so that comparisons, float->int casts and argmax (which would amplify a last-bit
difference into a different answer) only see exact values. `HYPOTHESIS_PROFILE=dev` searches harder."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, TinyJit, dtypes
from speck.tensor.errors import JitError

NP_OF = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_}
SP_OF = {"float32": dtypes.float32, "float16": dtypes.float16, "int32": dtypes.int32, "bool": dtypes.bool}
RANK = ["bool", "int32", "float16", "float32"]  # the common dtype of two operands is the higher one
EXACT_LIMIT = 2048  # integers up to this are exact in float16, the narrowest float here
LIMIT = 1e4  # ops whose result exceeds this (or is not finite) are redrawn


@dataclass
class Op:
    kind: str
    args: tuple[int, ...]  # indices into the value list (inputs first)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Program:
    inputs: list[tuple[tuple[int, ...], str]]  # shape, dtype
    ops: list[Op]
    outputs: list[int]  # values realized together at the end

    def __repr__(self) -> str:  # the shrunk failure prints as a readable listing
        lines = [f"v{i} = input{s} {d}" for i, (s, d) in enumerate(self.inputs)]
        lines += [f"v{len(self.inputs) + k} = {o.kind}{tuple(f'v{a}' for a in o.args)} {o.params}" for k, o in
                  enumerate(self.ops)]  # fmt: skip
        return "\n".join([*lines, f"outputs: {self.outputs}"])


def _dt(a: np.ndarray) -> str:
    return "bool" if a.dtype == np.bool_ else str(a.dtype)


def _common(x: str, y: str) -> str:
    return max(x, y, key=RANK.index)


# ---------------- the interpreter: one op on numpy (eager) or on speck (lazy) ----------------
def _cast(v: Any, dt: str, sp: bool) -> Any:
    return v.cast(SP_OF[dt]) if sp else v.astype(NP_OF[dt])


def _binary(kind: str, x: Any, y: Any, dt: str, sp: bool) -> Any:
    x, y = _cast(x, dt, sp), _cast(y, dt, sp)
    if kind == "add":
        return x + y
    if kind == "sub":
        return x - y
    if kind == "mul":
        return x * y
    if kind == "max":
        return x.maximum(y) if sp else np.maximum(x, y)
    if kind == "div":  # a safe denominator: |y| + 1
        d = y.abs() + 1 if sp else np.abs(y) + NP_OF[dt](1)
        if dt == "int32":
            return x // d
        return x / d
    if kind in ("lt", "eq", "ne"):
        return {"lt": x < y, "eq": x == y, "ne": x != y}[kind]
    raise AssertionError(kind)


def _unary(kind: str, x: Any, sp: bool) -> Any:
    if kind == "exp":  # scaled down so that chains stay finite
        return (x * 0.125).exp() if sp else np.exp(x * x.dtype.type(0.125))
    if kind == "log":
        return (x.abs() + 1).log() if sp else np.log(np.abs(x) + x.dtype.type(1))
    if kind == "sqrt":
        return x.abs().sqrt() if sp else np.sqrt(np.abs(x))
    if kind == "neg":
        return -x
    raise AssertionError(kind)


def _reduce(kind: str, x: Any, axis: tuple[int, ...], keepdim: bool, sp: bool) -> Any:
    if sp:
        if kind == "argmax":
            return x.argmax(axis=axis[0], keepdim=keepdim)
        return getattr(x, kind)(axis=axis, keepdim=keepdim)
    dt = _dt(x)
    if kind == "argmax":
        r = np.argmax(x, axis=axis[0], keepdims=keepdim).astype(np.int32)
        return r
    if kind == "sum":  # speck sums bools and ints as int32, halves in a wider accumulator
        acc = {"bool": np.int64, "int32": np.int64, "float16": np.float32, "float32": np.float64}[dt]
        out = {"bool": np.int32, "int32": np.int32}.get(dt, NP_OF[dt])
        return np.sum(x.astype(acc), axis=axis, keepdims=keepdim).astype(out)
    if kind == "mean":
        out = np.float16 if dt == "float16" else np.float32
        return np.mean(x.astype(np.float64), axis=axis, keepdims=keepdim).astype(out)
    return (np.max if kind == "max" else np.min)(x, axis=axis, keepdims=keepdim)


def apply(op: Op, vals: list[Any], sp: bool) -> Any:
    out = _apply(op, vals, sp)
    return out if sp else np.asarray(out)  # numpy hands back scalars for 0-d results


def _apply(op: Op, vals: list[Any], sp: bool) -> Any:
    """The op on numpy arrays (sp=False) or speck tensors (sp=True); writes mutate vals[op.args[0]] in place."""
    p, a = op.params, [vals[i] for i in op.args]
    k = op.kind
    if k in ("add", "sub", "mul", "max", "div", "lt", "eq", "ne"):
        return _binary(k, a[0], a[1], p["dt"], sp)
    if k in ("exp", "log", "sqrt", "neg"):
        return _unary(k, a[0], sp)
    if k == "where":
        c = _cast(a[0], "bool", sp)
        x, y = _cast(a[1], p["dt"], sp), _cast(a[2], p["dt"], sp)
        return c.where(x, y) if sp else np.where(c, x, y)
    if k == "cast":
        return _cast(a[0], p["dt"], sp)
    if k == "contiguous":
        return a[0].contiguous() if sp else a[0].copy()
    if k == "reshape":
        return a[0].reshape(p["shape"])
    if k == "permute":
        return a[0].permute(p["order"]) if sp else np.transpose(a[0], p["order"])
    if k == "expand":
        return a[0].reshape(p["mid"]).expand(p["shape"]) if sp else np.broadcast_to(a[0].reshape(p["mid"]), p["shape"])
    if k == "pad":
        return a[0].pad(p["pad"]) if sp else np.pad(a[0], p["pad"])
    if k == "shrink":
        return a[0].shrink(p["arg"]) if sp else a[0][tuple(slice(b, e) for b, e in p["arg"])]
    if k == "flip":
        return a[0].flip(p["axes"]) if sp else np.flip(a[0], p["axes"])
    if k == "getitem":
        return a[0][p["index"]]
    if k == "cat":
        return a[0].cat(a[1], dim=p["dim"]) if sp else np.concatenate([a[0], a[1]], axis=p["dim"])
    if k in ("sum", "max_r", "min_r", "mean", "argmax"):
        return _reduce(k.removesuffix("_r"), a[0], p["axis"], p["keepdim"], sp)
    if k in ("assign", "setitem"):  # write a[1] (cast to the input's dtype) into the input a[0]
        v = _cast(a[1], p["dt"], sp)
        idx = p.get("index", ())
        if sp:
            if k == "assign":
                a[0].assign(v.contiguous() if p["contig"] else v)
            else:
                a[0][idx] = v
            return a[0]
        target = np.array(a[0])  # numpy: earlier reads keep the old value, as in speck
        target[idx] = v
        vals[op.args[0]] = target
        return target
    raise AssertionError(k)


def buffer(a: np.ndarray, device: str) -> Tensor:
    """A realized buffer holding a (Tensor(0-d array) is a device-less constant: clone gives it storage)."""
    t = Tensor(a, device=device)
    return (t.clone(device) if t.device is None else t).realize()


def run_speck(prog: Program, arrays: list[np.ndarray], device: str) -> tuple[list[np.ndarray], list[int]]:
    """The outputs, and for each value the earlier value it is the same Tensor object as (itself if none)."""
    vals: list[Any] = [buffer(a, device) for a in arrays]
    alias = list(range(len(vals)))
    for op in prog.ops:
        out = apply(op, vals, sp=True)
        alias.append(next((alias[j] for j, v in enumerate(vals) if v is out), len(vals)))
        vals.append(out)
    outs = [vals[i] for i in prog.outputs]
    Tensor.realize(*outs)
    return [o.numpy() for o in outs], alias


MOVEMENT = frozenset({"reshape", "permute", "expand", "pad", "shrink", "flip", "getitem"})


@dataclass
class View:
    """A movement-op chain over input `root`: speck's views of a buffer see later writes to it (reads - computing
    ops, contiguous(), cat - keep the value of their time)."""

    root: int
    ops: tuple[Op, ...]

    def value(self, vals: list[Any]) -> np.ndarray:
        a = vals[self.root]
        for op in self.ops:
            a = apply(Op(op.kind, (0,), op.params), [a], sp=False)
        return a


def run_numpy(prog: Program, arrays: list[np.ndarray], alias: list[int]) -> list[np.ndarray]:
    """numpy's result under speck's write semantics. Ops speck answers with the operand itself (contiguous() of a
    buffer, a same-dtype cast, a write) give the same Python object: alias makes those values follow their root."""
    vals: list[Any] = [a.copy() for a in arrays]

    def read(i: int) -> np.ndarray:
        v = vals[alias[i]]
        return v.value(vals) if isinstance(v, View) else v

    for op in prog.ops:
        src = [vals[alias[i]] for i in op.args]
        if op.kind in MOVEMENT and (isinstance(src[0], View) or alias[op.args[0]] < len(arrays)):
            base = src[0] if isinstance(src[0], View) else View(alias[op.args[0]], ())
            vals.append(View(base.root, (*base.ops, op)))
        elif op.kind in ("assign", "setitem"):
            root = alias[op.args[0]]
            view = [vals[root], read(op.args[1])]
            apply(Op(op.kind, (0, 1), op.params), view, sp=False)
            vals[root] = view[0]
            vals.append(view[0])
        else:
            vals.append(apply(Op(op.kind, tuple(range(len(op.args))), op.params), [read(i) for i in op.args], False))
    return [np.asarray(read(i)) for i in prog.outputs]


# ---------------- the strategy ----------------
def _array(draw: st.DrawFn, shape: tuple[int, ...], dt: str) -> np.ndarray:
    n = int(np.prod(shape))
    if dt == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.bool_).reshape(shape)
    # small halves and integers: exact in every dtype, so that sums and products stay exact
    vals = draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n))
    a = np.array(vals, np.float64).reshape(shape)
    return (a if dt == "int32" else a / 2).astype(NP_OF[dt])


def _is_exact(a: np.ndarray) -> bool:
    if a.dtype == np.bool_ or a.size == 0:
        return True
    f = a.astype(np.float64)
    return bool(np.all(np.isfinite(f)) and np.all(f * 2 == np.round(f * 2)) and np.all(np.abs(f) <= EXACT_LIMIT))


def _factor_shape(draw: st.DrawFn, n: int) -> tuple[int, ...]:
    """A random shape with n elements (n == 0 keeps one 0 dim)."""
    if n == 0:
        return draw(st.sampled_from([(0,), (0, 2), (3, 0), (1, 0, 1)]))
    dims: list[int] = []
    while n > 1 and len(dims) < 3:
        d = draw(st.sampled_from([x for x in range(1, n + 1) if n % x == 0]))
        dims.append(d)
        n //= d
    dims.append(n)
    if draw(st.booleans()):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    return tuple(dims)


def _draw_op(draw: st.DrawFn, vals: list[np.ndarray], exact: list[bool], n_inputs: int) -> Op | None:
    """One op over the current values, or None when the drawn kind does not fit them."""
    i = len(vals) - 1 if draw(st.booleans()) else draw(st.integers(0, len(vals) - 1))  # mostly chains
    x = vals[i]
    kind = draw(st.sampled_from([
        "add", "sub", "mul", "max", "div", "lt", "eq", "ne", "exp", "log", "sqrt", "neg", "where", "cast",
        "contiguous", "reshape", "permute", "expand", "pad", "shrink", "flip", "getitem", "cat",
        "sum", "max_r", "min_r", "mean", "argmax", "assign", "setitem",
    ]))  # fmt: skip
    same = [j for j, v in enumerate(vals) if v.shape == x.shape]
    if kind in ("add", "sub", "mul", "max", "div", "lt", "eq", "ne"):
        j = draw(st.sampled_from(same))
        dt = _common(_dt(x), _dt(vals[j]))
        if kind in ("add", "sub", "mul", "div") and dt == "bool":
            dt = "int32"
        if kind in ("lt", "eq", "ne") and not (exact[i] and exact[j]):
            return None
        if kind == "div" and dt == "int32" and not (exact[i] and exact[j]):
            return None
        return Op(kind, (i, j), {"dt": dt})
    if kind in ("exp", "log", "sqrt"):
        return Op(kind, (i,)) if _dt(x) in ("float16", "float32") else None
    if kind == "neg":
        return Op(kind, (i,)) if _dt(x) != "bool" else None
    if kind == "where":
        if not exact[i]:
            return None
        j, k = draw(st.sampled_from(same)), draw(st.sampled_from(same))
        return Op(kind, (i, j, k), {"dt": _common(_dt(vals[j]), _dt(vals[k]))})
    if kind == "cast":
        dt = draw(st.sampled_from(RANK))
        if dt in ("int32", "bool") and _dt(x) in ("float16", "float32") and not exact[i]:
            return None
        return Op(kind, (i,), {"dt": dt})
    if kind == "contiguous":
        return Op(kind, (i,))
    if kind == "reshape":
        return Op(kind, (i,), {"shape": _factor_shape(draw, x.size)})
    if kind == "permute":
        return Op(kind, (i,), {"order": tuple(draw(st.permutations(range(x.ndim))))})
    if kind == "expand":  # insert 1s at random places, then expand 1s to random sizes
        mid = list(x.shape)
        for _ in range(draw(st.integers(0, 2))):
            if len(mid) < 4:
                mid.insert(draw(st.integers(0, len(mid))), 1)
        shape = tuple(draw(st.integers(1, 3)) if d == 1 else d for d in mid)
        return Op(kind, (i,), {"mid": tuple(mid), "shape": shape})
    if kind == "pad":
        if x.ndim == 0:
            return None
        pad = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in x.shape)
        return Op(kind, (i,), {"pad": pad})
    if kind == "shrink":
        arg = []
        for d in x.shape:
            b = draw(st.integers(0, d))
            arg.append((b, draw(st.integers(b, d))))
        return Op(kind, (i,), {"arg": tuple(arg)})
    if kind == "flip":
        if x.ndim == 0:
            return None
        axes = tuple(sorted(draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
        return Op(kind, (i,), {"axes": axes})
    if kind == "getitem":
        index = tuple(_slice(draw, d) for d in x.shape)
        return Op(kind, (i,), {"index": index})
    if kind == "cat":
        if x.ndim == 0:
            return None
        dim = draw(st.integers(0, x.ndim - 1))
        fits = [j for j, v in enumerate(vals) if v.ndim == x.ndim and all(
            a == b for k, (a, b) in enumerate(zip(v.shape, x.shape)) if k != dim) and _dt(v) == _dt(x)]  # fmt: skip
        return Op(kind, (i, draw(st.sampled_from(fits))), {"dim": dim})
    if kind in ("sum", "max_r", "min_r", "mean", "argmax"):
        if x.ndim == 0:
            return None
        if kind == "argmax":
            if not exact[i] or x.dtype == np.bool_:
                return None
            axis: tuple[int, ...] = (draw(st.integers(0, x.ndim - 1)),)
        else:
            axis = tuple(sorted(draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
        if kind != "sum" and any(x.shape[a] == 0 for a in axis):
            return None  # max/min/mean/argmax of nothing: no value to agree on
        if kind == "mean" and x.dtype == np.bool_:
            return None
        return Op(kind, (i,), {"axis": axis, "keepdim": draw(st.booleans())})
    if kind in ("assign", "setitem"):
        t = draw(st.integers(0, n_inputs - 1))
        target = vals[t]
        if kind == "assign":
            src = [j for j, v in enumerate(vals) if v.shape == target.shape]
            j = draw(st.sampled_from(src))
            return Op(kind, (t, j), {"dt": _dt(target), "contig": draw(st.booleans())}) if _castable(
                vals[j], exact[j], _dt(target)) else None  # fmt: skip
        index = tuple(_slice(draw, d) for d in target.shape)
        view = target[index]
        src = [j for j, v in enumerate(vals) if v.shape == view.shape]
        if not src:
            return None
        j = draw(st.sampled_from(src))
        if not _castable(vals[j], exact[j], _dt(target)):
            return None
        return Op(kind, (t, j), {"dt": _dt(target), "index": index})
    raise AssertionError(kind)


def _castable(v: np.ndarray, exact: bool, dt: str) -> bool:
    return exact or dt in ("float16", "float32")


def _slice(draw: st.DrawFn, n: int) -> slice:
    step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
    start = draw(st.none() | st.integers(-n - 1, n + 1))
    stop = draw(st.none() | st.integers(-n - 1, n + 1))
    return slice(start, stop, step)


@st.composite
def programs(draw: st.DrawFn) -> tuple[Program, list[np.ndarray]]:
    n_inputs = draw(st.integers(1, 3))
    base = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 2, 3, 4]), min_size=0, max_size=3)))
    inputs: list[tuple[tuple[int, ...], str]] = []
    arrays: list[np.ndarray] = []
    for _ in range(n_inputs):
        shape = base if draw(st.integers(0, 3)) else tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
        dt = draw(st.sampled_from(RANK))
        inputs.append((shape, dt))
        arrays.append(_array(draw, shape, dt))
    vals = [a.copy() for a in arrays]
    exact = [True] * n_inputs
    ops: list[Op] = []
    target = draw(st.integers(3, 10))
    tries = 0
    while len(ops) < target and tries < 60:
        tries += 1
        op = _draw_op(draw, vals, exact, n_inputs)
        if op is None:
            continue
        trial = list(vals)
        with np.errstate(all="ignore"):
            out = np.asarray(apply(op, trial, sp=False))
        if out.dtype.kind == "f" and out.size and not (np.all(np.isfinite(out)) and np.abs(out).max() <= LIMIT):
            continue
        if out.size > 4096:
            continue
        vals[:] = trial
        vals.append(out)
        inexact_op = op.kind in ("div", "exp", "log", "sqrt", "mean") and out.dtype.kind == "f"
        exact.append(all(exact[a] for a in op.args) and not inexact_op and _is_exact(out))
        if op.kind in ("assign", "setitem"):
            exact[op.args[0]] = exact[-1]
        ops.append(op)
    n = len(vals)
    extra = draw(st.sets(st.integers(0, n - 2), max_size=2)) if n > 1 else set()
    return Program(inputs, ops, sorted(extra | {n - 1})), arrays


# ---------------- the comparison ----------------
def assert_same(got: list[np.ndarray], want: list[np.ndarray], prog: Program, what: str) -> None:
    scale = max([1.0] + [float(np.abs(w.astype(np.float64)).max()) for w in want if w.size])
    for k, (g, w) in enumerate(zip(got, want)):
        msg = f"{what}: output {k} (v{prog.outputs[k]}) differs\n{prog!r}\ngot {g!r}\nwant {w!r}"
        assert g.shape == w.shape, msg
        assert _dt(g) == _dt(w), msg
        if w.dtype.kind == "f":
            tol = 2e-2 if w.dtype == np.float16 or _touches_half(prog) else 1e-4
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale,
                                       err_msg=msg)  # fmt: skip
        else:
            np.testing.assert_array_equal(g, w, err_msg=msg)


def _touches_half(prog: Program) -> bool:
    """Some value went through float16 (a float32 output can carry float16's rounding: exp/log there are ~1 ulp)."""
    return any(d == "float16" for _, d in prog.inputs) or any(o.params.get("dt") == "float16" for o in prog.ops)


BACKENDS = ["CPU:LLVM", pytest.param("CPU:CLANG", marks=pytest.mark.c_backend), "CPU:X86", "PYTHON"]


@pytest.mark.parametrize("device", BACKENDS)
@given(case=programs())
def test_random_graph_matches_numpy(device: str, case: tuple[Program, list[np.ndarray]]) -> None:
    prog, arrays = case
    got, alias = run_speck(prog, arrays, device)
    assert_same(got, run_numpy(prog, arrays, alias), prog, device)


@given(case=programs(), noopt=st.booleans())
def test_random_graph_matches_numpy_with_and_without_opts(case: tuple[Program, list[np.ndarray]], noopt: bool) -> None:
    prog, arrays = case
    with Context(NOOPT=int(noopt)):
        got, alias = run_speck(prog, arrays, "CPU")
        assert_same(got, run_numpy(prog, arrays, alias), prog, f"NOOPT={int(noopt)}")


@given(case=programs(), data=st.data())
def test_random_graph_under_tinyjit(case: tuple[Program, list[np.ndarray]], data: st.DataObject) -> None:
    prog, arrays = case
    alias = run_speck(prog, arrays, "CPU")[1]

    @TinyJit
    def f(*xs: Tensor) -> list[Tensor]:
        vals: list[Any] = list(xs)
        for op in prog.ops:
            vals.append(apply(op, vals, sp=True))
        return [vals[i].contiguous() for i in prog.outputs]

    for call in range(3):
        # fresh inputs: the same values shuffled, so that the program's value ranges (chosen for the first) still fit
        fresh = [a if call == 0 else data.draw(st.permutations(a.ravel().tolist())) for a in arrays]
        fresh = [np.array(v, a.dtype).reshape(a.shape) for v, a in zip(fresh, arrays)]
        try:
            got = [o.numpy() for o in f(*[buffer(a, "CPU") for a in fresh])]
        except JitError as e:  # a program of views of its inputs and of empty arrays has nothing to capture
            assert "didn't JIT anything" in str(e) and call == 1, e
            return
        assert_same(got, run_numpy(prog, fresh, alias), prog, f"TinyJit call {call}")


@settings(max_examples=min(10, settings.default.max_examples))  # each kernel is searched and timed: a few programs
@given(case=programs())
def test_random_graph_matches_numpy_under_beam_search(case: tuple[Program, list[np.ndarray]]) -> None:
    prog, arrays = case
    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECK_CACHE_DIR", cache)  # the winners are cached on disk: not in the user's cache
        with Context(BEAM=2, BEAM_TIMEOUT=0.5, IGNORE_BEAM_CACHE=1):
            got, alias = run_speck(prog, arrays, "CPU")
    assert_same(got, run_numpy(prog, arrays, alias), prog, "BEAM=2")
