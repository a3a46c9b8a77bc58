"""The AMD backend (speck.codegen.renderer.amdgpu, compiler.amdgpu, compiler.code_object): GPU lowering, LLVM IR for
amdgcn-amd-amdhsa, HSA code objects.

- every kernel of the corpus (tests/codegen/codegen_amd.py) lowers to a GPU program (workgroup/work-item ids) that
  the interpreter runs to the same bits as the kernel lowered for the CPU, and compiles to a code object;
- the code objects are checked with LLVM 16's own tools: llvm-objdump disassembles them, ld.lld links the same
  relocatable object into a shared object whose loaded bytes (headers, note, symbols, hash tables, descriptor, code)
  equal speck's, and llvm-readelf reads the metadata note, which says what msgpack decodes from it;
- the optimizer's workgroup opts, grid folding, the interpreter's lockstep limits and the writer's errors."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen_amd import (
    CORPUS,
    CORPUS_IDS,
    amd_compiler,
    corpus_spec,
    damaged,
    elementwise,
    four_axes,
    full_sum,
    matmul,
    metadata_note,
    reduce,
    symbolic,
    tool,
    values,
)
from codegen_helpers import assert_same, out_dtype, run_ast, run_prog
from speck.codegen.backends import get_backend
from speck.codegen.compiler.amdgpu import AMDGPUCompiler
from speck.codegen.compiler.code_object import link_code_object
from speck.codegen.errors import CodeObjectLinkError, OptError
from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt, OptOps, apply_opts, opt_base
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.program import to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, Context, Ops, UOp, dtypes

IDS = CORPUS_IDS
EF_AMDGPU_MACH = {"gfx1100": 0x41, "gfx1101": 0x46, "gfx1102": 0x47, "gfx1150": 0x43}


_compiler, _spec = amd_compiler, corpus_spec


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed: {proc.stderr}"
    assert "warning" not in proc.stderr.lower(), proc.stderr
    return proc.stdout


def _file(data: bytes) -> Any:
    f = tempfile.NamedTemporaryFile(suffix=".hsaco")
    f.write(data)
    f.flush()
    return f


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=IDS)
def test_gpu_program_computes_what_the_cpu_program_does(i: int) -> None:
    ast, bufs, var_vals = CORPUS[i]
    spec = _spec(i)
    assert not any(u.op is Ops.RANGE and u.arg[-1] is AxisType.GLOBAL for u in spec.uops)
    got = run_prog(spec, bufs, var_vals)
    # the same bits as the kernel lowered for the CPU without opts (same decompositions, same summation order),
    # unless the GPU's opts split a reduction across work-items (which sums in another order)
    cpu = full_rewrite_to_sink(ast, LLVMRenderer(fp_contract=False), optimize=False)
    reordered = any(o.op in (OptOps.GROUP, OptOps.GROUPTOP, OptOps.UNROLL) for o in spec.applied_opts)
    assert_same(run_prog(cpu, bufs, var_vals), got, out_dtype(ast), exact=not reordered)
    # and the kernel's own meaning (the transcendentals' decompositions are within their documented error)
    transcendental = any(u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) for u in ast.toposort())
    assert_same(run_ast(ast, bufs, var_vals), got, out_dtype(ast), exact=not transcendental and not reordered)


def test_launch_sizes_cover_the_output_exactly() -> None:
    spec = to_program(matmul(32, 48, 20), AMDGPURenderer())
    assert spec.local_size is not None
    grid = [g * l for g, l in zip(spec.launch_dims(), spec.local_size)]
    assert sorted(grid, reverse=True)[:2] == [48, 32] and np.prod(spec.local_size) <= 1024
    # x is the axis the store is contiguous along: neighbouring work-items write neighbouring elements
    assert grid[0] == 48


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=IDS)
def test_llvm_objdump_disassembles_every_code_object(i: int) -> None:
    spec = _spec(i)
    assert spec.lib is not None
    with _file(spec.lib) as f:
        out = _run([tool("objdump"), "--mcpu=gfx1100", "-d", f.name])
    assert f"<{spec.name}>:" in out and "s_endpgm" in out
    assert "<unknown>" not in out and "invalid" not in out.lower()


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=IDS)
def test_lld_links_the_same_shared_object(i: int) -> None:
    """ld.lld-16 -shared on the relocatable object LLVM emitted: every loaded byte (ELF and program headers, note,
    dynamic symbols, hash tables, descriptor, code, dynamic section) is the same as speck's writer's."""
    spec = _spec(i)
    assert spec.lib is not None
    rel = _compiler().relocatable(spec.src)
    assert link_code_object(rel, spec.name) == spec.lib
    with _file(rel) as r, tempfile.NamedTemporaryFile(suffix=".so") as so:
        _run([tool("lld"), "-shared", r.name, "-o", so.name])
        with open(so.name, "rb") as linked:  # lld replaces the file: read it by name
            theirs = linked.read()
        ours = spec.lib
        loaded_end = _loaded_end(ours)
        assert loaded_end == _loaded_end(theirs)
        # the header differs only where the section header table is (lld writes more non-loaded sections)
        skip = set(range(40, 48)) | set(range(60, 64))
        assert [b for k, b in enumerate(ours[:64]) if k not in skip] == [b for k, b in enumerate(theirs[:64])
                                                                        if k not in skip]  # fmt: skip
        assert ours[64:loaded_end] == theirs[64:loaded_end]
        with _file(ours) as o:
            assert _run([tool("readelf"), "--dyn-syms", o.name]).replace(o.name, "X") == \
                _run([tool("readelf"), "--dyn-syms", so.name]).replace(so.name, "X")  # fmt: skip


def _loaded_end(elf: bytes) -> int:
    phoff, phnum = struct.unpack_from("<Q", elf, 32)[0], struct.unpack_from("<H", elf, 56)[0]
    ends = []
    for k in range(phnum):
        p_type, _, p_offset, _, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", elf, phoff + 56 * k)
        if p_type == 1:
            ends.append(p_offset + p_filesz)
    return max(ends)


@pytest.mark.parametrize("i", range(0, len(CORPUS), 4), ids=IDS[::4])
def test_llvm_readelf_reads_themetadata_note(i: int) -> None:
    spec = _spec(i)
    assert spec.lib is not None
    md = metadata_note(spec.lib)
    (kernel,) = md["amdhsa.kernels"]
    assert kernel[".name"] == spec.name and kernel[".symbol"] == f"{spec.name}.kd"
    assert kernel[".wavefront_size"] == 32 and md["amdhsa.target"] == "amdgcn-amd-amdhsa--gfx1100"
    assert kernel[".reqd_workgroup_size"] == list(spec.local_size or (1, 1, 1))
    with _file(spec.lib) as f:
        text = _run([tool("readelf"), "--notes", f.name])
    assert "NT_AMDGPU_METADATA" in text
    for key in (".kernarg_segment_size", ".vgpr_count", ".sgpr_count", ".group_segment_fixed_size"):
        assert re.search(rf"^\s*{re.escape(key)}:\s+{kernel[key]}$", text, re.M), (key, kernel[key], text)
    # every buffer and variable is an argument, in slot order, at the offset the metadata gives
    args = kernel[".args"]
    assert [a[".name"] for a in args] == [f"data{b.slot}" for b in spec.buffers] + \
        [f"var.{v.arg[0]}" for v in spec.vars]  # fmt: skip
    for a in args:
        assert re.search(rf"\.name:\s+{re.escape(a['.name'])}\n\s+\.offset:\s+{a['.offset']}\n", text)


@pytest.mark.parametrize("arch", sorted(EF_AMDGPU_MACH))
def test_each_arch_is_a_backend_with_its_own_e_flags(arch: str) -> None:
    be = get_backend("AMD" if arch == "gfx1100" else f"AMD_{arch.upper()}")
    spec = be.to_program(elementwise(dtypes.float32))
    assert spec.lib is not None and spec.local_size is not None
    assert struct.unpack_from("<I", spec.lib, 48)[0] & 0xFF == EF_AMDGPU_MACH[arch]
    assert spec.lib[7] == 64 and spec.lib[8] == 3  # ELFOSABI_AMDGPU_HSA, code object v5
    assert metadata_note(spec.lib)["amdhsa.target"] == f"amdgcn-amd-amdhsa--{arch}"
    with _file(spec.lib) as f:  # LLVM 16 predates gfx1150 (RDNA3.5): its wave32 code decodes as gfx1100's
        assert "s_endpgm" in _run([tool("objdump"), f"--mcpu={'gfx1100' if arch == 'gfx1150' else arch}", "-d", f.name])


def test_renderer_declares_what_the_optimizer_and_pipeline_read() -> None:
    r = get_backend("AMD").renderer
    assert (r.has_local, r.has_shared, r.has_threads, r.device) == (True, True, False, "AMD")
    assert not r.registers_are_cpu and not r.register_blocking  # the GPU heuristic, not the CPU's register blocks
    assert (r.shared_max, r.wave_size, r.max_workgroup_size, r.local_max) == (65536, 32, 1024, (1024, 1024, 1024))
    assert r.global_max is not None and r.global_max[0] == 2**31 - 1
    for dt in (dtypes.float32, dtypes.float16, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.bool):
        assert r.supports(Ops.ADD, dt) and r.supports(Ops.MUL, dt)
    # bfloat16 has no RDNA3 arithmetic (computed in float32); half division and sqrt go through float32
    assert not r.supports(Ops.ADD, dtypes.bfloat16) and not r.supports(Ops.FDIV, dtypes.float16)
    assert not r.supports(Ops.EXP2, dtypes.float32)  # the polynomial, not v_exp_f32


def test_ir_uses_the_kernel_abi() -> None:
    spec = to_program(matmul(), AMDGPURenderer())
    src = spec.src
    assert "define amdgpu_kernel void @matmul(ptr addrspace(1) noalias %data0" in src
    assert "@llvm.amdgcn.workgroup.id.x()" in src and "@llvm.amdgcn.workitem.id.y()" in src
    lx, ly, lz = spec.local_size or (0, 0, 0)
    assert f"!0 = !{{i32 {lx}, i32 {ly}, i32 {lz}}}" in src
    assert f'"amdgpu-flat-work-group-size"="1,{lx * ly * lz}"' in src and '"amdgpu-no-workitem-id-z"' in src
    assert "addrspace(5)" in src  # the accumulator: private memory, promoted to a VGPR


def test_more_output_axes_than_grid_dimensions_fold_into_one_id() -> None:
    ast = four_axes((3, 5, 4, 8))
    spec = to_program(ast, AMDGPURenderer(), optimize=False)
    names = sorted(u.arg for u in spec.uops if u.op is Ops.SPECIAL)
    assert names == ["gidx0", "gidx1", "gidx2"] and spec.global_size == (8, 4, 15)
    bufs = [np.zeros(480, np.float32), np.arange(480, dtype=np.float32)]
    np.testing.assert_array_equal(run_prog(spec, bufs, {}), run_ast(ast, bufs, {}))


class _SmallGrid(AMDGPURenderer):
    global_max = (2**31 - 1, 4, 4)


def test_a_dimension_over_its_limit_moves_into_x() -> None:
    ast = four_axes((2, 3, 5, 7))
    spec = to_program(ast, _SmallGrid(), optimize=False)
    assert spec.global_size == (7 * 5, 3, 2) or spec.global_size[0] % 7 == 0
    assert all(g <= m for g, m in zip(spec.launch_dims(), _SmallGrid.global_max))  # type: ignore[arg-type]
    bufs = [np.zeros(210, np.float32), np.arange(210, dtype=np.float32)]
    np.testing.assert_array_equal(run_prog(spec, bufs, {}), run_ast(ast, bufs, {}))


def test_workgroup_opts_need_local_memory_and_respect_the_limit() -> None:
    base = opt_base(elementwise(dtypes.float32, 2048))
    with pytest.raises(OptError, match="needs local memory"):
        apply_opts(base, [Opt(OptOps.LOCAL, 0, 32)], LLVMRenderer())
    with pytest.raises(OptError, match="2048 work-items; renderer 'amdgpu' allows 1024"):
        apply_opts(base, [Opt(OptOps.LOCAL, 0, 2048)], AMDGPURenderer())
    with pytest.raises(OptError, match="LOCAL splits a GLOBAL axis"):
        apply_opts(opt_base(reduce(Ops.ADD)), [Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 2)], AMDGPURenderer())


def test_explicit_opts_choose_the_workgroup() -> None:
    ast = elementwise(dtypes.float32, 256)
    ast = ast.replace(arg=KernelInfo("ew_opts", opts=(Opt(OptOps.LOCAL, 0, 16),)))
    spec = to_program(ast, AMDGPURenderer())
    assert spec.local_size == (16, 1, 1) and spec.global_size == (16, 1, 1)


def test_interpreter_refuses_what_it_cannot_run_in_lockstep() -> None:
    n = UOp.special(4, "lidx0", dtypes.int32)
    r = UOp.range(n + UOp.const(dtypes.int32, 1), 0, AxisType.LOOP, dtypes.int32)
    out = UOp.param(0, dtypes.int32.ptr(4))
    st_ = out.index(n).store(r).end(r)
    prog = [n.src[0], n, UOp.const(dtypes.int32, 1), r.src[0], r, out, out.index(n), st_.src[0], st_, UOp.sink(st_)]
    with pytest.raises(RuntimeError, match="differs between work-items"):
        run_program([u for u in prog], [np.zeros(4, np.int32)])
    bad = UOp.special(4, "core_id", dtypes.int32)
    with pytest.raises(RuntimeError, match="not a GPU id"):
        run_program([bad.src[0], bad, UOp.sink()], [])


def test_disassembly_is_llvms_listing() -> None:
    be = get_backend("AMD")
    spec = be.to_program(reduce(Ops.MAX))
    assert spec.lib is not None
    listing = be.compiler.disassemble(spec.lib)
    assert "s_endpgm" in listing and f".amdhsa_kernel {spec.name}" in listing and "global_load" in listing
    # an object this compiler did not produce is disassembled by llvm-objdump
    listing = AMDGPUCompiler().disassemble(spec.lib)
    assert "s_endpgm" in listing and f"<{spec.name}>:" in listing


def test_writer_refuses_objects_it_cannot_link() -> None:
    from speck.codegen.compiler.llvm import LLVMCompiler

    x86 = LLVMCompiler().compile_uncached("define void @f() {\n  ret void\n}\n")
    with pytest.raises(CodeObjectLinkError, match="expected an AMDGPU relocatable object"):
        link_code_object(x86, "f")
    rel = _compiler().relocatable(_spec(0).src)
    with pytest.raises(CodeObjectLinkError, match="not a little-endian ELF64 object"):
        link_code_object(rel[:40], "ew")
    # a kernel that stores a pointer to a global: an absolute relocation needs a dynamic linker
    src = """@g = addrspace(1) global i32 0
@p = addrspace(1) global ptr addrspace(1) @g
define amdgpu_kernel void @k(ptr addrspace(1) %o) {
  %v = load ptr addrspace(1), ptr addrspace(1) @p
  store ptr addrspace(1) %v, ptr addrspace(1) %o
  ret void
}
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""
    with pytest.raises(CodeObjectLinkError, match="writable|absolute"):
        _compiler().compile_uncached(src)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_writer_fails_cleanly_on_damaged_input(data: st.DataObject) -> None:
    try:
        link_code_object(damaged(data, _compiler().relocatable(_spec(0).src), 4), "ew")
    except CodeObjectLinkError as e:
        assert "AMDGPU object 'ew'" in str(e)


@pytest.mark.parametrize(
    "ast,opts",
    [
        (full_sum(1024), (Opt(OptOps.GROUP, 0, 64),)),
        (reduce(Ops.MAX, 24, 64), (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16))),
        (reduce(Ops.ADD, 32, 64), (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUPTOP, 0, 16))),
        (reduce(Ops.MUL, 8, 48, dtypes.int32), (Opt(OptOps.GROUP, 0, 16), Opt(OptOps.GROUP, 0, 3))),
        (matmul(32, 32, 64), (Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.GROUP, 0, 8), Opt(OptOps.UPCAST, 0, 2))),
    ],
    ids=["sum", "max_local", "upcast_grouptop", "int_two_groups", "matmul"],
)
def test_grouped_reductions_go_through_lds(ast: UOp, opts: tuple[Opt, ...]) -> None:
    ast = ast.replace(arg=KernelInfo(ast.arg.name, opts=opts))
    spec = to_program(ast, AMDGPURenderer(), _compiler())
    assert spec.applied_opts == opts and spec.local_size is not None
    lds = sum(u.dtype.size * u.dtype.base.itemsize for u in spec.uops if u.op is Ops.DEFINE_LOCAL)  # type: ignore[attr-defined]
    assert any(u.op is Ops.BARRIER for u in spec.uops) and lds > 0
    assert (
        "addrspace(3)" in spec.src and "@llvm.amdgcn.s.barrier()" in spec.src and 'syncscope("workgroup")' in spec.src
    )
    assert spec.lib is not None and metadata_note(spec.lib)["amdhsa.kernels"][0][".group_segment_fixed_size"] == lds
    rng = np.random.default_rng(1)
    params = sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg)
    bufs = [values(rng, p.dtype.base, p.dtype.size, positive=True) for p in params]  # type: ignore[attr-defined]
    exact = not dtypes.is_float(out_dtype(ast))
    assert_same(run_ast(ast, bufs, {}), run_prog(spec, bufs, {}), out_dtype(ast), exact=exact)


def test_heuristic_groups_long_reductions_of_few_outputs() -> None:
    spec = to_program(full_sum(4096), AMDGPURenderer())
    assert [o.op for o in spec.applied_opts] == [OptOps.GROUP] and spec.local_size == (64, 1, 1)
    spec = to_program(matmul(64, 64, 64), AMDGPURenderer())
    assert OptOps.UPCAST in [o.op for o in spec.applied_opts] and OptOps.GROUP not in [o.op for o in spec.applied_opts]


@pytest.mark.parametrize("n", [1, 31, 32, 50])
def test_symbolic_sizes_get_full_waves_with_the_tail_gated_off(n: int) -> None:
    ast = symbolic(50)
    spec = to_program(ast, AMDGPURenderer())
    assert spec.local_size == (32, 1, 1) and spec.launch_dims({"n": n}) == (-(-n // 32), 1, 1)
    bufs = [np.full(50, -1.0, np.float32), np.arange(50, dtype=np.float32)]
    got = run_prog(spec, bufs, {"n": n})
    np.testing.assert_array_equal(got, run_ast(ast, bufs, {"n": n}))
    assert (got[n:] == -1.0).all()  # work-items past the end store nothing


def test_compile_pool_workers_build_the_same_code_objects() -> None:
    from speck.codegen.compiler.pool import CompilePool

    spec = to_program(matmul(), AMDGPURenderer())
    compiler = AMDGPUCompiler("gfx1101")
    recipe = compiler.worker_recipe()
    assert recipe.build().flags == compiler.flags
    pool = CompilePool(lanes=1)
    try:
        with Context(CACHELEVEL=0):  # a real compile, in the lane's worker process
            lib = pool.submit(compiler, spec.src).result()
        assert pool.workers()
    finally:
        pool.shutdown()
    assert lib == compiler.compile_uncached(spec.src)
    assert "s_endpgm" in compiler.disassemble(lib)  # not compiled here: llvm-objdump lists it


def test_beam_search_tries_workgroups_and_grouped_reductions_on_a_gpu() -> None:
    from speck.codegen.opt.search import beam_search, candidate_actions

    r = AMDGPURenderer()
    acts = candidate_actions(opt_base(reduce(Ops.ADD, 32, 64)), r)
    assert Opt(OptOps.LOCAL, 0, 32) in acts and Opt(OptOps.GROUP, 0, 16) in acts and Opt(OptOps.GROUPTOP, 0, 8) in acts
    assert not any(a.op is OptOps.THREAD for a in acts)
    assert not any(a.op in (OptOps.LOCAL, OptOps.GROUP) for a in candidate_actions(opt_base(reduce(Ops.ADD))))

    def timer(cand: UOp) -> float:  # a "device" where bigger workgroups are faster
        return 1.0 / float(np.prod(to_program(cand, r).local_size or (1,)))

    ast = elementwise(dtypes.float32, 1024)
    opts = beam_search(ast, r, 2, timer, use_cache=False)
    spec = to_program(ast.replace(arg=KernelInfo("ew_beam", opts=opts)), r)
    assert np.prod(spec.local_size or (1,)) > 128  # better than the heuristic's 128 by this timer


def test_a_code_object_cached_by_other_compiler_code_is_not_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The cache key holds a digest of the compiler's own sources (parse, optimize, emit, link): an object another
    version of that code stored under the same IR (an upgrade, a changed pass pipeline) is compiled afresh."""
    import speck.codegen.compiler.amdgpu as amdgpu

    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    src = _spec(0).src
    monkeypatch.setattr(amdgpu, "_DIGEST", ["older-compiler"])
    old = AMDGPUCompiler()
    old.disk_cache().put(old.cache_key(src), b"stale object written by other compiler code")
    assert old.compile(src) == b"stale object written by other compiler code"  # (the same code reuses its entry)
    monkeypatch.setattr(amdgpu, "_DIGEST", [])
    new = AMDGPUCompiler()
    assert new.cache_key(src) != old.cache_key(src)
    assert new.compile(src) == link_code_object(new.relocatable(src), amdgpu._kernel_label(src))
