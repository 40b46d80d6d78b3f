from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import Tenant
from tenants.selectors import tenant_get
from tenants.services import tenant_delete


class Command(BaseCommand):
    help = (
        "Delete a tenant: its retained text, batches, files, memberships and keys go; usage "
        "records and invoices stay (keys they name are revoked and scrubbed)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--yes", action="store_true", help="really delete (cannot be undone)")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["tenant"]
        try:
            tenant = tenant_get(slug=slug)
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant {slug!r}") from exc
        if not options["yes"]:
            raise CommandError(f"deleting {slug!r} cannot be undone; run again with --yes")
        try:
            summary = tenant_delete(tenant=tenant)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(str(summary))
