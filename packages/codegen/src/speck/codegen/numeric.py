"""Exact dtype semantics on numpy arrays, shared by the interpreter (programs and unlowered ASTs) and the code the
PythonRenderer emits.

Every value is a numpy array of its *compute* type: numpy's own type for bool/ints/float16/float32/float64, and
float32 holding exactly-representable values for bfloat16 and fp8 (numpy has no such types; every op result is
rounded back to the format, as hardware that emulates them does). Buffers keep the *storage* type: the same, except
bfloat16 and fp8 are stored as their uint16/uint8 bit patterns. Results match `speck.uop.exec_alu` (the constant
folder), so folding a constant never changes what a program computes: fixed-width ints wrap, float ops round once
at their own width (transcendentals are evaluated in float64 then rounded), integer division truncates toward zero
and x // 0 == x % 0 == 0, out-of-range shifts give 0 (or -1 for negative >>), float->int casts truncate and map
NaN/inf to 0."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from speck.codegen.errors import ProgramFormError
from speck.uop import DType, Ops, dtypes, truncate
from speck.uop.alu import threefry_rounds

_NP_STORAGE: dict[DType, Any] = {
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
    dtypes.bfloat16: np.uint16,
    **{d: np.uint8 for d in dtypes.fp8s},
    dtypes.weakint: np.int64,
    dtypes.weakfloat: np.float64,
}
_EMULATED = (dtypes.bfloat16, *dtypes.fp8s)


def storage_np(dt: DType) -> Any:
    """numpy type a buffer of scalar dtype dt is stored as (bit patterns for bfloat16/fp8)."""
    s = dt.scalar()
    if s not in _NP_STORAGE:
        raise ProgramFormError(f"no numpy storage type for {dt}; expected a concrete scalar dtype")
    return _NP_STORAGE[s]


def compute_np(dt: DType) -> Any:
    """numpy type values of dtype dt are computed in (float32 for the emulated bfloat16/fp8)."""
    s = dt.scalar()
    return np.float32 if s in _EMULATED else storage_np(s)


def _fp8_tables(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    from speck.uop.dtype import from_bits

    vals = np.array([from_bits(b, dt) for b in range(256)], dtype=np.float32)
    return vals, np.arange(256, dtype=np.uint8)


_FP8_CACHE: dict[DType, tuple[np.ndarray, np.ndarray]] = {}


def round_to(x: np.ndarray, dt: DType) -> np.ndarray:
    """Round float values (any float numpy type) to dtype dt, returned in dt's compute type."""
    s = dt.scalar()
    if s == dtypes.bfloat16:
        return bf16_from_bits(bf16_bits(np.asarray(x, dtype=np.float32)))
    if dtypes.is_fp8(s):
        f = np.vectorize(lambda v: truncate[s](float(v)), otypes=[np.float32])
        return np.asarray(f(x), dtype=np.float32) if np.size(x) else np.asarray(x, dtype=np.float32)
    return np.asarray(x).astype(compute_np(s))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN stays a quiet NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(x)
    r = np.where(nan, 0x7FC0 | ((u >> 16) & 0x8000), r)
    return r.astype(np.uint16)


def bf16_from_bits(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def to_storage(x: np.ndarray, dt: DType) -> np.ndarray:
    """Compute-type values of dtype dt -> the bits a buffer of dt holds."""
    s = dt.scalar()
    if s == dtypes.bfloat16:
        return bf16_bits(x)
    if dtypes.is_fp8(s):
        from speck.uop.dtype import to_bits

        f = np.vectorize(lambda v: to_bits(float(v), s), otypes=[np.uint8])
        return np.asarray(f(x), dtype=np.uint8) if np.size(x) else np.asarray(x, dtype=np.uint8)
    return np.asarray(x).astype(storage_np(s))


def from_storage(x: np.ndarray, dt: DType) -> np.ndarray:
    """Buffer bits of dtype dt -> compute-type values."""
    s = dt.scalar()
    if s == dtypes.bfloat16:
        return bf16_from_bits(x)
    if dtypes.is_fp8(s):
        if s not in _FP8_CACHE:
            _FP8_CACHE[s] = _fp8_tables(s)
        return _FP8_CACHE[s][0][np.asarray(x, dtype=np.uint8)]
    return np.asarray(x)


def const_array(v: Any, dt: DType) -> np.ndarray:
    """A 0-d array of Python value v (already exact for dt) in dt's compute type."""
    from speck.uop import cast_value

    s = dt.scalar()
    if s in (dtypes.weakint,):
        return np.array(int(v), dtype=np.int64)
    if s == dtypes.weakfloat:
        return np.array(float(v), dtype=np.float64)
    return np.array(cast_value(v, s), dtype=compute_np(s))


def _float_to_int(x: np.ndarray, dt: DType) -> np.ndarray:
    """C-style truncation toward zero; NaN/inf become 0; finite out-of-range values wrap like the constant folder."""
    t = np.trunc(np.asarray(x, dtype=np.float64))
    t = np.where(np.isfinite(t), t, 0.0)
    big = np.abs(t) >= 2.0**63
    out = np.where(big, 0.0, t).astype(np.int64).astype(storage_np(dt))
    if np.any(big):
        flat_t, flat_o = t.reshape(-1), out.reshape(-1)
        for i in np.nonzero(big.reshape(-1))[0]:
            flat_o[i] = truncate[dt](int(flat_t[i]))
        out = flat_o.reshape(t.shape)
    return out


def cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """CAST semantics (value conversion) from dtype src to dtype dst."""
    s, d = src.scalar(), dst.scalar()
    x = np.asarray(x)
    if d == dtypes.bool:
        return np.asarray(x != 0)
    if dtypes.is_int(d):
        if dtypes.is_float(s):
            return _float_to_int(x, d)
        return x.astype(storage_np(d))
    # float destination
    if d in _EMULATED:
        return round_to(x.astype(np.float64) if x.dtype != np.float32 else x, d)
    if dtypes.is_int(s) and s in (dtypes.int64, dtypes.uint64, dtypes.weakint) and d != dtypes.float64:
        # round once: int64 -> float64 is exact only below 2**53; go through Python ints where it is not
        return x.astype(np.float64).astype(compute_np(d))
    return x.astype(compute_np(d))


def bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """BITCAST semantics: reinterpret the bits of each element (same element size)."""
    bits = to_storage(x, src)
    if src.scalar().itemsize != dst.scalar().itemsize:
        raise ProgramFormError(f"bitcast between different element sizes {src} -> {dst} is not supported here")
    return from_storage(np.ascontiguousarray(bits).view(storage_np(dst)), dst)


def _shift(a: np.ndarray, b: np.ndarray, left: bool, dt: DType) -> np.ndarray:
    bits = 8 * dt.scalar().itemsize if not dt.is_weak else 64
    npt = storage_np(dt)
    a = np.asarray(a).astype(npt)
    b64 = np.asarray(b).astype(np.int64)
    bad = (b64 < 0) | (b64 >= bits)
    sb = np.where(bad, 0, b64).astype(npt)
    r = (a << sb) if left else (a >> sb)
    fill = np.zeros((), dtype=npt) if left or dtypes.is_unsigned(dt) else np.where(a < 0, npt(-1), npt(0))
    return np.where(bad, fill, r).astype(npt)


def _rotl32(v: np.ndarray, r: int) -> np.ndarray:
    return (v << np.uint32(r)) | (v >> np.uint32(32 - r))  # type: ignore[no-any-return, unused-ignore]


def threefry2x32(x: np.ndarray, key: np.ndarray) -> np.ndarray:
    """THREEFRY on arrays of uint64 counters and keys: speck.uop's `threefry_rounds` on uint32 arrays, so it matches
    the constant folder bit for bit."""
    x, key = np.asarray(x).astype(np.uint64), np.asarray(key).astype(np.uint64)
    shape = np.broadcast_shapes(x.shape, key.shape)
    x, key = np.atleast_1d(x), np.atleast_1d(key)  # arrays, not numpy scalars: their wrapping adds don't warn

    def words(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (v & np.uint64(0xFFFFFFFF)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)

    (x0, x1), (k0, k1) = words(x), words(key)
    y0, y1 = threefry_rounds(x0, x1, k0, k1, _rotl32, lambda v: v)
    out = (y1.astype(np.uint64) << np.uint64(32)) | y0.astype(np.uint64)
    result: np.ndarray = out.reshape(shape) if out.shape != shape else out
    return result


def _f64(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *a: fn(*[np.asarray(v, dtype=np.float64) for v in a])


_FLOAT_FN: dict[Ops, Callable[..., Any]] = {
    Ops.EXP2: _f64(np.exp2),
    Ops.LOG2: _f64(np.log2),
    Ops.SIN: _f64(lambda a: np.where(np.isinf(a), np.nan, np.sin(a))),
    Ops.SQRT: _f64(np.sqrt),
    Ops.RECIPROCAL: _f64(lambda a: 1.0 / a),
    Ops.POW: _f64(np.power),
}


def alu(op: Ops, dt: DType, *srcs: np.ndarray, src_dt: DType | None = None) -> np.ndarray:
    """Evaluate ALU `op` with result dtype `dt` (src_dt: dtype of the operands, needed for comparisons) on numpy
    compute-type arrays, with the exact semantics described in the module docstring."""
    s = dt.scalar()
    with np.errstate(all="ignore"):
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            a, b = srcs
            return np.asarray(a < b if op is Ops.CMPLT else (a != b if op is Ops.CMPNE else a == b))
        if op is Ops.WHERE:
            c, a, b = srcs
            return np.where(c, a, b).astype(compute_np(s))
        if op is Ops.THREEFRY:
            return threefry2x32(srcs[0], srcs[1])
        npt = compute_np(s)
        xs = [np.asarray(v).astype(npt) for v in srcs]
        if op in _FLOAT_FN and dtypes.is_float(s):
            r = _FLOAT_FN[op](*xs)
            return round_to(r, s)
        if op is Ops.TRUNC:
            return xs[0] if not dtypes.is_float(s) else np.asarray(np.trunc(xs[0]))
        if op is Ops.NEG:
            return np.logical_not(xs[0]) if s == dtypes.bool else round_to(-xs[0], s)
        if op in (Ops.SHL, Ops.SHR):
            return _shift(xs[0], srcs[1], op is Ops.SHL, s)
        if op in (Ops.CDIV, Ops.CMOD):
            a, b = xs
            zero = b == 0
            bb = np.where(zero, npt(1), b)
            rem = np.fmod(a, bb)
            r = rem if op is Ops.CMOD else ((a - rem) // bb)
            return np.asarray(np.where(zero, npt(0), r)).astype(npt)
        if op is Ops.MULACC:  # rounded once, like the constant folder (and a fused multiply-add)
            if dtypes.is_float(s) and s != dtypes.float64:
                return round_to(xs[0].astype(np.float64) * xs[1] + xs[2], s)
            return np.asarray(xs[0] * xs[1] + xs[2]).astype(npt)
        if op is Ops.POW and not dtypes.is_float(s):
            a, b = xs
            r = np.power(a, np.where(b < 0, 0, b).astype(npt))
            return np.where(b < 0, np.where(np.abs(a) == 1, np.where(b % 2 == 0, npt(1), a), npt(0)), r).astype(npt)
        if s == dtypes.bool:
            fns: dict[Ops, Callable[..., Any]] = {
                Ops.ADD: np.logical_or, Ops.MUL: np.logical_and, Ops.MAX: np.logical_or, Ops.OR: np.logical_or,
                Ops.AND: np.logical_and, Ops.XOR: np.logical_xor,
            }  # fmt: skip
            return np.asarray(fns[op](*xs))
        if op is Ops.MAX and dtypes.is_float(s):
            # b if b > a or b is NaN, else a: the compiled renderers' and the constant folder's MAX. NaN propagates
            # and of two equal operands (0.0 and -0.0) the first wins; np.maximum would give the second
            a, b = xs
            r = np.where((b > a) | (b != b), b, a)
            return round_to(r, s) if s in _EMULATED else np.asarray(r).astype(npt)
        binops: dict[Ops, Callable[..., Any]] = {
            Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.divide, Ops.MAX: np.maximum,
            Ops.XOR: np.bitwise_xor, Ops.OR: np.bitwise_or, Ops.AND: np.bitwise_and,
        }  # fmt: skip
        if op not in binops:
            raise ProgramFormError(f"interpreter: no semantics for {op.name} on {dt}")
        r = binops[op](*xs)
        if s in _EMULATED:
            return round_to(r, s)
        return np.asarray(r).astype(npt)


def identity_element(op: Ops, dt: DType) -> Any:
    """The value a reduction with `op` starts from (0 for ADD, 1 for MUL, the smallest value for MAX)."""
    if op is Ops.ADD:
        return False if dt.scalar() == dtypes.bool else (0.0 if dtypes.is_float(dt) else 0)
    if op is Ops.MUL:
        return True if dt.scalar() == dtypes.bool else (1.0 if dtypes.is_float(dt) else 1)
    if op is Ops.MAX:
        v = dtypes.min(dt.scalar())
        return -math.inf if dtypes.is_float(dt) else v
    raise ProgramFormError(f"no identity element for reduce op {op}")


__all__ = [
    "alu",
    "bitcast",
    "cast",
    "compute_np",
    "const_array",
    "from_storage",
    "identity_element",
    "round_to",
    "storage_np",
    "threefry2x32",
    "to_storage",
]
