"""Hostile round 4, settings from the environment: a junk value is a clear error naming the variable, what it
takes and what to do, at the first use; never a traceback from int()/to_dtype deep inside (DEFAULT_FLOAT=bogus
was an UnknownDTypeError naming no setting, SEED past 64 bits a bare OverflowError at the first rand, a negative
or infinite CPU_MEM_LIMIT an out-of-memory error or a bare OverflowError, REWRITE_LIMIT=0 a rewrite loop error on
the first kernel, SPECK_COMPILE_THREADS=100000 "can't start new thread", USB_KERNEL_TIMEOUT=-1 or inf an error
naming only "timeout" at the first USB kernel)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.compiler.pool import MAX_LANES, CompilePool
from speck.hcq.allocator import parse_bytes
from speck.hcq.errors import HCQValueError

PROGRAM = """
from speck.tensor import Tensor, nn
a = Tensor.rand(8, 8)
print(((a @ a).sum() + Tensor([1, 2]).sum()).numpy() is not None, nn.optim.OPTIM_DTYPE)
"""

# env -> (the error class's name, words its message must hold); "" class: runs and prints True
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "DEBUG=abc": ("SettingError", ("DEBUG='abc'", "integer")),
    "JIT=2.5": ("SettingError", ("JIT='2.5'", "integer")),
    "BEAM=1e9": ("SettingError", ("BEAM=", "integer")),
    "DEFAULT_FLOAT=bogus": ("SettingError", ("DEFAULT_FLOAT='bogus'", "names no dtype", "float32")),
    "DEFAULT_INT=bogus": ("SettingError", ("DEFAULT_INT='bogus'", "names no dtype", "int32")),
    "DEFAULT_FLOAT=int8": ("SettingError", ("DEFAULT_FLOAT='int8'", "float")),
    "OPTIM_DTYPE=junk": ("SettingError", ("OPTIM_DTYPE='junk'", "names no dtype")),
    "CPU_MEM_LIMIT=-5": ("HCQValueError", ("CPU_MEM_LIMIT='-5'", "byte count", "512M")),
    "CPU_MEM_LIMIT=inf": ("HCQValueError", ("CPU_MEM_LIMIT='inf'", "byte count")),
    "REWRITE_LIMIT=0": ("SettingError", ("REWRITE_LIMIT=0", "below 1")),
    "USB_KERNEL_TIMEOUT=-1": ("SettingError", ("USB_KERNEL_TIMEOUT=-1.0", "below 0")),
    "USB_KERNEL_TIMEOUT=inf": ("SettingError", ("USB_KERNEL_TIMEOUT=inf", "above")),
    "SEED=99999999999999999999999": ("", ()),
    "SPECK_COMPILE_THREADS=100000": ("", ()),
}


def _run(env: str) -> subprocess.CompletedProcess[str]:
    name, _, value = env.partition("=")
    e = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    e[name] = value
    return subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=e, timeout=300)


@pytest.mark.parametrize("env", sorted(CASES))
def test_a_junk_setting_is_a_clear_error_naming_it(env: str) -> None:
    cls, words = CASES[env]
    proc = _run(env)
    if not cls:
        assert proc.returncode == 0 and proc.stdout.startswith("True"), proc.stderr[-2000:]
        return
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.split(":")[0].endswith("." + cls), proc.stderr[-2000:]
    for w in words:
        assert w in last, f"{w!r} not in {last!r}"


@pytest.mark.parametrize("text", ["-1", "-2G", "inf", "-inf", "nan", "1e400", "lots", ""])
def test_parse_bytes_refuses_what_is_no_byte_count(text: str) -> None:
    with pytest.raises(HCQValueError, match="CPU_MEM_LIMIT=.*byte count"):
        parse_bytes(text, "CPU_MEM_LIMIT")


@given(st.integers(0, 2**40), st.sampled_from([("", 1), ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)]))
def test_parse_bytes_reads_counts_and_binary_multiples(n: int, unit: tuple[str, int]) -> None:
    assert parse_bytes(f"{n}{unit[0]}") == n * unit[1]


@pytest.mark.parametrize("lanes", [MAX_LANES + 1, 100000, 2**62])
def test_compile_lanes_are_capped(lanes: int) -> None:
    pool = CompilePool(lanes)
    try:
        assert pool.lanes == MAX_LANES
    finally:
        pool.shutdown()
