"""The Files and Batch APIs end to end: real Celery worker, real admission, real engines."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings

from dataplane.keys import ledger_key
from dataplane.redis_client import redis_sync_client
from tests.conftest import (
    ALIAS,
    DEPLOYMENT,
    ENCODER,
    ENCODER_PRICE_PER_1K,
    Process,
    _spawn,
    _wait_for,
    roomy_key,
)

CELERY = ["-m", "celery", "-A", "config", "worker", "--pool", "solo", "--loglevel", "INFO",
          "--without-gossip", "--without-mingle"]  # fmt: skip
# As deployed: the batch runners' turns on a worker of their own, the control jobs on another.
BATCHES_WORKER = [*CELERY, "--queues", "batches", "--hostname", "batches@%h"]
CONTROL_WORKER = [*CELERY, "--queues", "control", "--hostname", "control@%h"]


@dataclass
class Celery:
    """The Celery workers: the batch runners' (a test may kill it and start another) and the
    control jobs' (resuming the runners when a batch worker starts, among others)."""

    logs: Path
    process: Process | None = None
    control: Process | None = None
    starts: int = 0

    def start(self) -> None:
        """Start a worker of the `batches` queue."""
        self.starts += 1
        self.process = _spawn(f"celery-{self.starts}", BATCHES_WORKER, self.logs)
        _ready(self.process)

    def start_control(self) -> None:
        self.control = _spawn("celery-control", CONTROL_WORKER, self.logs)
        _ready(self.control)

    def kill(self) -> None:
        """Die as a crashed host does: no warm shutdown, nothing handed back."""
        assert self.process is not None
        os.killpg(self.process.popen.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=10)

    def stop(self) -> None:
        for process in (self.process, self.control):
            if process is not None and process.popen.poll() is None:
                os.killpg(process.popen.pid, signal.SIGTERM)
                process.popen.wait(timeout=60)


def _ready(process: Process) -> None:
    _wait_for(process, lambda: " ready." in process.tail(200), timeout=120)


@pytest.fixture(scope="module")
def celery(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    workers = Celery(logs=tmp_path_factory.mktemp("celery-logs"))
    try:
        workers.start_control()
        workers.start()
        yield workers
    finally:
        workers.stop()


@pytest.fixture
def sdk(stack: Any, world: Any, celery: Celery) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


def _chat_line(custom_id: str, content: str, max_tokens: int = 8, **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": ALIAS,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                **body,
            },
        }
    )


def _upload(sdk: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    return sdk.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def _wait(
    sdk: openai.OpenAI,
    batch_id: str,
    *,
    until: Any,
    timeout: float = 180,
    celery: Celery | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = sdk.batches.retrieve(batch_id)
        if until(batch):
            return batch
        assert time.monotonic() < deadline, f"batch stuck: {batch}\n{_story(celery)}"
        time.sleep(0.3)


def _story(celery: Celery | None) -> str:
    """What the batch's Celery workers logged, for a failure's message."""
    if celery is None:
        return ""
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}"
        for log in sorted(celery.logs.glob("*.log"))
    )


def _all_ran(sdk: openai.OpenAI, batch: Any, celery: Celery, count: int) -> None:
    """The batch completed with every line answered; else what failed and what Celery said."""
    counts = batch.request_counts
    if batch.status == "completed" and (counts.completed, counts.failed) == (count, 0):
        return
    errors = _entries(sdk, batch.error_file_id)[:3]
    pytest.fail(f"{batch.status} {counts}: first errors {errors}\n{_story(celery)}")


def _ended(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def _entries(sdk: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in sdk.files.content(file_id).text.splitlines()]


def test_a_batch_runs_with_the_sdk_and_malformed_lines_become_error_entries(sdk, world, usage_of):
    lines = [_chat_line(f"ok-{i}", f"Say hello number {i}") for i in range(5)]
    lines.insert(2, "{this is not json")
    lines.append(_chat_line("wrong-url", "x").replace("/v1/chat/completions", "/v1/embeddings"))
    lines.append(_chat_line("ok-0", "a duplicate custom_id"))
    lines.append(_chat_line("too-long", "x", max_tokens=10_000))
    file_id = _upload(sdk, lines)
    assert sdk.files.retrieve(file_id).bytes > 0
    batch = sdk.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating"
    batch = _wait(sdk, batch.id, until=_ended)
    assert batch.status == "completed"
    assert batch.request_counts.total == 9
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 4)
    assert batch.metadata == {"job": "nightly"}
    output = _entries(sdk, batch.output_file_id)
    assert [e["custom_id"] for e in output] == [f"ok-{i}" for i in range(5)]
    for entry in output:
        response = entry["response"]
        assert response["status_code"] == 200
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["content"]
        assert entry["error"] is None
    errors = {e["custom_id"]: e for e in _entries(sdk, batch.error_file_id)}
    assert errors[None]["error"]["code"] == "invalid_json"
    assert errors[None]["error"]["line"] == 3
    assert errors["wrong-url"]["error"]["code"] == "mismatched_url"
    assert errors["ok-0"]["error"]["code"] == "duplicate_custom_id"
    # Valid JSON, but more than the tenant allows: refused at admission, like an API call.
    refused = errors["too-long"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["code"] == "max_tokens_exceeded"
    # Each line that ran is one request, billed to the tenant in the batch class.
    request_ids = [e["response"]["request_id"] for e in output]
    records = usage_of(*request_ids)
    assert len(records) == 5
    assert {(r.tenant_id, r.priority, r.status) for r in records} == {
        (world.acme.pk, "batch", "ok")
    }
    assert batch.id in [b.id for b in sdk.batches.list(limit=100).data]


def test_embedding_batches_bill_at_the_batch_discount(
    sdk, world, encoder, usage_of, django_db_blocker
):
    from billing.services import price_book_add
    from models_registry.models import Alias

    with django_db_blocker.unblock():
        price_book_add(
            version=Alias.objects.get(name=ENCODER).version,
            input_per_1k=ENCODER_PRICE_PER_1K,
            output_per_1k=Decimal("0"),
            batch_discount_pct=Decimal("50"),
            effective_from=dt.datetime.now(dt.UTC),
        )
    texts = ["the yard at dawn", "switches and signals", "a freight train"]
    lines = [
        json.dumps(
            {
                "custom_id": f"e{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": ENCODER, "input": text},
            }
        )
        for i, text in enumerate(texts)
    ]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/embeddings", completion_window="1h"
    )
    batch = _wait(sdk, batch.id, until=_ended)
    assert (batch.status, batch.request_counts.completed) == ("completed", 3)
    output = _entries(sdk, batch.output_file_id)
    assert all(len(e["response"]["body"]["data"][0]["embedding"]) == 384 for e in output)
    records = usage_of(*[e["response"]["request_id"] for e in output])
    for record in records:
        full = ENCODER_PRICE_PER_1K * record.prompt_tokens / 1000
        assert record.priority == "batch"
        assert record.cost == full / 2


def test_cancelling_a_batch_aborts_its_in_flight_lines(sdk, world, usage_of):
    lines = [
        _chat_line(f"c{i}", f"Count slowly {i}", max_tokens=150, ignore_eos=True)
        for i in range(120)
    ]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    _wait(sdk, batch.id, until=lambda b: b.request_counts.completed >= 3, timeout=120)
    cancelling = sdk.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _wait(sdk, batch.id, until=_ended, timeout=60)
    assert batch.status == "cancelled"
    counts = batch.request_counts
    assert counts.total == 120
    assert counts.completed + counts.failed == 120
    assert 3 <= counts.completed < 120
    errors = _entries(sdk, batch.error_file_id)
    assert len(errors) == counts.failed
    assert {e["error"]["code"] for e in errors if e["error"]} <= {"batch_cancelled"}
    # Lines that were running when the batch was cancelled were aborted in the engine: their
    # usage records say so and bill the tokens produced until then.
    aborted = [e["response"]["request_id"] for e in errors if e["response"] is not None]
    aborted += [e["id"].removeprefix("batch_req_") for e in errors if e["response"] is None]
    records = usage_of(*aborted, timeout=10)
    assert any(r.status == "cancelled" and r.completion_tokens < 150 for r in records)
    with pytest.raises(openai.ConflictError):
        sdk.batches.cancel(batch.id)


def _admitted(deployment: str) -> int:
    """Requests the deployment's enqueue script admitted, over every hour of its ledger."""
    ledger: dict[bytes, bytes] = redis_sync_client().hgetall(ledger_key(deployment))  # type: ignore[assignment]
    return sum(int(v) for f, v in ledger.items() if f.endswith(b":admitted"))


def test_a_batch_survives_its_celery_worker_dying_mid_way(sdk, world, celery, usage_of):
    count = 60
    admitted_before = _admitted(DEPLOYMENT)
    lines = [_chat_line(f"r{i}", f"Line {i}", max_tokens=80, ignore_eos=True) for i in range(count)]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    _wait(sdk, batch.id, until=lambda b: b.request_counts.completed >= 5, timeout=120,
          celery=celery)  # fmt: skip
    celery.kill()
    progress = sdk.batches.retrieve(batch.id).request_counts.completed
    assert progress < count, "the batch finished before the worker could be killed"
    celery.start()
    batch = _wait(sdk, batch.id, until=_ended, timeout=240, celery=celery)
    _all_ran(sdk, batch, celery, count)
    output = _entries(sdk, batch.output_file_id)
    assert sorted(e["custom_id"] for e in output) == sorted(f"r{i}" for i in range(count))
    request_ids = [e["response"]["request_id"] for e in output]
    assert len(set(request_ids)) == count
    # Exactly one request per line: every line billed once, none lost, none run twice.
    records = usage_of(*request_ids)
    assert len(records) == count
    assert all(r.status == "ok" and r.completion_tokens == 80 for r in records)
    # Usage records are unique per request id, so a line sent twice would still show one:
    # the admission ledger counts every enqueue.
    assert _admitted(DEPLOYMENT) - admitted_before == count


def test_a_batch_survives_its_celery_worker_stopping_gracefully(
    stack, world, celery, usage_of, django_db_blocker
):
    """A rolling update: SIGTERM lets the worker end its step and exit; the next one goes on."""
    from tenants.services import api_key_issue, tenant_create

    with django_db_blocker.unblock():
        # Two lines at a time, so the batch is still running when its worker is stopped.
        tenant = tenant_create(slug="prestige")
        tenant.quota.max_concurrency = 2
        tenant.quota.save()
        key = api_key_issue(tenant=tenant, name="tests").token
    sdk = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    count = 40
    admitted_before = _admitted(DEPLOYMENT)
    lines = [_chat_line(f"g{i}", f"Line {i}", max_tokens=80, ignore_eos=True) for i in range(count)]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    _wait(sdk, batch.id, until=lambda b: b.request_counts.completed >= 5, timeout=120,
          celery=celery)  # fmt: skip
    assert celery.process is not None
    stopping = celery.process
    try:
        os.killpg(stopping.popen.pid, signal.SIGTERM)
        # A warm shutdown: the step in hand finishes (steps are short), then a clean exit.
        assert stopping.popen.wait(timeout=60) == 0, stopping.tail()
        counts = sdk.batches.retrieve(batch.id).request_counts
    finally:
        celery.start()
    assert counts is not None
    progress = counts.completed
    assert progress < count, "the batch finished before the worker was stopped"
    batch = _wait(sdk, batch.id, until=_ended, timeout=240, celery=celery)
    _all_ran(sdk, batch, celery, count)
    output = _entries(sdk, batch.output_file_id)
    assert sorted(e["custom_id"] for e in output) == sorted(f"g{i}" for i in range(count))
    request_ids = {e["response"]["request_id"] for e in output}
    records = usage_of(*request_ids)
    assert len(records) == count
    assert all(r.status == "ok" and r.completion_tokens == 80 for r in records)
    assert _admitted(DEPLOYMENT) - admitted_before == count  # no line sent twice


def test_a_batch_past_its_completion_window_expires_and_keeps_what_finished(
    stack, world, celery, django_db_blocker
):
    from batches.models import ENDED, Batch
    from batches.selectors import file_pieces

    # Three requests a minute: the window cannot hold twenty lines. The upload and the batch's
    # creation take two of them (every Files and Batch API call counts), so the test follows
    # the batch in the database rather than through the API.
    sdk = openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=world.limited_keys["soylent"], max_retries=0
    )
    count = 20
    lines = [_chat_line(f"w{i}", f"Window {i}") for i in range(count)]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines),
        endpoint="/v1/chat/completions",
        completion_window="1m",  # type: ignore[arg-type]  # OpenAI knows only 24h; we take 1m+
    )
    assert batch.expires_at is not None
    assert 59 <= batch.expires_at - batch.created_at <= 60
    # The window's end brought closer instead of waited out: its steps read it as it stands.
    with django_db_blocker.unblock():
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=10)
        Batch.objects.filter(pk=batch.id).update(expires_at=soon)
        deadline = time.monotonic() + 150
        while (ended := Batch.objects.get(pk=batch.id)).status not in ENDED:
            assert time.monotonic() < deadline, f"batch stuck: {ended.status}\n{_story(celery)}"
            time.sleep(0.3)

        def entries(file_id: str | None) -> list[dict[str, Any]]:
            if file_id is None:
                return []
            content = b"".join(file_pieces(tenant=ended.tenant_id, file_id=file_id))
            return [json.loads(line) for line in content.splitlines()]

        output, errors = entries(ended.output_file_id), entries(ended.error_file_id)
    assert ended.status == "expired"
    assert ended.expired_at is not None and ended.expired_at >= ended.expires_at
    assert 1 <= ended.completed < count
    assert (ended.total, ended.completed + ended.failed) == (count, count)
    assert len(output) == ended.completed
    assert all(e["response"]["status_code"] == 200 for e in output)
    assert len(errors) == ended.failed
    assert {e["error"]["code"] for e in errors if e["error"]} == {"batch_expired"}
    assert {e["custom_id"] for e in output + errors} == {f"w{i}" for i in range(count)}


def _poison(kind: str) -> str:
    """A batch line that no request can run, of one kind."""
    if kind == "nested-json":
        depth = 5000
        return _chat_line("poison", "x").replace('"x"', "[" * depth + "]" * depth)
    if kind == "huge-number":
        return _chat_line("poison", "x").replace('"max_tokens": 8', '"max_tokens": ' + "9" * 5000)
    if kind == "non-object-body":
        return _chat_line("poison", "x").replace('"body": {', '"body": ["not an object"], "_": {')
    if kind == "url-not-allowed":
        return _chat_line("poison", "x").replace("/v1/chat/completions", "/v1/fine_tuning/jobs")
    # A lone surrogate: valid JSON, but no text a request can carry.
    surrogates: dict[str, dict[str, Any]] = {
        "surrogate-content": {"messages": [{"role": "user", "content": "\ud800"}]},
        "surrogate-user": {"user": "\ud800"},
        "surrogate-stop": {"stop": ["\ud800"]},
    }
    return _chat_line("poison", "x", **surrogates[kind])


def _held(tenant_id: int, request_id: str) -> bool:
    """Whether a request still holds a reservation: its held share or a concurrency slot."""
    redis = redis_sync_client()
    tag = f"sy:{{t{tenant_id}}}"
    return bool(
        redis.exists(f"{tag}:held:{request_id}")
        or redis.zscore(f"{tag}:inflight", request_id) is not None
    )


@pytest.mark.parametrize(
    "kind",
    ["surrogate-content", "surrogate-user", "surrogate-stop", "nested-json", "huge-number",
     "non-object-body", "url-not-allowed"],
)  # fmt: skip
def test_a_poison_line_fails_alone(sdk, world, usage_of, kind):
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, [_chat_line("good", "Say hello"), _poison(kind)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = _wait(sdk, batch.id, until=_ended, timeout=90)
    assert batch.status == "completed"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (2, 1, 1)
    (output,) = _entries(sdk, batch.output_file_id)
    assert output["custom_id"] == "good"
    assert output["response"]["status_code"] == 200
    (error,) = _entries(sdk, batch.error_file_id)
    unreadable = kind in ("nested-json", "huge-number")  # not JSON the parser takes
    assert error["custom_id"] == (None if unreadable else "poison")
    failure = error["error"] or error["response"]["body"]["error"]
    assert failure["code"] and failure["message"]
    good_id = output["response"]["request_id"]
    poison_id = error["id"].removeprefix("batch_req_")
    (record,) = usage_of(good_id)
    assert record.status == "ok"
    assert usage_of(poison_id, timeout=1) == []
    # Nothing is left reserved: neither line holds a share of the tenant's limits.
    deadline = time.monotonic() + 15
    while _held(world.acme.pk, good_id) or _held(world.acme.pk, poison_id):
        assert time.monotonic() < deadline, "a reservation was never settled"
        time.sleep(0.2)


def test_a_batch_cancelled_at_once_ends_cancelled_with_counts_that_add_up(sdk):
    lines = [_chat_line(f"v{i}", f"Validate {i}") for i in range(2000)]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    sdk.batches.cancel(batch.id)
    batch = _wait(sdk, batch.id, until=_ended, timeout=90)
    assert batch.status == "cancelled"
    counts = batch.request_counts
    # Its file is read a part per step: cancelled before it was read (0 lines), part-way (the
    # lines read so far) or after, its counts cover every line read and add up.
    assert 0 <= counts.total <= 2000
    assert counts.completed + counts.failed == counts.total


def _files_post(stack: Any, key: str, content: bytes, purpose: str = "batch") -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/v1/files",
        files={"file": ("in.jsonl", content)},
        data={"purpose": purpose},
        headers={"Authorization": f"Bearer {key}"},
    )


@pytest.mark.parametrize(
    ("content", "purpose", "code", "param"),
    [
        (b'{"custom_id": "a"}\n', "fine-tune", "invalid_value", "purpose"),
        (b"\n\n", "batch", "invalid_value", "file"),
        (b"\xff\xfe not utf-8\n", "batch", "invalid_value", "file"),
    ],
)
def test_bad_uploads_are_clear_errors(stack, world, celery, content, purpose, code, param):
    response = _files_post(stack, world.acme_key, content, purpose)
    assert response.status_code == 400, response.text
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (code, param)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"endpoint": "/v1/chat/completions", "completion_window": "24h"}, 400, "input_file_id"),
        ({"input_file_id": "file-nope", "endpoint": "/v1/chat/completions"}, 404, "input_file_id"),
        ({"input_file_id": "F", "endpoint": "/v1/images", "completion_window": "24h"}, 400,
         "endpoint"),
        ({"input_file_id": "F", "endpoint": "/v1/completions", "completion_window": "9y"}, 400,
         "completion_window"),
        ({"input_file_id": "F", "endpoint": "/v1/completions", "output_expires": 3600}, 400,
         "output_expires"),
        ({"input_file_id": "F", "endpoint": "/v1/completions",
          "output_expires_after": {"anchor": "created_at", "seconds": 30}}, 400,
         "output_expires_after.seconds"),
    ],
)  # fmt: skip
def test_bad_batches_are_clear_errors(stack, world, celery, body, status, param):
    uploaded = _files_post(stack, world.acme_key, (_chat_line("a", "b") + "\n").encode()).json()
    body = {k: uploaded["id"] if v == "F" else v for k, v in body.items()}
    response = httpx.post(
        f"{stack.base_url}/v1/batches",
        json=body,
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_another_tenants_files_and_batches_are_not_found(stack, world, sdk):
    file_id = _upload(sdk, [_chat_line("x", "y")])
    batch = sdk.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    other = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.globex_key, max_retries=0)
    for call in (
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in other.batches.list().data]
    _wait(sdk, batch.id, until=_ended)


def test_a_file_downloads_under_its_own_non_ascii_name_and_is_never_sniffed(stack, world):
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    uploaded = httpx.post(
        f"{stack.base_url}/v1/files",
        files={"file": ("données 日本.jsonl", (_chat_line("a", "b") + "\n").encode())},
        data={"purpose": "batch"},
        headers=auth,
    )
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["filename"] == "données 日本.jsonl"
    content = httpx.get(f"{stack.base_url}/v1/files/{uploaded.json()['id']}/content", headers=auth)
    assert content.status_code == 200, content.text
    assert content.headers["content-disposition"] == (
        'attachment; filename="donnees .jsonl"; '
        "filename*=UTF-8''donn%C3%A9es%20%E6%97%A5%E6%9C%AC.jsonl"
    )
    assert content.headers["x-content-type-options"] == "nosniff"


def _responses_line(custom_id: str, text: str, **body: Any) -> str:
    request = {"model": ALIAS, "input": text, "max_output_tokens": 6, "temperature": 0, **body}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": request}
    )


def test_a_batch_of_responses_api_lines_answers_responses_and_stores_them(sdk, world, usage_of):
    lines = [
        _responses_line("kept", "Say hello."),
        _responses_line("not-kept", "Say hi.", store=False),
        _responses_line("chained", "Again.", previous_response_id="resp_" + "0" * 32),
    ]
    batch = sdk.batches.create(
        input_file_id=_upload(sdk, lines), endpoint="/v1/responses", completion_window="24h"
    )
    batch = _wait(sdk, batch.id, until=_ended)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    output = {e["custom_id"]: e["response"] for e in _entries(sdk, batch.output_file_id)}
    kept, not_kept = output["kept"]["body"], output["not-kept"]["body"]
    assert kept["object"] == not_kept["object"] == "response"
    # The trained model may end its answer before max_output_tokens.
    assert kept["output_text"] and 0 < kept["usage"]["output_tokens"] <= 6
    # A stored line's response is there to fetch (and chain on) like any other.
    assert sdk.responses.retrieve(kept["id"]).output_text == kept["output_text"]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(not_kept["id"])
    [chained] = _entries(sdk, batch.error_file_id)
    assert chained["error"]["param"] == "body.previous_response_id"
    records = usage_of(output["kept"]["request_id"], output["not-kept"]["request_id"])
    assert {r.priority for r in records} == {"batch"}
    tokens = {r.request_id: r.completion_tokens for r in records}
    assert tokens[output["kept"]["request_id"]] == kept["usage"]["output_tokens"]


def test_files_go_a_page_at_a_time_are_deleted_and_expire_as_the_sdk_asks(stack, django_db_blocker):
    with django_db_blocker.unblock():
        key = roomy_key("files-pages")
    own = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    data = (_chat_line("a", "b") + "\n").encode()
    first = own.files.create(file=("1.jsonl", io.BytesIO(data)), purpose="batch")
    second = own.files.create(
        file=("2.jsonl", io.BytesIO(data)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    third = own.files.create(file=("3.jsonl", io.BytesIO(data)), purpose="batch")
    assert first.expires_at == first.created_at + 30 * 86400
    assert second.expires_at == second.created_at + 3600
    assert own.files.retrieve(second.id).expires_at == second.expires_at
    # Newest first by default; `order`, `limit` and `after` page through them as OpenAI's do.
    assert [f.id for f in own.files.list()] == [third.id, second.id, first.id]
    page = own.files.list(limit=2, order="asc")
    assert [f.id for f in page.data] == [first.id, second.id] and page.has_more
    assert [f.id for f in page.get_next_page().data] == [third.id]
    assert [f.id for f in own.files.list()] == [third.id, second.id, first.id]  # the SDK's pages
    deleted = own.files.delete(second.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (second.id, True, "file")
    for gone in (lambda: own.files.retrieve(second.id), lambda: own.files.delete(second.id),
                 lambda: own.files.content(second.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            gone()
    assert [f.id for f in own.files.list(order="asc")] == [first.id, third.id]
    # A batch's output file is kept as its `output_expires_after` says.
    batch = own.batches.create(
        input_file_id=first.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    batch = _wait(own, batch.id, until=_ended)
    assert batch.status == "completed", batch
    output = own.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + 7200
    # An ended batch lets its input go and still names it.
    own.files.delete(first.id)
    assert own.batches.retrieve(batch.id).input_file_id == first.id


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"purpose": "batch", "expires_in": "60"}, "expires_in"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at"}, "expires_after.seconds"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at",
          "expires_after[seconds]": "60"}, "expires_after.seconds"),
        ({"purpose": "batch", "expires_after[anchor]": "now",
          "expires_after[seconds]": "3600"}, "expires_after.anchor"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at",
          "expires_after[seconds]": "9" * 5000}, "expires_after.seconds"),
    ],
    ids=["unknown-field", "no-seconds", "under-an-hour", "other-anchor", "thousands-of-digits"],
)  # fmt: skip
def test_an_upload_with_a_field_it_cannot_honour_is_refused_naming_it(
    stack, world, celery, form, param
):
    response = httpx.post(
        f"{stack.base_url}/v1/files",
        files={"file": ("in.jsonl", (_chat_line("a", "b") + "\n").encode())},
        data=form,
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/files?limit=0", "limit"),
        ("/v1/files?limit=10001", "limit"),
        ("/v1/files?limit=%C2%B2", "limit"),  # a digit to str.isdigit, not to int()
        ("/v1/files?limit=" + "9" * 5000, "limit"),
        ("/v1/files?order=sideways", "order"),
        ("/v1/batches?limit=101", "limit"),
        ("/v1/batches?limit=" + "9" * 5000, "limit"),
    ],
    ids=["zero", "past-the-most", "a-digit-to-isdigit", "thousands-of-digits", "order",
         "batches-past-the-most", "batches-thousands-of-digits"],
)  # fmt: skip
def test_a_bad_list_query_is_a_400_naming_it(stack, world, path, param):
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    response = httpx.get(f"{stack.base_url}{path}", headers=auth)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_every_files_and_batches_call_counts_against_the_tenants_requests_per_minute(
    stack, celery, django_db_blocker
):
    with django_db_blocker.unblock():
        key = roomy_key("files-rate", requests_per_minute=3)
    limited = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    data = (_chat_line("a", "b") + "\n").encode()
    uploaded = limited.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    limited.files.list()
    limited.files.retrieve(uploaded.id)
    with pytest.raises(openai.RateLimitError) as refused:
        limited.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert refused.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):
        limited.batches.list()
    with django_db_blocker.unblock():
        from batches.models import File

        assert list(
            File.objects.filter(tenant__slug="files-rate").values_list("pk", flat=True)
        ) == [uploaded.id]


def test_another_tenants_batch_is_not_scheduled_behind_one_tenants_ten_large_ones(
    stack, celery, django_db_blocker
):
    """Finding 5 of the hardening review: one upload of 50,000 lines that all fail validation,
    then ten batches on it, took another tenant's one-line batch from 1.0 s to 64.6 s: each
    batch was validated whole in one step, and each had its own chain of steps in one queue.

    Here each of the ten needs several steps to read its file: the other tenant's batch runs
    (through the engine) and ends before any of them has finished validating."""
    from batches.models import Batch

    per_step = settings.ROUNDHOUSE_BATCH_VALIDATE_LINES
    count = 4 * per_step
    with django_db_blocker.unblock():
        heavy_key, light_key = roomy_key("batch-flood"), roomy_key("batch-victim")
    heavy = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=heavy_key, max_retries=0)
    light = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=light_key, max_retries=0)
    wrong_url = _chat_line("f", "x").replace("/v1/chat/completions", "/v1/embeddings")
    upload = _upload(heavy, [wrong_url.replace('"f"', f'"f{i}"') for i in range(count)])
    floods = [
        heavy.batches.create(
            input_file_id=upload, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(10)
    ]
    victim = light.batches.create(
        input_file_id=_upload(light, [_chat_line("v", "Say hello")]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    done = _wait(light, victim.id, until=_ended, timeout=180, celery=celery)
    assert (done.status, done.request_counts.completed) == ("completed", 1), _story(celery)
    for batch_id in floods:
        _wait(heavy, batch_id, until=_ended, timeout=300, celery=celery)
    with django_db_blocker.unblock():
        ended = Batch.objects.get(pk=victim.id).completed_at
        flood = list(Batch.objects.filter(pk__in=floods).values_list("status", "failed"))
        validated = Batch.objects.filter(pk__in=floods).values_list("in_progress_at", flat=True)
        first = min(at for at in validated if at is not None)
    assert set(flood) == {("completed", count)}
    assert ended is not None
    assert ended < first, "the victim's batch waited until a flood batch was validated"


def test_control_jobs_run_while_every_batch_worker_is_stuck(
    stack, world, celery, django_db_blocker
):
    """Finding 5 of the hardening review: the periodic control jobs (rollout fail-fast,
    purges, sweeps) shared one queue with every tenant's batch steps. Here the batch worker
    makes no progress at all (stopped), and an hourly purge still runs at once."""
    from batches.models import File
    from batches.services import file_create
    from batches.tasks import files_purge

    content = (_chat_line("a", "b") + "\n").encode()
    with django_db_blocker.unblock():
        expired = file_create(
            tenant_id=world.globex.pk, filename="old.jsonl", purpose="batch", content=content
        )
        File.objects.filter(pk=expired.pk).update(expires_at=dt.datetime.now(dt.UTC))
    assert celery.process is not None
    stuck = celery.process.popen.pid
    os.killpg(stuck, signal.SIGSTOP)
    try:
        files_purge.delay()  # as beat sends it
        deadline = time.monotonic() + 60
        with django_db_blocker.unblock():
            while File.objects.filter(pk=expired.pk).exists():
                assert time.monotonic() < deadline, f"the purge never ran\n{_story(celery)}"
                time.sleep(0.3)
    finally:
        os.killpg(stuck, signal.SIGCONT)
