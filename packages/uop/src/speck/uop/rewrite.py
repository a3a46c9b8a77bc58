"""`graph_rewrite`: apply a PatternMatcher to a graph until nothing matches, with an explicit work stack (no Python
recursion, so 100k-node chains are fine) and a bound on rewrite chains (a rule set that never reaches a fixed point
raises instead of hanging)."""

from __future__ import annotations

from typing import Any

from speck.uop.errors import RewriteLoopError
from speck.uop.helpers import DEBUG
from speck.uop.settings import declare
from speck.uop.uop import UOp, register_service
from speck.uop.upat import PatternMatcher, _wants_ctx

REWRITE_LIMIT = declare(
    "REWRITE_LIMIT",
    1000,
    "speck.uop",
    ("speck.uop.rewrite",),
    "successive rewrites of one node before graph_rewrite calls it a loop",
    minimum=1,
)


def _describe_rule(pm: PatternMatcher, u: UOp, ctx: Any) -> str:
    """Name the rule that fires on u (re-run interpreted to find it; used only for error messages)."""
    for pat, fn in pm.rules_for(u.op):
        for store in pat.match(u, {}):
            ret = fn(ctx=ctx, **store) if _wants_ctx(fn) else fn(**store)
            if ret is not None and ret is not u:
                return f"{getattr(fn, '__qualname__', fn)} for pattern {pat!r}"
    return "<unknown rule>"


def _loop_error(pm: PatternMatcher, u: UOp, ctx: Any, name: str | None) -> RewriteLoopError:
    rule = _describe_rule(pm, u, ctx)
    where = f" in rewrite {name!r}" if name else ""
    return RewriteLoopError(
        f"graph_rewrite{where} did not reach a fixed point: node {u.op} was rewritten more than {REWRITE_LIMIT.value} "
        f"times in a row (or the rewrites far outnumber the graph's nodes); the last rule applied was {rule}. "
        "Two rules probably undo each other, or a rule keeps growing the graph."
    )


def _over_budget(root: UOp, total: int) -> bool:
    """A rule set that keeps growing the graph never repeats a node, so the chain limit can't see it: stop once
    the rewrites outnumber 50 per node of the input graph (real rule sets need a handful)."""
    return total > 50 * len(root.toposort())


def graph_rewrite(
    root: UOp,
    pm: PatternMatcher,
    ctx: Any = None,
    bottom_up: bool = False,
    name: str | None = None,
    walk: bool = False,
) -> UOp:
    """Rewrite `root` with `pm` to a fixed point and return the new root.

    Default order rewrites a node's sources first, then the node (and fully rewrites whatever a rule returns).
    `bottom_up=True` tries the rules on a node before descending into its sources (rule results are rewritten
    again). `walk=True` visits every node once: sources first, then at most one rule application per node.
    A pure matcher (`PatternMatcher(pure=True)`) rewriting without ctx in the default order starts from what earlier
    such rewrites found (`pm.memo()`): a subgraph rewritten before is not walked again."""
    if ctx is None and pm.pure and not bottom_up and not walk:
        return _rewrite_fixed_point(root, pm, None, name, pm.memo())[root]
    return _rewrite(root, pm, ctx, bottom_up, name, walk)[root]


def rewrites_anything(root: UOp, pm: PatternMatcher, ctx: Any = None) -> bool:
    """Whether `graph_rewrite(root, pm, ctx)` in the default order would change the graph: some rule fires on a node
    as it is. Exact when the rules keep no state in ctx: a node whose sources are unchanged is seen as it is, so when
    no rule fires on any node, nothing is rebuilt. A flat loop over the toposort (cached on a SINK) is much cheaper
    than the rewrite's walk, and the lowering pipeline has stages that leave most kernels as they are."""
    get = pm.op_table().get
    for u in root.toposort():
        f = get(u.op)
        if f is not None and f(u, ctx) is not None:
            return True
    return False


def _rewrite_fixed_point(root: UOp, pm: PatternMatcher, ctx: Any, name: str | None,
                         replace: dict[UOp, UOp] | None = None) -> dict[UOp, UOp]:  # fmt: skip
    """The default order (sources first, then the node, then whatever a rule returned), specialised because it is
    the hot loop of every simplify: stack entries are a node (visit it), a (node, None) pair (its sources are done
    now: rewrite it without checking them again) or a (node, result) pair (adopt the fully rewritten result), and
    a node whose sources are done is rewritten without a second trip through the stack.
    `replace` may hold results of earlier rewrites with the same pure matcher (every value in it is final)."""
    limit = REWRITE_LIMIT.value
    total, budget = 0, 100 * limit
    if replace is None:
        replace = {}
    depth: dict[UOp, int] = {}
    get = pm.op_table().get
    stack: list[Any] = [root]
    pop, push = stack.pop, stack.append
    while stack:
        n = pop()
        if type(n) is tuple:
            n, r = n
            if r is not None:
                replace[n] = replace[r]
                continue
            if n in replace:  # (a rule's result elsewhere may have reached it meanwhile)
                continue
            src = n.src
        else:
            if n in replace:
                continue
            src = n.src
            pending = False
            for s in reversed(src):  # popped in source order
                if s not in replace:
                    if not pending:
                        push((n, None))  # come back once the sources are done
                        pending = True
                    push(s)
            if pending:
                continue
        new_src = tuple([replace[s] for s in src])
        changed = new_src != src  # tuple compare: identity first, and UOps compare by identity
        nn = UOp(n.op, n.dtype, new_src, n.arg, n.tag) if changed else n
        f = get(nn.op)
        r = None if f is None else f(nn, ctx)
        if r is None:
            replace[n] = nn
            if changed:
                replace[nn] = nn
            continue
        d = depth.get(n, 0) + (r not in nn.src)  # returning one of its own sources shrinks the graph: progress
        total += 1
        if d > limit or (total > budget and _over_budget(root, total)):
            raise _loop_error(pm, nn, ctx, name)
        if depth.get(r, 0) < d:
            depth[r] = d
        if r in replace:
            replace[n] = replace[r]
            continue
        push((n, r))
        push(r)
    if DEBUG >= 6 and name is not None:
        print(f"graph_rewrite {name}: {len(replace)} nodes visited")
    return replace


def _rewrite(root: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None, walk: bool) -> dict[UOp, UOp]:
    if not bottom_up and not walk:
        return _rewrite_fixed_point(root, pm, ctx, name)
    limit = REWRITE_LIMIT.value
    total, budget = 0, 100 * limit  # past the budget, the graph's size decides whether this is still progress
    replace: dict[UOp, UOp] = {}
    depth: dict[UOp, int] = {}
    # stack entries: (node, stage, pending result of a rewrite)
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    table = pm.op_table()
    get = table.get

    def rewrite(u: UOp, ctx: Any) -> UOp | None:
        f = get(u.op)
        return None if f is None else f(u, ctx)

    while stack:
        n, stage, pend = stack.pop()
        if stage == 0:
            if n in replace:
                continue
            if bottom_up and not walk:
                r = rewrite(n, ctx)
                if r is not None:
                    # returning one of its own sources shrinks the graph: progress, not a step of a loop
                    d = depth.get(n, 0) + (r not in n.src)
                    total += 1
                    if d > limit or (total > budget and _over_budget(root, total)):
                        raise _loop_error(pm, n, ctx, name)
                    if depth.get(r, 0) < d:
                        depth[r] = d
                    stack.append((n, 2, r))
                    stack.append((r, 0, None))
                    continue
            stack.append((n, 1, None))
            for s in reversed(n.src):
                if s not in replace:
                    stack.append((s, 0, None))
        elif stage == 1:
            src = n.src
            new_src = tuple([replace[s] for s in src])
            changed = new_src != src  # tuple compare: identity first, and UOps compare by identity
            nn = UOp(n.op, n.dtype, new_src, n.arg, n.tag) if changed else n
            if walk:
                r = rewrite(nn, ctx)
                replace[n] = r if r is not None else nn
                continue
            if bottom_up:
                if changed:
                    if nn in replace:
                        replace[n] = replace[nn]
                        continue
                    stack.append((n, 2, nn))
                    stack.append((nn, 0, None))
                else:
                    replace[n] = n
                continue
            f = get(nn.op)
            r = None if f is None else f(nn, ctx)
            if r is None:
                replace[n] = nn
                if changed:
                    replace[nn] = nn
                continue
            d = depth.get(n, 0) + (r not in nn.src)
            total += 1
            if d > limit or (total > budget and _over_budget(root, total)):
                raise _loop_error(pm, nn, ctx, name)
            if depth.get(r, 0) < d:
                depth[r] = d
            if r in replace:
                replace[n] = replace[r]
                continue
            stack.append((n, 2, r))
            stack.append((r, 0, None))
        else:
            assert pend is not None
            replace[n] = replace[pend]
    if DEBUG >= 6 and name is not None:
        print(f"graph_rewrite {name}: {len(replace)} nodes visited")
    return replace


def graph_rewrite_map(root: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False,
                      name: str | None = None) -> dict[UOp, UOp]:  # fmt: skip
    """Rewrite `root` and return what each visited original node became (the root always included)."""
    replace = _rewrite(root, pm, ctx, bottom_up, name, False)
    return {u: replace[u] for u in root.toposort() if u in replace}


register_service("graph_rewrite", graph_rewrite)
