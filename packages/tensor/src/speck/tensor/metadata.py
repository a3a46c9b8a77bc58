"""Which Tensor op made a graph node (tinygrad's Metadata), so a ScheduleItem can name the ops fused into its kernel.

Tensor._new records, for each node it wraps, the outermost public Tensor method on the call stack (`relu`, not the
`maximum` relu calls) and, with TRACEMETA >= 2, the user's file:line that called it. Nodes made inside backward()
are marked `backward`. TRACEMETA=0 records nothing."""

from __future__ import annotations

import os
import sys
import weakref
from types import CodeType
from typing import Any

from speck.tensor.pyutils import Metadata
from speck.tensor.settings import TRACEMETA
from speck.uop import Ops, UOp

# graph node -> the Tensor op that made it (the first op wins: hash-consing gives x+1 made twice one node), keyed by
# weak references. Recording is on the per-op hot path: a key's death callback is the dict's own `pop` (C, no Python
# frame; tinygrad-style WeakKeyDictionary bookkeeping would cost a Python call per node made and per node dying). The
# callback only fires while its weak reference is alive, i.e. while it is the entry's key (nobody else holds it)
node_metadata_data: dict[weakref.ref[UOp], Metadata] = {}
_ref = weakref.ref
_getframe = sys._getframe
_drop = node_metadata_data.pop


def _remember(u: UOp, m: Metadata) -> None:
    node_metadata_data[_ref(u, _drop)] = m


def metadata_of(u: UOp) -> Metadata | None:
    """The Tensor op that made u (None when none was recorded)."""
    return node_metadata_data.get(_ref(u))


_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NN = _PKG + "nn" + os.sep
_BACKWARD_FILES = ("autograd.py", "gradient.py")
# id(code object) -> (inside speck.tensor's op modules, a public method name or None, a backward module, the code
# object, and for a public method its shared Metadata as (forward, backward)). Keyed by id: hashing a code object
# hashes its contents (bytecode, constants, names) on every lookup, which made this per-op walk cost microseconds; the
# entry holds the code object, so its id is never reused while cached
_CODE_INFO: dict[int, tuple[bool, str | None, bool, CodeType, tuple[Metadata, Metadata] | None]] = {}


def _code_info(code: CodeType) -> tuple[bool, str | None, bool, CodeType, tuple[Metadata, Metadata] | None]:
    if (info := _CODE_INFO.get(id(code))) is None or info[3] is not code:
        fn, name = code.co_filename, code.co_name
        inside = fn.startswith(_PKG) and not fn.startswith(_NN)
        public = not name.startswith("_") or (name.startswith("__") and name.endswith("__") and name != "__init__")
        named = name if inside and public and name != "<lambda>" else None
        shared = None if named is None else (_shared(named, False), _shared(named, True))
        info = _CODE_INFO[id(code)] = (inside, named, fn.endswith(_BACKWARD_FILES), code, shared)
    return info


def _shared_constant(u: UOp) -> bool:
    """A constant seen through views: hash-consing shares such nodes among all graphs using the value, so they
    belong to no one op."""
    while u.op in _VIEWS and u.src:
        u = u.src[0]
    return u.op in (Ops.CONST, Ops.DEVICE, Ops.UNIQUE, Ops.BUFFER)


_VIEWS = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})


# (name, backward) -> its Metadata, when no caller is recorded (TRACEMETA=1): one object per op name, not one per node
_SHARED: dict[tuple[str, bool], Metadata] = {}


def _shared(name: str, backward: bool) -> Metadata:
    if (m := _SHARED.get((name, backward))) is None:
        m = _SHARED[(name, backward)] = Metadata(name, "", backward)
    return m


_CONSTISH = frozenset({Ops.CONST, Ops.DEVICE, Ops.UNIQUE, Ops.BUFFER}) | _VIEWS


def record(u: UOp, fresh: bool = False) -> None:
    """Remember which Tensor op (the outermost one on the stack) made u. `fresh`: u is a computation (no constant,
    view or buffer) its caller has just made, which nothing else holds (so it has no entry: an entry dies with its
    node): the tests for those are skipped."""
    level = TRACEMETA.value
    if not level or (not fresh and (type(u) is not UOp or _ref(u) in node_metadata_data
                                    or (u.op in _CONSTISH and _shared_constant(u)))):  # fmt: skip
        return
    f: Any = _getframe(2)
    named = None  # the entry of the outermost public op met so far
    backward = False
    infos = _CODE_INFO
    while f is not None:
        code = f.f_code
        if (info := infos.get(id(code))) is None:  # (an entry is always its id's own code object: see _CODE_INFO)
            info = _code_info(code)
        if not info[0]:
            break
        if info[4] is not None:
            named = info
        if info[2]:
            backward = True
        f = f.f_back
    if named is None:
        return
    shared: tuple[Metadata, Metadata] = named[4]  # type: ignore[assignment]  # (set: it was tested in the walk)
    if level >= 2 and f is not None:
        m = Metadata(shared[0].name, f"{f.f_code.co_filename}:{f.f_lineno}", backward)
    else:
        m = shared[backward]  # (the shared one: _SHARED's)
    node_metadata_data[_ref(u, _drop)] = m  # (_remember, inlined)


def mark_backward(forward: UOp, grads: list[UOp]) -> None:
    """Name the nodes a gradient rule of `forward` just built (those with no op of their own yet) after forward's
    op, marked backward."""
    if (m := node_metadata_data.get(_ref(forward))) is None or not TRACEMETA.value:
        return
    bw = Metadata(m.name, m.caller, True)
    for g in grads:
        for n in g.toposort(gate=lambda x: _ref(x) not in node_metadata_data and x.op is not Ops.BUFFER):
            if _ref(n) not in node_metadata_data and not _shared_constant(n):
                _remember(n, bw)
