from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.reconcile import usage_reconcile


class Command(BaseCommand):
    help = (
        "Compare, per deployment and admission hour, the requests admitted, the requests "
        "finished (with tokens) and the usage records; exit 1 if any settled hour differs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hours", type=int, default=24, help="how many hours back")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = usage_reconcile(hours=options["hours"])
        header = f"{'hour (UTC)':<14} {'deployment':<24} {'admitted':>9} {'finished':>9} "
        header += f"{'records':>9} {'tokens':>11} {'in records':>11}  status"
        self.stdout.write(header)
        bad = 0
        for row in rows:
            problems = row.problems
            bad += bool(problems)
            status = "; ".join(problems) if problems else ("ok" if row.settled else "open")
            self.stdout.write(
                f"{row.hour:<14} {row.deployment:<24} {row.admitted:>9} {row.finished:>9} "
                f"{row.recorded:>9} {row.finished_tokens:>11} {row.recorded_tokens:>11}  {status}"
            )
        if bad:
            raise CommandError(f"{bad} deployment-hours do not reconcile")
        self.stdout.write(f"reconciled: {len(rows)} deployment-hours agree")
