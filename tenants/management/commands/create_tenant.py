from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant (a product team) with the default quota."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="short unique name, e.g. acme")
        parser.add_argument("--name", default="", help="display name (defaults to the slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = tenant_create(slug=options["slug"], name=options["name"])
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"created tenant {tenant.slug}")
