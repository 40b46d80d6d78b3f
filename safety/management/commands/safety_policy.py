from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from safety.models import PolicyAssignment, PolicyPack
from safety.services import policy_assign, policy_pack_save, policy_unassign
from tenants.models import Tenant


def _list(raw: str | None) -> list[str]:
    return [item.strip() for item in (raw or "").split(",") if item.strip()]


class Command(BaseCommand):
    help = "Create or change safety policy packs and assign them to tenants (every change audited)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        pack = actions.add_parser("pack", help="create or replace a pack's settings")
        pack.add_argument("name")
        pack.add_argument("--toxicity", type=float, default=None, help="threshold in (0, 1]")
        pack.add_argument("--pii", default="", help="kinds: email,phone,card,secret")
        pack.add_argument("--pii-action", choices=["redact", "block"], default="redact")
        pack.add_argument("--deny-terms", default="", help="comma-separated words")
        pack.add_argument("--deny-pattern", action="append", default=[], help="a regex (repeat)")
        pack.add_argument("--input-only", action="store_true", help="do not filter output")
        pack.add_argument("--output-only", action="store_true", help="do not screen input")
        pack.add_argument("--reason", default="")
        assign = actions.add_parser("assign", help="make a tenant (or one alias of it) use a pack")
        assign.add_argument("tenant")
        assign.add_argument("pack")
        assign.add_argument(
            "--alias", default="", help="an alias or a model: its model, by whatever name"
        )
        assign.add_argument("--reason", default="")
        unassign = actions.add_parser("unassign", help="remove a tenant's (alias's) pack")
        unassign.add_argument("tenant")
        unassign.add_argument("--alias", default="")
        unassign.add_argument("--reason", default="")
        actions.add_parser("list", help="packs and who uses them")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc

    def _pack(self, options: dict[str, Any]) -> None:
        if options["input_only"] and options["output_only"]:
            raise CommandError("--input-only and --output-only exclude each other")
        saved = policy_pack_save(
            name=options["name"],
            toxicity_threshold=options["toxicity"],
            pii_kinds=_list(options["pii"]),
            pii_action=options["pii_action"],
            deny_terms=_list(options["deny_terms"]),
            deny_patterns=options["deny_pattern"],
            apply_to_input=not options["output_only"],
            apply_to_output=not options["input_only"],
            reason=options["reason"],
        )
        self.stdout.write(f"pack {saved.name} saved")

    def _assign(self, options: dict[str, Any]) -> None:
        tenant = self._tenant(options["tenant"])
        pack = PolicyPack.objects.filter(name=options["pack"]).first()
        if pack is None:
            raise CommandError(f"no pack {options['pack']!r}")
        policy_assign(tenant=tenant, pack=pack, alias=options["alias"], reason=options["reason"])
        where = f" for {options['alias']}" if options["alias"] else ""
        self.stdout.write(f"{tenant.slug}{where} uses {pack.name}")

    def _unassign(self, options: dict[str, Any]) -> None:
        tenant = self._tenant(options["tenant"])
        policy_unassign(tenant=tenant, alias=options["alias"], reason=options["reason"])
        self.stdout.write(
            f"{tenant.slug} has no pack{' for ' + options['alias'] if options['alias'] else ''}"
        )

    def _list(self, options: dict[str, Any]) -> None:
        for pack in PolicyPack.objects.order_by("name"):
            users = [
                f"{a.tenant.slug}{'/' + a.alias if a.alias else ''}"
                for a in PolicyAssignment.objects.filter(pack=pack).select_related("tenant")
            ]
            checks = []
            if pack.toxicity_threshold is not None:
                checks.append(f"toxicity>{pack.toxicity_threshold}")
            if pack.pii_kinds:
                checks.append(f"pii {','.join(pack.pii_kinds)} ({pack.pii_action})")
            if pack.deny_terms or pack.deny_patterns:
                checks.append(
                    f"deny {len(pack.deny_terms)} terms, {len(pack.deny_patterns)} patterns"
                )
            self.stdout.write(
                f"{pack.name}: {'; '.join(checks) or 'no checks'} -> {', '.join(users) or 'unused'}"
            )

    @staticmethod
    def _tenant(slug: str) -> Tenant:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {slug!r}")
        return tenant
