"""The apps keep to the layers of docs/design-notes.md (the contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lint_imports(*, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache", "--no-logo"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_no_app_imports_from_a_layer_above_it():
    linted = _lint_imports(cwd=ROOT)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    # A copy of the project in which tenants, a ground app, imports billing, above it.
    for name in ("pyproject.toml", "config", "dataplane", "tenants", "models_registry",
                 "billing", "privacy", "safety", "rollouts", "inference", "workers", "batches",
                 "console", "embedded"):  # fmt: skip
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp_path / name)
    selectors = tmp_path / "tenants" / "selectors.py"
    selectors.write_text(selectors.read_text() + "\nfrom billing.models import UsageRecord\n")
    linted = _lint_imports(cwd=tmp_path)
    assert linted.returncode == 1
    assert "tenants.selectors -> billing.models" in linted.stdout
