from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.models import Deployment
from workers.capacity import PlanError, pool_plan
from workers.selectors import (
    deployment_gpus_per_replica,
    deployment_slo,
    throughput_curve_latest,
)
from workers.traffic_profile import ProfileError, profile_load

DEFAULT_HEADROOM = 0.2
DEFAULT_ZONES = 3


class Command(BaseCommand):
    help = (
        "Plan replicas and GPUs per pool from a traffic profile (YAML or JSON) and each "
        "deployment's latest curve measured by capacity_measure."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--profile", required=True, type=Path, help="traffic profile, .yaml/.yml or .json"
        )
        parser.add_argument(
            "--headroom",
            type=float,
            default=None,
            help=f"share of each replica's tokens/s kept free (profile's, else {DEFAULT_HEADROOM})",
        )
        parser.add_argument(
            "--zones",
            type=int,
            default=None,
            help=f"zones to survive losing one of (profile's, else {DEFAULT_ZONES}; 1: none)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            profile = profile_load(options["profile"])
        except ProfileError as exc:
            raise CommandError(str(exc)) from exc
        headroom = _first(options["headroom"], profile.headroom, DEFAULT_HEADROOM)
        zones = int(_first(options["zones"], profile.zones, DEFAULT_ZONES))
        if not 0 <= headroom < 1:
            raise CommandError(f"--headroom: a share in [0, 1), got {headroom:g}")
        if zones < 1:
            raise CommandError(f"--zones: 1 or more, got {zones}")
        replicas = gpus = 0
        failures = []
        for index, pool in enumerate(profile.pools):
            deployment = (
                Deployment.objects.select_related("version").filter(name=pool.deployment).first()
            )
            if deployment is None:
                failures.append(f"pools[{index}].deployment: no deployment {pool.deployment!r}")
                continue
            if pool.gpus_per_replica is not None:
                per_replica, source = pool.gpus_per_replica, "from the profile"
            else:
                per_replica = deployment_gpus_per_replica(deployment=deployment)
                source = "from the version's engine args"
            try:
                plan = pool_plan(
                    pool=pool,
                    curve=throughput_curve_latest(deployment=deployment),
                    serving_digest=deployment.version.digest,
                    deployment_slo=deployment_slo(deployment=deployment),
                    headroom=headroom,
                    zones=zones,
                    gpus_per_replica=per_replica,
                    gpus_source=source,
                )
            except PlanError as exc:
                failures.append(f"pool {pool.name}: {exc}")
                continue
            self.stdout.write("\n".join(plan.explain()) + "\n")
            replicas += plan.replicas
            gpus += plan.gpus
        self.stdout.write(
            f"total: {replicas} replicas, {gpus} GPUs over {zones} zone(s), headroom "
            f"{headroom:g}, for {len(profile.pools) - len(failures)} of "
            f"{len(profile.pools)} pools"
        )
        if failures:
            raise CommandError("\n".join(failures))


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)
