from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.weights import Progress, WeightsCache, WeightsError, manifest_load


class Command(BaseCommand):
    help = (
        "Prefetch a model version's files into the local weights cache from a JSON manifest "
        "(a list of {path, sha256, size, uri}), verifying each file's SHA-256."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # Here --version names the model version; it replaces Django's --version option.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--manifest", required=True, type=Path, help="JSON list of files")
        parser.add_argument("--version", required=True, help="version digest to cache them as")
        parser.add_argument(
            "--cache-root",
            type=Path,
            default=None,
            help="cache directory (default: <SWITCHYARD_DATA_DIR>/weights)",
        )
        parser.add_argument(
            "--max-bytes",
            type=int,
            default=None,
            help="evict least recently used versions above this size",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        root = options["cache_root"] or Path(settings.DATA_DIR) / "weights"
        cache = WeightsCache(root=root, max_bytes=options["max_bytes"])

        printed: set[str] = set()

        def progress(p: Progress) -> None:
            if p.file_done == p.file_size and p.path not in printed:
                printed.add(p.path)
                self.stdout.write(
                    f"{p.path}  {p.file_size} bytes  ({p.done}/{p.total} bytes of the version)"
                )

        try:
            files = manifest_load(options["manifest"])
            vdir = cache.fetch(options["version"], files, progress=progress)
        except (OSError, ValueError, WeightsError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"{len(files)} files in {vdir}"))
