from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.demo_adapter import demo_adapter_build


class Command(BaseCommand):
    help = "Build a tiny LoRA adapter (PEFT format) for the demo model from a seed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", type=Path, required=True, help="output directory (new)")
        parser.add_argument(
            "--base",
            type=Path,
            default=None,
            help="the base model directory (default: DATA_DIR/models/tiny-llama)",
        )
        parser.add_argument("--seed", type=int, default=1, help="weight seed")
        parser.add_argument("--rank", type=int, default=8, help="LoRA rank")

    def handle(self, *args: Any, **options: Any) -> None:
        base = options["base"] or Path(settings.DATA_DIR) / "models" / "tiny-llama"
        if not (base / "config.json").is_file():
            raise CommandError(f"no model at {base}; run build_demo_model first")
        try:
            out = demo_adapter_build(
                base_dir=base, out_dir=options["out"], rank=options["rank"], seed=options["seed"]
            )
        except (FileExistsError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"built adapter {out} (rank {options['rank']}, seed {options['seed']})")
