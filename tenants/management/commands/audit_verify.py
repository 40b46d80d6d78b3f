from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.audit import audit_verify
from tenants.models import AuditEvent


class Command(BaseCommand):
    help = "Check that every audit event matches its hash and links to the event before it."

    def handle(self, *args: Any, **options: Any) -> None:
        # Counted first: events appended during the walk are checked but not counted.
        count = AuditEvent.objects.count()
        problems = audit_verify()
        for problem in problems:
            self.stderr.write(str(problem))
        if problems:
            raise CommandError(f"audit chain broken: {len(problems)} problem(s) found")
        self.stdout.write(f"audit chain intact: {count} events")
