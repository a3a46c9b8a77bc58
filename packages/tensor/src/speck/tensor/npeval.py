"""A vectorised numpy evaluator of kernel ASTs (KERNEL_CONTRACT section 1).

Every RANGE gets its own numpy axis, so a node's value is an array broadcastable over the kernel's whole iteration
grid; a REDUCE reduces its ranges' axes. It is the realize engine's fallback when codegen can't handle a kernel, and
an independent check of the scheduler's index arithmetic in tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from speck.uop import DType, InvalidType, Ops, PtrDType, UOp, dtypes

_NP: dict[DType, Any] = {
    dtypes.bool: np.bool_,
    dtypes.int8: np.int8,
    dtypes.uint8: np.uint8,
    dtypes.int16: np.int16,
    dtypes.uint16: np.uint16,
    dtypes.int32: np.int32,
    dtypes.uint32: np.uint32,
    dtypes.int64: np.int64,
    dtypes.uint64: np.uint64,
    dtypes.float16: np.float16,
    dtypes.float32: np.float32,
    dtypes.float64: np.float64,
    dtypes.weakint: np.int64,
    dtypes.weakfloat: np.float64,
}


def np_dtype(dt: DType) -> Any:
    """The numpy dtype storing speck dtype dt (RuntimeError for dtypes numpy lacks)."""
    s = dt.base if isinstance(dt, PtrDType) else dt.scalar()
    if s not in _NP:
        raise RuntimeError(f"dtype {s} has no numpy equivalent; use one of {', '.join(d.name for d in _NP)}")
    return _NP[s]


def _cdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):
        bz = b == 0
        bs = np.where(bz, 1, b)
        q = np.abs(a) // np.abs(bs)
        neg = (a < 0) != (bs < 0)
        return np.where(bz, 0, np.where(neg, -q, q)).astype(np.result_type(a, b))
    return np.asarray(np.trunc(a / b))


def _threefry(x: np.ndarray, key: np.ndarray) -> np.ndarray:
    m = np.uint64(0xFFFFFFFF)
    x = x.astype(np.uint64)
    key = np.asarray(key).astype(np.uint64)
    k0, k1 = key & m, (key >> np.uint64(32)) & m
    ks = (k0, k1, np.uint64(0x1BD11BDA) ^ k0 ^ k1)
    x0, x1 = ((x & m) + ks[0]) & m, (((x >> np.uint64(32)) & m) + ks[1]) & m
    rot = ((13, 15, 26, 6), (17, 29, 16, 24))
    for i in range(5):
        for r in rot[i % 2]:
            x0 = (x0 + x1) & m
            x1 = ((x1 << np.uint64(r)) | (x1 >> np.uint64(32 - r))) & m
            x1 = x1 ^ x0
        x0 = (x0 + ks[(i + 1) % 3]) & m
        x1 = (x1 + ks[(i + 2) % 3] + np.uint64(i + 1)) & m
    return (x1 << np.uint64(32)) | x0


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    dt = np.result_type(a)
    bits = np.dtype(dt).itemsize * 8
    bb = np.asarray(b).astype(np.int64)
    ok = (bb >= 0) & (bb < bits)
    sb = np.where(ok, bb, 0).astype(dt)
    r = np.left_shift(a, sb) if left else np.right_shift(a, sb)
    fill = 0 if left else np.where(np.asarray(a) < 0, -1, 0).astype(dt) if np.issubdtype(dt, np.signedinteger) else 0
    return np.where(ok, r, fill).astype(dt)


def _alu(op: Ops, dt: DType, vals: list[Any]) -> Any:
    nd = np_dtype(dt) if op not in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else np.bool_
    a = vals[0]
    if op is Ops.EXP2:
        return np.exp2(a).astype(nd)
    if op is Ops.LOG2:
        return np.log2(a).astype(nd)
    if op is Ops.SIN:
        return np.sin(a).astype(nd)
    if op is Ops.SQRT:
        return np.sqrt(a).astype(nd)
    if op is Ops.RECIPROCAL:
        return (np.asarray(1, dtype=nd) / a).astype(nd)
    if op is Ops.NEG:
        return np.logical_not(a) if nd is np.bool_ else np.negative(a).astype(nd)
    if op is Ops.TRUNC:
        return np.trunc(a).astype(nd) if np.issubdtype(nd, np.floating) else a
    if op is Ops.WHERE:
        return np.where(a, vals[1], vals[2]).astype(nd)
    if op is Ops.MULACC:
        return (a * vals[1] + vals[2]).astype(nd)
    b = vals[1]
    if op is Ops.THREEFRY:
        return _threefry(a, b)
    fns: dict[Ops, Any] = {
        Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.SUB: np.subtract, Ops.FDIV: np.divide, Ops.MAX: np.maximum,
        Ops.POW: np.power, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
    }  # fmt: skip
    if op in fns:
        if nd is np.bool_ and op in (Ops.ADD, Ops.MAX):
            return np.logical_or(a, b)
        if nd is np.bool_ and op is Ops.MUL:
            return np.logical_and(a, b)
        return np.asarray(fns[op](a, b)).astype(nd)
    if op is Ops.CDIV:
        return _cdiv(a, b).astype(nd)
    if op is Ops.CMOD:
        return (a - _cdiv(a, b) * b).astype(nd)
    if op in (Ops.XOR, Ops.OR, Ops.AND):
        f = {Ops.XOR: np.bitwise_xor, Ops.OR: np.bitwise_or, Ops.AND: np.bitwise_and}[op]
        return np.asarray(f(a, b)).astype(nd)
    if op in (Ops.SHL, Ops.SHR):
        return _shift(np.asarray(a).astype(nd), b, op is Ops.SHL)
    raise RuntimeError(f"numpy evaluator: unsupported op {op}")


_IDENT = {Ops.ADD: 0, Ops.MUL: 1}


def eval_kernel(ast: UOp, bufs: list[np.ndarray], var_vals: dict[str, int]) -> None:
    """Run kernel `ast` on flat numpy arrays `bufs` (PARAM slot order), writing its stores in place."""
    axis_of: dict[UOp, int] = {}
    for n in ast.toposort():
        if n.op is Ops.RANGE and n not in axis_of:
            axis_of[n] = len(axis_of)
    nax = len(axis_of)
    vals: dict[UOp, Any] = {}

    def shape_at(ax: int, size: int) -> tuple[int, ...]:
        return tuple(size if i == ax else 1 for i in range(nax))

    with np.errstate(all="ignore"):
        node: UOp
        for node in ast.toposort():
            n = node
            op = n.op
            if op is Ops.CONST:
                vals[n] = None if isinstance(n.arg, InvalidType) else np.asarray(n.arg, dtype=np_dtype(n.dtype))
            elif op is Ops.DEFINE_VAR:
                vals[n] = np.asarray(var_vals[n.arg[0]], dtype=np.int64)
            elif op is Ops.RANGE:
                end = int(vals[n.src[0]])
                vals[n] = np.arange(end, dtype=np.int64).reshape(shape_at(axis_of[n], end))
            elif op is Ops.PARAM:
                vals[n] = bufs[n.arg]
            elif op is Ops.INDEX:
                iu = n.src[1]
                if iu.op is Ops.WHERE and iu.src[2].op is Ops.CONST and isinstance(iu.src[2].arg, InvalidType):
                    vals[n] = (vals[n.src[0]], vals[iu.src[1]], vals[iu.src[0]])
                else:
                    vals[n] = (vals[n.src[0]], vals[iu], None)
            elif op is Ops.WHERE and n.src[2].op is Ops.CONST and isinstance(n.src[2].arg, InvalidType):
                vals[n] = None  # gated index expression: consumed by INDEX through its sources
            elif op is Ops.LOAD:
                buf, ix0, gate = vals[n.src[0]]
                ix: Any = np.asarray(ix0, dtype=np.int64)
                if gate is None:
                    vals[n] = buf[ix]
                else:
                    g, ix = np.broadcast_arrays(np.asarray(gate), ix)
                    safe = np.where(g, ix, 0)
                    alt = vals[n.src[1]] if len(n.src) > 1 else np.zeros((), dtype=buf.dtype)
                    vals[n] = np.where(g, buf[safe] if buf.size else alt, alt)
            elif op is Ops.REDUCE:
                v = np.asarray(vals[n.src[0]])
                axes = tuple(axis_of[r] for r in n.src[1:])
                full = list(np.broadcast_shapes(v.shape, (1,) * nax))
                for r in n.src[1:]:
                    full[axis_of[r]] = int(vals[r.src[0]])
                v = np.broadcast_to(v.reshape(v.shape if v.ndim == nax else (1,) * (nax - v.ndim) + v.shape), full)
                rop, dt = n.arg, np_dtype(n.dtype)
                if rop is Ops.ADD:
                    vals[n] = np.add.reduce(v, axis=axes, keepdims=True, dtype=dt) if dt is not np.bool_ else \
                        np.logical_or.reduce(v, axis=axes, keepdims=True)  # fmt: skip
                elif rop is Ops.MUL:
                    vals[n] = np.multiply.reduce(v, axis=axes, keepdims=True, dtype=dt) if dt is not np.bool_ else \
                        np.logical_and.reduce(v, axis=axes, keepdims=True)  # fmt: skip
                else:
                    ident = dtypes.min(n.dtype)
                    vals[n] = np.maximum.reduce(v, axis=axes, keepdims=True, initial=ident).astype(dt)
            elif op is Ops.STORE:
                buf, ix0, gate = vals[n.src[0]]
                v = vals[n.src[1]]
                ix, v = np.broadcast_arrays(np.asarray(ix0, dtype=np.int64), np.asarray(v))
                if gate is not None:
                    g = np.broadcast_to(gate, ix.shape)
                    ix, v = ix[g], v[g]
                buf[ix.reshape(-1)] = v.reshape(-1)
            elif op is Ops.CAST:
                src = np.asarray(vals[n.src[0]])
                nd = np_dtype(n.dtype)
                if np.issubdtype(src.dtype, np.floating) and np.issubdtype(nd, np.integer):
                    src = np.where(np.isfinite(src), src, 0)
                    src = np.trunc(src)
                    info = np.iinfo(nd)
                    if np.issubdtype(nd, np.unsignedinteger):
                        src = np.where(src < 0, src.astype(np.int64).astype(nd), np.clip(src, 0, info.max))
                    else:
                        src = np.clip(src, info.min, info.max)
                vals[n] = src.astype(nd)
            elif op is Ops.BITCAST:
                src = np.ascontiguousarray(vals[n.src[0]])
                vals[n] = src.view(np_dtype(n.dtype))
            elif op in (Ops.END, Ops.SINK, Ops.DEVICE, Ops.UNIQUE):
                vals[n] = None
            elif op is Ops.BIND:
                vals[n] = np.asarray(n.src[1].arg, dtype=np.int64)
            else:
                vals[n] = _alu(op, n.dtype, [vals[s] for s in n.src])
