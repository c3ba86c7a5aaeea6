"""The public API: every exported name resolves, and importing the package does no work."""

from __future__ import annotations

import subprocess
import sys

import fp8_fusion_pass


def test_every_export_resolves():
    for name in fp8_fusion_pass.__all__:
        assert getattr(fp8_fusion_pass, name) is not None, name


def test_import_is_lazy():
    # Importing the package must not import torch's compiler stack, triton, transformers or our pass.
    code = (
        "import sys, fp8_fusion_pass; "
        "heavy = [m for m in ('triton', 'transformers', 'fp8_fusion_pass.fusion_pass', 'torch') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import fp8_fusion_pass pulled in: {out}"
