"""speck.uop.ops.FastOps: the hot lowering modules import it as `Ops`, so it must be Ops for everything they do with
it: the same member objects under every name (aliases included), iteration, lookup by value and by name, isinstance."""

from __future__ import annotations

import pickle

from speck.uop import Ops
from speck.uop.ops import FastOps


def test_every_member_and_alias_is_the_enum_member_itself() -> None:
    for name, member in Ops.__members__.items():
        assert getattr(FastOps, name) is member
    assert FastOps.IDIV is Ops.CDIV and FastOps.MOD is Ops.CMOD


def test_what_else_a_module_does_with_ops_goes_to_ops() -> None:
    assert list(FastOps) == list(Ops) and len(FastOps) == len(Ops)
    assert all(FastOps(m.value) is m and FastOps[m.name] is m for m in Ops)
    assert isinstance(Ops.ADD, FastOps) and not isinstance(1, FastOps)
    assert Ops.ADD in FastOps and "ADD" not in FastOps
    assert FastOps.__members__ == Ops.__members__
    assert pickle.loads(pickle.dumps(FastOps.RANGE)) is Ops.RANGE  # members pickle as the enum's
