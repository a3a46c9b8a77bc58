"""The realize engine under tinygrad's module name. The code that runs schedules is speck.tensor.realize; this module
adds tinygrad's object view of it: a `Runner` per kind of call (`CompiledRunner` for a kernel, `BufferCopy` for a
copy between buffers), an `ExecItem` (a runner with its buffers) per scheduled call, and `lower_schedule` turning
ScheduleItems into ExecItems. Running an ExecItem goes through the same path as every realize (counters, DEBUG
lines, TinyJit recording)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from speck.codegen.kernel_info import Estimates, kernel_name
from speck.hcq.runner import Copy, Exec, Host
from speck.tensor import realize as _realize
from speck.tensor.codegen import get_program
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import ScheduleItem
from speck.uop import UOp


class Runner:
    """Something a scheduled call runs: `display_name`, the `device` it runs on, and a call over raw buffers."""

    def __init__(self, display_name: str, device: str) -> None:
        self.display_name, self.device = display_name, device

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.display_name} on {self.device}>"


class CompiledRunner(Runner):
    """A compiled kernel (or, where codegen could not compile it, the numpy evaluator standing in for one): `call`
    is its runner call over its own arguments, `slots` which of a ScheduleItem's buffers those are. `p` is the
    codegen ProgramSpec when there is one; `prg` the compiled program."""

    def __init__(self, program: Any, device: str, call: Any = None, slots: tuple[int, ...] = ()) -> None:
        super().__init__(program.name, device)
        self.prg, self.call, self.slots = program, call, slots
        self.p = getattr(program, "spec", None)

    @property
    def estimates(self) -> Estimates:
        """The program's cost estimates (ops, global memory touched, bytes loaded); zeros without a ProgramSpec."""
        return getattr(self.p, "estimates", None) or Estimates()

    def __call__(self, bufs: list[UOp], var_vals: dict[str, int] | None = None, wait: bool = False) -> float:
        if self.call is None:  # a kernel of a schedule: bufs in its PARAM order
            _realize.execute([ScheduleItem(self.prg.ast, tuple(bufs), dict(var_vals or {}))])
        else:  # a captured call: bufs in its argument order
            _realize.run_entries([(self.call, tuple(bufs[s] for s in self.slots))], var_vals)
        return 0.0


class BufferCopy(Runner):
    """A copy of one buffer's contents into another (between devices, or within one)."""

    def __init__(self, nbytes: int, dest_device: str, src_device: str) -> None:
        super().__init__(f"copy {nbytes:8d}, {dest_device[:7]:>7s} <- {src_device[:7]:7s}", dest_device)
        self.nbytes = nbytes

    @property
    def estimates(self) -> Estimates:
        """A copy moves its bytes and computes nothing."""
        return Estimates(0, self.nbytes, self.nbytes)


@dataclass
class ExecItem:
    """A runner and the BUFFERs it works on, from one ScheduleItem `si`; `run()` executes it (counted like any
    scheduled call; var_vals overrides the Variables' values the schedule bound)."""

    prg: Runner
    bufs: list[UOp]
    si: ScheduleItem
    metadata: tuple[Any, ...] = field(default_factory=tuple)

    def run(self, var_vals: dict[str, int] | None = None, wait: bool = False, jit: bool = False,
            do_update_stats: bool = True) -> float | None:  # fmt: skip
        si = self.si
        if var_vals:
            si = ScheduleItem(si.ast, si.bufs, {**si.var_vals, **var_vals}, si.copy_offset)
        _realize.execute([si])
        return None


def _device(buf: UOp) -> str:
    return str(buf.src[1].arg)


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled kernel for `ast` on `device` (compiled once, then cached)."""
    return CompiledRunner(_realize.program(device, ast), device)


def lower_schedule_item(si: ScheduleItem) -> ExecItem:
    """The ExecItem running `si`."""
    if si.ast is None:
        dst, src = si.bufs
        prg: Runner = BufferCopy(int(dst.arg) * dst.dtype.itemsize, _device(dst), _device(src))
    else:
        prg = get_runner(_device(si.bufs[0]), si.ast)
    return ExecItem(prg, list(si.bufs), si)


def lower_schedule(schedule: list[ScheduleItem]) -> Iterator[tuple[ScheduleItem, ExecItem]]:
    """(ScheduleItem, ExecItem) pairs for a schedule, consuming it from the front (as tinygrad's does)."""
    while schedule:
        si = schedule.pop(0)
        yield si, lower_schedule_item(si)


def run_schedule(schedule: list[ScheduleItem], var_vals: dict[str, int] | None = None,
                 do_update_stats: bool = True) -> None:  # fmt: skip
    """Execute a schedule in order (its Variables at var_vals where given)."""
    if var_vals:
        schedule = [ScheduleItem(si.ast, si.bufs, {**si.var_vals, **var_vals}, si.copy_offset) for si in schedule]
    _realize.execute(list(schedule))


def exec_items(jit_cache: list[tuple[Any, tuple[UOp, ...]]]) -> list[ExecItem]:
    """A TinyJit capture's recorded calls as ExecItems (its `jit_cache`)."""
    out: list[ExecItem] = []
    for call, bufs in jit_cache:
        if isinstance(call, Copy):
            dst, src = bufs[call.dst], bufs[call.src]
            runner: Runner = BufferCopy(call.nbytes, _device(dst), _device(src))
            si = ScheduleItem(None, (dst, src), {}, call.offset // max(src.dtype.itemsize, 1))
        elif isinstance(call, Host) and not call.kernel:  # a host function (an MPI collective)
            runner, si = Runner(call.name, _device(bufs[0]) if bufs else ""), ScheduleItem(None, ())
        else:
            prog = call.program if isinstance(call, Exec) else call.fn
            runner = CompiledRunner(prog, _device(bufs[0]), call, tuple(range(len(bufs))))
            spec = getattr(prog, "spec", None)  # a device Program's ProgramSpec holds the kernel AST
            si = ScheduleItem(getattr(spec, "ast", None), tuple(bufs), dict(getattr(call, "vals", ())))
        out.append(ExecItem(runner, list(bufs), si))
    return out


class _Capturing(Sequence[Any]):
    """tinygrad's `capturing` list, read-only: one entry (the list of calls being recorded) while a TinyJit captures
    and CAPTURING is on, else empty, so `if capturing:` tells whether realizations are being recorded. Captures are
    started by TinyJit only; appending a capturer of one's own is not supported."""

    def _current(self) -> list[Any]:
        rec = _realize.recording()
        return [] if rec is None else [rec]

    def __len__(self) -> int:
        return len(self._current())

    def __getitem__(self, i: Any) -> Any:
        return self._current()[i]

    def __repr__(self) -> str:
        return f"capturing({'recording' if self else 'idle'})"


capturing = _Capturing()
# the compiled programs, keyed by (device, kernel AST); clearing it makes the next realization compile again
method_cache = _realize._program_cache


__all__ = [
    "BufferCopy", "CompiledRunner", "ExecItem", "Runner", "exec_items", "get_buffer", "get_runner",
    "capturing", "get_program", "kernel_name", "method_cache", "lower_schedule", "lower_schedule_item", "run_schedule",
]  # fmt: skip
