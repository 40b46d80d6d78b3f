from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Task
from models_registry.selectors import version_pinned
from models_registry.services import alias_set, model_version_register
from tenants.models import Tenant


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"not valid JSON: {raw!r}") from exc
    if not isinstance(value, dict):
        raise CommandError(f"expected a JSON object, got {raw!r}")
    return value


def _price(raw: str, flag: str) -> Decimal:
    try:
        return Decimal(raw)
    except InvalidOperation as exc:
        raise CommandError(f"{flag} must be a decimal number, got {raw!r}") from exc


class Command(BaseCommand):
    help = "Register a model directory as an immutable, content-addressed model version."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="model name, e.g. tiny-llama")
        parser.add_argument("source_dir", type=Path, help="directory with weights and tokenizer")
        parser.add_argument("--task", choices=Task.values, default=Task.CHAT, help="model task")
        parser.add_argument("--engine-args", default="{}", help="JSON object of engine args")
        parser.add_argument("--sampling", default="{}", help="JSON object of sampling defaults")
        parser.add_argument("--price-input", default="0", help="price per 1k input tokens")
        parser.add_argument("--price-output", default="0", help="price per 1k output tokens")
        parser.add_argument("--alias", default=None, help="also point this alias at the version")
        parser.add_argument("--label", default="", help="an operator's name, e.g. v2")
        parser.add_argument(
            "--weights-uri",
            default="",
            help="where workers fetch the files (file:// or http(s):// directory with the same "
            "files); default: the registry's own store",
        )
        parser.add_argument(
            "--tool-parser",
            default="",
            help="the vLLM tool parser that turns the model's output into tool calls, e.g. hermes",
        )
        parser.add_argument(
            "--reasoning-parser",
            default="",
            help="the vLLM reasoning parser that splits a reasoning model's thinking from its "
            "answer, e.g. qwen3",
        )
        parser.add_argument(
            "--base",
            default=None,
            help="register a LoRA adapter on this base version (model@version)",
        )
        parser.add_argument(
            "--tenant",
            default=None,
            help="the tenant the model or adapter is built for: it alone may call it "
            "(default: platform-wide)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        owner = None
        if options["tenant"]:
            owner = Tenant.objects.filter(slug=options["tenant"]).first()
            if owner is None:
                raise CommandError(f"no tenant {options['tenant']!r}")
        base = None
        if options["base"]:
            base = version_pinned(options["base"])
            if base is None:
                raise CommandError(f"no base version {options['base']!r} (use model@version)")
        try:
            version, created = model_version_register(
                model_name=options["name"],
                source_dir=options["source_dir"],
                task=options["task"],
                label=options["label"],
                base=base,
                engine_args=_json_object(options["engine_args"]),
                sampling_defaults=_json_object(options["sampling"]),
                price_input_per_1k=_price(options["price_input"], "--price-input"),
                price_output_per_1k=_price(options["price_output"], "--price-output"),
                weights_uri=options["weights_uri"],
                tool_parser=options["tool_parser"],
                reasoning_parser=options["reasoning_parser"],
                owner=owner,
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        state = "registered" if created else "already registered"
        files = len(version.manifest["files"])
        whose = f", {owner.slug}'s alone" if owner is not None else ""
        self.stdout.write(f"{state} {version.public_name} ({files} files{whose})")
        if options["alias"]:
            try:
                alias_set(name=options["alias"], version=version)
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from exc
            self.stdout.write(f"alias {options['alias']} -> {version.public_name}")
