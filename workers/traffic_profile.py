"""The traffic profile a capacity plan is made for: each pool's peak traffic and objectives.

Pure: no database, no Redis. `profile_load` reads a YAML or JSON file, `profile_parse` the decoded
document; a problem raises ProfileError naming the field. `workers.capacity` plans from it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ProfileError(ValueError):
    """A traffic profile that cannot be read; the message names the field."""


@dataclass(frozen=True)
class Tokens:
    """A distribution of tokens per request: its mean and whichever percentiles were given."""

    mean: float
    percentiles: tuple[tuple[float, float], ...] = ()  # (95.0, 2000.0): p95 is 2,000

    @property
    def p95(self) -> float | None:
        return dict(self.percentiles).get(95.0)

    def describe(self) -> str:
        given = [f"p{q:g} {v:,.0f}" for q, v in self.percentiles]
        return ", ".join([f"mean {self.mean:,.0f}", *given])


@dataclass(frozen=True)
class Slo:
    ttft_p95: float  # seconds
    itl_p95: float  # seconds

    def describe(self) -> str:
        return f"TTFT p95 ≤ {milliseconds(self.ttft_p95)}, ITL p95 ≤ {milliseconds(self.itl_p95)}"


@dataclass(frozen=True)
class Pool:
    """The peak traffic one deployment must serve."""

    name: str
    deployment: str
    requests_per_second: float
    prompt_tokens: Tokens
    output_tokens: Tokens
    slo: Slo | None = None  # None: the deployment's own objectives
    gpus_per_replica: int | None = None

    @property
    def demand_tokens_per_second(self) -> float:
        return self.requests_per_second * (self.prompt_tokens.mean + self.output_tokens.mean)


@dataclass(frozen=True)
class Profile:
    pools: tuple[Pool, ...]
    headroom: float | None = None
    zones: int | None = None


_TOP_FIELDS = ("pools", "headroom", "zones", "gpus_per_replica")
_POOL_FIELDS = (
    "name",
    "deployment",
    "requests_per_second",
    "prompt_tokens",
    "output_tokens",
    "slo",
    "gpus_per_replica",
)
_SLO_FIELDS = ("ttft_p95_seconds", "itl_p95_seconds")
_PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


def profile_load(path: Path) -> Profile:
    """Read a traffic profile from a YAML (.yaml, .yml) or JSON file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: {exc.strerror}") from exc
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON: {exc}") from exc
    try:
        return profile_parse(data)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def profile_parse(data: object) -> Profile:
    """Return the profile a decoded YAML or JSON document describes.

    Raises ProfileError naming the field (`pools[1].slo.itl_p95_seconds`) on the first problem.
    """
    top = _mapping(data, "profile", _TOP_FIELDS)
    headroom = None
    if top.get("headroom") is not None:
        headroom = _number(top["headroom"], "headroom", below=1.0)
    zones = None
    if top.get("zones") is not None:
        zones = _integer(top["zones"], "zones", minimum=1)
    default_gpus = None
    if top.get("gpus_per_replica") is not None:
        default_gpus = _integer(top["gpus_per_replica"], "gpus_per_replica", minimum=1)
    raw_pools = _required(top, "pools", "profile")
    if not isinstance(raw_pools, list) or not raw_pools:
        raise ProfileError(f"pools: must be a non-empty list of pools, got {_show(raw_pools)}")
    pools: list[Pool] = []
    seen: dict[str, str] = {}
    for index, raw in enumerate(raw_pools):
        where = f"pools[{index}]"
        pool = _pool(raw, where, default_gpus)
        if pool.deployment in seen:
            raise ProfileError(
                f"{where}.deployment: {pool.deployment!r} is already planned by "
                f"{seen[pool.deployment]}; one pool per deployment (add their traffic together)"
            )
        seen[pool.deployment] = where
        pools.append(pool)
    return Profile(pools=tuple(pools), headroom=headroom, zones=zones)


def _pool(raw: object, where: str, default_gpus: int | None) -> Pool:
    fields = _mapping(raw, where, _POOL_FIELDS)
    deployment = _required(fields, "deployment", where)
    if not isinstance(deployment, str) or not deployment:
        raise ProfileError(
            f"{where}.deployment: must be a deployment name, got {_show(deployment)}"
        )
    name = fields.get("name", deployment)
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{where}.name: must be a non-empty string, got {_show(name)}")
    slo = None
    if fields.get("slo") is not None:
        slo = _slo(fields["slo"], f"{where}.slo")
    gpus = default_gpus
    if fields.get("gpus_per_replica") is not None:
        gpus = _integer(fields["gpus_per_replica"], f"{where}.gpus_per_replica", minimum=1)
    return Pool(
        name=name,
        deployment=deployment,
        requests_per_second=_number(
            _required(fields, "requests_per_second", where), f"{where}.requests_per_second"
        ),
        prompt_tokens=_tokens(_required(fields, "prompt_tokens", where), f"{where}.prompt_tokens"),
        output_tokens=_tokens(_required(fields, "output_tokens", where), f"{where}.output_tokens"),
        slo=slo,
        gpus_per_replica=gpus,
    )


def _slo(raw: object, where: str) -> Slo:
    fields = _mapping(raw, where, _SLO_FIELDS)
    return Slo(
        ttft_p95=_number(
            _required(fields, "ttft_p95_seconds", where),
            f"{where}.ttft_p95_seconds",
            positive=True,
        ),
        itl_p95=_number(
            _required(fields, "itl_p95_seconds", where),
            f"{where}.itl_p95_seconds",
            positive=True,
        ),
    )


def _tokens(raw: object, where: str) -> Tokens:
    """A bare number (every request that long) or {mean: …, p50: …, p95: …, …}."""
    if not isinstance(raw, Mapping):
        return Tokens(mean=_number(raw, where))
    percentiles: list[tuple[float, float]] = []
    for key, value in raw.items():
        if key == "mean":
            continue
        match = _PERCENTILE.match(str(key))
        if match is None or not 0 < float(match.group(1)) < 100:
            raise ProfileError(
                f"{where}: unknown field {key!r} (expected mean and percentiles such as p50, p95)"
            )
        percentiles.append((float(match.group(1)), _number(value, f"{where}.{key}")))
    mean = _number(_required(raw, "mean", where), f"{where}.mean")
    percentiles.sort()
    for (lower_q, lower), (upper_q, upper) in itertools.pairwise(percentiles):
        if upper < lower:
            raise ProfileError(
                f"{where}.p{upper_q:g}: {upper:g} is below p{lower_q:g} ({lower:g}); "
                "percentiles cannot decrease"
            )
    return Tokens(mean=mean, percentiles=tuple(percentiles))


def _mapping(value: object, where: str, known: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where}: must be a mapping, got {_show(value)}")
    for key in value:
        if key not in known:
            raise ProfileError(
                f"{where}: unknown field {key!r} (expected one of: {', '.join(known)})"
            )
    return value


def _required(fields: Mapping[str, Any], key: str, where: str) -> Any:
    if fields.get(key) is None:
        prefix = "" if where == "profile" else f"{where}."
        raise ProfileError(f"{prefix}{key}: required")
    return fields[key]


def _number(
    value: object, where: str, *, positive: bool = False, below: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where}: must be a number, got {_show(value)}")
    number = float(value)
    if number < 0 or (positive and number == 0):
        bound = "above 0" if positive else "0 or more"
        raise ProfileError(f"{where}: must be {bound}, got {number:g}")
    if below is not None and number >= below:
        raise ProfileError(f"{where}: must be below {below:g}, got {number:g}")
    return number


def _integer(value: object, where: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfileError(f"{where}: must be a whole number ≥ {minimum}, got {_show(value)}")
    return value


def _show(value: object) -> str:
    return "nothing" if value is None else repr(value)


def milliseconds(seconds: float | None) -> str:
    """Show a latency in milliseconds (n/a when unmeasured)."""
    if seconds is None:
        return "n/a"
    ms = seconds * 1000
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"
