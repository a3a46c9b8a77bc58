"""tests/codegen run with SPEC=1: the lowering pipeline verifies the spec after every stage and spec_program on the
final program (what CI and `python3 -m pytest tests/codegen` check)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from speck.uop import Context


@pytest.fixture(autouse=True, scope="session")
def _spec_checks_on() -> Iterator[None]:
    with Context(SPEC=1):
        yield
