"""The reference interpreter: runs a kernel AST (KERNEL_CONTRACT.md section 1) or a lowered program (section 2) on
numpy arrays / memoryviews with exact dtype semantics (see speck.codegen.numeric), so every lowering stage can be
checked by running before and after it.

`eval_ast` gives every RANGE its own numpy axis and evaluates the whole AST by broadcasting; reductions are folded
sequentially in loop order (the order a lowered program accumulates in). `run_program` executes the linear UOp
list SIMT-style: the outermost GLOBAL range is not looped but carried as the leading axis of every value (the
iterations are independent by the CPU ABI), inner ranges loop in Python. Values are 2-D arrays
(batch-or-1, lanes); vectors are the lanes.

A GPU program (one with SPECIAL workgroup/work-item ids, speck.codegen.lower.gpudims) runs the same way with every
work-item of the launch grid as a row, all in lockstep: its loops are uniform (their trip counts don't depend on the
ids), so executing each UOp for every work-item before the next one also honours every BARRIER. DEFINE_LOCAL
buffers exist once per workgroup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from speck.codegen import numeric as nm
from speck.codegen.errors import OutOfBoundsAccessError, ProgramFormError, RunArgumentError
from speck.codegen.renderer.common import batched_range, outer_global_range
from speck.uop import AddrSpace, DType, GroupOp, InvalidType, Ops, PtrDType, UOp

BufferLike = Any  # memoryview | np.ndarray


def as_buffer(b: BufferLike, dt: DType, what: str) -> np.ndarray:
    """A writable flat numpy view of buffer `b` in the storage type of `dt` (no copy)."""
    npt = nm.storage_np(dt)
    if isinstance(b, np.ndarray):
        if not b.flags.c_contiguous:
            raise RunArgumentError(f"{what}: buffers must be C-contiguous numpy arrays or memoryviews")
        arr = b.reshape(-1)
        return arr if arr.dtype == np.dtype(npt) else arr.view(npt)
    if isinstance(b, (memoryview, bytearray)):
        return np.frombuffer(b, dtype=npt)
    raise RunArgumentError(f"{what}: expected a numpy array or memoryview buffer, got {type(b).__name__}")


def _buffers_by_slot(params: list[UOp], buffers: Sequence[BufferLike]) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for p in params:
        slot = p.arg if isinstance(p.arg, int) else p.arg[0]
        if slot >= len(buffers):
            raise RunArgumentError(f"kernel uses buffer slot {slot} but only {len(buffers)} buffers were passed")
        assert isinstance(p.dtype, PtrDType)
        arr = as_buffer(buffers[slot], p.dtype.base, f"buffer {slot}")
        if p.dtype.size >= 0 and arr.size < p.dtype.size:
            raise RunArgumentError(
                f"buffer {slot} holds {arr.size} elements of {p.dtype.base}; kernel needs {p.dtype.size}"
            )
        out[slot] = arr
    return out


def _slot(p: UOp) -> int:
    return int(p.arg if isinstance(p.arg, int) else p.arg[0])


def _oob(u: UOp, pos: np.ndarray, size: int) -> OutOfBoundsAccessError:
    bad = pos[(pos < 0) | (pos >= size)]
    return OutOfBoundsAccessError(f"interpreter: {u.op.name} reads/writes out of bounds at index "
                                  f"{int(bad.flat[0])} of a {size}-element buffer (node {u.op} {u.dtype})")  # fmt: skip


def _gated_positions(u: UOp, pos: np.ndarray, gate: np.ndarray, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds-check the lanes a gated access reads; gated-off lanes read index 0 (of an empty buffer, which every
    lane of an in-bounds access skips, a one-element stand-in) and their value is replaced."""
    live = pos[gate]
    if live.size and (live.min() < 0 or live.max() >= buf.size):
        raise _oob(u, live, buf.size)
    return (pos, buf) if buf.size else (np.zeros(pos.shape, np.intp), np.zeros(1, buf.dtype))


# ============================ unlowered ASTs ============================
class _Masked:
    """An index value that is Invalid where `mask` is False (a gated index)."""

    __slots__ = ("val", "mask")

    def __init__(self, val: Any, mask: Any) -> None:
        self.val, self.mask = val, mask


_INVALID = object()


def eval_ast(ast: UOp, buffers: Sequence[BufferLike], var_vals: dict[str, int] | None = None) -> None:
    """Evaluate an unlowered kernel AST in place on `buffers` (indexed by PARAM slot) with variables `var_vals`."""
    var_vals = var_vals or {}
    nodes = ast.toposort()
    ranges = [u for u in nodes if u.op is Ops.RANGE]
    axis = {r: i for i, r in enumerate(ranges)}
    nd = len(ranges)
    bufs = _buffers_by_slot([u for u in nodes if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType)], buffers)
    vals: dict[UOp, Any] = {}

    def shape1(i: int, n: int) -> tuple[int, ...]:
        return tuple(n if j == i else 1 for j in range(nd))

    def full_shape(rs: Sequence[UOp]) -> tuple[int, ...]:
        shp = [1] * nd
        for r in rs:
            shp[axis[r]] = int(np.asarray(vals[r]).shape[axis[r]])
        return tuple(shp)

    for u in nodes:
        op = u.op
        if op is Ops.CONST:
            vals[u] = _INVALID if isinstance(u.arg, InvalidType) else nm.const_array(u.arg, u.dtype).reshape((1,) * nd)
        elif op is Ops.DEFINE_VAR:
            if u.arg[0] not in var_vals:
                raise RunArgumentError(f"eval_ast: no value for variable {u.arg[0]!r}; pass it in var_vals")
            vals[u] = np.array(var_vals[u.arg[0]], dtype=np.int64).reshape((1,) * nd)
        elif op is Ops.RANGE:
            end = int(np.asarray(vals[u.src[0]]).reshape(-1)[0])
            vals[u] = np.arange(max(end, 0), dtype=np.int64).reshape(shape1(axis[u], max(end, 0)))
        elif op is Ops.PARAM:
            vals[u] = bufs[_slot(u)] if isinstance(u.dtype, PtrDType) else None
        elif op is Ops.INDEX:
            idx = vals[u.src[1]]
            if len(u.src) > 2:
                g = vals[u.src[2]]
                idx = _Masked(idx.val, idx.mask & g) if isinstance(idx, _Masked) else _Masked(idx, g)
            vals[u] = (u.src[0], idx)
        elif op is Ops.LOAD:
            buf_u, idx = vals[u.src[0]]
            buf = vals[buf_u]
            mask = None
            if isinstance(idx, _Masked):
                idx, mask = idx.val, idx.mask
            elif idx is _INVALID:
                idx, mask = np.zeros((1,) * nd, np.int64), np.zeros((1,) * nd, bool)
            pos = np.asarray(idx, dtype=np.int64)
            if mask is not None:
                pos, mask = np.broadcast_arrays(pos, mask)
                pos = np.where(mask, pos, 0)
                pos, buf = _gated_positions(u, pos, mask, buf)
            elif pos.size and (pos.min() < 0 or pos.max() >= buf.size):
                raise _oob(u, pos, buf.size)
            v = nm.from_storage(buf[pos], buf_u.dtype.base)
            if mask is not None:
                alt = vals[u.src[1]] if len(u.src) > 1 else nm.const_array(0, u.dtype)
                v = np.where(mask, v, alt).astype(nm.compute_np(u.dtype))
            vals[u] = v
        elif op is Ops.WHERE and any(isinstance(vals[s], _Masked) or vals[s] is _INVALID for s in u.src):
            c, a, b = (vals[s] for s in u.src)
            if b is _INVALID and not isinstance(a, _Masked):
                vals[u] = _Masked(a, c)
            elif a is _INVALID and not isinstance(b, _Masked):
                vals[u] = _Masked(b, np.logical_not(c))
            else:
                raise ProgramFormError(f"eval_ast: unsupported gated index shape at {u.op} (nested Invalid)")
        elif op in GroupOp.ALU:
            srcs = [vals[s] for s in u.src]
            if any(s is _INVALID for s in srcs):
                vals[u] = _INVALID
                continue
            masks = [s.mask for s in srcs if isinstance(s, _Masked)]
            raw = [s.val if isinstance(s, _Masked) else s for s in srcs]
            r = nm.alu(op, u.dtype, *raw, src_dt=u.src[0].dtype)
            vals[u] = _Masked(r, np.logical_and.reduce(masks) if len(masks) > 1 else masks[0]) if masks else r
        elif op is Ops.CAST:
            x = vals[u.src[0]]
            vals[u] = x if x is _INVALID else nm.cast(x, u.src[0].dtype, u.dtype)
        elif op is Ops.BITCAST:
            vals[u] = nm.bitcast(vals[u.src[0]], u.src[0].dtype, u.dtype)
        elif op is Ops.REDUCE:
            rs = u.src[1:]
            v = np.broadcast_to(vals[u.src[0]], np.broadcast_shapes(np.shape(vals[u.src[0]]), full_shape(rs)))
            acc = np.broadcast_to(nm.const_array(nm.identity_element(u.arg, u.dtype), u.dtype),
                                  tuple(1 if axis_i in {axis[r] for r in rs} else n
                                        for axis_i, n in enumerate(v.shape)))  # fmt: skip
            ax = [axis[r] for r in rs]
            sizes = [v.shape[a] for a in ax]
            for flat in np.ndindex(*sizes):
                sl = [slice(None)] * nd
                for a, k in zip(ax, flat):
                    sl[a] = slice(k, k + 1)
                acc = nm.alu(u.arg, u.dtype, acc, v[tuple(sl)])
            vals[u] = acc
        elif op is Ops.STORE:
            buf_u, idx = vals[u.src[0]]
            vals[u] = (buf_u, idx, vals[u.src[1]])
        elif op is Ops.END:
            _ast_store(u, vals, full_shape(u.src[1:]), nd)
            vals[u] = None
        elif op in (Ops.SINK, Ops.GROUP, Ops.AFTER):
            vals[u] = None
        else:
            raise ProgramFormError(f"eval_ast: {op} is not part of a kernel AST (stage: eval_ast)")
    for u in nodes:  # stores not wrapped in END (kernels with no output ranges)
        if u.op is Ops.STORE and not any(u in p.src for p in nodes if p.op is Ops.END):
            _ast_store_one(u, vals, (1,) * nd)


def _ast_store(end: UOp, vals: dict[UOp, Any], shape: tuple[int, ...], nd: int) -> None:
    effects = [end.src[0]]
    while effects:
        e = effects.pop()
        if e.op is Ops.STORE:
            _ast_store_one(e, vals, shape)
        elif e.op in (Ops.GROUP, Ops.END):
            effects.extend(e.src[: 1 if e.op is Ops.END else len(e.src)])


def _ast_store_one(st: UOp, vals: dict[UOp, Any], shape: tuple[int, ...]) -> None:
    buf_u, idx, v = vals[st]
    buf = vals[buf_u]
    mask = None
    if isinstance(idx, _Masked):
        idx, mask = idx.val, idx.mask
    if idx is _INVALID:
        return
    shp = np.broadcast_shapes(np.shape(idx), np.shape(v), shape, np.shape(mask) if mask is not None else ())
    pos = np.broadcast_to(np.asarray(idx, dtype=np.int64), shp).reshape(-1)
    val = np.broadcast_to(nm.to_storage(v, buf_u.dtype.base), shp).reshape(-1)
    if mask is not None:
        m = np.broadcast_to(mask, shp).reshape(-1)
        pos, val = pos[m], val[m]
    if pos.size and (pos.min() < 0 or pos.max() >= buf.size):
        raise _oob(st, pos, buf.size)
    buf[pos] = val


# ============================ programs ============================
def _program_uops(spec_or_uops: Any) -> list[UOp]:
    uops = getattr(spec_or_uops, "uops", spec_or_uops)
    if not isinstance(uops, (list, tuple)) or not uops or not isinstance(uops[0], UOp):
        raise RunArgumentError("run_program expects a ProgramSpec or a non-empty list of UOps (a linearized program)")
    return list(uops)


def run_program(spec_or_uops: Any, buffers: Sequence[BufferLike], var_vals: dict[str, int] | None = None,
                core_range: tuple[int, int] | None = None) -> None:  # fmt: skip
    """Execute a linearized program (a ProgramSpec or its UOp list) in place on `buffers` (by PARAM slot).

    `core_range=(start, end)` runs only that slice of the outermost GLOBAL range, as one CPU worker would."""
    uops = _program_uops(spec_or_uops)
    var_vals = var_vals or {}
    bufs = _buffers_by_slot([u for u in uops if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType)], buffers)
    outer, batched = outer_global_range(uops), batched_range(uops)
    vals: dict[UOp, Any] = {}
    end_of: dict[int, int] = {}
    open_stack: list[int] = []
    for i, u in enumerate(uops):
        if u.op is Ops.RANGE:
            open_stack.append(i)
        elif u.op is Ops.END:
            if not open_stack:
                raise ProgramFormError(f"run_program: END at position {i} closes no open RANGE")
            end_of[open_stack.pop()] = i
    pos_of = {u: i for i, u in enumerate(uops)}
    nbatch = 1
    grid = _Grid.of(uops, vals, bufs, var_vals)
    if grid is not None:
        if core_range is not None:
            raise ProgramFormError("run_program: core_range slices a CPU program's outer range; a GPU program (with "
                                   "SPECIAL ids) runs its whole launch grid")  # fmt: skip
        nbatch, batched = grid.rows, None
    elif batched is not None:
        # registers defined before the batched range opens still need one row per batched iteration: evaluate the
        # range end (pure, batch-independent) up front to size them
        for n in batched.src[0].toposort():
            _exec_one(n, vals, bufs, var_vals, 1)
        end0 = int(np.asarray(vals[batched.src[0]]).reshape(-1)[0])
        lo0, hi0 = (0, end0) if core_range is None else (max(0, core_range[0]), min(end0, core_range[1]))
        nbatch = max(1, hi0 - lo0)
    loop_state: dict[int, list[int]] = {}  # range position -> [current k, end]
    pc = 0
    while pc < len(uops):
        u = uops[pc]
        op = u.op
        if op is Ops.RANGE:
            ends = np.asarray(vals[u.src[0]]).reshape(-1)
            if ends.size > 1 and (ends != ends[0]).any():
                raise ProgramFormError(f"run_program: RANGE {u.arg} has a trip count that differs between work-items "
                                       f"({int(ends.min())}..{int(ends.max())}); the interpreter runs GPU programs in "
                                       "lockstep and needs uniform loops")  # fmt: skip
            end = int(ends[0])
            if u is batched:
                lo, hi = (0, end) if core_range is None else (max(0, core_range[0]), min(end, core_range[1]))
                if hi <= lo:
                    pc = end_of[pc] + 1
                    continue
                vals[u] = np.arange(lo, hi, dtype=nm.storage_np(u.dtype)).reshape(-1, 1)
            else:
                # the outer range run index by index still covers only this worker's slice
                lo, hi = (
                    (0, end)
                    if u is not outer or core_range is None
                    else (max(0, core_range[0]), min(end, core_range[1]))
                )
                if hi <= lo:
                    pc = end_of[pc] + 1
                    continue
                loop_state[pc] = [lo, hi]
                vals[u] = np.full((1, 1), lo, dtype=nm.storage_np(u.dtype))
            pc += 1
            continue
        if op is Ops.END:
            rpos = pos_of[u.src[1]]
            if u.src[1] is not batched:
                st = loop_state[rpos]
                st[0] += 1
                if st[0] < st[1]:
                    vals[u.src[1]] = np.full((1, 1), st[0], dtype=nm.storage_np(u.src[1].dtype))
                    pc = rpos + 1
                    continue
            pc += 1
            continue
        _exec_one(u, vals, bufs, var_vals, nbatch, grid)
        if op is Ops.SINK:
            break
        pc += 1


def _exec_one(u: UOp, vals: dict[UOp, Any], bufs: dict[int, np.ndarray], var_vals: dict[str, int],
              nbatch: int, grid: _Grid | None = None) -> None:  # fmt: skip
    op = u.op
    if op is Ops.CONST:
        if isinstance(u.arg, InvalidType):
            raise ProgramFormError("run_program: an Invalid CONST reached a program (gates must be explicit)")
        vals[u] = u.arg  # weak literal: only ever read by its CAST
    elif op is Ops.CAST and u.src[0].op is Ops.CONST:
        vals[u] = nm.const_array(u.src[0].arg, u.dtype).reshape(1, 1) if u.dtype.count == 1 else \
            np.full((1, u.dtype.count), nm.const_array(u.src[0].arg, u.dtype.scalar()))  # fmt: skip
    elif op is Ops.DEFINE_VAR:
        if u.arg[0] not in var_vals:
            raise RunArgumentError(f"run_program: no value for variable {u.arg[0]!r}; pass it in var_vals")
        vals[u] = np.array([[var_vals[u.arg[0]]]], dtype=nm.storage_np(u.dtype))
    elif op is Ops.PARAM:
        vals[u] = ("buf", _slot(u)) if isinstance(u.dtype, PtrDType) else None
    elif op is Ops.SPECIAL:
        if grid is None or u.arg not in grid.ids:
            raise _unknown_special(u)
        vals[u] = grid.ids[u.arg]
    elif op is Ops.DEFINE_LOCAL:
        assert isinstance(u.dtype, PtrDType)
        if grid is None:
            raise ProgramFormError("run_program: DEFINE_LOCAL (workgroup memory) in a program without a launch grid")
        nwg = grid.workgroups
        vals[u] = (
            "local",
            (
                np.zeros(nwg * u.dtype.size * u.dtype.base.count, nm.storage_np(u.dtype.base)),
                u.dtype.size * u.dtype.base.count,
            ),
        )
    elif op is Ops.DEFINE_REG:
        assert isinstance(u.dtype, PtrDType)
        base = u.dtype.base
        size = max(u.dtype.size, 1)
        vals[u] = ("reg", np.zeros((nbatch, size * base.count), dtype=nm.compute_np(base)))
    elif op is Ops.INDEX:
        gate = vals[u.src[2]] if len(u.src) > 2 else None
        vals[u] = (vals[u.src[0]], np.asarray(vals[u.src[1]]).astype(np.int64), gate)
    elif op is Ops.LOAD:
        (kind, ref), idx, gate = vals[u.src[0]]
        alt = vals[u.src[1]] if len(u.src) > 1 else None
        vals[u] = _load(u, kind, ref, idx, gate, alt, bufs, grid)
    elif op is Ops.STORE:
        (kind, ref), idx, gate = vals[u.src[0]]
        _store(u, kind, ref, idx, gate, vals[u.src[1]], bufs, grid)
    elif op in GroupOp.ALU:
        vals[u] = nm.alu(op, u.dtype, *[vals[s] for s in u.src], src_dt=u.src[0].dtype)
    elif op is Ops.CAST:
        vals[u] = nm.cast(vals[u.src[0]], u.src[0].dtype, u.dtype)
    elif op is Ops.BITCAST:
        vals[u] = nm.bitcast(vals[u.src[0]], u.src[0].dtype, u.dtype)
    elif op is Ops.STACK:
        parts = [np.asarray(vals[s]) for s in u.src]
        b = max(p.shape[0] for p in parts)
        vals[u] = np.concatenate([np.broadcast_to(p, (b, p.shape[1])) for p in parts], axis=1)
    elif op is Ops.GEP:
        vals[u] = np.asarray(vals[u.src[0]])[:, list(u.arg)]
    elif op in (Ops.SINK, Ops.NOOP, Ops.BARRIER):
        vals[u] = None
    else:
        raise ProgramFormError(f"run_program: {op} is not part of the program form (KERNEL_CONTRACT.md section 2)")


def _positions(idx: np.ndarray, n: int) -> np.ndarray:
    return idx.reshape(idx.shape[0], 1) + np.arange(n, dtype=np.int64).reshape(1, n)


def _local_positions(u: UOp, ref: Any, idx: np.ndarray, n: int, gate: Any, grid: _Grid | None) -> Any:
    """A DEFINE_LOCAL access: (the flat array of every workgroup's copy, positions in it); raises when a work-item
    reaches outside its own workgroup's buffer."""
    assert grid is not None  # DEFINE_LOCAL refused to exist without one
    arr, size = ref
    wg = grid.workgroup_of_row
    pos = np.broadcast_to(_positions(idx, n), (wg.shape[0], n))
    live = pos if gate is None else pos[np.broadcast_to(np.asarray(gate).reshape(-1, 1), pos.shape)]
    if live.size and (live.min() < 0 or live.max() >= size):
        raise _oob(u, live, size)
    return arr, np.where((pos >= 0) & (pos < size), pos, 0) + wg.reshape(-1, 1) * size


def _load(u: UOp, kind: str, ref: Any, idx: np.ndarray, gate: Any, alt: Any, bufs: dict[int, np.ndarray],
          grid: _Grid | None = None) -> Any:  # fmt: skip
    n = u.dtype.count
    if kind == "reg":
        reg = ref
        rows = reg.shape[0]
        pos = np.broadcast_to(_positions(idx, n), (rows, n))
        if gate is not None:
            raise ProgramFormError("run_program: gated register loads are not part of the program form")
        return reg[np.arange(rows).reshape(-1, 1), pos]
    base = u.src[0].src[0].dtype.base  # type: ignore[attr-defined]
    if kind == "local":
        buf, pos = _local_positions(u, ref, idx, n, gate, grid)
    else:
        buf, pos = bufs[ref], _positions(idx, n)
    if gate is not None:
        g = np.asarray(gate).reshape(-1, 1)
        pos, g = np.broadcast_arrays(pos, g)
        pos = np.where(g, pos, 0)
        pos, buf = _gated_positions(u, pos, g, buf)
    elif pos.size and (pos.min() < 0 or pos.max() >= buf.size):
        raise _oob(u, pos, buf.size)
    v = nm.from_storage(buf[pos], base)
    if gate is not None:
        a = alt if alt is not None else nm.const_array(0, u.dtype.scalar())
        v = np.where(g, v, a).astype(nm.compute_np(u.dtype))
    return v


def _store(u: UOp, kind: str, ref: Any, idx: np.ndarray, gate: Any, val: Any, bufs: dict[int, np.ndarray],
           grid: _Grid | None = None) -> None:  # fmt: skip
    v = np.asarray(val)
    if kind == "reg":
        reg = ref
        rows = reg.shape[0]
        n = v.shape[1] if v.ndim == 2 else 1
        pos = np.broadcast_to(_positions(idx, n), (rows, n))
        vv = np.broadcast_to(v.reshape(-1, n) if v.ndim else v, (rows, n))
        if gate is not None:
            g = np.broadcast_to(np.asarray(gate).reshape(-1, 1), (rows, 1))[:, 0]
            reg[np.arange(rows)[g].reshape(-1, 1), pos[g]] = vv[g]
        else:
            reg[np.arange(rows).reshape(-1, 1), pos] = vv
        return
    base = u.src[0].src[0].dtype.base  # type: ignore[attr-defined]
    n = v.shape[1] if v.ndim == 2 else 1
    if kind == "local":
        buf, pos = _local_positions(u, ref, idx, n, gate, grid)
    else:
        buf, pos = bufs[ref], _positions(idx, n)
    g0 = None if gate is None else np.asarray(gate).reshape(-1, 1)
    # (the gate's rows count too: lanes with their own gates may store to one uniform address, the last one wins)
    shp = np.broadcast_shapes(pos.shape, v.shape) if g0 is None else np.broadcast_shapes(pos.shape, v.shape, g0.shape)
    pos, vv = np.broadcast_to(pos, shp), np.broadcast_to(nm.to_storage(v, base), shp)
    if g0 is not None:
        g = np.broadcast_to(g0, shp)
        pos, vv = pos[g], vv[g]
    pos, vv = pos.reshape(-1), vv.reshape(-1)
    if pos.size and (pos.min() < 0 or pos.max() >= buf.size):
        raise _oob(u, pos, buf.size)
    buf[pos] = vv


class _Grid:
    """The launch grid of a GPU program: every work-item is a row, workgroup-major (row = workgroup * local size +
    work-item), and each SPECIAL id is a column of those rows."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        dims = {p: [sizes.get(f"{p}{d}", 1) for d in range(3)] for p in ("gidx", "lidx")}
        nwg, nloc = int(np.prod(dims["gidx"])), int(np.prod(dims["lidx"]))
        self.rows = nwg * nloc
        row = np.arange(self.rows, dtype=np.int64)
        self.workgroups = nwg
        self.workgroup_of_row = row // nloc
        self.ids: dict[str, np.ndarray] = {}
        for p, flat in (("gidx", row // nloc), ("lidx", row % nloc)):
            stride = 1
            for d, n in enumerate(dims[p]):
                self.ids[f"{p}{d}"] = ((flat // stride) % n).astype(np.int32).reshape(-1, 1)
                stride *= n

    @staticmethod
    def of(
        uops: list[UOp], vals: dict[UOp, Any], bufs: dict[int, np.ndarray], var_vals: dict[str, int]
    ) -> _Grid | None:
        """The grid of a program with SPECIAL ids (their sizes evaluated first), else None."""
        specials = [u for u in uops if u.op is Ops.SPECIAL]
        if not specials:
            return None
        sizes: dict[str, int] = {}
        for sp in specials:
            if sp.arg[:4] not in ("gidx", "lidx") or not sp.arg[4:].isdigit() or int(sp.arg[4:]) > 2:
                raise _unknown_special(sp)
            for n in sp.src[0].toposort():
                _exec_one(n, vals, bufs, var_vals, 1)
            sizes[sp.arg] = int(np.asarray(vals[sp.src[0]]).reshape(-1)[0])
        return _Grid(sizes)


def _unknown_special(u: UOp) -> ProgramFormError:
    return ProgramFormError(f"run_program: SPECIAL {u.arg!r} is not a GPU id the interpreter knows (gidx0-2 "
                            "workgroup ids, lidx0-2 work-item ids)")  # fmt: skip


__all__ = ["as_buffer", "eval_ast", "run_program"]
_ = AddrSpace
