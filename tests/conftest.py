"""Shared pytest setup: hypothesis profiles. CI uses a bounded, derandomized profile; `HYPOTHESIS_PROFILE=dev`
searches harder."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------- the C compilers the C backend must work with ----------------
import shutil  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

# Debian's gcc (has _Float16 on x86) and clang 14 (has not): the C renderer must serve both. CI installs both.
C_COMPILERS = ("gcc", "clang")


@pytest.fixture(params=C_COMPILERS)
def c_compiler(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs the test once per C compiler, with `CC` naming it (what ClangCompiler and find_c_compiler read). A
    missing compiler fails the test: the README's test command installs both."""
    path = shutil.which(request.param)
    if path is None:
        pytest.fail(f"{request.param} is not installed; the C backend is tested with both gcc and clang "
                    "(apt-get install gcc clang)")  # fmt: skip
    monkeypatch.setenv("CC", request.param)
    yield path
