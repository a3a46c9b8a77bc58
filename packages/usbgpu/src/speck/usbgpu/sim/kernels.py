"""Sample gfx1100 kernels in LLVM IR (amdgcn-amd-amdhsa) for simulator sessions: the smoke tests, fault tests and
benchmarks of the GPU model compile them (llvmlite, e.g. speck.codegen's AMDGPUCompiler) and load them with
speck.usbgpu.sim.loader.load_kernel."""

# out[i] = in[i] * a + b for i < n, 64 threads per workgroup: (ptr out, ptr in, float a, float b, i32 n)
AXPB = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
define amdgpu_kernel void @axpb(ptr addrspace(1) %out, ptr addrspace(1) %in, float %a, float %b, i32 %n) {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 64
  %i = add i32 %base, %tid
  %ok = icmp ult i32 %i, %n
  br i1 %ok, label %body, label %done
body:
  %pi = getelementptr float, ptr addrspace(1) %in, i32 %i
  %v = load float, ptr addrspace(1) %pi
  %m = fmul float %v, %a
  %r = fadd float %m, %b
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %po
  br label %done
done:
  ret void
}
"""


# a gfx1100 kernel that spins until *flag == 12345 (nobody writes it): a dispatch that never ends
SPIN = """
define amdgpu_kernel void @spin(ptr addrspace(1) %flag) {
entry:
  br label %loop
loop:
  %v = load volatile i32, ptr addrspace(1) %flag
  %z = icmp eq i32 %v, 12345
  br i1 %z, label %done, label %loop
done:
  ret void
}
"""

# reads in[tid + off] (a 64-bit element offset): an offset past the allocation is a page fault
OOB = """
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @oob(ptr addrspace(1) %out, ptr addrspace(1) %in, i64 %off) {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %t = zext i32 %tid to i64
  %i = add i64 %t, %off
  %pi = getelementptr float, ptr addrspace(1) %in, i64 %i
  %v = load float, ptr addrspace(1) %pi
  %po = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %v, ptr addrspace(1) %po
  ret void
}
"""
