"""LLVMCompiler: LLVM IR text -> relocatable x86-64 ELF object through llvmlite (no system toolchain needed)."""

from __future__ import annotations

import re
import threading
from typing import Any

from speck.codegen.compiler.base import Compiler, source_digest
from speck.codegen.compiler.pool import WorkerRecipe
from speck.codegen.errors import CodegenValueError, CompileError
from speck.codegen.settings import LLVM_PIPELINE, LLVM_QUICK, LLVM_UNROLL_THRESHOLD

_init_lock = threading.Lock()
_initialized = False

# The optimization pipeline run on speck kernels (pipeline="kernel", the default). speck's own passes already
# vectorized, unrolled and register-blocked the IR, so LLVM's O2 pipeline mostly re-derives what is there: the 107
# kernels of a cold CNN training step took 7.1 s CPU to optimize and emit with it (its SCEV-heavy loop passes -
# IndVarSimplify, LoopIdiom, the SLP vectorizer - walk every one of the hundreds of index expressions) and take
# 2.6 s with these passes, most of it the code generator's own; the step then runs within 1% of O2's speed. Each
# pass is here for a reason:
#   instruction_combine  first: canonicalizes `alloca float, i32 N` (how accumulators are declared) into an array
#                        alloca, which SROA can split; before it SROA leaves accumulators on the stack (4x slower)
#   sroa                 accumulators and other scalar allocas -> SSA registers (phis across loop iterations)
#   instruction_combine, simplify_cfg   fold what SROA exposed and merge the trivial blocks the renderer emits
#   loop_unroll          fully unrolls short constant loops (3x3 windows, edge guards): their gates fold to
#                        constants (padding kernels 2-3x faster) and loads get constant offsets
#   instruction_combine, simplify_cfg   clean up after unrolling
# No loop_rotate: the loops stay as the renderer writes them (exit test in the header). Rotating them (the exit test
# moved to the latch) is what let LLVM runtime-unroll a loop of unknown trip count, which it did in every module with
# more than one loop. Each kernel of the main job's CNN training step compiled with this pipeline (and
# UNROLL_THRESHOLD 200) and with the one before (loop_rotate, runtime unrolling where there is more than one loop,
# threshold 300), timed alone in one process, interleaved (best of 7; two copies of the same pipeline differed by
# < 1.5%): the kernels ran 0.9-2.0% faster in all (three runs) and compiled in 0.27-0.31 s less CPU (of ~2 s). The
# largest changes: the 6x6 weight gradient 7.1 -> 5.6 ms, the slowest ones a transpose 1.69 -> 1.90 ms and the
# fully connected layer's weight gradient 5.05 -> 5.28 ms. Matmul 256-1024, row sums and the MLP step: unchanged.
# A module without any vector type is one speck left scalar: it gets LLVM's standard pipeline instead, whose loop
# vectorizer may still widen it (such kernels are few and small in practice: 4 tiny ones in a CNN training run).
KERNEL_PASSES: tuple[str, ...] = (
    "instruction_combine", "sroa", "instruction_combine", "simplify_cfg",
    "loop_unroll", "instruction_combine", "simplify_cfg",
)  # fmt: skip
# Most of a compile is the code generator's (a cold CNN step's 104 modules: parse 0.07 s, these passes 0.36 s, object
# emission 0.9 s CPU, instruction selection the largest part), and it stays at level `opt` (2) with its default
# passes. Measured against that (emission CPU; each kernel of the warm step alone, bench/tools/step_kernels.py):
# codegen level 1 emits 4-5% faster, and the step's kernels ran 0-2% slower in all, a few small reductions 15-20%;
# -disable-lsr emits 17% faster, but the convolutions' kernels ran 11-17% slower (the 41 single-loop modules, where
# loop strength reduction has least to do, would save only 0.01 s of it).
# LLVM fully unrolls a constant loop when the unrolled body's estimated cost stays under this threshold (LLVM's own
# default is 150). A convolution's kernel-column loop (5 steps of 8 FMAs, 4 broadcasts and 2 loads, before cleanup)
# costs about 225: at 150 it stays a loop whose counter and branch cost 10 of its 18 instructions per step. With loops
# rotated, 300 ran the CNN step 2.4% faster than 150; without rotation (see KERNEL_PASSES) 200 and 300 ran its kernels
# equally fast (within 1%), 200 compiling them in ~0.2 s less CPU, and 150 was 0.5% slower to 1% faster in all. It is
# a process-wide LLVM option, set once.
# `$SPECK_LLVM_UNROLL_THRESHOLD` overrides it (read when LLVM is first initialized).
UNROLL_THRESHOLD = 200
# Runtime unrolling (of a loop whose trip count is not a constant) is off: see loop_rotate above. Set explicitly, so
# no LLVM default decides it; it is part of the flags (the cache key).
RUNTIME_UNROLL = "runtime-unroll=off"


# Kernels too small for optimization to pay compile at opt=QUICK_OPT: the LLVM backend's `compiler_for` picks
# LLVMCompiler(opt=QUICK_OPT) for a spec `quick_enough` passes. Such a kernel's run is its launch (~10 us on the CPU
# device), whatever its code. Measured on the main job's CNN training step, each of its 177 kernel launches compiled
# both ways and timed alone (best of 7, single-threaded): the 72 within these limits (Adam's updates of biases and
# small filters, the loss, the 10-class head) ran 0.03 ms slower in all, of the step's 74 ms (each difference within
# the timer's noise). A cold step compiles about 30 of its 130 distinct modules this way: ~0.1 s less LLVM CPU (of
# 1.4-1.9 s; bench/lowering_profile.py --llvm, LLVM_QUICK=1 against 0). Not opt=0, which saves about as much: its
# instruction selector does not fuse the renderer's `contract` multiply-adds into FMAs, so a small kernel would round
# `a * b + c` differently from the same expression in a big one (tests/tensor/test_quick_compile_numerics.py).
# Above these limits the cheaper compile starts to cost run time (2x-4x at opt=0 on the 1-2 MB reductions).
QUICK_OPT = 1
QUICK_OPS = 1 << 17  # ALU ops of one run (Estimates.ops)
QUICK_BYTES = 1 << 19  # bytes loaded (Estimates.lds) and global memory touched (Estimates.mem) by one run


def quick_enough(spec: Any) -> bool:
    """Whether a program spec's kernel is small enough to compile without optimization (see QUICK_OPS): its
    estimates are known (all three, not symbolic) and within the limits, and LLVM_QUICK is on."""
    est = getattr(spec, "estimates", None)
    if not LLVM_QUICK.value or est is None:
        return False
    ops, lds, mem = (getattr(est, k, None) for k in ("ops", "lds", "mem"))  # (a spec-like object may lack some)
    if not (isinstance(ops, int) and isinstance(lds, int) and isinstance(mem, int)):  # (symbolic: may be large)
        return False
    return ops <= QUICK_OPS and lds <= QUICK_BYTES and mem <= QUICK_BYTES


def _unroll_threshold() -> int:
    v = str(LLVM_UNROLL_THRESHOLD.value)
    if not v:
        return UNROLL_THRESHOLD
    if not v.isdigit():
        raise CodegenValueError(
            f"$SPECK_LLVM_UNROLL_THRESHOLD must be a non-negative integer (LLVM's default is 150), got {v!r}"
        )
    return int(v)


PIPELINES = ("kernel", "default")
_VECTOR_TYPE = re.compile(r"<\d+ x ")
_DEFINE = re.compile(r"^define [^@\n]*@([A-Za-z_.$][\w.$]*)\(", re.M)


def _llvm() -> Any:
    # llvmlite is imported lazily so `import speck.codegen` stays cheap and works without it for the C path
    global _initialized, UNROLL_THRESHOLD
    import llvmlite.binding as llvm

    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            UNROLL_THRESHOLD = _unroll_threshold()
            llvm.set_option("", f"-unroll-threshold={UNROLL_THRESHOLD}")
            llvm.set_option("", "-unroll-runtime=false")
            _initialized = True
    return llvm


def parse_module(src: str, compiler: str, triple: str, data_layout: str) -> Any:
    """Parse and verify LLVM IR text into a module for `triple`; CompileError (naming `compiler`) with LLVM's message
    when it is invalid. Each module gets a private LLVM context: the global one must not be shared across threads."""
    llvm = _llvm()
    try:
        mod = llvm.parse_assembly(src, context=llvm.create_context())
        mod.verify()
    except RuntimeError as e:
        raise CompileError(compiler, str(e), src) from None
    except UnicodeEncodeError as e:  # (llvmlite encodes the text as UTF-8: a lone surrogate can't be)
        raise CompileError(compiler, f"the source is not valid text ({e}); nothing was compiled", src) from None
    mod.triple = triple
    mod.data_layout = data_layout
    return mod


_all_targets = False


def llvm_all_targets() -> Any:
    """llvmlite with every target it was built with initialised (not just the host's): what a cross compiler for
    a GPU needs."""
    global _all_targets
    llvm = _llvm()
    with _init_lock:
        if not _all_targets:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _all_targets = True
    return llvm


_DIGEST: list[str] = []  # computed once per process


class LLVMCompiler(Compiler):
    """Compiles textual LLVM IR for the host CPU (its name and feature string from LLVM's host detection),
    optimizes it, and emits a position-independent (reloc=pic, small code model) relocatable ELF object with the
    code generator at level `opt`. `cpu`/`features` may be given to target another x86-64 CPU.

    `pipeline` picks the IR optimization: "kernel" (the default; `$SPECK_LLVM_PIPELINE` overrides it) runs the
    short pass list `KERNEL_PASSES`, documented pass by pass above, on modules speck already vectorized (speck's IR
    arrives vectorized and unrolled, and LLVM's full pipeline cost 10x the compile time for no measurable speed),
    and the standard pipeline on scalar ones. "default" runs the new pass manager's standard O`opt` pipeline (with
    loop and SLP vectorization) on everything. At O3 that pipeline's unroller fully unrolls small
    nested loops (a 50-step reduction inside the row loop took 10 s to optimize and emit, against 0.05 s at O2).
    opt=0 runs no IR passes at all. Every compile parses into its own LLVM context, so compilers may be used from
    several threads (llvmlite serializes the calls themselves)."""

    def __init__(self, opt: int = 2, cpu: str | None = None, features: str | None = None,
                 pipeline: str | None = None) -> None:  # fmt: skip
        if opt not in (0, 1, 2, 3):
            raise CodegenValueError(f"LLVMCompiler opt level must be 0..3, got {opt!r}")
        pipeline = pipeline if pipeline is not None else str(LLVM_PIPELINE.value) or "kernel"
        if pipeline not in PIPELINES:
            raise CodegenValueError(
                f"LLVMCompiler pipeline must be one of {', '.join(PIPELINES)} (from the argument or "
                f"$SPECK_LLVM_PIPELINE), got {pipeline!r}"
            )
        llvm = _llvm()
        self.opt, self.pipeline = opt, pipeline
        self.cpu = cpu if cpu is not None else llvm.get_host_cpu_name()
        self.features = features if features is not None else llvm.get_host_cpu_features().flatten()
        self.triple = llvm.get_process_triple()
        self.name = "llvm"
        passes = "passes=" + ",".join(KERNEL_PASSES) + "|scalar:default" if pipeline == "kernel" else "pipeline=default"
        unroll = f"unroll-threshold={UNROLL_THRESHOLD}"
        version = f"llvmlite-{_llvmlite_version()}"
        if not _DIGEST:  # (this module's code: an object cached by other compiler code is not reused)
            _DIGEST.append(source_digest(("compiler/llvm.py",)))
        self.flags = (f"O{opt}", self.triple, self.cpu, self.features, version, f"code={_DIGEST[0]}", unroll,
                      RUNTIME_UNROLL, passes)  # fmt: skip
        target = llvm.Target.from_triple(self.triple)
        self._tm = target.create_target_machine(
            cpu=self.cpu, features=self.features, opt=opt, reloc="pic", codemodel="small"
        )
        self._data_layout = str(self._tm.target_data)
        self._lock = threading.Lock()  # one compile at a time per compiler: its target machine is shared

    def worker_recipe(self) -> WorkerRecipe:
        """How a CompilePool worker process rebuilds this compiler (same flags, so the same objects)."""
        kwargs = (("opt", self.opt), ("cpu", self.cpu), ("features", self.features), ("pipeline", self.pipeline))
        env = (("SPECK_LLVM_UNROLL_THRESHOLD", str(UNROLL_THRESHOLD)),)
        return WorkerRecipe(type(self).__module__, type(self).__qualname__, kwargs, env, tuple(self.flags))

    def name_free(self, src: str) -> tuple[str, str] | None:
        """For a module speck's LLVM renderer made (one `define`, a first line `; kernel NAME...`): the source with
        NAME taken out of both, and NAME; None for any other module, or when NAME appears anywhere else."""
        m = _DEFINE.search(src)
        if m is None or src.count("define ") != 1:
            return None
        name = m.group(1)
        first, nl, rest = src.partition("\n")
        comment = f"; kernel {name}"
        if not (first == comment or first.startswith(comment + " ")):
            return None
        body = "; kernel \0" + first[len(comment) :] + nl + rest.replace(f"@{name}(", "@\0(", 1)
        return None if name in body else (body, name)

    def _optimized_module(self, src: str) -> Any:
        llvm = _llvm()
        mod = parse_module(src, "llvm (llvmlite)", self.triple, self._data_layout)
        if self.opt == 0:
            return mod
        pto = llvm.create_pipeline_tuning_options(speed_level=self.opt)
        if self.pipeline == "default" or not _VECTOR_TYPE.search(src):
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            pb = llvm.create_pass_builder(self._tm, pto)
            mpm = pb.getModulePassManager()
        else:
            pb = llvm.create_pass_builder(self._tm, pto)  # provides the analyses the passes ask for
            mpm = llvm.create_new_module_pass_manager()
            for name in KERNEL_PASSES:
                getattr(mpm, f"add_{name}_pass")()
        mpm.run(mod, pb)
        return mod

    def compile_uncached(self, src: str) -> bytes:
        """Parse, verify, optimize and emit an object. Raises CompileError carrying LLVM's message."""
        with self._lock:
            mod = self._optimized_module(src)
            return bytes(self._tm.emit_object(mod))

    def to_asm(self, src: str) -> str:
        """The optimized module as target assembly text (AT&T syntax, LLVM's own printer)."""
        with self._lock:
            return str(self._tm.emit_assembly(self._optimized_module(src)))


def _llvmlite_version() -> str:
    import llvmlite

    return str(llvmlite.__version__)
