"""Where the main thread's CPU goes in a cold first CNN training step (issue 20: first step <= 1 s).

Builds the main job's model (batch 128, Adam, TinyJit, as bench/train.py), runs the first jitted step with
SPECK_CACHE_DIR at a fresh temporary directory (or the given one with --cache-dir, to measure a warm disk cache) and
reports the main thread's CPU seconds (time.thread_time: the compile pool's workers are other processes) split by
pipeline stage (speck.codegen.pipeline's stages, rendering, linearization, scheduling), with --profile the hottest
functions under cProfile, and with --dump FILE the rendered source of every kernel (to compare two checkouts).

Run: python3 bench/lowering_profile.py [--model cnn] [--profile N] [--dump out.txt] [--cache-dir DIR] [--device D]"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--profile", type=int, default=0, help="print the N hottest functions (cProfile, tottime)")
    ap.add_argument("--dump", default="", help="write every kernel's rendered source to this file")
    ap.add_argument("--cache-dir", default="", help="use this compile cache (default: a fresh temporary one)")
    ap.add_argument("--device", default="", help="DEV, e.g. CPU:X86")
    a = ap.parse_args()
    os.environ["SPECK_CACHE_DIR"] = a.cache_dir or tempfile.mkdtemp(prefix="speck-lowering-")
    if a.device:
        os.environ["DEV"] = a.device
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train import make_step

    try:
        import speck.codegen.lowered_cache as lowered_cache
    except ImportError:  # a checkout from before the lowered-kernel cache (bench/tools/compare_lowering.py runs those)
        lowered_cache = None
    import speck.codegen.pipeline as pipeline
    import speck.codegen.program as program
    import speck.tensor.realize as realize

    stages: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    sources: list[tuple[str, str]] = []

    # stage CPU: _Stages.done is called at the end of each stage; charge the time since the previous mark
    mark = [0.0]
    orig_init, orig_done = pipeline._Stages.__init__, pipeline._Stages.done

    def init(self: Any, name: str) -> None:
        orig_init(self, name)
        mark[0] = time.thread_time()

    def done(self: Any, stage: str, g: Any) -> Any:
        now = time.thread_time()
        stages[stage] += now - mark[0]
        counts[stage] += 1
        r = orig_done(self, stage, g)
        mark[0] = time.thread_time()
        return r

    pipeline._Stages.__init__, pipeline._Stages.done = init, done  # type: ignore[method-assign]

    def timed(mod: Any, attr: str, label: str) -> None:
        fn = getattr(mod, attr)

        def wrapper(*args: Any, **kw: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*args, **kw)
            finally:
                stages[label] += time.thread_time() - t
                counts[label] += 1

        setattr(mod, attr, wrapper)

    timed(pipeline, "linearize", "linearize")
    for attr in ("lowered_key", "get", "put") if lowered_cache is not None else ():
        timed(lowered_cache, attr, f"lowered cache: {attr}")
    timed(realize, "_compile_ahead", "TOTAL lower+render (compile_ahead)")
    orig_to_program = program.to_program

    def to_program(ast: Any, renderer: Any, *args: Any, **kw: Any) -> Any:
        orig_render = renderer.render

        def render(uops: Any) -> Any:
            t = time.thread_time()
            src = orig_render(uops)
            stages["render"] += time.thread_time() - t
            counts["render"] += 1
            return src

        renderer.render = render
        try:
            t = time.thread_time()
            spec = orig_to_program(ast, renderer, *args, **kw)
            stages["to_program"] += time.thread_time() - t
            counts["to_program"] += 1
            sources.append((spec.name, spec.src))  # also when the lowered-kernel cache served it
            return spec
        finally:
            del renderer.render

    program.to_program = to_program
    step = make_step(a.model, a.batch)  # builds and initialises the model: its kernels are not counted
    stages.clear()
    counts.clear()
    sources.clear()
    prof = cProfile.Profile(time.thread_time) if a.profile else None  # CPU time: the host is shared
    c0 = time.thread_time()
    if prof:
        prof.enable()
    step().item()
    if prof:
        prof.disable()
    main_cpu = time.thread_time() - c0
    stats = realize.compile_pool_stats()
    if lowered_cache is not None:
        t = time.thread_time()
        flushed = lowered_cache.flush()
        print(f"lowered-kernel cache: {flushed} entries written after the step in {time.thread_time() - t:.3f} s CPU")
    print(
        f"first {a.model} step: main thread {main_cpu:.3f} s CPU; {len(sources)} kernels lowered, "
        f"{counts['render']} rendered; "
        f"compile pool {stats.get('submitted', 0):.0f} compiles ({stats.get('shared', 0):.0f} of them another's "
        f"object renamed), {stats.get('cpu_s', 0):.2f} s CPU"
    )
    total = stages["to_program"]
    stages["outside to_program (schedule, run, jit)"] = main_cpu - total
    print(f"{'stage':36s} {'calls':>6s} {'CPU s':>8s} {'ms/kernel':>10s} {'% lower':>8s}")
    for k, v in sorted(stages.items(), key=lambda kv: -kv[1]):
        n = max(1, len(sources))
        print(f"{k:36s} {counts[k]:6d} {v:8.3f} {1e3 * v / n:10.2f} {100 * v / total if total else 0:7.1f}%")
    if prof:
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(a.profile)
        st.sort_stats("cumtime").print_stats(a.profile)
        st.sort_stats("tottime").print_callers(12)
    if a.dump:
        with open(a.dump, "w") as f:
            for name, src in sources:
                f.write(f"=== {name}\n{src}\n")


if __name__ == "__main__":
    main()
