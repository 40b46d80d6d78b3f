from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import Role, Tenant
from tenants.selectors import tenant_get
from tenants.services import membership_add


class Command(BaseCommand):
    help = "Add a user to a tenant with a role (creates the user if new)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("username", help="login name")
        parser.add_argument("--role", choices=Role.values, default=Role.MEMBER, help="role")
        parser.add_argument("--email", default="", help="email address")
        parser.add_argument("--password", default=None, help="set this password")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = tenant_get(slug=options["tenant"])
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant {options['tenant']!r}") from exc
        try:
            membership = membership_add(
                tenant=tenant,
                username=options["username"],
                role=options["role"],
                email=options["email"],
                password=options["password"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"{membership.user} is {membership.role} of {tenant.slug}")
