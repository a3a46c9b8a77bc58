"""speck.codegen's settings (see speck.uop.settings for the table they join)."""

from __future__ import annotations

from speck.uop.settings import declare

OWNER = "speck.codegen"
BEAM = declare(
    "BEAM",
    0,
    OWNER,
    ("speck.codegen.opt.search", "speck.codegen.program"),
    "beam width of the kernel-optimization search (>= 1 enables it; winners cached on disk)",
)
NOOPT = declare(
    "NOOPT",
    0,
    OWNER,
    ("speck.codegen.opt",),
    "1: no heuristic optimizations (explicit opts and BEAM still apply)",
)
BEAM_TIMEOUT = declare("BEAM_TIMEOUT", 60.0, OWNER, ("speck.codegen.opt.search",), "seconds of search per kernel")
IGNORE_BEAM_CACHE = declare(
    "IGNORE_BEAM_CACHE",
    0,
    OWNER,
    ("speck.codegen.opt.search",),
    "1: search again instead of reading cached BEAM winners",
)
TRANSCENDENTAL = declare(
    "TRANSCENDENTAL",
    1,
    OWNER,
    ("speck.codegen.lower.decompositions",),
    ">= 2: software exp2/log2/sin/sqrt everywhere; 0 and 1: only where a backend lacks them",
)
X86_AVX512 = declare(
    "X86_AVX512", 1, OWNER, ("speck.codegen.cpu_features",), "0: the x86 backend keeps to AVX2 on a CPU with AVX-512"
)
LLVM_VECTOR_BYTES = declare(
    "LLVM_VECTOR_BYTES",
    0,
    OWNER,
    ("speck.codegen.cpu_features",),
    "widest vector the LLVM renderer emits when it is made: 16, 32 (AVX2) or 64 (AVX-512); 0: the host's widest",
)
FP_CONTRACT = declare(
    "FP_CONTRACT",
    1,
    OWNER,
    ("speck.codegen.backends",),
    "1: renderers may fuse a*b+c into one FMA (as BLAS libraries do); 0: never",
)
CACHE_DIR = declare(
    "SPECK_CACHE_DIR",
    "",
    OWNER,
    ("speck.codegen.cache.store", "speck.codegen.cache.cli"),
    "where the on-disk caches live (default ~/.cache/speck)",
    live=True,
)
LLVM_UNROLL_THRESHOLD = declare(
    "SPECK_LLVM_UNROLL_THRESHOLD",
    "",
    OWNER,
    ("speck.codegen.compiler.llvm",),
    "LLVM's loop-unroll threshold for kernels (an integer; default speck's)",
    live=True,
)
LLVM_PIPELINE = declare(
    "SPECK_LLVM_PIPELINE",
    "",
    OWNER,
    ("speck.codegen.compiler.llvm",),
    "the LLVM pass pipeline kernels compile with (default 'kernel')",
    live=True,
)
LLVM_QUICK = declare(
    "LLVM_QUICK",
    1,
    OWNER,
    ("speck.codegen.compiler.llvm",),
    "1: the LLVM backend compiles kernels too small for optimization to pay at opt=1 (see quick_enough); 0: never",
    minimum=0,
    maximum=1,
)
CC = declare("CC", "", OWNER, ("speck.codegen.compiler.clang",), "the C compiler (default clang, else gcc)", live=True)
OBJDUMP = declare(
    "OBJDUMP", "objdump", OWNER, ("speck.codegen.compiler.base",), "binutils' objdump (disassembly)", live=True
)
LLVM_OBJDUMP = declare(
    "LLVM_OBJDUMP",
    "",
    OWNER,
    ("speck.codegen.compiler.amdgpu",),
    "the llvm-objdump disassembling AMD code objects",
    live=True,
)
