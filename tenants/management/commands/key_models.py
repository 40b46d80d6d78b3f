from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.keys import PREFIX, public_id_of
from tenants.models import ApiKey, Tenant
from tenants.selectors import api_key_get, tenant_get
from tenants.services import api_key_models_set


class Command(BaseCommand):
    help = (
        "Narrow a tenant's API key to the models it may call (aliases or model names), or lift "
        "the narrowing with --all; every frontend applies it within seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("key_id", help="the key's public id (rh-xxxxxxxxxxxx or xxxxxxxxxxxx)")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--model", action="append", help="an alias or model (repeatable)")
        which.add_argument("--all", action="store_true", help="every model its tenant may call")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = tenant_get(slug=options["tenant"])
            key = api_key_get(tenant=tenant, public_id=public_id_of(options["key_id"]))
        except (Tenant.DoesNotExist, ApiKey.DoesNotExist) as exc:
            raise CommandError(
                f"no key {options['key_id']!r} in tenant {options['tenant']!r}"
            ) from exc
        try:
            key = api_key_models_set(key=key, models=[] if options["all"] else options["model"])
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        names = ", ".join(key.allowed_models) or "every model its tenant may call"
        self.stdout.write(f"{PREFIX}{key.public_id} calls {names}")
