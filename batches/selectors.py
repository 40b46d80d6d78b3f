"""Read a tenant's files and batches; another tenant's are not found."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import QuerySet

from batches.models import Batch, File, FileChunk
from config.json_body import shown
from inference.base.errors import ApiError
from tenants.models import Tenant


def _comparable(value: str) -> bool:
    """Whether PostgreSQL can compare a client's text with a column (not with a NUL in it)."""
    return "\x00" not in value


def file_get(*, tenant: Tenant | int, file_id: str) -> File:
    found = None
    if _comparable(file_id):
        found = File.objects.filter(tenant=tenant, pk=file_id).first()
    if found is None:
        raise ApiError(404, "file_not_found", f"No file '{shown(file_id)}'.", param="file_id")
    return found


def file_chunk(*, tenant: Tenant | int, file_id: str, seq: int) -> bytes | None:
    """Return the `seq`th chunk of one of the tenant's files, or None past its end (or if gone)."""
    data = (
        FileChunk.objects.filter(file__tenant=tenant, file_id=file_id, seq=seq)
        .values_list("data", flat=True)
        .first()
    )
    return None if data is None else bytes(data)


def file_pieces(*, tenant: Tenant | int, file_id: str) -> Iterator[bytes]:
    """Yield a file's bytes a chunk at a time, one query each: it is never whole in memory."""
    seq = 0
    while (data := file_chunk(tenant=tenant, file_id=file_id, seq=seq)) is not None:
        yield data
        seq += 1


def file_list(
    *,
    tenant: Tenant | int,
    purpose: str | None = None,
    after: str | None = None,
    limit: int = 10_000,
    ascending: bool = False,
) -> tuple[list[File], bool]:
    """Return a page of files by upload time, after the file `after`; and whether more exist."""
    files: QuerySet[File] = File.objects.filter(tenant=tenant)
    if purpose:
        files = files.filter(purpose=purpose) if _comparable(purpose) else files.none()
    if after:
        cursor = files.filter(pk=after).first() if _comparable(after) else None
        if cursor is None:
            raise ApiError(404, "file_not_found", f"No file '{shown(after)}'.", param="after")
        way = "gt" if ascending else "lt"
        files = files.filter(**{f"created_at__{way}": cursor.created_at}) | files.filter(
            **{"created_at": cursor.created_at, f"pk__{way}": cursor.pk}
        )
    order = ("created_at", "pk") if ascending else ("-created_at", "-pk")
    page = list(files.order_by(*order)[: limit + 1])
    return page[:limit], len(page) > limit


def batch_get(*, tenant: Tenant | int, batch_id: str) -> Batch:
    found = None
    if _comparable(batch_id):
        found = Batch.objects.filter(tenant=tenant, pk=batch_id).first()
    if found is None:
        raise ApiError(404, "batch_not_found", f"No batch '{shown(batch_id)}'.", param="batch_id")
    return found


def batch_list(*, tenant: Tenant | int, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    """Return a page of batches, newest first, after the batch `after`; and whether more exist."""
    batches = Batch.objects.filter(tenant=tenant).order_by("-created_at", "-pk")
    if after:
        cursor = batch_get(tenant=tenant, batch_id=after)
        batches = batches.filter(created_at__lt=cursor.created_at) | batches.filter(
            created_at=cursor.created_at, pk__lt=cursor.pk
        )
    page = list(batches[: limit + 1])
    return page[:limit], len(page) > limit
