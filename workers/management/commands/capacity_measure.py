from __future__ import annotations

import asyncio
import uuid
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from dataplane.frontdoor import FrontDoor
from dataplane.redis_client import redis_client_new, redis_sync_client
from dataplane.snapshots import live_workers_sync
from models_registry.models import Deployment, Rollout, RolloutState, Task
from models_registry.tokenizer import Tokenizer, TokenizerUnavailable, tokenizer_for
from tenants.models import Tenant
from workers.capacity import Level
from workers.loadgen import VOCABULARY_TEXT, Load, curve_measure
from workers.services import throughput_record


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise CommandError(f"--concurrency: comma-separated numbers, got {text!r}") from exc
    if not levels or min(levels) < 1 or len(set(levels)) != len(levels):
        raise CommandError(f"--concurrency: distinct whole numbers ≥ 1, got {text!r}")
    return sorted(levels)


class Command(BaseCommand):
    help = (
        "Measure a deployment's throughput curve: closed-loop load on its live workers through "
        "the Redis queue at each concurrency, one stored point per level, then a table."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--deployment", required=True, help="deployment to measure")
        parser.add_argument(
            "--tenant",
            required=True,
            help="tenant whose usage records keep the measurement (as shadow copies: cost 0)",
        )
        parser.add_argument(
            "--concurrency", default="1,4,16", help="requests in flight per level, e.g. 1,4,16"
        )
        parser.add_argument("--requests", type=int, default=64, help="requests per level")
        parser.add_argument("--prompt-tokens", type=int, default=512, help="tokens per prompt")
        parser.add_argument(
            "--max-tokens", type=int, default=128, help="tokens generated per request (exactly)"
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="seconds a request may take (default ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS)",
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["deployment"]
        levels = _levels(options["concurrency"])
        requests = options["requests"]
        prompt, output = options["prompt_tokens"], options["max_tokens"]
        try:
            deployment = Deployment.objects.select_related("version__model").get(name=name)
            tenant = Tenant.objects.select_related("quota").get(slug=options["tenant"])
        except Deployment.DoesNotExist as exc:
            raise CommandError(f"no deployment {name!r}") from exc
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant {options['tenant']!r}") from exc
        version = deployment.version
        if version.model.task == Task.EMBEDDING:
            raise CommandError(
                f"{name} serves an embedding model; capacity_measure drives generative "
                "deployments (bench/embeddings.py measures encoders)"
            )
        if requests < levels[-1]:
            raise CommandError(
                f"--requests {requests} is below the highest concurrency {levels[-1]}: that "
                "level would never have all its requests in flight"
            )
        if prompt < 1 or output < 1:
            raise CommandError("--prompt-tokens and --max-tokens must be 1 or more")
        if prompt + output > deployment.context_length:
            raise CommandError(
                f"--prompt-tokens + --max-tokens = {prompt + output} exceeds {name}'s context "
                f"of {deployment.context_length} tokens"
            )
        try:
            tokenizer = tokenizer_for(
                digest=version.digest, directory=version.artifact_dir, kind=Tokenizer
            )
        except TokenizerUnavailable as exc:
            raise CommandError(f"cannot load {version}'s tokenizer: {exc}") from exc
        run = uuid.uuid4()
        load = Load(
            deployment=name,
            version_digest=version.digest,
            tenant_id=tenant.pk,
            weight=float(tenant.quota.priority_weight),
            vocabulary=tuple(sorted(set(tokenizer.encode_text(VOCABULARY_TEXT)))),
            prompt_tokens=prompt,
            max_tokens=output,
            timeout=options["timeout"] or settings.ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS,
            user=f"capacity:{run}",
        )
        self._warn_about_rollouts(deployment)
        self.stdout.write(
            f"measuring {name} ({version}) run {run}: concurrency {','.join(map(str, levels))}, "
            f"{requests} requests per level, {prompt} prompt + {output} output tokens each"
        )
        measured = asyncio.run(self._measure(load, levels, requests, options["seed"]))
        throughput_record(deployment=deployment, run=run, levels=measured)
        self.stdout.write(f"stored {len(measured)} points of run {run}\n")
        self.stdout.write(_table(measured))

    def _warn_about_rollouts(self, deployment: Deployment) -> None:
        version = deployment.version
        rollouts = Rollout.objects.filter(
            Q(canary=version) | Q(baseline=version),
            state__in=[RolloutState.RUNNING, RolloutState.PAUSED],
        ).select_related("alias", "canary__model")
        for rollout in rollouts:
            self.stderr.write(
                f"warning: {version} is in rollout {rollout.pk} ({rollout}); this "
                "load counts in the SLIs its canary analysis compares"
            )

    async def _measure(
        self, load: Load, levels: list[int], requests: int, seed: int
    ) -> list[Level]:
        front = FrontDoor(redis_client_new())
        sync_client = redis_sync_client()

        def live_workers() -> int:
            workers = live_workers_sync(sync_client, load.deployment)
            if workers == 0:
                raise CommandError(
                    f"no live worker serves {load.deployment}; start one with "
                    f"manage.py run_worker --deployment {load.deployment}"
                )
            return workers

        try:
            return await curve_measure(
                front=front,
                load=load,
                levels=levels,
                requests=requests,
                seed=seed,
                live_workers=live_workers,
                say=self.stdout.write,
            )
        finally:
            await front.redis.aclose()


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}s"


def _table(levels: list[Level]) -> str:
    rows = [
        "| concurrency | workers | ok | errors | req/s | output tok/s | total tok/s "
        "| TTFT p50 / p95 s | ITL p50 / p95 s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for level in levels:
        rows.append(
            f"| {level.concurrency} | {level.workers} | {level.requests} | {level.errors} "
            f"| {level.requests_per_second:.2f} | {level.output_tokens_per_second:,.0f} "
            f"| {level.total_tokens_per_second:,.0f} "
            f"| {_s(level.ttft_p50)} / {_s(level.ttft_p95)} "
            f"| {_s(level.itl_p50)} / {_s(level.itl_p95)} |"
        )
    return "\n".join(rows)
