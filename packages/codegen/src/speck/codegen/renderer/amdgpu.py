"""AMDGPURenderer: a GPU program (KERNEL_CONTRACT.md section 2, with the launch grid's SPECIAL ids of
speck.codegen.lower.gpudims) -> textual LLVM IR for `amdgcn-amd-amdhsa` (RDNA3: gfx1100 and its siblings, wave32).

Everything a value is computed with (literals, casts, the ALU op table, gated loads, loops, accumulators) is the LLVM
renderer's (speck.codegen.renderer.llvmir), so both targets share one definition of every op's exact semantics.
What differs is the kernel ABI:
- `define amdgpu_kernel void @name(ptr addrspace(1) noalias %data0, ..., i32 %var.n)`: buffers are global memory
  (address space 1) and, like the variables, arrive in the kernarg segment (LLVM lays them out at their natural
  alignment; the code object's metadata lists each one's offset and size);
- SPECIAL `gidx<d>`/`lidx<d>` are `llvm.amdgcn.workgroup.id.{x,y,z}` / `llvm.amdgcn.workitem.id.{x,y,z}`; the
  workgroup size is known when the kernel is compiled, so the function carries `reqd_work_group_size` and
  `amdgpu-flat-work-group-size` (LLVM then knows the work-item ids' ranges), and `amdgpu-no-*` for every id and
  implicit argument it does not read (fewer SGPRs initialised at dispatch, no hidden kernel arguments);
- DEFINE_LOCAL is a module-level array in LDS (address space 3), one per workgroup;
- BARRIER is `s_barrier` between a workgroup-scope release fence and an acquire fence, which is what LLVM's AMDGPU
  memory model needs to order LDS (and global) accesses across the barrier;
- accumulators (DEFINE_REG) are allocas in the private address space (5), which SROA promotes to VGPRs.
Transcendentals: EXP2/LOG2/SIN use speck's polynomial decompositions (speck.codegen.lower.transcendental), as on the
CPU, not v_exp_f32/v_log_f32/v_sin_f32: those are approximations (about 1 ULP, and v_sin_f32 takes its argument in
revolutions with reduced accuracy away from 0), and the decompositions give the same bits on every target. SQRT,
FDIV and RECIPROCAL are `llvm.sqrt`/`fdiv`, which LLVM lowers for AMDGPU to correctly rounded sequences (no fast-math
flags, no `!fpmath`), so they match the interpreter bit for bit. float16 arithmetic is native (v_add_f16, ...)
except division and square root, computed in float32 and rounded once (exact, as 24 >= 2*11 + 2 bits); bfloat16
has no arithmetic on RDNA3 and is computed in float32 like fp8; float64 and int64 are native (slow on RDNA3, but
exact). Without `fp_contract` no op is fused: every float op rounds once, as in the interpreter."""

from __future__ import annotations

from typing import ClassVar

from speck.codegen.compiler.amdgpu import ARCHS
from speck.codegen.errors import CodegenValueError, ProgramFormError
from speck.codegen.renderer.llvmir import LLVMRenderer, _LLKernel, ltype
from speck.uop import AddrSpace, DType, Ops, PtrDType, UOp, dtypes

CODE_OBJECT_VERSION = 5  # HSA code object v5 (readable by LLVM 16's tools and ROCm's loader)

_WORKGROUP_ID = {"gidx0": "workgroup.id.x", "gidx1": "workgroup.id.y", "gidx2": "workgroup.id.z"}
_WORKITEM_ID = {"lidx0": "workitem.id.x", "lidx1": "workitem.id.y", "lidx2": "workitem.id.z"}
_IDS = {**_WORKGROUP_ID, **_WORKITEM_ID}
# `amdgpu-no-*` attributes that always hold for speck kernels: no implicit (hidden) arguments, no dispatch packet,
# queue or dispatch id, no LDS kernel id (LDS is addressed directly), no hostcall/heap; ids not read are added
_ALWAYS_NO = ("amdgpu-no-implicitarg-ptr", "amdgpu-no-dispatch-ptr", "amdgpu-no-queue-ptr", "amdgpu-no-dispatch-id",
              "amdgpu-no-lds-kernel-id", "amdgpu-no-hostcall-ptr", "amdgpu-no-heap-ptr",
              "amdgpu-no-multigrid-sync-arg", "amdgpu-no-default-queue", "amdgpu-no-completion-action")  # fmt: skip
# the pointer type of each address space a program's buffers live in
_ADDRSPACE = {
    AddrSpace.GLOBAL: "ptr addrspace(1)",
    AddrSpace.LOCAL: "ptr addrspace(3)",
    AddrSpace.REG: "ptr addrspace(5)",
}
# float16 ops computed in float32 and rounded (LLVM's f16 division/sqrt are not documented as correctly rounded)
_HALF_VIA_FLOAT = frozenset({Ops.FDIV, Ops.RECIPROCAL, Ops.SQRT})


class AMDGPURenderer(LLVMRenderer):
    """LLVM IR for an RDNA3 GPU (see the module docstring). Declarations the pipeline and optimizer read: local
    memory (LDS, 64 KiB per workgroup) and workgroups of up to 1024 work-items, no CPU thread slicing, vectors up to
    16 bytes (one 128-bit global load), native float16, wave size 32, a budget of VGPRs per work-item for upcasts."""

    name: ClassVar[str] = "amdgpu"
    device: ClassVar[str] = "AMD"
    has_local: ClassVar[bool] = True
    has_shared: ClassVar[bool] = True
    has_threads: ClassVar[bool] = False
    index_int64: ClassVar[bool] = False  # 64-bit integer math is two VALU ops on RDNA3: index math stays int32
    registers_are_cpu: ClassVar[bool] = False  # its vectors are a work-item's VGPRs: no CPU register blocking
    supports_float16: ClassVar[bool] = True
    supports_bfloat16: ClassVar[bool] = False  # RDNA3 has bf16 only in WMMA/dot instructions
    # workgroups: at most 1024 work-items in all; grid: workgroup ids are 32-bit, y and z kept to 16 bits
    local_max: ClassVar[tuple[int, ...] | None] = (1024, 1024, 1024)
    max_workgroup_size: ClassVar[int] = 1024
    global_max: ClassVar[tuple[int, ...] | None] = (2**31 - 1, 65535, 65535)
    shared_max: ClassVar[int] = 65536
    wave_size: ClassVar[int] = 32
    # VGPRs a work-item's upcast values should stay within (of 256): 128 keeps 12 waves resident per SIMD
    vgpr_budget: ClassVar[int] = 128

    def __init__(self, arch: str = "gfx1100", fp_contract: bool = False) -> None:
        if arch not in ARCHS:
            raise CodegenValueError(f"AMDGPURenderer arch must be one of {', '.join(ARCHS)}, got {arch!r}")
        self.arch = arch
        self.max_vector_bytes = 16  # type: ignore[misc]
        self.vector_registers = self.vgpr_budget  # type: ignore[misc]
        self.fp_contract = fp_contract

    @property
    def odd_vector_widths(self) -> bool:
        return False  # 3-lane loads exist (b96) but 5-7 lanes split into pieces: keep powers of two

    def supports(self, op: Ops, dtype: DType) -> bool:
        if op in _HALF_VIA_FLOAT and dtype.scalar() == dtypes.float16:
            return False
        return super().supports(op, dtype)

    def render(self, uops: list[UOp]) -> str:
        return _AMDKernel(self, uops).render()


def _buffer(u: UOp) -> UOp:
    while u.op is Ops.AFTER:
        u = u.src[0]
    return u


class _AMDKernel(_LLKernel):
    """One program rendered for the amdgpu_kernel ABI."""

    alloca_space = ", addrspace(5)"
    r: AMDGPURenderer

    def __init__(self, r: AMDGPURenderer, uops: list[UOp]) -> None:
        super().__init__(r, uops)
        self.lds: list[str] = []
        self.ids_used: set[str] = set()
        self.local_size = [1, 1, 1]

    def ptr_type(self, buf: UOp) -> str:
        dt = _buffer(buf).dtype
        assert isinstance(dt, PtrDType)
        return _ADDRSPACE[dt.addrspace]

    def signature(self) -> list[str]:
        params = self.buffer_params("ptr addrspace(1)") + [f"i32 {nm}" for nm in self.variable_names()]
        for u in self.uops:  # the workgroup size is fixed at compile time: LLVM may rely on it
            if u.op is Ops.SPECIAL and u.arg in _WORKITEM_ID:
                ok, n = self.cconst(u.src[0])
                if not ok:
                    raise ProgramFormError(f"renderer 'amdgpu': work-item id {u.arg} has a size that is not a constant")
                self.local_size[int(u.arg[-1])] = int(n)
        define = f"define amdgpu_kernel void @{self.sig.name}({', '.join(params)}) #0 !reqd_work_group_size !0 {{"
        return [*self.kernel_comment(), define]

    def module_tail(self) -> list[str]:
        no = [*_ALWAYS_NO, *(f"amdgpu-no-{_IDS[i].replace('.', '-')}" for i in sorted(_IDS) if i not in self.ids_used)]
        attrs = " ".join(f'"{a}"' for a in no)
        size = self.local_size[0] * self.local_size[1] * self.local_size[2]
        return [
            *self.lds,
            *self.helpers.values(),
            *self.intrinsics.values(),
            f'attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,{size}" "uniform-work-group-size"="true" '
            f"{attrs} }}",
            f"!0 = !{{i32 {self.local_size[0]}, i32 {self.local_size[1]}, i32 {self.local_size[2]}}}",
            "!llvm.module.flags = !{!1}",
            f'!1 = !{{i32 1, !"amdhsa_code_object_version", i32 {CODE_OBJECT_VERSION}00}}',
        ]

    def render_uop(self, u: UOp) -> None:
        op = u.op
        if op is Ops.SPECIAL:
            if u.arg not in _IDS:
                raise ProgramFormError(f"renderer 'amdgpu': SPECIAL {u.arg!r} is not a workgroup id (gidx0-2) or a "
                                       "work-item id (lidx0-2)")  # fmt: skip
            fn = f"@llvm.amdgcn.{_IDS[u.arg]}"
            self.intrinsics[fn] = f"declare i32 {fn}()"
            self.ids_used.add(u.arg)
            v = self.ins(f"call i32 {fn}()", u.arg)
            self.names[u] = v if u.dtype == dtypes.int32 else self.cast(v, dtypes.int32, u.dtype)
        elif op is Ops.DEFINE_LOCAL:
            assert isinstance(u.dtype, PtrDType)
            nm = self.names[u] = f"@__speck_lds{len(self.lds)}"
            base = u.dtype.base
            self.lds.append(f"{nm} = internal addrspace(3) global [{max(1, u.dtype.size)} x {ltype(base, mem=True)}] "
                            f"poison, align 16")  # fmt: skip
        elif op is Ops.BARRIER:
            self.intrinsics["@llvm.amdgcn.s.barrier"] = "declare void @llvm.amdgcn.s.barrier()"
            self.emit('fence syncscope("workgroup") release')
            self.emit("call void @llvm.amdgcn.s.barrier()")
            self.emit('fence syncscope("workgroup") acquire')
        else:
            super().render_uop(u)


__all__ = ["ARCHS", "CODE_OBJECT_VERSION", "AMDGPURenderer"]
