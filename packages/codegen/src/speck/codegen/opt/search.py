"""BEAM search over opt lists. Codegen never runs code: candidates are lowered and rendered to ProgramSpecs and
timed by a callback the caller supplies (a KernelTimer: `to_program(..., beam_timer=t)` builds one that renders each
candidate and hands its ProgramSpec to `t`; speck.tensor passes the kernel's own device's `time_program`).

The search is bounded: `BEAM_TIMEOUT` seconds per kernel (default 60), and the heuristic's choice competes as a
candidate, so the result is never slower than the heuristic by the timer's measure. Winners are cached on disk in
speck.codegen.cache's store (namespace "beam"), keyed by the AST's content hash, the renderer, the beam width and the
timer's device (`cache_tag`); `CACHELEVEL=0` disables the cache and `IGNORE_BEAM_CACHE=1` searches again (and
rewrites the entry). A corrupt entry is a miss."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from speck.codegen.cache import DiskCache
from speck.codegen.errors import OptError
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.lower.simplify import pm_simplify
from speck.codegen.opt.heuristic import hand_coded_optimizations
from speck.codegen.opt.kernel_opts import Opt, OptOps, apply_opts, const_size, output_axes, reduce_axes
from speck.codegen.opt.merge import merge_ranges
from speck.codegen.settings import BEAM_TIMEOUT, IGNORE_BEAM_CACHE
from speck.uop import DEBUG, UOp, graph_rewrite

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer

# seconds one run of a kernel takes, given the kernel AST with its opts (KernelInfo.opts; dont_opt for none) set:
# the caller lowers, compiles and runs it on the device it cares about (math.inf when that fails)
KernelTimer = Callable[[UOp], float]
LOCAL_AMOUNTS = (2, 4, 8, 16, 32, 64, 128)  # work-items per workgroup along one axis BEAM tries on a GPU
GROUP_AMOUNTS = (4, 8, 16, 32, 64)  # work-items a reduction is split across


# winners as JSON lists of opts in speck.codegen.cache's integrity-checked store; version 2: the first one there
BEAM_CACHE = DiskCache("beam", version=2)


def cache_key(ast: UOp, renderer: Renderer, width: int, cache_tag: str) -> str:
    return hashlib.sha256(ast.key + f"|{renderer.name}|{width}|{cache_tag}".encode()).hexdigest()


def _read_cached(key: str) -> tuple[Opt, ...] | None:
    """The cached winner, or None for a missing entry or one that doesn't describe opts (a miss, never an error)."""
    data = BEAM_CACHE.get(key)
    if data is None:
        return None
    try:
        return tuple(Opt.from_json(x) for x in json.loads(data))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def candidate_actions(sink: UOp, renderer: Renderer | None = None) -> list[Opt]:
    """Every single action worth trying on this kernel: on a renderer with workgroups (`has_local`), workgroup splits
    (LOCAL) and grouped reductions (GROUP/GROUPTOP) instead of CPU thread splits (THREAD)."""
    gpu = renderer is not None and renderer.has_local
    acts: list[Opt] = []
    outs, reds = output_axes(sink), reduce_axes(sink)
    for i, r in enumerate(outs):
        n = const_size(r)
        for a in (2, 3, 4, 8, 16):
            if n is not None and n % a == 0 and n > 1:
                acts.append(Opt(OptOps.UPCAST, i, a))
                if not gpu:
                    acts.append(Opt(OptOps.THREAD, i, a))
        for a in LOCAL_AMOUNTS if gpu else ():
            if n is not None and n % a == 0:
                acts.append(Opt(OptOps.LOCAL, i, a))
        for j in range(i + 1, len(outs)):
            acts.append(Opt(OptOps.SWAP, i, j))
    for i, r in enumerate(reds):
        n = const_size(r)
        for a in (2, 4, 8):
            if n is not None and n % a == 0 and n > 1:
                acts.append(Opt(OptOps.UNROLL, i, a))
        for a in GROUP_AMOUNTS if gpu else ():
            if n is not None and n % a == 0:
                acts += [Opt(OptOps.GROUP, i, a), Opt(OptOps.GROUPTOP, i, a)]
    return acts


def beam_search(ast: UOp, renderer: Renderer, width: int, timer: KernelTimer, max_rounds: int = 3,
                use_cache: bool = True, cache_tag: str = "") -> tuple[Opt, ...]:  # fmt: skip
    """Find a good opt list for `ast` by beam search of `width` candidates per round, timing candidates with
    `timer` (a KernelTimer: the kernel AST with the candidate's opts in, seconds out). Returns the best list found
    (the heuristic's when nothing beats it); cached on disk (see the module docstring)."""
    key = cache_key(ast, renderer, width, cache_tag)
    if use_cache and not IGNORE_BEAM_CACHE and (hit := _read_cached(key)) is not None:
        return hit
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    base = merge_ranges(graph_rewrite(ast, pm_simplify, name="beam_base"))
    deadline = time.perf_counter() + float(BEAM_TIMEOUT.value)

    def measure(opts: tuple[Opt, ...]) -> float:
        try:
            # no opts must mean exactly that: an empty opts tuple would let the optimizer choose (or search again)
            cand = ast.replace(arg=info.replace(opts=opts, dont_opt=not opts))
            return float(timer(cand))
        except OptError:
            return math.inf

    try:
        heuristic = tuple(hand_coded_optimizations(base, renderer))
        apply_opts(base, heuristic, renderer)
    except OptError:
        heuristic = ()
    starts = [(), heuristic] if heuristic else [()]
    best = sorted(((measure(o), o) for o in starts), key=lambda x: (x[0], len(x[1])))
    seen: set[tuple[Opt, ...]] = set(starts)
    timed_out = False
    for _ in range(max_rounds):
        cands: list[tuple[float, tuple[Opt, ...]]] = []
        for _t, opts in best:
            try:
                cur = apply_opts(base, opts, renderer)
            except OptError:
                continue
            for a in candidate_actions(cur, renderer):
                nxt = opts + (a,)
                if nxt in seen:
                    continue
                seen.add(nxt)
                try:
                    apply_opts(cur, (a,), renderer)
                except OptError:
                    continue
                if time.perf_counter() > deadline:
                    timed_out = True
                    break
                cands.append((measure(nxt), nxt))
            if timed_out:
                break
        if not cands:
            break
        merged = sorted(best + cands, key=lambda x: (x[0], len(x[1])))[:width]
        if merged[0][0] >= best[0][0] or timed_out:
            best = merged
            break
        best = merged
    winner = best[0][1]
    if DEBUG >= 2:
        print(f"BEAM {info.name}: {len(seen)} candidates, best {best[0][0] * 1e6:.1f} us with {winner}"
              + (" (time budget reached)" if timed_out else ""))  # fmt: skip
    if use_cache:
        BEAM_CACHE.put(key, json.dumps([o.to_json() for o in winner]).encode())
    return winner
