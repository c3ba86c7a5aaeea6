"""Thread and process safety of the pass's lazy pattern registration and of compiles that share a cache dir.

- Threads: the patterns are traced once per process, lazily, under a lock (``fusion_pass._traced``). With the
  trace reset, several threads ask for the table at the same moment (a barrier, and each traced form slowed down
  to widen the race window): one thread traces, all get the same table. Then two models are compiled with the
  backend in two threads at once, from the untraced state: both fuse as they do alone and compute what eager does.
  (The pass is not run on copies of one graph in threads: such copies share one FakeTensorMode, which is not
  thread-safe - torch raises ``AssertionError: False, True`` in ``in_kernel_invocation_manager`` - and no real
  compile shares a fake mode between threads.)
- Processes: two fresh processes (two models) compile at the same moment (a file barrier) into one fresh
  ``TORCHINDUCTOR_CACHE_DIR``: each report has its model's counts. (Hits on an entry written by another process
  are ``test_cache_safety.py``'s.)
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import reliability_worker
import tolerances
import torch

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from fuzz_harness import applied_counts

import fp8_fusion_pass
from fp8_fusion_pass import fusion_pass, verify
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.models import build_model, example_inputs
from fp8_fusion_pass.patterns import _site

QWEN3_L1 = {"norm_quant": 1, "add_norm_quant": 1, "silu_quant": 1}  # engine qwen3-tiny, 1 layer
LLAMA_L2 = {"norm_quant": 1, "add_norm_quant": 3, "silu_quant": 2}  # engine llama-tiny, 2 layers
THREADS = 4
TRACE_DELAY_S = 0.05  # per traced form: keeps the first tracer inside the lock while the others arrive

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _in_threads(fn, n: int) -> list:
    """Run ``fn(i)`` in n threads released together; re-raise the first exception."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def work(i):
        try:
            barrier.wait(timeout=60)
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def untraced(monkeypatch):
    """The pass as in a fresh process (nothing traced yet), with tracing counted and slowed down. ``Form._trace``
    is the tracing; ``Form.patterns`` serves its cache, which norm_rope also reads from the compiling threads."""
    calls = []
    original = _site.Form._trace

    def slow_trace(self):
        calls.append(threading.get_ident())
        time.sleep(TRACE_DELAY_S)
        return original(self)

    monkeypatch.setattr(fusion_pass, "_TRACED", None)
    monkeypatch.setattr(_site, "_PATTERNS", {})
    monkeypatch.setattr(_site.Form, "_trace", slow_trace)
    return calls


def test_lazy_registration_is_traced_once_under_a_thread_race(untraced):
    fusion_pass._traced()
    serial = len(untraced)  # forms traced by one first use
    assert serial >= 6, serial  # add-norm, norm and silu, each in the op and the plain-torch form

    fusion_pass._TRACED = None  # untraced again: now race
    _site._PATTERNS.clear()
    untraced.clear()
    tables = _in_threads(lambda i: fusion_pass._traced(), THREADS)
    assert len(untraced) == serial, f"{len(untraced)} forms traced by {THREADS} racing threads, {serial} by one"
    assert len(set(untraced)) == 1, "more than one thread traced"
    assert all(t is tables[0] for t in tables), "threads got different pattern tables"


def test_two_models_compile_concurrently_in_threads(untraced):
    models = [build_model("qwen3-tiny", form="engine", scheme="block", layers=1),
              build_model("llama-tiny", form="engine", scheme="block", layers=2)]
    inputs = [example_inputs(m, batch=2, seq=5) for m in models]
    options = {"emulate_precision_casts": True, "fx_graph_cache": False}  # a cache hit would skip the pass
    torch._dynamo.reset()
    report_mod.clear_reports()

    def compile_and_run(i):
        with torch.no_grad():
            return torch.compile(models[i], backend=fp8_fusion_pass.backend(**options))(*inputs[i])

    outs = _in_threads(compile_and_run, 2)
    torch._dynamo.reset()
    counts = sorted((applied_counts(r) for r in report_mod.all_reports()), key=lambda c: c["add_norm_quant"])
    assert counts == [QWEN3_L1, LLAMA_L2]
    assert len(set(untraced)) == 1  # one thread traced the patterns
    for model, args, got in zip(models, inputs, outs):
        with torch.no_grad():
            want = model(*args)
        check = verify.compare("threads", "logits", want, got, tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR)
        assert check.ok and check.positions_agree, check


def test_two_processes_compile_concurrently_with_one_cache_dir(tmp_path):
    jobs = [("qwen3", "qwen3-tiny", "1"), ("llama", "llama-tiny", "2")]
    barrier = str(tmp_path / "barrier")

    def worker(i):
        name, model, layers = jobs[i]
        return reliability_worker.spawn(tmp_path, name, "--model", model, "--layers", layers, "--barrier", barrier,
                                        "--parties", str(len(jobs)))

    for result, want in zip(_in_threads(worker, len(jobs)), (QWEN3_L1, LLAMA_L2)):
        (counts,) = result["reports"]  # each compiled (missed the empty cache) and ran the pass
        assert {k: v for k, v in counts.items() if k in want} == want, result
        assert result["cache_hit_reports"] == 0
    assert len(list((tmp_path / "barrier").glob("ready-*"))) == 2
