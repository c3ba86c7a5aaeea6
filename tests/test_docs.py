"""The user docs stay true: the index maps every page and example, links resolve, every reason code the report can
carry is documented, and the names, snippets and commands of docs/entry_points.md exist as written.

(That every ``guards.REASONS`` code has its section in docs/guards.md is tests/patterns/test_guards.py's check.)
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import shlex

import pytest

import fp8_fusion_pass
from fp8_fusion_pass import guards
from fp8_fusion_pass.cli import build_parser
from fp8_fusion_pass.patterns.zero_fill import FILL_REASONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
ENTRY_POINTS = DOCS / "entry_points.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(page: pathlib.Path) -> list[str]:
    return [m for m in LINK.findall(page.read_text()) if not m.startswith(("http://", "https://"))]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lowercase, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_index_maps_every_doc_and_example():
    linked = {(INDEX.parent / link.split("#")[0]).resolve() for link in _links(INDEX)}
    pages = {p.resolve() for p in DOCS.glob("*.md")} - {INDEX.resolve()}
    examples = {p.resolve() for p in (ROOT / "examples").glob("*.py")}
    assert not pages - linked, f"docs/index.md does not link: {sorted(p.name for p in pages - linked)}"
    assert not examples - linked, f"docs/index.md does not list: {sorted(p.name for p in examples - linked)}"


@pytest.mark.parametrize("page", [INDEX, ENTRY_POINTS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for link in _links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: broken link {link}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name}: no heading for #{anchor} in {path.name}"


def test_every_reason_code_the_report_can_carry_is_documented():
    # rejections (guards.REASONS) in guards.md; kept zero fills (zero_fill.FILL_REASONS) in zero_fill.md's table
    guards_text, fill_text = (DOCS / "guards.md").read_text(), (DOCS / "zero_fill.md").read_text()
    assert [c for c in guards.REASONS if f"`{c}`" not in guards_text] == []
    assert [c for c in FILL_REASONS if not re.search(rf"^\| `{c}` \|", fill_text, flags=re.MULTILINE)] == []


def test_entry_point_names_exist():
    text = ENTRY_POINTS.read_text()
    for name in sorted(set(re.findall(r"fp8_fusion_pass\.([a-z_]\w*)", text))):
        obj = getattr(fp8_fusion_pass, name, None)
        if obj is None:  # a submodule (fp8_fusion_pass.backend, .report, .cli)
            importlib.import_module(f"fp8_fusion_pass.{name}")
    assert {"backend", "fuse", "FP8FusionPass", "FusionConfig", "last_report", "set_backend"} <= set(
        re.findall(r"\b(\w+)\b", text))


def test_entry_point_snippets_parse():
    blocks = re.findall(r"```python\n(.*?)```", ENTRY_POINTS.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 6
    for block in blocks:
        ast.parse(block)


def test_cli_commands_in_the_docs_parse():
    blocks = re.findall(r"```bash\n(.*?)```", ENTRY_POINTS.read_text(), flags=re.DOTALL)
    commands = [line.split("#")[0].strip() for b in blocks for line in b.splitlines()]
    commands = [c for c in commands if c.startswith("fp8-fusion ")]
    verbs = {shlex.split(c)[1] for c in commands}
    assert verbs == {"diff", "verify", "scale-probe"}, verbs
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])  # argparse exits (SystemExit) on a bad flag
        assert args.verb in verbs
