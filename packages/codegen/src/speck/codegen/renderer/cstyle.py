"""ClangRenderer: a linearized program (KERNEL_CONTRACT.md section 2) -> freestanding GNU C11 with vector extensions.

The output includes no headers: the few types and helpers a kernel needs are emitted in front of it, only when used.
It compiles with both clang and gcc (`-ffreestanding -fPIC -O2 -c`, see compiler/clang.py for the exact flags) and
needs no `-fwrapv`: the renderer itself keeps every C operation defined.

Semantics (each choice matches the reference interpreter / speck.uop's exact folding):
- Integer ADD/SUB/MUL/NEG/SHL that may overflow (judged from the UOps' exact bounds) are computed in the unsigned
  type of the same width and converted back, so they wrap instead of being undefined. Index arithmetic whose bounds
  fit is written plainly (`ridx0 * 4 + ridx1`).
- CDIV/CMOD are C's `/` and `%`; when the divisor may be 0 (or -1 with a dividend that may be the minimum) a helper
  returns 0 for x/0 and x%0 and wraps MIN/-1, instead of trapping. Shifts by an amount outside [0, bits) give 0
  (-1 for an arithmetic right shift of a negative value), again through a guard only when the bounds need it.
- MAX propagates NaN (`b > a || b != b ? b : a`); CMPLT is false and CMPNE true on NaN (C's own comparisons).
- float16 is storage (arithmetic arrives already widened to float by the pipeline), read through an exact integer
  decoder. Whether the compiler has `_Float16` is detected by the compiler itself, in the preprocessor
  (`__FLT16_MAX__`, defined exactly where the type exists; gcc 12 has it on x86, clang 14 has not): with it, halves
  are `_Float16` written with `(_Float16)` from float (F16C); without it (or with `-DSPECK_NO_FLOAT16`) they are
  `unsigned short` bits written by an integer encoder that rounds to nearest even and quiets NaNs the way F16C
  does, so both give the same bits and one rendered source serves every compiler. float64 -> float16 rounds to odd
  at float precision first, which is exact. This keeps objects free of libgcc half helpers (__nehf2...).
- bfloat16 and fp8 are integer storage with conversion helpers (round to nearest even; fp8 saturates finite
  overflow; the layouts come from speck.uop's FP8_FORMATS table).
- Float -> integer casts truncate and wrap modulo 2**64 like the interpreter (NaN/inf give 0) through a
  helper, never an undefined C conversion; int64 -> float32 rounds through float64 as the interpreter does.
- Literals come only from casted consts `CAST(dt, CONST(v))`; a bare strongly-typed CONST is an error.
- Vectors use `vector_size` typedefs; contiguous vector loads/stores go through `__builtin_memcpy` (unaligned safe);
  comparisons/selects/MAX use integer masks and bitwise selects (C has no vector `?:`), plain casts use
  `__builtin_convertvector`; ops without a portable vector form are written lane by lane into a compound literal."""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from speck.codegen.errors import NoTypeError, ProgramFormError, UnsupportedOpError
from speck.codegen.renderer import DEFAULT_SUPPORTED_OPS, Renderer
from speck.codegen.renderer.common import (
    bare_const_error,
    casted_const,
    divisor_safe,
    int_fits,
    kernel_signature,
    shift_safe,
)
from speck.uop import DType, GroupOp, Ops, PtrDType, UOp, dtypes
from speck.uop.dtype import FP8_FORMATS

# ---------------------------------------------------------------------------------------------------------------------
# C types and literals

_CTYPE: dict[DType, str] = {
    dtypes.bool: "_Bool",
    dtypes.int8: "signed char",
    dtypes.uint8: "unsigned char",
    dtypes.int16: "short",
    dtypes.uint16: "unsigned short",
    dtypes.int32: "int",
    dtypes.uint32: "unsigned int",
    dtypes.int64: "long",
    dtypes.uint64: "unsigned long",
    dtypes.float16: "__speck_f16",
    dtypes.bfloat16: "__speck_bf16",
    **{d: f"__speck_{d.short_name}" for d in FP8_FORMATS},
    dtypes.float32: "float",
    dtypes.float64: "double",
}
# short names for vector typedefs; vectors of bool are bytes holding 0/1
_VSHORT: dict[DType, str] = {
    dtypes.bool: "bool",
    dtypes.int8: "i8",
    dtypes.uint8: "u8",
    dtypes.int16: "i16",
    dtypes.uint16: "u16",
    dtypes.int32: "i32",
    dtypes.uint32: "u32",
    dtypes.int64: "i64",
    dtypes.uint64: "u64",
    dtypes.float16: "f16",
    dtypes.bfloat16: "bf16",
    **{d: d.short_name for d in FP8_FORMATS},
    dtypes.float32: "f32",
    dtypes.float64: "f64",
}
# element type of the vector typedefs (vector_size needs an arithmetic element type)
_VELEM: dict[DType, str] = {**_CTYPE, dtypes.bool: "unsigned char", dtypes.bfloat16: "unsigned short",
                            **{d: "unsigned char" for d in FP8_FORMATS}}  # fmt: skip
_UNSIGNED_TWIN = {
    dtypes.int8: dtypes.uint8,
    dtypes.int16: dtypes.uint16,
    dtypes.int32: dtypes.uint32,
    dtypes.int64: dtypes.uint64,
}
_STORAGE = {dtypes.bfloat16, *FP8_FORMATS}  # float formats kept as integer bits
_MASK_INT = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}  # vector select masks by lane size


def _f32_text(v: float) -> str:
    return _f32_text_cached(v, math.copysign(1.0, v) < 0)  # the sign in the key keeps -0.0 apart from 0.0


@functools.lru_cache(maxsize=4096)
def _f32_text_cached(v: float, _neg: bool) -> str:
    """Shortest decimal that reads back (correctly rounded, as C does) as float32 v, with the `f` suffix, written the
    way Python writes floats (`16777216.0f`, `1e+30f`)."""
    s = str(np.float32(v))  # numpy's shortest unique float32 digits
    t = repr(float(s))  # the same digits in Python's layout; kept only if it provably still reads back as v
    m, e = math.frexp(abs(v))
    # the smaller distance to a neighbouring float32 (conservative at powers of two and at zero)
    gap = 2.0 ** max(e - 24 - (1 if m == 0.5 else 0), -149) if v != 0 else 2.0**-149
    if abs(Fraction(t) - Fraction(v)) < Fraction(gap) / 2:
        s = t
    if "." not in s and "e" not in s:
        s += ".0"
    return s + "f"


def _f64_text(v: float) -> str:
    s = repr(float(v))
    return s if ("." in s or "e" in s) else s + ".0"


def _special_float(v: float, single: bool) -> str | None:
    if math.isinf(v):
        return ("-" if v < 0 else "") + ("__builtin_inff()" if single else "__builtin_inf()")
    if math.isnan(v):
        return ("-" if math.copysign(1.0, v) < 0 else "") + ('__builtin_nanf("")' if single else '__builtin_nan("")')
    return None


def c_literal(v: Any, dt: DType) -> str:
    """The C spelling of value v (already truncated to scalar dtype dt): `1.0f`, `1.0`, `1`, `1l`, `1u`, `1ul`,
    `(short)1`, `__speck_f32_to_f16(1.0f)`, `__speck_f32_to_bf16(1.0f)`, `__builtin_inff()`... Each reads back
    exactly."""
    dt = dt.scalar()
    if dt == dtypes.bool:
        return "1" if v else "0"
    if dtypes.is_int(dt):
        v = int(v)
        if dt == dtypes.int32:
            return "(-2147483647-1)" if v == -(2**31) else str(v)
        if dt == dtypes.int64:
            return "(-9223372036854775807l-1l)" if v == -(2**63) else f"{v}l"
        if dt == dtypes.uint32:
            return f"{v}u"
        if dt == dtypes.uint64:
            return f"{v}ul"
        return f"({_CTYPE[dt]}){v}"
    v = float(v)
    if dt == dtypes.float64:
        return _special_float(v, False) or _f64_text(v)
    f = _special_float(v, True) or _f32_text(v)  # every narrower format holds values exactly representable in float
    if dt == dtypes.float32:
        return f
    return f"{_TO_STORAGE[dt]}({f})"


# ---------------------------------------------------------------------------------------------------------------------
# prelude: typedefs and helpers, emitted on demand, in this order

_TO_STORAGE = {dtypes.float16: "__speck_f32_to_f16", dtypes.bfloat16: "__speck_f32_to_bf16",
               **{d: f"__speck_f64_to_{d.short_name}" for d in FP8_FORMATS}}  # fmt: skip
_FROM_STORAGE = {dtypes.bfloat16: "__speck_bf16_to_f32", **{d: f"__speck_{d.short_name}_to_f32" for d in FP8_FORMATS}}

_BF16_HELPERS = """typedef unsigned short __speck_bf16;
static inline float __speck_bf16_to_f32(unsigned short b) { unsigned int u = (unsigned int)b << 16; float f; \
__builtin_memcpy(&f, &u, 4); return f; }
/* round to nearest even; NaN stays a quiet NaN with its sign */
static inline unsigned short __speck_f32_to_bf16(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return (unsigned short)(0x7FC0u | ((u >> 16) & 0x8000u));
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}"""

_FP8 = FP8_FORMATS


def _fp8_helpers(dt: DType) -> str:
    """Decoder (exact, to float) and encoder (from double, round to nearest even, saturating) of one fp8 format."""
    f, nm = FP8_FORMATS[dt], dt.short_name
    emax, mmask = (1 << f.ebits) - 1, (1 << f.mbits) - 1
    if f.kind == "fn":
        special = 'if ((b & 0x7Fu) == 0x7Fu) return __builtin_nanf("");'
    elif f.kind == "ieee":
        special = f'if (e == {emax}u) return m ? __builtin_nanf("") : s * __builtin_inff();'
    else:
        special = 'if (b == 0x80u) return __builtin_nanf("");'
    inf_ret = f"sign | {f.inf_bits:#x}u" if f.inf_bits is not None else f"{f.nan_bits:#x}u"
    zero = "0u" if f.kind == "fnuz" else "sign"  # fnuz has no negative zero
    sub = float(2.0 ** (1 - f.bias - f.mbits)).hex()
    return f"""typedef unsigned char __speck_{nm};
static inline float __speck_{nm}_to_f32(unsigned char b) {{
  unsigned int e = (b >> {f.mbits}) & {emax}u, m = b & {mmask}u;
  float s = (b & 0x80u) ? -1.0f : 1.0f;
  {special}
  if (e == 0) return s * (float)m * {sub}f;
  unsigned int u = ((unsigned int)(b & 0x80u) << 24) | ((e + {127 - f.bias}u) << 23) | (m << {23 - f.mbits});
  float r; __builtin_memcpy(&r, &u, 4); return r;
}}
static inline unsigned char __speck_f64_to_{nm}(double x) {{
  unsigned long u; __builtin_memcpy(&u, &x, 8);
  unsigned int sign = (unsigned int)(u >> 63) << 7;
  if (x != x) return {f.nan_bits:#x}u;
  if (__builtin_isinf(x)) return (unsigned char)({inf_ret});
  double ax = __builtin_fabs(x);
  if (ax > 2.0 * {f.max!r}) return (unsigned char)(sign | {f.max_bits:#x}u);
  int e = (int)((u >> 52) & 0x7FFu) - 1023;
  if (e < {1 - f.bias}) e = {1 - f.bias};
  unsigned long sb = (unsigned long)(e - {f.mbits} + 1023) << 52;
  double step; __builtin_memcpy(&step, &sb, 8);
  double q = ax / step;
  long r = (long)q;
  double d = q - (double)r;
  if (d > 0.5 || (d == 0.5 && (r & 1))) r += 1;
  if (r == 0) return (unsigned char)({zero});
  if ((double)r * step > {f.max!r}) return (unsigned char)(sign | {f.max_bits:#x}u);
  return (unsigned char)(sign | (unsigned int)(((long)(e + {f.bias - 1}) << {f.mbits}) + r));
}}"""


# half: _Float16 where the compiler has it (its conversion from float is F16C's vcvtps2ph), else 16-bit storage and an
# integer encoder giving the same bits: round to nearest even, overflow to inf, NaN quieted keeping its top payload bits
_F16_TYPE = """#if defined(__FLT16_MAX__) && !defined(SPECK_NO_FLOAT16)
typedef _Float16 __speck_f16;
static inline __speck_f16 __speck_f32_to_f16(float f) { return (_Float16)f; }
#else
typedef unsigned short __speck_f16;
static inline __speck_f16 __speck_f32_to_f16(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  unsigned int s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (unsigned short)(s | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return (unsigned short)(s | 0x7C00u);
  if (a >= 0x38800000u) { a -= 0x38000000u; return (unsigned short)(s | ((a + 0xFFFu + ((a >> 13) & 1u)) >> 13)); }
  if (a < 0x33000000u) return (unsigned short)s;
  unsigned int m = (a & 0x7FFFFFu) | 0x800000u, sh = 126u - (a >> 23), q = m >> sh, r = m & ((1u << sh) - 1u);
  unsigned int h = 1u << (sh - 1u);
  return (unsigned short)(s | (q + (r > h || (r == h && (q & 1u)))));
}
#endif"""

_F16_TO_F32 = """/* half -> float by integer decoding (exact). Deliberately opaque: a plain (float) conversion lets gcc
   fold comparisons of converted halves back into _Float16 comparisons, lowered to libgcc calls (__nehf2) */
static inline float __speck_f16_to_f32(__speck_f16 h) {
  unsigned short b; __builtin_memcpy(&b, &h, 2);
  unsigned int s = (unsigned int)(b & 0x8000u) << 16, e = (b >> 10) & 0x1Fu, m = b & 0x3FFu, u;
  if (e == 31u) u = s | 0x7F800000u | (m << 13);
  else if (e != 0u) u = s | ((e + 112u) << 23) | (m << 13);
  else if (m == 0u) u = s;
  else { float f = (float)m * 0x1p-24f; return s ? -f : f; }
  float f; __builtin_memcpy(&f, &u, 4); return f;
}"""

_F64_TO_F16 = """/* double -> half without libgcc: round to odd at float precision (float keeps 13 more bits than half,
   so the second rounding is exact), then round to half */
static inline __speck_f16 __speck_f64_to_f16(double x) {
  float f = (float)x;
  if ((double)f != x && x == x) {
    unsigned int u; __builtin_memcpy(&u, &f, 4);
    if (__builtin_fabs((double)f) > __builtin_fabs(x)) u -= 1u;
    u |= 1u;
    __builtin_memcpy(&f, &u, 4);
  }
  return __speck_f32_to_f16(f);
}"""


_F2I = """/* float -> integer as the interpreter does it: truncate toward zero and wrap modulo 2**64 (then to the target
   width); NaN and inf give 0. Defined for every input, unlike a C cast; the reduction below is exact. */
static inline unsigned long __speck_f2i(double x) {
  if (x != x || __builtin_fabs(x) == __builtin_inf()) return 0;
  if (__builtin_fabs(x) >= 0x1p64) x -= 0x1p64 * __builtin_trunc(x * 0x1p-64);
  return x < 0 ? -(unsigned long)(-x) : (unsigned long)x;
}"""


def _div_helper(dt: DType) -> str:
    ct, ut = _CTYPE[dt], _CTYPE[_UNSIGNED_TWIN.get(dt, dt)]
    sfx = _VSHORT[dt]
    neg = f"({ct})(-({ut})a)" if not dtypes.is_unsigned(dt) else "0"
    minus1 = f"b == ({ct})-1 ? {neg} : " if not dtypes.is_unsigned(dt) else ""
    mod_m1 = f" || b == ({ct})-1" if not dtypes.is_unsigned(dt) else ""
    return (
        f"/* x/0 and x%0 are 0 and MIN/-1 wraps, as in the interpreter, instead of trapping */\n"
        f"static inline {ct} __speck_div_{sfx}({ct} a, {ct} b) {{ return b == 0 ? 0 : {minus1}({ct})(a / b); }}\n"
        f"static inline {ct} __speck_mod_{sfx}({ct} a, {ct} b) {{ return (b == 0{mod_m1}) ? 0 : ({ct})(a % b); }}"
    )


def _vec_name(dt: DType) -> str:
    return f"{_VSHORT[dt.scalar()]}x{dt.count}"


def _vec_typedef(dt: DType) -> str:
    nbytes = dt.scalar().itemsize * dt.count
    return (f"typedef {_VELEM[dt.scalar()]} {_vec_name(dt)} __attribute__((vector_size({nbytes}"
            ")));")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# the renderer

# names a variable can't take in C (keywords, and the types the renderer spells)
_C_RESERVED = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "_Bool _Complex _Imaginary _Float16 asm typeof".split()
)
# the vector typedef names (`i32x4`): a parameter of that name would hide the type from the body
_VEC_TYPEDEF = re.compile(f"({'|'.join(map(re.escape, _VSHORT.values()))})x[0-9]+")
_C_UNSUPPORTED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})  # libm's results differ from the interpreter's by an ulp
_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^",
          Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}  # fmt: skip
_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "cast", Ops.STACK: "vec", Ops.GEP: "gep",
           Ops.DEFINE_REG: "acc", Ops.RANGE: "ridx"}  # fmt: skip


class ClangRenderer(Renderer):
    """Freestanding C for clang or gcc (see the module docstring for the exact semantics). EXP2/LOG2/SIN are left to
    the pipeline's polynomial decompositions so results match the interpreter bit for bit; SQRT and TRUNC map to
    `__builtin_sqrt[f]`/`__builtin_trunc[f]` (single instructions with SSE4.1). Vectors up to 32 bytes (AVX2)."""

    name: ClassVar[str] = "clang"
    supported_ops: ClassVar[frozenset[Ops]] = DEFAULT_SUPPORTED_OPS - _C_UNSUPPORTED
    has_vectors: ClassVar[bool] = True
    max_vector_bytes: ClassVar[int] = 32

    @property
    def pow2_vectors(self) -> bool:
        """gcc and clang reject vector_size types whose lane count is not a power of two."""
        return True

    def supports(self, op: Ops, dtype: DType) -> bool:
        """As the base class, plus WHERE on every dtype (a select needs no arithmetic in the value's format)."""
        if op is Ops.WHERE and dtype.scalar() in _CTYPE:
            return True
        return super().supports(op, dtype)

    def render(self, uops: list[UOp]) -> str:
        """Render the program as one C translation unit: prelude (typedefs/helpers in use) + the kernel function."""
        return _CKernel(self, uops).render()


class _CKernel:
    """The state of rendering one program: names of values, the open lines, and the prelude pieces in use."""

    def __init__(self, r: ClangRenderer, uops: list[UOp]) -> None:
        self.r, self.uops = r, uops
        self.sig = kernel_signature(uops, r.name)
        self.names: dict[UOp, str] = {}
        self.consts: dict[UOp, tuple[bool, Any]] = {}
        self.literals: dict[UOp, str] = {}
        self.counts: dict[str, int] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.prelude: dict[str, str] = {}  # key -> text, insertion order is dependency order

    # ---- naming and types ----
    def fresh(self, prefix: str) -> str:
        n = self.counts.get(prefix, 0)
        self.counts[prefix] = n + 1
        return f"{prefix}{n}"

    def need(self, key: str, text: str) -> None:
        self.prelude.setdefault(key, text)

    def need_dtype(self, dt: DType) -> None:
        s = dt.scalar()
        if s not in _CTYPE:
            raise NoTypeError(self.r.name, dt)
        if s == dtypes.float16:
            self.need("f16", _F16_TYPE)
        elif s == dtypes.bfloat16:
            self.need("bf16", _BF16_HELPERS)
        elif s in _FP8:
            self.need(f"fp8_{s.name}", _fp8_helpers(s))
        if dt.count > 1:
            self.need(f"vec_{dt.name}", _vec_typedef(dt))

    def ctype(self, dt: DType) -> str:
        self.need_dtype(dt)
        return _vec_name(dt) if dt.count > 1 else _CTYPE[dt]

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    # ---- operands ----
    def cconst(self, u: UOp) -> tuple[bool, Any]:
        """casted_const(u), memoized: literals are looked up at every use."""
        if (r := self.consts.get(u)) is None:
            r = self.consts[u] = casted_const(u)
        return r

    def operand(self, u: UOp) -> str:
        if u in self.names:
            return self.names[u]
        if u in self.literals:
            return self.literals[u]
        ok, v = self.cconst(u)
        if ok:
            self.need_dtype(u.dtype)
            lit = c_literal(v, u.dtype)
            if u.dtype.count > 1:
                lit = f"({self.ctype(u.dtype)}){{{', '.join([lit] * u.dtype.count)}}}"
            self.literals[u] = lit
            return lit
        if u.op is Ops.CONST:
            raise bare_const_error(u, self.r.name)
        raise ProgramFormError(f"renderer 'clang': {u.op} (dtype {u.dtype}) is used before it is defined; the "
                               "program is not in linearized order")  # fmt: skip

    def lane(self, u: UOp, i: int) -> str:
        """Lane i of a vector operand (scalars broadcast)."""
        if u.dtype.count == 1:
            return self.operand(u)
        if u not in self.names:
            ok, v = self.cconst(u)
            if ok:
                return c_literal(v, u.dtype)
        return f"{self.operand(u)}[{i}]"

    def pointer(self, idx: UOp) -> tuple[str, str]:
        """(buffer, offset) of an INDEX: element `buffer[offset]`, address `(buffer + offset)`."""
        buf, off = idx.src[0], idx.src[1]
        if off.dtype.count > 1:
            raise ProgramFormError(f"renderer 'clang': INDEX with a vector of offsets ({off.dtype}) is not a program "
                                   "form; devectorize gathers before rendering")  # fmt: skip
        return self.operand(buf), self.operand(off)

    # ---- main loop ----
    def render(self) -> str:
        sig = self.sig
        params: list[str] = []
        for b in sig.buffers:
            assert isinstance(b.dtype, PtrDType)
            nm = f"data{b.arg if isinstance(b.arg, int) else b.arg[0]}"
            self.names[b] = nm
            const = "" if b in sig.written else "const "
            params.append(f"{const}{self.ctype(b.dtype.base)}* restrict {nm}")
        used = set(self.names.values())
        for v in sig.variables:
            if v.dtype != dtypes.int32:
                raise UnsupportedOpError(self.r.name, Ops.DEFINE_VAR, v.dtype, "variables are int32 by the CPU ABI")
            nm = str(v.arg[0])
            # keep the variable's own name unless it is not an identifier, a keyword, or may collide with ours
            generated = r"(data|ridx|alu|val|cast|vec|gep|acc|var|tmp|core_start|core_end|_).*"
            if (not re.fullmatch(r"[A-Za-z_]\w*", nm) or nm in used or nm in _C_RESERVED or re.fullmatch(generated, nm)
                    or _VEC_TYPEDEF.fullmatch(nm)):  # fmt: skip
                nm = self.fresh("var")
            used.add(nm)
            self.names[v] = nm
            params.append(f"{self.ctype(v.dtype)} {nm}")
        params += ["int core_start", "int core_end"]
        for u in self.uops:
            try:
                self.render_uop(u)
            except NoTypeError as e:
                raise UnsupportedOpError(self.r.name, u.op, e.dtype, "the renderer has no type for it") from None
        if self.depth != 1:
            raise ProgramFormError(f"renderer 'clang': {self.depth - 1} RANGE(s) are never closed by an END")
        head = f"void {sig.name}({', '.join(params)}) {{"
        prelude = "\n".join(self.prelude.values())
        return (prelude + "\n\n" if prelude else "") + head + "\n" + "\n".join(self.lines) + "\n}\n"

    def render_uop(self, u: UOp) -> None:
        op = u.op
        if op in (Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP):
            return
        if op is Ops.CONST:
            if u.dtype.is_weak or u.dtype == dtypes.bool:
                return  # the inner CONST of a casted const: rendered by its CAST
            raise bare_const_error(u, self.r.name)
        if op is Ops.CAST and self.cconst(u)[0]:
            return  # literals are spelled inline at their uses
        if op is Ops.INDEX:
            return  # pointer arithmetic is spelled inline at the LOAD/STORE
        if op is Ops.RANGE:
            self.render_range(u)
        elif op is Ops.END:
            for _ in u.src[1:]:
                self.depth -= 1
                self.emit("}")
        elif op is Ops.DEFINE_REG:
            assert isinstance(u.dtype, PtrDType)
            nm = self.names[u] = self.fresh("acc")
            self.emit(f"{self.ctype(u.dtype.base)} {nm}[{max(1, u.dtype.size)}];")
        elif op is Ops.LOAD:
            self.render_load(u)
        elif op is Ops.STORE:
            self.render_store(u)
        else:
            self.render_value(u)

    def render_range(self, u: UOp) -> None:
        nm = self.names[u] = self.fresh("ridx")
        t = self.ctype(u.dtype)
        if u is self.sig.sliced:
            self.emit(f"for ({t} {nm} = core_start; {nm} < core_end; {nm}++) {{")
        else:
            self.emit(f"for ({t} {nm} = 0; {nm} < {self.operand(u.src[0])}; {nm}++) {{")
        self.depth += 1

    def _access(self, u: UOp, idx: UOp) -> tuple[str, bool]:
        """(element text `buf[off]` or, for an unaligned vector access through memcpy, address text, whether it is
        such a vector access)."""
        if idx.op is not Ops.INDEX:
            raise ProgramFormError(f"renderer 'clang': {u.op} must address memory through an INDEX, got {idx.op}")
        base = idx.src[0].dtype.base if isinstance(idx.src[0].dtype, PtrDType) else idx.src[0].dtype
        vdt = u.dtype if u.op is Ops.LOAD else u.src[1].dtype
        b, off = self.pointer(idx)
        if vdt == base:
            return f"{b}[{off}]", False
        if vdt.count > 1 and vdt.scalar() == base.scalar() and base.count == 1:
            return f"({b} + {off})", True
        raise ProgramFormError(f"renderer 'clang': {u.op} of {vdt} through a pointer to {base}; expected the element "
                               "type or a vector of it")  # fmt: skip

    def render_load(self, u: UOp) -> None:
        idx = u.src[0]
        ptr, vec = self._access(u, idx)
        t = self.ctype(u.dtype)
        nm = self.names[u] = self.fresh("val")
        gate = self.operand(idx.src[2]) if len(idx.src) > 2 else None
        if gate is None:
            if vec:
                self.emit(f"{t} {nm}; __builtin_memcpy(&{nm}, {ptr}, {u.dtype.nbytes});")
            else:
                self.emit(f"{t} {nm} = {ptr};")
            return
        alt = self.operand(u.src[1]) if len(u.src) > 1 else self.zero(u.dtype)
        if vec:
            self.emit(f"{t} {nm} = {alt};")
            self.emit(f"if ({gate}) __builtin_memcpy(&{nm}, {ptr}, {u.dtype.nbytes});")
        else:
            self.emit(f"{t} {nm} = {gate} ? {ptr} : {alt};")

    def zero(self, dt: DType) -> str:
        lit = c_literal(0 if not dtypes.is_float(dt) else 0.0, dt.scalar())
        return f"({self.ctype(dt)}){{{', '.join([lit] * dt.count)}}}" if dt.count > 1 else lit

    def render_store(self, u: UOp) -> None:
        idx, val = u.src[0], u.src[1]
        ptr, vec = self._access(u, idx)
        v = self.operand(val)
        if vec:
            if val not in self.names:  # a literal has no address: give it one
                tmp = self.fresh("vec")
                self.emit(f"{self.ctype(val.dtype)} {tmp} = {v};")
                v = tmp
            stmt = f"__builtin_memcpy({ptr}, &{v}, {val.dtype.nbytes});"
        else:
            stmt = f"{ptr} = {v};"
        if len(idx.src) > 2:
            stmt = f"if ({self.operand(idx.src[2])}) {stmt}"
        self.emit(stmt)

    # ---- values ----
    def render_value(self, u: UOp) -> None:
        op = u.op
        t = self.ctype(u.dtype)
        if op is Ops.STACK:
            expr = f"({t}){{{', '.join(self.operand(s) for s in u.src)}}}"
        elif op is Ops.GEP:
            lanes = tuple(u.arg)
            src = u.src[0]
            expr = (self.lane(src, lanes[0]) if len(lanes) == 1 else
                    f"({t}){{{', '.join(self.lane(src, i) for i in lanes)}}}")  # fmt: skip
        elif op is Ops.BITCAST:
            self.render_bitcast(u)
            return
        elif op is Ops.CAST:
            native = self.native_cast(u) if u.dtype.count > 1 else None
            expr = native or self.vectorwise(u, lambda i: self.cast(u.src[0], u.dtype.scalar(), i))
        elif op in GroupOp.ALU:
            expr = self.alu_expr(u)
        else:
            raise ProgramFormError(f"renderer 'clang' cannot express {op} (dtype {u.dtype}): it is not part of the "
                                   "program form (KERNEL_CONTRACT.md section 2)")  # fmt: skip
        prefix = "alu" if op in GroupOp.ALU else _PREFIX.get(op, "tmp")
        nm = self.names[u] = self.fresh(prefix)
        self.emit(f"{t} {nm} = {expr};")

    def vectorwise(self, u: UOp, lane_expr: Any) -> str:
        if u.dtype.count == 1:
            return str(lane_expr(None))
        return f"({self.ctype(u.dtype)}){{{', '.join(lane_expr(i) for i in range(u.dtype.count))}}}"

    def _src(self, s: UOp, i: int | None) -> str:
        return self.operand(s) if i is None else self.lane(s, i)

    def render_bitcast(self, u: UOp) -> None:
        src = u.src[0]
        if src.dtype.nbytes != u.dtype.nbytes:
            raise UnsupportedOpError(self.r.name, Ops.BITCAST, u.dtype, f"source {src.dtype} has another size")
        t = self.ctype(u.dtype)
        s = self.operand(src)
        if src not in self.names:
            tmp = self.fresh("cast")
            self.emit(f"{self.ctype(src.dtype)} {tmp} = {s};")
            s = tmp
        nm = self.names[u] = self.fresh("cast")
        self.emit(f"{t} {nm}; __builtin_memcpy(&{nm}, &{s}, {u.dtype.nbytes});")

    # ---- casts ----
    def cast(self, src: UOp, to: DType, i: int | None) -> str:
        x = self._src(src, i)
        fr = src.dtype.scalar()
        if fr == to:
            return x
        self.need_dtype(to)
        # storage formats and half: decode to float first, encode from float/double last
        if fr in _STORAGE or fr == dtypes.float16:
            x, fr = self.decode(x, fr), dtypes.float32
            if fr == to:
                return x
        if to == dtypes.bfloat16:
            return f"__speck_f32_to_bf16({self._to_float(x, fr, dtypes.float32)})"
        if to in _FP8:
            return f"{_TO_STORAGE[to]}({self._to_float(x, fr, dtypes.float64)})"
        if to == dtypes.float16:
            if fr == dtypes.float32 or fr == dtypes.bool:
                return f"__speck_f32_to_f16((float){x})" if fr == dtypes.bool else f"__speck_f32_to_f16({x})"
            self.need("f64_to_f16", _F64_TO_F16)
            return f"__speck_f64_to_f16({self._to_float(x, fr, dtypes.float64)})"
        return self._to_float(x, fr, to) if dtypes.is_float(to) else self._to_intlike(x, fr, to)

    def decode(self, x: str, fr: DType) -> str:
        """x of a storage format or half as a float expression."""
        if fr == dtypes.float16:
            self.need_dtype(fr)
            self.need("f16_to_f32", _F16_TO_F32)
            return f"__speck_f16_to_f32({x})"
        self.need_dtype(fr)
        return f"{_FROM_STORAGE[fr]}({x})"

    def _to_float(self, x: str, fr: DType, to: DType) -> str:
        """x of scalar dtype fr (a non-storage type) as float32/float64 `to`."""
        if fr == to:
            return x
        if to == dtypes.float32 and fr in (dtypes.int64, dtypes.uint64):
            return f"(float)(double){x}"  # rounded through float64, as the interpreter does
        return f"({_CTYPE[to]}){x}"

    def _to_intlike(self, x: str, fr: DType, to: DType) -> str:
        ct = _CTYPE[to]
        if to == dtypes.bool:
            return f"({x} != 0)"
        if dtypes.is_float(fr):
            self.need("f2i", _F2I)
            return f"({ct})__speck_f2i({x})"
        return f"({ct}){x}"

    # ---- ALU ----
    def alu_expr(self, u: UOp) -> str:
        op = u.op
        # the dtype an op works on: the sources' for comparisons, the result's otherwise
        dt = u.src[0].dtype if op in GroupOp.Comparison else (u.src[1].dtype if op is Ops.WHERE else u.dtype)
        if not self.r.supports(op, dt):
            raise UnsupportedOpError(self.r.name, op, dt)
        s = dt.scalar()
        if u.dtype.count > 1 and (native := self.native_vector(u, s)) is not None:
            return native
        return self.vectorwise(u, lambda i: self.scalar_alu(u, op, s, [self._src(x, i) for x in u.src]))

    def native_vector(self, u: UOp, s: DType) -> str | None:
        """Whole-vector C for the ops the vector extension defines identically in gcc and clang (None: write the op
        lane by lane). Comparisons give -1/0 integer masks, turned into 0/1 bool lanes; selects are bitwise."""
        op = u.op
        a = [self.operand(x) for x in u.src]
        n = u.dtype.count
        if s in (dtypes.float32, dtypes.float64) and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV):
            return f"({a[0]} {_INFIX[op]} {a[1]})"
        if s in (dtypes.float32, dtypes.float64) and op is Ops.NEG:
            return f"(-{a[0]})"
        if dtypes.is_int(s) and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR):
            if dtypes.is_unsigned(s) or op in (Ops.AND, Ops.OR, Ops.XOR) or int_fits(u):
                return f"({a[0]} {_INFIX[op]} {a[1]})"
            ut = self.ctype(_UNSIGNED_TWIN[s].vec(n))
            return f"({self.ctype(u.dtype)})(({ut}){a[0]} {_INFIX[op]} ({ut}){a[1]})"
        if not (dtypes.is_int(s) or s in (dtypes.float32, dtypes.float64, dtypes.bool)):
            return None
        if op in GroupOp.Comparison:
            return f"__builtin_convertvector(-({a[0]} {_INFIX[op]} {a[1]}), {self.ctype(u.dtype)})"
        if op is Ops.WHERE:
            mt = self.ctype(_MASK_INT[s.itemsize].vec(n))
            m = self.fresh("tmp")
            self.emit(f"{mt} {m} = -__builtin_convertvector({a[0]}, {mt});")
            return self.select(m, a[1], a[2], u.dtype)
        if op is Ops.MAX and s != dtypes.bool:
            mt = self.ctype(_MASK_INT[s.itemsize].vec(n))
            m = self.fresh("tmp")
            nan = f" | ({a[1]} != {a[1]})" if dtypes.is_float(s) else ""
            self.emit(f"{mt} {m} = ({mt})(({a[1]} > {a[0]}){nan});")
            return self.select(m, a[1], a[0], u.dtype)
        return None

    def select(self, mask: str, a: str, b: str, dt: DType) -> str:
        """Lanes of a where the -1/0 integer vector `mask` is set, else of b (bitwise, so exact for any type)."""
        mt = self.ctype(_MASK_INT[dt.scalar().itemsize].vec(dt.count))
        return f"({self.ctype(dt)})(({mask} & ({mt}){a}) | (~{mask} & ({mt}){b}))"

    def native_cast(self, u: UOp) -> str | None:
        """`__builtin_convertvector` where it means exactly the scalar cast in every lane, else None."""
        src, fr, to, n = u.src[0], u.src[0].dtype.scalar(), u.dtype.scalar(), u.dtype.count
        plain = set(_UNSIGNED_TWIN) | set(_UNSIGNED_TWIN.values()) | {dtypes.bool, dtypes.float32, dtypes.float64}
        if (
            fr not in plain
            or to not in plain
            or (dtypes.is_float(fr) and not dtypes.is_float(to) and to != dtypes.bool)
        ):
            return None  # float -> int needs the wrapping helper
        x, t = self.operand(src), self.ctype(u.dtype)
        if to == dtypes.bool:
            return f"__builtin_convertvector(-({x} != 0), {t})"
        if fr in (dtypes.int64, dtypes.uint64) and to == dtypes.float32:  # rounded through float64, as scalars
            return f"__builtin_convertvector(__builtin_convertvector({x}, {self.ctype(dtypes.float64.vec(n))}), {t})"
        return f"__builtin_convertvector({x}, {t})"

    def scalar_alu(self, u: UOp, op: Ops, s: DType, a: list[str]) -> str:
        fail = UnsupportedOpError(self.r.name, op, s, "no C form for this op on this dtype")
        if op is Ops.WHERE:
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if s in _STORAGE or s == dtypes.float16:
            if op not in GroupOp.Comparison:
                raise fail  # arithmetic on these formats arrives widened to float (supports_float16 etc. are False)
            a = [self.decode(x, s) for x in a]
            s = dtypes.float32
        if op in GroupOp.Comparison:
            return f"({a[0]} {_INFIX[op]} {a[1]})"
        if s == dtypes.bool:
            table = {Ops.ADD: "|", Ops.OR: "|", Ops.MAX: "|", Ops.MUL: "&", Ops.AND: "&", Ops.XOR: "^", Ops.SUB: "^"}
            if op in table:
                return f"({a[0]} {table[op]} {a[1]})"
            if op is Ops.NEG:
                return f"(!{a[0]})"
            raise fail
        if dtypes.is_float(s):
            sfx = "f" if s == dtypes.float32 else ""
            if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV):
                return f"({a[0]} {_INFIX[op]} {a[1]})"
            if op is Ops.NEG:
                return f"(-{a[0]})"
            if op is Ops.MAX:  # NaN-propagating like the interpreter (numpy.maximum)
                return f"(({a[1]} > {a[0]} || {a[1]} != {a[1]}) ? {a[1]} : {a[0]})"
            if op is Ops.SQRT:
                return f"__builtin_sqrt{sfx}({a[0]})"
            if op is Ops.TRUNC:
                return f"__builtin_trunc{sfx}({a[0]})"
            if op is Ops.RECIPROCAL:
                return f"(1.0{sfx} / {a[0]})"
            raise fail
        return self.int_alu(u, op, s, a)

    def int_alu(self, u: UOp, op: Ops, s: DType, a: list[str]) -> str:
        ct = _CTYPE[s]
        ut = "unsigned long" if s.itemsize == 8 else "unsigned int"
        bits = 8 * s.itemsize
        if op is Ops.MAX:
            return f"({a[1]} > {a[0]} ? {a[1]} : {a[0]})"
        if op is Ops.TRUNC:
            return a[0]
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            return f"({a[0]} {_INFIX[op]} {a[1]})" if s.itemsize >= 4 else f"({ct})({a[0]} {_INFIX[op]} {a[1]})"
        if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG):
            if int_fits(u) and s.itemsize >= 4:
                return f"(-{a[0]})" if op is Ops.NEG else f"({a[0]} {_INFIX[op]} {a[1]})"
            if op is Ops.NEG:
                return f"({ct})(-({ut}){a[0]})"
            return f"({ct})(({ut}){a[0]} {_INFIX[op]} ({ut}){a[1]})"
        if op in (Ops.CDIV, Ops.CMOD):
            sym = "/" if op is Ops.CDIV else "%"
            if divisor_safe(u.src[0], u.src[1]):
                return f"({a[0]} {sym} {a[1]})" if s.itemsize >= 4 else f"({ct})({a[0]} {sym} {a[1]})"
            self.need(f"div_{s.name}", _div_helper(s))
            return f"__speck_{'div' if op is Ops.CDIV else 'mod'}_{_VSHORT[s]}({a[0]}, {a[1]})"
        if op in (Ops.SHL, Ops.SHR):
            if op is Ops.SHL:
                expr = f"({ct})(({ut}){a[0]} << {a[1]})"
            else:
                expr = f"({a[0]} >> {a[1]})" if s.itemsize >= 4 else f"({ct})({a[0]} >> {a[1]})"
            if shift_safe(u.src[1], bits):
                return expr
            fallback = "0" if op is Ops.SHL or dtypes.is_unsigned(s) else f"({a[0]} < 0 ? ({ct})-1 : 0)"
            amount_ok = (
                f"{a[1]} < {bits}" if dtypes.is_unsigned(u.src[1].dtype) else f"({a[1]} >= 0 && {a[1]} < {bits})"
            )
            return f"({amount_ok} ? {expr} : ({ct}){fallback})"
        raise UnsupportedOpError(self.r.name, op, s, "no C form for this op on an integer dtype")


__all__ = ["ClangRenderer", "c_literal"]
