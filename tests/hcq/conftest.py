"""Fixtures for the runtime tests: a private compile cache, the CPU device, and compiled hand-written kernels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # every test session compiles into its own cache so results never depend on an earlier run
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "speck-cache"))
    yield


@pytest.fixture
def cpu() -> Iterator[object]:
    from speck.hcq import Device

    dev = Device["CPU"]
    threads = dev.threads  # type: ignore[attr-defined]
    yield dev
    dev.threads = threads  # type: ignore[attr-defined]
    dev.synchronize()
