from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.manifest import ArtifactError
from models_registry.selectors import version_pinned
from workers.services import version_fetch, weights_cache
from workers.weights import Progress


class Command(BaseCommand):
    help = (
        "Prefetch registered model versions into this host's weights cache (a warm pool before "
        "a rollout), each file from the version's weights URI, verified by its SHA-256."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("versions", nargs="+", help="versions as model@label or model@id")

    def handle(self, *args: Any, **options: Any) -> None:
        versions = []
        for ref in options["versions"]:
            version = version_pinned(ref)
            if version is None:
                raise CommandError(f"no version {ref!r} (use model@label or model@id)")
            versions.append(version)
        for version in versions:
            printed: set[str] = set()

            def progress(p: Progress, printed: set[str] = printed) -> None:
                if p.file_done == p.file_size and p.path not in printed:
                    printed.add(p.path)
                    self.stdout.write(
                        f"  {p.path}  {p.file_size} bytes  ({p.done}/{p.total} of the version)"
                    )

            self.stdout.write(f"{version.public_name}:")
            try:
                directory = version_fetch(version=version, progress=progress)
            except ArtifactError as exc:
                raise CommandError(str(exc)) from exc
            files = len(version.manifest["files"])
            self.stdout.write(
                self.style.SUCCESS(f"{version.public_name}: {files} files in {directory}")
            )
        cache = weights_cache()
        self.stdout.write(f"cache {cache.root}: {cache.size_bytes()} bytes")
