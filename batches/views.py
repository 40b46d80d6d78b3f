"""The Files and Batch APIs under /v1, OpenAI-compatible, for the caller's tenant only."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError

from batches import scheduler, selectors, services
from batches.models import Batch, File
from config.db import tenant_db_call
from config.http import content_disposition
from config.turns import Turns
from inference.base.errors import ApiError, invalid, unrecognized
from inference.base.metrics import RequestClock
from inference.edge.asgi import ResponseCut
from inference.edge.endpoint import (
    api_endpoint,
    json_response,
    limit_query,
    list_page,
    page_query,
    request_clock,
    request_json,
    request_principal,
)
from tenants.models import Scope

log = logging.getLogger(__name__)
_MULTIPART_SLACK = 64 * 1024  # the form's own bytes around the file


def _ts(at: dt.datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def file_object(file: File) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.size,
        "created_at": _ts(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": _ts(file.expires_at),
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata or None,
    }


# The form fields of an upload (the SDK writes `expires_after` as two bracketed fields).
_UPLOAD_FIELDS = frozenset(("file", "purpose", "expires_after[anchor]", "expires_after[seconds]"))


def _expires_after(form: Any) -> dict[str, Any] | None:
    """The upload's `expires_after` as the JSON object it stands for, or None."""
    anchor = form.get("expires_after[anchor]")
    seconds = form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    # A form's text is read as an integer only when it is one (thousands of digits are not).
    if isinstance(seconds, str) and seconds.isascii() and seconds.isdigit() and len(seconds) < 20:
        return {"anchor": anchor, "seconds": int(seconds)}
    return {"anchor": anchor, "seconds": seconds}


def _upload(request: HttpRequest) -> tuple[str, str, UploadedFile, int | None]:
    """Return the (filename, purpose, file, expiry seconds) of an upload, or raise a 400/413.

    The file is as Django parsed it: in memory when small, else spooled to a temporary file;
    it is read a chunk at a time from there on.
    """
    limit = settings.ROUNDHOUSE_MAX_FILE_BYTES
    length = request.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit + _MULTIPART_SLACK:
        raise ApiError(413, "file_too_large", f"The file exceeds {limit} bytes.", param="file")
    if not (request.content_type or "").startswith("multipart/form-data"):
        raise invalid("file", "Upload the file as multipart/form-data with 'file' and 'purpose'.")
    try:
        upload = request.FILES.get("file")
        purpose = request.POST.get("purpose")
        names = [*request.POST, *request.FILES]
    except RequestDataTooBig as exc:
        raise ApiError(
            413, "file_too_large", f"The file exceeds {limit} bytes.", param="file"
        ) from exc
    except (MultiPartParserError, SuspiciousOperation) as exc:
        # A form without a boundary, or with more fields than Django reads: the client's fault.
        raise invalid("file", f"The multipart body cannot be read: {exc}") from exc
    for name in names:
        if name not in _UPLOAD_FIELDS:
            raise unrecognized(name)
    if upload is None:
        raise invalid("file", "Missing required parameter: 'file'.", "missing_required_parameter")
    if not purpose:
        raise invalid(
            "purpose", "Missing required parameter: 'purpose'.", "missing_required_parameter"
        )
    if upload.size is not None and upload.size > limit:
        raise ApiError(413, "file_too_large", f"The file exceeds {limit} bytes.", param="file")
    seconds = services.expires_after_parse(_expires_after(request.POST), "expires_after")
    return upload.name or "upload.jsonl", purpose, upload, seconds


@api_endpoint("GET", "POST", counted=True)
async def files(request: HttpRequest, request_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant = principal.tenant_id
    if request.method == "POST":
        filename, purpose, upload, seconds = await asyncio.to_thread(_upload, request)
        created = await tenant_db_call(
            tenant,
            services.file_create,
            tenant_id=tenant,
            filename=filename,
            purpose=purpose,
            content=upload,
            expires_seconds=seconds,
        )
        return json_response(file_object(created))
    # OpenAI's file lists hold up to 10,000 a page, and that many unless asked for fewer.
    limit, order, after = page_query(request, default=10_000, most=10_000)
    page, more = await tenant_db_call(
        tenant,
        selectors.file_list,
        tenant=principal.tenant_id,
        purpose=request.GET.get("purpose"),
        after=after,
        limit=limit,
        ascending=order == "asc",
    )
    return json_response(list_page([file_object(f) for f in page], has_more=more))


@api_endpoint("GET", "DELETE", counted=True)
async def file_detail(request: HttpRequest, request_id: str, file_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant = principal.tenant_id
    if request.method == "DELETE":
        deleted = await tenant_db_call(
            tenant, services.file_delete, tenant_id=tenant, file_id=file_id
        )
        return json_response({"id": deleted, "object": "file", "deleted": True})
    found = await tenant_db_call(tenant, selectors.file_get, tenant=tenant, file_id=file_id)
    return json_response(file_object(found))


@api_endpoint("GET", counted=True)
async def file_content(
    request: HttpRequest, request_id: str, file_id: str
) -> HttpResponse | StreamingHttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant = principal.tenant_id
    found = await tenant_db_call(tenant, selectors.file_get, tenant=tenant, file_id=file_id)
    response = StreamingHttpResponse(
        _file_pieces(tenant, found, request_clock(request)), content_type="application/jsonl"
    )
    response["Content-Length"] = str(found.size)
    response["Content-Disposition"] = content_disposition(found.filename)
    # A tenant's bytes under the API's origin: never let a browser sniff them into HTML.
    response["X-Content-Type-Options"] = "nosniff"
    return response


async def _file_pieces(tenant_id: int, file: File, clock: RequestClock) -> AsyncIterator[bytes]:
    """Yield a file's bytes a chunk at a time, each read when the client has taken the last.

    Each chunk is one short database call within the tenant's share; the handler sends a
    chunk only as fast as the client takes it, so a download holds a chunk or two however
    large the file or slow its reader. A tenant's downloads go out
    ROUNDHOUSE_DOWNLOADS_PER_TENANT at a time per frontend, its others waiting their turn
    (their bodies wait, after the answer's head): a tenant pulling many large
    files at once takes the frontend's time and bandwidth from every other tenant otherwise.
    """
    sent = seq = 0
    over = await _downloads.take(tenant_id)
    try:
        while sent < file.size:
            data = await tenant_db_call(
                tenant_id, selectors.file_chunk, tenant=tenant_id, file_id=file.id, seq=seq
            )
            if data is None:
                raise ResponseCut(f"file {file.id} was deleted while it was being downloaded")
            yield data
            sent, seq = sent + len(data), seq + 1
    finally:
        over()
        clock.finish()  # a download ends when its last chunk is written, or it is cut


_downloads = Turns(lambda: int(settings.ROUNDHOUSE_DOWNLOADS_PER_TENANT))


def _start(batch_id: str) -> None:
    """Start the batch runners that are not running: the new batch takes its turn among them."""
    try:
        scheduler.runners_wake()
    except Exception:
        # The periodic resume job starts them once Redis and the broker answer again.
        log.warning("could not start batch %s now; it will be resumed", batch_id, exc_info=True)


@api_endpoint("GET", "POST", counted=True)
async def batches(request: HttpRequest, request_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    if request.method == "POST":
        body = await request_json(request)
        for name in body:
            if name not in services.BATCH_FIELDS:
                raise unrecognized(name)
        batch = await tenant_db_call(
            principal.tenant_id,
            services.batch_create,
            tenant_id=principal.tenant_id,
            api_key_id=principal.key_id,
            input_file_id=body.get("input_file_id"),
            endpoint=body.get("endpoint"),
            completion_window=body.get("completion_window", "24h"),
            metadata=body.get("metadata"),
            output_expires_after=body.get("output_expires_after"),
        )
        await tenant_db_call(principal.tenant_id, _start, batch.id)
        return json_response(batch_object(batch))
    page, more = await tenant_db_call(
        principal.tenant_id,
        selectors.batch_list,
        tenant=principal.tenant_id,
        after=request.GET.get("after"),
        limit=limit_query(request),
    )
    return json_response(list_page([batch_object(b) for b in page], has_more=more))


@api_endpoint("GET", counted=True)
async def batch_detail(request: HttpRequest, request_id: str, batch_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant = principal.tenant_id
    batch = await tenant_db_call(tenant, selectors.batch_get, tenant=tenant, batch_id=batch_id)
    return json_response(batch_object(batch))


@api_endpoint("POST", counted=True)
async def batch_cancel(request: HttpRequest, request_id: str, batch_id: str) -> HttpResponse:
    principal = await request_principal(request, Scope.INFERENCE)
    tenant = principal.tenant_id
    batch = await tenant_db_call(tenant, selectors.batch_get, tenant=tenant, batch_id=batch_id)
    batch = await tenant_db_call(tenant, services.batch_cancel, batch=batch)
    return json_response(batch_object(batch))
