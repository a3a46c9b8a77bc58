"""Where the main thread's CPU goes in a cold first CNN training step (issue 20: first step <= 1 s).

Builds the main job's model (batch 128, Adam, TinyJit, as bench/train.py), runs the first jitted step with
SPECK_CACHE_DIR at a fresh temporary directory (or the given one with --cache-dir, to measure a warm disk cache) and
reports the main thread's CPU seconds (time.thread_time: the compile pool's workers are other processes) split by
pipeline stage (speck.codegen.pipeline's stages, rendering, linearization, scheduling), with --profile the hottest
functions under cProfile, and with --dump FILE the rendered source of every kernel (to compare two checkouts).

With --llvm (LLVM sources only), every distinct source of the step is compiled again in this process after the step,
its LLVM CPU split into parse+verify, IR passes and object emission (the hottest kernels listed), and the step's wall
time on an idle 2-core host is estimated from CPU times (the machine is shared, so wall clocks mislead): the compile
worker takes the queue from its head from the first submit on (after booting), the main thread lowers, then takes the
queue from its tail (CompilePool.result), then loads and runs the kernels.

Run: python3 bench/lowering_profile.py [--model cnn] [--profile N] [--dump out.txt] [--cache-dir DIR] [--device D]
                                       [--llvm N]"""

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
    ap.add_argument("--llvm", type=int, default=-1, help="LLVM CPU per stage, the N slowest kernels, idle estimate")
    ap.add_argument("--boot", type=float, default=0.15, help="compile worker start-up (s) for the idle estimate")
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
    # (main-thread CPU at each compile submit, source, whether it is another's object renamed) for --llvm
    submits: list[tuple[float, str, bool, Any]] = []
    ahead_end = [0.0]
    c0 = 0.0
    if a.llvm >= 0:
        import speck.codegen.compiler.pool as pool

        orig_submit = pool.CompilePool.submit

        def submit(self: Any, compiler: Any, src: str) -> Any:
            fut = orig_submit(self, compiler, src)
            submits.append((time.thread_time() - c0, src, isinstance(fut, pool._Renamed), compiler))
            return fut

        pool.CompilePool.submit = submit  # type: ignore[method-assign]
        orig_ahead = realize._compile_ahead

        def ahead(*args: Any, **kw: Any) -> Any:
            try:
                return orig_ahead(*args, **kw)
            finally:
                ahead_end[0] = time.thread_time() - c0

        realize._compile_ahead = ahead
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
    if a.llvm >= 0:
        local_cpu = stats.get("cpu_s", 0.0) - stats.get("worker_cpu_s", 0.0)  # compiles the main thread did itself
        llvm_breakdown(submits, main_cpu - local_cpu, ahead_end[0], a.llvm, a.boot)
    if a.dump:
        with open(a.dump, "w") as f:
            for name, src in sources:
                f.write(f"=== {name}\n{src}\n")


def llvm_breakdown(submits: list[tuple[float, str, bool, Any]], main_cpu: float, ahead_end: float, top: int,
                   boot: float) -> None:  # fmt: skip
    """Compile each submitted source again here with the compiler it was submitted to, timed per LLVM stage, and
    estimate the idle-host wall time. `main_cpu`: the main thread's CPU in the step without the compiles it did
    itself."""
    jobs = [(t, src, c) for t, src, renamed, c in submits if not renamed and hasattr(c, "_optimized_module")]
    if not jobs:
        print("--llvm: no compiles were submitted (a warm cache, or not the LLVM backend)")
        return
    jobs[0][2].compile_uncached(jobs[0][1])  # (LLVM's one-time set-up in this process)
    levels: dict[str, int] = defaultdict(int)
    stage = {"parse+verify": 0.0, "IR passes": 0.0, "emit": 0.0}
    rows, cpu = [], []
    for _, src, c in jobs:
        levels[f"O{c.opt}"] += 1
        t0 = time.thread_time()
        mod = parse_only(c, src)
        t1 = time.thread_time()
        mod = c._optimized_module(src)  # (parses again: its parse is subtracted below)
        t2 = time.thread_time()
        c._tm.emit_object(mod)
        t3 = time.thread_time()
        parse, passes, emit = t1 - t0, max(0.0, (t2 - t1) - (t1 - t0)), t3 - t2
        stage["parse+verify"] += parse
        stage["IR passes"] += passes
        stage["emit"] += emit
        cpu.append(parse + passes + emit)
        name = src.split("\n", 1)[0].removeprefix("; kernel ")
        rows.append((parse + passes + emit, parse, passes, emit, name, len(src)))
    total = sum(cpu)
    print(
        f"LLVM: {len(jobs)} modules compiled ({', '.join(f'{v} at {k}' for k, v in sorted(levels.items()))}), "
        f"{total:.3f} s CPU: " + ", ".join(f"{k} {v:.3f} s" for k, v in stage.items())
    )
    for tot, parse, passes, emit, name, size in sorted(rows, reverse=True)[:top]:
        print(f"  {1e3 * tot:7.1f} ms  (parse {1e3 * parse:5.1f}, passes {1e3 * passes:5.1f}, emit {1e3 * emit:6.1f})"
              f"  {name} ({size} bytes of IR)")  # fmt: skip
    # idle 2-core estimate: the worker from the head (from the first submit + boot), the main thread from the tail
    # once its lowering is done; what the main thread does after that (load, run) follows the last object
    head, tail = 0, len(jobs) - 1
    worker, caller, stolen = jobs[0][0] + boot, ahead_end, 0.0
    while head <= tail:
        if worker <= caller:
            worker = max(worker, jobs[head][0]) + cpu[head]
            head += 1
        else:
            caller += cpu[tail]
            stolen += cpu[tail]
            tail -= 1
    after = max(0.0, main_cpu - ahead_end)  # (the step's own CPU after lowering: loading, running)
    nosteal = jobs[0][0] + boot
    for (t, _, _), c_ in zip(jobs, cpu):
        nosteal = max(nosteal, t) + c_
    print(
        f"idle 2-core estimate: lowering done at {ahead_end:.2f} s, last object at {max(worker, caller):.2f} s "
        f"({stolen:.2f} s of it compiled by the main thread), then {after:.2f} s: first step ~"
        f"{max(worker, caller) + after:.2f} s (a worker alone: ~{max(nosteal, ahead_end) + after:.2f} s)"
    )


def parse_only(c: Any, src: str) -> Any:
    from speck.codegen.compiler.llvm import parse_module

    return parse_module(src, "llvm", c.triple, c._data_layout)


if __name__ == "__main__":
    main()
