"""``tests/gpu_suite.sh`` runs every file that has GPU tests, each in exactly one of its parts."""

from __future__ import annotations

import pathlib
import re
import subprocess

TESTS = pathlib.Path(__file__).parent
SCRIPT = TESTS / "gpu_suite.sh"


def _parts() -> dict[str, list[str]]:
    text = SCRIPT.read_text()
    return {name: body.split() for name, body in re.findall(r"^(PART\d)=\(([^)]*)\)", text, flags=re.MULTILINE)}


def test_every_gpu_test_file_is_in_one_part():
    gpu_files = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py")
                       if re.search(r"pytest\.mark\.gpu\b", p.read_text()))  # fmt: skip
    listed = [f for files in _parts().values() for f in files]
    assert len(_parts()) == 3 and sorted(listed) == gpu_files, (sorted(set(gpu_files) ^ set(listed)), listed)


def test_a_part_it_does_not_have_is_refused():
    done = subprocess.run(["bash", str(SCRIPT), "4"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "usage" in done.stderr
