"""Hypothesis profiles for the rules' properties: `ci` (the default, bounded for CI) and `long` (a search).

Choose one with the environment variable HYPOTHESIS_PROFILE, e.g. `HYPOTHESIS_PROFILE=long pytest tests/rules`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=_CHECKS, derandomize=True,
                          print_blob=True)
settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=_CHECKS, print_blob=True)
settings.register_profile("long", max_examples=100_000, deadline=None, suppress_health_check=_CHECKS,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
