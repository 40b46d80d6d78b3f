"""The web console: server-rendered pages for tenant admins, finance people and operators.

Every tenant page takes the tenant from the URL and checks the signed-in user's membership:
a tenant the user does not belong to is a 404, exactly like one that does not exist.
Operators are Django staff. Lists are paginated; model output is never shown unescaped.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.budgets import budget_banner
from billing.selectors import (
    deployment_load,
    month_start,
    tenant_month_spend,
    usage_aggregate,
    version_slis,
)
from console import selectors
from dataplane.redis_client import redis_sync_client
from dataplane.snapshots import depth_sync, kv_cache_usage_sync, live_workers_sync, rate_sync
from inference.responses.store import (
    Kept,
    conversation_delete,
    conversation_get,
    conversation_items,
    response_delete,
    response_get,
    response_opened,
)
from models_registry.models import Model
from models_registry.selectors import (
    model_access_get,
    model_access_list,
    model_list_for_tenant,
    version_pinned,
)
from models_registry.services import (
    alias_fallback_set,
    alias_split_set,
    model_grant,
    model_limit_set,
    model_owner_set,
    model_revoke,
)
from rollouts.services import RolloutConflict, rollout_act
from tenants.lockout import lockout_is_locked
from tenants.models import ApiKey, Role, Scope, Tenant
from tenants.selectors import api_key_get, api_key_list
from tenants.services import (
    MAX_KEY_DAYS,
    MAX_ROTATION_OVERLAP_HOURS,
    api_key_issue,
    api_key_revoke,
    api_key_rotate,
)

PAGE_SIZE = 50


# --- sign-in with lockout -------------------------------------------------------------------


class LockoutAuthenticationForm(AuthenticationForm):
    """Say that a username is locked, rather than that its password is wrong.

    The lock itself is enforced by the authentication backend (tenants.lockout), for every way
    in; this only picks the message.
    """

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        if lockout_is_locked(username=username):
            minutes = settings.ROUNDHOUSE_LOGIN_LOCK_SECONDS // 60
            raise ValidationError(
                f"Too many failed sign-ins for this account: try again in {minutes} minutes.",
                code="locked",
            )
        return super().clean()


class LoginView(auth_views.LoginView):
    template_name = "console/login.html"
    authentication_form = LockoutAuthenticationForm
    redirect_authenticated_user = True


# --- who may see what ------------------------------------------------------------------------


_ROLE = "_roundhouse_console_role"


def _tenant(request: HttpRequest, slug: str, *roles: str) -> Tenant:
    """The tenant of a page, if the user is staff or a member with one of the roles; else 404."""
    tenant = selectors.tenant_get(slug=slug)
    if tenant is None:
        raise Http404("no such tenant")
    if request.user.is_staff:
        return tenant
    membership = selectors.membership_get(tenant=tenant, user_id=request.user.pk or 0)
    if membership is None or (roles and membership.role not in roles):
        raise Http404("no such tenant")
    setattr(request, _ROLE, membership.role)  # for the page's navigation (_nav)
    return tenant


def _staff(request: HttpRequest) -> None:
    if not request.user.is_staff:
        raise Http404("no such page")


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


def _nav(request: HttpRequest, tenant: Tenant | None = None) -> dict[str, Any]:
    role = getattr(request, _ROLE, None) if tenant is not None else None
    return {"tenant": tenant, "role": role, "is_staff": request.user.is_staff}


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Send operators to operations and members to their (first) tenant."""
    if request.user.is_staff:
        return redirect("console:ops")
    membership = selectors.membership_first(user_id=request.user.pk or 0)
    if membership is None:
        return render(request, "console/no_tenant.html", _nav(request))
    return redirect("console:overview", slug=membership.tenant.slug)


# --- tenant pages ----------------------------------------------------------------------------


@login_required
def overview(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant(request, slug)
    daily = usage_aggregate(tenant_id=tenant.pk, group="day", since=month_start())
    totals = {
        "requests": sum(row.requests for row in daily),
        "prompt": sum(row.prompt_tokens for row in daily),
        "completion": sum(row.completion_tokens for row in daily),
    }
    spend = tenant_month_spend(tenant_id=tenant.pk)
    budget = tenant.quota.monthly_budget
    running = Decimal(0)
    chart: dict[str, list[Any]] = {"labels": [], "spend": [], "budget": []}
    for row in daily:
        running += row.cost
        chart["labels"].append(row.label[5:])  # MM-DD
        chart["spend"].append(float(round(running, 4)))
        chart["budget"].append(float(budget))
    return render(
        request,
        "console/overview.html",
        {
            **_nav(request, tenant),
            "totals": totals,
            "spend": spend,
            "budget": budget,
            "percent": round(float(spend * 100 / budget), 1) if budget else None,
            "banner": budget_banner(tenant=tenant),
            "chart": chart,
            "quota": tenant.quota,
        },
    )


@login_required
def keys(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN)
    # The new secret travels once through the session (post, redirect, get): a reload or the
    # back button cannot show it again or create a second key.
    issued = request.session.pop("issued_key", None)
    if request.method == "POST":
        name = (request.POST.get("name") or "").strip()[:200]
        scopes = request.POST.getlist("scopes") or [Scope.INFERENCE, Scope.MODELS_READ]
        allowed = request.POST.getlist("allowed_models")
        days = _whole_number(request.POST.get("expires_in_days"), 1, MAX_KEY_DAYS)
        if not name:
            messages.error(request, "Give the key a name.")
        elif days is None:
            messages.error(request, f"Expiry is a whole number of days from 1 to {MAX_KEY_DAYS}.")
        else:
            expires = timezone.now() + dt.timedelta(days=days) if days else None
            try:
                made = api_key_issue(
                    tenant=tenant,
                    name=name,
                    scopes=scopes,
                    expires_at=expires,
                    allowed_models=allowed,
                    actor=_user(request),
                )
            except ValidationError as exc:
                messages.error(request, "; ".join(exc.messages))
            else:
                request.session["issued_key"] = {"name": made.key.name, "token": made.token}
                return redirect("console:keys", slug=slug)
    page = Paginator(api_key_list(tenant=tenant), PAGE_SIZE)
    return render(
        request,
        "console/keys.html",
        {
            **_nav(request, tenant),
            "page": page.get_page(request.GET.get("page")),
            "issued": issued,
            "scopes": Scope.choices,
            "model_names": _callable_names(tenant),
        },
    )


def _callable_names(tenant: Tenant) -> list[str]:
    """The names a key of the tenant may be narrowed to: its models and their aliases."""
    names: set[str] = set()
    for row in model_list_for_tenant(tenant_id=tenant.pk):
        names.add(row.model.name)
        names.update(row.aliases)
    return sorted(names)


@login_required
def models(request: HttpRequest, slug: str) -> HttpResponse:
    """The models the tenant may call (its own adapters among them) and this month's use."""
    tenant = _tenant(request, slug, Role.ADMIN)
    rows = model_list_for_tenant(tenant_id=tenant.pk)
    used = {
        row.label: row
        for row in usage_aggregate(tenant_id=tenant.pk, group="model", since=month_start())
    }
    callable_names = {row.model.name for row in rows}
    return render(
        request,
        "console/models.html",
        {
            **_nav(request, tenant),
            "rows": [{"m": row, "usage": used.get(row.model.name)} for row in rows],
            # Used this month, but not callable now (its access was taken away since).
            "former": [row for name, row in sorted(used.items()) if name not in callable_names],
        },
    )


def _whole_number(raw: str | None, lo: int, hi: int) -> int | None:
    """Return a form's whole number in [lo, hi], 0 when left empty, or None when it is not one."""
    raw = (raw or "").strip()
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(hi))):
        return None
    value = int(raw)
    return value if lo <= value <= hi else None


def _key(tenant: Tenant, public_id: str) -> ApiKey:
    try:
        return api_key_get(tenant=tenant, public_id=public_id)
    except ApiKey.DoesNotExist as exc:
        raise Http404("no such key") from exc


@login_required
@require_POST
def key_revoke(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN)
    key = _key(tenant, public_id)
    api_key_revoke(key=key, actor=_user(request))
    messages.success(request, f"Key {key.name} ({key.public_id}) revoked.")
    return redirect("console:keys", slug=slug)


@login_required
@require_POST
def key_rotate(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN)
    key = _key(tenant, public_id)
    hours = _whole_number(request.POST.get("overlap_hours") or "24", 0, MAX_ROTATION_OVERLAP_HOURS)
    if hours is None:
        limit = MAX_ROTATION_OVERLAP_HOURS
        messages.error(request, f"The overlap is a whole number of hours from 0 to {limit}.")
        return redirect("console:keys", slug=slug)
    try:
        made = api_key_rotate(key=key, overlap=dt.timedelta(hours=hours), actor=_user(request))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("console:keys", slug=slug)
    request.session["issued_key"] = {"name": made.key.name, "token": made.token}
    key = _key(tenant, key.public_id)  # rotation set the old key's expiry
    until = f"{key.expires_at:%Y-%m-%d %H:%M} UTC"
    messages.success(request, f"The old key {key.public_id} keeps working until {until}.")
    return redirect("console:keys", slug=slug)


@login_required
def requests_recent(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's recent requests with their latency breakdown (prompts are not stored)."""
    tenant = _tenant(request, slug, Role.ADMIN)
    records = selectors.usage_record_list(tenant=tenant)
    page = Paginator(records, PAGE_SIZE).get_page(request.GET.get("page"))
    rows: list[dict[str, Any]] = []
    for r in page:
        queue = (r.started_at - r.enqueued_at).total_seconds() * 1000 if r.started_at else None
        ttft = (
            (r.first_token_at - r.enqueued_at).total_seconds() * 1000 if r.first_token_at else None
        )
        total = (r.finished_at - r.enqueued_at).total_seconds() * 1000
        rows.append({"r": r, "queue_ms": queue, "ttft_ms": ttft, "total_ms": total})
    return render(
        request, "console/requests.html", {**_nav(request, tenant), "page": page, "rows": rows}
    )


@login_required
def responses(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's stored responses (`POST /v1/responses` with `store`), newest first."""
    tenant = _tenant(request, slug, Role.ADMIN)
    page = Paginator(selectors.stored_response_list(tenant=tenant), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    rows = [_response_summary(response_opened(row)) | {"created": row.created_at} for row in page]
    return render(
        request, "console/responses.html", {**_nav(request, tenant), "page": page, "rows": rows}
    )


@login_required
def response(request: HttpRequest, slug: str, response_id: str) -> HttpResponse:
    """One stored response: its input items, its output and its usage."""
    tenant = _tenant(request, slug, Role.ADMIN)
    kept = response_get(tenant_id=tenant.pk, response_id=response_id)
    if kept is None:
        raise Http404("no such response")
    body = kept.body
    return render(
        request,
        "console/response.html",
        {
            **_nav(request, tenant),
            "r": _response_summary(kept),
            "instructions": body.get("instructions") or "",
            "inputs": [_item_shown(item) for item in kept.input_items],
            "outputs": [_item_shown(item) for item in body.get("output") or []],
            "error": (body.get("error") or {}).get("message", ""),
            "metadata": sorted((body.get("metadata") or {}).items()),
        },
    )


@login_required
@require_POST
def response_remove(request: HttpRequest, slug: str, response_id: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN)
    if not response_delete(tenant_id=tenant.pk, response_id=response_id):
        raise Http404("no such response")
    messages.success(request, f"Response {response_id} deleted.")
    return redirect("console:responses", slug=slug)


@login_required
def conversations(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's conversations (the Conversations API's), the latest changed first."""
    tenant = _tenant(request, slug, Role.ADMIN)
    page = Paginator(selectors.conversation_list(tenant=tenant), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(request, "console/conversations.html", {**_nav(request, tenant), "page": page})


@login_required
def conversation(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    """One conversation: its items in order, and its metadata."""
    tenant = _tenant(request, slug, Role.ADMIN)
    found = conversation_get(tenant_id=tenant.pk, conversation_id=conversation_id)
    items = conversation_items(tenant_id=tenant.pk, conversation_id=conversation_id)
    if found is None or items == "missing":
        raise Http404("no such conversation")
    listed = [] if isinstance(items, str) else items  # past its bound: too many to show
    return render(
        request,
        "console/conversation.html",
        {
            **_nav(request, tenant),
            "c": found,
            "created": dt.datetime.fromtimestamp(found["created_at"], tz=dt.UTC),
            "items": [{"id": item["id"], **_item_shown(item)} for item in listed],
            "metadata": sorted(found["metadata"].items()),
        },
    )


@login_required
@require_POST
def conversation_remove(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN)
    if not conversation_delete(tenant_id=tenant.pk, conversation_id=conversation_id):
        raise Http404("no such conversation")
    messages.success(request, f"Conversation {conversation_id} deleted.")
    return redirect("console:conversations", slug=slug)


def _response_summary(kept: Kept) -> dict[str, Any]:
    """What the console shows of a stored response in a list row or a page's header."""
    body = kept.body
    usage = body.get("usage") or {}
    text = " ".join(
        shown["text"] for shown in map(_item_shown, body.get("output") or []) if shown["text"]
    )
    return {
        "id": kept.id,
        "status": body.get("status", ""),
        "model": body.get("model", ""),
        "requested_model": kept.requested_model,
        "previous_id": kept.previous_id,
        "input_tokens": usage.get("input_tokens"),
        "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "background": bool(body.get("background")),
        "text": text,
    }


def _item_shown(item: dict[str, Any]) -> dict[str, str]:
    """An input or output item as a kind (a role, or what the item is) and its text."""
    kind = str(item.get("type") or "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            text = content
        else:
            parts = [p.get("text") or p.get("refusal") or "" for p in content or []]
            text = "".join(str(part) for part in parts)
        return {"kind": str(item.get("role") or "message"), "text": text}
    if kind == "function_call":
        return {"kind": "tool call", "text": f"{item.get('name')}({item.get('arguments') or ''})"}
    if kind == "function_call_output":
        return {"kind": "tool result", "text": str(item.get("output") or "")}
    if kind == "reasoning":
        summary = item.get("summary") or item.get("content") or []
        text = " ".join(str(part.get("text") or "") for part in summary)
        return {"kind": "reasoning", "text": text}
    return {"kind": kind, "text": ""}


CONSOLE_GROUPS = ("day", "model", "key", "user")


@login_required
def usage(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN, Role.FINANCE)
    group = request.GET.get("group_by", "day")
    if group not in CONSOLE_GROUPS:
        group = "day"
    rows = usage_aggregate(tenant_id=tenant.pk, group=group, since=month_start(), limit=500)
    chart = {
        "labels": [row.label for row in rows],
        "tokens": [row.prompt_tokens + row.completion_tokens for row in rows],
    }
    return render(
        request,
        "console/usage.html",
        {
            **_nav(request, tenant),
            "rows": rows,
            "group": group,
            "groups": CONSOLE_GROUPS,
            "chart": chart,
        },
    )


@login_required
def invoices(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN, Role.FINANCE)
    page = Paginator(selectors.invoice_list(tenant=tenant), PAGE_SIZE)
    return render(
        request,
        "console/invoices.html",
        {**_nav(request, tenant), "page": page.get_page(request.GET.get("page"))},
    )


@login_required
def invoice_detail(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = _tenant(request, slug, Role.ADMIN, Role.FINANCE)
    invoice = selectors.invoice_get(tenant=tenant, pk=pk)
    if invoice is None:
        raise Http404("no such invoice")
    return render(
        request,
        "console/invoice.html",
        {
            **_nav(request, tenant),
            "invoice": invoice,
            "lines": selectors.invoice_line_list(invoice=invoice),
        },
    )


# --- operator pages --------------------------------------------------------------------------


@login_required
def ops(request: HttpRequest) -> HttpResponse:
    _staff(request)
    return render(
        request, "console/ops.html", {**_nav(request), **_ops_state(), **_ops_hour(timezone.now())}
    )


@login_required
def ops_live(request: HttpRequest) -> HttpResponse:
    """The deployments table alone: htmx swaps it in every few seconds."""
    _staff(request)
    return render(request, "console/_deployments.html", _ops_state())


LOAD_MINUTES = 60


def _ops_hour(now: dt.datetime) -> dict[str, Any]:
    """Each deployment's last hour, minute by minute, for the operations page's charts: output
    tokens, failed requests and the time to first token's p95 (a minute without requests has
    no p95: a gap in its line, not a zero)."""
    until = now.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    since = until - dt.timedelta(minutes=LOAD_MINUTES)
    minutes, whole = deployment_load(since=since, until=until)
    starts = [since + dt.timedelta(minutes=i) for i in range(LOAD_MINUTES)]
    at = {start: i for i, start in enumerate(starts)}
    series: dict[str, dict[str, list[Any]]] = {}
    for load in minutes:
        i = None if load.start is None else at.get(load.start)
        if i is None:
            continue
        line = series.setdefault(
            load.deployment,
            {
                "tokens": [0] * LOAD_MINUTES,
                "failed": [0] * LOAD_MINUTES,
                "ttft_p95": [None] * LOAD_MINUTES,
            },
        )
        line["tokens"][i] = load.completion_tokens
        line["failed"][i] = load.failed
        line["ttft_p95"][i] = load.ttft_p95_ms
    return {
        "hour": whole,
        "hour_chart": {
            "labels": [start.strftime("%H:%M") for start in starts],
            "deployments": [{"name": name, **line} for name, line in sorted(series.items())],
        },
    }


def _ops_state() -> dict[str, Any]:
    client = redis_sync_client()
    deployments = []
    for deployment in selectors.deployment_list():
        queued, queued_tokens = depth_sync(client, deployment.name)
        deployments.append(
            {
                "deployment": deployment,
                "live": live_workers_sync(client, deployment.name),
                "queued": queued,
                "queued_tokens": queued_tokens,
                "tokens_per_second": rate_sync(client, deployment.name),
                "kv_cache_usage": kv_cache_usage_sync(client, deployment.name),
            }
        )
    return {
        "deployments": deployments,
        "aliases": selectors.alias_list(),
        "now": timezone.now(),
    }


@login_required
def canary(request: HttpRequest, name: str) -> HttpResponse:
    _staff(request)
    alias = selectors.alias_get(name=name)
    if alias is None:
        raise Http404("no such alias")
    rollouts = selectors.rollout_shown_list(alias=alias)
    since = timezone.now() - dt.timedelta(hours=1)
    splits = selectors.alias_split_list(alias=alias)
    targeting = selectors.alias_targeting_list(alias=alias)
    versions = [alias.version] + [s.version for s in splits]
    for version in [row["split"].version for row in targeting] + [r.canary for r in rollouts]:
        if version not in versions:
            versions.append(version)
    comparison = [
        {"version": v.public_name, **version_slis(version=v, since=since).as_dict()}
        for v in versions
    ]
    split = splits[0] if splits else None
    return render(
        request,
        "console/canary.html",
        {
            **_nav(request),
            "alias": alias,
            "rollouts": [
                {
                    "rollout": r,
                    "tenants": [t.slug for t in r.tenants.all()],
                    "decisions": selectors.rollout_decision_list(rollout=r),
                }
                for r in rollouts
            ],
            "split": split,
            "targeting": targeting,
            "candidates": [v for v in versions if v != alias.version],
            "comparison": comparison,
            "fallbacks": [a.name for a in selectors.alias_list() if a.pk != alias.pk],
        },
    )


@login_required
@require_POST
def canary_split(request: HttpRequest, name: str) -> HttpResponse:
    _staff(request)
    alias = selectors.alias_get(name=name)
    if alias is None:
        raise Http404("no such alias")
    version = version_pinned(request.POST.get("version", ""))
    slug = request.POST.get("tenant", "").strip()
    tenant = selectors.tenant_get(slug=slug) if slug else None
    try:
        percent = float(request.POST.get("percent", ""))
        if version is None:
            raise ValidationError("choose a version")
        if slug and tenant is None:
            raise ValidationError(f"no tenant {slug!r}")
        alias_split_set(
            alias=alias,
            version=version,
            percent=percent,
            tenants=[tenant] if tenant is not None else [],
            actor=_user(request),
            reason=request.POST.get("reason", ""),
        )
        whose = f"of {tenant.slug}'s traffic to {name}" if tenant is not None else f"of {name}"
        messages.success(request, f"{version.public_name} now gets {percent:g}% {whose}.")
    except ValidationError as exc:
        messages.error(request, f"Split not changed: {'; '.join(exc.messages)}")
    except ValueError as exc:
        messages.error(request, f"Split not changed: {exc}")
    return redirect("console:canary", name=name)


@login_required
@require_POST
def canary_fallback(request: HttpRequest, name: str) -> HttpResponse:
    _staff(request)
    alias = selectors.alias_get(name=name)
    if alias is None:
        raise Http404("no such alias")
    chosen = request.POST.get("fallback", "")
    fallback = selectors.alias_get(name=chosen) if chosen else None
    try:
        if chosen and fallback is None:
            raise ValidationError(f"no alias {chosen!r}")
        alias_fallback_set(
            alias=alias,
            fallback=fallback,
            actor=_user(request),
            reason=request.POST.get("reason", ""),
        )
        if fallback is None:
            messages.success(request, f"{name} has no fallback now.")
        else:
            messages.success(request, f"{fallback.name} now takes what {name} cannot.")
    except ValidationError as exc:
        messages.error(request, f"Fallback not changed: {'; '.join(exc.messages)}")
    return redirect("console:canary", name=name)


@login_required
@require_POST
def canary_action(request: HttpRequest, name: str, pk: int, action: str) -> HttpResponse:
    _staff(request)
    rollout = selectors.rollout_get(alias_name=name, pk=pk)
    if rollout is None or action not in ("promote", "pause", "resume", "rollback"):
        raise Http404("no such rollout action")
    reason = (request.POST.get("reason") or "").strip()
    if not reason:
        messages.error(request, f"Say why you {action} (the reason goes in the audit log).")
        return redirect("console:canary", name=name)
    slug = (request.POST.get("tenant") or "").strip()
    tenant = selectors.tenant_get(slug=slug) if slug else None
    if slug and tenant is None:
        messages.error(request, f"No tenant {slug!r}.")
        return redirect("console:canary", name=name)
    try:
        rollout_act(
            rollout,
            action=action,
            actor=_user(request),
            reason=reason,
            tenants=[tenant] if tenant is not None else [],
        )
        done = f"{action} of {tenant.slug}" if tenant is not None else action
        messages.success(request, f"Rollout {pk}: {done} done.")
    except RolloutConflict as exc:
        messages.error(request, str(exc))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    return redirect("console:canary", name=name)


@login_required
def versions(request: HttpRequest) -> HttpResponse:
    """Every model version with its manifest: files and hashes, engine args, prices, base."""
    _staff(request)
    page = Paginator(selectors.version_list(), 20).get_page(request.GET.get("page"))
    return render(request, "console/versions.html", {**_nav(request), "page": page})


@login_required
def tenants(request: HttpRequest) -> HttpResponse:
    """Tenants with their quotas and this month's usage (staff: finance and operations)."""
    _staff(request)
    page = Paginator(selectors.tenant_list(), PAGE_SIZE).get_page(request.GET.get("page"))
    usage = selectors.tenant_month_usage(tenant_ids=[t.pk for t in page])
    rows: list[dict[str, Any]] = [{"tenant": t, "usage": usage.get(t.pk, {})} for t in page]
    return render(request, "console/tenants.html", {**_nav(request), "page": page, "rows": rows})


@login_required
def audit(request: HttpRequest) -> HttpResponse:
    _staff(request)
    action = request.GET.get("action", "").strip()
    target = request.GET.get("target", "").strip()
    events = selectors.audit_event_list(action=action, target=target)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/audit.html",
        {**_nav(request), "page": page, "action": action, "target": target},
    )


@login_required
def model_access(request: HttpRequest) -> HttpResponse:
    """Every model and who may call it: owned by a tenant, limited to grants, or open."""
    _staff(request)
    return render(
        request,
        "console/model_access.html",
        {
            **_nav(request),
            "rows": model_access_list(),
            "tenants": selectors.tenant_list().filter(deleted_at__isnull=True),
        },
    )


def _access_model(name: str) -> Model:
    access = model_access_get(name=name)
    if access is None:
        raise Http404("no such model")
    return access.model


def _access_tenant(slug: str) -> Tenant | None:
    return selectors.tenant_get(slug=slug) if slug else None


@login_required
@require_POST
def model_access_change(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """Grant, revoke, limit, open or give a model (each audited, with the reason given)."""
    _staff(request)
    if action not in ("grant", "revoke", "limit", "open", "owner"):
        raise Http404("no such change")
    model = _access_model(name)
    reason = (request.POST.get("reason") or "").strip()
    slug = request.POST.get("tenant", "")
    tenant = _access_tenant(slug)
    actor = _user(request)
    try:
        if action in ("grant", "revoke") and tenant is None:
            raise ValidationError(f"no tenant {slug!r}")
        if action == "grant" and tenant is not None:
            model_grant(model=model, tenant=tenant, actor=actor, reason=reason)
            messages.success(request, f"{tenant.slug} may call {model.name}.")
        elif action == "revoke" and tenant is not None:
            model_revoke(model=model, tenant=tenant, actor=actor, reason=reason)
            messages.success(request, f"{tenant.slug} may no longer call {model.name}.")
        elif action in ("limit", "open"):
            limited = action == "limit"
            model_limit_set(model=model, limited=limited, actor=actor, reason=reason)
            shown = "its grants alone" if limited else "every tenant"
            messages.success(request, f"{model.name} is open to {shown}.")
        else:
            if slug and tenant is None:
                raise ValidationError(f"no tenant {slug!r}")
            model_owner_set(model=model, owner=tenant, actor=actor, reason=reason)
            shown = f"{tenant.slug}'s alone" if tenant else "platform-wide"
            messages.success(request, f"{model.name} is {shown}.")
    except ValidationError as exc:
        messages.error(request, f"Access not changed: {'; '.join(exc.messages)}")
    return redirect("console:model_access")
