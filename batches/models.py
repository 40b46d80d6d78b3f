"""Uploaded files and asynchronous batches of requests (OpenAI's Files and Batch APIs)."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.db import models

from tenants.models import ApiKey, Tenant


def file_id_new() -> str:
    return f"file-{secrets.token_hex(12)}"


def batch_id_new() -> str:
    return f"batch_{secrets.token_hex(12)}"


class FilePurpose(models.TextChoices):
    BATCH = "batch"  # an uploaded batch input
    BATCH_OUTPUT = "batch_output"  # a batch's output or error file, written by the platform


# A file's bytes are kept in pieces of this size (the last one shorter): whoever reads or writes
# a file holds a piece or two of it at a time, never the whole file.
FILE_CHUNK_BYTES = 1024 * 1024


class File(models.Model):
    """A tenant's JSONL file, kept in PostgreSQL so every frontend and job host can read it.

    Its bytes are its chunks (FileChunk), in order; `size` is their total.
    """

    id = models.CharField(primary_key=True, max_length=40, default=file_id_new, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="files")
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    size = models.PositiveBigIntegerField()
    lines = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # When the hourly purge deletes it (batches.services.files_purge): its `expires_after`, or
    # 30 days after its upload or its batch's end. Null: kept until deleted.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["expires_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class FileChunk(models.Model):
    """One piece of a file's bytes: the `seq`th, of FILE_CHUNK_BYTES (the last one fewer)."""

    # The unique (file, seq) index serves every lookup by file: no index of its own.
    file = models.ForeignKey(File, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["file", "seq"], name="file_chunk_unique")]

    def __str__(self) -> str:
        return f"{self.file_id}#{self.seq}"


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ENDED = (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
UNFINISHED = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)


class Batch(models.Model):
    """A file of requests run at batch priority within a completion window."""

    id = models.CharField(primary_key=True, max_length=40, default=batch_id_new, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batches")
    # The key that created the batch: its lines run with that key's limits and are billed to it.
    api_key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="batches")
    endpoint = models.CharField(max_length=32)
    # A file is deleted (by its tenant, or once it expires) only when no batch still running
    # reads it (batches.services.file_delete); an ended batch keeps naming it, as OpenAI's does.
    input_file = models.ForeignKey(
        File, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    output_file = models.ForeignKey(
        File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    completion_window = models.CharField(max_length=8)
    # How long its output and error files are kept once written (`output_expires_after`).
    output_expires_seconds = models.PositiveIntegerField(default=30 * 24 * 3600)
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    metadata = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(null=True, blank=True)
    # Lines read from the input file so far: all of them once it is no longer validating.
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Where validation goes on: the bytes of the input file read into lines so far (each
    # validating step reads a bounded part of it; batches.services.batch_validate).
    validated_bytes = models.PositiveBigIntegerField(default=0)
    # When a step of it last began: the batch runner serves the tenant whose batches were
    # served least recently first (batches.scheduler).
    stepped_at = models.DateTimeField(null=True, blank=True)
    # Its steps that failed in a row (a step that ends well starts again from 0).
    step_failures = models.PositiveSmallIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["status"]),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def ended(self) -> bool:
        return self.status in ENDED


# Generic only in the type stubs; the strict check of the data plane loads every app's models.
class JsonText(models.Field):  # type: ignore[type-arg, unused-ignore]
    """JSON stored as text.

    PostgreSQL's jsonb refuses the NUL character, which request bodies and model output may
    hold; as text with JSON escapes (\\u0000) every value round-trips exactly.
    """

    _pyi_private_set_type: Any
    _pyi_private_get_type: Any

    def get_internal_type(self) -> str:
        return "TextField"

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"))


class LineState(models.TextChoices):
    PENDING = "pending"
    SUBMITTED = "submitted"  # handed to admission; its request id says where it went
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class BatchLine(models.Model):
    """One request of a batch and, once it ended, its result."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()  # 0-based line number in the input file
    custom_id = models.CharField(max_length=512, blank=True)
    body = JsonText(null=True)  # the request body; null for a malformed line
    state = models.CharField(max_length=16, choices=LineState.choices, default=LineState.PENDING)
    # Derived from the batch and line: a resumed line can never become a second request.
    request_id = models.CharField(max_length=64)
    result = JsonText(null=True, blank=True)  # {"status_code", "body"} of the response
    error = JsonText(null=True, blank=True)  # {"code", "message"} for a line that never ran
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="batch_line_unique")]
        indexes = [models.Index(fields=["batch", "state", "index"])]

    def __str__(self) -> str:
        return f"{self.batch_id}#{self.index}"
