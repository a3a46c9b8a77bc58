"""The x86 backend's split into render (program text, on the lowering thread) and compile (the backend proper, in a
CompilePool worker or here): the text reads back into the very program it was written from, for the hypothesis
corpus and for the values JSON cannot hold plainly; compiling the text builds exactly the object `render_x86` builds
from the program, listing included; a worker process builds the same bytes; a changed backend is a different cache
identity."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings

from codegen_strategies import kernel_asts
from speck.codegen.compiler.pool import CompilePool
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt, OptOps
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.x86 import X86Compiler, X86Renderer, read_listing, render_x86
from speck.codegen.x86.compiler import backend_digest
from speck.codegen.x86.program_text import dump_program, load_program
from speck.uop import AddrSpace, AxisType, UOp, dtypes
from test_x86_kernels import without_narrow_floats
from test_x86_select import GOLDEN_KERNELS, unselectable_program

BOOT_TIMEOUT = 120.0  # seconds a worker may take to start on a loaded machine (a bound, not a measurement)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield tmp_path


def lowered(ast: UOp, fp_contract: bool = False) -> list[UOp]:
    return full_rewrite_to_sink(ast, X86Renderer(fp_contract))


@given(kernel_asts(max_depth=2))
@settings(max_examples=30, deadline=None)
def test_program_text_reads_back_into_the_same_program(case: tuple[Any, Any, Any]) -> None:
    ast, inputs, _ = case
    ast, _ = without_narrow_floats(ast, inputs)
    for fp in (False, True):
        uops = lowered(ast, fp)
        back, fp_back = load_program(X86Renderer(fp).render(uops))
        assert back == uops and fp_back == fp  # UOps are hash-consed: equal lists hold the very same nodes


def test_values_without_a_plain_json_form_round_trip() -> None:
    """-0.0, inf, nan, bools next to equal ints, enums, dtypes, opts and tags come back as they went in."""
    r = UOp.range(4, 0, AxisType.GLOBAL)
    consts = [UOp.const(dtypes.float32, v) for v in (-0.0, 0.0, math.inf, -math.inf, math.nan, 1e-45, 0.1)]
    flags = [UOp.const(dtypes.bool, True), UOp.const(dtypes.int32, 1), UOp.const(dtypes.bool, False)]
    p = UOp.param(0, dtypes.float32.vec(4).ptr(16, AddrSpace.GLOBAL))
    reg = UOp.param(1, dtypes.float32.ptr(8, AddrSpace.REG))
    info = KernelInfo("odd", opts=(Opt(OptOps.UPCAST, 0, 4),), applied_opts=(Opt(OptOps.SWAP, 0, 1),), dont_opt=True)
    tagged = UOp.const(dtypes.int32, 3).replace(tag=("lin", 7))
    uops = [p, reg, r.src[0], r, *consts, *flags, tagged, UOp.sink(r, arg=info)]
    back, _ = load_program(dump_program(uops, False))
    assert len(back) == len(uops)
    for a, b in zip(back, uops):
        assert (a.op, a.dtype, a.tag) == (b.op, b.dtype, b.tag)
        assert type(a.arg) is type(b.arg)
        if isinstance(b.arg, float):
            assert (math.isnan(a.arg) and math.isnan(b.arg)) or (a.arg == b.arg and math.copysign(1, a.arg) ==
                                                                  math.copysign(1, b.arg))  # fmt: skip
        else:
            assert a.arg == b.arg


def test_an_arg_without_a_spelling_is_refused_as_unsupported() -> None:
    from speck.codegen.renderer import UnsupportedOpError

    odd = UOp.const(dtypes.int32, 1).replace(arg=frozenset({1}))
    with pytest.raises(UnsupportedOpError, match="frozenset"):
        dump_program([odd], False)


@pytest.mark.parametrize("name", sorted(GOLDEN_KERNELS))
def test_compiling_the_text_builds_the_object_render_x86_builds(name: str) -> None:
    uops = lowered(GOLDEN_KERNELS[name]())
    direct = render_x86(uops)
    lib = X86Compiler().compile(X86Renderer().render(uops))
    assert lib == direct.obj
    assert read_listing(lib) == direct.listing == X86Compiler().disassemble(lib)
    assert direct.listing.startswith(f"# speck x86-64 kernel {name}:")


def test_compile_pool_workers_build_the_same_x86_objects() -> None:
    c = X86Compiler()
    srcs = [X86Renderer().render(lowered(build())) for build in GOLDEN_KERNELS.values()]
    p = CompilePool(2)
    try:
        p.start_workers()
        assert p.wait_ready(BOOT_TIMEOUT), "the compile workers did not start"
        libs = [f.result() for f in [p.submit(c, s) for s in srcs]]
        assert sum(w.compiled for w in p.workers()) == len(srcs)  # all of them in the workers
    finally:
        p.shutdown()
    assert libs == [c.compile_uncached(s) for s in srcs]


def test_a_worker_reports_a_late_refusal_and_stays_up() -> None:
    """The selector refuses only once there (an int32 vector load): a worker reports CompileRefused, as a compile
    here raises it (the registry renders the kernel with its fallback), and keeps compiling x86 afterwards."""
    from speck.codegen.errors import CompileRefused

    c = X86Compiler()
    refused = X86Renderer().render(unselectable_program())
    fine = X86Renderer().render(lowered(GOLDEN_KERNELS["row_sum"]()))
    p = CompilePool(1)
    try:
        p.start_workers()
        assert p.wait_ready(BOOT_TIMEOUT), "the compile worker did not start"
        with pytest.raises(CompileRefused, match="no selection rule"):
            p.submit(c, refused).result()
        lib = p.submit(c, fine).result()
        assert [w.compiled for w in p.workers()] == [1]
    finally:
        p.shutdown()
    with pytest.raises(CompileRefused):
        c.compile_uncached(refused)
    assert lib == c.compile_uncached(fine) and read_listing(lib) is not None


def test_the_cache_identity_names_the_backend_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """An object cached by one version of the backend is never handed out by another: the digest is in `flags`."""
    src = X86Renderer().render(lowered(GOLDEN_KERNELS["row_sum"]()))
    digest = backend_digest()
    assert X86Compiler().flags == (f"backend={digest}",)
    key = X86Compiler().cache_key(src)
    import speck.codegen.x86.compiler as xc

    monkeypatch.setattr(xc, "_BACKEND_FILES", ("x86/select.py",))
    assert backend_digest() != digest
    monkeypatch.setattr(xc, "_DIGEST", [backend_digest()])
    assert X86Compiler().cache_key(src) != key


@pytest.mark.parametrize("gc_on", [True, False])
def test_compiling_makes_no_reference_cycles_and_restores_the_collector(gc_on: bool) -> None:
    """X86Compiler pauses the cyclic collector while it compiles (speed): sound only because the backend leaves no
    cyclic garbage behind, which this checks on real kernels; the collector's state is as it was before."""
    import gc

    srcs = [X86Renderer().render(lowered(GOLDEN_KERNELS[name]())) for name in sorted(GOLDEN_KERNELS)]
    compiler = X86Compiler()
    was = gc.isenabled()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        (gc.enable if gc_on else gc.disable)()
        for src in srcs:
            compiler.compile_uncached(src)
            assert gc.isenabled() == gc_on
        gc.collect()
        assert gc.garbage == [], f"the backend left {len(gc.garbage)} objects in reference cycles"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize(
    "field, why",
    [
        ("0,-1", "negative source index"),
        ("0,x", "ValueError"),
        ("0,999", "IndexError"),
        ("SELF", "IndexError"),
        ("0,", "ValueError"),
    ],  # fmt: skip
)
def test_a_bad_sources_field_names_its_line(field: str, why: str) -> None:
    """A sources field that is not earlier UOps' indices (negative, not a number, past the end, a UOp not read yet)
    is a CompileError naming the line, never a program built from other UOps; a good field read once is no excuse
    for a bad one later (the fields' pickers are remembered)."""
    from speck.codegen.errors import CompileError

    src = X86Renderer().render(lowered(GOLDEN_KERNELS["row_sum"]()))
    lines = src.split("\n")
    k = next(n for n, ln in enumerate(lines) if n and ln.split("\t")[3])  # the first line with sources
    *head, srcs, rest = lines[k].split("\t", 4)
    good = "\n".join(lines[:k] + ["\t".join([*head, srcs, rest])] + lines[k + 1 :])
    assert load_program(good)[0] == load_program(src)[0]
    field = field.replace("SELF", str(k - 1))  # (the UOp the line itself defines: not read yet)
    bad = "\n".join(lines[:k] + ["\t".join([*head, field, rest])] + lines[k + 1 :])
    with pytest.raises(CompileError, match=f"line {k + 1} of the x86 program is not a UOp.*{why}"):
        load_program(bad)
