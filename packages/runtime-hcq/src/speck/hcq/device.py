"""DeviceBase: what every device has (name, allocator, engines, synchronize, batch submission, a codegen backend
for devices that run kernels, BEAM's timer). Device kinds and the `Device[...]` registry are in speck.hcq.registry."""

from __future__ import annotations

import math
import platform
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.codegen.backends import get_backend
from speck.codegen.cache import CacheWarning
from speck.hcq import runner
from speck.hcq.allocator import Allocator, check_copy_size
from speck.hcq.buffer import Buffer
from speck.hcq.errors import ElfLinkError, HCQError
from speck.hcq.queue import Engine, HWQueue, ProfileEvent
from speck.hcq.settings import PROFILE
from speck.uop import DEBUG

if TYPE_CHECKING:
    from speck.codegen.backends import Backend
    from speck.codegen.compiler import Compiler
    from speck.codegen.renderer import Renderer
    from speck.hcq.program import Program


# run, with the device, at the end of every synchronize() a user calls (not of speck's own waits, wait_idle): a
# layer above reports there what the device's work recorded (speck.tensor: an out-of-range index, IndexOutOfBoundsError)
SYNC_CHECKS: list[Callable[[DeviceBase], None]] = []


def _profile_enabled() -> bool:
    return str(PROFILE.value) not in ("", "0")


class DeviceBase:
    """What every device has: a canonical name (`name`, also `device`), an `allocator`, the engines its queues run
    on ("compute" and "copy"), `synchronize`, batch submission with per-kernel timing, and, for devices that run
    kernels, a codegen backend (`backend_name`, a name in speck.codegen.backends) giving `renderer` and `compiler`,
    plus `runtime(name, lib) -> Program`. `graph` is the class that batches many kernels into one launch (TinyJit
    replays use it), or None."""

    # capabilities: what the device can do, declared by its class (code asks these, never the device's name)
    backend_name: str = ""  # the speck.codegen backend this device's programs come from ("" : runs no kernels)
    host_visible = True  # buffers can be viewed from the host without a copy
    any_renderer = False  # load_program accepts programs from every renderer (NULL: it runs none of them)
    file_backed = False  # buffers are regions of a file (DISK): data, not memory the device holds
    graph: type | None = None  # the class batching many calls into one launch (speck.hcq.runner), or None

    def __init__(self, name: str, allocator: Allocator) -> None:
        self.name, self.allocator = name, allocator
        self.engines: dict[str, Engine] = {"compute": Engine(self, "compute"), "copy": Engine(self, "copy")}
        self._engine_list = list(self.engines.values())
        self.profile = _profile_enabled()

    @property
    def runs_kernels(self) -> bool:
        """Whether programs run here (the device names a codegen backend)."""
        return bool(self.backend_name)

    @property
    def counts_memory(self) -> bool:
        """Whether the memory its buffers hold counts as used device memory (a file's bytes do not)."""
        return not self.file_backed

    # -- identity -------------------------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        """The canonical name, e.g. "CPU:1"."""
        return self.name

    @property
    def device_id(self) -> int:
        """The index of a numbered device ("CPU:3" -> 3); 0 otherwise."""
        suffix = self.name.partition(":")[2]
        return int(suffix) if suffix.isdigit() else 0

    @property
    def arch(self) -> str:
        """The architecture programs are built for (the host's, for CPU devices)."""
        return f"{platform.machine()},native"

    def count(self) -> int:
        """Physical devices of this kind reachable (1 for host devices)."""
        return 1

    def finalize(self) -> None:
        """Wait for outstanding work; called for every opened device at interpreter exit."""
        try:
            self.wait_idle()
        except HCQError:
            pass

    # -- compilation and programs -------------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The speck.codegen backend (renderer + compiler) this device's programs come from."""
        if not self.backend_name:
            raise HCQError(f"{self.name} runs no kernels, so it has no renderer or compiler; compute on CPU")
        return get_backend(self.backend_name)

    @property
    def renderer(self) -> Renderer:
        """The codegen Renderer kernels for this device are rendered with."""
        return self.backend.renderer

    @property
    def compiler(self) -> Compiler:
        """The codegen Compiler producing what `runtime` loads."""
        return self.backend.compiler

    def accepts_renderer(self, renderer: str) -> bool:
        """Whether programs rendered by `renderer` (ProgramSpec.renderer) run here."""
        return self.any_renderer or renderer in self.backend.renderer_names()

    def runtime(self, name: str, lib: bytes, **spec: Any) -> Program:
        """Load compiled `lib` and return the Program for its function `name`. Optional keyword arguments describe
        the program (buffers=[(index, dtype, size, role)], vars=[(name, min, max)], global_size, estimates) so
        calls can be checked."""
        raise HCQError(f"{self.name} cannot load programs")

    def load_program(self, spec: Any) -> Program:
        """Load a codegen ProgramSpec-like object (name, src, lib, global_size, buffers, vars, estimates, renderer
        attributes). Without `lib`, `src` is compiled with this device's compiler. A spec rendered for another
        renderer than this device's raises HCQError naming both. An object that fails to link (ElfLinkError) is
        compiled once more from `src` bypassing the cache (`compiler.recompile`), with a CacheWarning."""
        renderer = getattr(spec, "renderer", None)
        if isinstance(renderer, str) and not self.accepts_renderer(renderer):
            raise HCQError(
                f"program {spec.name!r} was rendered by the {renderer!r} renderer, but {self.name} runs "
                f"{' or '.join(repr(n) for n in sorted(self.backend.renderer_names()))} programs; render it with the "
                "device's renderer (Device[name].renderer)"
            )
        lib, src = getattr(spec, "lib", None), getattr(spec, "src", None)
        if lib is None:
            if src is None:
                raise HCQError(f"program spec {getattr(spec, 'name', spec)!r} has neither lib (bytes) nor src")
            lib = self.backend.compiler_for(spec).compile(src)
        kw = {k: getattr(spec, k, None) for k in ("buffers", "vars", "global_size", "estimates")}
        try:
            return self.runtime(spec.name, lib, **kw, spec=spec)
        except ElfLinkError as e:
            # a cached object that does not load (its entry is intact but holds the wrong object): compile once more
            # from the source, bypassing the cache; an object that fails freshly compiled too is a real error
            if src is None:
                raise
            fresh = self.backend.compiler_for(spec).recompile(src)
            if fresh == lib:
                raise
            warnings.warn(f"{self.name}: the object of program {spec.name!r} did not load ({e}); it was compiled "
                          "again and its cache entry replaced", CacheWarning, stacklevel=2)  # fmt: skip
            if hasattr(spec, "lib"):
                spec.lib = fresh
            return self.runtime(spec.name, fresh, **kw, spec=spec)

    def time_program(self, spec: Any, runs: int = 3) -> float:
        """Seconds the fastest of `runs` runs of a ProgramSpec takes here, on zero-filled scratch buffers of its
        sizes, variables at their upper bounds: the timer BEAM search uses for candidates on this device. A candidate
        that does not compile or load times as infinity (it can't win)."""
        try:
            prog = self.load_program(spec)
        except Exception as e:  # a candidate the compiler or loader rejects is not an error of the search
            if DEBUG >= 2:
                print(f"BEAM candidate {getattr(spec, 'name', '?')} failed to load on {self.name}: {e}")
            return math.inf
        bufs = []
        for a in spec.buffers:
            b = Buffer(self.name, int(a.size), a.dtype)
            bufs.append(b.copyin(np.zeros(b.nbytes, np.uint8)))
        vals = tuple(int(v.arg[2]) for v in spec.vars)
        best = math.inf
        for _ in range(runs):
            t = prog(*bufs, vals=vals, wait=True)
            best = min(best, float(t) if t is not None else math.inf)
        return best

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
        """Wait until everything submitted to this device has completed (wait_idle), then run the SYNC_CHECKS."""
        self.wait_idle(timeout)  # (a device's own: the AMD device's also waits for the GPU's timeline)
        for check in SYNC_CHECKS:
            check(self)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until everything submitted to this device has completed; raise a latched execution error, or
        SignalTimeoutError (naming the engine's timeline signal, the value awaited and seen) after `timeout` s."""
        for e in self._engine_list:
            if e.timeline.mem[0] < e.submitted:
                e.timeline.wait(e.submitted, timeout)
            if e.error is not None:
                err, e.error = e.error, None
                raise HCQError(f"{self.name} {e.kind} engine: a submitted command failed: {err}") from err

    def wait_kernels(self) -> None:
        """Return once every kernel launched so far has run. A host engine has finished a launch when its command
        returns, so there is nothing to wait for here (and never for the copy engine); a GPU device, whose launch
        only queues the kernel, overrides this."""

    def synchronize_if_busy(self) -> None:
        """synchronize() when some engine still has work in flight (cheap when idle)."""
        for e in self.engines.values():
            if e.timeline.mem[0] < e.submitted or e.error is not None:
                self.wait_idle()
                return

    def run_batch(self, calls: Sequence[tuple[Any, ...]], timing: bool = True) -> list[tuple[str, float]]:
        """Run many kernels as one plan through the runner (speck.hcq.runner) and wait. `calls` holds (program,
        buffers, global_size[, vals]) tuples; every call is checked before anything runs. Returns [(program name,
        seconds)] per kernel (0.0 each when timing=False)."""
        bufs: list[Any] = []
        plan_calls = []
        for c in calls:
            prog, hb, gs = c[0], list(c[1]), c[2]
            vals = tuple(c[3]) if len(c) > 3 else ()
            if prog.device is not self:
                raise HCQError(f"run_batch on {self.name}: program {prog.name!r} is loaded on {prog.device.name}")
            prog.check_args(hb, vals)
            names = prog.var_names or [f"var{i}" for i in range(len(vals))]
            plan_calls.append(runner.Exec(prog, tuple(range(len(bufs), len(bufs) + len(hb))), tuple(zip(names, vals)),
                                          tuple(gs)))  # fmt: skip
            bufs += hb
        plan = runner.Plan(plan_calls, len(bufs), name="batch")
        times = runner.run(plan, bufs, timing=True, count=False) if timing else None
        if not timing:
            runner.run(plan, bufs, count=False)
        return [(c[0].name, times[i] if times else 0.0) for i, c in enumerate(calls)]

    # -- copy commands (called by the engines) --------------------------------------------------------------
    def _copy(self, dest: Any, src: Any, nbytes: int) -> None:
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
