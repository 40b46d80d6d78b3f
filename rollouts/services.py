"""Canary rollouts: ramp a version's share of an alias, compare it, promote or roll back.

A rollout moves through its steps (percent of the alias's traffic). Each analysis compares
the canary's SLIs with the baseline's over the current step, and over a short recent window:

- a guardrail is breached when the canary is worse than the baseline by more than the
  policy allows in **both** windows (the step so far and the recent window), so a blip that
  has already passed, or a slow start that has recovered, does not count;
- a breach must be seen in `breach_checks` analyses in a row before it rolls back;
- a step advances once both versions have `min_samples` requests in it, it has lasted
  `min_step_seconds` and nothing is breached. Leaving the last step below 100 % promotes.

A canary that fails outright does not wait for that: every few seconds `rollouts_fail_fast`
counts each running canary's failed requests over the last minute, and one that failed at
least ROUNDHOUSE_ROLLOUT_FAIL_FAST_ERROR_PCT of at least ..._MIN_REQUESTS, while its
baseline failed less than half as often, is rolled back at once.

A rollout scoped to tenants ramps the canary through those tenants' own splits (tenant
targeting: every other tenant stays where it was), judges the canary on those tenants'
requests alone against the baseline's, and its rollback, automatic or by hand, removes only
its tenants' splits. One tenant can be rolled back alone while the rest carry on. Promoting
it keeps its tenants on the canary (100 % of their traffic); the alias's primary is unchanged.

Every decision is stored with the numbers it compared and written to the audit chain.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing.selectors import Slis, version_failures, version_slis
from dataplane.changes import ROUTES, change_publish
from models_registry.models import (
    BUCKETS,
    Alias,
    AliasSplit,
    Deployment,
    ModelVersion,
    Rollout,
    RolloutDecision,
    RolloutState,
    default_guardrails,
    default_steps,
)
from models_registry.selectors import deployment_for
from models_registry.services import (
    alias_version_check,
    deployment_retire,
    deployment_serve,
    percent_buckets,
    targeting_tenants_check,
)
from tenants.models import Tenant
from tenants.services import audit_record

log = logging.getLogger(__name__)

GUARDRAILS = tuple(default_guardrails())
ACTIVE = (RolloutState.RUNNING, RolloutState.PAUSED)


class RolloutConflict(Exception):
    """The rollout cannot take this action in its current state (HTTP 409)."""


@dataclass(frozen=True)
class Verdict:
    action: str  # hold, advance, promote, rollback
    reason: str
    evidence: dict[str, Any]
    breached: tuple[str, ...] = ()


def _steps_check(steps: list[float]) -> list[float]:
    if not steps or any(not isinstance(s, int | float) for s in steps):
        raise ValidationError({"steps": "steps must be a list of percentages"})
    if any(s <= 0 or s > 100 for s in steps) or sorted(set(steps)) != list(steps):
        raise ValidationError({"steps": "steps must rise strictly, each in (0, 100]"})
    if steps[-1] != 100:
        steps = [*steps, 100]
    return [float(s) for s in steps]


def _guardrails_check(guardrails: dict[str, float] | None) -> dict[str, float]:
    merged = {**default_guardrails(), **(guardrails or {})}
    unknown = set(merged) - set(GUARDRAILS)
    if unknown:
        raise ValidationError(
            {"guardrails": f"unknown guardrails {sorted(unknown)}; known: {list(GUARDRAILS)}"}
        )
    if any(float(v) <= 0 for v in merged.values()):
        raise ValidationError({"guardrails": "every guardrail must be positive"})
    return {k: float(v) for k, v in merged.items()}


def _tenant_ids(rollout: Rollout) -> list[int] | None:
    """The ids of the tenants a scoped rollout targets; None for one of every tenant."""
    if not rollout.scoped:
        return None
    return sorted(rollout.tenants.values_list("pk", flat=True))


def _tenant_slugs(rollout: Rollout) -> list[str]:
    return sorted(rollout.tenants.values_list("slug", flat=True))


def _split_set(rollout: Rollout, percent: float) -> None:
    """Give the canary its share of the traffic the rollout covers (each tenant's, if scoped)."""
    buckets = percent_buckets(percent, "percent")
    scopes: list[Tenant | None] = list(rollout.tenants.all()) if rollout.scoped else [None]
    for tenant in scopes:
        AliasSplit.objects.update_or_create(
            alias=rollout.alias,
            version=rollout.canary,
            tenant=tenant,
            defaults={"buckets": buckets},
        )


def _splits_remove(rollout: Rollout, tenant_ids: Sequence[int] | None = None) -> None:
    """Remove the canary's splits the rollout made (of `tenant_ids` only, when given)."""
    splits = AliasSplit.objects.filter(alias=rollout.alias, version=rollout.canary)
    if tenant_ids is not None:
        splits.filter(tenant_id__in=tenant_ids).delete()
    elif rollout.scoped:
        splits.filter(tenant__in=rollout.tenants.all()).delete()
    else:
        splits.filter(tenant__isnull=True).delete()


def _decide(
    rollout: Rollout,
    *,
    action: str,
    reason: str,
    evidence: dict[str, Any],
    actor: User | None,
    before: dict[str, Any],
) -> RolloutDecision:
    decision = RolloutDecision.objects.create(
        rollout=rollout,
        action=action,
        percent=rollout.percent,
        reason=reason,
        evidence=evidence,
        actor=actor,
    )
    scope = {"tenants": _tenant_slugs(rollout)} if rollout.scoped else {}
    audit_record(
        action=f"rollout.{action}",
        target_type="rollout",
        target_id=f"{rollout.pk}",
        actor=actor,
        reason=reason,
        before=before,
        after=_snapshot(rollout),
        data={
            "alias": rollout.alias.name,
            "canary": rollout.canary.public_name,
            **scope,
            **evidence,
        },
    )
    return decision


def _snapshot(rollout: Rollout) -> dict[str, Any]:
    snapshot = {"state": rollout.state, "percent": rollout.percent, "step": rollout.step_index}
    if rollout.scoped:
        snapshot["tenants"] = _tenant_slugs(rollout)
    return snapshot


def rollout_start(
    *,
    alias: Alias,
    canary: ModelVersion,
    steps: list[float] | None = None,
    min_samples: int = 200,
    min_step_seconds: int = 300,
    guardrails: dict[str, float] | None = None,
    short_window_seconds: int = 300,
    breach_checks: int = 2,
    tenants: Sequence[Tenant] = (),
    actor: User | None = None,
    reason: str = "",
) -> Rollout:
    """Start sending the first step's share of an alias's traffic to a canary version.

    With `tenants`, the share is of those tenants' traffic alone (see the module's doc). A
    tenant already targeted on the alias, by a split or another active rollout, is refused:
    its traffic would not be the primary's to compare with.
    """
    steps = _steps_check(steps if steps is not None else default_steps())
    guardrails = _guardrails_check(guardrails)
    tenants = list(dict.fromkeys(tenants))
    targeting_tenants_check(tenants)
    if canary.pk == alias.version_id:
        raise ValidationError({"canary": f"{canary.public_name} already serves {alias.name}"})
    if canary.model.task != alias.version.model.task:
        raise ValidationError({"canary": "the canary must do the same task as the alias"})
    if min_samples < 1 or breach_checks < 1:
        raise ValidationError({"min_samples": "min_samples and breach_checks must be ≥ 1"})
    alias_version_check(alias=alias, version=canary, field="canary", tenants=tenants)
    deployment = deployment_for(canary)
    if deployment is None:
        raise ValidationError({"canary": f"{canary.public_name} has no deployment; create one"})
    with transaction.atomic():
        Alias.objects.select_for_update().get(pk=alias.pk)
        _start_conflicts_check(alias, tenants)
        rollout = Rollout.objects.create(
            alias=alias,
            baseline=alias.version,
            canary=canary,
            steps=steps,
            step_started_at=timezone.now(),
            min_samples=min_samples,
            min_step_seconds=min_step_seconds,
            guardrails=guardrails,
            short_window_seconds=short_window_seconds,
            breach_checks=breach_checks,
            scoped=bool(tenants),
            created_by=actor,
        )
        rollout.tenants.set(tenants)
        # A deployment retired by an earlier rollback serves again.
        deployment_serve(deployment=deployment)
        _split_set(rollout, rollout.percent)
        _decide(
            rollout,
            action="start",
            reason=reason or f"canary {canary.public_name} at {rollout.percent:g}%",
            evidence={"steps": steps, "guardrails": guardrails},
            actor=actor,
            before={"state": None, "baseline": alias.version.public_name},
        )
    return rollout


def _start_conflicts_check(alias: Alias, tenants: Sequence[Tenant]) -> None:
    """Refuse a second rollout of the same traffic: of every tenant, or of a tenant named."""
    active = Rollout.objects.filter(alias=alias, state__in=ACTIVE)
    if not tenants:
        if active.filter(scoped=False).exists():
            raise RolloutConflict(f"{alias.name} already has a rollout in progress")
        return
    held = list(active.filter(tenants__in=tenants).values_list("pk", "tenants__slug"))
    if held:
        named = ", ".join(f"{slug} (rollout {pk})" for pk, slug in sorted(held))
        raise RolloutConflict(f"{alias.name} already has a rollout in progress for {named}")
    targeted = AliasSplit.objects.filter(alias=alias, tenant__in=tenants).select_related(
        "tenant", "version__model"
    )
    if targeted:
        named = ", ".join(f"{s.tenant} ({s.version.public_name} {s.percent:g}%)" for s in targeted)
        raise ValidationError(
            {
                "tenants": f"{named} already have splits of {alias.name} of their own: remove "
                "them first, so the canary is compared with the primary they would be on"
            }
        )


def _window_verdicts(
    rollout: Rollout, canary: Slis, baseline: Slis, *, floor: int
) -> dict[str, dict[str, Any]]:
    """Compare one window; return each guardrail's numbers and whether it is breached."""
    limits = rollout.guardrails
    out: dict[str, dict[str, Any]] = {}
    enough = canary.requests >= floor and baseline.requests >= floor

    def ratio(name: str, c: float | None, b: float | None) -> None:
        breached = enough and c is not None and b is not None and b > 0 and c / b > limits[name]
        out[name] = {"canary": c, "baseline": b, "limit": limits[name], "breached": breached}

    points = canary.error_rate_pct - baseline.error_rate_pct
    out["error_rate_points"] = {
        "canary": canary.error_rate_pct,
        "baseline": baseline.error_rate_pct,
        "limit": limits["error_rate_points"],
        "breached": enough and points > limits["error_rate_points"],
    }
    ratio("ttft_p95_ratio", canary.ttft_p95_ms, baseline.ttft_p95_ms)
    ratio("itl_p95_ratio", canary.itl_p95_ms, baseline.itl_p95_ms)
    ratio("cost_per_1k_ratio", canary.cost_per_1k, baseline.cost_per_1k)
    return out


def rollout_verdict(rollout: Rollout, *, now: dt.datetime | None = None) -> Verdict:
    """Judge a running rollout from its usage records, without changing anything."""
    now = now or timezone.now()
    since = rollout.step_started_at
    recent = max(since, now - dt.timedelta(seconds=rollout.short_window_seconds))
    # A scoped canary is judged on its tenants' requests alone; the baseline on everyone's,
    # since a tenant moved whole sends the baseline nothing to compare with.
    tenants = _tenant_ids(rollout)
    long = {
        "canary": version_slis(version=rollout.canary, since=since, until=now, tenant_ids=tenants),
        "baseline": version_slis(version=rollout.baseline, since=since, until=now),
    }
    short = {
        "canary": version_slis(version=rollout.canary, since=recent, until=now, tenant_ids=tenants),
        "baseline": version_slis(version=rollout.baseline, since=recent, until=now),
    }
    # Too few requests make percentiles noise: a window needs a quarter of the step's sample.
    floor = max(5, rollout.min_samples // 4)
    step_checks = _window_verdicts(rollout, long["canary"], long["baseline"], floor=floor)
    recent_checks = _window_verdicts(rollout, short["canary"], short["baseline"], floor=floor)
    breached = tuple(
        name
        for name in GUARDRAILS
        if step_checks[name]["breached"] and recent_checks[name]["breached"]
    )
    evidence: dict[str, Any] = {
        "percent": rollout.percent,
        **({"tenants": _tenant_slugs(rollout)} if rollout.scoped else {}),
        "step": {k: v.as_dict() for k, v in long.items()},
        "recent": {k: v.as_dict() for k, v in short.items()},
        "checks": {"step": step_checks, "recent": recent_checks},
        "breached": list(breached),
        "breaches_in_a_row": rollout.breaches + (1 if breached else 0),
    }
    if breached:
        if rollout.breaches + 1 >= rollout.breach_checks:
            return Verdict("rollback", f"guardrails breached: {', '.join(breached)}", evidence)
        return Verdict(
            "hold",
            f"guardrails breached ({', '.join(breached)}), "
            f"{rollout.breaches + 1} of {rollout.breach_checks} analyses in a row",
            evidence,
            breached,
        )
    waiting = []
    for side, slis in long.items():
        if slis.requests < rollout.min_samples:
            waiting.append(f"{side} {slis.requests}/{rollout.min_samples} requests")
    held = (now - since).total_seconds()
    if held < rollout.min_step_seconds:
        waiting.append(f"step held {held:.0f}/{rollout.min_step_seconds}s")
    if waiting:
        return Verdict("hold", "waiting: " + ", ".join(waiting), evidence)
    following = rollout.steps[rollout.step_index + 1]
    if following >= 100:
        return Verdict("promote", f"healthy at {rollout.percent:g}%: promoting", evidence)
    return Verdict("advance", f"healthy at {rollout.percent:g}%: to {following:g}%", evidence)


def _rollback(
    rollout: Rollout, *, reason: str, evidence: dict[str, Any], actor: User | None
) -> None:
    before = _snapshot(rollout)
    _splits_remove(rollout)
    rollout.state = RolloutState.ROLLED_BACK
    rollout.finished_at = timezone.now()
    rollout.save()
    _decide(
        rollout, action="rollback", reason=reason, evidence=evidence, actor=actor, before=before
    )
    _retire_canary(rollout, actor=actor)


def _retire_canary(rollout: Rollout, *, actor: User | None) -> None:
    """Drain the canary's workers unless they serve something else (a base, an alias, a split).

    A split left naming the canary (another tenant moved to it, another rollout's) still
    sends it traffic: its workers stay.
    """
    canary = rollout.canary
    if canary.base_id is not None:
        return  # an adapter: its base's workers go on serving the base
    if Alias.objects.filter(version=canary).exists():
        return
    if AliasSplit.objects.filter(version=canary).exists():
        return
    for deployment in Deployment.objects.filter(version=canary):
        deployment_retire(deployment=deployment, actor=actor)


def _tenants_rollback(
    rollout: Rollout,
    *,
    tenants: Sequence[Tenant],
    reason: str,
    evidence: dict[str, Any],
    actor: User | None,
) -> None:
    """Take some of a scoped rollout's tenants back to the primary; the rest carry on.

    The last tenant's going rolls the whole rollout back.
    """
    if not rollout.scoped:
        raise ValidationError({"tenants": f"rollout {rollout.pk} is not scoped to tenants"})
    targeted = set(rollout.tenants.values_list("pk", flat=True))
    outside = sorted(t.slug for t in tenants if t.pk not in targeted)
    if outside:
        raise ValidationError({"tenants": f"rollout {rollout.pk} does not target {outside}"})
    if targeted <= {t.pk for t in tenants}:
        _rollback(rollout, reason=reason, evidence=evidence, actor=actor)
        return
    before = _snapshot(rollout)
    _splits_remove(rollout, [t.pk for t in tenants])
    rollout.tenants.remove(*tenants)
    rollout.save(update_fields=["updated_at"])
    evidence = {**evidence, "rolled_back_tenants": sorted(t.slug for t in tenants)}
    _decide(
        rollout,
        action="tenant_rollback",
        reason=reason,
        evidence=evidence,
        actor=actor,
        before=before,
    )


def _promote(
    rollout: Rollout, *, reason: str, evidence: dict[str, Any], actor: User | None
) -> None:
    before = _snapshot(rollout)
    alias = rollout.alias
    if rollout.scoped:
        # Its tenants stay on the canary, whole; everyone else stays where they were.
        AliasSplit.objects.filter(
            alias=alias, version=rollout.canary, tenant__in=rollout.tenants.all()
        ).update(buckets=BUCKETS)
        change_publish(ROUTES)  # update() sends no signal
    else:
        alias.version = rollout.canary
        alias.save(update_fields=["version", "updated_at"])
        # The canary is everyone's primary now: splits naming it, tenant-targeted ones too,
        # would only keep their tenants out of the next rollout. A scoped rollout of the same
        # version still running keeps its own.
        running = Rollout.tenants.through.objects.filter(
            rollout__alias=alias, rollout__state__in=ACTIVE, rollout__canary=rollout.canary
        ).values_list("tenant_id", flat=True)
        AliasSplit.objects.filter(alias=alias, version=rollout.canary).exclude(
            tenant_id__in=list(running)
        ).delete()
    rollout.step_index = len(rollout.steps) - 1
    rollout.state = RolloutState.PROMOTED
    rollout.finished_at = timezone.now()
    rollout.save()
    _decide(rollout, action="promote", reason=reason, evidence=evidence, actor=actor, before=before)


def _locked(rollout: Rollout) -> Rollout:
    return (
        Rollout.objects.select_for_update()
        .select_related("alias", "canary__model", "baseline__model")
        .get(pk=rollout.pk)
    )


def rollout_analyze(rollout: Rollout, *, now: dt.datetime | None = None) -> Verdict | None:
    """Run one analysis of a running rollout and act on it; None if it is not running."""
    with transaction.atomic():
        rollout = _locked(rollout)
        if rollout.state != RolloutState.RUNNING:
            return None
        verdict = rollout_verdict(rollout, now=now)
        if verdict.action == "rollback":
            _rollback(rollout, reason=verdict.reason, evidence=verdict.evidence, actor=None)
        elif verdict.action == "promote":
            _promote(rollout, reason=verdict.reason, evidence=verdict.evidence, actor=None)
        elif verdict.action == "advance":
            before = _snapshot(rollout)
            rollout.step_index += 1
            rollout.step_started_at = now or timezone.now()
            rollout.breaches = 0
            rollout.save()
            _split_set(rollout, rollout.percent)
            _decide(
                rollout,
                action="advance",
                reason=verdict.reason,
                evidence=verdict.evidence,
                actor=None,
                before=before,
            )
        else:
            breaches = len(verdict.breached) and rollout.breaches + 1
            if breaches or rollout.breaches:
                # A breach (or the end of one) is a decision worth keeping; a plain wait is not.
                before = _snapshot(rollout)
                rollout.breaches = breaches
                rollout.save(update_fields=["breaches", "updated_at"])
                _decide(
                    rollout,
                    action="hold",
                    reason=verdict.reason,
                    evidence=verdict.evidence,
                    actor=None,
                    before=before,
                )
    log.info("rollout %s: %s (%s)", rollout.pk, verdict.action, verdict.reason)
    return verdict


def rollouts_analyze(*, now: dt.datetime | None = None) -> dict[int, str]:
    """Analyse every running rollout; return what each one did."""
    done = {}
    for rollout in Rollout.objects.filter(state=RolloutState.RUNNING):
        try:
            verdict = rollout_analyze(rollout, now=now)
        except Exception:
            log.exception("analysis of rollout %s failed", rollout.pk)
            continue
        if verdict is not None:
            done[rollout.pk] = verdict.action
    return done


def rollout_fail_fast_verdict(rollout: Rollout, *, now: dt.datetime) -> Verdict | None:
    """A rollback verdict when the canary fails outright (see the module's doc), else None.

    Only counts, from the database: cheap enough to run every few seconds. The baseline's
    count keeps an outage of the whole platform (both versions failing) from rolling back a
    canary that is not the cause; the regular analysis judges that case.
    """
    since = max(
        rollout.created_at,
        now - dt.timedelta(seconds=settings.ROUNDHOUSE_ROLLOUT_FAIL_FAST_WINDOW_SECONDS),
    )
    requests, errors = version_failures(
        version=rollout.canary, since=since, until=now, tenant_ids=_tenant_ids(rollout)
    )
    least = settings.ROUNDHOUSE_ROLLOUT_FAIL_FAST_MIN_REQUESTS
    if least <= 0 or requests < least:
        return None
    share = 100 * errors / requests
    if share < settings.ROUNDHOUSE_ROLLOUT_FAIL_FAST_ERROR_PCT:
        return None
    base_requests, base_errors = version_failures(version=rollout.baseline, since=since, until=now)
    base_share = 100 * base_errors / base_requests if base_requests else 0.0
    if base_requests >= least and base_share >= share / 2:
        return None  # the baseline fails too: not the canary's doing
    evidence = {
        "percent": rollout.percent,
        **({"tenants": _tenant_slugs(rollout)} if rollout.scoped else {}),
        "fail_fast": {
            "since": since.isoformat(),
            "canary": {"requests": requests, "errors": errors, "error_rate_pct": round(share, 3)},
            "baseline": {
                "requests": base_requests,
                "errors": base_errors,
                "error_rate_pct": round(base_share, 3),
            },
            "limit_pct": settings.ROUNDHOUSE_ROLLOUT_FAIL_FAST_ERROR_PCT,
            "min_requests": least,
        },
    }
    reason = (
        f"failing fast: the canary failed {errors} of its last {requests} requests "
        f"({share:.0f} %; the baseline {base_share:.0f} % of {base_requests})"
    )
    return Verdict("rollback", reason, evidence, ("error_rate_points",))


def rollouts_fail_fast(*, now: dt.datetime | None = None) -> list[int]:
    """Roll back every running rollout whose canary fails outright; return their ids."""
    now = now or timezone.now()
    rolled = []
    for rollout in Rollout.objects.filter(state=RolloutState.RUNNING):
        try:
            with transaction.atomic():
                rollout = _locked(rollout)
                if rollout.state != RolloutState.RUNNING:
                    continue
                verdict = rollout_fail_fast_verdict(rollout, now=now)
                if verdict is None:
                    continue
                _rollback(rollout, reason=verdict.reason, evidence=verdict.evidence, actor=None)
        except Exception:
            log.exception("fail-fast check of rollout %s failed", rollout.pk)
            continue
        log.warning("rollout %s rolled back: %s", rollout.pk, verdict.reason)
        rolled.append(rollout.pk)
    return rolled


def rollout_act(
    rollout: Rollout,
    *,
    action: str,
    actor: User | None,
    reason: str = "",
    tenants: Sequence[Tenant] = (),
) -> Rollout:
    """Promote, pause, resume or roll back a rollout by hand.

    A rollback with `tenants` takes only those tenants of a scoped rollout back to the
    primary.
    """
    if tenants and action != "rollback":
        raise ValidationError({"tenants": "only a rollback names tenants"})
    with transaction.atomic():
        rollout = _locked(rollout)
        if not rollout.is_active:
            raise RolloutConflict(f"rollout {rollout.pk} is {rollout.state}; nothing to {action}")
        evidence = {"manual": True, "percent": rollout.percent}
        reason = reason or f"{action} by {actor.get_username() if actor else 'an operator'}"
        if tenants:
            _tenants_rollback(
                rollout, tenants=tenants, reason=reason, evidence=evidence, actor=actor
            )
        elif action == "promote":
            _promote(rollout, reason=reason, evidence=evidence, actor=actor)
        elif action == "rollback":
            _rollback(rollout, reason=reason, evidence=evidence, actor=actor)
        elif action in ("pause", "resume"):
            wanted = RolloutState.RUNNING if action == "pause" else RolloutState.PAUSED
            if rollout.state != wanted:
                raise RolloutConflict(f"rollout {rollout.pk} is {rollout.state}; cannot {action}")
            before = _snapshot(rollout)
            rollout.state = RolloutState.PAUSED if action == "pause" else RolloutState.RUNNING
            rollout.breaches = 0
            rollout.save()
            _decide(
                rollout, action=action, reason=reason, evidence=evidence, actor=actor, before=before
            )
        else:
            raise ValidationError({"action": "action must be promote, pause, resume or rollback"})
    return rollout
