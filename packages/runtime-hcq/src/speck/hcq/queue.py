"""Hardware command queues and the engines that execute them.

An `HWQueue` records commands (exec / copy / signal / wait / timestamp / barrier); `submit(device)` writes them
into one of the device's engines (its "ring") and rings the doorbell. An `Engine` executes submissions strictly in
order. For the CPU the "hardware" is this executor: when the engine is idle the submitting thread executes the
commands itself (no wake-up cost: this is what keeps an empty kernel's round trip in the microseconds); if a wait
cannot be satisfied yet, or the engine is busy, the rest is handed to the engine's own background thread. Every
engine owns a timeline signal it sets to the submission's sequence number when a submission completes, which is
what `Device.synchronize` waits on."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from speck.hcq.errors import HCQError
from speck.hcq.signal import Signal

if TYPE_CHECKING:
    from typing import Self

EXEC, COPY, SIGNAL, WAIT, TIMESTAMP, BARRIER = range(6)
OP_NAMES = ("exec", "copy", "signal", "wait", "timestamp", "barrier")
Command = tuple[Any, ...]


class CommandTarget(Protocol):
    """What an engine needs from its device to run the device-specific commands."""

    name: str

    def _copy(self, dest: Any, src: Any, nbytes: int) -> None: ...


@dataclass(frozen=True)
class ProfileEvent:
    """One executed command under PROFILE=1: device, engine, command kind, name (the kernel's for exec) and its
    start/end in perf_counter_ns (monotonic)."""

    device: str
    engine: str
    kind: str
    name: str
    start_ns: int
    end_ns: int


class Submission(list):  # type: ignore[type-arg]
    """A copy of a queue's commands made for one submission: the engine empties it once done, so the buffers its
    commands name are free as soon as the submission completes."""


class HWQueue:
    """A list of commands for one engine ("compute" or "copy"); the builder methods return the queue so they chain:
    `HWQueue().wait(s, 1).exec(prog, args, (n, 1, 1)).signal(s, 2).submit(dev)`. A queue may be submitted more
    than once (each submission runs all its commands again)."""

    __slots__ = ("cmds", "engine")

    def __init__(self, engine: str = "compute") -> None:
        self.cmds: list[Command] = []
        self.engine = engine

    def exec(
        self, prog: Any, args: tuple[Any, ...], global_size: tuple[int, ...] = (1, 1, 1), threads: int | None = None
    ) -> Self:
        """Run program `prog` with its raw argument tuple (see Program.raw_args) over `global_size`; `threads`
        forces a worker count (None: the device decides)."""
        self.cmds.append((EXEC, prog, args, global_size, threads))
        return self

    def copy(self, dest: Any, src: Any, nbytes: int) -> Self:
        """Copy `nbytes` from `src` to `dest` (device addresses, or Buffers)."""
        self.cmds.append((COPY, dest, src, nbytes))
        return self

    def signal(self, sig: Signal, value: int) -> Self:
        """Set `sig` to `value` once every earlier command of this queue has completed."""
        self.cmds.append((SIGNAL, sig, value))
        return self

    def wait(self, sig: Signal, value: int) -> Self:
        """Do not start later commands before `sig` reaches `value`."""
        self.cmds.append((WAIT, sig, value))
        return self

    def timestamp(self, sig: Signal) -> Self:
        """Write the current monotonic time into `sig.timestamp` (value unchanged)."""
        self.cmds.append((TIMESTAMP, sig))
        return self

    def barrier(self) -> Self:
        """Make later commands see every earlier command's memory effects. CPU engines execute in order and each
        command completes before the next starts, so this is a no-op kept for the same queue code on every device."""
        self.cmds.append((BARRIER,))
        return self

    def submit(self, device: Any, background: bool = False) -> Self:
        """Write the commands into `device`'s engine and ring its doorbell. Execution may have finished when this
        returns (idle CPU engine) or may continue asynchronously; order with signals or device.synchronize().
        `background=True` never runs the commands on the calling thread (a copy between devices then overlaps with
        what the caller does next)."""
        device.engines[self.engine].submit(Submission(self.cmds), background)
        return self


class Engine:
    """An in-order command processor of one device ("compute" or "copy"). Submissions get sequence numbers 1, 2, ...;
    `timeline` reaches n when submission n has completed. An error in a background submission is latched and
    raised by the next `Device.synchronize`; one in an inline submission is raised by `submit` itself. Either way
    the signals the failed submission would have set are failed, so nobody waits on them forever."""

    def __init__(self, device: CommandTarget, kind: str) -> None:
        self.device, self.kind = device, kind
        self.timeline = Signal(0, name=f"{device.name}:{kind}:timeline")
        self.submitted = 0
        self.error: BaseException | None = None
        self.profile = False
        self.events: list[ProfileEvent] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: deque[tuple[list[Command], int, int]] = deque()
        self._busy = False
        self._bg_go = False
        self._thread: threading.Thread | None = None

    # -- doorbell -----------------------------------------------------------------------------------------------
    def submit(self, cmds: list[Command], background: bool = False) -> None:
        """Accept one submission (the doorbell). Runs it on the calling thread when the engine is idle, unless
        `background` asks for the engine's own thread. One exec command on an idle engine (the runner's launches:
        a kernel, a device graph) is launched directly, without the general command loop."""
        lock = self._lock  # a plain lock on the hot path: Condition's context manager is Python code
        lock.acquire()
        self.submitted += 1
        seq = self.submitted
        if self._busy:
            self._pending.append((cmds, 0, seq))
            lock.release()
            return
        self._busy = True
        lock.release()
        if background:
            self._after_inline((cmds, 0, seq))
            return
        if len(cmds) == 1 and (c := cmds[0])[0] == EXEC and not self.profile and c[1].device is self.device:
            try:
                c[1].launch(c[2], c[3], c[4])
            except BaseException:
                self.timeline.set(seq)
                self._after_inline(None)
                raise
            tl = self.timeline
            tl.mem[0] = seq  # (Signal.set inlined: seq only grows; set() wakes the waiters there are)
            if tl._waiters:
                tl.set(seq)
            stopped_at = -1
        else:
            try:
                stopped_at = self._run(cmds, 0, seq, inline=True)
            except BaseException:
                self._after_inline(None)
                raise
        if stopped_at < 0:
            lock.acquire()
            if not self._pending:
                self._busy = False
                lock.release()
                return
            lock.release()
        self._after_inline((cmds, stopped_at, seq) if stopped_at >= 0 else None)

    def run_inline(self, fn: Any, arg: Any) -> bool:
        """submit() of one exec command whose launch is the native call `fn(arg)` (a settled device graph's), for
        an idle engine: the same sequence number, timeline and hand-over of work queued meanwhile as submit's inline
        run, without building or reading a command. False (nothing done) when the engine is busy or profiles: the
        caller then submits the command."""
        lock = self._lock
        lock.acquire()
        if self._busy or self.profile:
            lock.release()
            return False
        self.submitted += 1
        seq = self.submitted
        self._busy = True
        lock.release()
        try:
            fn(arg)
        except BaseException:
            self.timeline.set(seq)
            self._after_inline(None)
            raise
        tl = self.timeline
        tl.mem[0] = seq  # (Signal.set inlined, as in submit)
        if tl._waiters:
            tl.set(seq)
        lock.acquire()
        if not self._pending:
            self._busy = False
            lock.release()
            return True
        lock.release()
        self._after_inline(None)
        return True

    def _after_inline(self, deferred: tuple[list[Command], int, int] | None) -> None:
        with self._cond:
            if deferred is not None:
                self._pending.appendleft(deferred)
            if not self._pending:
                self._busy = False
                return
            self._bg_go = True  # ownership passes to the background thread; _busy stays set
            if self._thread is None:
                self._thread = threading.Thread(target=self._background, name=f"hcq-{self.timeline.name}", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _background(self) -> None:
        while True:
            with self._cond:
                while not self._bg_go:
                    self._cond.wait()
                self._bg_go = False
            while True:
                with self._cond:
                    if not self._pending:
                        self._busy = False
                        break
                    cmds, start, seq = self._pending.popleft()
                try:
                    self._run(cmds, start, seq, inline=False)
                except BaseException as e:  # latched: raised by the next synchronize
                    self.error = e
                del cmds  # an idle thread holds no submission (nor the buffers its commands name)

    @property
    def idle(self) -> bool:
        """True when every submission so far has completed."""
        return self.timeline.mem[0] >= self.submitted

    # -- execution ----------------------------------------------------------------------------------------------
    def _run(self, cmds: list[Command], i: int, seq: int, inline: bool) -> int:
        """Execute cmds[i:]; returns -1 when done, or the index of a wait that an inline run must not block on."""
        dev = self.device
        profile = self.profile
        try:
            n = len(cmds)
            while i < n:
                c = cmds[i]
                op = c[0]
                t0 = time.perf_counter_ns() if profile else 0
                if op == EXEC:
                    if c[1].device is not dev:
                        raise HCQError(f"program {c[1].name!r} is loaded on {c[1].device.name}, not on {dev.name}")
                    c[1].launch(c[2], c[3], c[4])
                elif op == SIGNAL:
                    c[1].set(c[2])
                elif op == WAIT:
                    if c[1].mem[0] < c[2]:
                        if inline:
                            return i
                        c[1].wait(c[2], timeout=float("inf"))
                elif op == TIMESTAMP:
                    c[1].stamp()
                elif op == COPY:
                    dev._copy(c[1], c[2], c[3])
                elif op != BARRIER:
                    raise HCQError(f"unknown command {c!r} submitted to {self.timeline.name}")
                if profile:
                    name = getattr(c[1], "name", "") if op == EXEC else ""
                    self.events.append(
                        ProfileEvent(dev.name, self.kind, OP_NAMES[op], name, t0, time.perf_counter_ns())
                    )
                i += 1
        except BaseException as e:
            for c in cmds[i:]:
                if c[0] == SIGNAL:
                    c[1].fail(e)
            self.timeline.set(seq)
            raise
        # the commands hold their buffers: drop this frame's reference before anyone waiting for this submission
        # wakes (a freed tensor's memory is then free, and counted so, once synchronize returns). Only a queue's own
        # per-submission copy is emptied: other lists are the submitter's (a device graph submits the same one on
        # every run)
        c = ()
        if type(cmds) is Submission:
            cmds.clear()
        self.timeline.set(seq)
        return -1
