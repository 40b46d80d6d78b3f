"""The apps keep to the layers of docs/design/layers.md (the contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("tenants.selectors", "billing.models"),  # a ground app imports one above it
        ("workers.services", "inference.base.errors"),  # siblings in a layer: none imports another
    ],
)
def test_an_upward_or_sideways_import_breaks_the_contract(tmp_path, module, imported):
    # A copy of the project in which one module imports what its layer may not.
    for name in ("pyproject.toml", "config", "dataplane", "tenants", "models_registry",
                 "billing", "privacy", "safety", "rollouts", "inference", "workers", "batches",
                 "console", "embedded"):  # fmt: skip
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp_path / name)
    changed = tmp_path / (module.replace(".", "/") + ".py")
    changed.write_text(changed.read_text() + f"\nimport {imported}\n")
    linted = _lint_imports(cwd=tmp_path)
    assert linted.returncode == 1
    assert f"{module} -> {imported}" in linted.stdout
