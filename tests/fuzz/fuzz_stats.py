"""The fuzz profile in force and the session tally (``conftest.py`` prints it; tests add to it)."""

from __future__ import annotations

import collections
import os

from hypothesis import settings

PROFILE = os.environ.get("FP8_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"FP8_FUZZ_PROFILE must be ci or long, got {PROFILE!r}")

# Examples per test that pays two full Inductor compiles (C++ codegen: 15-40 s each here), per profile.
FULL_COMPILE_EXAMPLES = {"ci": 1, "long": 4}[PROFILE]
# Examples of the adversarial whole-model fuzz, per profile.
ADVERSARIAL_EXAMPLES = {"ci": 10, "long": 100}[PROFILE]

TALLY: collections.Counter = collections.Counter()
REASONS: collections.Counter = collections.Counter()
FINDINGS: list[str] = []


def profile(**overrides) -> settings:
    """The settings of the profile in force (registered in conftest.py), with ``overrides``."""
    return settings(settings.get_profile(PROFILE), **overrides)
