"""The lowered-kernel cache (speck.codegen.lowered_cache): a warm entry gives back the same program (source, UOps,
sizes, buffers, variables, estimates) without lowering; the key changes with anything lowering reads (AST, renderer
settings, speck settings, optimize) and is the same in every process; SPEC=1, DEBUG>=3 and BEAM's timer always lower;
an entry that can't be read back is a miss."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import speck.codegen.pipeline as pipeline
from speck.codegen import KernelInfo, lowered_cache, to_program
from speck.codegen.cache.store import DiskCache
from speck.codegen.program import ProgramSpec
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, Context, Ops, UOp, dtypes
from test_program import rowsum_kernel, scale_kernel

HERE = os.path.dirname(os.path.abspath(__file__))


def var_kernel() -> UOp:
    """A kernel over a variable extent: its launch size and estimates are UOp expressions."""
    n = UOp.variable("n", 1, 64)
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(64)).index(i).load()
    io = UOp.param(0, dtypes.float32.ptr(64))
    return UOp.sink(io.index(i).store(io.index(i).load() * a + 1.0).end(i), arg=KernelInfo("fma_n"))


KERNELS = {"scale": scale_kernel, "rowmax": rowsum_kernel, "var": var_kernel}


@pytest.fixture
def cache(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    lowered_cache.flush()  # nothing queued by earlier tests lands in this directory
    with Context(SPEC=0, DEBUG=0):
        yield


def _fields(p: ProgramSpec) -> tuple[object, ...]:
    return (p.name, p.src, p.global_size, p.buffers, p.vars, p.estimates, p.renderer, p.applied_opts)


def _no_lowering(*args: object, **kw: object) -> list[UOp]:
    raise AssertionError("lowered although the cache holds the kernel")


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_warm_entry_is_the_same_program_without_lowering(cache: None, kernel: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    r = LLVMRenderer()
    cold = to_program(KERNELS[kernel](), r)
    assert lowered_cache.flush() == 1
    monkeypatch.setattr(pipeline, "full_rewrite_to_sink", _no_lowering)
    warm = to_program(KERNELS[kernel](), r)
    assert _fields(warm) == _fields(cold)
    assert len(warm.uops) == len(cold.uops) and all(a is b for a, b in zip(warm.uops, cold.uops))  # hash-consed


def test_cold_lowering_queues_and_flush_writes(cache: None) -> None:
    r = LLVMRenderer()
    to_program(scale_kernel(), r)
    store = DiskCache("lowered/llvm", lowered_cache.VERSION)
    assert store.keys() == []  # written at flush (at exit), not while lowering
    assert lowered_cache.flush() == 1
    assert store.keys() == [lowered_cache.lowered_key(scale_kernel(), r, True)]


def test_key_follows_everything_lowering_reads(cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    r = LLVMRenderer()
    base = lowered_cache.lowered_key(scale_kernel(), r, True)
    assert lowered_cache.lowered_key(scale_kernel(), LLVMRenderer(), True) == base  # equal inputs, equal keys
    others = [
        lowered_cache.lowered_key(rowsum_kernel(), r, True),
        lowered_cache.lowered_key(scale_kernel(), r, False),
        lowered_cache.lowered_key(scale_kernel(), LLVMRenderer(fp_contract=True), True),  # the default is False
    ]
    with Context(TRANSCENDENTAL=2):
        others.append(lowered_cache.lowered_key(scale_kernel(), r, True))
    monkeypatch.setattr(LLVMRenderer, "max_vector_bytes", 16, raising=False)  # (host default: 32, or 64 on AVX-512)
    r2 = LLVMRenderer()
    vars(r2).pop("max_vector_bytes", None)
    others.append(lowered_cache.lowered_key(scale_kernel(), r2, True))
    assert base not in others and len(set(others)) == len(others)


def test_key_is_the_same_in_another_process(cache: None) -> None:
    code = ("from speck.codegen import lowered_cache; from speck.codegen.renderer.llvmir import LLVMRenderer; "
            "import sys; sys.path.insert(0, sys.argv[1]); from test_program import rowsum_kernel; "
            "print(lowered_cache.lowered_key(rowsum_kernel(), LLVMRenderer(), True))")  # fmt: skip
    with Context(SPEC=0, DEBUG=0):
        mine = lowered_cache.lowered_key(rowsum_kernel(), LLVMRenderer(), True)
    for seed in ("1", "2"):  # string hashes (set orders) differ between these processes
        env = dict(os.environ, PYTHONHASHSEED=seed, SPEC="0", DEBUG="0")
        out = subprocess.run([sys.executable, "-c", code, HERE], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == mine


@pytest.mark.parametrize("setting", [{"SPEC": 1}, {"DEBUG": 3}, {"CACHELEVEL": 0}])
def test_verification_debug_and_cache_off_always_lower(cache: None, setting: dict[str, int]) -> None:
    r = LLVMRenderer()
    to_program(scale_kernel(), r)
    lowered_cache.flush()
    calls = []
    real = pipeline.full_rewrite_to_sink

    def counting(*args: object, **kw: object) -> list[UOp]:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    pipeline.full_rewrite_to_sink = counting  # type: ignore[assignment]
    try:
        with Context(**setting):
            to_program(scale_kernel(), r)
        to_program(scale_kernel(), r)  # back in the cached settings: served
    finally:
        pipeline.full_rewrite_to_sink = real  # type: ignore[assignment]
    assert calls == [1]
    assert lowered_cache.flush() == 0


def test_beam_timer_always_lowers(cache: None) -> None:
    assert not lowered_cache.usable(beam_timer=lambda spec: 1.0)
    assert lowered_cache.usable()


def test_unreadable_entry_is_a_miss_and_is_rewritten(cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    r = LLVMRenderer()
    key = lowered_cache.lowered_key(scale_kernel(), r, True)
    store = DiskCache("lowered/llvm", lowered_cache.VERSION)
    store.put(key, b"not a pickle")  # a well-formed store entry whose payload can't be read back
    assert lowered_cache.get(key, r) is None
    cold = to_program(scale_kernel(), r)  # lowers
    assert lowered_cache.flush() == 1
    monkeypatch.setattr(pipeline, "full_rewrite_to_sink", _no_lowering)
    assert _fields(to_program(scale_kernel(), r)) == _fields(cold)


def test_flat_table_round_trip_keeps_shared_nodes_and_tags() -> None:
    x = UOp.variable("x", 0, 9)
    a = x * 3 + 1
    tagged = a.replace(tag=("lin", 4))
    value = ([x, a, tagged, UOp.sink(a, tagged)], {"size": a + x}, (Ops.ADD, dtypes.float32.vec(4)))
    back = lowered_cache.loads(lowered_cache.dumps(value, value[0]))
    assert all(p is q for p, q in zip(back[0], value[0]))
    assert back[1]["size"] is value[1]["size"] and back[2] == value[2]


def test_key_does_not_depend_on_which_settings_are_registered(cache: None) -> None:
    from speck.uop.helpers import ContextVar

    r = LLVMRenderer()
    before = lowered_cache.lowered_key(scale_kernel(), r, True)
    extra = ContextVar("SPECK_TEST_LOWERED_CACHE_SETTING", 0)  # a module imported later registers its settings
    try:
        assert lowered_cache.lowered_key(scale_kernel(), r, True) == before  # at its default: as if unregistered
        extra.value = 1
        assert lowered_cache.lowered_key(scale_kernel(), r, True) != before
    finally:
        ContextVar._registry.pop(extra.key)


def test_a_cold_cache_hashes_keys_at_the_write_with_the_settings_of_the_lowering(
    cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no namespace directory nothing is looked up and no AST is hashed while lowering; the entry written at
    flush is keyed as lowered_key was when the kernel was lowered (settings and renderer of then, not of the flush),
    and serves the kernel in those settings."""
    r = LLVMRenderer()
    hashed: list[object] = []
    real_key_of = lowered_cache.key_of
    monkeypatch.setattr(lowered_cache, "key_of", lambda ctx, ast: hashed.append(ast) or real_key_of(ctx, ast))
    with Context(TRANSCENDENTAL=2):
        cold = to_program(scale_kernel(), r)
        want = real_key_of(lowered_cache.key_context(r, True), scale_kernel())
    assert hashed == []
    assert want != lowered_cache.lowered_key(scale_kernel(), r, True)  # the setting is part of the key
    assert lowered_cache.flush() == 1
    assert DiskCache("lowered/llvm", lowered_cache.VERSION).keys() == [want]
    monkeypatch.setattr(pipeline, "full_rewrite_to_sink", _no_lowering)
    with Context(TRANSCENDENTAL=2):
        assert _fields(to_program(scale_kernel(), r)) == _fields(cold)
