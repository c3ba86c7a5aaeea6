"""``benchmarks/attention_timeline.py``: its copy of the decode-attention kernel with the phase marks. The marks go
in by text anchors in ``decode_attention.py``; a change there that moves one must fail here, not on the GPU."""

import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import attention_timeline  # noqa: E402


def test_every_mark_goes_into_the_kernel_and_the_copy_imports():
    traced = attention_timeline.traced_module()
    src = open(traced.__file__).read()
    assert src.count("_clock()") == 7 and src.count("_gtimer()") == 3  # six phase marks + the def; entry / exit
    assert src.count("_landed(") == 5 and "tl.store(_tr + 11" in src  # the RoPE prologue's two inner marks + the def
    assert "trace_ptr" in traced._decode_attention_kernel.arg_names
    assert traced.TRACE == [None] and traced.SPLIT_VISIBLE == attention_timeline.decode_attention.SPLIT_VISIBLE


def test_a_moved_anchor_is_named(monkeypatch, tmp_path):
    old = tmp_path / "decode_attention.py"
    old.write_text(open(attention_timeline.decode_attention.__file__).read().replace("    split = tl.program_id(1)\n",
                                                                                    "    split = tl.program_id(1) \n"))
    with pytest.raises(SystemExit, match="anchor not found once"):
        attention_timeline.traced_module(str(old))


def test_it_needs_a_gpu():
    if attention_timeline.torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="needs an NVIDIA GPU"):
        attention_timeline.main(["--batches", "1"])


def test_the_prologue_splits_into_its_three_parts_where_the_inner_marks_ran():
    import torch

    # one launch of two programs: entry 0, prologue 100, loop 400, ticket 500, merge 600 (the winner), exit 700;
    # loads landed at 30 / 40 and the math done at 80 / 70
    tr = torch.zeros(2, attention_timeline.SLOTS, dtype=torch.int64)
    tr[:, :6] = torch.tensor([0, 100, 400, 500, 600, 700])
    tr[:, 6], tr[:, 7], tr[:, 9] = 1000, 1350, torch.tensor([0, 1])
    tr[:, 10], tr[:, 11] = torch.tensor([30, 40]), torch.tensor([80, 70])
    rows = {r[0]: r[1:] for r in attention_timeline.summarize([tr], [1, 1])}
    assert [r for r in rows if r.startswith("prologue")] == ["prologue", *attention_timeline.PROLOGUE]
    # (median program, slowest): torch's median of two is the lower
    assert rows["prologue: loads land"] == ["30", "40"] and rows["prologue: norm / RoPE math"] == ["30", "50"]
    assert rows["prologue: k / v stores, barrier"] == ["20", "30"] and rows["prologue"] == ["100", "100"]
    tr[:, 10:] = 0  # a launch without them (another source's copy, the token form): no inner rows
    assert not any(r[0].startswith("prologue:") for r in attention_timeline.summarize([tr], [1, 1]))


@pytest.mark.parametrize("bad", ["NO_SUCH=1", "SPLIT_VISIBLE=yes", "config_for=1", "SPLIT_VISIBLE"])
def test_set_takes_only_the_modules_int_constants(bad):
    with pytest.raises(SystemExit, match="--set takes NAME=int"):
        attention_timeline.main(["--set", bad])
