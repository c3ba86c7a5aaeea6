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
