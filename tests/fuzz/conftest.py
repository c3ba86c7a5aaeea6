"""Hypothesis profiles for the fuzz tests, and a tally of what they tried.

Profiles (``FP8_FUZZ_PROFILE``, default ``ci``):
Registered here, applied per test through ``fuzz_stats.profile()``.

- ``ci``: the quick CI run. Few examples, derandomized (the same examples every run, so CI is not flaky and a
  failure reproduces), no example database written. Budget: < 3 minutes on a loaded 2-core box.
- ``long``: the documented soak (docs/reliability.md): many random examples, ~35 minutes on the same box (-n 2);
  failures are saved in ``.hypothesis/`` and replayed first next time.

    FP8_FUZZ_PROFILE=long pytest tests/fuzz -q -p no:cacheprovider -n 2

The tally (graphs compiled, inputs run through both graphs, fusions applied, rejection reasons seen) is printed
at the end of the session (by tests/conftest.py, which also sums the workers' under pytest-xdist) and, with
``FP8_FUZZ_STATS=path``, written there as JSON.
"""

from __future__ import annotations

import json

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


def pytest_sessionfinish(session):
    """Hand the tally to the summary that tests/conftest.py prints: in this process, or, under pytest-xdist (CI runs
    ``-n 2``), from each worker to the controller, which sums them (its ``pytest_testnodedown``)."""
    if not TALLY:
        return
    counts = {"profile": PROFILE, "tally": dict(TALLY), "reasons": dict(REASONS)}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fp8_fuzz"] = json.dumps(counts)
    else:
        session.config.__dict__.setdefault("fp8_fuzz_tallies", []).append(counts)
