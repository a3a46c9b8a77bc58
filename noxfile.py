"""nox sessions for the speck monorepo: one test session per package, plus lint, typecheck, bench, demo and
check_versions. Each session installs only what it needs: the package under test and the packages below it."""

from __future__ import annotations

import pathlib
import re
import shutil
import tomllib

import nox

nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["tests", "lint", "typecheck", "check_versions", "docs"]

ROOT = pathlib.Path(__file__).parent
# package folder -> (import name, sibling folders it depends on), bottom of the stack first
PACKAGES: dict[str, tuple[str, list[str]]] = {
    "uop": ("uop", []),
    "codegen": ("codegen", ["uop"]),
    "runtime-hcq": ("hcq", ["uop", "codegen"]),
    "usbgpu": ("usbgpu", []),
    "tensor": ("tensor", ["uop", "codegen", "runtime-hcq"]),
}
EXISTING = [p for p in PACKAGES if (ROOT / "packages" / p / "pyproject.toml").exists()]
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "numpy>=1.24"]  # numpy is the numeric reference in tests
# the C backend must work with both compilers (gcc 12 has _Float16 on x86, clang 14 has not): these sessions run their
# c_backend-marked tests under each
C_COMPILERS = ("gcc", "clang")
C_BACKEND_SESSIONS = ("codegen", "runtime-hcq", "tensor")
# usbgpu's tests also build its sdist and wheel (offline: no build isolation), draw the CLI's progress bar and compile
# the RDNA3 emulator's test kernels with llvmlite (linked by LLVM 16's ld.lld, which the README's command installs);
# codegen's and hcq's AMD code-object tests decode the metadata note with msgpack (next to speck's own decoder, and
# LLVM 16's llvm-objdump/ld.lld/llvm-readelf, which the README's test command installs with apt), and codegen's run
# its code objects on the RDNA3 emulator (speck-usbgpu[sim], a test tool: codegen never imports usbgpu)
EXTRA_TEST_TOOLS = {"usbgpu": ["build>=1", "setuptools>=64", "wheel", "tqdm>=4.60", "llvmlite>=0.42"],
                    "codegen": ["msgpack>=1", "-e", "packages/usbgpu[sim]"], "runtime-hcq": ["msgpack>=1"]}  # fmt: skip


def _editable(folders: list[str]) -> list[str]:
    args: list[str] = []
    for f in folders:
        args += ["-e", f"packages/{f}"]
    return args


@nox.session
@nox.parametrize("package", EXISTING + ["integration", "tensor-mpi"])
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests with only it and the packages below it installed (tensor-mpi: the MPI jobs).

    tensor-mpi runs the tensor tests marked `mpi` (mpiexec -n 2 on localhost) with speck-tensor[mpi] installed:
    mpi4py and Open MPI from PyPI; the tensor session leaves them out."""
    marker: list[str] = []
    if package == "integration":
        folders, test_dir = EXISTING, "tests/integration"
    elif package == "tensor-mpi":
        folders, test_dir, marker = PACKAGES["tensor"][1], "tests/tensor", ["-m", "mpi"]
        session.install(
            *_editable(folders), "-e", "packages/tensor[mpi]", *TEST_TOOLS, *EXTRA_TEST_TOOLS.get("tensor", [])
        )
    else:
        folders, test_dir = PACKAGES[package][1] + [package], f"tests/{PACKAGES[package][0]}"
        marker = ["-m", "not mpi"] if package == "tensor" else []
    if package != "tensor-mpi":
        session.install(*_editable(folders), *TEST_TOOLS, *EXTRA_TEST_TOOLS.get(package, []))
    env = {"HYPOTHESIS_PROFILE": "ci", "SPEC": "1"}
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs, env=env)
        return
    base = ["-q", "-p", "no:cacheprovider"]
    if package not in C_BACKEND_SESSIONS:
        session.run("python", "-m", "pytest", *base, *marker, test_dir, env=env)
        return
    # the tests marked c_backend run once per C compiler (CC picks it); the rest once
    also = f" and {marker[1]}" if marker else ""
    session.run("python", "-m", "pytest", *base, "-m", f"not c_backend{also}", test_dir, env=env)
    for cc in C_COMPILERS:
        if shutil.which(cc) is None:
            session.error(f"{cc} is not installed: the C backend is tested with {' and '.join(C_COMPILERS)} (the "
                          "README's test command installs both)")  # fmt: skip
        session.run("python", "-m", "pytest", *base, "-m", f"c_backend{also}", test_dir, env={**env, "CC": cc})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint (with banned imports enforcing the package layering) and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package (strict for speck.uop)."""
    session.install(*_editable(EXISTING), "mypy>=1.10", *TEST_TOOLS)
    session.run("mypy", *[f"packages/{p}/src" for p in EXISTING])


BENCH_TOOLS = ["numpy", "threadpoolctl"]  # threadpoolctl: which BLAS kernel numpy runs (bench/_host.py prints it)
# the benchmarks' environment: numpy's real OpenBLAS kernels, not the machine's Haswell override (bench/_host.py
# also removes these in-process, before numpy loads, for runs outside nox)
BENCH_ENV = {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs-material + mkdocstrings) into build/site; warnings are errors."""
    session.install("mkdocs-material>=9.5", "mkdocstrings[python]>=0.26")
    session.run("mkdocs", "build", "--strict", "--clean", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark in bench/ (not the PyTorch comparison: bench_peers) and print its table."""
    session.install(*_editable(EXISTING), *BENCH_TOOLS)
    session.install("-e", "packages/tensor[mpi]")  # bench/multidevice.py measures MPI's allreduce too
    for script in sorted((ROOT / "bench").glob("*.py")):
        if script.name.startswith("_") or script.name == "peers.py":
            continue
        session.run("python", str(script), *session.posargs, env=BENCH_ENV)


# pip, not uv: PyTorch's CPU wheel lies on this machine's disk (pip's find-links); uv would download a CUDA build
@nox.session(venv_backend="venv")
def bench_peers(session: nox.Session) -> None:
    """speck beside numpy and PyTorch (CPU wheel, installed into this session only), with each target marked."""
    session.install(*_editable(EXISTING), *BENCH_TOOLS, "torch==2.13.0")
    session.run("python", str(ROOT / "bench" / "peers.py"), *session.posargs, env=BENCH_ENV)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train the small CNN on Fashion-MNIST on the default CPU device."""
    session.install(*_editable(PACKAGES["tensor"][1] + ["tensor"]))
    session.run("python", "-m", "speck.tensor.examples.train", *session.posargs)


def _version(folder: str) -> tuple[int, ...]:
    mod = PACKAGES[folder][0]
    text = (ROOT / "packages" / folder / "src" / "speck" / mod / "_version.py").read_text()
    m = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    assert m is not None, f"no __version__ in {folder}"
    return tuple(int(x) for x in m.group(1).split(".")[:3])


@nox.session(venv_backend="none")
def check_versions(session: nox.Session) -> None:
    """Fail when a package's declared floor on a sibling is above that sibling's current version."""
    dist_to_folder = {f"speck-{f}": f for f in EXISTING}
    problems = []
    for folder in EXISTING:
        meta = tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())["project"]
        deps = list(meta.get("dependencies", []))
        for extra in meta.get("optional-dependencies", {}).values():
            deps += extra
        for dep in deps:
            m = re.match(r"(speck-[a-z-]+)\s*>=\s*([0-9.]+)", dep)
            if m is None or m.group(1) not in dist_to_folder:
                continue
            floor = tuple(int(x) for x in m.group(2).split("."))
            current = _version(dist_to_folder[m.group(1)])
            if floor > current:
                problems.append(f"{folder} requires {m.group(1)}>={m.group(2)} but the sibling is at {current}")
    if problems:
        session.error("sibling version floors not satisfied:\n  " + "\n  ".join(problems))
    session.log(f"version floors ok for {', '.join(EXISTING)}")
