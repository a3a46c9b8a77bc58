"""Reverse-mode differentiation of tensor-level UOp graphs.

`compute_gradient(root, root_grad, targets)` walks the graph from `root` back to `targets` and returns the gradient
of each target. The local derivative of every op is a rule in the `pm_gradient` table below: given the node and the
gradient flowing into it, it returns one gradient (or None) per source."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from speck.tensor.errors import GradientError
from speck.tensor.metadata import mark_backward
from speck.uop import Ops, PatternMatcher, UOp, UPat, dtypes
from speck.uop.uop import sint


def const_like(x: UOp, v: float | int | bool) -> UOp:
    """A constant with x's dtype broadcast to x's shape."""
    c = UOp.const(x.dtype.scalar(), v)
    shape = x.shape
    if not shape:
        return c
    return c.reshape((1,) * len(shape)).expand(shape)


def _broadcast_back(grad: UOp, shape: tuple[sint, ...]) -> UOp:
    """Sum grad over the axes where `shape` was expanded (shape has 1s there)."""
    axes = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    return grad.reduce_axis(Ops.ADD, axes) if axes else grad


def _reduce_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    op, axes = ret.arg
    x = ret.src[0]
    if op is Ops.ADD:
        return (ctx.expand(x.shape),)
    if op is Ops.MAX:
        # the gradient goes to every position that equals the max, split evenly between ties
        mask = x.ne(ret.expand(x.shape)).ne(True).cast(ctx.dtype)
        count = mask.reduce_axis(Ops.ADD, axes)
        return ((mask / count.expand(x.shape)) * ctx.expand(x.shape),)
    if op is Ops.MUL:
        # d(prod)/dx_i is the product of the other elements: prod / x_i where x_i != 0; at a zero it is the product
        # of the nonzero elements if x_i is the only zero, else 0 (prod / x_i would give nan there)
        zero, one = const_like(x, 0), const_like(x, 1)
        nz = x.ne(zero)
        nzero = nz.where(zero, one).reduce_axis(Ops.ADD, axes)
        prod_nz = nz.where(x, one).reduce_axis(Ops.MUL, axes)
        at_zero = nzero.eq(const_like(nzero, 1)).where(prod_nz, const_like(prod_nz, 0)).expand(x.shape)
        safe_x = nz.where(x, one)
        return (nz.where(ret.expand(x.shape) / safe_x, at_zero) * ctx.expand(x.shape),)
    return (None,)


def _pad_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    x = ret.src[0]
    return (ctx.shrink(tuple((b, b + s) for (b, _), s in zip(ret.arg, x.shape))),)


def _shrink_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    x = ret.src[0]
    return (ctx.pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, x.shape))),)


def _permute_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    inv = tuple(sorted(range(len(ret.arg)), key=lambda i: ret.arg[i]))
    return (ctx.permute(inv),)


def _pow_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    x, y = ret.src
    dx = ctx * y * x.pow(y - const_like(y, 1))
    # d/dy x**y = x**y * ln(x); where x == 0 and y > 0 the limit is 0
    lnx = x.log2() * const_like(x, math.log(2))
    dy = ctx * ret * x.eq(const_like(x, 0)).where(const_like(x, 0), lnx)
    return (dx, dy)


def _cos(x: UOp) -> UOp:
    """cos(x) as 1 - 2 sin(x/2)^2: exact halving, no rounding of x - pi/2 (whose error is up to ulp(x)/2: 0.03 at
    x = 1e6 in float32)."""
    s = (x * const_like(x, 0.5)).sin()
    return const_like(x, 1) - const_like(x, 2) * s * s


def _where_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    c = ret.src[0]
    zero = const_like(ctx, 0)
    return (None, c.where(ctx, zero), c.where(zero, ctx))


def _max_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    x, y = ret.src
    # ties split the gradient in half, like the MAX reduction
    gt, eq = (y < x).cast(ctx.dtype), x.eq(y).cast(ctx.dtype)
    half = const_like(ctx, 0.5)
    return (ctx * (gt + eq * half), ctx * ((const_like(ctx, 1) - gt - eq) + eq * half))


def _copy_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
    # a copy to another device: the gradient is copied back to the device the value came from
    dev = uop_device(ret.src[0])
    back = UOp(Ops.COPY, ctx.dtype, (ctx, UOp(Ops.DEVICE, arg=dev)), dev)
    return (back,) + (None,) * (len(ret.src) - 1)


# rules built from tensor ops by the layer that owns the Tensor class (ASSIGN, the O(k) scatter: speck.tensor.tensor
# registers speck.tensor.indexing.scatter_gradient over its class): op -> rule(gradient of node, node)
_TENSOR_RULES: dict[Ops, Callable[[UOp, UOp], tuple[UOp | None, ...] | None]] = {}


def register_gradient_rule(op: Ops, rule: Callable[[UOp, UOp], tuple[UOp | None, ...] | None]) -> None:
    """Differentiate `op` nodes with rule(gradient of node, node) -> one gradient per source (None: no rule)."""
    _TENSOR_RULES[op] = rule


def _tensor_rule(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...] | None:
    if (rule := _TENSOR_RULES.get(ret.op)) is None:
        raise GradientError(f"no gradient rule for {ret.op} is registered: the Tensor class registers it when "
                            "speck.tensor is imported; import speck.tensor before differentiating")  # fmt: skip
    return rule(ctx, ret)


def uop_device(u: UOp) -> str:
    """The device a tensor-level node computes on: that of the first buffer, copy or device it reaches."""
    for n in u.toposort(gate=lambda x: x.op not in (Ops.BUFFER, Ops.COPY)):
        if n.op is Ops.BUFFER:
            return str(n.src[1].arg)
        if n.op in (Ops.COPY, Ops.DEVICE):
            return str(n.arg)
    raise GradientError(f"can't tell which device a {u.op} node computes on (it reaches no buffer or device)")


pm_gradient = PatternMatcher(
    [
        (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype),)),
        (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * ret * ret,)),
        (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (_cos(ret.src[0]) * ctx,)),
        (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * const_like(ret.src[0], math.log(2))),)),
        (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ret * ctx * const_like(ret, math.log(2)),)),
        (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * const_like(ret, 2)),)),
        (UPat(Ops.NEG, name="ret"), lambda ctx, ret: (-ctx,)),
        (
            UPat(
                (
                    Ops.CMPLT,
                    Ops.CMPNE,
                    Ops.CMPEQ,
                    Ops.TRUNC,
                    Ops.CDIV,
                    Ops.CMOD,
                    Ops.AND,
                    Ops.OR,
                    Ops.XOR,
                    Ops.SHL,
                    Ops.SHR,
                    Ops.BITCAST,
                    Ops.THREEFRY,
                ),
                name="ret",
            ),
            lambda ctx, ret: (None,) * len(ret.src),
        ),  # fmt: skip
        (UPat(Ops.ADD, name="ret"), lambda ctx, ret: (ctx, ctx)),
        (UPat(Ops.SUB, name="ret"), lambda ctx, ret: (ctx, -ctx)),
        (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ret.src[1] * ctx, ret.src[0] * ctx)),
        (
            UPat(Ops.FDIV, name="ret"),
            lambda ctx, ret: (ctx / ret.src[1], -ctx * ret.src[0] / (ret.src[1] * ret.src[1])),
        ),  # fmt: skip
        (UPat(Ops.MULACC, name="ret"), lambda ctx, ret: (ret.src[1] * ctx, ret.src[0] * ctx, ctx)),
        (UPat(Ops.MAX, name="ret"), _max_grad),
        (UPat(Ops.POW, name="ret"), _pow_grad),
        (UPat(Ops.WHERE, name="ret"), _where_grad),
        (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_grad),
        (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
        (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_broadcast_back(ctx, ret.src[0].shape),)),
        (UPat(Ops.PERMUTE, name="ret"), _permute_grad),
        (UPat(Ops.PAD, name="ret"), _pad_grad),
        (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
        (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(ret.arg),)),
        (UPat((Ops.CONTIGUOUS, Ops.AFTER), name="ret"), lambda ctx, ret: (ctx,) + (None,) * (len(ret.src) - 1)),
        (UPat(Ops.DETACH, name="ret"), lambda ctx, ret: (None,) * len(ret.src)),
        (UPat(Ops.COPY, name="ret"), _copy_grad),
        (UPat(Ops.ASSIGN, name="ret"), _tensor_rule),
    ]
)


GradientRule = Callable[[UOp], tuple[UOp | None, ...]]
# composite ops (convolution) whose derivative is better built directly than from their movement-op graph:
# node -> (the inputs it is differentiated against, rule(gradient of node) -> one gradient per input)
_OVERRIDES: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], GradientRule]] = weakref.WeakKeyDictionary()


def user_gradients(got: Any, srcs: tuple[UOp, ...], what: str, error: type[Exception]) -> tuple[UOp | None, ...]:
    """What a user's grad_fxn returned for inputs `srcs`, checked: one UOp (a Tensor is fine too) of its input's
    shape, or None, per input. `what` names the grad_fxn in messages ("grad_fxn of @function f"); `error` is raised."""
    grads = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    if len(grads) != len(srcs):
        raise error(f"{what} returned {len(grads)} gradient(s) for {len(srcs)} input(s); return one UOp (or None) per "
                    "input, in argument order")  # fmt: skip
    out: list[UOp | None] = []
    for k, (g, src) in enumerate(zip(grads, srcs)):
        g = getattr(g, "uop", g)
        if g is not None and (not isinstance(g, UOp) or g.shape != src.shape):
            found = f"shape {g.shape}" if isinstance(g, UOp) else type(g).__name__
            raise error(f"{what}: gradient {k} must be a UOp of shape {src.shape} (or None), got {found}")
        out.append(g)
    return tuple(out)


def override_gradient(node: UOp, inputs: tuple[UOp, ...], rule: GradientRule) -> None:
    """Differentiate `node` with `rule` (gradient of node -> one gradient per input, or None) instead of walking
    the graph that computes it: the gradient reaches `inputs` directly and nothing between them and node."""
    # the table is keyed weakly on node: a rule holding node (or a tensor of it) would keep its entry for good
    cells = getattr(rule, "__closure__", None) or ()
    assert not any((v := c.cell_contents) is node or getattr(v, "_uop", None) is node for c in cells), "rule holds node"
    _OVERRIDES[node] = (inputs, rule)


def _flows_to(u: UOp) -> tuple[UOp, ...]:
    """The nodes u's gradient flows to: its sources, or the inputs of its overridden rule (which a gather of a
    sharded tensor reaches only through the rule: speck.tensor.multi)."""
    if u.op is Ops.DETACH:
        return ()
    override = _OVERRIDES.get(u)
    return u.src if override is None else override[0]


def _deepwalk(root: UOp, targets: set[UOp]) -> list[UOp]:
    """Nodes between root and any target (the only ones gradients flow through), sources first."""
    on_path: dict[UOp, bool] = {}
    order: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:  # toposort along _flows_to (iterative: graphs are deep)
        u, visited = stack.pop()
        if u in order:
            continue
        if visited:
            order[u] = None
            on_path[u] = u in targets or any(on_path.get(s, False) for s in _flows_to(u))
            continue
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(_flows_to(u)) if s not in order)
    return [u for u in order if on_path[u]]


def _unbroadcast(g: UOp, src: UOp) -> UOp:
    """g summed back to src's shape where src was broadcast implicitly (a graph node combining a () or size-1 source
    with a bigger one, without an EXPAND node: its gradient has the bigger shape)."""
    if not (g.has_shape and src.has_shape) or g.shape == src.shape:
        return g
    gs, ss = g.shape, src.shape
    if len(ss) > len(gs) or not all(isinstance(d, int) for d in (*gs, *ss)):
        return g
    lead = len(gs) - len(ss)
    axes = tuple(range(lead)) + tuple(lead + i for i, (a, b) in enumerate(zip(ss, gs[lead:])) if a == 1 and b != 1)
    if any(a != b and a != 1 for a, b in zip(ss, gs[lead:])):
        return g  # (not a broadcast: leave it to the rule that made it)
    return g.reduce_axis(Ops.ADD, axes).reshape(ss) if axes else g.reshape(ss)


def _add_contributions(prev: UOp, new: UOp, node: UOp) -> UOp:
    return prev + new


# How two gradient contributions to one node combine. speck.tensor.multi (above this module) registers its own: a
# plain node (a constant) can be shared by a sharded graph and a one-device one (graph nodes are interned), and a
# sharded contribution to it is gathered to the node's device first.
_COMBINE: list[Callable[[UOp, UOp, UOp], UOp]] = [_add_contributions]


def register_combine(fn: Callable[[UOp, UOp, UOp], UOp]) -> None:
    """Make fn(prev, new, node) the way two gradient contributions to node add up (speck.tensor.multi, once)."""
    _COMBINE[0] = fn


def compute_gradient(root: UOp, root_grad: UOp, targets: Iterable[UOp]) -> dict[UOp, UOp]:
    """Gradient of `root` (seeded with root_grad) with respect to each target reachable from root.

    Targets not reachable from root are absent from the result."""
    tset = set(targets)
    grads: dict[UOp, UOp] = {root: root_grad}
    for u in reversed(_deepwalk(root, tset)):
        g = grads.get(u)
        if g is None:  # (a target in the middle of the graph passes its gradient on: backward() fills every tensor)
            continue
        srcs: tuple[UOp, ...] = u.src
        local: tuple[UOp | None, ...] | None
        if (override := _OVERRIDES.get(u)) is not None:
            srcs, local = override[0], override[1](g)
        else:
            local = pm_gradient.rewrite(u, ctx=g)  # type: ignore[assignment]
        if local is None:
            # a leaf: nothing to pass its gradient on to (a realized sharded tensor's node has no sources either)
            if not srcs or u.op in (Ops.BUFFER, Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.DEVICE, Ops.UNIQUE):
                continue
            raise GradientError(f"no gradient rule for {u.op}; it can't be differentiated (detach() its input)")
        for s, sg in zip(srcs, local):
            if sg is None:
                continue
            if sg.dtype != s.dtype and dtypes.is_float(s.dtype):
                sg = sg.cast(s.dtype)
            sg = _unbroadcast(sg, s)
            grads[s] = _COMBINE[0](grads[s], sg, s) if s in grads else sg
        mark_backward(u, [grads[s] for s in srcs if s in grads])
    return {t: grads[t] for t in tset if t in grads}
