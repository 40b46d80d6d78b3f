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


def test_a_slower_canary_is_rolled_back_after_consecutive_breaches(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, breach_checks=2)
    start = rollout.step_started_at
    actions = []
    for minute in (1, 2):
        now = start + dt.timedelta(minutes=minute)
        _served(world, base, n=20, at=now - dt.timedelta(seconds=10), ttft_ms=20)
        _served(world, canary, n=20, at=now - dt.timedelta(seconds=10), ttft_ms=400)
        verdict = rollout_analyze(rollout, now=now)
        assert verdict is not None
        actions.append(verdict.action)
    assert actions == ["hold", "rollback"]
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert not AliasSplit.objects.filter(alias=alias).exists()  # weights reverted
    assert Alias.objects.get(pk=alias.pk).version == base
    # The canary drains; the prior version stays warm.
    assert Deployment.objects.get(name="roll-canary").state == DeploymentState.DRAINING
    assert Deployment.objects.get(name="roll-base").state == DeploymentState.READY
    evidence = rollout.decisions.get(action="rollback").evidence
    assert evidence["breached"] == ["ttft_p95_ratio"]
    ttft = evidence["checks"]["recent"]["ttft_p95_ratio"]
    assert ttft["canary"] > 10 * ttft["baseline"]


def test_a_failing_canary_breaches_the_error_rate(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, breach_checks=1)
    now = rollout.step_started_at + dt.timedelta(minutes=1)
    _served(world, base, n=40, at=now - dt.timedelta(seconds=10))
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=10))
    _served(world, canary, n=10, at=now - dt.timedelta(seconds=10), status="error")
    verdict = rollout_analyze(rollout, now=now)
    assert verdict is not None and verdict.action == "rollback"
    assert "error_rate_points" in verdict.reason


def test_a_canary_that_fails_outright_is_rolled_back_within_seconds(versions, world):
    """Not after two 30-second analyses: the fail-fast check sees the first dozen failures."""
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


def test_a_short_blip_does_not_roll_back(versions, world):
    """A slow burst that has passed leaves the recent window healthy: no breach counts."""
    alias, base, canary = versions
    rollout = _start(alias, canary, short_window_seconds=60, breach_checks=2, min_samples=40)
    start = rollout.step_started_at
    # Minute 1: a blip, the canary is slow for a moment.
    _served(world, base, n=20, at=start + dt.timedelta(seconds=50))
    _served(world, canary, n=8, at=start + dt.timedelta(seconds=50), ttft_ms=900)
    _served(world, canary, n=12, at=start + dt.timedelta(seconds=55))
    # Minutes 2 to 4: healthy again.
    for minute in (2, 3, 4):
        at = start + dt.timedelta(minutes=minute, seconds=-20)
        _served(world, base, n=20, at=at)
        _served(world, canary, n=20, at=at)
        verdict = rollout_analyze(rollout, now=start + dt.timedelta(minutes=minute))
        assert verdict is not None
        assert verdict.action != "rollback", verdict.reason
        assert not verdict.breached
    rollout.refresh_from_db()
    assert rollout.state in (RolloutState.RUNNING, RolloutState.PROMOTED)
    assert not rollout.decisions.filter(action="hold").exists()


def test_one_breached_analysis_then_recovery_resets_the_count(versions, world):
    alias, base, canary = versions
    rollout = _start(alias, canary, short_window_seconds=60, breach_checks=2, min_samples=40)
    start = rollout.step_started_at
    _served(world, base, n=20, at=start + dt.timedelta(seconds=50))
    _served(world, canary, n=20, at=start + dt.timedelta(seconds=50), ttft_ms=900)
    first = rollout_analyze(rollout, now=start + dt.timedelta(minutes=1))
    assert first is not None and first.action == "hold" and first.breached
    for minute in (2, 3, 4):
        at = start + dt.timedelta(minutes=minute, seconds=-20)
        _served(world, base, n=40, at=at)
        _served(world, canary, n=40, at=at)
        verdict = rollout_analyze(rollout, now=start + dt.timedelta(minutes=minute))
        if verdict is None:  # promoted: nothing left to analyse
            break
        assert verdict.action != "rollback", verdict.reason
    rollout.refresh_from_db()
    assert rollout.state != RolloutState.ROLLED_BACK and rollout.breaches == 0
    # The breach is on record with the numbers it saw.
    hold = rollout.decisions.filter(action="hold").first()
    assert hold is not None and "1 of 2" in hold.reason
    assert hold.evidence["checks"]["step"]["ttft_p95_ratio"]["breached"]


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
    _served(world, base, n=30, at=now - dt.timedelta(seconds=10))
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=10), tenant=world.globex,
            ttft_ms=900)  # fmt: skip
    _served(world, canary, n=30, at=now - dt.timedelta(seconds=10))
    verdict = rollout_verdict(rollout, now=now)
    assert verdict.action == "advance" and not verdict.breached, verdict.reason
    assert verdict.evidence["tenants"] == ["acme"]
    assert verdict.evidence["step"]["canary"]["requests"] == 30
    # Acme's own slow requests do breach it.
    _served(world, canary, n=60, at=now - dt.timedelta(seconds=5), ttft_ms=900)
    analysed = rollout_analyze(rollout, now=now + dt.timedelta(seconds=1))
    assert analysed is not None, "not running"
    assert analysed.action == "rollback", analysed.reason
    assert "ttft_p95_ratio" in analysed.reason


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
