from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Alias
from models_registry.selectors import version_pinned
from models_registry.services import alias_split_set
from tenants.selectors import tenants_by_slug


class Command(BaseCommand):
    help = (
        "Show an alias's splits, or send a share of its traffic (or of named tenants' traffic "
        "alone) to another version; percent 0 removes the split."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("alias")
        parser.add_argument("version", nargs="?", help="model@label or model@<version id prefix>")
        parser.add_argument("percent", nargs="?", type=float, help="0 to 100; 0 removes it")
        parser.add_argument(
            "--tenant",
            action="append",
            default=[],
            help="split this tenant's traffic alone (repeat for more); others stay put",
        )
        parser.add_argument("--reason", default="")
        parser.add_argument("--actor", default=None, help="username recorded in the audit")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = Alias.objects.select_related("version__model").filter(name=options["alias"])
        found = alias.first() if "\x00" not in options["alias"] else None
        if found is None:
            raise CommandError(f"no alias {options['alias']!r}")
        if options["version"] is not None:
            self._set(found, options)
        self._show(found)

    def _set(self, alias: Alias, options: dict[str, Any]) -> None:
        version = version_pinned(options["version"])
        if version is None:
            raise CommandError(f"no version {options['version']!r} (use model@version)")
        if options["percent"] is None:
            raise CommandError("give the percent to send (0 removes the split)")
        tenants, missing = tenants_by_slug(slugs=options["tenant"])
        if missing:
            raise CommandError(f"no tenants {missing}")
        actor = User.objects.filter(username=options["actor"]).first() if options["actor"] else None
        try:
            alias_split_set(
                alias=alias,
                version=version,
                percent=options["percent"],
                tenants=tenants,
                actor=actor,
                reason=options["reason"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc

    def _show(self, alias: Alias) -> None:
        self.stdout.write(f"{alias.name}: primary {alias.version.public_name}")
        for split in alias.splits.select_related("version__model", "tenant"):
            scope = f"of {split.tenant.slug}'s traffic" if split.tenant else "of untargeted traffic"
            self.stdout.write(f"  {split.percent:g}% {scope} -> {split.version.public_name}")
