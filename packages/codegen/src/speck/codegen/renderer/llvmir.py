"""LLVMRenderer: a linearized program (KERNEL_CONTRACT.md section 2) -> textual LLVM IR (opaque pointers, LLVM 15+).

The function follows CPU_ABI.md: `void @name(ptr noalias %data0, ..., i32 %var..., i32 %core_start, i32 %core_end)`.
Loops are basic blocks with a phi for the index; gated loads/stores branch around the memory access (a phi joins
the loaded value with the alternative); DEFINE_REG accumulators are entry-block allocas that the optimizer's
SROA/mem2reg promote to registers.

Exact semantics (the same choices as the C renderer, see cstyle.py): no fast-math flags anywhere (unless the renderer is
made with fp_contract=True, which marks add/sub/mul `contract` so LLVM may fuse them into FMAs), so every float op
rounds once; MAX is `fcmp ogt b,a | fcmp uno b,b` + select (NaN-propagating like the interpreter, never
llvm.maxnum); CMPLT is `fcmp olt` (false on NaN), CMPNE `fcmp une` (true on NaN), CMPEQ `fcmp oeq`; sdiv/srem and
shifts are guarded with selects only where the UOps' bounds do not rule out division by 0, MIN/-1 or shift amounts
outside [0, bits); float -> int truncates and wraps modulo 2**64 (NaN/inf -> 0) like the interpreter, without
poison; int64 -> float32 rounds through double. bool is i1 in registers and i8 in memory; half is `half`; bfloat16
and fp8 are i16/i8 bits converted by small internal helper functions (round to nearest even, fp8 saturating),
and double -> half rounds to odd at float precision first, so no libgcc calls are needed.
Vectors are `<n x T>`; widths above `max_vector_bytes` (32, AVX2) are split by the pipeline."""

from __future__ import annotations

import math
import re
import struct
from typing import Any, ClassVar

from speck.codegen.cpu_features import llvm_vector_bytes
from speck.codegen.errors import CodegenValueError, NoTypeError, ProgramFormError, UnsupportedOpError
from speck.codegen.renderer import DEFAULT_SUPPORTED_OPS, Renderer
from speck.codegen.renderer.common import bare_const_error, casted_const, kernel_signature, shift_safe
from speck.uop import DType, GroupOp, PtrDType, UOp, dtypes
from speck.uop.dtype import FP8_FORMATS, to_bits
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_LTYPE: dict[DType, str] = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.uint64: "i64",
    dtypes.float16: "half",
    dtypes.bfloat16: "i16",
    **{d: "i8" for d in FP8_FORMATS},
    dtypes.float32: "float",
    dtypes.float64: "double",
}
_STORAGE = {dtypes.bfloat16, *FP8_FORMATS}
_NATIVE_FLOATS = {dtypes.float16, dtypes.float32, dtypes.float64}
_INTR_SFX = {dtypes.float16: "f16", dtypes.float32: "f32", dtypes.float64: "f64"}


_NSW_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL})


def _fits(op: Ops, u: UOp, dt: DType) -> bool:
    """Whether signed int `op` of u's two sources can't overflow dt for any values within the sources' bounds."""
    (a0, a1), (b0, b1) = (u.src[0].vmin, u.src[0].vmax), (u.src[1].vmin, u.src[1].vmax)
    if not all(type(v) is int for v in (a0, a1, b0, b1)):
        return False
    if op is Ops.ADD:
        lo, hi = a0 + b0, a1 + b1
    elif op is Ops.SUB:
        lo, hi = a0 - b1, a1 - b0
    else:
        corners = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        lo, hi = min(corners), max(corners)
    if (bounds := _INT_RANGE.get(dt)) is None:
        bounds = _INT_RANGE[dt] = (dtypes.min(dt), dtypes.max(dt))
    return bool(bounds[0] <= lo and hi <= bounds[1])


_INT_RANGE: dict[DType, tuple[Any, Any]] = {}  # dtype -> (min, max), for _fits


def ltype(dt: DType, mem: bool = False) -> str:
    """LLVM type of a value of dt (`mem`: its in-memory form, where bool is i8)."""
    if (t := _LTYPE_OF.get((dt, mem))) is None:
        t = _LTYPE_OF[(dt, mem)] = _ltype(dt, mem)
    return t


_LTYPE_OF: dict[tuple[DType, bool], str] = {}  # (ltype is asked for at nearly every rendered instruction)


def _ltype(dt: DType, mem: bool) -> str:
    s = dt.scalar()
    if s not in _LTYPE:
        raise NoTypeError("llvm", dt)
    base = "i8" if (mem and s == dtypes.bool) else _LTYPE[s]
    return base if dt.count == 1 else f"<{dt.count} x {base}>"


def _float_hex(v: float) -> str:
    return "0x" + struct.pack(">d", v).hex().upper()


def llvm_scalar_literal(v: Any, dt: DType) -> str:
    """The LLVM spelling of scalar value v (already truncated to dt): `true`, `-1`, `0x3FF0000000000000` (floats as
    the hex bits of the double holding the exact value), `0xH3C00` (half); bfloat16/fp8 as their integer bits."""
    s = dt.scalar()
    if s == dtypes.bool:
        return "true" if v else "false"
    if s == dtypes.float16:
        return f"0xH{to_bits(v, s):04X}"
    if s in _STORAGE:
        bits, width = to_bits(v, s), 8 * s.itemsize
        return str(bits - (1 << width) if bits >> (width - 1) else bits)
    if dtypes.is_float(s):
        v = float(v)
        return _float_hex(math.nan) if math.isnan(v) else _float_hex(v)
    v, width = int(v), 8 * s.itemsize
    v &= (1 << width) - 1
    return str(v - (1 << width) if v >> (width - 1) else v)


def llvm_literal(v: Any, dt: DType) -> str:
    """Scalar literal, or a splat constant vector `<float 0x..., float 0x...>` for a vector dt."""
    lit = llvm_scalar_literal(v, dt)
    if dt.count == 1:
        return lit
    return "<" + ", ".join(f"{ltype(dt.scalar())} {lit}" for _ in range(dt.count)) + ">"


# ---- helper functions (internal, always inlined), emitted only when used ----
_HELPERS: dict[str, str] = {
    "bf16_to_f32": """define internal float @__speck_bf16_to_f32(i16 %b) alwaysinline {
  %w = zext i16 %b to i32
  %s = shl i32 %w, 16
  %f = bitcast i32 %s to float
  ret float %f
}""",
    "f32_to_bf16": """define internal i16 @__speck_f32_to_bf16(float %f) alwaysinline {
  %u = bitcast float %f to i32
  %hi = lshr i32 %u, 16
  %odd = and i32 %hi, 1
  %r0 = add i32 %u, 32767
  %r1 = add i32 %r0, %odd
  %r2 = lshr i32 %r1, 16
  %sg = and i32 %hi, 32768
  %nanb = or i32 %sg, 32704
  %isnan = fcmp uno float %f, %f
  %r3 = select i1 %isnan, i32 %nanb, i32 %r2
  %r = trunc i32 %r3 to i16
  ret i16 %r
}""",
    "f64_to_f16": """define internal half @__speck_f64_to_f16(double %x) alwaysinline {
  %f = fptrunc double %x to float
  %back = fpext float %f to double
  %inexact = fcmp one double %back, %x
  %ab = call double @llvm.fabs.f64(double %back)
  %ax = call double @llvm.fabs.f64(double %x)
  %bigger = fcmp ogt double %ab, %ax
  %u = bitcast float %f to i32
  %dec = zext i1 %bigger to i32
  %u1 = sub i32 %u, %dec
  %u2 = or i32 %u1, 1
  %u3 = select i1 %inexact, i32 %u2, i32 %u
  %f2 = bitcast i32 %u3 to float
  %h = fptrunc float %f2 to half
  ret half %h
}""",
}

_FP8 = FP8_FORMATS


def _fp8_helpers(dt: DType) -> str:
    """Decoder (exact, to float) and encoder (from double, round to nearest even, saturating) of one fp8 format."""
    f, nm = FP8_FORMATS[dt], dt.short_name
    eb, mb, bias, maxv, nanb, sub = f.ebits, f.mbits, f.bias, f.max, f.nan_bits, 2.0 ** (1 - f.bias - f.mbits)
    emax = (1 << eb) - 1
    if f.kind == "fn":
        special = f"""  %low = and i32 %w, 127
  %isnan = icmp eq i32 %low, 127
  %r = select i1 %isnan, float {_float_hex(math.nan)}, float %r1"""
    elif f.kind == "fnuz":
        special = f"""  %isnan = icmp eq i32 %w, 128
  %r = select i1 %isnan, float {_float_hex(math.nan)}, float %r1"""
    else:
        special = f"""  %top = icmp eq i32 %e, {emax}
  %mz = icmp eq i32 %m, 0
  %inf = select i1 %neg, float {_float_hex(-math.inf)}, float {_float_hex(math.inf)}
  %infnan = select i1 %mz, float %inf, float {_float_hex(math.nan)}
  %r = select i1 %top, float %infnan, float %r1"""
    to_f32 = f"""define internal float @__speck_{nm}_to_f32(i8 %b) alwaysinline {{
  %w = zext i8 %b to i32
  %sg = and i32 %w, 128
  %neg = icmp ne i32 %sg, 0
  %e0 = lshr i32 %w, {mb}
  %e = and i32 %e0, {emax}
  %m = and i32 %w, {(1 << mb) - 1}
  %sg31 = shl i32 %sg, 24
  %eb = add i32 %e, {127 - bias}
  %eb23 = shl i32 %eb, 23
  %m23 = shl i32 %m, {23 - mb}
  %fb0 = or i32 %sg31, %eb23
  %fb = or i32 %fb0, %m23
  %normal = bitcast i32 %fb to float
  %mf = uitofp i32 %m to float
  %sub0 = fmul float %mf, {_float_hex(sub)}
  %subn = fneg float %sub0
  %sub = select i1 %neg, float %subn, float %sub0
  %isz = icmp eq i32 %e, 0
  %r1 = select i1 %isz, float %sub, float %normal
{special}
  ret float %r
}}"""
    from_f64 = f"""define internal i8 @__speck_f64_to_{nm}(double %x) alwaysinline {{
  %u = bitcast double %x to i64
  %sg64 = lshr i64 %u, 63
  %sg8 = trunc i64 %sg64 to i8
  %sign = shl i8 %sg8, 7
  %ax = call double @llvm.fabs.f64(double %x)
  %eraw64 = lshr i64 %u, 52
  %eraw = trunc i64 %eraw64 to i32
  %e0 = and i32 %eraw, 2047
  %e1 = sub i32 %e0, 1023
  %small = icmp slt i32 %e1, {1 - bias}
  %e = select i1 %small, i32 {1 - bias}, i32 %e1
  %big = fcmp ogt double %ax, {_float_hex(2 * maxv)}
  %esafe = select i1 %big, i32 0, i32 %e
  %sb0 = add i32 %esafe, {1023 - mb}
  %sb1 = zext i32 %sb0 to i64
  %sb = shl i64 %sb1, 52
  %step = bitcast i64 %sb to double
  %q = fdiv double %ax, %step
  %r0 = fptosi double %q to i64
  %rf = sitofp i64 %r0 to double
  %d = fsub double %q, %rf
  %gt = fcmp ogt double %d, 0x3FE0000000000000
  %eq = fcmp oeq double %d, 0x3FE0000000000000
  %odd64 = and i64 %r0, 1
  %odd = icmp ne i64 %odd64, 0
  %tie = and i1 %eq, %odd
  %up = or i1 %gt, %tie
  %upi = zext i1 %up to i64
  %r = add i64 %r0, %upi
  %rfl = sitofp i64 %r to double
  %v = fmul double %rfl, %step
  %over = fcmp ogt double %v, {_float_hex(maxv)}
  %ovf = or i1 %over, %big
  %eb0 = add i32 %esafe, {bias - 1}
  %eb1 = zext i32 %eb0 to i64
  %eb = shl i64 %eb1, {mb}
  %bits64 = add i64 %eb, %r
  %bits8 = trunc i64 %bits64 to i8
  %bits = or i8 %bits8, %sign
  %ovfb = or i8 %sign, {f.max_bits}
  %res0 = select i1 %ovf, i8 %ovfb, i8 %bits
  %rzero = icmp eq i64 %r, 0
  %res = select i1 %rzero, i8 {"0" if f.kind == "fnuz" else "%sign"}, i8 %res0
  %isinf = fcmp oeq double %ax, {_float_hex(math.inf)}
  %infb = {f"or i8 %sign, {f.inf_bits}" if f.inf_bits is not None else f"or i8 0, {nanb}"}
  %res2 = select i1 %isinf, i8 %infb, i8 %res
  %isnan = fcmp uno double %x, %x
  %out = select i1 %isnan, i8 {nanb}, i8 %res2
  ret i8 %out
}}"""
    return to_f32 + "\n" + from_f64


# A buffer this big outlives every cache (the host's L3 is 32 MiB at most here): its whole-vector stores are
# non-temporal (vmovntps), writing lines without reading them first. a+b over 16M float32 (a 64 MiB output): 31.6 ->
# 40.6 GB/s on 2 cores, 14 -> 39 GB/s on one. Smaller outputs (a CNN's 9 MiB activations) are read back soon and
# stay cached.
NONTEMPORAL_MIN_BYTES = 32 << 20

_NO_CODE = frozenset({Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP})  # named (or nothing) where they are used
_LLVM_UNSUPPORTED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})  # libm's results differ from the interpreter's


def _comment_text(name: object) -> str:
    """A user-chosen name as comment text: as written if it is an identifier, else its ASCII repr (no line breaks)."""
    text = str(name)
    return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) else ascii(text)


class LLVMRenderer(Renderer):
    """Textual LLVM IR for the host CPU (see the module docstring for the exact semantics). EXP2/LOG2/SIN are left
    to the pipeline's decompositions; SQRT/TRUNC are `llvm.sqrt`/`llvm.trunc`. Vectors up to 256 bits (AVX2), or
    512 bits when the host has AVX-512F (see `llvm_vector_bytes`: the LLVM_VECTOR_BYTES setting may narrow them)."""

    name: ClassVar[str] = "llvm"
    supported_ops: ClassVar[frozenset[Ops]] = DEFAULT_SUPPORTED_OPS - _LLVM_UNSUPPORTED
    has_vectors: ClassVar[bool] = True
    index_int64: ClassVar[bool] = True  # 64-bit addresses: int32 index math costs LLVM's loop analyses (see Renderer)
    max_vector_bytes: ClassVar[int] = 32
    # stores of whole vectors into buffers at least this big bypass the caches (0: never; see render_store)
    nontemporal_min_bytes: ClassVar[int] = 0

    @property
    def odd_vector_widths(self) -> bool:
        """<5 x float> is as good a vector as <8 x float> to LLVM: the optimizer may block by 3, 5 or 6 lanes."""
        return True

    @property
    def wide_shuffles(self) -> bool:
        """LLVM turns a GEP's lane gather from two registers into one two-source permute (vpermt2ps)."""
        return True

    def __init__(self, max_vector_bytes: int | None = None, fp_contract: bool = False) -> None:
        """`max_vector_bytes`: widest vector to emit (16, 32 or 64 bytes); None: the LLVM_VECTOR_BYTES setting, else
        the host's (64 only with AVX-512F, else 32). `fp_contract`: mark float add/sub/mul `contract`, letting LLVM
        fuse a*b+c into one FMA (rounded once, so results may differ from the exact default in the last bit; about
        twice the throughput of multiply-then-add in convolutions and matmuls)."""
        mvb = llvm_vector_bytes() if max_vector_bytes is None else max_vector_bytes
        if mvb not in (16, 32, 64):
            raise CodegenValueError(
                f"LLVMRenderer max_vector_bytes must be 16, 32 or 64 (bytes), got {max_vector_bytes!r}"
            )
        self.max_vector_bytes = mvb  # type: ignore[misc]
        self.vector_registers = 32 if mvb == 64 else 16  # type: ignore[misc]  # AVX-512 names zmm0..31
        self.fp_contract = fp_contract
        self.nontemporal_min_bytes = NONTEMPORAL_MIN_BYTES  # type: ignore[misc]

    def supports(self, op: Ops, dtype: DType) -> bool:
        """As the base class, plus WHERE on every dtype (a select needs no arithmetic in the value's format)."""
        if op is Ops.WHERE and dtype.scalar() in _LTYPE:
            return True
        return super().supports(op, dtype)

    def render(self, uops: list[UOp]) -> str:
        """Render the program as one LLVM module: the kernel function plus the internal helpers it uses."""
        return _LLKernel(self, uops).render()


class _LLKernel:
    """The state of rendering one program: SSA names, the current basic block, allocas, and helpers in use.
    Targets other than the host CPU subclass it for their ABI (speck.codegen.renderer.amdgpu): the signature,
    pointer address spaces, and the UOps only they have (hardware ids, workgroup memory, barriers)."""

    alloca_space = ""  # `, addrspace(N)` where the target keeps stack slots in an address space of their own

    def __init__(self, r: LLVMRenderer, uops: list[UOp]) -> None:
        self.r, self.uops = r, uops
        self.sig = kernel_signature(uops, r.name)
        self.names: dict[UOp, str] = {}
        self.consts: dict[UOp, tuple[bool, Any]] = {}
        self.supported: dict[tuple[Ops, DType], bool] = {}  # the renderer's supports(op, dtype), asked once each
        self.literals: dict[UOp, str] = {}
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.helpers: dict[str, str] = {}
        self.intrinsics: dict[str, str] = {}
        self.block = "entry"
        self.ntmp = 0
        self.loops: list[tuple[UOp, str]] = []  # open RANGEs and their loop label
        self.nontemporal = False  # a non-temporal store was emitted: the kernel ends with sfence

    # ---- emission helpers ----
    def tmp(self, prefix: str = "t") -> str:
        self.ntmp += 1
        return f"%{prefix}{self.ntmp}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def ins(self, text: str, prefix: str = "t") -> str:
        nm = self.tmp(prefix)
        self.emit(f"{nm} = {text}")
        return nm

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    def intrinsic(self, base: str, dt: DType) -> str:
        s = dt.scalar()
        sfx = _INTR_SFX[s] if dt.count == 1 else f"v{dt.count}{_INTR_SFX[s]}"
        name = f"@llvm.{base}.{sfx}"
        self.intrinsics[name] = f"declare {ltype(dt)} {name}({ltype(dt)})"
        return name

    def helper(self, key: str) -> str:
        if "fp8" in key:
            dt = next(d for d in FP8_FORMATS if key.endswith(d.short_name) or key.startswith(d.short_name + "_"))
            self.helpers[dt.short_name] = _fp8_helpers(dt)
            self.intrinsics["@llvm.fabs.f64"] = "declare double @llvm.fabs.f64(double)"
        else:
            self.helpers[key] = _HELPERS[key]
            if key == "f64_to_f16":
                self.intrinsics["@llvm.fabs.f64"] = "declare double @llvm.fabs.f64(double)"
        return "@__speck_" + key

    # ---- operands ----
    def cconst(self, u: UOp) -> tuple[bool, Any]:
        """casted_const(u), memoized: literals are looked up at every use."""
        if (r := self.consts.get(u)) is None:
            r = self.consts[u] = casted_const(u)
        return r

    def operand(self, u: UOp) -> str:
        if u in self.names:
            return self.names[u]
        if (lit := self.literals.get(u)) is not None:
            return lit
        ok, v = self.cconst(u)
        if ok:
            lit = self.literals[u] = llvm_literal(v, u.dtype)
            return lit
        if u.op is Ops.CONST:
            raise bare_const_error(u, self.r.name)
        raise ProgramFormError(f"renderer 'llvm': {u.op} (dtype {u.dtype}) is used before it is defined; the program "
                               "is not in linearized order")  # fmt: skip

    def typed(self, u: UOp) -> str:
        return f"{ltype(u.dtype)} {self.operand(u)}"

    def splat(self, v: Any, dt: DType) -> str:
        return llvm_literal(v, dt)

    # ---- main ----
    def ptr_type(self, buf: UOp) -> str:
        """The LLVM type of a pointer into `buf` (a PARAM, DEFINE_REG or DEFINE_LOCAL, or an AFTER of one): one flat
        address space on the CPU; targets with several (the GPU's global, LDS, private) override this."""
        return "ptr"

    def signature(self) -> list[str]:
        """The function's comment and `define` line (the CPU ABI, CPU_ABI.md): buffers, variables, core slice."""
        params = self.buffer_params("ptr") + [f"i32 {nm}" for nm in self.variable_names()]
        params += ["i32 %core_start", "i32 %core_end"]
        return [*self.kernel_comment(), f"define void @{self.sig.name}({', '.join(params)}) #0 {{"]

    def buffer_params(self, ptr: str) -> list[str]:
        """Name the buffer PARAMs (`%data<slot>`) and return their parameters: `ptr` noalias, readonly unless
        written."""
        params: list[str] = []
        for b in self.sig.buffers:
            nm = self.names[b] = f"%data{b.arg if isinstance(b.arg, int) else b.arg[0]}"
            params.append(f"{ptr} noalias {'' if b in self.sig.written else 'readonly '}{nm}")
        return params

    def variable_names(self) -> list[str]:
        """Name the DEFINE_VARs (int32 by-value arguments, in name order) and return their SSA names."""
        out = []
        for i, v in enumerate(self.sig.variables):
            if v.dtype != dtypes.int32:
                raise UnsupportedOpError(self.r.name, Ops.DEFINE_VAR, v.dtype, "variables are int32 by the kernel ABI")
            # (LLVM cuts local names at 1024 characters: a longer Variable name was "redefinition of argument")
            named = len(str(v.arg[0])) <= 64 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(v.arg[0]))
            nm = f"%var.{v.arg[0]}" if named else f"%var{i}"
            if nm in out:  # (two Variables of one name with different ranges: one value, two arguments)
                nm = f"%var{i}"
            self.names[v] = nm
            out.append(nm)
        return out

    def kernel_comment(self) -> list[str]:
        # a name that is no identifier is quoted and escaped (one with a newline ended the comment: broken IR)
        var_names = ", ".join(f"{self.names[v]}={_comment_text(v.arg[0])}" for v in self.sig.variables)
        return [f"; kernel {self.sig.name}" + (f" (variables: {var_names})" if var_names else "")]

    def module_tail(self) -> list[str]:
        """What follows the function: helpers, intrinsic declarations, attribute groups."""
        return [
            *self.helpers.values(),
            *self.intrinsics.values(),
            'attributes #0 = { nounwind "frame-pointer"="none" }',
        ]

    def render(self) -> str:
        head = self.signature()
        for u in self.uops:
            try:
                self.render_uop(u)
            except NoTypeError as e:
                raise UnsupportedOpError(self.r.name, u.op, e.dtype, "the renderer has no type for it") from None
        if self.loops:
            raise ProgramFormError(f"renderer {self.r.name!r}: {len(self.loops)} RANGE(s) are never closed by an END")
        out = [*head, "entry:"]
        out += ["  " + a for a in self.allocas]
        out += self.lines
        if self.nontemporal:  # non-temporal stores are weakly ordered: visible to other cores before returning
            out.append("  call void @llvm.x86.sse.sfence()")
        out += ["  ret void", "}", ""]
        out += self.module_tail()
        return "\n".join(out) + "\n"

    def render_uop(self, u: UOp) -> None:
        op = u.op
        if op in _NO_CODE:
            return
        if op is Ops.CONST:
            if u.dtype.is_weak or u.dtype == dtypes.bool:
                return
            raise bare_const_error(u, self.r.name)
        if op is Ops.CAST and self.cconst(u)[0]:
            return
        if op is Ops.INDEX:
            self.render_index(u)
        elif op is Ops.RANGE:
            self.render_range(u)
        elif op is Ops.END:
            for r in reversed(u.src[1:]):
                self.close_range(r)
        elif op is Ops.DEFINE_REG:
            assert isinstance(u.dtype, PtrDType)
            nm = self.names[u] = f"%acc{len(self.allocas)}"
            base = u.dtype.base
            self.allocas.append(f"{nm} = alloca {ltype(base, mem=True)}, i32 {max(1, u.dtype.size)}, "
                                f"align {max(1, base.nbytes)}{self.alloca_space}")  # fmt: skip
        elif op is Ops.LOAD:
            self.render_load(u)
        elif op is Ops.STORE:
            self.render_store(u)
        else:
            self.names[u] = self.render_value(u)

    def render_range(self, u: UOp) -> None:
        n = len([x for x in self.names if x.op is Ops.RANGE])
        t = ltype(u.dtype)
        lbl = f"loop{n}"
        nm = self.names[u] = f"%ridx{n}"
        if u is self.sig.sliced:
            start, end = "%core_start", "%core_end"
            if t != "i32":
                start = self.ins(f"sext i32 {start} to {t}")
                end = self.ins(f"sext i32 %core_end to {t}")
        else:
            start, end = "0", self.operand(u.src[0])
        self.emit(f"br label %{lbl}")
        pred = self.block
        self.label(lbl)
        self.emit(f"{nm} = phi {t} [ {start}, %{pred} ], [ {nm}_next, %{lbl}_latch ]")
        self.emit(f"{nm}_cond = icmp slt {t} {nm}, {end}")
        self.emit(f"br i1 {nm}_cond, label %{lbl}_body, label %{lbl}_exit")
        self.label(f"{lbl}_body")
        self.loops.append((u, lbl))

    def close_range(self, r: UOp) -> None:
        if not self.loops or self.loops[-1][0] is not r:
            raise ProgramFormError("renderer 'llvm': END closes a RANGE that is not the innermost open one; ranges "
                                   "must nest")  # fmt: skip
        _, lbl = self.loops.pop()
        nm, t = self.names[r], ltype(r.dtype)
        self.emit(f"br label %{lbl}_latch")
        self.label(f"{lbl}_latch")
        self.emit(f"{nm}_next = add nsw {t} {nm}, 1")
        self.emit(f"br label %{lbl}")
        self.label(f"{lbl}_exit")

    def render_index(self, u: UOp) -> None:
        buf, off = u.src[0], u.src[1]
        if off.dtype.count > 1:
            raise ProgramFormError(
                f"renderer 'llvm': INDEX with a vector of offsets ({off.dtype}) is not a program form"
            )
        base = buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype
        # no `inbounds`: a gated INDEX may point anywhere while its gate is false
        gep = f"getelementptr {ltype(base, mem=True)}, {self.ptr_type(buf)} {self.operand(buf)}, {self.typed(off)}"
        self.names[u] = self.ins(gep, "p")

    def _access(self, u: UOp, idx: UOp, vdt: DType) -> int:
        """The alignment of a LOAD/STORE of vdt through idx (checks the access is the element type or a vector)."""
        if idx.op is not Ops.INDEX:
            raise ProgramFormError(f"renderer 'llvm': {u.op} must address memory through an INDEX, got {idx.op}")
        base = idx.src[0].dtype.base if isinstance(idx.src[0].dtype, PtrDType) else idx.src[0].dtype
        if vdt == base:
            return max(1, base.scalar().itemsize)
        if vdt.count > 1 and vdt.scalar() == base.scalar() and base.count == 1:
            return max(1, base.itemsize)
        raise ProgramFormError(f"renderer 'llvm': {u.op} of {vdt} through a pointer to {base}; expected the element "
                               "type or a vector of it")  # fmt: skip

    def _load_value(self, u: UOp, ptr: str, align: int) -> str:
        mt = ltype(u.dtype, mem=True)
        v = self.ins(f"load {mt}, {self.ptr_type(u.src[0].src[0])} {ptr}, align {align}", "ld")
        if u.dtype.scalar() == dtypes.bool:
            v = self.ins(f"icmp ne {mt} {v}, {'zeroinitializer' if u.dtype.count > 1 else '0'}")
        return v

    def render_load(self, u: UOp) -> None:
        idx = u.src[0]
        align = self._access(u, idx, u.dtype)
        ptr = self.operand(idx)
        if len(idx.src) <= 2:
            self.names[u] = self._load_value(u, ptr, align)
            return
        alt = self.operand(u.src[1]) if len(u.src) > 1 else self.zero(u.dtype)
        gate = self.operand(idx.src[2])
        n = self.tmp("g")[1:]
        pred = self.block
        self.emit(f"br i1 {gate}, label %{n}_load, label %{n}_join")
        self.label(f"{n}_load")
        v = self._load_value(u, ptr, align)
        loaded_in = self.block
        self.emit(f"br label %{n}_join")
        self.label(f"{n}_join")
        self.names[u] = self.ins(f"phi {ltype(u.dtype)} [ {v}, %{loaded_in} ], [ {alt}, %{pred} ]", "v")

    def zero(self, dt: DType) -> str:
        return "zeroinitializer" if dt.count > 1 else llvm_scalar_literal(0.0 if dtypes.is_float(dt) else 0, dt)

    def render_store(self, u: UOp) -> None:
        idx, val = u.src[0], u.src[1]
        align = self._access(u, idx, val.dtype)
        n = None
        if len(idx.src) > 2:
            n = self.tmp("g")[1:]
            self.emit(f"br i1 {self.operand(idx.src[2])}, label %{n}_store, label %{n}_join")
            self.label(f"{n}_store")
        v = self.operand(val)
        if val.dtype.scalar() == dtypes.bool:
            v = self.ins(f"zext {ltype(val.dtype)} {v} to {ltype(val.dtype, mem=True)}")
        store = f"store {ltype(val.dtype, mem=True)} {v}, {self.ptr_type(idx.src[0])} {self.operand(idx)}"
        if n is None and self._nontemporal(idx, val.dtype):
            # vmovntps needs an address aligned to the vector; a view at an odd offset takes the cached store
            size = val.dtype.count * val.dtype.scalar().itemsize
            addr = self.ins(f"ptrtoint {self.ptr_type(idx.src[0])} {self.operand(idx)} to i64")
            low = self.ins(f"and i64 {addr}, {size - 1}")
            ok = self.ins(f"icmp eq i64 {low}, 0")
            m = self.tmp("nt")[1:]
            self.emit(f"br i1 {ok}, label %{m}_nt, label %{m}_cached")
            self.label(f"{m}_nt")
            self.emit(f"{store}, align {size}, !nontemporal !{{i32 1}}")
            self.emit(f"br label %{m}_join")
            self.label(f"{m}_cached")
            self.emit(f"{store}, align {align}")
            self.emit(f"br label %{m}_join")
            self.label(f"{m}_join")
            if "@llvm.x86.sse.sfence" not in self.intrinsics:
                self.intrinsics["@llvm.x86.sse.sfence"] = "declare void @llvm.x86.sse.sfence()"
            self.nontemporal = True
            return
        self.emit(f"{store}, align {align}")
        if n is not None:
            self.emit(f"br label %{n}_join")
            self.label(f"{n}_join")

    def _nontemporal(self, idx: UOp, vdt: DType) -> bool:
        """A store of a whole float vector (16 bytes or more, a power of two) into a buffer of at least the
        renderer's `nontemporal_min_bytes` (see NONTEMPORAL_MIN_BYTES)."""
        least = self.r.nontemporal_min_bytes
        buf = idx.src[0]
        if not least or buf.op is not Ops.PARAM or not isinstance(buf.dtype, PtrDType) or vdt.count < 2:
            return False
        size = vdt.count * vdt.scalar().itemsize
        return (
            dtypes.is_float(vdt.scalar()) and size >= 16 and size & (size - 1) == 0
            and buf.dtype.size * buf.dtype.base.itemsize >= least
        )  # fmt: skip

    # ---- values ----
    def render_value(self, u: UOp) -> str:
        op = u.op
        if op is Ops.STACK:
            if all(self.cconst(s)[0] for s in u.src):  # all literals: a constant vector, no instructions
                return "<" + ", ".join(self.typed(s) for s in u.src) + ">"
            t, cur = ltype(u.dtype), "poison"
            if (shuffled := self.stack_shuffle(u, t)) is not None:
                return shuffled
            for i, s in enumerate(u.src):
                cur = self.ins(f"insertelement {t} {cur}, {self.typed(s)}, i32 {i}", "v")
            return cur
        if op is Ops.GEP:
            src, lanes = u.src[0], tuple(u.arg)
            if src.dtype.count == 1:
                return self.operand(src)
            if len(lanes) == 1:
                return self.ins(f"extractelement {self.typed(src)}, i32 {lanes[0]}", "v")
            mask = ", ".join(f"i32 {i}" for i in lanes)
            sv = f"shufflevector {self.typed(src)}, {ltype(src.dtype)} poison, <{len(lanes)} x i32> <{mask}>"
            return self.ins(sv, "v")
        if op is Ops.BITCAST:
            src = u.src[0]
            if src.dtype.nbytes != u.dtype.nbytes or dtypes.is_bool(src.dtype) or dtypes.is_bool(u.dtype):
                raise UnsupportedOpError(self.r.name, Ops.BITCAST, u.dtype, f"source {src.dtype} has another size")
            if ltype(src.dtype) == ltype(u.dtype):
                return self.operand(src)
            return self.ins(f"bitcast {self.typed(src)} to {ltype(u.dtype)}", "v")
        if op is Ops.CAST:
            return self.cast(self.operand(u.src[0]), u.src[0].dtype, u.dtype)
        if op in GroupOp.ALU:
            return self.alu(u)
        raise ProgramFormError(f"renderer 'llvm' cannot express {op} (dtype {u.dtype}): it is not part of the program "
                               "form (KERNEL_CONTRACT.md section 2)")  # fmt: skip

    def stack_shuffle(self, u: UOp, t: str) -> str | None:
        """A STACK as one shufflevector where it can be: a broadcast of one value (insert it once, splat it), or
        lanes of at most two vectors of one type (how the expander and devectorizer join loaded or split parts).
        A chain of one insertelement per lane is what InstCombine turns into these anyway, at a cost: ~10% of a cold
        CNN step's IR lines were such chains, parsed and folded per module. None when it is neither."""
        first, n = u.src[0], len(u.src)
        if all(s is first for s in u.src):
            one = self.ins(f"insertelement {t} poison, {self.typed(first)}, i32 0", "v")
            return self.ins(f"shufflevector {t} {one}, {t} poison, <{n} x i32> zeroinitializer", "v")
        vecs: list[UOp] = []
        mask: list[int] = []
        for s in u.src:
            if s.op is not Ops.GEP or len(s.arg) != 1 or (v := s.src[0]).dtype.count < 2:
                return None
            if v not in vecs:
                if len(vecs) == 2 or (vecs and v.dtype != vecs[0].dtype):
                    return None
                vecs.append(v)
            mask.append(s.arg[0] + (v.dtype.count if v is not vecs[0] else 0))
        a = self.typed(vecs[0])
        b = self.operand(vecs[1]) if len(vecs) == 2 else "poison"
        lanes = ", ".join(f"i32 {i}" for i in mask)
        return self.ins(f"shufflevector {a}, {ltype(vecs[0].dtype)} {b}, <{n} x i32> <{lanes}>", "v")

    def lanewise(self, x: str, fr: DType, to: DType, fn: Any) -> str:
        """Apply scalar function fn(x_lane) -> value of to.scalar() to each lane of vector x (for helper calls)."""
        if fr.count == 1:
            return str(fn(x))
        cur = "poison"
        for i in range(fr.count):
            lane = self.ins(f"extractelement {ltype(fr)} {x}, i32 {i}")
            cur = self.ins(f"insertelement {ltype(to)} {cur}, {ltype(to.scalar())} {fn(lane)}, i32 {i}")
        return cur

    # ---- casts ----
    def cast(self, x: str, fr_dt: DType, to_dt: DType) -> str:
        fr, to, n = fr_dt.scalar(), to_dt.scalar(), to_dt.count

        def vec(d: DType) -> DType:
            return d.vec(n) if n > 1 else d

        if fr == to:
            return x
        if fr == dtypes.bfloat16:
            h = self.helper("bf16_to_f32")
            x = self.lanewise(x, fr_dt, vec(dtypes.float32), lambda a: self.ins(f"call float {h}(i16 {a})"))
            return self.cast(x, vec(dtypes.float32), to_dt)
        if fr in _FP8:
            h = self.helper(f"{fr.short_name}_to_f32")
            x = self.lanewise(x, fr_dt, vec(dtypes.float32), lambda a: self.ins(f"call float {h}(i8 {a})"))
            return self.cast(x, vec(dtypes.float32), to_dt)
        if to == dtypes.bfloat16:
            x = self.cast(x, fr_dt, vec(dtypes.float32))
            h = self.helper("f32_to_bf16")
            return self.lanewise(x, vec(dtypes.float32), to_dt, lambda a: self.ins(f"call i16 {h}(float {a})"))
        if to in _FP8:
            x = self.cast(x, fr_dt, vec(dtypes.float64))
            h = self.helper(f"f64_to_{to.short_name}")
            return self.lanewise(x, vec(dtypes.float64), to_dt, lambda a: self.ins(f"call i8 {h}(double {a})"))
        if to == dtypes.float16 and fr not in (dtypes.float32, dtypes.bool):
            x = self.cast(x, fr_dt, vec(dtypes.float64))
            h = self.helper("f64_to_f16")
            return self.lanewise(x, vec(dtypes.float64), to_dt, lambda a: self.ins(f"call half {h}(double {a})"))
        ft, tt = ltype(fr_dt), ltype(to_dt)
        if fr == dtypes.bool:
            return self.ins(f"{'uitofp' if dtypes.is_float(to) else 'zext'} {ft} {x} to {tt}", "v")
        if to == dtypes.bool:
            if dtypes.is_float(fr):
                return self.ins(f"fcmp une {ft} {x}, {self.zero(fr_dt)}", "v")
            return self.ins(f"icmp ne {ft} {x}, {self.zero(fr_dt)}", "v")
        if dtypes.is_float(fr) and dtypes.is_float(to):
            op = "fpext" if to.itemsize > fr.itemsize else "fptrunc"
            return self.ins(f"{op} {ft} {x} to {tt}", "v")
        if dtypes.is_float(fr):
            return self.float_to_int(x, fr_dt, to_dt)
        if (
            dtypes.is_float(to) and fr.itemsize == 8 and to != dtypes.float64
        ):  # round through float64 like the interpreter
            x = self.ins(f"{'uitofp' if dtypes.is_unsigned(fr) else 'sitofp'} {ft} {x} to {ltype(vec(dtypes.float64))}")
            return self.cast(x, vec(dtypes.float64), to_dt)
        if dtypes.is_float(to):
            return self.ins(f"{'uitofp' if dtypes.is_unsigned(fr) else 'sitofp'} {ft} {x} to {tt}", "v")
        # int -> int
        if fr.itemsize == to.itemsize:
            return x
        if fr.itemsize > to.itemsize:
            return self.ins(f"trunc {ft} {x} to {tt}", "v")
        return self.ins(f"{'zext' if dtypes.is_unsigned(fr) else 'sext'} {ft} {x} to {tt}", "v")

    def float_to_int(self, x: str, fr_dt: DType, to_dt: DType) -> str:
        """Truncate toward zero and wrap modulo 2**64 like the interpreter (NaN and inf give 0). |x| >= 2**64 is
        first reduced exactly (x - 2**64 * trunc(x / 2**64)); fptoui then only sees values proven in range, so no
        poison is ever produced."""
        n = to_dt.count
        f64 = dtypes.float64.vec(n) if n > 1 else dtypes.float64
        i64d = dtypes.int64.vec(n) if n > 1 else dtypes.int64
        i64 = ltype(i64d)
        bt = ltype(dtypes.bool.vec(n) if n > 1 else dtypes.bool)
        d = self.cast(x, fr_dt, f64)
        t = ltype(f64)
        fabs, trunc = self.intrinsic("fabs", f64), self.intrinsic("trunc", f64)
        ax = self.ins(f"call {t} {fabs}({t} {d})")
        big = self.ins(f"fcmp oge {t} {ax}, {self.splat(2.0**64, f64)}")
        sc = self.ins(f"fmul {t} {d}, {self.splat(2.0**-64, f64)}")
        q = self.ins(f"call {t} {trunc}({t} {sc})")
        qq = self.ins(f"fmul {t} {q}, {self.splat(2.0**64, f64)}")
        red = self.ins(f"fsub {t} {d}, {qq}")
        d2 = self.ins(f"select {bt} {big}, {t} {red}, {t} {d}")
        ax2 = self.ins(f"call {t} {fabs}({t} {d2})")
        ok = self.ins(f"fcmp olt {t} {ax2}, {self.splat(2.0**64, f64)}")
        xs = self.ins(f"select {bt} {ok}, {t} {d2}, {t} {self.zero(f64)}")
        axs = self.ins(f"select {bt} {ok}, {t} {ax2}, {t} {self.zero(f64)}")
        mag = self.ins(f"fptoui {t} {axs} to {i64}")
        neg = self.ins(f"fcmp olt {t} {xs}, {self.zero(f64)}")
        nmag = self.ins(f"sub {i64} {self.zero(i64d)}, {mag}")
        r = self.ins(f"select {bt} {neg}, {i64} {nmag}, {i64} {mag}", "v")
        return r if to_dt.scalar().itemsize == 8 else self.ins(f"trunc {i64} {r} to {ltype(to_dt)}", "v")

    # ---- ALU ----
    def alu(self, u: UOp) -> str:
        op = u.op
        dt = u.src[0].dtype if op in GroupOp.Comparison else (u.src[1].dtype if op is Ops.WHERE else u.dtype)
        if (ok := self.supported.get((op, dt))) is None:
            ok = self.supported[(op, dt)] = self.r.supports(op, dt)
        if not ok:
            raise UnsupportedOpError(self.r.name, op, dt)
        s = dt.scalar()
        a = [self.operand(x) for x in u.src]
        t = ltype(dt)

        def fail(s: DType = s) -> UnsupportedOpError:  # built only when raised (alu runs for every ALU op)
            return UnsupportedOpError(self.r.name, op, s, "no LLVM form for this op on this dtype")

        if op is Ops.WHERE:
            return self.ins(f"select {self.typed(u.src[0])}, {t} {a[1]}, {t} {a[2]}", "v")
        if s in _STORAGE:
            if op not in GroupOp.Comparison:
                raise fail()
            a = [self.cast(x, dt, dtypes.float32.vec(dt.count) if dt.count > 1 else dtypes.float32) for x in a]
            s, dt = dtypes.float32, (dtypes.float32.vec(dt.count) if dt.count > 1 else dtypes.float32)
            t = ltype(dt)
        if dtypes.is_float(s):
            if op in GroupOp.Comparison:
                cc = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[op]
                return self.ins(f"fcmp {cc} {t} {a[0]}, {a[1]}", "v")
            if s == dtypes.float16 and not self.r.supports_float16:
                raise fail()  # half arithmetic arrives widened to float (supports_float16 is False)
            simple = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
            if op in simple:
                flag = " contract" if self.r.fp_contract and op is not Ops.FDIV else ""
                return self.ins(f"{simple[op]}{flag} {t} {a[0]}, {a[1]}", "v")
            if op is Ops.NEG:
                return self.ins(f"fneg {t} {a[0]}", "v")
            if op is Ops.RECIPROCAL:
                return self.ins(f"fdiv {t} {self.splat(1.0, dt)}, {a[0]}", "v")
            if op in (Ops.SQRT, Ops.TRUNC):
                fn = self.intrinsic("sqrt" if op is Ops.SQRT else "trunc", dt)
                return self.ins(f"call {t} {fn}({t} {a[0]})", "v")
            if op is Ops.MAX:  # b if (b > a or b is NaN) else a: NaN-propagating, never llvm.maxnum
                gt = self.ins(f"fcmp ogt {t} {a[1]}, {a[0]}")
                nan = self.ins(f"fcmp uno {t} {a[1]}, {a[1]}")
                bt = ltype(dtypes.bool.vec(dt.count) if dt.count > 1 else dtypes.bool)
                c = self.ins(f"or {bt} {gt}, {nan}")
                return self.ins(f"select {bt} {c}, {t} {a[1]}, {t} {a[0]}", "v")
            raise fail()
        signed = not dtypes.is_unsigned(s) and s != dtypes.bool
        if op in GroupOp.Comparison:
            cc = {Ops.CMPLT: "slt" if signed else "ult", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
            return self.ins(f"icmp {cc} {t} {a[0]}, {a[1]}", "v")
        if s == dtypes.bool:
            table = {Ops.ADD: "or", Ops.OR: "or", Ops.MAX: "or", Ops.MUL: "and", Ops.AND: "and", Ops.XOR: "xor",
                     Ops.SUB: "xor"}  # fmt: skip
            if op in table:
                return self.ins(f"{table[op]} {t} {a[0]}, {a[1]}", "v")
            if op is Ops.NEG:
                return self.ins(f"xor {t} {a[0]}, {self.splat(True, dt)}", "v")
            raise fail()
        return self.int_alu(u, op, s, dt, a, signed)

    def int_alu(self, u: UOp, op: Ops, s: DType, dt: DType, a: list[str], signed: bool) -> str:
        t = ltype(dt)
        bt = ltype(dtypes.bool.vec(dt.count) if dt.count > 1 else dtypes.bool)
        simple = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
        if op in simple:
            # fixed-width ints wrap, so no nsw in general; but index math whose bounds fit the type cannot overflow,
            # and telling LLVM so (nsw) spares its scalar evolution the wrap cases (loop analysis compiles faster)
            nsw = " nsw" if op in _NSW_OPS and signed and dt.count == 1 and len(u.src) == 2 and _fits(op, u, s) else ""
            return self.ins(f"{simple[op]}{nsw} {t} {a[0]}, {a[1]}", "v")
        if op is Ops.NEG:
            return self.ins(f"sub {t} {self.zero(dt)}, {a[0]}", "v")
        if op is Ops.TRUNC:
            return a[0]
        if op is Ops.MAX:
            c = self.ins(f"icmp {'sgt' if signed else 'ugt'} {t} {a[1]}, {a[0]}")
            return self.ins(f"select {bt} {c}, {t} {a[1]}, {t} {a[0]}", "v")
        if op in (Ops.CDIV, Ops.CMOD):
            ins = ("sdiv" if signed else "udiv") if op is Ops.CDIV else ("srem" if signed else "urem")
            b_uop = u.src[1]
            lo, hi = b_uop.vmin, b_uop.vmax
            zero_ok = isinstance(lo, int) and isinstance(hi, int) and not lo <= 0 <= hi
            m1_ok = not signed or (isinstance(lo, int) and not lo <= -1 <= hi) or u.src[0].vmin > dtypes.min(s)
            if zero_ok and m1_ok:
                return self.ins(f"{ins} {t} {a[0]}, {a[1]}", "v")
            # guard: x/0 = x%0 = 0, MIN/-1 wraps to MIN (= -x), x%-1 = 0, as in the interpreter
            one, zero = self.splat(1, dt), self.zero(dt)
            isz = self.ins(f"icmp eq {t} {a[1]}, {zero}")
            bad = isz
            if signed:
                ism1 = self.ins(f"icmp eq {t} {a[1]}, {self.splat(-1, dt)}")
                bad = self.ins(f"or {bt} {isz}, {ism1}")
            safe_b = self.ins(f"select {bt} {bad}, {t} {one}, {t} {a[1]}")
            q = self.ins(f"{ins} {t} {a[0]}, {safe_b}")
            if op is Ops.CMOD:
                return self.ins(f"select {bt} {bad}, {t} {zero}, {t} {q}", "v")
            if signed:
                neg = self.ins(f"sub {t} {zero}, {a[0]}")
                q = self.ins(f"select {bt} {ism1}, {t} {neg}, {t} {q}")
            return self.ins(f"select {bt} {isz}, {t} {zero}, {t} {q}", "v")
        if op in (Ops.SHL, Ops.SHR):
            ins = "shl" if op is Ops.SHL else ("ashr" if signed else "lshr")
            bits = 8 * s.itemsize
            if shift_safe(u.src[1], bits):
                return self.ins(f"{ins} {t} {a[0]}, {a[1]}", "v")
            # out-of-range amounts give 0 (-1 for an arithmetic right shift of a negative value)
            inr = self.ins(f"icmp ult {t} {a[1]}, {self.splat(bits, dt)}")  # unsigned compare also rejects < 0
            safe = self.ins(f"select {bt} {inr}, {t} {a[1]}, {t} {self.zero(dt)}")
            r = self.ins(f"{ins} {t} {a[0]}, {safe}")
            if ins == "ashr":
                fb = self.ins(f"ashr {t} {a[0]}, {self.splat(bits - 1, dt)}")
            else:
                fb = self.zero(dt)
            return self.ins(f"select {bt} {inr}, {t} {r}, {t} {fb}", "v")
        raise UnsupportedOpError(self.r.name, op, s, "no LLVM form for this op on an integer dtype")


__all__ = ["LLVMRenderer", "llvm_literal", "ltype"]
