"""The data plane sits under every app: it imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import dataplane

APPS = {
    "inference",
    "tenants",
    "workers",
    "billing",
    "batches",
    "models_registry",
    "safety",
    "privacy",
    "console",
}


def test_the_data_plane_imports_no_app():
    package = Path(dataplane.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in APPS]
    assert len(list(package.rglob("*.py"))) > 10  # the walk reads the package
    assert found == []
