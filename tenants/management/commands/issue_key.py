from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from tenants.keys import PREFIX
from tenants.models import Scope, Tenant
from tenants.selectors import tenant_get
from tenants.services import MAX_KEY_DAYS, api_key_issue


class Command(BaseCommand):
    help = "Issue an API key for a tenant and print its token (shown this once only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--name", default="cli", help="label for the key")
        parser.add_argument(
            "--scope",
            action="append",
            choices=Scope.values,
            help="grant this scope (repeatable; default: all)",
        )
        parser.add_argument("--expires-in-days", type=int, default=None, help="expire after N days")
        parser.add_argument(
            "--model",
            action="append",
            default=None,
            help="narrow the key to this alias or model (repeatable; default: every model "
            "its tenant may call)",
        )
        parser.add_argument("--quiet", action="store_true", help="print only the token")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = tenant_get(slug=options["tenant"])
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant {options['tenant']!r}") from exc
        days = options["expires_in_days"]
        if days is not None and not 0 < days <= MAX_KEY_DAYS:
            raise CommandError(f"--expires-in-days must be from 1 to {MAX_KEY_DAYS}")
        expires_at = timezone.now() + dt.timedelta(days=days) if days else None
        try:
            issued = api_key_issue(
                tenant=tenant,
                name=options["name"],
                scopes=options["scope"],
                expires_at=expires_at,
                allowed_models=options["model"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        if options["quiet"]:
            self.stdout.write(issued.token)
            return
        self.stdout.write(f"key {PREFIX}{issued.key.public_id} for {tenant.slug} (shown once):")
        self.stdout.write(issued.token)
