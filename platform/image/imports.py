"""Import every module of the platform in the image build, so a dependency missing from the
image fails the build rather than a process in production.

`manage.py check` imports the apps, URLs and models; this goes further, into the modules only a
worker, a Celery task or a management command imports (the engine, invoices, the exporters).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]


# Not in the image (.containerignore): the test suite and the benchmarks.
NOT_SHIPPED = {"tests", "bench"}


def packages() -> list[str]:
    """The repository's top-level Python packages (folders with an __init__.py) it ships."""
    found = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    return sorted(found - NOT_SHIPPED)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    django.setup()
    failures = []
    count = 0
    for package in packages():
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            # Migrations run through migrate; settings modules read their environment.
            if ".migrations." in info.name or info.name.startswith("config.settings."):
                continue
            count += 1
            try:
                importlib.import_module(info.name)
            except ImportError as exc:
                failures.append(f"{info.name}: {exc}")
    if failures:
        sys.exit("modules that do not import in the image:\n  " + "\n  ".join(failures))
    print(f"{count} modules import")


if __name__ == "__main__":
    main()
