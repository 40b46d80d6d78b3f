"""Create files and batches, validate a batch's lines, and write its result files."""

from __future__ import annotations

import codecs
import datetime as dt
import hashlib
import io
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce, Length
from django.utils import timezone

from batches import jsonl, selectors
from batches.models import (
    ENDED,
    FILE_CHUNK_BYTES,
    Batch,
    BatchLine,
    BatchStatus,
    File,
    FileChunk,
    FilePurpose,
    LineState,
)
from config.json_body import BodyProblem, json_check, shown
from inference.base.errors import ApiError, invalid, unrecognized
from inference.body.fields import CHAT, COMPLETIONS
from inference.body.parser import generation_parse
from inference.body.tools import compiled_for
from inference.embeddings.format import BYTES_FORMATS
from inference.embeddings.protocol import embeddings_parse
from inference.responses.protocol import RESPONSES, batch_line_parse
from tenants.models import ApiKey, Tenant

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
# OpenAI's bounds on a file's `expires_after` and a batch's `output_expires_after`, in seconds;
# a batch file with neither is kept for the longest, as OpenAI keeps it.
EXPIRES_LEAST = 3600
EXPIRES_MOST = 30 * 24 * 3600
_EXPIRES_FIELDS = ("anchor", "seconds")
# The body fields of POST /v1/batches; any other is refused, naming it.
BATCH_FIELDS = frozenset(
    ("input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after")
)


def _pieces(stream: IO[bytes]) -> Iterator[bytes]:
    """Read a file object from its start, a chunk at a time."""
    stream.seek(0)
    return iter(lambda: stream.read(FILE_CHUNK_BYTES), b"")


def _file_lines(stream: IO[bytes]) -> int:
    try:
        return sum(1 for _ in jsonl.lines(_pieces(stream)))
    except jsonl.NotText as exc:
        raise invalid("file", f"The file is not UTF-8 text (byte {exc.at}).") from exc


def expires_after_parse(raw: Any, field: str) -> int | None:
    """The seconds of an expiry policy (`{"anchor": "created_at", "seconds": N}`), or None."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid(field, f"'{field}' must be an object with 'anchor' and 'seconds'.")
    for name in raw:
        if name not in _EXPIRES_FIELDS:
            raise unrecognized(f"{field}.{name}")
    if raw.get("anchor") != "created_at":
        raise invalid(f"{field}.anchor", f"'{field}.anchor' must be 'created_at'.")
    seconds = raw.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not EXPIRES_LEAST <= seconds <= EXPIRES_MOST
    ):
        raise invalid(
            f"{field}.seconds",
            f"'{field}.seconds' must be an integer from {EXPIRES_LEAST} (1 hour) to "
            f"{EXPIRES_MOST} (30 days).",
        )
    return seconds


def _tenant_lock(tenant_id: int) -> None:
    """Hold the tenant's row to the transaction's end: one upload at a time checks its room."""
    if not Tenant.objects.select_for_update().filter(pk=tenant_id).exists():
        raise ApiError(401, "invalid_api_key", "The key's tenant no longer exists.")


def _room_check(tenant_id: int, size: int) -> None:
    """Refuse an upload that would take the tenant's files past their storage limit."""
    limit = settings.ROUNDHOUSE_TENANT_FILE_BYTES
    used = File.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("size"))["total"] or 0
    if used + size > limit:
        raise ApiError(
            400,
            "storage_limit_exceeded",
            f"The tenant's files hold {used} bytes and this one {size}; together they may hold "
            f"{limit}. Delete files (DELETE /v1/files/{{file_id}}) to make room.",
            param="file",
        )


def file_create(
    *,
    tenant_id: int,
    filename: str,
    purpose: str,
    content: bytes | IO[bytes],
    expires_seconds: int | None = None,
) -> File:
    """Store an uploaded batch input file after checking its purpose, size and line count.

    `content` is the bytes or a seekable file object (an upload spooled to disk), read a chunk
    at a time: once to check it, once to store it in chunks. The tenant's files together stay
    within ROUNDHOUSE_TENANT_FILE_BYTES: PostgreSQL holds them for every tenant, so one
    tenant's uploads cannot fill it for the others. The file expires `expires_seconds` after
    its upload (30 days if not given).
    """
    if purpose != FilePurpose.BATCH:
        raise invalid("purpose", f"'purpose' must be 'batch' here, not {purpose!r}.")
    stream = io.BytesIO(content) if isinstance(content, bytes) else content
    size = stream.seek(0, io.SEEK_END)
    limit = settings.ROUNDHOUSE_MAX_FILE_BYTES
    if size > limit:
        raise ApiError(
            413, "file_too_large", f"The file is {size} bytes; the limit is {limit}.",
            param="file",
        )  # fmt: skip
    lines = _file_lines(stream)
    if lines == 0:
        raise invalid("file", "The file is empty: send one JSON request per line.")
    if lines > settings.ROUNDHOUSE_MAX_FILE_LINES:
        raise invalid(
            "file",
            f"The file has {lines} requests; a batch takes at most "
            f"{settings.ROUNDHOUSE_MAX_FILE_LINES}.",
            code="too_many_lines",
        )
    with transaction.atomic():
        _tenant_lock(tenant_id)
        _room_check(tenant_id, size)
        file = File.objects.create(
            tenant_id=tenant_id,
            purpose=purpose,
            filename=filename.replace("\x00", "")[:255] or "upload.jsonl",
            size=size,
            lines=lines,
            expires_at=timezone.now() + dt.timedelta(seconds=expires_seconds or EXPIRES_MOST),
        )
        for seq, piece in enumerate(_pieces(stream)):
            FileChunk.objects.create(file=file, seq=seq, data=piece)
        return file


def file_delete(*, tenant_id: int, file_id: str) -> str:
    """Delete one of the tenant's files, unless a batch still running reads it (a 409).

    A batch that wrote it as its output or error file names none from then on.
    """
    with transaction.atomic():
        found = None
        if "\x00" not in file_id:
            files = File.objects.select_for_update().filter(tenant_id=tenant_id, pk=file_id)
            found = files.values_list("pk", flat=True).first()
        if found is None:
            raise ApiError(404, "file_not_found", f"No file '{shown(file_id)}'.", param="file_id")
        running = _running_on([found])
        if running:
            batch_id = running[found]
            raise ApiError(
                409,
                "file_in_use",
                f"Batch '{batch_id}' still reads file '{found}': cancel it, or wait for it to "
                "end, before deleting the file.",
                param="file_id",
            )
        File.objects.filter(pk=found).delete()
    return found


def _running_on(file_ids: list[str]) -> dict[str, str]:
    """Of these files, those a batch that has not ended reads, each with one such batch."""
    rows = (
        Batch.objects.filter(input_file_id__in=file_ids)
        .exclude(status__in=ENDED)
        .values_list("input_file_id", "pk")
    )
    return dict(rows)


def files_purge(*, now: dt.datetime | None = None, chunk: int = 500) -> int:
    """Delete the files past their expiry that no running batch reads; return how many.

    Each chunk is locked before it is checked, as a delete locks its file and a batch's
    creation its input: a batch created on a file meanwhile keeps it until the batch ends.
    """
    now = now or timezone.now()
    deleted = 0
    after = ""
    while True:
        ids = list(
            File.objects.filter(expires_at__lte=now, pk__gt=after)
            .order_by("pk")
            .values_list("pk", flat=True)[:chunk]
        )
        if not ids:
            return deleted
        after = ids[-1]
        with transaction.atomic():
            locked = list(
                File.objects.select_for_update(skip_locked=True)
                .filter(pk__in=ids, expires_at__lte=now)
                .values_list("pk", flat=True)
            )
            running = _running_on(locked)
            gone = [pk for pk in locked if pk not in running]
            if gone:
                deleted += File.objects.filter(pk__in=gone).delete()[1].get(File._meta.label, 0)


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
    output_expires_after: Any = None,
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
    output_seconds = expires_after_parse(output_expires_after, "output_expires_after")
    with transaction.atomic():
        # The file's row is held until the batch is in: a delete waits, then finds it in use.
        file = (
            File.objects.select_for_update().filter(tenant_id=tenant_id, pk=input_file_id).first()
        )
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
            output_expires_seconds=output_seconds or EXPIRES_MOST,
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


def _duplicate(custom_id: str) -> ApiError:
    return invalid("custom_id", f"custom_id {custom_id!r} is used twice.", "duplicate_custom_id")


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
        raise _duplicate(custom_id)
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


def _input_read(*, file: File, start: int) -> bytes | None:
    """Return a file's bytes from `start` to the end of the chunk that holds it (nothing past
    its end), one query; None if the file is gone (a chunk it should have is missing).

    Validation goes on from where the last step stopped, anywhere in a chunk: each read is
    the rest of one chunk, so no chunk is read twice in a step.
    """
    if start >= file.size:
        return b""
    seq, skip = divmod(start, FILE_CHUNK_BYTES)
    data = selectors.file_chunk(tenant=file.tenant_id, file_id=file.id, seq=seq)
    return None if data is None else data[skip:]


@dataclass
class _Read:
    """The lines one validating step read, and where its input file goes on."""

    lines: list[str]
    end: int  # the offset of the first byte not read into a line
    finished: bool  # the file is read to its end


def _lines_read(*, file: File, start: int, most: int, until: float | None) -> _Read | None:
    """Read the non-blank lines of a file from byte `start`: at most `most`, fewer after `until`.

    Lines are what str.splitlines finds (as when the file was uploaded and its lines counted),
    so a line and its number are the same however the file is cut into steps. At least one
    line is read, so every step gets on. None if the file is gone.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines: list[str] = []
    text, at, end = "", start, start
    while True:
        data = _input_read(file=file, start=at)
        if data is None:
            return None
        at += len(data)
        finished = at >= file.size or not data
        text += decoder.decode(data, final=finished)
        pieces = text.splitlines(keepends=True)
        if pieces and not finished and pieces[-1].splitlines()[0] == pieces[-1]:
            # Its line goes on in the next piece of the file (or a later step reads it whole).
            text = pieces.pop()
        else:
            text = ""
        for piece in pieces:
            end += len(piece.encode("utf-8"))
            if piece.strip():
                lines.append(piece.splitlines()[0])
            out_of_time = until is not None and time.monotonic() >= until and end > start
            if len(lines) >= most or out_of_time:
                return _Read(lines, end, finished=end >= file.size)
        if finished:
            return _Read(lines, end, finished=True)


def _claimed_before(*, batch: Batch, index: int, custom_ids: set[str]) -> set[str]:
    """Of these custom_ids, those that a line of the batch before `index` took as its own.

    A line takes its custom_id when the id passes its checks, even if the line then fails;
    one whose id was refused (its error names `custom_id`) takes none.
    """
    rows = BatchLine.objects.filter(
        batch=batch, index__lt=index, custom_id__in=custom_ids
    ).values_list("custom_id", "error")
    return {cid for cid, error in rows if error is None or error.get("param") != "custom_id"}


def _line_failed(line: BatchLine, error: ApiError, *, now: dt.datetime) -> None:
    line.body = None
    line.state, line.ended_at = LineState.FAILED, now
    line.error = {
        "code": error.code,
        "message": f"Line {line.index + 1}: {error.message}",
        "param": error.param,
        "line": line.index + 1,
    }


def batch_validate(*, batch: Batch, until: float | None = None) -> Batch:
    """Read the next lines of the input file: runnable ones pending, malformed ones failed.

    One call reads at most ROUNDHOUSE_BATCH_VALIDATE_LINES lines, fewer once `until` (a
    time.monotonic() value) has passed, and stores them with where the next call goes on, in
    one transaction: a step that dies loses only its own part. The batch is in_progress once
    its file has been read to the end; a batch that is not validating is left as it is.

    A malformed line is an entry in the error file, not a failed batch.
    """
    status, start, index = (
        Batch.objects.filter(pk=batch.pk).values_list("status", "validated_bytes", "total").get()
    )
    if status != BatchStatus.VALIDATING:
        batch.refresh_from_db()
        return batch
    file = File.objects.filter(pk=batch.input_file_id).only("id", "tenant_id", "size").first()
    read = None
    if file is not None:
        most = settings.ROUNDHOUSE_BATCH_VALIDATE_LINES
        read = _lines_read(file=file, start=start, most=most, until=until)
    if read is None:
        # Only a file no running batch reads is deleted; this one went before the batch was in.
        return batch_fail(batch=batch, message=f"The input file '{batch.input_file_id}' is gone.")
    seen: set[str] = set()
    claims: dict[int, str] = {}  # the lines that took their custom_id, by position
    now = timezone.now()
    lines = []
    for offset, raw in enumerate(read.lines):
        line = BatchLine(
            batch=batch, index=index + offset, request_id=line_request_id(batch.id, index + offset)
        )
        taken = len(seen)
        try:
            with compiled_for(batch.tenant_id):
                line.custom_id, line.body = _line_check(raw, endpoint=batch.endpoint, seen=seen)
        except Exception as exc:
            # Whatever a line holds, it fails alone: never the batch, nor its other lines.
            error = exc if isinstance(exc, ApiError) else None
            if error is None:
                log.exception("batch %s: line %d could not be read", batch.id, line.index + 1)
                error = ApiError(400, "invalid_request", "The request could not be read.")
            line.custom_id = _custom_id_of(raw)
            _line_failed(line, error, now=now)
        if len(seen) > taken:
            claims[offset] = line.custom_id
        lines.append(line)
    # A custom_id taken in an earlier step makes each line here that took it again a duplicate.
    earlier = _claimed_before(batch=batch, index=index, custom_ids=set(claims.values()))
    for offset, custom_id in claims.items():
        if custom_id in earlier:
            _line_failed(lines[offset], _duplicate(custom_id), now=now)
    with transaction.atomic():
        # Only from where it was: a step whose lease lapsed mid-read leaves the part to the
        # step that took the batch over.
        went_on = Batch.objects.filter(pk=batch.pk, validated_bytes=start, total=index).update(
            validated_bytes=read.end, total=index + len(lines)
        )
        if went_on:
            BatchLine.objects.bulk_create(lines, batch_size=2000)
            counts_refresh(batch=batch)
            if read.finished:
                Batch.objects.filter(pk=batch.pk, status=BatchStatus.VALIDATING).update(
                    status=BatchStatus.IN_PROGRESS, in_progress_at=now
                )
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


class _Room:
    """The bytes a tenant's files may still take, as result files are written into it."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self, size: int) -> bool:
        """Take `size` bytes if they fit; say whether they did."""
        if size > self.left:
            return False
        self.left -= size
        return True


class _ResultFile:
    """A batch's output or error file, written a chunk at a time as its entries come.

    Its row is made with the first entry (a batch with no such entries has no such file), and
    every FILE_CHUNK_BYTES written go to PostgreSQL as one chunk: the file is never whole in
    memory, however many lines it has or however large one is.
    """

    def __init__(self, batch: Batch, kind: str) -> None:
        self.batch, self.kind = batch, kind
        self.file: File | None = None
        self.held = bytearray()  # written, not yet a chunk
        self.seq = 0

    def write(self, data: bytes) -> None:
        if self.file is None:
            self.file = File.objects.create(
                tenant_id=self.batch.tenant_id,
                purpose=FilePurpose.BATCH_OUTPUT,
                filename=f"{self.batch.id}_{self.kind}.jsonl",
                size=0,
                lines=0,
                expires_at=timezone.now() + dt.timedelta(seconds=self.batch.output_expires_seconds),
            )
        self.file.size += len(data)
        self.file.lines += 1
        view = memoryview(data)
        room = FILE_CHUNK_BYTES - len(self.held)
        self.held += view[:room]
        view = view[room:]
        while len(self.held) == FILE_CHUNK_BYTES:
            self._chunk(bytes(self.held))
            self.held = bytearray(view[:FILE_CHUNK_BYTES])
            view = view[FILE_CHUNK_BYTES:]

    def close(self) -> File | None:
        """Write what is left and the file's size and line count; return the file, if any."""
        if self.file is None:
            return None
        if self.held:
            self._chunk(bytes(self.held))
            self.held = bytearray()
        self.file.save(update_fields=["size", "lines"])
        return self.file

    def _chunk(self, data: bytes) -> None:
        assert self.file is not None, "a chunk belongs to a file"
        FileChunk.objects.create(file=self.file, seq=self.seq, data=data)
        self.seq += 1


# A page of lines read to write the result files holds about this many bytes of results (and
# at least one line, however large).
_PAGE_BYTES = 2 * FILE_CHUNK_BYTES
_PAGE_LINES = 1000


def _line_pages(batch: Batch) -> Iterator[list[BatchLine]]:
    """Yield the batch's lines in order, a page of about _PAGE_BYTES of results at a time."""
    after = -1
    while True:
        sizes = list(
            batch.lines.filter(index__gt=after)
            .order_by("index")
            .annotate(held=Coalesce(Length("result"), 0) + Coalesce(Length("error"), 0))
            .values_list("index", "held")[:_PAGE_LINES]
        )
        if not sizes:
            return
        last, total = sizes[0][0], 0
        for index, held in sizes:
            if total and total + held > _PAGE_BYTES:
                break
            last, total = index, total + held
        page = batch.lines.filter(index__gt=after, index__lte=last).defer("body")
        yield list(page.order_by("index"))
        after = last


def _results_write(batch: Batch) -> tuple[File | None, File | None, dict[str, Any] | None]:
    """Write the output and error files in line order, within the tenant's storage bound.

    Returns the two files (None where no line belongs in it) and, if they would take the
    tenant's files past ROUNDHOUSE_TENANT_FILE_BYTES, the batch error saying where they stop:
    both files then hold every line before the first that did not fit, and none after it.
    Runs in the caller's transaction, which holds the tenant's row: no upload or other batch
    of the tenant's takes the same room meanwhile.
    """
    limit = settings.ROUNDHOUSE_TENANT_FILE_BYTES
    used = File.objects.filter(tenant_id=batch.tenant_id).aggregate(total=Sum("size"))["total"]
    room = _Room(limit - (used or 0))
    output, error = _ResultFile(batch, "output"), _ResultFile(batch, "error")
    for page in _line_pages(batch):
        for line in page:
            entry = json.dumps(_entry(line), separators=(",", ":")).encode() + b"\n"
            if not room.take(len(entry)):
                written = output.close(), error.close()
                return *written, {
                    "code": "storage_limit_exceeded",
                    "message": (
                        f"The batch's output and error files stop before line "
                        f"{line.index + 1}: with its entry the tenant's files would hold more "
                        f"than their limit of {limit} bytes. The lines from there on are "
                        "counted in request_counts but are in neither file. Delete files "
                        "(DELETE /v1/files/{file_id}) to make room for the next batch."
                    ),
                    "param": None,
                    "line": line.index + 1,
                }
            (output if line.state == LineState.SUCCEEDED else error).write(entry)
    return output.close(), error.close(), None


def batch_finalize(*, batch: Batch, status: str) -> Batch:
    """Write the output and error files (in line order) and end the batch with a status.

    Lines still pending end as cancelled or expired with the batch. The files count towards
    the tenant's storage: a batch whose files would pass it ends failed, saying so (see
    `_results_write`).
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
    with transaction.atomic():
        _tenant_lock(batch.tenant_id)
        batch.output_file, batch.error_file, cut = _results_write(batch)
        fields = ["output_file", "error_file", "status"]
        if cut is not None:
            status = BatchStatus.FAILED
            errors = Batch.objects.values_list("errors", flat=True).get(pk=batch.pk)
            batch.errors = {"object": "list", "data": [*(errors or {}).get("data", []), cut]}
            fields.append("errors")
        # Counted in the same commit as the status: a client that sees the batch ended sees
        # its final counts too.
        counts_refresh(batch=batch)
        batch.status = status
        setattr(batch, f"{status}_at", timezone.now())
        batch.save(update_fields=[*fields, f"{status}_at"])
    batch.refresh_from_db()
    return batch


def batch_fail(*, batch: Batch, message: str) -> Batch:
    """End a batch that cannot go on as failed, saying why; its unfinished lines fail with it."""
    error = {"code": "batch_failed", "message": message, "param": None, "line": None}
    Batch.objects.filter(pk=batch.pk).update(errors={"object": "list", "data": [error]})
    return batch_finalize(batch=batch, status=BatchStatus.FAILED)
