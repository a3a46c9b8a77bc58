"""Expansion of UPCAST/UNROLL ranges into vector lanes.

Every node that depends on expand ranges A (sorted by axis id) gets prod(sizes of A) lanes, row-major over A. Two
representations: value nodes are one vector UOp (STACK/GEP/vector ALU); index-domain nodes (weakint math, INDEX
pointers, and anything derived from them) are a list of scalar per-lane UOps, since weakint has no vector form.
Loads and stores whose per-lane indices are contiguous become vector LOAD/STORE at lane 0's index (a run per
group of the innermost axis when the whole vector is not contiguous), otherwise scalar accesses STACKed together.
A REDUCE over an UNROLL range combines that axis's lanes horizontally (once after the loop when the REDUCE also has loop
ranges: the accumulator keeps every lane); END simply forgets expand ranges."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from speck.codegen.errors import ProgramFormError
from speck.uop import AxisType, GroupOp, InvalidType, PtrDType, UOp, dtypes
from speck.uop.affine import linear_terms
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)
from speck.uop.symbolic import fold_alu

EXPAND_TYPES = (AxisType.UPCAST, AxisType.UNROLL)


@dataclass
class _Val:
    """An expanded node: `axes` it varies over, and either one (vector) UOp or a list of per-lane scalar UOps."""

    axes: tuple[UOp, ...]
    vec: UOp | None = None
    lanes: list[UOp] | None = None


def _size(r: UOp) -> int:
    end = r.src[0]
    if end.op is not Ops.CONST or not isinstance(end.arg, int):
        raise ProgramFormError(
            f"expand: {r.arg[-1].name} range axis {r.arg[:-1]} needs a constant size, found {end.op}"
        )
    return int(end.arg)


def _key(r: UOp) -> tuple[int, ...]:
    return tuple(r.arg[:-1])


class _Expander:
    def __init__(self, wide_shuffles: bool = True) -> None:
        self.wide_shuffles = wide_shuffles
        self.memo: dict[UOp, _Val] = {}
        self.maps: dict[tuple[tuple[UOp, ...], tuple[UOp, ...]], list[int]] = {}

    def nlanes(self, axes: tuple[UOp, ...]) -> int:
        n = 1
        for a in axes:
            n *= _size(a)
        return n

    def mapping(self, src_axes: tuple[UOp, ...], axes: tuple[UOp, ...]) -> list[int]:
        """For each lane of `axes`, the lane of a value over `src_axes` (a subset) it reads."""
        key = (src_axes, axes)
        if key in self.maps:
            return self.maps[key]
        sizes = [_size(a) for a in axes]
        pos = {a: i for i, a in enumerate(axes)}
        out = []
        for coords in product(*[range(s) for s in sizes]):
            lane = 0
            for a in src_axes:
                lane = lane * _size(a) + coords[pos[a]]
            out.append(lane)
        self.maps[key] = out
        return out

    def as_vec(self, v: _Val, axes: tuple[UOp, ...]) -> UOp:
        """v broadcast to `axes` as one vector UOp (a scalar when axes is empty)."""
        m = self.mapping(v.axes, axes)
        if v.lanes is not None:
            return UOp.stack(*[v.lanes[i] for i in m])
        assert v.vec is not None
        if not v.axes:
            return UOp.stack(*[v.vec] * len(m)) if len(m) > 1 else v.vec
        if m == list(range(v.vec.dtype.count)):
            return v.vec
        return v.vec.gep(*m)

    def as_lanes(self, v: _Val, axes: tuple[UOp, ...]) -> list[UOp]:
        m = self.mapping(v.axes, axes)
        if v.lanes is not None:
            return [v.lanes[i] for i in m]
        assert v.vec is not None
        return [v.vec if not v.axes else v.vec.gep(i) for i in m]

    def run(self, sink: UOp) -> UOp:
        for u in sink.toposort():
            self.memo[u] = self.expand(u)
        res = self.memo[sink]
        assert res.vec is not None and not res.axes
        return res.vec

    def expand(self, u: UOp) -> _Val:
        memo = self.memo
        srcs = [memo[s] for s in u.src]
        op = u.op
        if op is Ops.RANGE and u.arg[-1] in EXPAND_TYPES:
            return _Val((u,), lanes=[UOp.const(u.dtype, k) for k in range(_size(u))])
        if not any(s.axes for s in srcs):
            # nothing below varies over lanes: rebuild with (possibly rewritten) sources
            new = tuple(s.vec if s.vec is not None else s.lanes[0] for s in srcs)  # type: ignore[index]
            if op in (Ops.END, Ops.REDUCE):
                return self.close(u, new, ())
            return _Val((), vec=u.replace(src=new) if new != u.src else u)
        axes = tuple(sorted({a for s in srcs for a in s.axes}, key=_key))
        if op in (Ops.END, Ops.REDUCE):
            return self.close(u, None, axes)
        if op is Ops.LOAD:
            return self.load(u, srcs, axes)
        if op is Ops.STORE:
            return self.store(u, srcs, axes)
        if op is Ops.SINK or op is Ops.GROUP:
            raise ProgramFormError(
                f"expand: {op.name} source still varies over expand ranges {[_key(a) for a in axes]}"
            )
        lanes_mode = lanes_only(u.dtype) or any(s.lanes is not None for s in srcs)
        if lanes_mode:
            per = [self.as_lanes(s, axes) for s in srcs]
            lanes = [UOp(op, u.dtype, srcs_k, u.arg) for srcs_k in zip(*per)]  # lane k: every source's lane k
            if op is Ops.CDIV or op is Ops.CMOD:
                # a lane's j//16 and j%16 of constants fold, so contiguity (decided on linear forms) sees the runs
                # of a column block spanning two 16-float stripes of a packed matmul operand
                lanes = [_folded(x) for x in lanes]
            if op is Ops.CAST and not lanes_only(u.dtype):
                # index math becoming a value (a random counter, an arange): one vector from here on, so what is
                # computed from it is vector ops, not one scalar chain per lane (threefry: 8x the IR, 10x the LLVM time)
                return _Val(axes, vec=UOp.stack(*lanes))
            return _Val(axes, lanes=lanes)
        if u.dtype.count != 1 or op not in GroupOp.ALU | {Ops.CAST, Ops.BITCAST}:
            raise ProgramFormError(f"expand: can't vectorize {op.name} of {u.dtype} over expand ranges")
        n = self.nlanes(axes)
        vs = tuple(self.as_vec(s, axes) for s in srcs)
        return _Val(axes, vec=UOp(op, u.dtype.vec(n), vs, u.arg))

    # ---------------- memory ----------------
    def _index_lanes(self, idx_val: _Val, axes: tuple[UOp, ...]) -> list[UOp]:
        # not simplified here: contiguity is decided on linear forms, and only the indices kept get simplified
        return self.as_lanes(idx_val, axes)

    def _runs(self, idxs: list[UOp], axes: tuple[UOp, ...]) -> int | None:
        """Length of contiguous runs the lanes split into (all lanes, else groups of the innermost axis, else halves
        of those down to 4 lanes: a register block of two 16-float column stripes in different places), or None."""
        inner = _size(axes[-1]) if axes else 1
        runs = [len(idxs), inner]
        while inner % 2 == 0 and inner > 4:
            inner //= 2
            runs.append(inner)
        for run in runs:
            if run <= 1:
                continue
            if all(_contiguous(idxs[g : g + run]) for g in range(0, len(idxs), run)):
                return run
        return None

    def load(self, u: UOp, srcs: list[_Val], axes: tuple[UOp, ...]) -> _Val:
        idx_val = srcs[0]
        idxs = self._index_lanes(idx_val, axes)
        alt = self.as_vec(srcs[1], axes) if len(srcs) > 1 else None
        same = _all_same(idxs)
        run = None if same else self._runs(idxs, axes)
        n = len(idxs)
        if run is None:
            if same:  # every lane reads the same element
                ld = UOp(Ops.LOAD, u.dtype, (idxs[0].simplify(), *([alt.gep(0)] if alt is not None else [])), u.arg)
                return _Val(axes, vec=UOp.stack(*[ld] * n))
            simple = [ix.simplify() for ix in idxs]
            if alt is None and (span := _short_span(simple)) is not None:
                # the lanes read a few neighbouring elements, some more than once (an upsampled operand at w // 2):
                # one vector load of the span, its lanes picked out
                base, offs = span
                if max(offs) == 0:  # one element after simplification
                    one = UOp(Ops.LOAD, u.dtype, (simple[base],), u.arg)
                    return _Val(axes, vec=UOp.stack(*[one] * n))
                ld = UOp(Ops.LOAD, u.dtype.vec(max(offs) + 1), (simple[base],), u.arg)
                return _Val(axes, vec=ld.gep(*offs))
            loads = [UOp(Ops.LOAD, u.dtype, (simple[k], *([alt.gep(k)] if alt is not None else [])), u.arg)
                     for k in range(n)]  # fmt: skip
            return _Val(axes, vec=UOp.stack(*loads))
        parts = []
        for g in range(0, n, run):
            extra = (alt.gep(*range(g, g + run)),) if alt is not None else ()
            parts.append(UOp(Ops.LOAD, u.dtype.vec(run), (idxs[g].simplify(), *extra), u.arg))
        if len(parts) == 1:
            return _Val(axes, vec=parts[0])
        return _Val(axes, vec=UOp.stack(*[p.gep(i) for p in parts for i in range(run)]))

    def store(self, u: UOp, srcs: list[_Val], axes: tuple[UOp, ...]) -> _Val:
        idxs = self._index_lanes(srcs[0], axes)
        val = self.as_vec(srcs[1], axes)
        n = len(idxs)
        run = None if _all_same(idxs) else self._runs(idxs, axes)
        if run is None:
            sts = [UOp(Ops.STORE, dtypes.void, (idxs[k].simplify(), val.gep(k)), u.arg) for k in range(n)]
        else:
            sts = [UOp(Ops.STORE, dtypes.void, (idxs[g].simplify(), val.gep(*range(g, g + run)) if run < n else val),
                       u.arg) for g in range(0, n, run)]  # fmt: skip
        return _Val((), vec=sts[0] if len(sts) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(sts)))

    # ---------------- closing ranges ----------------
    def close(self, u: UOp, new: tuple[UOp, ...] | None, axes: tuple[UOp, ...]) -> _Val:
        rngs = [r for r in u.src[1:] if r.arg[-1] not in EXPAND_TYPES]
        xr = [r for r in u.src[1:] if r.arg[-1] in EXPAND_TYPES]
        if u.op is Ops.END:
            body = self.memo[u.src[0]]
            if body.axes:
                raise ProgramFormError("expand: an END's effect still varies over expand ranges")
            eff = body.vec
            assert eff is not None
            rs = [self.memo[r].vec for r in rngs]
            return _Val((), vec=UOp(Ops.END, u.dtype, (eff, *rs), u.arg) if rs else eff)  # type: ignore[arg-type]
        val = self.memo[u.src[0]]
        out_axes = tuple(a for a in val.axes if a not in xr)
        v = self.as_vec(val, val.axes) if val.axes else (val.vec if val.vec is not None else val.lanes[0])  # type: ignore[index]
        rs = [self.memo[r].vec for r in rngs]
        if xr and any(a in val.axes for a in xr) and rs:
            # loop-carried: accumulate every lane (a vector accumulator) and combine the unrolled lanes once after
            # the loop, not on every iteration
            v = UOp(Ops.REDUCE, v.dtype, (v, *rs), u.arg)  # type: ignore[arg-type]
            rs = []
        if xr and any(a in val.axes for a in xr):
            red_axes = tuple(a for a in val.axes if a in xr)
            groups: dict[int, list[int]] = {}
            for lane, coords in enumerate(product(*[range(_size(a)) for a in val.axes])):
                c = dict(zip(val.axes, coords))
                okey = 0
                for a in out_axes:
                    okey = okey * _size(a) + c[a]
                rkey = 0
                for a in red_axes:
                    rkey = rkey * _size(a) + c[a]
                groups.setdefault(rkey, [0] * self.nlanes(out_axes))[okey] = lane
            parts = [groups[rk] for rk in sorted(groups)]
            v = _combine_lanes(v, parts, u.arg) if self.wide_shuffles else _combine_in_order(v, parts, u.arg)
        # a REDUCE over an expand range the value doesn't depend on: x op x op ... (n times)
        for r in xr:
            if r not in val.axes:
                base = v
                for _ in range(_size(r) - 1):
                    v = v.alu(u.arg, base)
        res = UOp(Ops.REDUCE, v.dtype, (v, *rs), u.arg) if rs else v  # type: ignore[arg-type]
        return _Val(out_axes, vec=res)


def _combine_in_order(v: UOp, groups: list[list[int]], op: Ops) -> UOp:
    """Combine the lane groups of v with `op` one group after another (each group: one lane per output)."""
    acc = v.gep(*groups[0])
    for g in groups[1:]:
        acc = acc.alu(op, v.gep(*g))
    return acc


def _combine_lanes(v: UOp, groups: list[list[int]], op: Ops) -> UOp:
    """Combine the lane groups of v (each: the lanes of one reduce position, one per output) with `op` as a tree of
    halves: the first half of the groups with the second, as one wide op, then again on the result (whose lanes are
    output-major, so each output's partial results stay together in one register). Done one group at a time, 8
    accumulators of 16 lanes took 15 dependent 8-lane ops, each gathering a lane from every accumulator; halving
    needs one two-register shuffle pair per output register and level. An odd group left over joins last."""
    n = len(groups[0])
    left: UOp | None = None
    while len(groups) > 1:
        if len(groups) % 2:
            last = v.gep(*groups[-1])
            left = last if left is None else last.alu(op, left)
            groups = groups[:-1]
        h = len(groups) // 2
        lo = v.gep(*[groups[k][o] for o in range(n) for k in range(h)])
        hi = v.gep(*[groups[h + k][o] for o in range(n) for k in range(h)])
        v = lo.alu(op, hi)
        groups = [[o * h + k for o in range(n)] for k in range(h)]
    out = v if v.dtype.count == n and groups[0] == list(range(n)) else v.gep(*groups[0])
    return out if left is None else out.alu(op, left)


def lanes_only(dt: object) -> bool:
    """Index-domain dtypes (weakint, pointers) have no vector form: their nodes expand to per-lane scalars."""
    return dt == dtypes.weakint or isinstance(dt, PtrDType)


def _folded(x: UOp) -> UOp:
    """x as a constant when its sources are constants, else x."""
    if all(s.op is Ops.CONST for s in x.src) and (c := fold_alu(x)) is not None:
        return c
    return x


def _all_same(idxs: list[UOp]) -> bool:
    """Every lane addresses the same element (same gate, zero offset)."""
    if all(x is idxs[0] for x in idxs):
        return True
    base, gate = _split_gate(idxs[0])
    for x in idxs[1:]:
        b, g = _split_gate(x)
        if b is None or base is None or g is not gate or b.src[0] is not base.src[0]:
            return False
        if index_offset(base.src[1], b.src[1]) != 0:
            return False
    return True


def _short_span(idxs: list[UOp]) -> tuple[int, list[int]] | None:
    """(lane with the lowest index, every lane's offset from it) when all lanes index one buffer under one gate at
    constant offsets spanning fewer elements than there are lanes (so some element is read twice) and a power of
    two of them, else None. The span's ends are both read, so every element between them is in bounds too."""
    base, gate = _split_gate(idxs[0])
    if base is None or len(idxs) < 2:
        return None
    offs = [0]
    for x in idxs[1:]:
        b, g = _split_gate(x)
        if b is None or g is not gate or b.src[0] is not base.src[0]:
            return None
        if (o := index_offset(base.src[1], b.src[1])) is None:
            return None
        offs.append(o)
    lo = min(offs)
    rel = [o - lo for o in offs]
    span = max(rel) + 1
    if span >= len(idxs) or span & (span - 1):  # C vector types need a power-of-two width
        return None
    return offs.index(lo), rel


def _contiguous(idxs: list[UOp]) -> bool:
    """idx_k == idx_0 + k for every lane (gated indices: same gate on every lane)."""
    base, gate = _split_gate(idxs[0])
    if base is None:
        return False
    bterms, bconst = linear_terms(base.src[1])
    for k, x in enumerate(idxs[1:], start=1):
        b, g = _split_gate(x)
        if g is not gate or b is None or b.src[0] is not base.src[0]:
            return False
        terms, const = linear_terms(b.src[1])
        if terms != bterms or const - bconst != k:
            return False
    return True


def index_offset(a: UOp, b: UOp) -> int | None:
    """b - a when it is a constant (same non-constant terms), else None."""
    ta, ca = linear_terms(a)
    tb, cb = linear_terms(b)
    return cb - ca if ta == tb else None


def _split_gate(ix: UOp) -> tuple[UOp | None, UOp | None]:
    """INDEX(buf, WHERE(c, i, Invalid)) -> (INDEX(buf, i), c); plain INDEX -> (itself, None)."""
    if ix.op is not Ops.INDEX or len(ix.src) != 2:
        return None, None
    i = ix.src[1]
    if i.op is Ops.WHERE and i.src[2].op is Ops.CONST and isinstance(i.src[2].arg, InvalidType):
        return ix.replace(src=(ix.src[0], i.src[1])), i.src[0]
    return ix, None


def expand_vectors(sink: UOp, wide_shuffles: bool = True) -> UOp:
    """Expand every UPCAST/UNROLL range of `sink` into vector lanes (no-op when there are none). `wide_shuffles`
    (Renderer.wide_shuffles): an unrolled reduction's lanes combine as a tree of halves, else one group at a time."""
    if not any(u.op is Ops.RANGE and u.arg[-1] in EXPAND_TYPES for u in sink.toposort()):
        return sink
    return _Expander(wide_shuffles).run(sink)
