"""PythonRenderer: renders a program as Python source (numpy SIMT code, the same execution model as
speck.codegen.interpret) and `run_python` executes that source with exec.

The generated function is `def <name>(rt):` where `rt` (a PythonRuntime) holds the buffers, variables and the core
range. Each UOp becomes one line `v<i> = ...` calling the interpreter's exact-semantics primitives; inner RANGEs
become Python for loops, the outermost GLOBAL range is carried as the leading array axis (all its iterations at
once, or the `core_range` slice of them)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from speck.codegen import interpret as it
from speck.codegen import numeric as nm
from speck.codegen.errors import ProgramFormError, RunArgumentError
from speck.codegen.kernel_info import kernel_name
from speck.codegen.renderer import Renderer
from speck.codegen.renderer.common import batched_range, outer_global_range
from speck.uop import GroupOp, Ops, PtrDType, UOp


class PythonRenderer(Renderer):
    """Renders programs as Python source; supports every ALU op and vectors (it is the reference backend)."""

    name = "python"
    device = "PYTHON"
    supported_ops = GroupOp.ALU
    has_vectors = True
    registers_are_cpu = False
    max_vector_bytes = 32
    supports_float16 = True
    supports_bfloat16 = True
    supports_fp8 = True

    def render(self, uops: list[UOp]) -> str:
        """Python source of `def <name>(rt):` executing `uops` (K, the table of constants, is bound by run_python)."""
        pos = {u: i for i, u in enumerate(uops)}
        outer, batched = outer_global_range(uops), batched_range(uops)
        lines = [f"def {_py_name(uops)}(rt):"]
        ind = 1

        def v(u: UOp) -> str:
            return f"v{pos[u]}"

        def emit(s: str) -> None:
            lines.append("    " * ind + s)

        for i, u in enumerate(uops):
            op = u.op
            args = ", ".join(v(s) for s in u.src)
            if op is Ops.RANGE:
                emit(f"_end{i} = int(np.asarray({v(u.src[0])}).reshape(-1)[0])")
                if u is batched:
                    emit(f"_lo{i}, _hi{i} = rt.batch_bounds(_end{i})")
                    emit(f"if _hi{i} > _lo{i}:")
                    ind += 1
                    emit(f"v{i} = np.arange(_lo{i}, _hi{i}).astype(K[{i}]).reshape(-1, 1)")
                elif u is outer:  # run index by index, over this worker's slice only
                    emit(f"_lo{i}, _hi{i} = rt.batch_bounds(_end{i})")
                    emit(f"for _k{i} in range(_lo{i}, _hi{i}):")
                    ind += 1
                    emit(f"v{i} = np.full((1, 1), _k{i}, dtype=K[{i}])")
                else:
                    emit(f"for _k{i} in range(_end{i}):")
                    ind += 1
                    emit(f"v{i} = np.full((1, 1), _k{i}, dtype=K[{i}])")
                continue
            if op is Ops.END:
                emit("pass")
                ind -= 1
                continue
            if op is Ops.SINK:
                emit("return None")
                continue
            if op is Ops.CONST:
                emit(f"v{i} = {_py_literal(u.arg)}  # weak literal, read by its CAST")
            elif op is Ops.CAST and u.src[0].op is Ops.CONST:
                emit(f"v{i} = rt.literal(U[{i}])")
            elif op is Ops.DEFINE_VAR:
                emit(f"v{i} = rt.var({u.arg[0]!r}, K[{i}])")
            elif op is Ops.PARAM:
                emit(f"v{i} = ('buf', {it._slot(u)})" if isinstance(u.dtype, PtrDType) else f"v{i} = None")
            elif op is Ops.DEFINE_REG:
                emit(f"v{i} = rt.reg(U[{i}])")
            elif op is Ops.INDEX:
                gate = v(u.src[2]) if len(u.src) > 2 else "None"
                emit(f"v{i} = ({v(u.src[0])}, np.asarray({v(u.src[1])}).astype(np.int64), {gate})")
            elif op is Ops.LOAD:
                alt = v(u.src[1]) if len(u.src) > 1 else "None"
                emit(f"v{i} = rt.load(U[{i}], {v(u.src[0])}, {alt})")
            elif op is Ops.STORE:
                emit(f"rt.store(U[{i}], {args})")
            elif op in GroupOp.ALU:
                emit(f"v{i} = nm.alu(U[{i}].op, U[{i}].dtype, {args})")
            elif op is Ops.CAST:
                emit(f"v{i} = nm.cast({args}, U[{i}].src[0].dtype, U[{i}].dtype)")
            elif op is Ops.BITCAST:
                emit(f"v{i} = nm.bitcast({args}, U[{i}].src[0].dtype, U[{i}].dtype)")
            elif op is Ops.STACK:
                emit(f"v{i} = rt.stack({args})")
            elif op is Ops.GEP:
                emit(f"v{i} = np.asarray({args})[:, {list(u.arg)!r}]")
            else:
                raise ProgramFormError(f"PythonRenderer: {op} is not part of the program form; can't render it")
        return "\n".join(lines) + "\n"


def _py_literal(v: object) -> str:
    """Python source for a literal (inf/nan need float('...'))."""
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    return repr(v)


def _py_name(uops: list[UOp]) -> str:
    name = re.sub(r"\W", "_", kernel_name(uops[-1]) if uops else "kernel")
    return name if name and not name[0].isdigit() else f"k_{name}"


class PythonRuntime:
    """What generated Python code calls: buffers by slot, variable values, the batched slice."""

    def __init__(self, uops: list[UOp], buffers: Sequence[Any], var_vals: dict[str, int],
                 core_range: tuple[int, int] | None) -> None:  # fmt: skip
        self.bufs = it._buffers_by_slot([u for u in uops if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType)],
                                        buffers)  # fmt: skip
        self.var_vals, self.core_range = var_vals, core_range
        self.nbatch = 1
        batched = batched_range(uops)
        if batched is not None:
            vals: dict[UOp, Any] = {}
            for n in batched.src[0].toposort():
                it._exec_one(n, vals, self.bufs, var_vals, 1)
            lo, hi = self.batch_bounds(int(np.asarray(vals[batched.src[0]]).reshape(-1)[0]))
            self.nbatch = max(1, hi - lo)

    def batch_bounds(self, end: int) -> tuple[int, int]:
        if self.core_range is None:
            return 0, end
        return max(0, self.core_range[0]), min(end, self.core_range[1])

    def literal(self, u: UOp) -> np.ndarray:
        c = nm.const_array(u.src[0].arg, u.dtype.scalar())
        return c.reshape(1, 1) if u.dtype.count == 1 else np.full((1, u.dtype.count), c)

    def var(self, name: str, npt: Any) -> np.ndarray:
        if name not in self.var_vals:
            raise RunArgumentError(f"python kernel: no value for variable {name!r}; pass it in var_vals")
        return np.array([[self.var_vals[name]]], dtype=npt)

    def reg(self, u: UOp) -> tuple[str, np.ndarray]:
        assert isinstance(u.dtype, PtrDType)
        base = u.dtype.base
        return ("reg", np.zeros((self.nbatch, max(u.dtype.size, 1) * base.count), dtype=nm.compute_np(base)))

    def load(self, u: UOp, ptr: Any, alt: Any) -> Any:
        (kind, ref), idx, gate = ptr
        return it._load(u, kind, ref, idx, gate, alt, self.bufs)

    def store(self, u: UOp, ptr: Any, val: Any) -> None:
        (kind, ref), idx, gate = ptr
        it._store(u, kind, ref, idx, gate, val, self.bufs)

    def stack(self, *parts: Any) -> np.ndarray:
        ps = [np.asarray(p) for p in parts]
        b = max(p.shape[0] for p in ps)
        return np.concatenate([np.broadcast_to(p, (b, p.shape[1])) for p in ps], axis=1)


def run_python(src: str, uops: list[UOp], buffers: Sequence[Any], var_vals: dict[str, int] | None = None,
               core_range: tuple[int, int] | None = None) -> None:  # fmt: skip
    """exec the PythonRenderer source `src` of program `uops` on `buffers` (in place)."""
    kt: dict[int, Any] = {}
    for i, u in enumerate(uops):
        if u.op in (Ops.RANGE, Ops.DEFINE_VAR):
            kt[i] = nm.storage_np(u.dtype)
    glb: dict[str, Any] = {"np": np, "nm": nm, "K": kt, "U": uops}
    exec(compile(src, "<speck python kernel>", "exec"), glb)
    fn = glb[_py_name(uops)]
    fn(PythonRuntime(uops, buffers, var_vals or {}, core_range))


__all__ = ["PythonRenderer", "PythonRuntime", "run_python"]
