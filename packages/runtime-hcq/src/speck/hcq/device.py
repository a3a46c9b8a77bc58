"""The device registry (`Device["CPU"]`, `Device.DEFAULT`) and the base class every device builds on."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speck.hcq.allocator import Allocator, check_copy_size
from speck.hcq.errors import DeviceNotFoundError, HCQError
from speck.hcq.queue import EXEC, TIMESTAMP, Engine, HWQueue, ProfileEvent
from speck.hcq.signal import Signal

if TYPE_CHECKING:
    from speck.codegen.compiler import Compiler
    from speck.hcq.buffer import Buffer
    from speck.hcq.program import Program

# renderer names a device accepts in ProgramSpec.renderer, by the device's renderer_name
_RENDERER_ALIASES = {"clang": ("clang", "c"), "llvm": ("llvm",), "x86": ("x86",), "python": ("python",)}

KNOWN_DEVICES = ("CPU", "CPU:<n>", "CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON", "NULL", "DISK:<path>")


def _profile_enabled() -> bool:
    return os.environ.get("PROFILE", "0") not in ("", "0")


class DeviceBase:
    """What every device has: a canonical `name`, an `allocator`, the engines its queues run on ("compute" and
    "copy"), `synchronize`, batch submission with per-kernel timing, and (for devices that compile) `compiler`,
    `renderer_name` and `runtime(name, lib) -> Program`."""

    renderer_name: str = ""
    host_visible = True  # buffers can be viewed from the host without a copy
    any_renderer = False  # load_program accepts programs from every renderer (NULL: it runs none of them)

    def __init__(self, name: str, allocator: Allocator) -> None:
        self.name, self.allocator = name, allocator
        self.engines: dict[str, Engine] = {"compute": Engine(self, "compute"), "copy": Engine(self, "copy")}
        self._engine_list = list(self.engines.values())
        self._compiler: Compiler | None = None
        self._compiler_lock = threading.Lock()
        self.profile = _profile_enabled()

    # -- compilation and programs -------------------------------------------------------------------------------
    @property
    def compiler(self) -> Compiler:
        """The codegen Compiler producing what `runtime` loads (created on first use)."""
        if self._compiler is None:
            with self._compiler_lock:
                if self._compiler is None:
                    self._compiler = self._make_compiler()
        return self._compiler

    def _make_compiler(self) -> Compiler:
        raise HCQError(f"{self.name} does not compile programs")

    def runtime(self, name: str, lib: bytes, **spec: Any) -> Program:
        """Load compiled `lib` and return the Program for its function `name`. Optional keyword arguments describe
        the program (buffers=[(index, dtype, size, role)], vars=[(name, min, max)], global_size, estimates) so
        calls can be checked."""
        raise HCQError(f"{self.name} cannot load programs")

    def load_program(self, spec: Any) -> Program:
        """Load a codegen ProgramSpec-like object (name, src, lib, global_size, buffers, vars, estimates, renderer
        attributes). Without `lib`, `src` is compiled with this device's compiler. A spec rendered for another
        renderer than this device's raises HCQError naming both."""
        renderer = getattr(spec, "renderer", None)
        if (
            isinstance(renderer, str)
            and not self.any_renderer
            and renderer not in _RENDERER_ALIASES.get(self.renderer_name, (self.renderer_name,))
        ):
            raise HCQError(
                f"program {spec.name!r} was rendered by the {renderer!r} renderer, but {self.name} runs "
                f"{self.renderer_name!r} programs; render it with the device's renderer"
            )
        lib = getattr(spec, "lib", None)
        if lib is None:
            src = getattr(spec, "src", None)
            if src is None:
                raise HCQError(f"program spec {getattr(spec, 'name', spec)!r} has neither lib (bytes) nor src")
            lib = self.compiler.compile(src)
        return self.runtime(
            spec.name,
            lib,
            buffers=getattr(spec, "buffers", None),
            vars=getattr(spec, "vars", None),
            global_size=getattr(spec, "global_size", None),
            estimates=getattr(spec, "estimates", None),
            spec=spec,
        )

    def choose_threads(self, prog: Program, bufs: Sequence[Buffer]) -> int | None:
        """How many workers an exec of `prog` on `bufs` should use (None: the device's default)."""
        return None

    # -- queues, engines and synchronization --------------------------------------------------------------------
    @property
    def profile(self) -> bool:
        """PROFILE=1 (or setting this True) records a ProfileEvent per executed command in `profile_events`."""
        return self._profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self._profile = on
        for e in self.engines.values():
            e.profile = on

    @property
    def profile_events(self) -> list[ProfileEvent]:
        """Recorded per-command events of all engines, ordered by start time."""
        return sorted((ev for e in self.engines.values() for ev in e.events), key=lambda ev: ev.start_ns)

    def hw_queue(self, engine: str = "compute") -> HWQueue:
        """A new, empty command queue for this device's `engine` ("compute" or "copy")."""
        if engine not in self.engines:
            raise HCQError(f"{self.name} has engines {sorted(self.engines)}, not {engine!r}")
        return HWQueue(engine)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until everything submitted to this device has completed; raise a latched execution error, or
        SignalTimeoutError (naming the engine's timeline signal, the value awaited and seen) after `timeout` s."""
        for e in self._engine_list:
            if e.timeline.mem[0] < e.submitted:
                e.timeline.wait(e.submitted, timeout)
            if e.error is not None:
                err, e.error = e.error, None
                raise HCQError(f"{self.name} {e.kind} engine: a submitted command failed: {err}") from err

    def synchronize_if_busy(self) -> None:
        """synchronize() when some engine still has work in flight (cheap when idle)."""
        for e in self.engines.values():
            if e.timeline.mem[0] < e.submitted or e.error is not None:
                self.synchronize()
                return

    def run_batch(self, calls: Sequence[tuple[Any, ...]], timing: bool = True) -> list[tuple[str, float]]:
        """Submit many kernels as one queue and wait. `calls` holds (program, buffers, global_size[, vals]) tuples;
        every call is checked before anything is submitted. Returns [(program name, seconds)] per kernel from
        timestamps taken around each exec (0.0 each when timing=False)."""
        progs: list[tuple[Program, tuple[Any, ...], tuple[int, ...], int | None]] = []
        for c in calls:
            prog, bufs, gs = c[0], c[1], c[2]
            vals = c[3] if len(c) > 3 else ()
            if prog.device is not self:
                raise HCQError(f"run_batch on {self.name}: program {prog.name!r} is loaded on {prog.device.name}")
            prog.check_args(bufs, vals)
            progs.append((prog, prog.raw_args(bufs, vals), gs, self.choose_threads(prog, bufs)))
        q = self.hw_queue()
        stamps = [Signal(name=f"{self.name}:batch{i}") for i in range(len(progs) + 1)] if timing else []
        for i, (prog, args, gs, threads) in enumerate(progs):
            if timing and i == 0:
                q.cmds.append((TIMESTAMP, stamps[0]))
            q.cmds.append((EXEC, prog, args, gs, threads))
            if timing:
                q.cmds.append((TIMESTAMP, stamps[i + 1]))
        q.submit(self)
        self.synchronize()
        if not timing:
            return [(p.name, 0.0) for p, *_ in progs]
        return [(p.name, (stamps[i + 1].timestamp - stamps[i].timestamp) * 1e-9) for i, (p, *_) in enumerate(progs)]

    # -- copy commands (called by the engines) --------------------------------------------------------------
    def _copy(self, dest: Any, src: Any, nbytes: int) -> None:
        from speck.hcq.buffer import Buffer

        if isinstance(dest, Buffer) and isinstance(src, Buffer):
            check_copy_size(f"copy from {src!r} to {dest!r}", dest.nbytes, src.nbytes)
            check_copy_size(f"copy command of {nbytes} bytes into {dest!r}", dest.nbytes, nbytes)
            dest.dev.allocator.copyin(
                dest.opaque, dest.offset, src.dev.allocator.as_memoryview(src.opaque, src.offset, nbytes)
            )
            return
        self._copy_raw(int(dest), int(src), nbytes)

    def _copy_raw(self, dest: int, src: int, nbytes: int) -> None:
        raise HCQError(f"{self.name} cannot copy between raw addresses")

    @property
    def mem_used(self) -> int:
        """Bytes held by this device's live buffers."""
        return self.allocator.mem_used

    def __repr__(self) -> str:
        return f"<Device {self.name}>"


def canonicalize(name: str) -> str:
    """Canonical device name: upper-case device kind and suffix ("cpu:llvm" -> "CPU:LLVM", "cpu:0" -> "CPU"),
    a DISK path kept verbatim. Raises DeviceNotFoundError listing the known names for anything else."""
    if not isinstance(name, str) or not name:
        raise DeviceNotFoundError(
            f"device names are non-empty strings, got {name!r}; known: {', '.join(KNOWN_DEVICES)}"
        )
    kind, _, rest = name.partition(":")
    kind = kind.upper()
    if kind == "DISK":
        if not rest:
            raise DeviceNotFoundError(
                f"DISK needs a file path (DISK:/path/to/file); known devices: {', '.join(KNOWN_DEVICES)}"
            )
        return f"DISK:{rest}"
    rest = rest.upper()
    if kind == "CPU":
        if rest in ("", "0"):
            return "CPU"
        if rest in ("LLVM", "CLANG", "X86") or re.fullmatch(r"[1-9][0-9]*", rest):
            return f"CPU:{rest}"
    elif kind in ("PYTHON", "NULL") and rest in ("", "0"):
        return kind
    raise DeviceNotFoundError(f"unknown device {name!r}; known devices: {', '.join(KNOWN_DEVICES)}")


class _DeviceRegistry:
    """`Device[name]` opens (once) and returns the device called `name`; `Device.DEFAULT` is `$DEV` or "CPU"."""

    def __init__(self) -> None:
        self._open: dict[str, DeviceBase] = {}
        self._lock = threading.Lock()
        self._default: str | None = None

    def canonicalize(self, name: str) -> str:
        return canonicalize(name)

    def __getitem__(self, name: str) -> DeviceBase:
        try:
            return self._open[name]
        except KeyError:
            pass
        canon = canonicalize(name)
        with self._lock:
            if (dev := self._open.get(canon)) is None:
                dev = self._open[canon] = _open_device(canon)
            self._open[name] = dev
        return dev

    @property
    def DEFAULT(self) -> str:
        """The default device: what was assigned to Device.DEFAULT, else `$DEV`, else "CPU"."""
        return self._default if self._default is not None else canonicalize(os.environ.get("DEV", "CPU") or "CPU")

    @DEFAULT.setter
    def DEFAULT(self, name: str | None) -> None:
        self._default = None if name is None else canonicalize(name)

    @property
    def opened(self) -> list[str]:
        """Canonical names of the devices opened so far."""
        return sorted({d.name for d in self._open.values()})

    def known(self) -> tuple[str, ...]:
        return KNOWN_DEVICES


def _open_device(canon: str) -> DeviceBase:
    if canon.startswith("CPU"):
        from speck.hcq.cpu import CPUDevice

        return CPUDevice(canon)
    if canon == "NULL":
        from speck.hcq.null import NullDevice

        return NullDevice()
    if canon == "PYTHON":
        from speck.hcq.python_device import PythonDevice

        return PythonDevice()
    if canon.startswith("DISK:"):
        from speck.hcq.disk import DiskDevice

        return DiskDevice(canon)
    raise DeviceNotFoundError(f"unknown device {canon!r}; known devices: {', '.join(KNOWN_DEVICES)}")


Device = _DeviceRegistry()
