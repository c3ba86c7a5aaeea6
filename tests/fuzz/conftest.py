"""Hypothesis profiles for the fuzz tests, and a tally of what they tried.

Profiles (``FP8_FUZZ_PROFILE``, default ``ci``):
Registered here, applied per test through ``fuzz_stats.profile()``.

- ``ci``: the quick CI run. Few examples, derandomized (the same examples every run, so CI is not flaky and a
  failure reproduces), no example database written. Budget: < 3 minutes on a loaded 2-core box.
- ``long``: the documented soak (docs/reliability.md): many random examples, ~20 minutes on the same box;
  failures are saved in ``.hypothesis/`` and replayed first next time.

    FP8_FUZZ_PROFILE=long pytest tests/fuzz -q -p no:cacheprovider

The tally (graphs compiled, inputs run through both graphs, fusions applied, rejection reasons seen) is printed
at the end of the session and, with ``FP8_FUZZ_STATS=path``, written there as JSON.
"""

from __future__ import annotations

import json
import os

from fuzz_stats import PROFILE, REASONS, TALLY
from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "deadline": None,  # one example compiles a model: seconds, and load-dependent on a shared box
    "suppress_health_check": (HealthCheck.too_slow, HealthCheck.data_too_large),
    "print_blob": True,  # a failure prints @reproduce_failure(...) to replay it exactly
}
# ci: no shrink phase - shrinking a model-compiling example ran > 5 minutes; the failing example is printed as drawn.
settings.register_profile("ci", max_examples=6, derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.generate), **_COMMON)
settings.register_profile("long", max_examples=200, **_COMMON)
# Not settings.load_profile(): that would change hypothesis defaults for every test in the session; the fuzz
# tests take their profile explicitly (fuzz_stats.profile()).


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY:
        return
    terminalreporter.section(f"fp8 fuzz tally (profile {PROFILE})")
    for key, value in sorted(TALLY.items()):
        terminalreporter.write_line(f"{key}: {value}")
    terminalreporter.write_line(f"rejection reasons seen: {dict(sorted(REASONS.items()))}")
    path = os.environ.get("FP8_FUZZ_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({"profile": PROFILE, "tally": dict(TALLY), "reasons": dict(REASONS)}, f, indent=2)
