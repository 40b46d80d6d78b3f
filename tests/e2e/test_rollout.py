"""Rollouts with real workers: splits, shadows, LoRA adapters, canaries that roll back.

Two more workers run next to the session's: one serves a version of the demo model whose
registered engine settings make it slower (one sequence at a time), the other a version
with LoRA adapters enabled, whose adapters are versions of their own.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from models_registry.models import Alias, Deployment, DeploymentState, ModelVersion
from tests.conftest import CONTEXT, Process, _free_port, _http_ok, _spawn, _wait_for, roomy_key

SLOW = "tiny-slow"
LORA = "tiny-lora"
CANARY_ALIAS = "canary-chat"
LORA_ALIAS = "lora-chat"
ADAPTERS = ("tiny-sql", "tiny-poet", "tiny-pirate")


@dataclass(frozen=True)
class Canary:
    version: ModelVersion
    alias: Alias
    worker: Process
    other_frontend: str  # a second frontend's base URL
    lora_base: ModelVersion
    adapters: dict[str, ModelVersion]
    lora_worker: Process


@pytest.fixture(scope="module")
def canary(
    stack: Any,
    world: Any,
    demo_model_dir: Path,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Canary]:
    from models_registry.demo_adapter import demo_adapter_build
    from models_registry.services import alias_set, deployment_create, model_version_register

    logs = tmp_path_factory.mktemp("canary-logs")
    built = tmp_path_factory.mktemp("adapters")
    with django_db_blocker.unblock():
        lora_base, _ = model_version_register(
            model_name="tiny-llama",
            source_dir=demo_model_dir,
            label="lora-base",
            sampling_defaults={"top_p": 0.999},
        )
        deployment_create(
            name=LORA,
            version=lora_base,
            max_num_seqs=8,
            max_model_len=CONTEXT,
            kv_cache_bytes=32 << 20,
            enforce_eager=True,
            max_loras=1,  # the worker keeps two adapters loaded: a third evicts one
        )
        adapters = {
            name: model_version_register(
                model_name=name,
                source_dir=demo_adapter_build(
                    base_dir=demo_model_dir, out_dir=built / name, seed=seed
                ),
                base=lora_base,
            )[0]
            for seed, name in enumerate(ADAPTERS, start=1)
        }
        alias_set(name=LORA_ALIAS, version=lora_base)
        version, _ = model_version_register(
            model_name="tiny-llama",
            source_dir=demo_model_dir,
            label="slow",
            engine_args={"max_num_seqs": 1},
            price_input_per_1k=world.version.price_input_per_1k,
            price_output_per_1k=world.version.price_output_per_1k,
        )
        deployment_create(
            name=SLOW,
            version=version,
            max_model_len=CONTEXT,
            kv_cache_bytes=32 << 20,
            enforce_eager=True,
        )
        alias = alias_set(name=CANARY_ALIAS, version=world.version)
    worker = _spawn("worker-slow", ["manage.py", "run_worker", "--deployment", SLOW], logs)
    lora_worker = _spawn("worker-lora", ["manage.py", "run_worker", "--deployment", LORA], logs)
    port = _free_port()
    frontend = _spawn(
        "frontend-2",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        logs,
    )
    try:
        other = f"http://127.0.0.1:{port}"
        _wait_for(frontend, lambda: _http_ok(f"{other}/healthz"), timeout=120)
        _wait_for(worker, lambda: "ready: serving" in worker.tail(400), timeout=600)
        _wait_for(lora_worker, lambda: "ready: serving" in lora_worker.tail(400), timeout=600)
        yield Canary(
            version=version,
            alias=alias,
            worker=worker,
            other_frontend=other,
            lora_base=lora_base,
            adapters=adapters,
            lora_worker=lora_worker,
        )
    finally:
        for process in (worker, lora_worker, frontend):
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in (worker, lora_worker, frontend):
            try:
                process.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.popen.kill()


def _chat(base_url: str, key: str, **fields: Any) -> httpx.Response:
    body = {
        "model": CANARY_ALIAS,
        "messages": [{"role": "user", "content": "Tell me about the rail yard."}],
        "max_tokens": 8,
        **fields,
    }
    with httpx.Client(base_url=base_url, timeout=120) as client:
        return client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )


def _route_settle(key: str, *base_urls: str, alias: str = CANARY_ALIAS) -> None:
    """Wait until frontends route by the registry's current state.

    A change marks the frontends' cached routes stale as soon as its message arrives; a route
    is then served once more while it reloads in the background: one read after the message
    starts the reload, the pause lets it land.
    """
    time.sleep(0.3)
    for base_url in base_urls:
        httpx.get(f"{base_url}/v1/models/{alias}", headers={"Authorization": f"Bearer {key}"})
    time.sleep(0.5)


def _served_by(key: str, base_url: str, version: str, *, alias: str = CANARY_ALIAS) -> None:
    """Wait until a frontend sends some users to `version`: its route has the new split.

    `_route_settle` gives a reload time to land; on a loaded machine the change message can
    come later than that, and a load sent meanwhile all goes to the old version.
    """
    deadline = time.monotonic() + 30
    for i in range(10_000):
        response = _chat(base_url, key, model=alias, user=f"settle-{i}", max_tokens=1)
        if response.headers.get("x-roundhouse-model-version") == version:
            return
        assert time.monotonic() < deadline, f"{base_url} never routed a user to {version}"
        time.sleep(0.05)


def test_assignment_is_sticky_across_frontends_and_billing_follows_the_version(
    canary, stack, world, usage_of, django_db_blocker
):
    from models_registry.services import alias_split_set

    with django_db_blocker.unblock():
        alias_split_set(alias=canary.alias, version=canary.version, percent=50)
    _route_settle(world.acme_key, stack.base_url, canary.other_frontend)
    try:
        served: dict[str, str] = {}
        request_ids: dict[str, str] = {}
        for i in range(12):
            user = f"sticky-{i}"
            first = _chat(stack.base_url, world.acme_key, user=user)
            second = _chat(canary.other_frontend, world.acme_key, user=user)
            assert first.status_code == second.status_code == 200, first.text
            version = first.headers["x-roundhouse-model-version"]
            assert second.headers["x-roundhouse-model-version"] == version
            assert first.json()["model"] == f"tiny-llama@{version}"
            served[user] = version
            request_ids[first.headers["x-request-id"]] = version
        assert set(served.values()) == {world.version.version, canary.version.version}
        # A pinned version bypasses the split, whatever the user.
        for user in served:
            pinned = _chat(stack.base_url, world.acme_key, user=user, model="tiny-llama@slow")
            assert pinned.headers["x-roundhouse-model-version"] == canary.version.version
        # Usage is billed to the version that served each request.
        records = usage_of(*request_ids)
        assert len(records) == len(request_ids)
        with django_db_blocker.unblock():
            for record in records:
                digest = ModelVersion.objects.get(pk=record.model_version_id).digest
                assert digest.startswith(request_ids[record.request_id])
                assert record.cost > 0 and not record.shadow
    finally:
        with django_db_blocker.unblock():
            alias_split_set(alias=canary.alias, version=canary.version, percent=0)


def test_an_unknown_version_is_a_404_naming_it(stack, world):
    response = _chat(stack.base_url, world.acme_key, model="tiny-llama@doesnotexist")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "has no version 'doesnotexist'" in error["message"]


def test_shadow_copies_run_on_the_candidate_and_are_not_billed(
    canary, stack, world, usage_of, django_db_blocker
):
    from models_registry.services import alias_shadow_set

    with django_db_blocker.unblock():
        alias_shadow_set(alias=canary.alias, version=canary.version, percent=100)
    _route_settle(world.acme_key, stack.base_url)
    try:
        ids = []
        for i in range(3):
            response = _chat(stack.base_url, world.acme_key, user=f"shadow-{i}")
            assert response.status_code == 200
            assert response.headers["x-roundhouse-model-version"] == world.version.version
            ids.append(response.headers["x-request-id"])
        shadows = usage_of(*(f"{rid}-shadow" for rid in ids))
        originals = usage_of(*ids)
    finally:
        with django_db_blocker.unblock():
            alias_shadow_set(alias=canary.alias, version=None)
    assert len(shadows) == 3 and len(originals) == 3
    with django_db_blocker.unblock():
        for record in shadows:
            assert record.shadow and record.cost == 0 and record.status == "ok"
            assert record.model_version_id == canary.version.pk
            assert record.first_token_at is not None  # its latencies are there to compare
        assert all(r.cost > 0 and not r.shadow for r in originals)


def _load(
    base_url: str,
    key: str,
    *,
    prefix: str,
    n: int = 32,
    model: str = CANARY_ALIAS,
    max_tokens: int = 8,
    parallel: int = 8,
) -> list[str]:
    """Send n requests, `parallel` at a time, from n users; return their request ids."""

    def one(i: int) -> str:
        response = _chat(
            base_url, key, user=f"{prefix}-{i}", model=model, max_tokens=max_tokens, ignore_eos=True
        )
        assert response.status_code == 200, response.text
        return response.headers["x-request-id"]

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, range(n)))


def _long_stream(base_url: str, key: str, out: dict[str, Any], started: threading.Event) -> None:
    body = {
        "model": "tiny-llama@slow",
        "prompt": "Once upon a time",
        "max_tokens": 160,
        "ignore_eos": True,
        "stream": True,
    }
    text, finish = [], None
    with (
        httpx.Client(base_url=base_url, timeout=120) as client,
        client.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        out["request_id"] = response.headers["x-request-id"]
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice.get("text", ""))
            started.set()
            finish = choice.get("finish_reason") or finish
    out["text"], out["finish_reason"] = "".join(text), finish


def test_a_slower_canary_rolls_back_on_its_own_and_drains_without_dropping_streams(
    canary, stack, world, usage_of, django_db_blocker
):
    from rollouts.services import rollout_start, rollout_verdict
    from rollouts.tasks import rollouts_analyze

    with django_db_blocker.unblock():
        # The TTFT objective both versions are judged against: the baseline's first tokens,
        # eight at a time on its batching engine, come well inside it; the canary's, queued
        # behind one sequence at a time, mostly later. The windows cover a round of load
        # each, since this test analyses after each round rather than every 10 s.
        Deployment.objects.filter(name=SLOW).update(slo_ttft_p95_ms=1000)
        rollout = rollout_start(
            alias=canary.alias,
            canary=canary.version,
            steps=[50, 100],
            min_samples=8,
            min_step_seconds=0,
            short_window_seconds=60,
            long_window_seconds=120,
            breach_checks=2,
        )
    _route_settle(world.acme_key, stack.base_url)
    _served_by(world.acme_key, stack.base_url, canary.version.version)
    verdicts = []
    stream: dict[str, Any] = {}
    started = threading.Event()
    streamer = threading.Thread(
        target=_long_stream, args=(stack.base_url, world.acme_key, stream, started)
    )
    for round_ in range(2):
        # 64-token answers, 24 at a time: on one sequence at a time the canary keeps about
        # twelve waiting, so its TTFT is several times the baseline's (nine in ten of its first
        # tokens past the objective, a burn rate of about 18 against the 6 of a breach). With
        # eight at a time it kept four, and the baseline's TTFT (its engine sharing two cores
        # with the canary's) came within 1.5 times of it now and then; with 32-token answers 16
        # at a time half the canary's first tokens came past the objective, and at a faster
        # moment fewer than the 30 % a breach needs: the round was promoted.
        ids = _load(
            stack.base_url,
            world.acme_key,
            prefix=f"ramp-{round_}",
            n=64,
            max_tokens=64,
            parallel=24,
        )
        usage_of(*ids)
        if round_ == 1:
            # A stream in flight on the canary when it is rolled back must still finish.
            streamer.start()
            assert started.wait(60)
        with django_db_blocker.unblock():
            rollout.refresh_from_db()
            evidence = rollout_verdict(rollout).evidence["burn"]  # what the analysis sees
            done = rollouts_analyze.apply().get()
        assert rollout.pk in done, f"rollout {rollout.pk} was not analysed: {done}, {evidence}"
        verdicts.append(done[rollout.pk])
        assert verdicts == ["hold", "rollback"][: round_ + 1], evidence
    streamer.join(120)
    assert verdicts == ["hold", "rollback"]
    assert stream["finish_reason"] == "length"
    with django_db_blocker.unblock():
        rollout.refresh_from_db()
        assert rollout.state == "rolled_back"
        evidence = rollout.decisions.get(action="rollback").evidence
        assert "ttft" in evidence["breached"]
        ttft = evidence["burn"]["slos"]["ttft"]
        assert ttft["short"]["canary"]["burn"] >= 2 * ttft["short"]["baseline"]["burn"]
        assert ttft["long"]["canary"]["burn"] >= 6
        assert not Alias.objects.get(pk=canary.alias.pk).splits.exists()
    # After the rollback every user is on the baseline again...
    _route_settle(world.acme_key, stack.base_url)
    for i in range(4):
        response = _chat(stack.base_url, world.acme_key, user=f"ramp-0-{i}")
        assert response.headers["x-roundhouse-model-version"] == world.version.version
    # ...the canary's worker served its queue, drained and left; the baseline stays warm.
    canary.worker.popen.wait(timeout=90)
    assert canary.worker.popen.returncode == 0, canary.worker.tail()
    with django_db_blocker.unblock():
        assert Deployment.objects.get(name=SLOW).state == DeploymentState.STOPPED
        assert Deployment.objects.get(version=world.version).state == DeploymentState.READY
    (record,) = usage_of(stream["request_id"])
    assert record.status == "ok" and record.completion_tokens == 160


def _damaged_adapter(
    name: str, base: ModelVersion, demo_model_dir: Path, tmp_path: Path, django_db_blocker: Any
) -> ModelVersion:
    """Register an adapter of `base`, then damage its stored weights: its requests fail."""
    from models_registry.demo_adapter import demo_adapter_build
    from models_registry.services import model_version_register

    with django_db_blocker.unblock():
        adapter, _ = model_version_register(
            model_name=name,
            source_dir=demo_adapter_build(
                base_dir=demo_model_dir, out_dir=tmp_path / name, seed=sum(map(ord, name))
            ),
            base=base,
        )
    stored = adapter.artifact_dir / "adapter_model.safetensors"
    stored.chmod(0o644)
    stored.write_bytes(b"not weights")
    return adapter


def test_a_canary_that_fails_outright_is_rolled_back_by_the_fail_fast_check(
    canary, stack, world, demo_model_dir, tmp_path, usage_of, django_db_blocker
):
    """A canary whose every request fails (an adapter whose weights were damaged after it was
    registered) is rolled back by the first fail-fast check that sees ten of its requests,
    not after two analyses of its step."""
    from models_registry.services import alias_set
    from rollouts.services import rollout_start
    from rollouts.tasks import rollouts_fail_fast

    alias_name = "ff-chat"
    broken = _damaged_adapter(
        "tiny-broken", canary.lora_base, demo_model_dir, tmp_path, django_db_blocker
    )
    with django_db_blocker.unblock():
        alias = alias_set(name=alias_name, version=canary.lora_base)
        rollout = rollout_start(
            alias=alias, canary=broken, steps=[50, 100], min_samples=200, breach_checks=2
        )
    _route_settle(world.acme_key, stack.base_url, alias=alias_name)
    failed: list[str] = []
    for i in range(200):
        response = _chat(stack.base_url, world.acme_key, model=alias_name, user=f"ff-{i}")
        if response.status_code == 503:
            assert response.json()["error"]["code"] == "adapter_unavailable", response.text
            failed.append(response.headers["x-request-id"])
        else:
            assert response.status_code == 200, response.text
        if len(failed) == 10:
            break
    assert len(failed) == 10, "the canary's split never took a request"
    assert len(usage_of(*failed)) == 10
    with django_db_blocker.unblock():
        rolled = rollouts_fail_fast.apply().get()
        assert rollout.pk in rolled
        rollout.refresh_from_db()
        assert rollout.state == "rolled_back"
        decision = rollout.decisions.get(action="rollback")
        assert decision.reason.startswith("failing fast")
        assert decision.evidence["fail_fast"]["canary"]["errors"] >= 10
        assert not Alias.objects.get(pk=alias.pk).splits.exists()
    _route_settle(world.acme_key, stack.base_url, alias=alias_name)
    for i in range(8):
        response = _chat(stack.base_url, world.acme_key, model=alias_name, user=f"ff-{i}")
        assert response.status_code == 200, response.text
        assert response.headers["x-roundhouse-model-version"] == canary.lora_base.version


def _greedy(base_url: str, key: str, model: str) -> tuple[str, str, str]:
    """Return (text, served model, request id) of a greedy completion."""
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response = client.post(
            "/v1/completions",
            json={"model": model, "prompt": "The yard master said", "max_tokens": 12,
                  "temperature": 0, "ignore_eos": True},
            headers={"Authorization": f"Bearer {key}"},
        )  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["text"], body["model"], response.headers["x-request-id"]


def test_lora_adapters_load_on_first_use_change_the_output_and_leave_the_base_alone(
    canary, stack, world, usage_of, django_db_blocker
):
    base_name = "tiny-llama@lora-base"
    sql = canary.adapters["tiny-sql"]
    base_text, served, _ = _greedy(stack.base_url, world.acme_key, base_name)
    assert served == canary.lora_base.public_name
    assert "loaded adapter" not in canary.lora_worker.tail(400)  # nothing loaded up front
    sql_text, served, sql_id = _greedy(stack.base_url, world.acme_key, "tiny-sql")
    assert served == sql.public_name and sql_text != base_text
    assert f"loaded adapter {sql.public_name}" in canary.lora_worker.tail(400)
    # Base and adapter requests batched together each get their own model's output.
    models = [base_name, "tiny-sql"] * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(lambda m: _greedy(stack.base_url, world.acme_key, m)[0], models))
    assert texts == [base_text, sql_text] * 4
    # Usage is billed to the adapter version that served the request.
    (record,) = usage_of(sql_id)
    assert record.model_version_id == sql.pk
    # Two adapters stay loaded: a third evicts the least recently used, which reloads later.
    _greedy(stack.base_url, world.acme_key, "tiny-poet")
    _greedy(stack.base_url, world.acme_key, "tiny-pirate")
    assert f"evicted adapter {sql.public_name}" in canary.lora_worker.tail(400)
    assert _greedy(stack.base_url, world.acme_key, "tiny-sql")[0] == sql_text


def test_a_tampered_adapter_fails_its_requests_and_not_the_engine(
    canary, stack, world, demo_model_dir, tmp_path, django_db_blocker
):
    _damaged_adapter("tiny-bad", canary.lora_base, demo_model_dir, tmp_path, django_db_blocker)
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        response = client.post(
            "/v1/completions",
            json={"model": "tiny-bad", "prompt": "hi", "max_tokens": 4},
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "adapter_unavailable"
    assert "adapter_model.safetensors" in error["message"]
    # The engine and its other adapters carry on.
    assert _greedy(stack.base_url, world.acme_key, "tiny-llama@lora-base")[0]


def test_a_healthy_canary_is_promoted_step_by_step(
    canary, stack, world, usage_of, django_db_blocker
):
    """An adapter on the same engine as the baseline: no worse, so it ramps to 100 %.

    The guardrails are far looser than the defaults here: with ~10 requests per side one
    slow request on a busy machine is a burn rate (under the p95 ratios of old, one made the
    canary's 4 times the baseline's and a clean-clone run held the ramp so). Latency burns at
    most 20 times its budget (every request late, of a 5 % budget), so only failures could
    stop this ramp, and this test is about the ramp, not the thresholds (the rollback tests
    in this module are about those).
    """
    from rollouts.services import rollout_start
    from rollouts.tasks import rollouts_analyze

    with django_db_blocker.unblock():
        alias = Alias.objects.get(name=LORA_ALIAS)
        rollout = rollout_start(
            alias=alias,
            canary=canary.adapters["tiny-poet"],
            steps=[25, 50, 100],
            min_samples=6,
            min_step_seconds=0,
            guardrails={"burn_rate": 25.0, "engine_seconds_per_1k_ratio": 10.0},
        )
    actions = []
    for round_ in range(2):
        _route_settle(world.acme_key, stack.base_url, alias=LORA_ALIAS)
        ids = _load(stack.base_url, world.acme_key, prefix=f"healthy-{round_}", n=40,
                    model=LORA_ALIAS)  # fmt: skip
        usage_of(*ids)
        with django_db_blocker.unblock():
            actions.append(rollouts_analyze.apply().get()[rollout.pk])
    assert actions == ["advance", "promote"]
    with django_db_blocker.unblock():
        rollout.refresh_from_db()
        assert rollout.state == "promoted"
        assert Alias.objects.get(name=LORA_ALIAS).version == canary.adapters["tiny-poet"]
        percents = list(rollout.decisions.values_list("action", "percent"))
        assert percents == [("start", 25.0), ("advance", 50.0), ("promote", 100.0)]
    _route_settle(world.acme_key, stack.base_url, alias=LORA_ALIAS)
    _, served, _ = _greedy(stack.base_url, world.acme_key, LORA_ALIAS)
    assert served == canary.adapters["tiny-poet"].public_name


# --- tenant targeting: a split or a canary of named tenants' traffic alone --------------------


def _versions_seen(base_url: str, key: str, alias: str, users: list[str]) -> dict[str, str]:
    """Return the version that served each user (x-roundhouse-model-version)."""
    seen = {}
    for user in users:
        response = _chat(base_url, key, model=alias, user=user, max_tokens=1)
        assert response.status_code == 200, response.text
        seen[user] = response.headers["x-roundhouse-model-version"]
    return seen


def _traffic(base_url: str, key: str, alias: str) -> dict[str, float] | None:
    response = httpx.get(
        f"{base_url}/v1/models/{alias}", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json().get("traffic")


def _routed_as(key: str, base_url: str, alias: str, users: list[str], wanted: set[str]) -> None:
    """Wait until a frontend routes these users only to `wanted` versions (the change landed)."""
    deadline = time.monotonic() + 30
    while set(_versions_seen(base_url, key, alias, users).values()) != wanted:
        assert time.monotonic() < deadline, f"{base_url} never routed {users} to {wanted}"
        time.sleep(0.2)


def test_a_tenant_moved_first_gets_the_new_version_on_every_frontend_and_rolls_back_alone(
    canary, stack, world, django_db_blocker
):
    """Acme is moved whole to an adapter, globex half its users to another; a tenant not
    targeted stays on the primary; acme's rollback leaves globex's users where they were."""
    from models_registry.services import alias_set, alias_split_set

    alias_name = "targeted-chat"
    base, poet, sql = (
        canary.lora_base, canary.adapters["tiny-poet"], canary.adapters["tiny-sql"]
    )  # fmt: skip
    with django_db_blocker.unblock():
        bystander = roomy_key("targeting-bystander")
        alias = alias_set(name=alias_name, version=base)
        alias_split_set(alias=alias, version=poet, percent=100, tenants=[world.acme])
        alias_split_set(alias=alias, version=sql, percent=50, tenants=[world.globex])
    frontends = (stack.base_url, canary.other_frontend)
    users = [f"targeted-{i}" for i in range(12)]
    for base_url in frontends:
        _routed_as(world.acme_key, base_url, alias_name, users, {poet.version})
    globex = {url: _versions_seen(url, world.globex_key, alias_name, users) for url in frontends}
    # Globex's split is sticky per user, the same on both frontends, and of its users alone.
    assert globex[stack.base_url] == globex[canary.other_frontend]
    assert set(globex[stack.base_url].values()) == {base.version, sql.version}
    for base_url in frontends:
        assert set(_versions_seen(base_url, bystander, alias_name, users).values()) == {
            base.version
        }
    # Each tenant is told its own traffic; another's targeting does not show.
    assert _traffic(stack.base_url, world.acme_key, alias_name) == {
        poet.version: 100.0, base.version: 0.0,
    }  # fmt: skip
    assert _traffic(stack.base_url, world.globex_key, alias_name) == {
        sql.version: 50.0, base.version: 50.0,
    }  # fmt: skip
    assert _traffic(stack.base_url, bystander, alias_name) is None

    with django_db_blocker.unblock():
        alias_split_set(alias=alias, version=poet, percent=0, tenants=[world.acme])
    for base_url in frontends:
        _routed_as(world.acme_key, base_url, alias_name, users, {base.version})
        assert _versions_seen(base_url, world.globex_key, alias_name, users) == globex[base_url]


def test_a_scoped_canary_that_fails_rolls_back_its_tenant_alone(
    canary, stack, world, demo_model_dir, tmp_path, usage_of, django_db_blocker
):
    """Acme's canary (an adapter whose weights were damaged) fails outright; globex's canary
    of a healthy adapter on the same alias runs on. The fail-fast check rolls back acme's,
    which takes acme back to the primary and leaves globex's users where they were."""
    from models_registry.models import Rollout
    from models_registry.services import alias_set
    from rollouts.services import rollout_act, rollout_start
    from rollouts.tasks import rollouts_fail_fast

    alias_name = "scoped-chat"
    base, pirate = canary.lora_base, canary.adapters["tiny-pirate"]
    broken = _damaged_adapter(
        "tiny-broken-scoped", base, demo_model_dir, tmp_path, django_db_blocker
    )
    with django_db_blocker.unblock():
        bystander = roomy_key("scoped-bystander")
        alias = alias_set(name=alias_name, version=base)
        acme_rollout = rollout_start(
            alias=alias, canary=broken, steps=[50, 100], min_samples=200, tenants=[world.acme]
        )
        globex_rollout = rollout_start(
            alias=alias, canary=pirate, steps=[50, 100], min_samples=200, tenants=[world.globex]
        )
    try:
        users = [f"scoped-{i}" for i in range(12)]
        _route_settle(world.globex_key, stack.base_url, alias=alias_name)
        _routed_as(bystander, stack.base_url, alias_name, users, {base.version})
        deadline = time.monotonic() + 30
        while True:
            globex = _versions_seen(stack.base_url, world.globex_key, alias_name, users)
            if set(globex.values()) == {base.version, pirate.version}:
                break
            assert time.monotonic() < deadline, f"globex never reached its canary: {globex}"
            time.sleep(0.2)
        failed: list[str] = []
        for i in range(200):
            response = _chat(stack.base_url, world.acme_key, model=alias_name, user=f"sc-{i}")
            if response.status_code == 503:
                assert response.json()["error"]["code"] == "adapter_unavailable", response.text
                failed.append(response.headers["x-request-id"])
            else:
                assert response.status_code == 200, response.text
                assert response.headers["x-roundhouse-model-version"] == base.version
            if len(failed) == 10:
                break
        assert len(failed) == 10, "acme's canary never took a request"
        assert len(usage_of(*failed)) == 10
        with django_db_blocker.unblock():
            rolled = rollouts_fail_fast.apply().get()
            assert acme_rollout.pk in rolled and globex_rollout.pk not in rolled
            assert Rollout.objects.get(pk=acme_rollout.pk).state == "rolled_back"
            assert Rollout.objects.get(pk=globex_rollout.pk).state == "running"
            decision = Rollout.objects.get(pk=acme_rollout.pk).decisions.get(action="rollback")
            assert decision.evidence["tenants"] == ["acme"]
        _route_settle(world.acme_key, stack.base_url, alias=alias_name)
        _routed_as(world.acme_key, stack.base_url, alias_name, users, {base.version})
        assert _versions_seen(stack.base_url, world.globex_key, alias_name, users) == globex
        assert set(_versions_seen(stack.base_url, bystander, alias_name, users).values()) == {
            base.version
        }
    finally:
        with django_db_blocker.unblock():
            for rollout in (acme_rollout, globex_rollout):
                rollout.refresh_from_db()
                if rollout.is_active:
                    rollout_act(rollout, action="rollback", actor=None, reason="test over")
