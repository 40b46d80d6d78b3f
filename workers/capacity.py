"""Capacity arithmetic: summarise a measured load level, plan replicas for a traffic profile.

Pure: no database, no Redis. `capacity_measure` turns what its load generator saw into
`Level`s; `capacity_plan` reads a `Profile` (workers.traffic_profile) and each deployment's
latest `Curve` and asks `pool_plan` how many replicas and GPUs each pool needs.

The rule, per pool:

1. Operating point. Per replica (a curve measured on W workers is divided by W), take the
   highest measured concurrency whose TTFT p95 and ITL p95 meet the SLO and which had no
   errors. When the next measured concurrency misses the SLO, move towards it as far as both
   latencies, interpolated linearly in concurrency, still meet the SLO, and take the tokens/s
   interpolated the same way (only while tokens/s rises between the two points). Latency
   grows convexly and throughput concavely with concurrency, so both chords err on the safe
   side. Nothing is extrapolated beyond the highest measured concurrency.
2. Replicas needed = ceil(demand / (tokens/s per replica x (1 - headroom))), where demand =
   requests/s x (mean prompt + mean output tokens) and tokens/s per replica counts prompt and
   output tokens at the operating point.
3. Zones: to survive losing any one of Z zones, total = ceil(needed x Z / (Z - 1)), spread
   evenly (zone sizes differ by at most one), at least one per zone. Losing the largest zone
   leaves floor(total x (Z - 1) / Z) ≥ needed. With Z = 1 there is no zone redundancy.
4. GPUs = total replicas x GPUs per replica.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from workers.traffic_profile import Pool, Slo, milliseconds

# Measured and planned token mixes further apart than this make tokens/s incomparable.
MIX_TOLERANCE = 2.0
_EPSILON = 1e-9


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the nearest-rank q-quantile (0 < q ≤ 1) of values, or None when there are none.

    The rollout analysis (billing.selectors) uses the same rule, so a p95 here and there agree.
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One request as the load generator saw it."""

    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None  # seconds from enqueue to the first token
    itl: float | None = None  # seconds: (last token - first token) / (output tokens - 1)
    error: str = ""  # the error code, for a failed request


@dataclass(frozen=True)
class Level:
    """What one concurrency level of a measurement run gave, for the whole deployment."""

    concurrency: int
    workers: int
    requests: int  # finished without error
    errors: int
    seconds: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    requests_per_second: float
    output_tokens_per_second: float
    total_tokens_per_second: float
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None


def level_summarise(
    *, concurrency: int, workers: int, samples: Sequence[Sample], seconds: float
) -> Level:
    """Summarise one level: rates over its wall time, from successful requests only.

    ITL is each request's mean gap between tokens, as the rollout analysis computes it.
    """
    ok = [s for s in samples if s.ok]
    prompt = sum(s.prompt_tokens for s in ok)
    output = sum(s.output_tokens for s in ok)
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    itls = [s.itl for s in ok if s.itl is not None]
    wall = max(seconds, _EPSILON)
    return Level(
        concurrency=concurrency,
        workers=workers,
        requests=len(ok),
        errors=len(samples) - len(ok),
        seconds=seconds,
        prompt_tokens_mean=prompt / len(ok) if ok else 0.0,
        output_tokens_mean=output / len(ok) if ok else 0.0,
        requests_per_second=len(ok) / wall,
        output_tokens_per_second=output / wall,
        total_tokens_per_second=(prompt + output) / wall,
        ttft_p50=percentile(ttfts, 0.50),
        ttft_p95=percentile(ttfts, 0.95),
        itl_p50=percentile(itls, 0.50),
        itl_p95=percentile(itls, 0.95),
    )


# --- planning ---------------------------------------------------------------------------


class PlanError(ValueError):
    """A pool that cannot be planned from what was measured; the message says why."""


@dataclass(frozen=True)
class CurvePoint:
    """One measured concurrency level, per replica."""

    concurrency: float
    tokens_per_second: float  # prompt + output tokens
    ttft_p95: float | None
    itl_p95: float | None
    errors: int = 0

    def meets(self, slo: Slo) -> bool:
        return self.shortfall(slo) <= 1.0 and self.errors == 0

    def shortfall(self, slo: Slo) -> float:
        """The worse of measured / objective for the two latencies (≤ 1 meets the SLO)."""
        if self.ttft_p95 is None or self.itl_p95 is None:
            return math.inf
        return max(self.ttft_p95 / slo.ttft_p95, self.itl_p95 / slo.itl_p95)

    def describe(self, slo: Slo) -> str:
        verdict = "meets the SLO" if self.meets(slo) else self._misses(slo)
        return (
            f"c={self.concurrency:g}: {self.tokens_per_second:,.0f} tok/s, "
            f"TTFT p95 {milliseconds(self.ttft_p95)}, "
            f"ITL p95 {milliseconds(self.itl_p95)} ({verdict})"
        )

    def _misses(self, slo: Slo) -> str:
        missed = [
            name
            for name, value, limit in (
                ("TTFT", self.ttft_p95, slo.ttft_p95),
                ("ITL", self.itl_p95, slo.itl_p95),
            )
            if value is None or value > limit
        ]
        parts = ["misses " + " and ".join(missed)] if missed else []
        if self.errors:
            parts.append(f"{self.errors} error(s)")
        return ", ".join(parts)


@dataclass(frozen=True)
class Curve:
    """A deployment's latest measurement run, per replica."""

    run: str
    measured_at: dt.datetime
    version_digest: str
    workers: int  # live workers while it was measured (rates above are divided by them)
    max_num_seqs: int
    prompt_tokens_mean: float
    output_tokens_mean: float
    points: tuple[CurvePoint, ...]


@dataclass(frozen=True)
class OperatingPoint:
    """Where each replica runs: its concurrency and tokens/s within the SLO."""

    concurrency: float
    tokens_per_second: float
    measured: CurvePoint  # the highest measured concurrency that meets the SLO
    towards: CurvePoint | None = None  # the next one, when interpolated towards it


def operating_point(*, points: Sequence[CurvePoint], slo: Slo) -> OperatingPoint:
    """Return the highest concurrency per replica that meets the SLO (see the module's rule).

    Raises PlanError naming the closest measured point when none meets it.
    """
    if not points:
        raise PlanError("the measured curve has no points")
    ordered = sorted(points, key=lambda p: p.concurrency)
    passing = [i for i, p in enumerate(ordered) if p.meets(slo)]
    if not passing:
        best = min(ordered, key=lambda p: (p.shortfall(slo), p.errors))
        raise PlanError(
            f"no measured concurrency meets {slo.describe()}; the closest was "
            f"{best.describe(slo)}. Lower the concurrency measured (capacity_measure "
            "--concurrency 1,2,...), use a faster version or hardware, or relax the SLO"
        )
    index = passing[-1]
    base = ordered[index]
    plain = OperatingPoint(
        concurrency=base.concurrency, tokens_per_second=base.tokens_per_second, measured=base
    )
    if index + 1 == len(ordered):
        return plain
    above = ordered[index + 1]
    if above.errors or above.tokens_per_second <= base.tokens_per_second:
        return plain
    assert base.ttft_p95 is not None and base.itl_p95 is not None  # it meets the SLO
    if above.ttft_p95 is None or above.itl_p95 is None:
        return plain
    share = min(
        _within(base.ttft_p95, above.ttft_p95, slo.ttft_p95),
        _within(base.itl_p95, above.itl_p95, slo.itl_p95),
    )
    if share <= 0:
        return plain
    return OperatingPoint(
        concurrency=base.concurrency + share * (above.concurrency - base.concurrency),
        tokens_per_second=base.tokens_per_second
        + share * (above.tokens_per_second - base.tokens_per_second),
        measured=base,
        towards=above,
    )


def _within(low: float, high: float, limit: float) -> float:
    """How far (0-1) from low towards high a linearly rising latency stays within limit."""
    if high <= limit:
        return 1.0
    return (limit - low) / (high - low)  # low ≤ limit < high


def replicas_needed(*, demand: float, per_replica: float, headroom: float) -> int:
    """Return ceil(demand / (per_replica x (1 - headroom))), 0 for no demand."""
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom must be in [0, 1), got {headroom:g}")
    if per_replica <= 0:
        raise PlanError("the operating point serves no tokens per second")
    if demand <= 0:
        return 0
    # Less a hair: 17.000000000000004 replicas of float arithmetic are 17.
    return math.ceil(demand / (per_replica * (1 - headroom)) - _EPSILON)


def zone_spread(*, needed: int, zones: int) -> tuple[int, ...]:
    """Return replicas per zone so that losing any one zone still leaves `needed`.

    total = ceil(needed x Z / (Z - 1)), at least one per zone, zone sizes differing by at
    most one (largest first). One zone gets `needed` (at least one): nothing to survive.
    """
    if zones < 1:
        raise PlanError(f"zones must be 1 or more, got {zones}")
    total = needed if zones == 1 else -(-needed * zones // (zones - 1))
    total = max(total, zones)
    size, larger = divmod(total, zones)
    return tuple(size + 1 if zone < larger else size for zone in range(zones))


@dataclass(frozen=True)
class PoolPlan:
    pool: Pool
    slo: Slo
    slo_source: str  # "profile" or "deployment"
    curve: Curve
    point: OperatingPoint
    headroom: float
    needed: int
    per_zone: tuple[int, ...]
    gpus_per_replica: int
    gpus_source: str  # where gpus_per_replica came from, for the explanation
    warnings: tuple[str, ...] = ()

    @property
    def replicas(self) -> int:
        return sum(self.per_zone)

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    def explain(self) -> list[str]:
        """Return the plan as lines: inputs, each formula with its numbers, the result."""
        pool, curve, point = self.pool, self.curve, self.point
        demand = pool.demand_tokens_per_second
        lines = [
            f"pool {pool.name} (deployment {pool.deployment})",
            f"  traffic   {pool.requests_per_second:g} req/s at peak; prompt tokens "
            f"{pool.prompt_tokens.describe()}; output tokens {pool.output_tokens.describe()}",
            f"  SLO       {self.slo.describe()} (from the {self.slo_source})",
            f"  curve     run {curve.run[:8]} of {curve.measured_at:%Y-%m-%d %H:%M} UTC on "
            f"{curve.version_digest[:12]}: {curve.workers} worker(s), max_num_seqs "
            f"{curve.max_num_seqs},",
            f"            prompt {curve.prompt_tokens_mean:,.0f} + output "
            f"{curve.output_tokens_mean:,.0f} tokens per request; per replica:",
        ]
        lines += [f"            {p.describe(self.slo)}" for p in curve.points]
        if point.towards is None:
            how = "the highest measured concurrency that meets the SLO"
        else:
            how = (
                f"interpolated from c={point.measured.concurrency:g} towards "
                f"c={point.towards.concurrency:g} while both p95s stay within the SLO"
            )
        lines.append(
            f"  point     c={point.concurrency:.3g} per replica, "
            f"{point.tokens_per_second:,.0f} tok/s ({how})"
        )
        lines.append(
            f"  demand    {pool.requests_per_second:g} req/s × ({pool.prompt_tokens.mean:,.0f} + "
            f"{pool.output_tokens.mean:,.0f}) tokens = {demand:,.0f} tok/s"
        )
        usable = point.tokens_per_second * (1 - self.headroom)
        ratio = demand / usable
        lines.append(
            f"  replicas  ceil({demand:,.0f} / ({point.tokens_per_second:,.0f} × "
            f"(1 − {self.headroom:g}))) = ceil({ratio:,.2f}) = {self.needed}"
        )
        zones = len(self.per_zone)
        spread = " + ".join(str(n) for n in self.per_zone)
        if zones == 1:
            lines.append(f"  zones     1 zone: no zone redundancy → {self.replicas}")
        else:
            raw = -(-self.needed * zones // (zones - 1))
            floor = f", at least one per zone → {self.replicas}" if raw < zones else ""
            survivors = self.replicas - max(self.per_zone)
            lines.append(
                f"  zones     ceil({self.needed} × {zones} / ({zones} − 1)) = {raw}{floor}, "
                f"spread {spread} (losing a zone of {max(self.per_zone)} leaves "
                f"{survivors} ≥ {self.needed})"
            )
        lines.append(
            f"  GPUs      {self.replicas} replicas × {self.gpus_per_replica} GPU(s) per replica "
            f"({self.gpus_source}) = {self.gpus}"
        )
        lines += [f"  warning   {w}" for w in self.warnings]
        return lines


def pool_plan(
    *,
    pool: Pool,
    curve: Curve | None,
    serving_digest: str,
    deployment_slo: Slo,
    headroom: float,
    zones: int,
    gpus_per_replica: int,
    gpus_source: str,
) -> PoolPlan:
    """Plan one pool's replicas and GPUs from its deployment's latest curve.

    The pool's SLO is the profile's, else the deployment's own objectives. Raises PlanError
    when there is no curve, when it was measured on another version than the deployment
    serves now, or when no measured point meets the SLO.
    """
    if curve is None or not curve.points:
        raise PlanError(
            f"deployment {pool.deployment} has no measured throughput curve; measure it first: "
            f"manage.py capacity_measure --deployment {pool.deployment} --tenant SLUG "
            f"--prompt-tokens {pool.prompt_tokens.mean:.0f} "
            f"--max-tokens {max(pool.output_tokens.mean, 1):.0f}"
        )
    if curve.version_digest != serving_digest:
        raise PlanError(
            f"deployment {pool.deployment}'s latest curve (run {curve.run[:8]}) was measured "
            f"on version {curve.version_digest[:12]}, it now serves {serving_digest[:12]}; "
            "measure it again"
        )
    slo = pool.slo or deployment_slo
    point = operating_point(points=curve.points, slo=slo)
    needed = replicas_needed(
        demand=pool.demand_tokens_per_second,
        per_replica=point.tokens_per_second,
        headroom=headroom,
    )
    return PoolPlan(
        pool=pool,
        slo=slo,
        slo_source="profile" if pool.slo is not None else "deployment",
        curve=curve,
        point=point,
        headroom=headroom,
        needed=needed,
        per_zone=zone_spread(needed=needed, zones=zones),
        gpus_per_replica=gpus_per_replica,
        gpus_source=gpus_source,
        warnings=tuple(_mix_warnings(pool, curve)),
    )


def _mix_warnings(pool: Pool, curve: Curve) -> list[str]:
    """Say where the profile's requests differ from the measured ones enough to matter."""
    warnings = []
    for kind, planned, measured in (
        ("prompt", pool.prompt_tokens.mean, curve.prompt_tokens_mean),
        ("output", pool.output_tokens.mean, curve.output_tokens_mean),
    ):
        if _apart(planned, measured):
            warnings.append(
                f"the profile's mean {kind} ({planned:,.0f} tokens) is far from the measured "
                f"one ({measured:,.0f}): tokens/s is not comparable across mixes; measure with "
                f"--prompt-tokens {pool.prompt_tokens.mean:.0f} "
                f"--max-tokens {max(pool.output_tokens.mean, 1):.0f}"
            )
    p95 = pool.prompt_tokens.p95
    if p95 is not None and p95 > MIX_TOLERANCE * curve.prompt_tokens_mean:
        warnings.append(
            f"prompt p95 ({p95:,.0f} tokens) is over {MIX_TOLERANCE:g}× the measured prompt "
            f"({curve.prompt_tokens_mean:,.0f}): long prompts' TTFT will exceed the measured "
            f"p95; measure with --prompt-tokens {p95:.0f} to plan for them"
        )
    return warnings


def _apart(planned: float, measured: float) -> bool:
    if planned <= 0 or measured <= 0:
        return planned != measured
    return max(planned / measured, measured / planned) > MIX_TOLERANCE
