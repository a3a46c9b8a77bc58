"""Hand-written kernels following CPU_ABI.md, as LLVM IR text and as C, used by the runtime tests until codegen
produces kernels itself. Every kernel loops its outermost index over [core_start, core_end)."""

from __future__ import annotations


def _row_loop(name: str, params: str, body: str) -> str:
    # a loop over rows i in [s, e) with `body` using %i (i64); params come before (i32 %s, i32 %e)
    return f"""
define void @{name}({params}i32 %s, i32 %e) {{
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i32 = phi i32 [%s, %entry], [%n, %loop]
  %i = sext i32 %i32 to i64
{body}
  %n = add i32 %i32, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}
"""


# out[i] = a[i] + b[i]
ADD_IR = _row_loop(
    "add",
    "ptr noalias %o, ptr noalias %a, ptr noalias %b, ",
    """  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %va = load float, ptr %pa
  %vb = load float, ptr %pb
  %r = fadd float %va, %vb
  %q = getelementptr float, ptr %o, i64 %i
  store float %r, ptr %q""",
)

# out[i] = a[i] * k + i   (k: an int32 variable): shows var passing and the global index
SCALE_IR = _row_loop(
    "scale",
    "ptr noalias %o, ptr noalias %a, i32 %k, ",
    """  %pa = getelementptr float, ptr %a, i64 %i
  %va = load float, ptr %pa
  %kf = sitofp i32 %k to float
  %fi = sitofp i32 %i32 to float
  %m = fmul float %va, %kf
  %r = fadd float %m, %fi
  %q = getelementptr float, ptr %o, i64 %i
  store float %r, ptr %q""",
)

# out[row] = sum(inp[row*cols : (row+1)*cols]) in order (an inner loop: a reduction per row)
ROWSUM_IR = """
define void @rowsum(ptr noalias %o, ptr noalias %a, i32 %cols, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %rows, label %exit
rows:
  %r = phi i32 [%s, %entry], [%rn, %rowend]
  %base = mul i32 %r, %cols
  %has = icmp sgt i32 %cols, 0
  br i1 %has, label %inner, label %rowend
inner:
  %j = phi i32 [0, %rows], [%jn, %inner]
  %acc = phi float [0.0, %rows], [%acc2, %inner]
  %idx = add i32 %base, %j
  %idx64 = sext i32 %idx to i64
  %p = getelementptr float, ptr %a, i64 %idx64
  %v = load float, ptr %p
  %acc2 = fadd float %acc, %v
  %jn = add i32 %j, 1
  %cj = icmp slt i32 %jn, %cols
  br i1 %cj, label %inner, label %rowend
rowend:
  %res = phi float [0.0, %rows], [%acc2, %inner]
  %r64 = sext i32 %r to i64
  %q = getelementptr float, ptr %o, i64 %r64
  store float %res, ptr %q
  %rn = add i32 %r, 1
  %c = icmp slt i32 %rn, %e
  br i1 %c, label %rows, label %exit
exit:
  ret void
}
"""

# out[i] = powf(a[i], b[i]) through libm, and a constant table lookup (rodata)
POW_IR = (
    "declare float @powf(float, float)\n"
    "@tab = internal constant [4 x float] [float 1.0, float 2.0, float 0.5, float 3.0]\n"
    + _row_loop(
        "powk",
        "ptr noalias %o, ptr noalias %a, ",
        """  %pa = getelementptr float, ptr %a, i64 %i
  %va = load float, ptr %pa
  %m = and i64 %i, 3
  %tp = getelementptr [4 x float], ptr @tab, i64 0, i64 %m
  %t = load float, ptr %tp
  %r = call float @powf(float %va, float %t)
  %q = getelementptr float, ptr %o, i64 %i
  store float %r, ptr %q""",
    )
)

EMPTY_IR = """
define void @empty(i32 %s, i32 %e) {
  ret void
}
"""

# out[i] = a[i] + b[i] in C (for ClangCompiler / gcc)
ADD_C = """
void add(float *restrict o, const float *restrict a, const float *restrict b, int core_start, int core_end) {
  for (int i = core_start; i < core_end; i++) o[i] = a[i] + b[i];
}
"""
