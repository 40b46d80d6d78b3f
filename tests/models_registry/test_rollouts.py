"""The canary policy over real usage records: ramp, promote, roll back, ignore blips."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import UsageRecord
from billing.services import price_current
from models_registry.models import (
    Alias,
    AliasSplit,
    Deployment,
    DeploymentState,
    Rollout,
    RolloutState,
)
from models_registry.selectors import routing_resolve
from models_registry.services import (
    alias_set,
    alias_split_set,
    deployment_create,
    model_version_register,
)
from rollouts.services import (
    RolloutConflict,
    rollout_act,
    rollout_analyze,
    rollout_start,
    rollout_verdict,
    rollouts_fail_fast,
)
from tenants.models import AuditEvent, Tenant

pytestmark = pytest.mark.django_db
_ids = itertools.count()


@pytest.fixture
def versions(tmp_path, world):
    made = []
    for content in ("base", "canary"):
        source = tmp_path / content
        source.mkdir()
        (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
        (source / "weights.bin").write_text(content)
        version, _ = model_version_register(
            model_name="roll",
            source_dir=source,
            label=content,
            price_input_per_1k=Decimal("1"),
            price_output_per_1k=Decimal("2"),
        )
        deployment_create(name=f"roll-{content}", version=version)
        made.append(version)
    Deployment.objects.filter(name__startswith="roll-").update(state=DeploymentState.READY)
    alias = alias_set(name="roll-chat", version=made[0])
    return alias, made[0], made[1]


def _served(world, version, *, n, at, ttft_ms=20.0, status="ok", itl_ms=10.0, tenant=None):
    """Write n usage records of requests a version finished at a time (acme's by default)."""
    rows = []
    for _ in range(n):
        enqueued = at - dt.timedelta(milliseconds=ttft_ms + 15 * itl_ms)
        first = enqueued + dt.timedelta(milliseconds=ttft_ms)
        rows.append(
            UsageRecord(
                request_id=f"roll-{next(_ids)}",
                tenant=tenant or world.acme,
                model_version=version,
                deployment="x",
                endpoint="chat",
                status=status,
                prompt_tokens=10,
                completion_tokens=16,
                cost=Decimal("0.001"),
                enqueued_at=enqueued,
                started_at=enqueued,
                first_token_at=first if status == "ok" else None,
                finished_at=first + dt.timedelta(milliseconds=15 * itl_ms),
            )
        )
    UsageRecord.objects.bulk_create(rows)


def _start(alias, canary, **policy):
    defaults = dict(steps=[10, 50, 100], min_samples=20, min_step_seconds=60)
    return rollout_start(alias=alias, canary=canary, **{**defaults, **policy})


def test_a_healthy_canary_is_promoted_step_by_step(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary)
    assert AliasSplit.objects.get(alias=alias).buckets == 1000  # 10 %
    t0 = rollout.step_started_at
    for step, (percent, action) in enumerate([(10, "advance"), (50, "promote")]):
        now = t0 + dt.timedelta(minutes=2 * (step + 1))
        _served(world, base, n=30, at=now - dt.timedelta(seconds=30))
        _served(world, canary, n=30, at=now - dt.timedelta(seconds=30))
        rollout.refresh_from_db()
        assert rollout.percent == percent
        verdict = rollout_analyze(rollout, now=now)
        assert verdict is not None
        assert verdict.action == action, verdict.reason
    rollout.refresh_from_db()
    alias.refresh_from_db()
    assert rollout.state == RolloutState.PROMOTED
    assert alias.version == canary and not alias.splits.exists()
    actions = list(rollout.decisions.values_list("action", flat=True))
    assert actions == ["start", "advance", "promote"]
    promote = rollout.decisions.get(action="promote")
    assert promote.evidence["step"]["canary"]["requests"] == 30
    assert AuditEvent.objects.filter(action="rollout.promote", target_id=str(rollout.pk)).exists()


def test_a_step_waits_for_its_minimum_sample(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary)
    now = rollout.step_started_at + dt.timedelta(minutes=5)
    _served(world, base, n=30, at=now - dt.timedelta(seconds=5))
    _served(world, canary, n=3, at=now - dt.timedelta(seconds=5))
    verdict = rollout_analyze(rollout, now=now)
    assert verdict is not None and verdict.action == "hold"
    assert "canary 3/20 requests" in verdict.reason


def _every_10s(rollout, world, base, canary, *, seconds, canary_fields=None, start=None):
    """Serve both versions for `seconds`, analysing every 10 s as the beat does; return the
    (seconds from start, action) of each analysis. `canary_fields(t)` gives the canary's
    requests' fields for the window ending at t (healthy when it returns {})."""
    start = start or rollout.step_started_at
    actions = []
    for t in range(10, seconds + 1, 10):
        now = start + dt.timedelta(seconds=t)
        _served(world, base, n=5, at=now - dt.timedelta(seconds=3))
        fields = canary_fields(t) if canary_fields else {}
        _served(world, canary, n=5, at=now - dt.timedelta(seconds=3), **fields)
        verdict = rollout_analyze(rollout, now=now)
        if verdict is None:
            break
        actions.append((t, verdict.action))
        if verdict.action in ("rollback", "promote"):
            break
    return actions


def test_a_slower_canary_is_rolled_back_after_three_burning_analyses(versions, world):
    """Every canary request later than the TTFT objective (2 s): 20 times the budget, from the
    first analysis; the third in a row rolls back, 30 s after the breach began."""
    alias, base, canary = versions
    rollout = _start(alias, canary, min_samples=1000)
    actions = _every_10s(
        rollout, world, base, canary, seconds=120, canary_fields=lambda t: {"ttft_ms": 2500}
    )
    assert actions == [(10, "hold"), (20, "hold"), (30, "rollback")]
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert not AliasSplit.objects.filter(alias=alias).exists()  # weights reverted
    assert Alias.objects.get(pk=alias.pk).version == base
    # The canary drains; the prior version stays warm.
    assert Deployment.objects.get(name="roll-canary").state == DeploymentState.DRAINING
    assert Deployment.objects.get(name="roll-base").state == DeploymentState.READY
    holds = rollout.decisions.filter(action="hold")
    assert [h.evidence["breaches_in_a_row"] for h in holds] == [1, 2]
    evidence = rollout.decisions.get(action="rollback").evidence
    assert evidence["breached"] == ["ttft"]
    ttft = evidence["burn"]["slos"]["ttft"]
    assert ttft["short"]["canary"] == {"events": 5, "burn": 20.0}
    assert ttft["long"]["canary"] == {"events": 15, "burn": 20.0}
    assert ttft["long"]["baseline"]["burn"] == 0.0
    assert evidence["burn"]["objectives"]["ttft_ms"] == 2000


def test_a_failing_canary_burns_its_availability_budget(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, breach_checks=1)
    now = rollout.step_started_at + dt.timedelta(minutes=1)
    _served(world, base, n=40, at=now - dt.timedelta(seconds=5))
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=5))
    _served(world, canary, n=10, at=now - dt.timedelta(seconds=5), status="error")
    verdict = rollout_analyze(rollout, now=now)
    assert verdict is not None and verdict.action == "rollback"
    assert "availability burn 250×" in verdict.reason  # 25 % failed of a 0.1 % budget


def test_a_burn_both_versions_share_is_not_the_canarys(versions, world):
    """The platform is slow for everyone: the canary burns, but no faster than the baseline."""
    alias, base, canary = versions
    rollout = _start(alias, canary, min_samples=1000)
    start = rollout.step_started_at
    for t in (10, 20, 30, 40):
        now = start + dt.timedelta(seconds=t)
        _served(world, base, n=5, at=now - dt.timedelta(seconds=3), ttft_ms=2500)
        _served(world, canary, n=5, at=now - dt.timedelta(seconds=3), ttft_ms=2500)
        verdict = rollout_analyze(rollout, now=now)
        assert verdict is not None and verdict.action == "hold" and not verdict.breached
        assert verdict.evidence["burn"]["slos"]["ttft"]["short"]["canary"]["burn"] == 20.0


def test_a_real_breach_rolls_back_within_a_minute_and_a_noisy_window_does_not(versions, world):
    """A healthy canary with one noisy stretch (slow and failing, seen by two analyses) keeps
    running; when a tenth of its requests start failing for good, it is rolled back within
    60 s of the breach."""
    alias, base, canary = versions
    rollout = _start(alias, canary, min_samples=1000)

    def canary_fields(t: int) -> dict:
        return {"ttft_ms": 3000, "status": "error"} if t in (40, 50) else {}

    actions = _every_10s(rollout, world, base, canary, seconds=180, canary_fields=canary_fields)
    assert {action for _, action in actions} == {"hold"}
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING and rollout.breaches == 0
    counted = [d.evidence["breaches_in_a_row"] for d in rollout.decisions.filter(action="hold")]
    assert counted == [1, 2, 0]  # seen twice, then cleared
    # From now on one request in ten fails: 100 times the availability budget.
    breach_at = rollout.step_started_at + dt.timedelta(seconds=180)
    rolled_at = None
    for t in range(10, 61, 10):
        now = breach_at + dt.timedelta(seconds=t)
        _served(world, base, n=10, at=now - dt.timedelta(seconds=3))
        _served(world, canary, n=9, at=now - dt.timedelta(seconds=3))
        _served(world, canary, n=1, at=now - dt.timedelta(seconds=3), status="error")
        verdict = rollout_analyze(rollout, now=now)
        assert verdict is not None
        if verdict.action == "rollback":
            rolled_at = t
            break
    assert rolled_at == 30, "three analyses after the breach began"
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert rollout.decisions.get(action="rollback").evidence["breached"] == ["availability"]


def test_an_analysis_without_canary_requests_keeps_the_count(versions, world):
    """A quiet short window is no evidence either way: the breaches counted so far stand."""
    alias, _base, canary = versions
    rollout = _start(alias, canary, min_samples=1000)
    start = rollout.step_started_at
    now = start + dt.timedelta(seconds=10)
    _served(world, canary, n=5, at=now - dt.timedelta(seconds=3), ttft_ms=2500)
    first = rollout_analyze(rollout, now=now)
    assert first is not None and first.breached == ("ttft",)
    quiet = rollout_analyze(rollout, now=now + dt.timedelta(seconds=10))
    assert quiet is not None and quiet.action == "hold" and not quiet.breached
    rollout.refresh_from_db()
    assert rollout.breaches == 1


def test_a_canary_that_costs_twice_per_token_is_held_back(versions, world):
    """Its engine takes twice as long per token (within every latency objective): it is held
    at its first step however long it runs, with the numbers on record, and never promoted."""
    alias, base, canary = versions
    rollout = _start(alias, canary)
    start = rollout.step_started_at
    for minute in range(1, 6):
        now = start + dt.timedelta(minutes=minute)
        _served(world, base, n=30, at=now - dt.timedelta(seconds=30), ttft_ms=20, itl_ms=10)
        _served(world, canary, n=30, at=now - dt.timedelta(seconds=30), ttft_ms=40, itl_ms=20)
        verdict = rollout_analyze(rollout, now=now)
        assert verdict is not None
        assert verdict.action == "hold" and not verdict.breached, verdict.reason
        assert "serving cost" in verdict.reason
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING and rollout.percent == 10 and rollout.cost_held
    (held,) = rollout.decisions.filter(action="hold")  # stored once, when it began
    cost = held.evidence["cost"]
    assert cost["breached"] and cost["ratio"] == 2.0 and cost["limit"] == 1.5
    step = held.evidence["step"]
    assert step["canary"]["engine_seconds_per_1k"] == pytest.approx(
        2 * step["baseline"]["engine_seconds_per_1k"], rel=1e-5
    )


def test_a_canary_that_fails_outright_is_rolled_back_within_seconds(versions, world):
    """Not after three analyses: the fail-fast check sees the first dozen failures."""
    alias, base, canary = versions
    rollout = _start(alias, canary)  # two analyses in a row before the usual rollback
    now = rollout.step_started_at + dt.timedelta(seconds=8)
    _served(world, base, n=40, at=now - dt.timedelta(seconds=4))
    _served(world, canary, n=3, at=now - dt.timedelta(seconds=4))
    _served(world, canary, n=9, at=now - dt.timedelta(seconds=3), status="error")
    assert rollouts_fail_fast(now=now) == [rollout.pk]
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert not AliasSplit.objects.filter(alias=alias, version=canary).exists()
    assert Deployment.objects.get(name="roll-canary").state == DeploymentState.DRAINING
    decision = rollout.decisions.get(action="rollback")
    assert "9 of its last 12" in decision.reason
    assert decision.evidence["fail_fast"]["canary"] == {
        "requests": 12, "errors": 9, "error_rate_pct": 75.0,
    }  # fmt: skip
    assert AuditEvent.objects.filter(action="rollout.rollback", target_id=str(rollout.pk)).exists()
    assert rollouts_fail_fast(now=now) == []  # rolled back once


def test_fail_fast_waits_for_enough_requests_and_ignores_a_platform_wide_outage(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary)
    now = rollout.step_started_at + dt.timedelta(seconds=8)
    _served(world, canary, n=9, at=now - dt.timedelta(seconds=3), status="error")
    assert rollouts_fail_fast(now=now) == []  # 9 failures: fewer than 10 requests
    # The baseline fails as much: the platform, not the canary.
    _served(world, base, n=20, at=now - dt.timedelta(seconds=3), status="worker_lost")
    _served(world, canary, n=1, at=now - dt.timedelta(seconds=3), status="worker_lost")
    assert rollouts_fail_fast(now=now) == []
    # Failures older than the window are forgotten; a healthy minute keeps it running.
    later = now + dt.timedelta(seconds=61)
    _served(world, base, n=20, at=later - dt.timedelta(seconds=2))
    _served(world, canary, n=20, at=later - dt.timedelta(seconds=2))
    assert rollouts_fail_fast(now=later) == []
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING


def test_fail_fast_can_be_switched_off(versions, world, settings):
    settings.ROUNDHOUSE_ROLLOUT_FAIL_FAST_MIN_REQUESTS = 0
    alias, _base, canary = versions
    rollout = _start(alias, canary)
    now = rollout.step_started_at + dt.timedelta(seconds=8)
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=3), status="error")
    assert rollouts_fail_fast(now=now) == []


@pytest.fixture
def staff_user() -> User:
    return User.objects.create_user("otto", is_staff=True)


@pytest.fixture
def staff(staff_user) -> APIClient:
    client = APIClient()
    client.force_login(staff_user)
    return client


def test_operators_start_pause_resume_and_roll_back_through_the_api(staff, versions):
    _alias, _base, _canary = versions
    created = staff.post(
        "/api/rollouts",
        {"alias": "roll-chat", "canary": "roll@canary", "steps": [5, 25, 100], "reason": "v2"},
        format="json",
    )
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    assert created.json()["percent"] == 5
    again = staff.post("/api/rollouts", {"alias": "roll-chat", "canary": "roll@canary"})
    assert again.status_code == 409
    assert staff.post(f"/api/rollouts/{pk}/pause", {"reason": "investigating"}).status_code == 200
    assert Rollout.objects.get(pk=pk).state == RolloutState.PAUSED
    assert staff.post(f"/api/rollouts/{pk}/pause").status_code == 409
    assert staff.post(f"/api/rollouts/{pk}/resume").status_code == 200
    rolled = staff.post(f"/api/rollouts/{pk}/rollback", {"reason": "by hand"})
    assert rolled.status_code == 200 and rolled.json()["state"] == "rolled_back"
    detail = staff.get(f"/api/rollouts/{pk}").json()
    assert [d["action"] for d in detail["decisions"]] == [
        "start", "pause", "resume", "rollback",
    ]  # fmt: skip
    assert detail["decisions"][-1]["actor"] == "otto"
    event = AuditEvent.objects.filter(action="rollout.rollback").latest("id")
    assert event.reason == "by hand"
    assert event.after is not None and event.after["state"] == "rolled_back"


def test_the_api_names_an_unknown_version_and_refuses_non_staff(staff, versions, world):
    response = staff.post("/api/rollouts", {"alias": "roll-chat", "canary": "roll@nope"})
    assert response.status_code == 400 and "canary" in response.json()
    assert (
        staff.post("/api/rollouts", {"alias": "nope", "canary": "roll@canary"}).status_code == 404
    )
    outsider = APIClient()
    outsider.force_login(world.alice)
    assert outsider.get("/api/rollouts").status_code == 403


def test_splits_and_shadow_through_the_api(staff, versions):
    _alias, _base, canary = versions
    split = staff.put(
        "/api/aliases/roll-chat/split", {"version": "roll@canary", "percent": 12.5}, format="json"
    )
    assert split.status_code == 200, split.content
    assert split.json()["splits"] == [{"version": canary.public_name, "percent": 12.5}]
    shadow = staff.put(
        "/api/aliases/roll-chat/shadow", {"version": "roll@canary", "percent": 10}, format="json"
    )
    assert shadow.json()["shadow"] == {"version": canary.public_name, "percent": 10}
    too_much = staff.put(
        "/api/aliases/roll-chat/split", {"version": "roll@canary", "percent": 150}, format="json"
    )
    assert too_much.status_code == 400 and "percent" in too_much.json()


def test_the_cli_starts_and_promotes_a_rollout(versions, capsys):
    alias, _base, canary = versions
    call_command("rollout", "start", "roll-chat", "roll@canary", "--steps", "20,100")
    rollout = Rollout.objects.get(alias=alias, state=RolloutState.RUNNING)
    call_command("rollout", "promote", str(rollout.pk), "--reason", "looks good")
    call_command("rollout", "status", str(rollout.pk))
    out = capsys.readouterr().out
    assert "promote at 100%: looks good" in out
    assert Alias.objects.get(pk=alias.pk).version == canary
    finished = Rollout.objects.get(pk=rollout.pk).finished_at
    assert finished is not None and finished <= timezone.now()


def test_a_versions_slis_are_served_to_operators(staff, versions, world):
    canary = versions[2]
    _served(world, canary, n=10, at=timezone.now() - dt.timedelta(minutes=1), ttft_ms=50)
    response = staff.get("/api/versions/roll@canary/slis", {"minutes": 10})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["requests"] == 10 and body["ttft_p95_ms"] == pytest.approx(50, abs=1)
    assert staff.get("/api/versions/roll@nope/slis").status_code == 404
    assert staff.get("/api/versions/roll@canary/slis", {"minutes": "x"}).status_code == 400


# --- canaries scoped to tenants --------------------------------------------------------------


def _targets(alias):
    """Each targeted tenant's splits of the alias: {slug: {version: percent}}."""
    out: dict[str, dict[str, float]] = {}
    for split in AliasSplit.objects.filter(alias=alias, tenant__isnull=False):
        assert split.tenant is not None
        out.setdefault(split.tenant.slug, {})[split.version.public_name] = split.percent
    return out


def test_a_scoped_canary_takes_a_share_of_its_tenants_traffic_alone(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, tenants=[world.acme])
    assert rollout.scoped and list(rollout.tenants.all()) == [world.acme]
    assert _targets(alias) == {"acme": {canary.public_name: 10.0}}
    assert not AliasSplit.objects.filter(alias=alias, tenant__isnull=True).exists()
    routing = routing_resolve(name="roll-chat", price_of=price_current)
    assert routing is not None
    globex = {routing.pick(tenant_id=world.globex.pk, user=f"u{i}").version for i in range(500)}
    acme = {routing.pick(tenant_id=world.acme.pk, user=f"u{i}").version for i in range(500)}
    assert globex == {base.version} and acme == {base.version, canary.version}
    event = AuditEvent.objects.get(action="rollout.start", target_id=str(rollout.pk))
    assert event.after is not None and event.after["tenants"] == ["acme"]
    assert event.data["tenants"] == ["acme"]


def test_a_scoped_canary_is_judged_on_its_tenants_requests_alone(versions, world):
    """Globex's slow requests on the canary version (pinned by name) are not acme's canary."""
    alias, base, canary = versions
    rollout = _start(alias, canary, tenants=[world.acme], breach_checks=1)
    now = rollout.step_started_at + dt.timedelta(minutes=1)
    _served(world, base, n=30, at=now - dt.timedelta(seconds=5))
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=5), tenant=world.globex,
            ttft_ms=2500)  # fmt: skip
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=5))
    verdict = rollout_verdict(rollout, now=now)
    assert verdict.action == "advance" and not verdict.breached, verdict.reason
    assert verdict.evidence["tenants"] == ["acme"]
    assert verdict.evidence["step"]["canary"]["requests"] == 30
    # Acme's own slow requests do breach it.
    _served(world, canary, n=60, at=now - dt.timedelta(seconds=2), ttft_ms=2500)
    analysed = rollout_analyze(rollout, now=now + dt.timedelta(seconds=1))
    assert analysed is not None, "not running"
    assert analysed.action == "rollback", analysed.reason
    assert analysed.breached == ("ttft",)


def test_a_scoped_canarys_rollback_reverts_only_its_targeting(versions, world):
    alias, base, canary = versions
    alias_split_set(alias=alias, version=canary, percent=100, tenants=[world.globex])
    rollout = _start(alias, canary, tenants=[world.acme], breach_checks=1)
    now = rollout.step_started_at + dt.timedelta(minutes=1)
    _served(world, base, n=40, at=now - dt.timedelta(seconds=10))
    _served(world, canary, n=40, at=now - dt.timedelta(seconds=10), status="error")
    verdict = rollout_analyze(rollout, now=now)
    assert verdict is not None and verdict.action == "rollback"
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert _targets(alias) == {"globex": {canary.public_name: 100.0}}
    # Globex is still sent to the canary: its workers stay.
    assert Deployment.objects.get(name="roll-canary").state == DeploymentState.READY
    event = AuditEvent.objects.get(action="rollout.rollback", target_id=str(rollout.pk))
    assert event.data["tenants"] == ["acme"]


def test_fail_fast_counts_only_a_scoped_canarys_tenants(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, tenants=[world.acme])
    now = rollout.step_started_at + dt.timedelta(seconds=8)
    _served(world, base, n=40, at=now - dt.timedelta(seconds=4))
    _served(world, canary, n=20, at=now - dt.timedelta(seconds=3), status="error",
            tenant=world.globex)  # fmt: skip
    assert rollouts_fail_fast(now=now) == []
    _served(world, canary, n=12, at=now - dt.timedelta(seconds=3), status="error")
    assert rollouts_fail_fast(now=now) == [rollout.pk]
    decision = Rollout.objects.get(pk=rollout.pk).decisions.get(action="rollback")
    assert decision.evidence["fail_fast"]["canary"]["requests"] == 12
    assert decision.evidence["tenants"] == ["acme"]
    assert _targets(alias) == {}


def test_one_tenant_of_a_scoped_canary_rolls_back_alone(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, tenants=[world.acme, world.globex])
    assert _targets(alias) == {
        "acme": {canary.public_name: 10.0}, "globex": {canary.public_name: 10.0},
    }  # fmt: skip
    rollout_act(rollout, action="rollback", actor=None, reason="acme only", tenants=[world.acme])
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING
    assert list(rollout.tenants.all()) == [world.globex]
    assert _targets(alias) == {"globex": {canary.public_name: 10.0}}
    decision = rollout.decisions.latest("id")
    assert decision.action == "tenant_rollback"
    assert decision.evidence["rolled_back_tenants"] == ["acme"]
    event = AuditEvent.objects.filter(action="rollout.tenant_rollback").latest("id")
    assert event.before is not None and event.before["tenants"] == ["acme", "globex"]
    assert event.after is not None and event.after["tenants"] == ["globex"]
    # The rollout goes on for globex: its next step is globex's alone.
    now = rollout.step_started_at + dt.timedelta(minutes=2)
    _served(world, base, n=30, at=now - dt.timedelta(seconds=30))
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=30), tenant=world.globex)
    verdict = rollout_analyze(rollout, now=now)
    assert verdict is not None, "not running"
    assert verdict.action == "advance", verdict.reason
    assert _targets(alias) == {"globex": {canary.public_name: 50.0}}
    with pytest.raises(ValidationError, match="does not target"):
        rollout_act(rollout, action="rollback", actor=None, tenants=[world.acme])
    # The last tenant's going rolls the whole rollout back.
    rollout_act(rollout, action="rollback", actor=None, tenants=[world.globex])
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK and _targets(alias) == {}


def test_a_promoted_scoped_canary_keeps_its_tenants_on_it_and_the_primary_for_others(
    versions, world
):
    alias, base, canary = versions
    rollout = _start(alias, canary, tenants=[world.acme], steps=[50, 100])
    rollout_act(rollout, action="promote", actor=None, reason="acme is happy")
    rollout.refresh_from_db()
    alias.refresh_from_db()
    assert rollout.state == RolloutState.PROMOTED
    assert alias.version == base
    assert _targets(alias) == {"acme": {canary.public_name: 100.0}}
    assert Deployment.objects.get(name="roll-canary").state == DeploymentState.READY


def test_scoped_rollouts_of_other_tenants_run_side_by_side(versions, world):
    alias, _base, canary = versions
    everyone = _start(alias, canary)
    acme = _start(alias, canary, tenants=[world.acme])
    globex = _start(alias, canary, tenants=[world.globex])
    assert {everyone.state, acme.state, globex.state} == {RolloutState.RUNNING}
    with pytest.raises(RolloutConflict, match="acme"):
        _start(alias, canary, tenants=[world.acme])
    with pytest.raises(RolloutConflict):
        _start(alias, canary)
    # A tenant a rollout holds is the rollout's to move.
    with pytest.raises(ValidationError, match="rollout"):
        alias_split_set(alias=alias, version=canary, percent=100, tenants=[world.acme])
    # A tenant already split on its own cannot start a canary against the primary.
    initech = Tenant.objects.get(slug="initech")
    alias_split_set(alias=alias, version=canary, percent=100, tenants=[initech])
    with pytest.raises(ValidationError, match="initech"):
        _start(alias, canary, tenants=[initech])


def test_promoting_for_everyone_clears_the_tenant_splits_of_the_new_primary(versions, world):
    alias, _base, canary = versions
    alias_split_set(alias=alias, version=canary, percent=100, tenants=[world.globex])
    scoped = _start(alias, canary, tenants=[world.acme])
    everyone = _start(alias, canary)
    rollout_act(everyone, action="promote", actor=None)
    alias.refresh_from_db()
    assert alias.version == canary
    # Globex's split named what is everyone's primary now; acme's rollout still holds its own.
    assert _targets(alias) == {"acme": {canary.public_name: 10.0}}
    assert Rollout.objects.get(pk=scoped.pk).state == RolloutState.RUNNING


def test_operators_scope_rollouts_and_splits_to_tenants_through_the_api(staff, versions, world):
    _alias, _base, canary = versions
    created = staff.post(
        "/api/rollouts",
        {"alias": "roll-chat", "canary": "roll@canary", "steps": [5, 100],
         "tenants": ["acme", "globex"]},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["scoped"] is True and sorted(body["tenants"]) == ["acme", "globex"]
    pk = body["id"]
    alone = staff.post(
        f"/api/rollouts/{pk}/rollback", {"tenants": ["acme"], "reason": "acme"}, format="json"
    )
    assert alone.status_code == 200, alone.content
    assert alone.json()["state"] == "running" and alone.json()["tenants"] == ["globex"]
    not_a_rollback = staff.post(f"/api/rollouts/{pk}/pause", {"tenants": ["globex"]}, format="json")
    assert not_a_rollback.status_code == 400 and "tenants" in not_a_rollback.json()
    unknown = staff.post(
        "/api/rollouts",
        {"alias": "roll-chat", "canary": "roll@canary", "tenants": ["nosuch"]},
        format="json",
    )
    assert unknown.status_code == 400 and "nosuch" in unknown.json()["tenants"]
    split = staff.put(
        "/api/aliases/roll-chat/split",
        {"version": "roll@canary", "percent": 100, "tenants": ["initech"], "reason": "first"},
        format="json",
    )
    assert split.status_code == 200, split.content
    assert split.json()["targets"] == {
        "globex": [{"version": canary.public_name, "percent": 5.0}],
        "initech": [{"version": canary.public_name, "percent": 100.0}],
    }  # fmt: skip
    assert split.json()["splits"] == []
    held = staff.put(
        "/api/aliases/roll-chat/split",
        {"version": "roll@canary", "percent": 0, "tenants": ["globex"]},
        format="json",
    )
    assert held.status_code == 400 and "rollout" in held.json()["tenants"][0]
    bad = staff.put(
        "/api/aliases/roll-chat/split",
        {"version": "roll@canary", "percent": 1, "tenants": ["not a slug!"]},
        format="json",
    )
    assert bad.status_code == 400 and "tenants" in bad.json()


def test_the_cli_targets_tenants_and_rolls_one_back(versions, world, capsys):
    alias, _base, canary = versions
    call_command("split", "roll-chat", "roll@canary", "100", "--tenant", "initech")
    call_command(
        "rollout", "start", "roll-chat", "roll@canary", "--steps", "20,100",
        "--tenant", "acme", "--tenant", "globex",
    )  # fmt: skip
    rollout = Rollout.objects.get(alias=alias, state=RolloutState.RUNNING)
    call_command("rollout", "rollback", str(rollout.pk), "--tenant", "acme", "--reason", "acme")
    call_command("rollout", "status", str(rollout.pk))
    call_command("split", "roll-chat")
    out = capsys.readouterr().out
    assert f"rollout {rollout.pk} started: " in out and "for acme, globex" in out
    assert "tenant_rollback at 20%: acme" in out
    assert f"100% of initech's traffic -> {canary.public_name}" in out
    assert f"20% of globex's traffic -> {canary.public_name}" in out
    assert _targets(alias) == {
        "globex": {canary.public_name: 20.0}, "initech": {canary.public_name: 100.0},
    }  # fmt: skip
    with pytest.raises(CommandError, match="no tenants"):
        call_command("split", "roll-chat", "roll@canary", "5", "--tenant", "nosuch")


def test_the_console_targets_a_tenant_and_rolls_one_back(staff_user, versions, world):
    alias, _base, canary = versions
    client = Client()
    client.force_login(staff_user)
    page = "/console/ops/aliases/roll-chat"
    moved = client.post(
        f"{page}/split",
        {"tenant": "initech", "version": "roll@canary", "percent": "100", "reason": "first"},
        follow=True,
    )
    assert "roll@" in moved.content.decode() and "of initech&#x27;s traffic" in (
        moved.content.decode()
    )
    assert _targets(alias) == {"initech": {canary.public_name: 100.0}}
    rollout = _start(alias, canary, tenants=[world.acme, world.globex])
    shown = client.get(page).content.decode()
    assert "Tenant targeting" in shown and 'data-tenant="initech"' in shown
    assert "Roll back this tenant alone" in shown
    back = client.post(
        f"{page}/rollouts/{rollout.pk}/rollback", {"tenant": "acme", "reason": "acme"}, follow=True
    )
    assert "rollback of acme done" in back.content.decode()
    removed = client.post(
        f"{page}/split", {"tenant": "initech", "version": "roll@canary", "percent": "0"}
    )
    assert removed.status_code == 302
    assert _targets(alias) == {"globex": {canary.public_name: 10.0}}
    unknown = client.post(
        f"{page}/split", {"tenant": "nosuch", "version": "roll@canary", "percent": "5"}, follow=True
    )
    assert "no tenant &#x27;nosuch&#x27;" in unknown.content.decode()
    for hostile in ("a\x00b", "x" * 5000):  # a 400 from the form parser, or a message
        back = client.post(
            f"{page}/rollouts/{rollout.pk}/rollback", {"tenant": hostile, "reason": "r"}
        )
        split = client.post(
            f"{page}/split", {"tenant": hostile, "version": "roll@canary", "percent": "5"}
        )
        assert back.status_code in (302, 400) and split.status_code in (302, 400)
    assert _targets(alias) == {"globex": {canary.public_name: 10.0}}
