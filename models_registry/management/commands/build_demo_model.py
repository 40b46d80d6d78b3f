from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from models_registry.demo_model import demo_model_build


class Command(BaseCommand):
    help = "Build the tiny demo chat model (Llama architecture, trained on the CPU, local data)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--out",
            type=Path,
            default=None,
            help="output directory (default: DATA_DIR/models/tiny-llama)",
        )
        parser.add_argument(
            "--seed", type=int, default=0, help="seed of the weights and the training data"
        )
        parser.add_argument("--force", action="store_true", help="rebuild even if present")

    def handle(self, *args: Any, **options: Any) -> None:
        out = options["out"] or Path(settings.DATA_DIR) / "models" / "tiny-llama"
        if (out / "config.json").exists() and not options["force"]:
            self.stdout.write(f"demo model already at {out}")
            return
        if out.exists():
            shutil.rmtree(out)
        self.stdout.write(f"building demo model into {out} ...")
        started = time.monotonic()
        demo_model_build(out_dir=out, seed=options["seed"])
        self.stdout.write(f"built {out} in {time.monotonic() - started:.1f}s")
