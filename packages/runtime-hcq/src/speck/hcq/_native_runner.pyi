# The optional C extension speck.hcq._native_runner (source: _native_runner.c beside this file).
from typing import Any

def run_short(plan: Any, bufs: Any, var_vals: Any, wait: bool, timing: bool, count: bool, /) -> bool: ...
def setup(
    buffer: type,
    batch: type,
    signal: type,
    counts: Any,
    graph: type,
    graph_module: Any,
    debug: Any,
    profile: Any,
    native: Any,
    off: tuple[Any, ...],
    two: int,
    /,
) -> None: ...
def taken() -> int: ...
