"""The benchmark commands behind issue 7's figures still parse as written.

docs/benchmarks.md opens with "Where issue 7 stands": a table whose last column holds the command of each figure,
and a paragraph naming the sections that hold those runs' code blocks. A reader re-runs them on a GPU to reproduce
the figures, so a flag renamed or dropped in a script must fail here, on the CPU, not on the next GPU run. Each
command goes through its script's own ``main(argv)`` with ``argparse`` stopped right after parsing: nothing is
built or timed. (Older sections quote the commands of their own commits; those may use flags since withdrawn.)
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import re
import shlex
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
STANDS = "## Where issue 7 stands"


def _section(text: str, heading: str) -> str:
    """The text under the first heading that starts with ``heading``, up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading)
    stop = re.compile(r"^#{1,%d} " % level, re.MULTILINE)
    after = stop.search(text, start + len(heading))
    return text[start:after.start() if after else len(text)]


def _commands() -> list[str]:
    text = PAGE.read_text()
    stands = _section(text, STANDS)
    table_rows = [line for line in stands.splitlines() if line.startswith("| ") and "|---" not in line][1:]
    commands = [c for row in table_rows for c in re.findall(r"`([\w./]+\.py [^`]*)`", row.rsplit(" | ", 1)[-1])]
    intro = stands.split("\n\n")[1]
    named = re.findall(r'"([^"]+)"', intro)
    assert named, "the first paragraph under 'Where issue 7 stands' names the sections of its runs"
    for name in named:
        section = _section(text, "### " + name)
        for block in re.findall(r"```\n(.*?)```", section, flags=re.DOTALL):
            commands += [line.split("#")[0].strip() for line in block.splitlines() if "benchmarks/" in line]
    return commands


class _Parsed(Exception):
    pass


def _script_and_argv(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # PYTHONPATH=. and the like, before the command
        words = words[1:]
    words = words[1:] if words[0] == "python" else words
    return pathlib.Path(words[0]).stem, words[1:]


def _parse(script: str, argv: list[str], monkeypatch) -> None:
    """``benchmarks/<script>.py``'s ``main(argv)``, stopped by ``_Parsed`` right after its arguments parse."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))  # argparse exits (SystemExit 2) on a flag it does not know

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    importlib.import_module(script).main(argv)


COMMANDS = _commands()


def test_the_table_and_its_sections_hold_commands():
    scripts = {_script_and_argv(c)[0] for c in COMMANDS}
    assert {"decode", "fused_kernels", "gemm"} <= scripts, COMMANDS


@pytest.mark.parametrize("command", sorted(set(COMMANDS)))
def test_command_parses(command, monkeypatch):
    script, argv = _script_and_argv(command)
    assert (ROOT / "benchmarks" / f"{script}.py").exists(), command
    with pytest.raises(_Parsed):
        _parse(script, argv, monkeypatch)


def test_a_withdrawn_flag_fails(monkeypatch):
    # the check itself: gemm.py's --scales-ahead left it in ea76d3c
    with pytest.raises(SystemExit):
        _parse("gemm", ["--ms", "16", "--scales-ahead", "2"], monkeypatch)


def test_env_words_and_python_are_not_the_script():
    assert _script_and_argv("PYTHONPATH=. python benchmarks/decode.py --inductor force_shape_pad=True") == (
        "decode", ["--inductor", "force_shape_pad=True"])
    assert _script_and_argv("gemm.py --ms 1") == ("gemm", ["--ms", "1"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
