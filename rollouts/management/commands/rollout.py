from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Alias, Rollout
from models_registry.selectors import version_pinned
from rollouts.services import RolloutConflict, rollout_act, rollout_start, rollouts_analyze
from tenants.models import Tenant
from tenants.selectors import tenants_by_slug

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
        start.add_argument("--short-window-seconds", type=int, default=10)
        start.add_argument("--long-window-seconds", type=int, default=60)
        start.add_argument("--breach-checks", type=int, default=3)
        start.add_argument("--guardrails", default="{}", help='JSON, e.g. {"burn_rate": 10}')
        start.add_argument(
            "--tenant",
            action="append",
            default=[],
            help="scope the canary to this tenant's traffic (repeat for more); others stay put",
        )
        status = sub.add_parser("status", help="show rollouts and their last decisions")
        status.add_argument("id", type=int, nargs="?")
        sub.add_parser("analyze", help="run one analysis of every running rollout now")
        for action in ACTIONS:
            acting = sub.add_parser(action, help=f"{action} a rollout by hand")
            acting.add_argument("id", type=int)
            acting.add_argument("--reason", default="")
            if action == "rollback":
                acting.add_argument(
                    "--tenant",
                    action="append",
                    default=[],
                    help="roll back only this tenant of a scoped rollout (repeat for more)",
                )
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
                    tenants=tenants_named(options.get("tenant", [])),
                )
                self.stdout.write(f"rollout {rollout.pk}: {rollout}{_scope(rollout)}")
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
            long_window_seconds=options["long_window_seconds"],
            breach_checks=options["breach_checks"],
            guardrails=guardrails,
            tenants=tenants_named(options["tenant"]),
            actor=actor,
        )
        self.stdout.write(f"rollout {rollout.pk} started: {rollout}{_scope(rollout)}")

    def _status(self, pk: int | None) -> None:
        rollouts = [self._rollout(pk)] if pk else list(Rollout.objects.all()[:20])
        if not rollouts:
            self.stdout.write("no rollouts")
        for rollout in rollouts:
            self.stdout.write(
                f"rollout {rollout.pk}: {rollout} baseline {rollout.baseline}{_scope(rollout)}"
            )
            for decision in rollout.decisions.order_by("-id")[:5]:
                when = decision.created_at.strftime("%Y-%m-%d %H:%M:%S")
                self.stdout.write(
                    f"  {when} {decision.action} at {decision.percent:g}%: {decision.reason}"
                )


def tenants_named(slugs: list[str]) -> list[Tenant]:
    """Return the tenants named by slug, or fail naming those that do not exist."""
    tenants, missing = tenants_by_slug(slugs=slugs)
    if missing:
        raise CommandError(f"no tenants {missing}")
    return tenants


def _scope(rollout: Rollout) -> str:
    if not rollout.scoped:
        return ""
    slugs = sorted(rollout.tenants.values_list("slug", flat=True))
    return f" for {', '.join(slugs) or 'no tenant left'}"
