from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Alias, Rollout
from models_registry.selectors import version_pinned
from rollouts.services import RolloutConflict, rollout_act, rollout_start, rollouts_analyze

ACTIONS = ("promote", "pause", "resume", "rollback")


class Command(BaseCommand):
    help = "Start, inspect, analyse, promote, pause, resume or roll back canary rollouts."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True)
        start = sub.add_parser("start", help="send a first share of an alias to a canary")
        start.add_argument("alias")
        start.add_argument("canary", help="model@label or model@<version id prefix>")
        start.add_argument("--steps", default="1,5,25,50,100", help="percent per step")
        start.add_argument("--min-samples", type=int, default=200)
        start.add_argument("--min-step-seconds", type=int, default=300)
        start.add_argument("--short-window-seconds", type=int, default=300)
        start.add_argument("--breach-checks", type=int, default=2)
        start.add_argument("--guardrails", default="{}", help='JSON, e.g. {"ttft_p95_ratio": 2}')
        status = sub.add_parser("status", help="show rollouts and their last decisions")
        status.add_argument("id", type=int, nargs="?")
        sub.add_parser("analyze", help="run one analysis of every running rollout now")
        for action in ACTIONS:
            acting = sub.add_parser(action, help=f"{action} a rollout by hand")
            acting.add_argument("id", type=int)
            acting.add_argument("--reason", default="")
        for command in sub.choices.values():
            command.add_argument("--actor", default=None, help="username recorded in the audit")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = User.objects.filter(username=options["actor"]).first() if options["actor"] else None
        command = options["command"]
        try:
            if command == "start":
                self._start(options, actor)
            elif command == "status":
                self._status(options["id"])
            elif command == "analyze":
                for pk, action in rollouts_analyze().items():
                    self.stdout.write(f"rollout {pk}: {action}")
            else:
                rollout = rollout_act(
                    self._rollout(options["id"]),
                    action=command,
                    actor=actor,
                    reason=options["reason"],
                )
                self.stdout.write(f"rollout {rollout.pk}: {rollout}")
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except RolloutConflict as exc:
            raise CommandError(str(exc)) from exc

    def _rollout(self, pk: int) -> Rollout:
        rollout = Rollout.objects.filter(pk=pk).first()
        if rollout is None:
            raise CommandError(f"no rollout {pk}")
        return rollout

    def _start(self, options: dict[str, Any], actor: User | None) -> None:
        alias = Alias.objects.filter(name=options["alias"]).first()
        if alias is None:
            raise CommandError(f"no alias {options['alias']!r}")
        canary = version_pinned(options["canary"])
        if canary is None:
            raise CommandError(f"no version {options['canary']!r} (use model@version)")
        try:
            steps = [float(s) for s in options["steps"].split(",")]
            guardrails = json.loads(options["guardrails"])
        except ValueError as exc:
            raise CommandError(f"bad --steps or --guardrails: {exc}") from exc
        rollout = rollout_start(
            alias=alias,
            canary=canary,
            steps=steps,
            min_samples=options["min_samples"],
            min_step_seconds=options["min_step_seconds"],
            short_window_seconds=options["short_window_seconds"],
            breach_checks=options["breach_checks"],
            guardrails=guardrails,
            actor=actor,
        )
        self.stdout.write(f"rollout {rollout.pk} started: {rollout}")

    def _status(self, pk: int | None) -> None:
        rollouts = [self._rollout(pk)] if pk else list(Rollout.objects.all()[:20])
        if not rollouts:
            self.stdout.write("no rollouts")
        for rollout in rollouts:
            self.stdout.write(f"rollout {rollout.pk}: {rollout} baseline {rollout.baseline}")
            for decision in rollout.decisions.order_by("-id")[:5]:
                when = decision.created_at.strftime("%Y-%m-%d %H:%M:%S")
                self.stdout.write(
                    f"  {when} {decision.action} at {decision.percent:g}%: {decision.reason}"
                )
