"""Files and batches below the API: limits, windows, line validation and the result files."""

from __future__ import annotations

import datetime as dt
import io
import json
import tracemalloc
from typing import Any

import pytest
from django.conf import settings
from django.db.models import Sum
from django.test import override_settings
from django.utils import timezone

from batches import selectors, services
from batches.models import (
    FILE_CHUNK_BYTES,
    Batch,
    BatchLine,
    BatchStatus,
    File,
    FileChunk,
    LineState,
)
from batches.selectors import file_pieces
from batches.services import (
    batch_cancel,
    batch_create,
    batch_finalize,
    batch_validate,
    expires_after_parse,
    file_create,
    file_delete,
    files_purge,
    line_request_id,
    window_parse,
)
from batches.tasks import files_purge as files_purge_task
from inference.base.errors import ApiError
from tenants.models import ApiKey
from tenants.services import api_key_issue, tenant_create

pytestmark = pytest.mark.django_db


def _line(custom_id: str, **body: object) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny-chat", "prompt": "x", "max_tokens": 2, **body},
        }
    )


def _batch(world, lines: list[str], *, endpoint: str = "/v1/completions") -> Batch:
    content = ("\n".join(lines) + "\n").encode()
    file = file_create(
        tenant_id=world.acme.pk, filename="in.jsonl", purpose="batch", content=content
    )
    return batch_create(
        tenant_id=world.acme.pk,
        api_key_id=ApiKey.objects.filter(tenant=world.acme).values_list("pk", flat=True)[0],
        input_file_id=file.id,
        endpoint=endpoint,
        completion_window="24h",
    )


def _content(file: File) -> bytes:
    return b"".join(file_pieces(tenant=file.tenant_id, file_id=file.id))


@override_settings(ROUNDHOUSE_MAX_FILE_BYTES=100)
def test_a_file_over_the_size_limit_is_a_413(world):
    with pytest.raises(ApiError) as refused:
        file_create(tenant_id=world.acme.pk, filename="f", purpose="batch", content=b"x" * 101)
    assert (refused.value.status, refused.value.param) == (413, "file")


@override_settings(ROUNDHOUSE_MAX_FILE_LINES=3)
def test_a_file_over_the_line_limit_names_its_count(world):
    with pytest.raises(ApiError) as refused:
        file_create(tenant_id=world.acme.pk, filename="f", purpose="batch", content=b"{}\n" * 4)
    assert refused.value.code == "too_many_lines"
    assert "4 requests" in refused.value.message


@pytest.mark.parametrize(
    ("raw", "minutes"), [("24h", 1440), ("30m", 30), ("168h", 10080), ("1m", 1)]
)
def test_completion_windows(raw, minutes):
    assert window_parse(raw) == dt.timedelta(minutes=minutes)


@pytest.mark.parametrize("raw", ["0m", "169h", "1d", "24", 24, None, "h"])
def test_bad_completion_windows(raw):
    with pytest.raises(ApiError) as refused:
        window_parse(raw)
    assert refused.value.param == "completion_window"


def test_validation_turns_each_line_into_a_pending_or_failed_line(world):
    batch = _batch(
        world,
        [
            _line("a"),
            "[1, 2]",
            _line("b", temperature=9),
            _line("c", stream=True),
            json.dumps({"custom_id": "d", "method": "GET", "url": "/v1/completions", "body": {}}),
            _line("e"),
        ],
    )
    batch = batch_validate(batch=batch)
    assert batch.status == BatchStatus.IN_PROGRESS
    assert (batch.total, batch.failed) == (6, 4)
    lines = {line.index: line for line in batch.lines.all()}
    assert [lines[i].state for i in range(6)] == [
        LineState.PENDING, LineState.FAILED, LineState.FAILED,
        LineState.FAILED, LineState.FAILED, LineState.PENDING,
    ]  # fmt: skip
    errors = {i: line.error or {} for i, line in lines.items()}
    assert errors[2]["param"] == "temperature"
    assert errors[3]["param"] == "body.stream"
    assert errors[4]["code"] == "invalid_method"
    assert lines[0].request_id == line_request_id(batch.id, 0) != lines[5].request_id
    # Validating again (a resumed job) changes nothing.
    assert batch_validate(batch=batch).lines.count() == 6


def test_finalizing_a_cancelled_batch_writes_both_files_in_line_order(world):
    batch = batch_validate(batch=_batch(world, [_line("a"), _line("b"), "oops"]))
    BatchLine.objects.filter(batch=batch, index=0).update(
        # Model output may hold NUL characters (jsonb refuses them): they must round-trip.
        state=LineState.SUCCEEDED,
        result={"status_code": 200, "body": {"text": "a\x00b"}},
    )
    batch = batch_cancel(batch=batch)
    assert batch.status == BatchStatus.CANCELLING
    batch = batch_finalize(batch=batch, status=BatchStatus.CANCELLED)
    assert (batch.status, batch.completed, batch.failed) == ("cancelled", 1, 2)
    assert batch.cancelled_at is not None
    assert batch.output_file is not None and batch.error_file is not None
    output = [json.loads(x) for x in _content(batch.output_file).splitlines()]
    errors = [json.loads(x) for x in _content(batch.error_file).splitlines()]
    assert [o["custom_id"] for o in output] == ["a"]
    assert output[0]["response"]["request_id"] == line_request_id(batch.id, 0)
    assert output[0]["response"]["body"] == {"text": "a\x00b"}
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("b", "batch_cancelled"),
        (None, "invalid_json"),
    ]
    with pytest.raises(ApiError) as refused:
        batch_cancel(batch=batch)
    assert refused.value.status == 409


def _raw(custom_id: str, body: str) -> str:
    return (
        f'{{"custom_id": "{custom_id}", "method": "POST", "url": "/v1/completions", '
        f'"body": {body}}}'
    )


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (_raw("s", '{"model": "m", "prompt": "\\ud800", "max_tokens": 2}'), "invalid_value",
         "body.prompt"),
        (_raw("u", '{"model": "m", "prompt": "x", "user": "\\udfff"}'), "invalid_value",
         "body.user"),
        (_raw("t", '{"model": "m", "prompt": "x", "stop": ["\\ud800"]}'), "invalid_value",
         "body.stop[0]"),
        (_raw("k", '{"model": "m", "prompt": "x", "metadata": {"\\ud800": 1}}'),
         "invalid_value", "body.metadata.\ufffd"),
        (_raw("\\ud800", '{"model": "m", "prompt": "x"}'), "invalid_value", "custom_id"),
        (_raw("n", '{"model": "m", "prompt": "x", "extra": ' + "[" * 100 + "]" * 100 + "}"),
         "invalid_json", "body"),
        (_raw("r", '{"model": "m", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"), "invalid_json",
         None),
        (_raw("h", '{"model": "m", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}"),
         "invalid_json", None),
        (_raw("b", '"just text"'), "invalid_body", "body"),
    ],
    ids=["surrogate-prompt", "surrogate-user", "surrogate-stop", "surrogate-key",
         "surrogate-custom-id", "nested-body", "nested-line", "huge-number", "non-object"],
)  # fmt: skip
def test_validation_fails_a_poison_line_alone(world, raw, code, param):
    batch = batch_validate(batch=_batch(world, [_line("good"), raw]))
    assert (batch.status, batch.total, batch.failed) == (BatchStatus.IN_PROGRESS, 2, 1)
    good, poison = batch.lines.order_by("index")
    assert good.state == LineState.PENDING
    assert poison.state == LineState.FAILED
    assert poison.error is not None
    assert (poison.error["code"], poison.error["param"]) == (code, param)
    # The error file can be written: a finalized batch reads back every line.
    batch = batch_finalize(batch=batch, status=BatchStatus.CANCELLED)
    assert batch.error_file is not None
    assert len(_content(batch.error_file).splitlines()) == 2


def test_metadata_with_a_lone_surrogate_is_refused(world):
    with pytest.raises(ApiError) as refused:
        batch_create(
            tenant_id=world.acme.pk,
            api_key_id=ApiKey.objects.filter(tenant=world.acme).values_list("pk", flat=True)[0],
            input_file_id=_batch(world, [_line("a")]).input_file_id,
            endpoint="/v1/completions",
            completion_window="24h",
            metadata={"job": "\ud800"},
        )
    assert (refused.value.status, refused.value.param) == (400, "metadata")


def test_an_embeddings_line_asking_for_vllms_binary_answer_fails_alone(world):
    """A batch's answers are JSON lines: the bytes formats have no place in them."""

    def line(custom_id: str, encoding_format: str) -> str:
        body = {"model": "minilm", "input": "x", "encoding_format": encoding_format}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}
        )

    lines = [line("b64", "base64"), line("bytes", "bytes"), line("only", "bytes_only")]
    batch = batch_validate(batch=_batch(world, lines, endpoint="/v1/embeddings"))
    states = [(x.state, x.error and x.error["param"]) for x in batch.lines.order_by("index")]
    assert states == [
        (LineState.PENDING, None),
        (LineState.FAILED, "body.encoding_format"),
        (LineState.FAILED, "body.encoding_format"),
    ]


# --- validation in bounded steps ----------------------------------------------------------------


def _invalid(custom_id: str) -> str:
    """A line that fails validation: its url is not the batch's endpoint."""
    return _line(custom_id).replace("/v1/completions", "/v1/embeddings")


def _validated(batch: Batch, *, most: int = 100, until: float | None = None) -> list[int]:
    """Validate a batch step by step until its file is read; return the lines each step read."""
    read: list[int] = []
    while batch.status == BatchStatus.VALIDATING:
        assert len(read) < most, "validation never reached the end of the file"
        before = batch.total
        batch = batch_validate(batch=batch, until=until)
        read.append(batch.total - before)
    return read


def test_a_large_file_of_failing_lines_is_validated_over_bounded_steps(world):
    """Finding 5 of the hardening review: one step validated a whole file, 50,000 failing lines
    holding a Celery worker (and every tenant's batches behind it) for seconds on end."""
    limit = settings.ROUNDHOUSE_BATCH_VALIDATE_LINES
    count = 4 * limit + 7
    batch = _batch(world, [_invalid(f"x{i}") for i in range(count)])
    first = batch_validate(batch=batch)
    assert (first.status, first.total, first.failed) == (BatchStatus.VALIDATING, limit, limit)
    assert first.lines.count() == limit
    assert [*_validated(first)] == [limit, limit, limit, 7]
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.failed) == (BatchStatus.IN_PROGRESS, count, count)
    assert batch.validated_bytes == File.objects.get(pk=batch.input_file_id).size
    errors = list(batch.lines.order_by("index").values_list("index", "custom_id", "error"))
    assert [(i, cid) for i, cid, _ in errors] == [(i, f"x{i}") for i in range(count)]
    assert {(e and e["code"], e and e["line"] - i) for i, _, e in errors} == {("mismatched_url", 1)}


def test_a_step_whose_time_is_up_still_reads_a_line(world):
    """Out of time from the start (one slow line), each step still gets one line further."""
    batch = _batch(world, [_line("a"), _invalid("b"), _line("c")])
    assert _validated(batch, until=0.0) == [1, 1, 1]
    batch.refresh_from_db()
    assert (batch.status, batch.total, batch.failed) == (BatchStatus.IN_PROGRESS, 3, 1)


@override_settings(ROUNDHOUSE_BATCH_VALIDATE_LINES=2)
def test_a_custom_id_taken_in_an_earlier_step_is_a_duplicate_in_a_later_one(world):
    lines = [
        _line("a"),
        _invalid("b"),  # the line fails, but it took its custom_id
        _raw("c\\u0000", '{"model": "m", "prompt": "x"}'),  # its id is refused: it takes none
        _line("e"),
        _line("c"),
        _line("a"),
        _line("b"),
        _line("d"),
        _line("d"),
    ]
    batch = _batch(world, lines)
    assert _validated(batch) == [2, 2, 2, 2, 1]
    found = [
        (line.custom_id, line.state, line.error and line.error["code"])
        for line in batch.lines.order_by("index")
    ]
    assert found == [
        ("a", LineState.PENDING, None),
        ("b", LineState.FAILED, "mismatched_url"),
        ("c", LineState.FAILED, "invalid_value"),
        ("e", LineState.PENDING, None),
        ("c", LineState.PENDING, None),
        ("a", LineState.FAILED, "duplicate_custom_id"),
        ("b", LineState.FAILED, "duplicate_custom_id"),
        ("d", LineState.PENDING, None),
        ("d", LineState.FAILED, "duplicate_custom_id"),
    ]
    duplicate = batch.lines.get(index=5)
    assert duplicate.body is None
    assert duplicate.error == {
        "code": "duplicate_custom_id",
        "message": "Line 6: custom_id 'a' is used twice.",
        "param": "custom_id",
        "line": 6,
    }


@override_settings(ROUNDHOUSE_BATCH_VALIDATE_LINES=3)
def test_lines_are_the_same_however_the_file_is_cut_into_steps(world, monkeypatch):
    """Line breaks of every kind str.splitlines knows, and characters of up to four bytes, read
    five bytes at a time: the lines and their numbers are those the upload counted."""
    from batches import services

    def line(custom_id: str) -> str:
        body = {"model": "m", "prompt": f"dites {custom_id}", "max_tokens": 2}
        raw = {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}
        return json.dumps(raw, ensure_ascii=False)

    monkeypatch.setattr(services, "FILE_CHUNK_BYTES", 5)  # stored, and read, in 5-byte chunks
    text = (
        line("é") + "\r\n\r\n"
        + line("日本") + "\r"
        + line("🚂") + "\u2028  \n"
        + line("ü") + "\x0c\x1c\x85\n"
        + line("end")  # no line break at the end
    )  # fmt: skip
    file = file_create(
        tenant_id=world.acme.pk, filename="f", purpose="batch", content=text.encode()
    )
    expected = [raw for raw in text.splitlines() if raw.strip()]
    assert file.lines == len(expected) == 5
    batch = batch_create(
        tenant_id=world.acme.pk,
        api_key_id=ApiKey.objects.filter(tenant=world.acme).values_list("pk", flat=True)[0],
        input_file_id=file.id,
        endpoint="/v1/completions",
        completion_window="24h",
    )
    assert _validated(batch) == [3, 2]
    lines = list(batch.lines.order_by("index"))
    assert [x.custom_id for x in lines] == ["é", "日本", "🚂", "ü", "end"]
    assert [x.state for x in lines] == [LineState.PENDING] * 5
    assert [x.body for x in lines] == [json.loads(raw)["body"] for raw in expected]


# --- keeping files: expiry, deletion, the tenant's storage ------------------------------------


def _upload(tenant_id: int, content: bytes = b"{}\n", expires_seconds: int | None = None) -> File:
    return file_create(tenant_id=tenant_id, filename="f", purpose="batch", content=content,
                       expires_seconds=expires_seconds)  # fmt: skip


def test_a_file_expires_after_30_days_or_when_its_upload_says(world):
    before = timezone.now()
    kept = _upload(world.acme.pk)
    assert kept.expires_at is not None
    assert before + dt.timedelta(days=30) <= kept.expires_at <= timezone.now() + dt.timedelta(30)
    hour = _upload(world.acme.pk, expires_seconds=3600)
    assert hour.expires_at is not None
    assert (hour.expires_at - hour.created_at).total_seconds() == pytest.approx(3600, abs=1)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ("3600", "expires_after"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
        ({"seconds": 3600}, "expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3599}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2_592_001}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": "3600"}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": True}, "expires_after.seconds"),
        ({"anchor": "created_at"}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 3600, "days": 1}, "expires_after.days"),
    ],
    ids=["not-an-object", "other-anchor", "no-anchor", "under-an-hour", "over-30-days",
         "seconds-as-text", "seconds-as-boolean", "no-seconds", "unknown-field"],
)  # fmt: skip
def test_a_bad_expiry_policy_is_a_400_naming_its_field(raw, param):
    with pytest.raises(ApiError) as refused:
        expires_after_parse(raw, "expires_after")
    assert (refused.value.status, refused.value.param) == (400, param)
    assert expires_after_parse(None, "expires_after") is None
    assert expires_after_parse({"anchor": "created_at", "seconds": 2_592_000}, "x") == 2_592_000


def test_a_tenants_files_stay_within_its_storage_and_spare_the_others(world, settings):
    settings.ROUNDHOUSE_TENANT_FILE_BYTES = 10
    one, other = tenant_create(slug="files-room-1"), tenant_create(slug="files-room-2")
    _upload(one.pk, b"{}\n{}\n")  # 6 bytes
    with pytest.raises(ApiError) as refused:
        _upload(one.pk, b"{}\n{}\n")
    assert (refused.value.status, refused.value.code) == (400, "storage_limit_exceeded")
    assert "hold 6 bytes" in refused.value.message
    _upload(other.pk, b"{}\n{}\n")  # another tenant's room is its own
    _upload(one.pk, b"{}\n")  # what fits still goes in: 9 of 10
    File.objects.filter(tenant=one, size=6).delete()
    _upload(one.pk, b"{}\n{}\n")  # room again once files go


def test_a_file_is_deleted_once_no_running_batch_reads_it(world):
    batch = _batch(world, [_line("a")])
    with pytest.raises(ApiError) as refused:
        file_delete(tenant_id=world.acme.pk, file_id=batch.input_file_id)
    assert (refused.value.status, refused.value.code) == (409, "file_in_use")
    assert batch.id in refused.value.message
    with pytest.raises(ApiError) as foreign:
        file_delete(tenant_id=world.globex.pk, file_id=batch.input_file_id)
    assert (foreign.value.status, foreign.value.param) == (404, "file_id")
    BatchLine.objects.all().delete()
    batch = batch_finalize(batch=batch_validate(batch=batch), status=BatchStatus.CANCELLED)
    assert file_delete(tenant_id=world.acme.pk, file_id=batch.input_file_id) == batch.input_file_id
    assert not File.objects.filter(pk=batch.input_file_id).exists()
    # The ended batch still names its input, as OpenAI's does; its error file can go too.
    batch.refresh_from_db()
    assert batch.input_file_id is not None and batch.error_file_id is not None
    file_delete(tenant_id=world.acme.pk, file_id=batch.error_file_id)
    batch.refresh_from_db()
    assert batch.error_file_id is None
    with pytest.raises(ApiError) as gone:
        file_delete(tenant_id=world.acme.pk, file_id="file-\x00")
    assert gone.value.status == 404


def test_a_batch_over_a_file_deleted_meanwhile_fails_saying_so(world):
    batch = _batch(world, [_line("a")])
    File.objects.filter(pk=batch.input_file_id).delete()
    batch = batch_validate(batch=batch)
    assert batch.status == BatchStatus.FAILED and batch.errors is not None
    assert "is gone" in batch.errors["data"][0]["message"]


def test_the_purge_deletes_expired_files_but_those_a_running_batch_reads(world):
    running = _batch(world, [_line("a")])
    expired = _upload(world.acme.pk)
    fresh = _upload(world.acme.pk)
    past = timezone.now() - dt.timedelta(seconds=1)
    File.objects.filter(pk__in=[running.input_file_id, expired.pk]).update(expires_at=past)
    assert files_purge(chunk=1) == 1
    ids = (running.input_file_id, expired.pk, fresh.pk)
    assert set(File.objects.filter(pk__in=ids).values_list("pk", flat=True)) == {
        running.input_file_id,
        fresh.pk,
    }
    batch_finalize(batch=running, status=BatchStatus.CANCELLED)
    assert files_purge() == 1
    assert not File.objects.filter(pk=running.input_file_id).exists()
    entry = settings.CELERY_BEAT_SCHEDULE["batches-files-purge"]
    assert entry["task"] == files_purge_task.name


def test_a_batchs_result_files_expire_as_its_output_expires_after_says(world):
    file = _upload(world.acme.pk, (_line("a") + "\n").encode())
    key_id = ApiKey.objects.filter(tenant=world.acme).values_list("pk", flat=True)[0]

    def create(seconds: int) -> Batch:
        policy = {"anchor": "created_at", "seconds": seconds}
        return batch_create(tenant_id=world.acme.pk, api_key_id=key_id, input_file_id=file.id,
                            endpoint="/v1/completions", completion_window="24h",
                            output_expires_after=policy)  # fmt: skip

    batch = batch_finalize(batch=batch_validate(batch=create(7200)), status=BatchStatus.CANCELLED)
    error_file = File.objects.get(pk=batch.error_file_id)
    assert error_file.expires_at is not None
    kept = error_file.expires_at - error_file.created_at
    assert kept.total_seconds() == pytest.approx(7200, abs=1)
    with pytest.raises(ApiError) as refused:
        create(60)
    assert refused.value.param == "output_expires_after.seconds"


# --- a file's bytes in chunks; result files written in pieces, within the storage bound -------


def _tenant_batch(slug: str, lines: list[str]) -> Batch:
    """A validated batch of a tenant of its own (so its files are all the tenant holds)."""
    tenant = tenant_create(slug=slug)
    key = api_key_issue(tenant=tenant, name="batches").key
    file = file_create(tenant_id=tenant.pk, filename="in.jsonl", purpose="batch",
                       content=io.BytesIO(("\n".join(lines) + "\n").encode()))  # fmt: skip
    batch = batch_create(tenant_id=tenant.pk, api_key_id=key.pk, input_file_id=file.id,
                         endpoint="/v1/completions", completion_window="24h")  # fmt: skip
    return batch_validate(batch=batch)


def _answered(batch: Batch, *indexes: int, text: str) -> None:
    """Mark lines succeeded with an answer holding `text`."""
    result = {"status_code": 200, "body": {"object": "text_completion", "text": text}}
    BatchLine.objects.filter(batch=batch, index__in=indexes).update(
        state=LineState.SUCCEEDED, result=result
    )


def _chunk_sizes(file: File) -> list[int]:
    rows = FileChunk.objects.filter(file=file).order_by("seq").values_list("seq", "data")
    assert [seq for seq, _ in rows] == list(range(len(rows)))
    return [len(data) for _, data in rows]


def _stored(tenant_id: int) -> int:
    return File.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("size"))["total"] or 0


def test_an_upload_is_stored_and_read_back_a_chunk_at_a_time(world, monkeypatch):
    # Lines of 600 kB of two-byte characters: chunk edges fall inside lines and characters.
    lines = [_line(f"l{i}", prompt="é" * 300_000) for i in range(6)]
    content = ("\n".join(lines) + "\n").encode()
    reads: list[int] = []
    chunk_read = selectors.file_chunk

    def counted(**kwargs: Any) -> bytes | None:
        data = chunk_read(**kwargs)
        reads.append(-1 if data is None else len(data))
        return data

    monkeypatch.setattr(selectors, "file_chunk", counted)
    batch = _tenant_batch("files-in-chunks", lines)
    file = File.objects.get(pk=batch.input_file_id)
    assert (file.size, file.lines) == (len(content), 6)
    whole, rest = divmod(len(content), FILE_CHUNK_BYTES)
    assert _chunk_sizes(file) == [FILE_CHUNK_BYTES] * whole + [rest]
    # Validation read it a chunk at a time, and every line came out whole.
    assert reads == [FILE_CHUNK_BYTES] * whole + [rest]
    assert (batch.total, batch.failed) == (6, 0)
    assert [x.custom_id for x in batch.lines.order_by("index")] == [f"l{i}" for i in range(6)]
    assert _content(file) == content


def test_a_batchs_result_files_are_written_in_chunks_and_count_against_storage(world, settings):
    batch = _tenant_batch("results-in-chunks", [_line(f"l{i}") for i in range(5)])
    _answered(batch, 0, 1, 3, 4, text="y" * 700_000)
    batch = batch_finalize(batch=batch, status=BatchStatus.CANCELLED)
    assert (batch.status, batch.completed, batch.failed) == ("cancelled", 4, 1)
    assert batch.output_file is not None and batch.error_file is not None
    output = _content(batch.output_file)
    assert [json.loads(x)["custom_id"] for x in output.splitlines()] == ["l0", "l1", "l3", "l4"]
    assert (batch.output_file.size, batch.output_file.lines) == (len(output), 4)
    whole, rest = divmod(len(output), FILE_CHUNK_BYTES)
    assert _chunk_sizes(batch.output_file) == [FILE_CHUNK_BYTES] * whole + [rest]
    # The result files count against the tenant's storage as its uploads do.
    held = _stored(batch.tenant_id)
    assert held == File.objects.get(pk=batch.input_file_id).size + len(output) + (
        batch.error_file.size
    )
    settings.ROUNDHOUSE_TENANT_FILE_BYTES = held + 5
    with pytest.raises(ApiError) as refused:
        _upload(batch.tenant_id, b"{}\n{}\n")
    assert refused.value.code == "storage_limit_exceeded"
    assert f"hold {held} bytes" in refused.value.message


def test_a_batchs_output_is_never_whole_in_the_workers_memory(world):
    count, size = 48, 1024 * 1024
    batch = _tenant_batch("results-in-memory", [_line(f"l{i}") for i in range(count)])
    _answered(batch, *range(count), text="z" * size)
    tracemalloc.start()
    try:
        batch = batch_finalize(batch=batch, status=BatchStatus.COMPLETED)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert batch.output_file is not None and batch.output_file.size > count * size
    # Loosely: a page of lines and a chunk or two, not the 48 MiB file (once or several times).
    assert peak < count * size / 2, f"finalizing peaked at {peak} bytes"


def test_a_batch_whose_results_would_pass_the_tenants_storage_ends_failed_saying_so(
    world, settings
):
    batch = _tenant_batch("results-past-room", [_line(f"l{i}") for i in range(4)])
    _answered(batch, 0, 1, 2, 3, text="w" * 1000)
    one = len(_entry(BatchLine.objects.get(batch=batch, index=0)))
    # Room for the input and two answers, not three.
    limit = settings.ROUNDHOUSE_TENANT_FILE_BYTES = _stored(batch.tenant_id) + 2 * one + one // 2
    batch = batch_finalize(batch=batch, status=BatchStatus.COMPLETED)
    assert batch.status == BatchStatus.FAILED and batch.failed_at is not None
    assert batch.errors is not None
    (error,) = batch.errors["data"]
    assert (error["code"], error["line"]) == ("storage_limit_exceeded", 3)
    assert "stop before line 3" in error["message"] and str(limit) in error["message"]
    # Every line ran and is counted so; the output holds those before the cut, in order.
    assert (batch.completed, batch.failed, batch.total) == (4, 0, 4)
    assert batch.output_file is not None and batch.error_file is None
    output = _content(batch.output_file)
    assert [json.loads(x)["custom_id"] for x in output.splitlines()] == ["l0", "l1"]
    assert _stored(batch.tenant_id) <= limit


def _entry(line: BatchLine) -> bytes:
    return json.dumps(services._entry(line), separators=(",", ":")).encode() + b"\n"
