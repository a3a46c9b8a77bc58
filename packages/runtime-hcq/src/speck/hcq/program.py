"""Program: a loaded kernel bound to a device, with argument checking done before anything runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speck.hcq import runner
from speck.hcq.buffer import Buffer
from speck.hcq.dtypes import DTypeInfo, dtype_info
from speck.hcq.errors import HCQError, ProgramArgumentError
from speck.hcq.interfaces import DeviceLike, ProgramLike
from speck.hcq.registry import Device


@dataclass(frozen=True)
class BufferParam:
    """What a program expects of one buffer argument: dtype (None: any), minimum size in elements (None: any) and
    role ("in", "out" or "inout")."""

    index: int
    dtype: DTypeInfo | None
    size: int | None
    role: str = "inout"


def buffer_params(spec: Sequence[Any] | None) -> list[BufferParam] | None:
    """Normalize codegen's buffer list [(index, dtype, size, role), ...] (or BufferParams) to BufferParams."""
    if spec is None:
        return None
    out = []
    for i, p in enumerate(spec):
        if isinstance(p, BufferParam):
            out.append(p)
            continue
        idx, dt, size, role = (
            (tuple(p) + (None, None, None, "inout"))[:4] if not isinstance(p, int) else (i, None, None, "inout")
        )
        out.append(
            BufferParam(i if idx is None else int(idx), None if dt is None else dtype_info(dt), size, role or "inout")
        )
    return sorted(out, key=lambda p: p.index)  # kernels take their buffers in index order


def _estimate(estimates: Any, *names: str) -> int:
    for n in names:
        v = getattr(estimates, n, None)
        if v is not None:
            try:
                return int(v)
            except Exception:  # symbolic estimates (UOps depending on variables) may refuse int() in any way
                return 0
    return 0


class Program:
    """A kernel loaded on a device. Call it with Buffers: `prog(*bufs, global_size=(n, 1, 1), vals=(v0, ...),
    wait=True)` validates the arguments (count, device, dtype, size - raising ProgramArgumentError naming them,
    before touching any memory), submits one exec command to the device's compute engine and, with `wait`,
    waits for that engine (not for the device's copy engine) and returns the elapsed seconds. `raw_args` gives the
    argument tuple an HWQueue.exec takes."""

    def __init__(
        self,
        device: DeviceLike,
        name: str,
        lib: bytes,
        buffers: Sequence[Any] | None = None,
        vars: Sequence[Any] | None = None,
        global_size: tuple[Any, ...] | None = None,
        estimates: Any = None,
        spec: Any = None,
    ) -> None:
        self.device, self.name, self.lib = device, name, lib
        self.params = buffer_params(buffers)
        self.var_names: list[str] | None = None
        self.var_bounds: list[tuple[int, int] | None] = []
        if vars is not None:
            # (name, min, max) tuples, or codegen's DEFINE_VAR UOps whose arg is that tuple
            described = [
                v.arg if not isinstance(v, (tuple, str)) and isinstance(getattr(v, "arg", None), tuple) else v
                for v in vars
            ]
            self.var_names = [str(v[0]) if isinstance(v, tuple) else str(v) for v in described]
            self.var_bounds = [
                (int(v[1]), int(v[2])) if isinstance(v, tuple) and len(v) >= 3 and isinstance(v[1], int) else None
                for v in described
            ]
        self.global_size = global_size
        self.spec = spec  # the ProgramSpec this was loaded from, if any
        # a global size that depends on variables is resolved per call (through spec.launch_dims)
        self._symbolic_size = global_size is not None and not all(isinstance(d, int) for d in global_size)
        self.estimates = estimates
        self.est_bytes = _estimate(estimates, "mem", "mem_bytes")
        self.est_flops = _estimate(estimates, "flops", "ops")
        self._engine = device.engines["compute"]
        # what each buffer must be, precomputed for check_args' fast path: (DTypeInfo or None, min size or None)
        self._param_req: tuple[tuple[DTypeInfo | None, int | None], ...] | None = (
            None if self.params is None else tuple((p.dtype, p.size) for p in self.params)
        )

    # -- argument checking --------------------------------------------------------------------------------------
    def check_args(self, bufs: Sequence[Buffer], vals: Sequence[int]) -> None:
        """Raise ProgramArgumentError when the buffers or variable values do not match what the program expects."""
        dev = self.device
        if self.params is None and self.var_names is None:  # the common unchecked case: only the device matters
            for b in bufs:
                if b.__class__ is not Buffer or b.dev is not dev:
                    break
            else:
                return
        req = self._param_req
        if req is not None and not vals and not self.var_names and len(bufs) == len(req):
            # the hot path: every buffer a plain Buffer on this device with the very DTypeInfo (interned per dtype)
            # and enough elements; anything else falls through to the full check that names the problem
            for b, (info, size) in zip(bufs, req):
                if (
                    b.__class__ is not Buffer
                    or b.dev is not dev
                    or (info is not None and b.info is not info)
                    or (size is not None and b.size < size)
                ):
                    break
            else:
                return
        if self.params is not None and len(bufs) != len(self.params):
            raise ProgramArgumentError(f"program {self.name!r} takes {len(self.params)} buffers, got {len(bufs)}")
        if self.var_names is not None and len(vals) != len(self.var_names):
            raise ProgramArgumentError(
                f"program {self.name!r} takes {len(self.var_names)} variable values ({', '.join(self.var_names)}), "
                f"got {len(vals)}"
            )
        for i, b in enumerate(bufs):
            if not isinstance(b, Buffer):
                raise ProgramArgumentError(
                    f"program {self.name!r}: argument {i} must be a Buffer, got {type(b).__name__}"
                )
            if b.dev is not dev:
                raise ProgramArgumentError(
                    f"program {self.name!r} is loaded on {dev.name} but buffer {i} ({b!r}) lives on {b.device}; copy "
                    f"it to {dev.name} first"
                )
            if self.params is None:
                continue
            p = self.params[i]
            if p.dtype is not None and (p.dtype.itemsize, p.dtype.fmt) != (b.info.itemsize, b.info.fmt):
                raise ProgramArgumentError(
                    f"program {self.name!r}: buffer {i} must hold {p.dtype.name} (itemsize {p.dtype.itemsize}), "
                    f"got {b.info.name} (itemsize {b.info.itemsize})"
                )
            if p.size is not None and b.size < p.size:
                raise ProgramArgumentError(
                    f"program {self.name!r}: buffer {i} must hold at least {p.size} elements, got {b.size} ({b!r})"
                )
        for k, v in enumerate(vals):
            if not isinstance(v, int) or not -(2**31) <= v < 2**31:
                raise ProgramArgumentError(f"program {self.name!r}: variable values must be int32, got {v!r}")
            if k < len(self.var_bounds) and (bounds := self.var_bounds[k]) is not None:
                lo, hi = bounds
                if not lo <= v <= hi:
                    assert self.var_names is not None
                    raise ProgramArgumentError(
                        f"program {self.name!r}: variable {self.var_names[k]} must be in [{lo}, {hi}], got {v}"
                    )

    def var_vals(self, vals: Sequence[int]) -> dict[str, int]:
        """{variable name: value} for positional variable values."""
        return dict(zip(self.var_names or [f"var{i}" for i in range(len(vals))], vals))

    def launch_dims(self, vals: Sequence[int]) -> tuple[int, ...]:
        """The global size with variables substituted (needs the spec's launch_dims for symbolic sizes)."""
        assert self.global_size is not None
        if not self._symbolic_size:
            return tuple(self.global_size)
        if self.spec is None or not hasattr(self.spec, "launch_dims"):
            raise ProgramArgumentError(
                f"program {self.name!r} has a symbolic global size {self.global_size}; pass global_size= explicitly"
            )
        return tuple(int(d) for d in self.spec.launch_dims(self.var_vals(vals)))

    def raw_args(self, bufs: Sequence[Buffer], vals: Sequence[int] = ()) -> tuple[Any, ...]:
        """The device-level argument tuple for HWQueue.exec (for the CPU: buffer addresses then variable values)."""
        return (*[b.ptr for b in bufs], *vals)

    def __call__(
        self,
        *bufs: Buffer,
        global_size: tuple[int, ...] | None = None,
        local_size: tuple[int, ...] | None = None,
        vals: Sequence[int] = (),
        wait: bool = False,
        threads: int | None = None,
    ) -> float | None:
        """Run the program once on `bufs` through the runner (a one-call plan; not counted in GlobalCounters, which
        count what tensors run). With `wait`, returns the seconds it took."""
        names = self.var_names or [f"var{i}" for i in range(len(vals))]
        call = runner.Exec(self, tuple(range(len(bufs))), tuple(zip(names, vals)), global_size, threads)
        if len(vals) != len(names):  # the check names the mismatch (zip above would drop values)
            self.check_args(bufs, vals)
        times = runner.run(runner.Plan([call], len(bufs), name=self.name), bufs, wait=wait, timing=wait, count=False)
        return times[0] if times else None

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        """Run the kernel now on the calling thread (devices' executors call this)."""
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, ...]:
        """A program pickles as its device's name and the ProgramSpec it was loaded from (compiled object included);
        unpickling loads it again there."""
        if self.spec is None or getattr(self.spec, "lib", None) is None:
            raise HCQError(f"can't pickle program {self.name!r}: it was not loaded from a ProgramSpec with its "
                           "compiled object (load it with Device.load_program)")  # fmt: skip
        return (_load_program, (self.device.name, self.spec))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device.name}>"


def _load_program(device: str, spec: Any) -> ProgramLike:
    try:
        return Device[device].load_program(spec)
    except Exception as e:
        raise HCQError(f"can't unpickle program {spec.name!r}: device {device!r} can't load it here "
                       f"({type(e).__name__}: {e})") from e  # fmt: skip
