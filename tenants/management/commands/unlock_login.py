from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tenants.lockout import lockout_unlock


class Command(BaseCommand):
    help = "Lift a username's sign-in lock before its window ends (audited)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--reason", default="", help="why, for the audit log")

    def handle(self, *args: Any, **options: Any) -> None:
        lockout_unlock(username=options["username"], reason=options["reason"])
        self.stdout.write(f"unlocked {options['username']}")
