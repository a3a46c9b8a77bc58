"""The RDNA3 emulator's fast paths give the general paths' bits: the division macro's shortcuts (V_DIV_SCALE and
V_DIV_FIXUP when no lane meets a special case) against the general code on the same lanes, the 32-bit carry adds
against 64-bit arithmetic, 64-bit shifts by a constant in 32-bit halves against the uint64 path, FlatMemory's
overlapping-window gathers against byte indexing, the decode cache against a fresh decode (and new code at the same
address), and whole dispatches run as one wide lockstep group against the same dispatch one wave per group (same
memory, same Stats)."""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdna3_corpus import NP, cases, special_floats
from rdna3_llvm import compile_ir
from speck.usbgpu.sim.rdna3 import FlatMemory, Stats, run, valu
from speck.usbgpu.sim.rdna3.decode import decode_at

dispatch_mod = importlib.import_module("speck.usbgpu.sim.rdna3.dispatch")
vector_mod = importlib.import_module("speck.usbgpu.sim.rdna3.vector")  # (the package's `dispatch` is the function)


def f64_lanes() -> st.SearchStrategy[np.ndarray]:
    bits = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1 << 63, 0x7FF0000000000000, 0x0010000000000000]))
    return st.lists(bits, min_size=32, max_size=32).map(lambda x: np.array(x, np.uint64).view(np.float64))


NO_WAVES: Any = None  # these semantics functions read no wave state


def general(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn` with the "no special case" shortcuts turned off."""
    with monkeypatch.context() as m:
        m.setattr(valu, "_ordinary_scale", lambda d, n: False)
        m.setattr(valu, "_ordinary_fixup", lambda q, d, n: False)
        return fn(NO_WAVES, *args)


def same_bits(x: Any, y: Any) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    return bool(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes())


EXPS = [0, 1, 2, 22, 23, 24, 25, 100, 126, 127, 128, 129, 250, 251, 252, 253, 254, 255]
GAPS = [-152, -151, -150, -149, -148, -127, -126, -125, -124, -123, 0, 93, 94, 95, 96, 97]


def f32_of(sign: int, exp: int, mant: int) -> Any:
    return np.array([(sign << 31) | (min(max(exp, 0), 255) << 23) | mant], np.uint32).view(np.float32)[0]


@st.composite
def division_lanes(draw: st.DrawFn) -> tuple[np.float32, np.float32, np.float32]:
    """(q, d, n) of one lane, with exponents at and around every boundary the shortcuts test."""
    mant = st.one_of(st.sampled_from([0, 1, 0x400000, 0x7FFFFF]), st.integers(0, 0x7FFFFF))
    ed = draw(st.one_of(st.sampled_from(EXPS), st.integers(0, 255)))
    en = ed + draw(st.one_of(st.sampled_from(GAPS), st.integers(-255, 255)))
    eq = draw(st.one_of(st.sampled_from(EXPS), st.integers(0, 255)))
    signs = draw(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)))
    return f32_of(signs[0], eq, draw(mant)), f32_of(signs[1], ed, draw(mant)), f32_of(signs[2], en, draw(mant))


@settings(max_examples=300, deadline=None)
@given(st.lists(division_lanes(), min_size=1, max_size=4))
def test_div_scale_and_fixup_shortcuts_match_the_general_path(lanes: list[tuple[Any, ...]]) -> None:
    """Per lane (one-lane arrays, so the shortcut is taken whenever that lane qualifies) and for all lanes at once."""
    groups = [[lane] for lane in lanes] + [lanes]
    with pytest.MonkeyPatch.context() as mp, np.errstate(all="ignore"):
        for group in groups:
            q, d, n = (np.array(x, np.float32) for x in zip(*group))
            for s0 in (d, n):
                fast, slow = valu._div_scale(NO_WAVES, s0, d, n), general(mp, valu._div_scale, s0, d, n)
                assert same_bits(fast[0], slow[0]) and same_bits(fast[1], slow[1]), (q, d, n)
            assert same_bits(valu._div_fixup(NO_WAVES, q, d, n), general(mp, valu._div_fixup, q, d, n)), (q, d, n)


def test_div_shortcuts_match_the_general_path_on_the_boundary_grid() -> None:
    """Every boundary exponent of d, every boundary gap to n's exponent, extreme mantissas: lane by lane."""
    mants = [0, 1, 0x400000, 0x7FFFFF]
    with pytest.MonkeyPatch.context() as mp, np.errstate(all="ignore"):
        for ed in EXPS:
            for gap in GAPS:
                for md in mants:
                    for mn in mants:
                        d, n = np.array([f32_of(0, ed, md)]), np.array([f32_of(1, ed + gap, mn)])
                        q = np.array([f32_of(0, EXPS[(ed + gap) % len(EXPS)], mn)])
                        fast, slow = valu._div_scale(NO_WAVES, d, d, n), general(mp, valu._div_scale, d, d, n)
                        assert same_bits(fast[0], slow[0]) and same_bits(fast[1], slow[1]), (d, n)
                        fast, slow = valu._div_scale(NO_WAVES, n, d, n), general(mp, valu._div_scale, n, d, n)
                        assert same_bits(fast[0], slow[0]) and same_bits(fast[1], slow[1]), (d, n)
                        got, want = valu._div_fixup(NO_WAVES, q, d, n), general(mp, valu._div_fixup, q, d, n)
                        assert same_bits(got, want), (q, d, n)


@settings(max_examples=60, deadline=None)
@given(f64_lanes(), f64_lanes(), f64_lanes())
def test_div_shortcuts_match_the_general_path_for_f64(q: np.ndarray, d: np.ndarray, n: np.ndarray) -> None:
    with pytest.MonkeyPatch.context() as mp, np.errstate(all="ignore"):
        for k in [slice(i, i + 1) for i in range(32)] + [slice(None)]:
            fast, slow = valu._div_scale(NO_WAVES, d[k], d[k], n[k]), general(mp, valu._div_scale, d[k], d[k], n[k])
            assert same_bits(fast[0], slow[0]) and same_bits(fast[1], slow[1])
            assert same_bits(
                valu._div_fixup(NO_WAVES, q[k], d[k], n[k]), general(mp, valu._div_fixup, q[k], d[k], n[k])
            )


def test_the_shortcut_predicates_hold_for_ordinary_quotients() -> None:
    """A typical division (finite normal operands of moderate size) takes the shortcut, so it is what runs."""
    rng = np.random.default_rng(0)
    d, n = rng.uniform(0.5, 4, 64).astype(np.float32), rng.uniform(-3, 3, 64).astype(np.float32)
    assert valu._ordinary_scale(d, n) and valu._ordinary_fixup(n / d, d, n)
    assert not valu._ordinary_scale(d, np.where(np.arange(64) == 5, np.float32(0), n))


EDGES = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, 2**32 - 1)), min_size=64, max_size=64))
def test_carry_adds_match_64_bit_arithmetic(words: list[int]) -> None:
    a, b = np.array(words[:32], np.uint32).reshape(1, 32), np.array(words[32:], np.uint32).reshape(1, 32)
    cin = (a & 1).astype(bool) ^ (b >> 31).astype(bool)
    wide = a.astype(np.uint64) + b.astype(np.uint64)
    res, carry = valu._add_co(NO_WAVES, a, b)
    assert (res == (wide & 0xFFFFFFFF)).all() and (carry == (wide >> 32).astype(bool)).all()
    wide_ci = wide + cin.astype(np.uint64)
    res, carry = valu._add_co_ci(NO_WAVES, a, b, cin)
    assert (res == (wide_ci & 0xFFFFFFFF)).all() and (carry == (wide_ci >> 32).astype(bool)).all()


def test_decode_cache_rereads_the_words_and_decodes_new_code_afresh() -> None:
    code = {0x1000: 0x7E000280, 0x1004: 0xBFB00000}  # v_mov_b32_e32 v0, 0; s_endpgm
    first = decode_at(0x1000, code.__getitem__)
    assert decode_at(0x1000, code.__getitem__) is first and first.text == "v_mov_b32_e32 v0, 0"
    literal = {0x1000: 0x7E0002FF, 0x1004: 0x3F800000}  # v_mov_b32_e32 v0, 0x3f800000 (a literal word follows)
    a = decode_at(0x1000, literal.__getitem__)
    literal[0x1004] = 0x40000000  # same first word, new literal: not the cached instruction
    b = decode_at(0x1000, literal.__getitem__)
    assert a.text == "v_mov_b32_e32 v0, 0x3f800000" and b.text == "v_mov_b32_e32 v0, 0x40000000"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.sampled_from([1, 2, 4, 8, 12, 16]), st.integers(0, 2**32 - 1))
def test_window_gathers_match_byte_indexing(length: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, length, dtype=np.uint8)
    mem = FlatMemory()
    base = mem.alloc(data, "buf")
    if length < size:
        return
    offsets = rng.integers(0, length - size + 1, 50)
    if rng.random() < 0.5:
        offsets &= ~3
    got = mem.gather(np.uint64(base) + offsets.astype(np.uint64), size)
    assert (got == data[offsets[:, None] + np.arange(size)]).all()


def _stats(s: Stats) -> tuple[Any, ...]:
    return (s.workgroups, s.waves, s.instructions, dict(s.by_mnemonic), dict(s.by_kind), s.bytes_read,
            s.bytes_written, s.lds_bytes)  # fmt: skip


WIDE = ["fdiv_f32", "fdiv_f64", "fma_f32", "loop_divergent", "lds_tree_sum", "scratch_array", "sdiv_i64"]


@pytest.mark.parametrize("name", WIDE)
def test_one_wide_group_and_one_wave_per_group_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batching every wave into one lockstep group (the default) and running one wave per group write the same
    bits and count the same Stats."""
    known = {c.name: c for c in cases()}
    if name not in known:
        pytest.fail(f"{name} is not a kernel of rdna3_corpus (known: {sorted(known)[:8]}...)")
    c = known[name]
    rng = np.random.default_rng(1)
    gen = c.inputs or special_floats
    a = np.asarray(gen(rng, c.n, c.a)).astype(NP[c.a])
    b = np.asarray(gen(rng, c.n, c.b)).astype(NP[c.b])
    so = compile_ir(c.ir, c.true16)
    out_dt = np.dtype(NP[c.out])
    results = []
    for width in (1024, 1):
        real = dispatch_mod.dispatch

        def narrow(*args: Any, width: int = width, real: Any = real, **kw: Any) -> Any:
            return real(*args, **kw, max_group_waves=width)

        monkeypatch.setattr(dispatch_mod, "dispatch", narrow)
        mem = FlatMemory()
        pa, pb = mem.alloc(a, "a"), mem.alloc(b, "b")
        po = mem.alloc(c.n * out_dt.itemsize, "out")
        stats = run(so, c.name, (-(-c.n // c.block), 1, 1), (c.block, 1, 1), struct.pack("<QQQi", po, pa, pb, c.n),
                    mem)  # fmt: skip
        results.append((mem.array(po, out_dt, c.n).tobytes(), _stats(stats)))
        monkeypatch.setattr(dispatch_mod, "dispatch", real)
    assert results[0] == results[1]


@pytest.mark.parametrize("op", [0x33C, 0x33D])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 16, 31, 32, 33, 63, 64])
def test_64_bit_shifts_by_a_constant_match_the_uint64_path(op: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """v_lshlrev_b64 / v_lshrrev_b64 v[4:5], k, v[2:3] in 32-bit halves against the generic 64-bit executor, with
    some lanes inactive (they keep their old bits)."""
    row = valu.VOP3[op]
    rng = np.random.default_rng(k)
    regs = rng.integers(0, 2**32, (8, 3, 32), dtype=np.uint64).astype(np.uint32)
    exec_words = np.array([0xFFFFFFFF, 0x0F0F00F1, 0], np.uint32)
    fields = vector_mod.Fields(4, [128 + k, 256 + 2])
    outs = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(vector_mod, "_shift64_const", lambda row, f: None)
        run_inst = vector_mod.build_valu(row, fields)
        w = waves(regs.copy(), exec_words)
        with np.errstate(all="ignore"):
            run_inst(w)
        outs.append(w.v.copy())
    assert (outs[0] == outs[1]).all()


def waves(v: np.ndarray, exec_words: np.ndarray) -> Any:
    from speck.usbgpu.sim.rdna3.dispatch import DispatchPacket, Launch
    from speck.usbgpu.sim.rdna3.wave import EXEC, Mode, Waves

    n = v.shape[1]
    launch = Launch(DispatchPacket(0, 0, 0, 0), FlatMemory(), 1, n, 0, Stats())
    s = np.zeros((128, n), np.uint32)
    s[EXEC] = exec_words
    return Waves(launch, s, v, np.zeros(n, bool), np.zeros(n, np.int64), np.arange(n), 0, Mode())
