from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.keys import PREFIX, public_id_of
from tenants.models import ApiKey, Tenant
from tenants.selectors import api_key_get, tenant_get
from tenants.services import api_key_revoke


class Command(BaseCommand):
    help = "Revoke a tenant's API key; it stops working everywhere within seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument(
            "key_id", help="the key's public id (rh-xxxxxxxxxxxx, sy-xxxxxxxxxxxx or xxxxxxxxxxxx)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        public_id = public_id_of(options["key_id"])
        try:
            tenant = tenant_get(slug=options["tenant"])
            key = api_key_get(tenant=tenant, public_id=public_id)
        except (Tenant.DoesNotExist, ApiKey.DoesNotExist) as exc:
            raise CommandError(
                f"no key {options['key_id']!r} in tenant {options['tenant']!r}"
            ) from exc
        api_key_revoke(key=key)
        self.stdout.write(f"revoked {PREFIX}{key.public_id}")
