"""Metrics and traces from real requests through the running stack (docs/metrics.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ALIAS, DEPLOYMENT, roomy_key

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
FRONTEND_STAGES = ("auth", "preprocess", "admission", "relay")
WORKER_STAGES = ("platform_queue", "engine_queue", "prefill", "decode")


def _scrape(url: str) -> Samples:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a series' samples whose labels include these."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def _labels(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls) in samples if n == name]


def _chat(client: httpx.Client, key: str, **fields: object) -> httpx.Response:
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": 24,
        "ignore_eos": True,
        **fields,
    }
    response = client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    return response


def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail("metrics did not arrive in time")
        time.sleep(0.2)


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def test_every_process_exports_its_series_with_the_right_labels(stack, world, client, usage_of):
    before = _scrape(stack.worker_metrics_url)
    response = _chat(client, world.acme_key)
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": ALIAS,
            "messages": [{"role": "user", "content": "and the mountains"}],
            "max_tokens": 8,
            "stream": True,
        },
        headers={"Authorization": f"Bearer {world.acme_key}"},
    ) as streamed:
        assert streamed.status_code == 200
        streamed.read()
    usage_of(response.headers["x-request-id"], streamed.headers["x-request-id"])
    _until(
        lambda: (
            _value(_scrape(stack.worker_metrics_url), "roundhouse_worker_requests_total")
            >= _value(before, "roundhouse_worker_requests_total") + 2
        )
    )

    frontend = _scrape(f"{stack.base_url}/metrics")
    for stage in FRONTEND_STAGES:
        assert _value(
            frontend, "roundhouse_stage_seconds_count", stage=stage, deployment=DEPLOYMENT
        ), stage
    assert _value(frontend, "roundhouse_request_seconds_count", endpoint="chat_completions") >= 2
    assert (
        _value(
            frontend,
            "roundhouse_admission_decisions_total",
            deployment=DEPLOYMENT,
            reason="admitted",
        )
        >= 2
    )
    assert _value(frontend, "roundhouse_requests_total", endpoint="chat_completions", code="200")
    # The streamed request ended with its finish reason: one completed stream (the other
    # request was not streamed and is not counted).
    assert (
        _value(
            frontend, "roundhouse_streams_ended_total", deployment=DEPLOYMENT, outcome="completed"
        )
        >= 1
    )
    # The platform's shared state, read from Redis at scrape time.
    for priority in ("interactive", "batch"):
        series = frozenset({("deployment", DEPLOYMENT), ("priority", priority)})
        assert ("roundhouse_queue_depth", series) in frontend, priority
        # Each class has its own age series (a missing one would read as 0), 0 when none waits.
        assert ("roundhouse_queue_oldest_age_seconds", series) in frontend, priority
        age = frontend[("roundhouse_queue_oldest_age_seconds", series)]
        assert age >= 0, (priority, age)
        if frontend[("roundhouse_queue_depth", series)] == 0:
            assert age == 0, (priority, age)
    assert _value(frontend, "roundhouse_deployment_workers", deployment=DEPLOYMENT) >= 1
    assert _value(frontend, "roundhouse_deployment_desired_replicas", deployment=DEPLOYMENT) >= 1
    assert _value(
        frontend, "roundhouse_deployment_slo", deployment=DEPLOYMENT, objective="ttft_p95_seconds"
    ) == pytest.approx(world.deployment.slo_ttft_p95_ms / 1000)
    assert ("roundhouse_usage_ingest_lag_events", frozenset({("deployment", DEPLOYMENT)})) in (
        frontend
    )
    # django-prometheus: the sign-in page passes its middleware; the scrape queries the database.
    assert client.get("/console/login").status_code == 200
    django = _scrape(f"{stack.base_url}/metrics")
    assert _value(django, "django_http_requests_total_by_method_total", method="GET") >= 1
    assert _value(django, "django_http_responses_total_by_status_total", status="200") >= 1
    assert _value(django, "django_db_execute_total", vendor="postgresql") >= 1

    worker = _scrape(stack.worker_metrics_url)
    engine = {"deployment": DEPLOYMENT}
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ):
        assert _value(worker, name, **engine) > 0, name
        for labels in _labels(worker, name):
            assert labels["deployment"] == DEPLOYMENT and labels["model_name"], labels
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert _labels(worker, name), name
    kv_cache = _labels(worker, "vllm:kv_cache_usage_perc")
    assert kv_cache and all(labels["deployment"] == DEPLOYMENT for labels in kv_cache), kv_cache
    assert 0 <= _value(worker, "vllm:kv_cache_usage_perc", **engine) <= 1
    for stage in WORKER_STAGES:
        assert _value(worker, "roundhouse_stage_seconds_count", stage=stage, **engine), stage
    assert (
        _value(
            worker, "roundhouse_time_to_first_token_seconds_count", priority="interactive", **engine
        )
        >= 2
    )
    assert _value(worker, "roundhouse_worker_requests_total", status="ok", **engine) >= 2
    assert _value(worker, "roundhouse_generated_tokens_total", **engine) >= 24 + 1
    # The SLIs' worker series: engine time and tokens per version, idle time, and the
    # restart counts, there at 0 before any engine died.
    assert _value(worker, "roundhouse_engine_seconds_total", **engine) > 0
    assert _value(worker, "roundhouse_served_tokens_total", **engine) > 24 + 1
    (served,) = _labels(worker, "roundhouse_served_tokens_total")
    assert world.version.digest.startswith(served["version"]) and "zone" in served, served
    assert _value(worker, "roundhouse_worker_idle_seconds_total", **engine) > 0
    for reason in ("crash", "oom"):
        assert ("roundhouse_engine_restarts_total", reason) in {
            (n, dict(ls).get("reason")) for n, ls in worker
        }, reason

    ingester = _scrape(stack.ingester_metrics_url)
    assert (
        _value(ingester, "roundhouse_tenant_tokens_total", tenant="acme", kind="completion") >= 25
    )
    assert _value(ingester, "roundhouse_usage_ingested_total") >= 2
    assert _value(ingester, "roundhouse_billed_tokens_total", deployment=DEPLOYMENT) > 24 + 1
    assert _value(ingester, "roundhouse_billed_cost_total", deployment=DEPLOYMENT) > 0


def _stage_parts(*scrapes: Samples) -> dict[str, float]:
    return {
        stage: sum(
            _value(samples, "roundhouse_stage_seconds_sum", stage=stage, deployment=DEPLOYMENT)
            for samples in scrapes
        )
        for stage in (*FRONTEND_STAGES, *WORKER_STAGES)
    }


def test_the_stages_of_a_request_add_up_to_roughly_its_end_to_end_time(stack, world, client):
    """One request alone: the growth of every stage's sum is close to what the client waited."""
    frontend_url, worker_url = f"{stack.base_url}/metrics", stack.worker_metrics_url
    _chat(client, world.acme_key)  # warm: nothing of this request's counts below
    # Alone means alone: no earlier test's request still running on the engine or queued.
    _until(
        lambda: (
            _value(_scrape(worker_url), "vllm:num_requests_running", deployment=DEPLOYMENT) == 0
            and _value(_scrape(frontend_url), "roundhouse_queue_depth", deployment=DEPLOYMENT) == 0
        )
    )
    time.sleep(0.5)
    parts_before = _stage_parts(_scrape(frontend_url), _scrape(worker_url))
    before = sum(parts_before.values())
    requests_before = _value(_scrape(worker_url), "roundhouse_worker_requests_total")
    decode_before = _value(_scrape(worker_url), "roundhouse_stage_seconds_count", stage="decode")
    started = time.perf_counter()
    _chat(client, world.acme_key, max_tokens=64)
    waited = time.perf_counter() - started
    _until(
        lambda: (
            _value(_scrape(worker_url), "roundhouse_worker_requests_total") > requests_before
            and _value(_scrape(worker_url), "roundhouse_stage_seconds_count", stage="decode")
            > decode_before
        )
    )
    parts = _stage_parts(_scrape(frontend_url), _scrape(worker_url))
    grown = {stage: round((parts[stage] - parts_before[stage]) * 1000, 1) for stage in parts}
    staged = sum(parts.values()) - before
    e2e = _value(_scrape(frontend_url), "roundhouse_request_seconds_sum")
    print(f"client waited {waited * 1000:.1f} ms; stages add up to {staged * 1000:.1f} ms")
    # The stages leave out only the Redis hops between them and the client's own HTTP work.
    assert 0.6 * waited <= staged <= 1.05 * waited, f"ms by stage: {grown}"
    assert e2e > 0


def test_request_ids_and_user_tags_never_become_labels(stack, world, client):
    """More requests with new users add samples to existing series, never new series."""
    for i in range(2):
        _chat(client, world.acme_key, user=f"warm-user-{i}")
    time.sleep(1.0)
    urls = (f"{stack.base_url}/metrics", stack.worker_metrics_url, stack.ingester_metrics_url)
    before = [set(_scrape(url)) for url in urls]
    request_ids = [
        _chat(client, world.acme_key, user=f"user-{i}-label-probe").headers["x-request-id"]
        for i in range(5)
    ]
    time.sleep(1.0)
    after = [set(_scrape(url)) for url in urls]
    for series_before, series_after in zip(before, after, strict=True):
        grown = {name for name, _ in series_after - series_before}
        # Only a histogram bucket's first observation or a new status code may appear.
        assert not any("label-probe" in str(labels) for _, labels in series_after)
        assert len(series_after) - len(series_before) <= 40, grown
    every_value = {v for series in after for _, labels in series for _, v in labels}
    assert not every_value & set(request_ids)


def test_trace_ids_flow_from_the_client_through_the_worker_to_the_usage_record(
    stack, world, client, usage_of
):
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    response = client.post(
        "/v1/chat/completions",
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={
            "Authorization": f"Bearer {world.acme_key}",
            "traceparent": f"00-{trace_id}-b7ad6b7169203331-01",
        },
    )
    assert response.status_code == 200, response.text
    version, returned_trace, span, flags = response.headers["traceparent"].split("-")
    assert (version, returned_trace, flags) == ("00", trace_id, "01")
    assert span != "b7ad6b7169203331"  # the frontend's own span
    # The worker copies the job envelope's trace into the usage event it writes.
    (record,) = usage_of(response.headers["x-request-id"])
    assert record.trace_id == trace_id

    # A streamed request carries its trace the same way.
    streamed_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": ALIAS,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
        headers={
            "Authorization": f"Bearer {world.acme_key}",
            "traceparent": f"00-{streamed_trace}-00f067aa0ba902b7-01",
        },
    ) as streamed:
        assert streamed.status_code == 200
        streamed.read()
    assert streamed.headers["traceparent"].split("-")[1] == streamed_trace
    (record,) = usage_of(streamed.headers["x-request-id"])
    assert record.trace_id == streamed_trace

    # Without a traceparent the platform starts a trace, and the record keeps that one.
    response = _chat(client, world.acme_key)
    started = response.headers["traceparent"].split("-")[1]
    (record,) = usage_of(response.headers["x-request-id"])
    assert record.trace_id == started and len(started) == 32


def test_process_logs_are_json_lines(stack):
    """Outside `make demo`, logs are one JSON object per line that pipelines can parse."""
    lines = [line for line in stack.worker.tail(400).splitlines() if line.startswith("{")]
    entries = [json.loads(line) for line in lines]
    ready = [e for e in entries if e["message"].startswith("engine ready")]
    assert ready, stack.worker.tail(40)
    assert {"ts", "level", "logger", "message", "process"} <= set(ready[0])


def test_encoder_workers_report_their_batches(stack, world, encoder, client):
    from tests.conftest import ENCODER

    response = client.post(
        "/v1/embeddings",
        json={"model": ENCODER, "input": ["one", "two words", "three short words"]},
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == 200, response.text
    _until(lambda: _value(_scrape(encoder.metrics_url), "roundhouse_encoder_batch_size_count") > 0)
    samples = _scrape(encoder.metrics_url)
    labels = {"deployment": ENCODER}
    assert _value(samples, "roundhouse_encoder_batch_size_sum", **labels) >= 3
    assert (
        0
        < _value(samples, "roundhouse_encoder_batch_fill_ratio_sum", **labels)
        <= (_value(samples, "roundhouse_encoder_batch_fill_ratio_count", **labels))
    )
    assert _value(samples, "roundhouse_encoder_batch_seconds_count", **labels) >= 1
    for stage in ("platform_queue", "engine_queue", "prefill"):
        assert _value(samples, "roundhouse_stage_seconds_count", stage=stage, **labels), stage
    frontend = _scrape(f"{stack.base_url}/metrics")
    assert _value(frontend, "roundhouse_stage_seconds_count", stage="relay", **labels) >= 1


def test_a_worker_exports_the_kv_blocks_each_tenant_holds(stack, world, client, django_db_blocker):
    with django_db_blocker.unblock():
        key = roomy_key("kv-holder", max_tokens_per_request=1500)
    body = {
        "model": ALIAS,
        "prompt": "Once upon a time, in a roundhouse far away,",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as streamed:
        assert streamed.status_code == 200
        # Seen at the worker's next heartbeat, under the tenant's slug; the stream runs on.
        _until(
            lambda: (
                _value(
                    _scrape(stack.worker_metrics_url),
                    "roundhouse_worker_tenant_kv_blocks",
                    deployment=DEPLOYMENT,
                    tenant="kv-holder",
                )
                >= 1
            )
        )
    # The client hung up: the request ends, and the tenant leaves the series.
    _until(
        lambda: (
            not _labels_with(
                _scrape(stack.worker_metrics_url), "roundhouse_worker_tenant_kv_blocks", "kv-holder"
            )
        )
    )


def _labels_with(samples: Samples, name: str, tenant: str) -> list[dict[str, str]]:
    return [labels for labels in _labels(samples, name) if labels.get("tenant") == tenant]
