"""Hand-written LLVM IR kernels for the RDNA3 emulator tests, each with inputs and a numpy reference.

Every kernel takes (ptr out, ptr a, ptr b, i32 n) in address space 1 and handles elements gid < n, where
gid = workgroup.id.x * 64 + workitem.id.x (blocks of 64 threads = two waves) unless it says otherwise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rdna3_llvm import kernel

ARGS = "ptr addrspace(1) %out, ptr addrspace(1) %a, ptr addrspace(1) %b, i32 %n"
PROLOGUE = """
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 64
  %i = add i32 %base, %tid
  %inb = icmp slt i32 %i, %n
  br i1 %inb, label %body, label %done
body:
"""
EPILOGUE = """
  br label %done
done:
  ret void
"""


@dataclass(frozen=True)
class Case:
    """A kernel: its IR, element types of out/a/b, a reference f(a, b) -> out, and tolerance in ULPs (0 = exact)."""

    name: str
    ir: str
    out: str
    a: str
    b: str
    ref: Callable[[np.ndarray, np.ndarray], np.ndarray]
    ulp: int = 0
    n: int = 200
    block: int = 64
    true16: bool = False
    inputs: Callable[[np.random.Generator, int, str], np.ndarray] | None = None
    extra_decls: str = ""
    tags: tuple[str, ...] = field(default=())


def _elementwise(name: str, ty_out: str, ty_a: str, ty_b: str, expr: str, decls: str = "") -> str:
    """A kernel computing out[i] = expr(x, y) with x = a[i], y = b[i]; expr is IR producing %r from %x, %y."""
    body = f"""{PROLOGUE}
  %pa = getelementptr {ty_a}, ptr addrspace(1) %a, i32 %i
  %x = load {ty_a}, ptr addrspace(1) %pa
  %pb = getelementptr {ty_b}, ptr addrspace(1) %b, i32 %i
  %y = load {ty_b}, ptr addrspace(1) %pb
{expr}
  %po = getelementptr {ty_out}, ptr addrspace(1) %out, i32 %i
  store {ty_out} %r, ptr addrspace(1) %po
{EPILOGUE}"""
    return kernel(name, ARGS, body, decls)


NP = {
    "float": np.float32,
    "half": np.float16,
    "double": np.float64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "bfloat": np.uint16,
}


def special_floats(rng: np.random.Generator, n: int, ty: str) -> np.ndarray:
    """Random values with NaN, +-inf, +-0, denormals and extremes mixed in."""
    dt = NP[ty]
    if ty == "bfloat":
        f = special_floats(rng, n, "float")
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    if np.issubdtype(dt, np.floating):
        fi = np.finfo(dt)
        vals = (rng.standard_normal(n) * rng.choice([1e-3, 1, 10, 1e4], n)).astype(dt)
        special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, fi.tiny, -fi.tiny, fi.max, -fi.max, 1.0, -1.0])
        special = np.concatenate([special, [fi.tiny / 4, -fi.tiny / 3, fi.smallest_subnormal]]).astype(dt)
        pick = rng.random(n) < 0.2
        vals[pick] = rng.choice(special, int(pick.sum()))
        return vals
    info = np.iinfo(dt)
    vals = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    edge = np.array([0, 1, info.max, info.min, info.max - 1, info.min + 1], dtype=dt)
    pick = rng.random(n) < 0.2
    vals[pick] = rng.choice(edge, int(pick.sum()))
    return vals


def _f64ref(f: Callable[..., np.ndarray], dt: type = np.float32) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return f(a.astype(np.float64), b.astype(np.float64)).astype(dt)

    return run


def _wrap(f: Callable[..., np.ndarray], dt: type) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(f(a, b)).astype(dt)

    return run


def _idiv(a: np.ndarray, b: np.ndarray, dt: type, rem: bool = False) -> np.ndarray:
    """C's truncating signed division (or remainder), wrapped to the type."""
    bits = np.iinfo(dt).bits
    out = []
    for x, y in zip(a.tolist(), b.tolist()):
        q = abs(x) // abs(y)
        q = q if (x >= 0) == (y >= 0) else -q
        out.append((x - q * y if rem else q) % (1 << bits))
    return np.array(out, dtype=np.uint64).astype(dt)


def _nonzero_ints(rng: np.random.Generator, n: int, ty: str) -> np.ndarray:
    v = special_floats(rng, n, ty)
    v[v == 0] = 3
    if np.issubdtype(NP[ty], np.signedinteger):  # min / -1 overflows (undefined in LLVM)
        v[v == -1] = 7
    return v


def cases() -> list[Case]:
    out: list[Case] = []
    f32 = "float"
    for op, ref in (("fadd", np.add), ("fsub", np.subtract), ("fmul", np.multiply), ("fdiv", np.divide)):
        ir = _elementwise(f"{op}_f32", f32, f32, f32, f"  %r = {op} float %x, %y")
        out.append(Case(f"{op}_f32", ir, f32, f32, f32, _wrap(ref, np.float32), tags=("f32",)))
    unary = {
        "exp2": (np.exp2, 1),
        "log2": (np.log2, 1),
        "sqrt": (np.sqrt, 0),
        "sin": (np.sin, 1),
        "cos": (np.cos, 1),
        "exp": (np.exp, 1),
        "log": (np.log, 1),
    }
    for fn, (ref, ulp) in unary.items():
        decl = f"declare float @llvm.{fn}.f32(float)"
        ir = _elementwise(f"{fn}_f32", f32, f32, f32, f"  %r = call float @llvm.{fn}.f32(float %x)", decl)
        if fn in ("sin", "cos"):
            # LLVM lowers sin(x) to V_SIN_F32(x * 1/(2*pi)) (revolutions): the product rounds to float32 first
            out.append(Case(f"{fn}_f32", ir, f32, f32, f32, _revolutions(ref), 1))
            continue
        out.append(Case(f"{fn}_f32", ir, f32, f32, f32, _f64ref(lambda a, b, r=ref: r(a)), ulp))
    ir = _elementwise("rcp_f32", f32, f32, f32, "  %r = fdiv float 1.0, %x")
    out.append(Case("rcp_f32", ir, f32, f32, f32, _wrap(lambda a, b: np.float32(1) / a, np.float32)))
    d = "double"
    for op, ref_ in (("fadd", np.add), ("fmul", np.multiply), ("fdiv", np.divide)):
        ir = _elementwise(f"{op}_f64", d, d, d, f"  %r = {op} double %x, %y")
        out.append(Case(f"{op}_f64", ir, d, d, d, _wrap(ref_, np.float64), tags=("f64",)))
    decl = "declare double @llvm.fma.f64(double, double, double)"
    ir = _elementwise("fma_f64", d, d, d, "  %r = call double @llvm.fma.f64(double %x, double %y, double %x)", decl)
    out.append(Case("fma_f64", ir, d, d, d, _fma64_ref, tags=("f64",)))
    decl = "declare double @llvm.sqrt.f64(double)"
    ir = _elementwise("sqrt_f64", d, d, d, "  %r = call double @llvm.sqrt.f64(double %x)", decl)
    out.append(Case("sqrt_f64", ir, d, d, d, _wrap(lambda a, b: np.sqrt(a), np.float64), tags=("f64",)))
    decl = "declare float @llvm.fma.f32(float, float, float)"
    ir = _elementwise("fma_f32", f32, f32, f32, "  %r = call float @llvm.fma.f32(float %x, float %y, float %x)", decl)
    out.append(Case("fma_f32", ir, f32, f32, f32, _f64ref(lambda a, b: a * b + a)))
    for fn, ref_ in (("minnum", np.fmin), ("maxnum", np.fmax)):
        decl = f"declare float @llvm.{fn}.f32(float, float)"
        ir = _elementwise(f"{fn}_f32", f32, f32, f32, f"  %r = call float @llvm.{fn}.f32(float %x, float %y)", decl)
        out.append(Case(f"{fn}_f32", ir, f32, f32, f32, _wrap(ref_, np.float32), tags=("minmax",)))
    expr = "  %c = fcmp olt float %x, %y\n  %r = select i1 %c, float %x, float %y"
    out.append(
        Case(
            "select_f32",
            _elementwise("select_f32", f32, f32, f32, expr),
            f32,
            f32,
            f32,
            _wrap(lambda a, b: np.where(a < b, a, b), np.float32),
        )
    )
    # integers
    for ty, dt in (("i32", np.int32), ("i64", np.int64), ("i16", np.int16), ("i8", np.int8)):
        for op, ref_ in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("xor", np.bitwise_xor)):
            ir = _elementwise(f"{op}_{ty}", ty, ty, ty, f"  %r = {op} {ty} %x, %y")
            out.append(Case(f"{op}_{ty}", ir, ty, ty, ty, _wrap(ref_, dt)))
        bits = np.iinfo(dt).bits
        for op in ("shl", "lshr", "ashr"):
            expr = f"  %s = and {ty} %y, {bits - 1}\n  %r = {op} {ty} %x, %s"

            def ref_shift(a: np.ndarray, b: np.ndarray, op: str = op, dt: type = dt, bits: int = bits) -> np.ndarray:
                s = (b.astype(np.int64) & (bits - 1)).astype(dt)
                u = a.view(np.dtype(dt).str.replace("i", "u"))
                if op == "shl":
                    return (u << s.astype(u.dtype)).view(dt)
                if op == "lshr":
                    return (u >> s.astype(u.dtype)).view(dt)
                return a >> s

            out.append(Case(f"{op}_{ty}", _elementwise(f"{op}_{ty}", ty, ty, ty, expr), ty, ty, ty, ref_shift))
        for op in ("sdiv", "srem", "udiv", "urem"):
            udt = np.dtype(dt).str.replace("i", "u")

            def ref_div(a: np.ndarray, b: np.ndarray, op: str = op, dt: type = dt, udt: str = udt) -> np.ndarray:
                if op[0] == "u":
                    ua, ub = a.view(udt), b.view(udt)
                    return (ua // ub if op == "udiv" else ua % ub).view(dt)
                return _idiv(a, b, dt, rem=op == "srem")

            ir = _elementwise(f"{op}_{ty}", ty, ty, ty, f"  %r = {op} {ty} %x, %y")
            out.append(Case(f"{op}_{ty}", ir, ty, ty, ty, ref_div, inputs=_nonzero_ints, tags=("div",)))
        for pred, ref_c in (("slt", np.less), ("ult", None), ("eq", np.equal)):
            expr = f"  %c = icmp {pred} {ty} %x, %y\n  %r = select i1 %c, {ty} %x, {ty} %y"

            def ref_cmp(a: np.ndarray, b: np.ndarray, pred: str = pred, dt: type = dt) -> np.ndarray:
                if pred == "ult":
                    u = np.dtype(dt).str.replace("i", "u")
                    c = a.view(u) < b.view(u)
                else:
                    c = {"slt": np.less, "eq": np.equal}[pred](a, b)
                return np.where(c, a, b)

            del ref_c
            out.append(
                Case(f"cmp_{pred}_{ty}", _elementwise(f"cmp_{pred}_{ty}", ty, ty, ty, expr), ty, ty, ty, ref_cmp)
            )
    # a wave-uniform value: lane 0 of each wave (all of its lanes are active: 200 elements, waves of 32)
    rfl = "declare i32 @llvm.amdgcn.readfirstlane.i32(i32)"
    expr = "  %f = call i32 @llvm.amdgcn.readfirstlane.i32(i32 %x)\n  %r = add i32 %f, %y"
    ir = _elementwise("readfirstlane_i32", "i32", "i32", "i32", expr, rfl)
    out.append(Case("readfirstlane_i32", ir, "i32", "i32", "i32", lambda a, b: a[np.arange(len(a)) // 32 * 32] + b))
    # casts
    # (name = <llvm op>_<from>_<to>, result type, source type, numpy reference; None: the bf16 references below)
    casts: list[tuple[str, str, str, Callable[[np.ndarray], np.ndarray] | None]] = [
        ("fptosi_f32_i32", "i32", "float", lambda a: a.astype(np.int32)),
        ("fptoui_f32_u32", "i32", "float", lambda a: a.astype(np.uint32).view(np.int32)),
        ("sitofp_i32_f32", "float", "i32", lambda a: a.astype(np.float32)),
        ("uitofp_i32_f32", "float", "i32", lambda a: a.view(np.uint32).astype(np.float32)),
        ("sitofp_i64_f32", "float", "i64", lambda a: a.astype(np.float32)),
        ("uitofp_i64_f32", "float", "i64", lambda a: a.view(np.uint64).astype(np.float32)),
        ("fptosi_f32_i64", "i64", "float", lambda a: a.astype(np.int64)),
        ("sitofp_i8_f32", "float", "i8", lambda a: a.astype(np.float32)),
        ("fptrunc_f32_f16", "half", "float", lambda a: a.astype(np.float16)),
        ("fpext_f16_f32", "float", "half", lambda a: a.astype(np.float32)),
        ("fptosi_f16_i16", "i16", "half", lambda a: a.astype(np.int16)),
        ("sitofp_i16_f16", "half", "i16", lambda a: a.astype(np.float16)),
        ("bitcast_f32_i32", "i32", "float", lambda a: a.view(np.int32)),
        ("sext_i8_i32", "i32", "i8", lambda a: a.astype(np.int32)),
        ("zext_i16_i64", "i64", "i16", lambda a: a.view(np.uint16).astype(np.int64)),
        ("trunc_i64_i8", "i8", "i64", lambda a: a.astype(np.int8)),
        ("fptrunc_f32_bf16", "bfloat", "float", None),
        ("fpext_bf16_f32", "float", "bfloat", None),
    ]
    for name, to, frm, ref1 in casts:
        expr = f"  %r = {name.split('_')[0]} {frm} %x to {to}"
        in_range = name.startswith("fpto")

        def inputs_cast(rng: np.random.Generator, n: int, ty: str, name: str = name, frm: str = frm) -> np.ndarray:
            if name.startswith("fpto"):  # out-of-range conversions are poison in LLVM: stay inside the target range
                lim = {"i32": 2e9, "u32": 4e9, "i64": 9e18, "i16": 3e4}[name.split("_")[-1]]
                lo = 0 if name.startswith("fptoui") else -lim
                return rng.uniform(lo, lim, n).astype(NP[frm])
            return special_floats(rng, n, ty)

        def cast_ref(a: np.ndarray, b: np.ndarray, f: Callable[[np.ndarray], np.ndarray] | None = ref1) -> np.ndarray:
            assert f is not None
            with np.errstate(all="ignore"):  # the special values overflow casts on purpose, as on the GPU
                return f(a)

        out.append(
            Case(
                name,
                _elementwise(name, to, frm, frm, expr),
                to,
                frm,
                frm,
                _bf16_ref(name) if ref1 is None else cast_ref,
                inputs=inputs_cast if in_range else None,
                tags=("cast",),
            )
        )
        del in_range
    # half precision
    h = "half"
    for op, ref_ in (("fadd", np.add), ("fmul", np.multiply), ("fsub", np.subtract), ("fdiv", np.divide)):
        for suffix in ("", "_true16"):
            ir = _elementwise(f"{op}_f16{suffix}", h, h, h, f"  %r = {op} half %x, %y")
            out.append(
                Case(f"{op}_f16{suffix}", ir, h, h, h, _wrap(ref_, np.float16), true16=bool(suffix), tags=("f16",))
            )
    decl = "declare half @llvm.fma.f16(half, half, half)"
    ir = _elementwise("fma_f16", h, h, h, "  %r = call half @llvm.fma.f16(half %x, half %y, half %y)", decl)
    out.append(Case("fma_f16", ir, h, h, h, _f64ref(lambda a, b: a * b + b, np.float16), tags=("f16",)))
    for fn, ulp in (("exp2", 1), ("sqrt", 0), ("log2", 1)):
        decl = f"declare half @llvm.{fn}.f16(half)"
        ir = _elementwise(f"{fn}_f16", h, h, h, f"  %r = call half @llvm.{fn}.f16(half %x)", decl)
        ref_fn = getattr(np, fn)
        out.append(Case(f"{fn}_f16", ir, h, h, h, _f64ref(lambda a, b, f=ref_fn: f(a), np.float16), ulp))
    # bf16 arithmetic (LLVM widens to f32 and rounds back with integer ops on gfx1100)
    bf = "bfloat"
    ir = _elementwise("fadd_bf16", bf, bf, bf, "  %r = fadd bfloat %x, %y")
    out.append(Case("fadd_bf16", ir, bf, bf, bf, _bf16_binary(np.add), tags=("bf16",)))
    ir = _elementwise("fmul_bf16", bf, bf, bf, "  %r = fmul bfloat %x, %y")
    out.append(Case("fmul_bf16", ir, bf, bf, bf, _bf16_binary(np.multiply), tags=("bf16",)))
    out += _control_flow_cases()
    return out


def _revolutions(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """f(2*pi*t) for t = float32(x * float32(1/(2*pi))), with the whole turns of t removed exactly."""

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            t = (a.astype(np.float32) * np.float32(1 / (2 * np.pi))).astype(np.float64)
            r = f(2 * np.pi * (t - np.rint(t)))
            r = np.where(np.isfinite(t), r, np.nan)
            return np.where(t == 0, t if f is np.sin else 1.0, r).astype(np.float32)

    return run


def _fma64_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a*b + a for float64, exactly rounded (Python's exact rationals; numpy has no fused multiply-add)."""
    from fractions import Fraction

    out = np.empty(len(a))
    for k, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        if not (np.isfinite(x) and np.isfinite(y)) or x == 0 or y == 0:
            with np.errstate(all="ignore"):
                out[k] = np.float64(x) * np.float64(y) + np.float64(x)
            continue
        v = Fraction(x) * Fraction(y) + Fraction(x)
        try:
            out[k] = float(v)
        except OverflowError:
            out[k] = np.inf if v > 0 else -np.inf
    return out


def _bf16_round(f: np.ndarray) -> np.ndarray:
    bits = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def _bf16_to_f32(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


def _bf16_ref(name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    if name == "fptrunc_f32_bf16":
        return lambda a, b: _bf16_round(a)
    return lambda a, b: _bf16_to_f32(a)


def _bf16_binary(f: Callable[..., np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _bf16_round(f(_bf16_to_f32(a), _bf16_to_f32(b)))

    return run


def _lds_prologue(block: int, sym: str) -> str:
    """Entry block: i = workgroup * block + thread; a[i] stored to LDS array `sym` at the thread's slot (%ls)."""
    return f"""
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, {block}
  %i = add i32 %base, %tid
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %ls = getelementptr [{block} x float], ptr addrspace(3) {sym}, i32 0, i32 %tid
  store float %x, ptr addrspace(3) %ls"""


def _control_flow_cases() -> list[Case]:
    out = []
    # a loop with a per-lane trip count: out[i] = sum_{k < b[i] % 16} a[i] * k
    body = f"""{PROLOGUE}
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %pb = getelementptr i32, ptr addrspace(1) %b, i32 %i
  %y = load i32, ptr addrspace(1) %pb
  %cnt = and i32 %y, 15
  br label %loop
loop:
  %k = phi i32 [0, %body], [%k1, %loop]
  %acc = phi float [0.0, %body], [%acc1, %loop]
  %kf = sitofp i32 %k to float
  %t = fmul float %x, %kf
  %acc1 = fadd float %acc, %t
  %k1 = add i32 %k, 1
  %c = icmp ult i32 %k1, %cnt
  br i1 %c, label %loop, label %exit
exit:
  %r = phi float [%acc1, %loop]
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %po
{EPILOGUE}"""

    def loop_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        res = np.zeros(len(a), np.float32)
        for j in range(len(a)):
            acc = np.float32(0)
            for k in range(max(1, int(b[j]) & 15)):
                acc = np.float32(acc + np.float32(a[j] * np.float32(k)))
            res[j] = acc
        return res

    ints = lambda rng, n, ty: (
        rng.integers(0, 1 << 20, n).astype(np.int32) if ty == "i32" else (rng.standard_normal(n).astype(np.float32))
    )
    out.append(
        Case(
            "loop_divergent",
            kernel("loop_divergent", ARGS, body),
            "float",
            "float",
            "i32",
            loop_ref,
            inputs=ints,
            tags=("control",),
        )
    )
    # LDS: a 128-thread workgroup (four waves) reverses its block through LDS with a barrier in between
    body = (
        _lds_prologue(128, "@lds")
        + """
  call void @llvm.amdgcn.s.barrier()
  %rt = sub i32 127, %tid
  %lr = getelementptr [128 x float], ptr addrspace(3) @lds, i32 0, i32 %rt
  %y = load float, ptr addrspace(3) %lr
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %y, ptr addrspace(1) %po
  ret void"""
    )
    decl = "@lds = internal addrspace(3) global [128 x float] undef, align 4"
    out.append(
        Case(
            "lds_reverse",
            kernel("lds_reverse", ARGS, body, decl),
            "float",
            "float",
            "float",
            lambda a, b: a.reshape(-1, 128)[:, ::-1].reshape(-1),
            n=512,
            block=128,
            tags=("lds",),
        )
    )
    # LDS tree reduction over 256 threads (eight waves) with barriers in a loop
    body = (
        _lds_prologue(256, "@red")
        + """
  br label %loop
loop:
  %s = phi i32 [128, %entry], [%s1, %next]
  call void @llvm.amdgcn.s.barrier()
  %act = icmp ult i32 %tid, %s
  br i1 %act, label %add, label %next
add:
  %j = add i32 %tid, %s
  %lj = getelementptr [256 x float], ptr addrspace(3) @red, i32 0, i32 %j
  %v1 = load float, ptr addrspace(3) %lj
  %v0 = load float, ptr addrspace(3) %ls
  %v = fadd float %v0, %v1
  store float %v, ptr addrspace(3) %ls
  br label %next
next:
  %s1 = lshr i32 %s, 1
  %more = icmp ne i32 %s1, 0
  br i1 %more, label %loop, label %fin
fin:
  call void @llvm.amdgcn.s.barrier()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %wr, label %end
wr:
  %l0 = load float, ptr addrspace(3) getelementptr ([256 x float], ptr addrspace(3) @red, i32 0, i32 0)
  %po = getelementptr float, ptr addrspace(1) %out, i32 %wg
  store float %l0, ptr addrspace(1) %po
  br label %end
end:
  ret void"""
    )
    decl = "@red = internal addrspace(3) global [256 x float] undef, align 4"

    def tree(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        v = a.reshape(-1, 256).copy()
        s = 128
        while s:
            v[:, :s] = v[:, :s] + v[:, s : 2 * s]
            s //= 2
        res = np.zeros(len(a), np.float32)
        res[: len(v)] = v[:, 0]
        return res

    out.append(
        Case(
            "lds_tree_sum",
            kernel("lds_tree_sum", ARGS, body, decl),
            "float",
            "float",
            "float",
            tree,
            n=1024,
            block=256,
            inputs=lambda rng, n, ty: rng.standard_normal(n).astype(np.float32),
            tags=("lds",),
        )
    )
    # scratch: a private array indexed by data
    body = f"""{PROLOGUE}
  %arr = alloca [32 x i32], align 4, addrspace(5)
  br label %fill
fill:
  %k = phi i32 [0, %body], [%k1, %fill]
  %pk = getelementptr [32 x i32], ptr addrspace(5) %arr, i32 0, i32 %k
  %v = mul i32 %k, %i
  store volatile i32 %v, ptr addrspace(5) %pk
  %k1 = add i32 %k, 1
  %c = icmp ult i32 %k1, 32
  br i1 %c, label %fill, label %read
read:
  %pb = getelementptr i32, ptr addrspace(1) %b, i32 %i
  %y = load i32, ptr addrspace(1) %pb
  %idx = and i32 %y, 31
  %pr = getelementptr [32 x i32], ptr addrspace(5) %arr, i32 0, i32 %idx
  %r = load volatile i32, ptr addrspace(5) %pr
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %r, ptr addrspace(1) %po
{EPILOGUE}"""
    out.append(
        Case(
            "scratch_array",
            kernel("scratch_array", ARGS, body),
            "i32",
            "i32",
            "i32",
            lambda a, b: ((b & 31) * np.arange(len(b))).astype(np.int32),
            tags=("scratch",),
        )
    )
    # divergent if/else with a load only on one side (a gated load)
    expr_body = f"""{PROLOGUE}
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %i
  %y = load float, ptr addrspace(1) %pb
  %c = fcmp ogt float %y, 0.0
  br i1 %c, label %then, label %else
then:
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %t = fmul float %x, %y
  br label %join
else:
  %e = fsub float 0.0, %y
  br label %join
join:
  %r = phi float [%t, %then], [%e, %else]
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %po
{EPILOGUE}"""
    out.append(
        Case(
            "if_else_gated",
            kernel("if_else_gated", ARGS, expr_body),
            "float",
            "float",
            "float",
            _wrap(lambda a, b: np.where(b > 0, a * b, np.float32(0) - b), np.float32),
            tags=("control",),
        )
    )
    return out
