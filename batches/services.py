"""Create files and batches, validate a batch's lines, and write its result files."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from batches.models import (
    Batch,
    BatchLine,
    BatchStatus,
    File,
    FilePurpose,
    LineState,
)
from config.json_body import BodyProblem, json_check, shown
from inference.errors import ApiError, invalid
from inference.openai_format import BYTES_FORMATS
from inference.params import CHAT, COMPLETIONS, embeddings_parse, generation_parse
from inference.responses import RESPONSES, batch_line_parse
from inference.structured import compiled_for
from tenants.models import ApiKey

log = logging.getLogger(__name__)
# The endpoints a batch may call, and how each line's body is checked.
ENDPOINTS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": "embeddings",
    "/v1/responses": RESPONSES,
}
# At most five ASCII digits: 168h is 10080m, and the column holds eight characters.
_WINDOW = re.compile(r"([0-9]{1,5})([mh])")
MAX_WINDOW = dt.timedelta(days=7)


def _file_lines(content: bytes) -> int:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("file", f"The file is not UTF-8 text (byte {exc.start}).") from exc
    return sum(1 for line in text.splitlines() if line.strip())


def file_create(*, tenant_id: int, filename: str, purpose: str, content: bytes) -> File:
    """Store an uploaded batch input file after checking its purpose, size and line count."""
    if purpose != FilePurpose.BATCH:
        raise invalid("purpose", f"'purpose' must be 'batch' here, not {purpose!r}.")
    limit = settings.ROUNDHOUSE_MAX_FILE_BYTES
    if len(content) > limit:
        raise ApiError(
            413, "file_too_large", f"The file is {len(content)} bytes; the limit is {limit}.",
            param="file",
        )  # fmt: skip
    lines = _file_lines(content)
    if lines == 0:
        raise invalid("file", "The file is empty: send one JSON request per line.")
    if lines > settings.ROUNDHOUSE_MAX_FILE_LINES:
        raise invalid(
            "file",
            f"The file has {lines} requests; a batch takes at most "
            f"{settings.ROUNDHOUSE_MAX_FILE_LINES}.",
            code="too_many_lines",
        )
    return File.objects.create(
        tenant_id=tenant_id,
        purpose=purpose,
        filename=filename.replace("\x00", "")[:255] or "upload.jsonl",
        size=len(content),
        lines=lines,
        content=content,
    )


def window_parse(raw: Any) -> dt.timedelta:
    """Return a completion window such as "24h" (OpenAI's) or "30m" as a duration."""
    match = _WINDOW.fullmatch(raw) if isinstance(raw, str) else None
    window = None
    if match:
        amount, unit = int(match[1]), match[2]
        window = dt.timedelta(hours=amount) if unit == "h" else dt.timedelta(minutes=amount)
    if window is None or not dt.timedelta(minutes=1) <= window <= MAX_WINDOW:
        raise invalid(
            "completion_window",
            "'completion_window' must be a duration like '24h' or '30m', from 1m to 168h.",
        )
    return window


def batch_create(
    *,
    tenant_id: int,
    api_key_id: int,
    input_file_id: Any,
    endpoint: Any,
    completion_window: Any,
    metadata: Any = None,
) -> Batch:
    """Create a batch over one of the tenant's files; the batch job validates and runs it."""
    if not isinstance(input_file_id, str):
        raise invalid("input_file_id", "'input_file_id' is required.", "missing_required_parameter")
    if "\x00" in input_file_id:
        raise invalid("input_file_id", "'input_file_id' cannot contain the NUL character.")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise invalid("endpoint", f"'endpoint' must be one of {', '.join(ENDPOINTS)}.")
    window = window_parse(completion_window)
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(
            isinstance(v, str) and len(v) <= 512 and "\x00" not in k + v and _unicode(k + v)
            for k, v in metadata.items()
        )
    ):
        raise invalid("metadata", "'metadata' is up to 16 string values of at most 512 chars.")
    file = File.objects.filter(tenant_id=tenant_id, pk=input_file_id).first()
    if file is None:
        raise ApiError(
            404, "file_not_found", f"No file '{shown(input_file_id)}'.", param="input_file_id"
        )
    if file.purpose != FilePurpose.BATCH:
        raise invalid("input_file_id", f"'{file.id}' is not a batch input file.")
    return Batch.objects.create(
        tenant_id=tenant_id,
        api_key=ApiKey.objects.get(pk=api_key_id, tenant_id=tenant_id),
        endpoint=endpoint,
        input_file=file,
        completion_window=completion_window,
        metadata=metadata or {},
        expires_at=timezone.now() + window,
    )


def batch_cancel(*, batch: Batch) -> Batch:
    """Ask a running batch to stop; its job aborts the in-flight lines and writes the files."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch.pk)
        if batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            batch.status = BatchStatus.CANCELLING
            batch.cancelling_at = timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
        elif batch.status != BatchStatus.CANCELLING:
            raise ApiError(
                409,
                "batch_not_cancellable",
                f"Batch '{batch.id}' is {batch.status} and can no longer be cancelled.",
            )
    return batch


def line_request_id(batch_id: str, index: int) -> str:
    """The request id of a batch line: the same on every attempt to run it."""
    return hashlib.blake2b(f"{batch_id}:{index}".encode(), digest_size=16).hexdigest()


def _line_check(raw: str, *, endpoint: str, seen: set[str]) -> tuple[str, dict[str, Any]]:
    """Return a line's custom_id and request body, or raise an ApiError saying what is wrong."""
    try:
        line = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"The line is not valid JSON: {exc}.") from exc
    except RecursionError as exc:
        raise ApiError(400, "invalid_json", "The line is nested too deeply.") from exc
    if not isinstance(line, dict):
        raise ApiError(400, "invalid_request", "A line must be a JSON object.")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise invalid("custom_id", "Each line needs a string 'custom_id'.", "missing_custom_id")
    if len(custom_id) > 512 or "\x00" in custom_id or not _unicode(custom_id):
        raise invalid(
            "custom_id", "'custom_id' is at most 512 characters of Unicode text, with no NUL."
        )
    if custom_id in seen:
        raise invalid("custom_id", f"custom_id {custom_id!r} is used twice.", "duplicate_custom_id")
    seen.add(custom_id)
    if line.get("method") != "POST":
        raise invalid("method", "'method' must be 'POST'.", "invalid_method")
    if line.get("url") != endpoint:
        raise invalid("url", f"'url' must be the batch's endpoint {endpoint}.", "mismatched_url")
    body = line.get("body")
    if not isinstance(body, dict):
        raise invalid("body", "'body' must be a JSON object.", "invalid_body")
    try:
        json_check(body, root="body")
    except BodyProblem as exc:
        raise ApiError(400, exc.code, exc.message, param=exc.param) from None
    if body.get("stream"):
        raise invalid("body.stream", "Batch requests cannot stream.", "unsupported_parameter")
    kind = ENDPOINTS[endpoint]
    if kind == "embeddings":
        if embeddings_parse(body).encoding_format in BYTES_FORMATS:
            message = "A batch's answers are JSON lines: 'encoding_format' is float or base64."
            raise invalid("body.encoding_format", message)
    elif kind == RESPONSES:
        batch_line_parse(body, response_id=f"resp_{'0' * 32}")
    else:
        generation_parse(body, endpoint=kind)
    return custom_id, body


def _unicode(text: str) -> bool:
    """Whether text is Unicode that PostgreSQL can store (no lone surrogate such as \\ud800)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _custom_id_of(raw: str) -> str:
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    value = line.get("custom_id") if isinstance(line, dict) else None
    if not isinstance(value, str):
        return ""
    # A lone surrogate cannot be stored: it is kept as its escape (\\ud800) instead.
    return value.encode("utf-8", "backslashreplace").decode()[:512].replace("\x00", "")


def batch_validate(*, batch: Batch) -> Batch:
    """Turn the input file into lines: runnable ones pending, malformed ones failed at once.

    A malformed line is an entry in the error file, not a failed batch. Validation runs once:
    a batch that already has lines (a resumed job) is left as it is.
    """
    if batch.lines.exists():
        return batch
    text = bytes(batch.input_file.content).decode("utf-8")
    seen: set[str] = set()
    now = timezone.now()
    lines = []
    for index, raw in enumerate(r for r in text.splitlines() if r.strip()):
        line = BatchLine(batch=batch, index=index, request_id=line_request_id(batch.id, index))
        try:
            with compiled_for(batch.tenant_id):
                line.custom_id, line.body = _line_check(raw, endpoint=batch.endpoint, seen=seen)
        except Exception as exc:
            # Whatever a line holds, it fails alone: never the batch, nor its other lines.
            error = exc if isinstance(exc, ApiError) else None
            if error is None:
                log.exception("batch %s: line %d could not be read", batch.id, index + 1)
                error = ApiError(400, "invalid_request", "The request could not be read.")
            line.custom_id = _custom_id_of(raw)
            line.state, line.ended_at = LineState.FAILED, now
            line.error = {
                "code": error.code,
                "message": f"Line {index + 1}: {error.message}",
                "param": error.param,
                "line": index + 1,
            }
        lines.append(line)
    with transaction.atomic():
        BatchLine.objects.bulk_create(lines, batch_size=2000)
        # Counted even if the batch was cancelled meanwhile: its counts cover every line read.
        Batch.objects.filter(pk=batch.pk).update(total=len(lines))
        Batch.objects.filter(pk=batch.pk, status=BatchStatus.VALIDATING).update(
            status=BatchStatus.IN_PROGRESS, in_progress_at=now
        )
    counts_refresh(batch=batch)
    batch.refresh_from_db()
    return batch


def counts_refresh(*, batch: Batch) -> None:
    """Recount the batch's completed and failed lines from the lines themselves."""
    counts = batch.lines.aggregate(
        completed=Count("pk", filter=Q(state=LineState.SUCCEEDED)),
        failed=Count(
            "pk", filter=Q(state__in=[LineState.FAILED, LineState.CANCELLED, LineState.EXPIRED])
        ),
    )
    Batch.objects.filter(pk=batch.pk).update(**counts)


def _entry(line: BatchLine) -> dict[str, Any]:
    response = None
    if line.result is not None:
        response = {"request_id": line.request_id, **line.result}
    return {
        "id": f"batch_req_{line.request_id}",
        "custom_id": line.custom_id or None,
        "response": response,
        "error": line.error,
    }


def _jsonl(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)


def batch_finalize(*, batch: Batch, status: str) -> Batch:
    """Write the output and error files (in line order) and end the batch with a status.

    Lines still pending end as cancelled or expired with the batch.
    """
    now = timezone.now()
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.FINALIZING, finalizing_at=now)
    leftover = {
        BatchStatus.CANCELLED: (LineState.CANCELLED, "batch_cancelled", "The batch was cancelled."),
        BatchStatus.EXPIRED: (
            LineState.EXPIRED,
            "batch_expired",
            "The batch's completion window ended before this request ran.",
        ),
        BatchStatus.FAILED: (
            LineState.FAILED,
            "batch_failed",
            "The batch failed before this request could run.",
        ),
    }.get(BatchStatus(status))
    if leftover is not None:
        state, code, message = leftover
        batch.lines.filter(state__in=[LineState.PENDING, LineState.SUBMITTED]).update(
            state=state, error={"code": code, "message": message}, ended_at=now
        )
    done: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for line in batch.lines.order_by("index").iterator(chunk_size=2000):
        (done if line.state == LineState.SUCCEEDED else failed).append(_entry(line))
    with transaction.atomic():
        if done:
            batch.output_file = _result_file(batch, "output", done)
        if failed:
            batch.error_file = _result_file(batch, "error", failed)
        # Counted in the same commit as the status: a client that sees the batch ended sees
        # its final counts too.
        counts_refresh(batch=batch)
        batch.status = status
        setattr(batch, f"{status}_at", timezone.now())
        batch.save(update_fields=["output_file", "error_file", "status", f"{status}_at"])
    batch.refresh_from_db()
    return batch


def batch_fail(*, batch: Batch, message: str) -> Batch:
    """End a batch that cannot go on as failed, saying why; its unfinished lines fail with it."""
    error = {"code": "batch_failed", "message": message, "param": None, "line": None}
    Batch.objects.filter(pk=batch.pk).update(errors={"object": "list", "data": [error]})
    return batch_finalize(batch=batch, status=BatchStatus.FAILED)


def _result_file(batch: Batch, kind: str, entries: list[dict[str, Any]]) -> File:
    content = _jsonl(entries)
    return File.objects.create(
        tenant_id=batch.tenant_id,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch.id}_{kind}.jsonl",
        size=len(content),
        lines=len(entries),
        content=content,
    )
