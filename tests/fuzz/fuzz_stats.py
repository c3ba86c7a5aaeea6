"""The fuzz profile in force and the session tally (``conftest.py`` prints it; tests add to it)."""

from __future__ import annotations

import collections
import os

from hypothesis import Phase, settings

PROFILE = os.environ.get("FP8_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"FP8_FUZZ_PROFILE must be ci or long, got {PROFILE!r}")

# Examples of the adversarial whole-model fuzz, per profile.
ADVERSARIAL_EXAMPLES = {"ci": 10, "long": 100}[PROFILE]

TALLY: collections.Counter = collections.Counter()
REASONS: collections.Counter = collections.Counter()


def profile(**overrides) -> settings:
    """The settings of the profile in force (registered in conftest.py), with ``overrides``."""
    return settings(settings.get_profile(PROFILE), **overrides)


def full_compile_profile() -> settings:
    """For tests paying two real Inductor compiles per example (C++ codegen: 10-40 s here): in CI only their
    explicit examples, in the long profile 6 drawn ones on top."""
    if PROFILE == "ci":
        return profile(phases=(Phase.explicit,))
    return profile(max_examples=6)
