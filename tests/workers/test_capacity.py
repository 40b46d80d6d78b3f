"""Capacity: measuring a deployment's throughput curve and planning replicas from it."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from models_registry.services import deployment_create
from tests.conftest import DEPLOYMENT
from workers.capacity import (
    Curve,
    CurvePoint,
    Level,
    PlanError,
    Sample,
    level_summarise,
    operating_point,
    percentile,
    pool_plan,
    replicas_needed,
    zone_spread,
)
from workers.models import ThroughputPoint
from workers.selectors import throughput_curve_latest
from workers.services import throughput_record
from workers.traffic_profile import Pool, ProfileError, Slo, Tokens, profile_load, profile_parse

SLO = Slo(ttft_p95=1.0, itl_p95=0.05)
DIGEST = "a" * 64


def _point(concurrency: float, tps: float, ttft: float, itl: float, errors: int = 0) -> CurvePoint:
    return CurvePoint(
        concurrency=concurrency, tokens_per_second=tps, ttft_p95=ttft, itl_p95=itl, errors=errors
    )


CURVE_POINTS = (
    _point(1, 400, 0.05, 0.010),
    _point(4, 1200, 0.20, 0.020),
    _point(16, 3000, 1.80, 0.040),
)


def _curve(points: tuple[CurvePoint, ...] = CURVE_POINTS, **fields: Any) -> Curve:
    values: dict[str, Any] = {
        "run": uuid.uuid4().hex,
        "measured_at": dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC),
        "version_digest": DIGEST,
        "workers": 1,
        "max_num_seqs": 32,
        "prompt_tokens_mean": 600.0,
        "output_tokens_mean": 200.0,
        "points": points,
        **fields,
    }
    return Curve(**values)


def _pool(**fields: Any) -> Pool:
    values: dict[str, Any] = {
        "name": "chat",
        "deployment": "chat",
        "requests_per_second": 10.0,
        "prompt_tokens": Tokens(mean=600, percentiles=((95.0, 1000.0),)),
        "output_tokens": Tokens(mean=200),
        "slo": SLO,
        **fields,
    }
    return Pool(**values)


def _plan(pool: Pool | None = None, curve: Curve | None = None, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "pool": pool or _pool(),
        "curve": curve if curve is not None else _curve(),
        "serving_digest": DIGEST,
        "deployment_slo": Slo(ttft_p95=2.0, itl_p95=0.2),
        "headroom": 0.2,
        "zones": 3,
        "gpus_per_replica": 1,
        "gpus_source": "default",
        **fields,
    }
    return pool_plan(**values)


# --- measuring ------------------------------------------------------------------------------


def test_percentile_is_nearest_rank_like_the_rollout_analysis():
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.95) == 19.0
    assert percentile(values, 0.50) == 10.0
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([], 0.95) is None


def test_a_level_counts_rates_over_its_wall_time_from_successful_requests_only():
    samples = [
        Sample(ok=True, prompt_tokens=100, output_tokens=50, ttft=0.1, itl=0.01),
        Sample(ok=True, prompt_tokens=100, output_tokens=50, ttft=0.3, itl=0.03),
        Sample(ok=False, error="worker_lost"),
    ]
    level = level_summarise(concurrency=2, workers=1, samples=samples, seconds=2.0)
    assert (level.requests, level.errors) == (2, 1)
    assert level.requests_per_second == 1.0
    assert level.output_tokens_per_second == 50.0
    assert level.total_tokens_per_second == 150.0
    assert (level.prompt_tokens_mean, level.output_tokens_mean) == (100.0, 50.0)
    assert (level.ttft_p50, level.ttft_p95) == (0.1, 0.3)
    assert (level.itl_p50, level.itl_p95) == (0.01, 0.03)


def test_a_level_where_everything_failed_has_no_latencies():
    level = level_summarise(
        concurrency=1, workers=1, samples=[Sample(ok=False, error="no_worker")], seconds=1.0
    )
    assert level.requests == 0 and level.errors == 1
    assert level.ttft_p95 is None and level.itl_p95 is None
    assert level.total_tokens_per_second == 0.0


# --- the operating point ----------------------------------------------------------------------


def test_it_takes_the_highest_measured_concurrency_that_meets_the_slo_when_it_is_the_last():
    point = operating_point(points=CURVE_POINTS[:2], slo=SLO)
    assert (point.concurrency, point.tokens_per_second) == (4, 1200)
    assert point.towards is None


def test_it_interpolates_towards_the_next_point_as_far_as_both_p95s_stay_within_the_slo():
    point = operating_point(points=CURVE_POINTS, slo=SLO)
    # TTFT 0.20 → 1.80 crosses 1.0 at half way; ITL 0.02 → 0.04 stays within 0.05 all along.
    assert point.measured.concurrency == 4 and point.towards is not None
    assert point.concurrency == pytest.approx(10.0)
    assert point.tokens_per_second == pytest.approx(2100.0)


def test_the_tighter_latency_bounds_the_interpolation():
    slo = Slo(ttft_p95=1.0, itl_p95=0.025)  # ITL 0.02 → 0.04 crosses 0.025 a quarter of the way
    point = operating_point(points=CURVE_POINTS, slo=slo)
    assert point.concurrency == pytest.approx(7.0)
    assert point.tokens_per_second == pytest.approx(1650.0)


def test_it_does_not_interpolate_past_the_knee_where_tokens_per_second_falls():
    points = (_point(4, 1200, 0.2, 0.02), _point(16, 1100, 1.8, 0.04))
    point = operating_point(points=points, slo=SLO)
    assert (point.concurrency, point.tokens_per_second, point.towards) == (4, 1200, None)


def test_a_point_with_errors_does_not_qualify():
    points = (_point(1, 400, 0.05, 0.01), _point(4, 1200, 0.2, 0.02, errors=1))
    point = operating_point(points=points, slo=SLO)
    assert point.concurrency == 1 and point.towards is None


def test_the_highest_passing_point_wins_even_if_a_lower_one_missed():
    points = (_point(1, 400, 0.05, 0.01), _point(2, 700, 1.5, 0.01), _point(4, 1200, 0.5, 0.02))
    assert operating_point(points=points, slo=SLO).concurrency == 4


def test_no_point_meeting_the_slo_is_an_error_naming_the_closest_measured():
    points = (_point(1, 400, 1.5, 0.01), _point(4, 1200, 3.0, 0.02))
    with pytest.raises(PlanError) as raised:
        operating_point(points=points, slo=SLO)
    message = str(raised.value)
    assert "no measured concurrency meets TTFT p95 ≤ 1,000 ms" in message
    assert "closest was c=1" in message and "TTFT p95 1,500 ms" in message
    assert "misses TTFT" in message


# --- replicas, zones, GPUs ------------------------------------------------------------------


def test_replicas_keep_headroom_free_on_each_replica():
    # 8,000 tok/s of demand on replicas that serve 1,000 but keep 20 % free: 8,000 / 800.
    assert replicas_needed(demand=8000, per_replica=1000, headroom=0.2) == 10
    assert replicas_needed(demand=8001, per_replica=1000, headroom=0.2) == 11
    assert replicas_needed(demand=8000, per_replica=1000, headroom=0.0) == 8


def test_float_noise_does_not_add_a_replica():
    # 0.1 x 3 / 0.1 is 3.0000000000000004 in floating point.
    assert replicas_needed(demand=0.1 * 3, per_replica=0.1, headroom=0.0) == 3


def test_no_demand_needs_no_replica_and_bad_inputs_are_refused():
    assert replicas_needed(demand=0, per_replica=1000, headroom=0.2) == 0
    with pytest.raises(PlanError, match="headroom"):
        replicas_needed(demand=1, per_replica=1000, headroom=1.0)
    with pytest.raises(PlanError, match="no tokens per second"):
        replicas_needed(demand=1, per_replica=0, headroom=0.2)


@pytest.mark.parametrize(
    ("needed", "zones", "spread"),
    [
        (3, 3, (2, 2, 1)),  # ceil(3 x 3 / 2) = 5
        (4, 3, (2, 2, 2)),  # ceil(4 x 3 / 2) = 6
        (10, 3, (5, 5, 5)),  # 15
        (1, 3, (1, 1, 1)),  # ceil(1.5) = 2, then at least one per zone
        (0, 3, (1, 1, 1)),
        (5, 2, (5, 5)),  # two zones: each must carry everything
        (7, 1, (7,)),  # one zone: nothing to survive
        (0, 1, (1,)),
    ],
)
def test_zone_spread_survives_losing_a_zone(needed, zones, spread):
    assert zone_spread(needed=needed, zones=zones) == spread


def test_zone_spread_invariants_hold_for_every_size():
    for zones in range(2, 7):
        for needed in range(0, 60):
            spread = zone_spread(needed=needed, zones=zones)
            assert len(spread) == zones and min(spread) >= 1
            assert max(spread) - min(spread) <= 1
            assert sum(spread) - max(spread) >= needed
            assert sum(spread) == max(math.ceil(needed * zones / (zones - 1)), zones)


def test_zone_spread_refuses_no_zones():
    with pytest.raises(PlanError, match="zones"):
        zone_spread(needed=1, zones=0)


def test_a_pool_plan_multiplies_replicas_by_gpus_per_replica_and_explains_each_step():
    plan = _plan(gpus_per_replica=2, gpus_source="from the profile")
    # demand 10 x (600 + 200) = 8,000 tok/s; point 2,100 tok/s; 8,000 / 1,680 = 4.76 → 5.
    assert plan.needed == 5
    assert plan.per_zone == (3, 3, 2)  # ceil(5 x 3 / 2) = 8
    assert (plan.replicas, plan.gpus) == (8, 16)
    text = "\n".join(plan.explain())
    assert "10 req/s × (600 + 200) tokens = 8,000 tok/s" in text
    assert "ceil(8,000 / (2,100 × (1 − 0.2))) = ceil(4.76) = 5" in text
    assert "ceil(5 × 3 / (3 − 1)) = 8, spread 3 + 3 + 2 (losing a zone of 3 leaves 5 ≥ 5)" in text
    assert "8 replicas × 2 GPU(s) per replica (from the profile) = 16" in text
    assert "interpolated from c=4 towards c=16" in text


def test_a_pool_without_an_slo_is_held_to_its_deployments_objectives():
    plan = _plan(pool=_pool(slo=None), deployment_slo=Slo(ttft_p95=0.1, itl_p95=0.05))
    assert plan.slo == Slo(ttft_p95=0.1, itl_p95=0.05) and plan.slo_source == "deployment"
    assert plan.point.concurrency == pytest.approx(1 + 3 * (0.05 / 0.15))


def test_a_deployment_never_measured_cannot_be_planned():
    with pytest.raises(PlanError, match=r"no measured throughput curve.*capacity_measure"):
        _plan(curve=_curve(points=()))


def test_a_curve_of_another_version_cannot_be_planned():
    with pytest.raises(PlanError, match="measured on version bbbbbbbbbbbb, it now serves aaaa"):
        _plan(curve=_curve(version_digest="b" * 64))


def test_it_warns_when_the_profile_asks_for_other_requests_than_were_measured():
    long_prompts = Tokens(mean=2000, percentiles=((95.0, 8000.0),))
    plan = _plan(pool=_pool(prompt_tokens=long_prompts))
    assert any(
        "mean prompt (2,000 tokens) is far from the measured one" in w for w in plan.warnings
    )
    assert any("prompt p95 (8,000 tokens)" in w for w in plan.warnings)
    assert not _plan().warnings


# --- the profile --------------------------------------------------------------------------


PROFILE: dict[str, Any] = {
    "headroom": 0.25,
    "zones": 2,
    "gpus_per_replica": 2,
    "pools": [
        {
            "name": "chat-eu",
            "deployment": "chat",
            "requests_per_second": 40,
            "prompt_tokens": {"mean": 600, "p50": 400, "p95": 2000},
            "output_tokens": 200,
            "slo": {"ttft_p95_seconds": 1.0, "itl_p95_seconds": 0.05},
        },
        {
            "deployment": "summarise",
            "requests_per_second": 2.5,
            "prompt_tokens": {"mean": 3000},
            "output_tokens": {"mean": 300, "p99": 900},
            "gpus_per_replica": 4,
        },
    ],
}


def test_a_profile_reads_pools_distributions_and_defaults():
    profile = profile_parse(PROFILE)
    assert (profile.headroom, profile.zones) == (0.25, 2)
    chat, summarise = profile.pools
    assert chat.name == "chat-eu" and chat.requests_per_second == 40
    assert chat.prompt_tokens == Tokens(mean=600, percentiles=((50.0, 400.0), (95.0, 2000.0)))
    assert chat.prompt_tokens.p95 == 2000 and chat.output_tokens == Tokens(mean=200)
    assert chat.slo == Slo(ttft_p95=1.0, itl_p95=0.05) and chat.gpus_per_replica == 2
    assert summarise.name == "summarise" and summarise.slo is None
    assert summarise.gpus_per_replica == 4 and summarise.output_tokens.p95 is None


def test_a_profile_file_may_be_yaml_or_json(tmp_path):
    as_json = tmp_path / "peak.json"
    as_json.write_text(json.dumps(PROFILE))
    as_yaml = tmp_path / "peak.yaml"
    as_yaml.write_text(
        "zones: 3\n"
        "pools:\n"
        "  - deployment: chat\n"
        "    requests_per_second: 12\n"
        "    prompt_tokens: {mean: 500, p95: 1500}\n"
        "    output_tokens: {mean: 150, p95: 400}\n"
        "    slo: {ttft_p95_seconds: 0.8, itl_p95_seconds: 0.04}\n"
    )
    assert profile_load(as_json) == profile_parse(PROFILE)
    assert profile_load(as_yaml).pools[0].prompt_tokens.p95 == 1500


def _with_pool(**changes: Any) -> dict[str, Any]:
    pool = {**PROFILE["pools"][0], **changes}
    return {"pools": [{k: v for k, v in pool.items() if v is not None}]}


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({}, "pools: required"),
        ({"pools": []}, "pools: must be a non-empty list"),
        ([], "profile: must be a mapping"),
        ({"pools": [], "zone": 3}, "profile: unknown field 'zone'"),
        ({**PROFILE, "headroom": 1}, "headroom: must be below 1, got 1"),
        ({**PROFILE, "zones": 0}, "zones: must be a whole number ≥ 1, got 0"),
        ({**PROFILE, "gpus_per_replica": 1.5}, "gpus_per_replica: must be a whole number"),
        (_with_pool(requests_per_second=None), "pools[0].requests_per_second: required"),
        (_with_pool(requests_per_second="many"), "pools[0].requests_per_second: must be a number"),
        (_with_pool(requests_per_second=-1), "pools[0].requests_per_second: must be 0 or more"),
        (_with_pool(deployment=None), "pools[0].deployment: required"),
        (_with_pool(rps=3), "pools[0]: unknown field 'rps'"),
        (_with_pool(prompt_tokens={"p95": 9}), "pools[0].prompt_tokens.mean: required"),
        (
            _with_pool(prompt_tokens={"mean": 9, "max": 20}),
            "pools[0].prompt_tokens: unknown field 'max'",
        ),
        (
            _with_pool(output_tokens={"mean": 9, "p50": 20, "p95": 10}),
            "pools[0].output_tokens.p95: 10 is below p50 (20)",
        ),
        (
            _with_pool(slo={"ttft_p95_seconds": 1}),
            "pools[0].slo.itl_p95_seconds: required",
        ),
        (
            _with_pool(slo={"ttft_p95_seconds": 0, "itl_p95_seconds": 0.1}),
            "pools[0].slo.ttft_p95_seconds: must be above 0",
        ),
        (
            _with_pool(slo={"ttft_p95_seconds": True, "itl_p95_seconds": 0.1}),
            "pools[0].slo.ttft_p95_seconds: must be a number, got True",
        ),
        (
            {"pools": [PROFILE["pools"][0], PROFILE["pools"][0]]},
            "pools[1].deployment: 'chat' is already planned by pools[0]",
        ),
    ],
)
def test_a_bad_profile_is_refused_naming_the_field(profile, message):
    with pytest.raises(ProfileError) as raised:
        profile_parse(profile)
    assert message in str(raised.value)


def test_an_unreadable_profile_file_says_what_is_wrong(tmp_path):
    broken = tmp_path / "peak.yaml"
    broken.write_text("pools: [\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        profile_load(broken)
    with pytest.raises(ProfileError, match="No such file"):
        profile_load(tmp_path / "missing.json")


# --- stored curves and the commands ---------------------------------------------------------


def _level(concurrency: int, tps: float, ttft: float, itl: float, *, workers: int = 1) -> Level:
    return Level(
        concurrency=concurrency,
        workers=workers,
        requests=40,
        errors=0,
        seconds=10.0,
        prompt_tokens_mean=600.0,
        output_tokens_mean=200.0,
        requests_per_second=tps / 800,
        output_tokens_per_second=tps / 4,
        total_tokens_per_second=tps,
        ttft_p50=ttft / 2,
        ttft_p95=ttft,
        itl_p50=itl / 2,
        itl_p95=itl,
    )


@pytest.mark.django_db
def test_a_curve_is_read_per_replica_from_the_latest_run(world):
    deployment = deployment_create(name="curve-chat", version=world.version)
    earlier = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    throughput_record(
        deployment=deployment, run=uuid.uuid4(), levels=[_level(1, 999, 0.1, 0.01)],
        measured_at=earlier,
    )  # fmt: skip
    run = uuid.uuid4()
    throughput_record(
        deployment=deployment,
        run=run,
        levels=[_level(8, 2400, 0.3, 0.02, workers=2), _level(2, 800, 0.1, 0.01, workers=2)],
    )
    curve = throughput_curve_latest(deployment=deployment)
    assert curve is not None and curve.run == str(run)
    assert curve.version_digest == world.version.digest and curve.workers == 2
    assert curve.max_num_seqs == deployment.max_num_seqs
    assert [(p.concurrency, p.tokens_per_second) for p in curve.points] == [(1, 400), (4, 1200)]
    assert (
        throughput_curve_latest(deployment=deployment_create(name="new", version=world.version))
        is None
    )


@pytest.mark.django_db
def test_a_run_is_stored_whole_or_not_at_all(world):
    deployment = deployment_create(name="whole-chat", version=world.version)
    with pytest.raises(ValidationError, match="measured once per run"):
        throughput_record(
            deployment=deployment,
            run=uuid.uuid4(),
            levels=[_level(4, 1200, 0.2, 0.02), _level(4, 1300, 0.2, 0.02)],
        )
    with pytest.raises(ValidationError, match="at least one level"):
        throughput_record(deployment=deployment, run=uuid.uuid4(), levels=[])
    assert not ThroughputPoint.objects.filter(deployment=deployment).exists()


def _write_profile(tmp_path: Path, pools: list[dict[str, Any]], **top: Any) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"pools": pools, **top}))
    return path


def _traffic(deployment: str, **fields: Any) -> dict[str, Any]:
    return {
        "deployment": deployment,
        "requests_per_second": 10,
        "prompt_tokens": {"mean": 600, "p95": 1000},
        "output_tokens": {"mean": 200, "p95": 400},
        "slo": {"ttft_p95_seconds": 1.0, "itl_p95_seconds": 0.05},
        **fields,
    }


@pytest.mark.django_db
def test_capacity_plan_prints_each_pools_formula_and_a_total(world, tmp_path):
    chat = deployment_create(name="plan-chat", version=world.version)
    batch = deployment_create(name="plan-batch", version=world.version)
    for deployment in (chat, batch):
        throughput_record(
            deployment=deployment,
            run=uuid.uuid4(),
            levels=[
                _level(1, 400, 0.05, 0.01),
                _level(4, 1200, 0.2, 0.02),
                _level(16, 3000, 1.8, 0.04),
            ],
        )
    profile = _write_profile(
        tmp_path,
        [_traffic("plan-chat"), _traffic("plan-batch", requests_per_second=1)],
        headroom=0.5,
    )
    out = io.StringIO()
    call_command("capacity_plan", "--profile", str(profile), "--headroom", "0.2", stdout=out)
    text = out.getvalue()
    # plan-chat: 8,000 / (2,100 x 0.8) → 5 → 8 over 3 zones; plan-batch: 800 / 1,680 → 1 → 3.
    assert "ceil(8,000 / (2,100 × (1 − 0.2))) = ceil(4.76) = 5" in text
    assert "ceil(800 / (2,100 × (1 − 0.2))) = ceil(0.48) = 1" in text
    assert "total: 11 replicas, 11 GPUs over 3 zone(s), headroom 0.2, for 2 of 2 pools" in text


@pytest.mark.django_db
def test_capacity_plan_fails_naming_each_pool_it_cannot_plan(world, tmp_path):
    deployment_create(name="never-measured", version=world.version)
    strict = deployment_create(name="too-slow", version=world.version)
    throughput_record(deployment=strict, run=uuid.uuid4(), levels=[_level(1, 400, 3.0, 0.01)])
    profile = _write_profile(
        tmp_path, [_traffic("never-measured"), _traffic("too-slow"), _traffic("nowhere")]
    )
    with pytest.raises(CommandError) as raised:
        call_command("capacity_plan", "--profile", str(profile), stdout=io.StringIO())
    message = str(raised.value)
    assert "pool never-measured: deployment never-measured has no measured throughput" in message
    assert "pool too-slow: no measured concurrency meets" in message
    assert "closest was c=1: 400 tok/s, TTFT p95 3,000 ms" in message
    assert "pools[2].deployment: no deployment 'nowhere'" in message


@pytest.mark.django_db
def test_capacity_plan_refuses_a_bad_profile_naming_the_file_and_field(world, tmp_path):
    profile = _write_profile(tmp_path, [_traffic("x", requests_per_second="lots")])
    with pytest.raises(CommandError, match=r"profile.json: pools\[0\].requests_per_second"):
        call_command("capacity_plan", "--profile", str(profile))


MEASURE = ["--deployment", DEPLOYMENT, "--tenant", "acme"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--deployment", "nowhere", "--tenant", "acme"], "no deployment 'nowhere'"),
        (["--deployment", DEPLOYMENT, "--tenant", "nobody"], "no tenant 'nobody'"),
        ([*MEASURE, "--concurrency", "1,x"], "--concurrency: comma-separated numbers"),
        ([*MEASURE, "--concurrency", "4", "--requests", "2"], "--requests 2 is below the highest"),
        ([*MEASURE, "--prompt-tokens", "4000"], "exceeds tiny-chat's context of 2048 tokens"),
    ],
)
def test_capacity_measure_refuses_what_it_cannot_measure(world, arguments, message):
    with pytest.raises(CommandError, match=message):
        call_command("capacity_measure", *arguments, stdout=io.StringIO())


# --- end to end: the session's vLLM worker ------------------------------------------------------


@pytest.fixture(scope="module")
def ops_tenant(world: Any, django_db_blocker: Any) -> Any:
    from tenants.services import tenant_create

    with django_db_blocker.unblock():
        return tenant_create(slug="capacity-ops")


@pytest.mark.django_db
def test_capacity_measure_drives_the_worker_and_stores_a_point_per_level(
    stack, world, ops_tenant, tmp_path
):
    out = io.StringIO()
    call_command(
        "capacity_measure",
        "--deployment", DEPLOYMENT, "--tenant", ops_tenant.slug, "--concurrency", "1,2",
        "--requests", "4", "--prompt-tokens", "16", "--max-tokens", "8",
        stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "[1/2] concurrency 1: 4 requests on 1 worker(s)" in text
    assert "[2/2] concurrency 2: done in" in text
    points = list(
        ThroughputPoint.objects.filter(deployment=world.deployment).order_by("concurrency")
    )
    assert [p.concurrency for p in points] == [1, 2]
    assert len({p.run for p in points}) == 1
    for point in points:
        assert (point.requests, point.errors, point.workers) == (4, 0, 1)
        assert point.prompt_tokens_mean == 16 and point.output_tokens_mean == 8
        assert point.version_digest == world.version.digest
        assert point.total_tokens_per_second > point.output_tokens_per_second > 0
        assert point.ttft_p50_seconds is not None and point.ttft_p95_seconds is not None
        assert point.itl_p50_seconds is not None and point.itl_p95_seconds is not None
        assert 0 < point.ttft_p50_seconds <= point.ttft_p95_seconds < 60
        assert 0 <= point.itl_p50_seconds <= point.itl_p95_seconds < 10
    assert "| 2 | 1 | 4 | 0 |" in text

    profile = _write_profile(
        tmp_path,
        [
            _traffic(
                DEPLOYMENT,
                prompt_tokens=16,
                output_tokens=8,
                slo={"ttft_p95_seconds": 60, "itl_p95_seconds": 10},
            )
        ],
    )
    plan = io.StringIO()
    call_command("capacity_plan", "--profile", str(profile), "--zones", "2", stdout=plan)
    assert f"pool {DEPLOYMENT} (deployment {DEPLOYMENT})" in plan.getvalue()
    assert "c=2 per replica" in plan.getvalue()
    assert "total: " in plan.getvalue()
