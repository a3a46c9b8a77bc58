"""BEAM search over opt lists. Codegen never runs code: candidates are lowered and rendered to ProgramSpecs and
timed by a callback the runtime supplies (`register_beam_timer`, or the `timer` argument). Winners are cached on
disk in `$SPECK_CACHE_DIR/beam` (default ~/.cache/speck/beam), keyed by the AST's content hash, the renderer and
the beam width; `CACHELEVEL=0` disables the cache."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt.kernel_opts import Opt, OptError, OptOps, apply_opts, const_size, output_axes, reduce_axes
from speck.uop import UOp

if TYPE_CHECKING:
    from speck.codegen.program import ProgramSpec
    from speck.codegen.renderer import Renderer

BeamTimer = Callable[["ProgramSpec"], float]
_TIMER: list[BeamTimer] = []


def register_beam_timer(timer: BeamTimer | None) -> None:
    """Install the function BEAM uses to time a candidate ProgramSpec (seconds; math.inf for a failed run)."""
    _TIMER.clear()
    if timer is not None:
        _TIMER.append(timer)


def registered_timer() -> BeamTimer | None:
    return _TIMER[0] if _TIMER else None


def _cache_path(ast: UOp, renderer: Renderer, width: int) -> pathlib.Path:
    root = os.environ.get("SPECK_CACHE_DIR")
    base = pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "speck"
    key = hashlib.sha256(ast.key + f"|{renderer.name}|{width}".encode()).hexdigest()
    return base / "beam" / f"{key}.json"


def _cache_on() -> bool:
    return int(os.environ.get("CACHELEVEL", "1") or "0") > 0


def candidate_actions(sink: UOp) -> list[Opt]:
    """Every single action worth trying on this kernel."""
    acts: list[Opt] = []
    outs, reds = output_axes(sink), reduce_axes(sink)
    for i, r in enumerate(outs):
        n = const_size(r)
        for a in (2, 3, 4, 8, 16):
            if n is not None and n % a == 0 and n > 1:
                acts.append(Opt(OptOps.UPCAST, i, a))
                acts.append(Opt(OptOps.THREAD, i, a))
        for j in range(i + 1, len(outs)):
            acts.append(Opt(OptOps.SWAP, i, j))
    for i, r in enumerate(reds):
        n = const_size(r)
        for a in (2, 4, 8):
            if n is not None and n % a == 0 and n > 1:
                acts.append(Opt(OptOps.UNROLL, i, a))
    return acts


def beam_search(ast: UOp, renderer: Renderer, width: int, timer: BeamTimer | None = None, max_rounds: int = 3,
                use_cache: bool = True) -> tuple[Opt, ...]:  # fmt: skip
    """Find a good opt list for `ast` by beam search of `width` candidates per round, timing candidates with
    `timer` (default: the registered one). Returns the best list (possibly empty); cached on disk."""
    from speck.codegen.pipeline import pm_simplify
    from speck.codegen.program import to_program
    from speck.uop import graph_rewrite

    timer = timer or registered_timer()
    if timer is None:
        raise RuntimeError("BEAM search needs a timer: the runtime must call "
                           "speck.codegen.opt.register_beam_timer(fn) (fn(ProgramSpec) -> seconds)")  # fmt: skip
    path = _cache_path(ast, renderer, width)
    if use_cache and _cache_on() and path.exists():
        return tuple(Opt.from_json(x) for x in json.loads(path.read_text()))
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    from speck.codegen.opt.merge import merge_ranges

    base = merge_ranges(graph_rewrite(ast, pm_simplify, name="beam_base"))

    def measure(opts: tuple[Opt, ...]) -> float:
        try:
            cand = ast.replace(arg=info.replace(opts=opts, dont_opt=False))
            return float(timer(to_program(cand, renderer)))
        except OptError:
            return math.inf

    best: list[tuple[float, tuple[Opt, ...]]] = [(measure(()), ())]
    seen: set[tuple[Opt, ...]] = {()}
    for _ in range(max_rounds):
        cands: list[tuple[float, tuple[Opt, ...]]] = []
        for _t, opts in best:
            try:
                cur = apply_opts(base, opts, renderer)
            except OptError:
                continue
            for a in candidate_actions(cur):
                nxt = opts + (a,)
                if nxt in seen:
                    continue
                seen.add(nxt)
                try:
                    apply_opts(cur, (a,), renderer)
                except OptError:
                    continue
                cands.append((measure(nxt), nxt))
        if not cands:
            break
        merged = sorted(best + cands, key=lambda x: (x[0], len(x[1])))[:width]
        if merged[0][0] >= best[0][0]:
            best = merged
            break
        best = merged
    winner = best[0][1]
    if use_cache and _cache_on():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([o.to_json() for o in winner]))
        tmp.replace(path)
    return winner
