"""Shared pytest setup: hypothesis profiles. CI uses a bounded, derandomized profile; `HYPOTHESIS_PROFILE=dev`
searches harder."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
