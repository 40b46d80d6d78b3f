"""Canary rollouts: ramp a version's share of an alias, compare it, promote or roll back.

A rollout moves through its steps (percent of the alias's traffic). Every analysis (every
10 s by default) judges the canary on the SLIs the burn-rate alerts page on — availability,
time to first token and inter-token latency against the objectives of the deployment serving
it — over two windows that slide with each analysis (10 s and 60 s by default):

- an SLO burns over the short window when the canary spends its error budget at least
  `burn_rate` times as fast as it may, and `burn_vs_baseline` times as fast as the baseline
  (both versions burning is the platform's trouble); over the long window, when it spends it
  at least `burn_rate` times as fast over at least a few events;
- it rolls back when the SLO burns over the short window in `breach_checks` analyses in a
  row (3), and over the long window at the last of them. The short window is no longer than
  the analysis period, so one noisy stretch counts in two analyses at most; the long window
  keeps a few late requests in a quiet short window from counting as a trend. A real breach
  rolls back about 30 s after its requests reach the records. An analysis with no canary
  request in its short window neither adds to the count nor clears it;
- the serving-cost guard compares engine-seconds per 1k tokens over the step: a canary that
  costs more than `engine_seconds_per_1k_ratio` times the baseline's is held at its step,
  neither advanced nor promoted, until it is cheaper again or an operator acts;
- a step advances once both versions have `min_samples` requests in it, it has lasted
  `min_step_seconds` and nothing is breached or held. Leaving the last step below 100 %
  promotes.

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

from billing.selectors import (
    SloWindow,
    version_failures,
    version_serving_cost,
    version_slo_windows,
)
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
    short_window_seconds: int = 10,
    long_window_seconds: int = 60,
    breach_checks: int = 3,
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
    if not 1 <= short_window_seconds <= long_window_seconds:
        raise ValidationError(
            {"long_window_seconds": "the long window must be at least the short one (≥ 1 s)"}
        )
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
            long_window_seconds=long_window_seconds,
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


# A p95 latency objective leaves 5 % of events over its threshold: the latency SLOs' budget.
LATENCY_BUDGET = 0.05
SLOS = ("availability", "ttft", "itl")


def _guardrails(rollout: Rollout) -> dict[str, float]:
    """The rollout's guardrails over the defaults (a rollout stored before a guardrail existed
    gets its default; names no longer known are ignored)."""
    stored = {k: float(v) for k, v in rollout.guardrails.items() if k in GUARDRAILS}
    return {**default_guardrails(), **stored}


@dataclass(frozen=True)
class Objectives:
    """The SLOs a canary is held to: those of the deployment serving it."""

    ttft_ms: float
    itl_ms: float
    availability: float

    @classmethod
    def of(cls, version: ModelVersion) -> Objectives:
        deployment = deployment_for(version)
        if deployment is None:
            defaults = Deployment()
            return cls(defaults.slo_ttft_p95_ms, defaults.slo_itl_p95_ms, 0.999)
        return cls(
            float(deployment.slo_ttft_p95_ms),
            float(deployment.slo_itl_p95_ms),
            float(deployment.slo_availability),
        )

    def budgets(self) -> dict[str, float]:
        return {
            "availability": max(1e-6, 1 - self.availability),
            "ttft": LATENCY_BUDGET,
            "itl": LATENCY_BUDGET,
        }


def _burns(window: SloWindow, budgets: dict[str, float]) -> dict[str, tuple[int, float]]:
    """(events, burn rate) of each SLO over a window: the bad share over the budget."""
    counted = {
        "availability": (window.requests, window.failed),
        "ttft": (window.ttft_events, window.ttft_slow),
        "itl": (window.itl_events, window.itl_slow),
    }
    return {
        slo: (events, round(bad / events / budgets[slo], 3) if events else 0.0)
        for slo, (events, bad) in counted.items()
    }


def _burn_checks(
    rollout: Rollout, *, now: dt.datetime, objectives: Objectives, limits: dict[str, float]
) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...], bool]:
    """Compare the canary's error-budget burn with the limit and the baseline's, per SLO.

    Returns the evidence, the SLOs breached over the short window, those breached over both,
    and whether the short window held any canary request at all (without one an analysis has
    no new evidence).
    """
    windows = (rollout.short_window_seconds, rollout.long_window_seconds)

    def windows_of(version: ModelVersion, tenant_ids: list[int] | None) -> list[SloWindow]:
        return version_slo_windows(
            version=version,
            until=now,
            windows=windows,
            ttft_ms=objectives.ttft_ms,
            itl_ms=objectives.itl_ms,
            tenant_ids=tenant_ids,
        )

    canary = windows_of(rollout.canary, _tenant_ids(rollout))
    baseline = windows_of(rollout.baseline, None)
    budgets = objectives.budgets()
    least = settings.ROUNDHOUSE_ROLLOUT_BURN_MIN_EVENTS
    checks: dict[str, Any] = {}
    burning, breached = [], []
    for slo in SLOS:
        check: dict[str, Any] = {"budget": budgets[slo]}
        hits = []
        for name, c_window, b_window, floor in (
            ("short", canary[0], baseline[0], 1),
            ("long", canary[1], baseline[1], least),
        ):
            c_events, c_burn = _burns(c_window, budgets)[slo]
            b_events, b_burn = _burns(b_window, budgets)[slo]
            # The baseline is compared over the short windows, each analysis's own evidence;
            # the long window only makes sure the burn is more than a few requests.
            hit = (
                c_events >= floor
                and c_burn >= limits["burn_rate"]
                and (name == "long" or c_burn >= limits["burn_vs_baseline"] * b_burn)
            )
            check[name] = {
                "canary": {"events": c_events, "burn": c_burn},
                "baseline": {"events": b_events, "burn": b_burn},
                "breached": hit,
            }
            hits.append(hit)
        check["breached"] = all(hits)
        checks[slo] = check
        if hits[0]:
            burning.append(slo)
        if check["breached"]:
            breached.append(slo)
    evidence = {
        "objectives": {
            "ttft_ms": objectives.ttft_ms,
            "itl_ms": objectives.itl_ms,
            "availability": objectives.availability,
        },
        "windows": {"short": windows[0], "long": windows[1]},
        "limits": {"burn_rate": limits["burn_rate"], "vs_baseline": limits["burn_vs_baseline"]},
        "slos": checks,
        "canary": {"short": canary[0].as_dict(), "long": canary[1].as_dict()},
        "baseline": {"short": baseline[0].as_dict(), "long": baseline[1].as_dict()},
    }
    return evidence, tuple(burning), tuple(breached), canary[0].requests > 0


def rollout_verdict(rollout: Rollout, *, now: dt.datetime | None = None) -> Verdict:
    """Judge a running rollout from its usage records, without changing anything.

    Rollback: an SLO's budget burns past the limit, and past the baseline's, over both sliding
    windows, in `breach_checks` analyses in a row. Hold: a breach not yet seen often enough,
    the serving-cost guard, or a step short of its samples or time. Otherwise advance, or
    promote from the last step below 100 %.
    """
    now = now or timezone.now()
    since = rollout.step_started_at
    limits = _guardrails(rollout)
    # A scoped canary is judged on its tenants' requests alone; the baseline on everyone's,
    # since a tenant moved whole sends the baseline nothing to compare with.
    tenants = _tenant_ids(rollout)
    burn, burning, breached, evidenced = _burn_checks(
        rollout, now=now, objectives=Objectives.of(rollout.canary), limits=limits
    )
    step = {
        "canary": version_serving_cost(
            version=rollout.canary, since=since, until=now, tenant_ids=tenants
        ),
        "baseline": version_serving_cost(version=rollout.baseline, since=since, until=now),
    }
    # The cost guard needs a quarter of the step's sample on each side before it judges.
    floor = max(5, rollout.min_samples // 4)
    c_cost, b_cost = step["canary"].per_1k, step["baseline"].per_1k
    cost_limit = limits["engine_seconds_per_1k_ratio"]
    cost_ratio = round(c_cost / b_cost, 3) if c_cost is not None and b_cost else None
    costly = (
        step["canary"].requests >= floor
        and step["baseline"].requests >= floor
        and cost_ratio is not None
        and cost_ratio > cost_limit
    )
    # Without a canary request in the short window an analysis neither adds to nor clears
    # the breaches counted so far.
    in_a_row = rollout.breaches + 1 if burning else (rollout.breaches if not evidenced else 0)
    evidence: dict[str, Any] = {
        "percent": rollout.percent,
        **({"tenants": _tenant_slugs(rollout)} if rollout.scoped else {}),
        "burn": burn,
        "step": {k: v.as_dict() for k, v in step.items()},
        "cost": {
            "canary": c_cost,
            "baseline": b_cost,
            "ratio": cost_ratio,
            "limit": cost_limit,
            "breached": costly,
        },
        "burning": list(burning),
        "breached": list(breached),
        "breaches_in_a_row": in_a_row,
    }
    if burning:
        named = ", ".join(f"{slo} burn {burn['slos'][slo]['short']['canary']['burn']:g}×"
                          for slo in burning)  # fmt: skip
        if breached and in_a_row >= rollout.breach_checks:
            return Verdict("rollback", f"error budget burning: {named}", evidence, breached)
        long = "over the long window too" if breached else "not yet over the long window"
        return Verdict(
            "hold",
            f"error budget burning ({named}; {long}), {in_a_row} of {rollout.breach_checks} "
            "analyses in a row",
            evidence,
            burning,
        )
    if costly:
        return Verdict(
            "hold",
            f"serving cost {c_cost:g} engine-s per 1k tokens, {cost_ratio:g}× the baseline's "
            f"{b_cost:g} (limit {cost_limit:g}×): held at {rollout.percent:g}%",
            evidence,
        )
    waiting = []
    for side, cost in step.items():
        if cost.requests < rollout.min_samples:
            waiting.append(f"{side} {cost.requests}/{rollout.min_samples} requests")
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
            rollout.cost_held = False
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
            breaches = verdict.evidence["breaches_in_a_row"]
            cost_held = verdict.evidence["cost"]["breached"]
            changed = breaches != rollout.breaches or cost_held != rollout.cost_held
            if changed or verdict.breached:
                # A breach, the end of one, or the cost guard holding or letting go is a
                # decision worth keeping; a plain wait is not.
                before = _snapshot(rollout)
                rollout.breaches = breaches
                rollout.cost_held = cost_held
                rollout.save(update_fields=["breaches", "cost_held", "updated_at"])
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
    return Verdict("rollback", reason, evidence, ("availability",))


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
