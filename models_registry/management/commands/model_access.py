from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Model
from models_registry.selectors import model_access_get, model_access_list
from models_registry.services import model_grant, model_limit_set, model_owner_set, model_revoke
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Show and change who may call a model: limit a platform-wide model to named tenants, "
        "grant or revoke it, open it to every tenant again, or give it to one tenant."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True)
        show = sub.add_parser("show", help="who may call each model (or one)")
        show.add_argument("model", nargs="?")
        limit = sub.add_parser("limit", help="limit a platform-wide model to tenants granted it")
        limit.add_argument("model")
        limit.add_argument(
            "--grant", action="append", default=[], help="grant this tenant too (repeatable)"
        )
        opened = sub.add_parser("open", help="open a platform-wide model to every tenant again")
        opened.add_argument("model")
        for name, text in (("grant", "let a tenant call"), ("revoke", "stop a tenant calling")):
            acting = sub.add_parser(name, help=f"{text} a limited platform-wide model")
            acting.add_argument("model")
            acting.add_argument("tenant")
        owner = sub.add_parser("owner", help="give a model to a tenant, or make it platform-wide")
        owner.add_argument("model")
        whose = owner.add_mutually_exclusive_group(required=True)
        whose.add_argument("--tenant", help="the tenant that alone may call it")
        whose.add_argument("--platform", action="store_true", help="no owner: platform-wide")
        for command in sub.choices.values():
            command.add_argument("--reason", default="", help="why (kept in the audit log)")
            command.add_argument("--actor", default=None, help="username recorded in the audit")

    def handle(self, *args: Any, **options: Any) -> None:
        command = options["command"]
        if command == "show":
            self._show(options["model"])
            return
        actor = User.objects.filter(username=options["actor"]).first() if options["actor"] else None
        model = self._model(options["model"])
        reason = options["reason"]
        try:
            if command == "limit":
                grants = [self._tenant(slug) for slug in options["grant"]]
                model_limit_set(
                    model=model, limited=True, grants=grants, actor=actor, reason=reason
                )
            elif command == "open":
                model_limit_set(model=model, limited=False, actor=actor, reason=reason)
            elif command == "grant":
                tenant = self._tenant(options["tenant"])
                if not model_grant(model=model, tenant=tenant, actor=actor, reason=reason):
                    self.stdout.write(f"{tenant.slug} already had {model.name}")
            elif command == "revoke":
                tenant = self._tenant(options["tenant"])
                if not model_revoke(model=model, tenant=tenant, actor=actor, reason=reason):
                    self.stdout.write(f"{tenant.slug} had no grant of {model.name}")
            else:
                owner = None if options["platform"] else self._tenant(options["tenant"])
                model_owner_set(model=model, owner=owner, actor=actor, reason=reason)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self._show(model.name)

    def _show(self, name: str | None) -> None:
        rows = model_access_list() if name is None else [model_access_get(name=name)]
        for row in rows:
            if row is None:
                raise CommandError(f"no model {name!r}")
            line = f"{row.model.name}: {row.shown}"
            if row.bases:
                line += f" (adapter on {', '.join(row.bases)})"
            self.stdout.write(line)

    def _model(self, name: str) -> Model:
        model = Model.objects.filter(name=name).first()
        if model is None:
            raise CommandError(f"no model {name!r}")
        return model

    def _tenant(self, slug: str) -> Tenant:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {slug!r}")
        return tenant
