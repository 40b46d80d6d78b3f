"""The file and batch operations of the /v1 OpenAPI document, with the objects they take and give.

BatchesConfig.ready registers them as a part of the document (inference.openapi.parts).
"""

from __future__ import annotations

from batches.models import BatchStatus, FilePurpose
from batches.services import ENDPOINTS, EXPIRES_LEAST, EXPIRES_MOST
from inference.openapi.parts import Part
from inference.openapi.paths import AUTH_ERRORS, errors, list_of, ok, path_parameter
from inference.openapi.schema import NO_NUL, Schema, json_content, obj, ref

FILE: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "file"},
        "bytes": {"type": "integer"},
        "created_at": {"type": "integer"},
        "filename": {"type": "string"},
        "purpose": {"type": "string", "enum": list(FilePurpose.values)},
        "status": {"const": "processed"},
        "status_details": {"type": "null"},
        "expires_at": {"type": ["integer", "null"]},
    },
    "id",
    "object",
    "bytes",
    "created_at",
    "filename",
    "purpose",
    "status",
)

_TIMESTAMP = {"type": ["integer", "null"]}
_BATCH_MOMENTS = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
                  "expired_at", "cancelling_at", "cancelled_at")  # fmt: skip
BATCH: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "batch"},
        "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
        "errors": {"type": ["object", "null"]},
        "input_file_id": {"type": "string"},
        "completion_window": {"type": "string"},
        "status": {"type": "string", "enum": list(BatchStatus.values)},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        "created_at": {"type": "integer"},
        **{name: _TIMESTAMP for name in _BATCH_MOMENTS},
        "request_counts": obj(
            {name: {"type": "integer"} for name in ("total", "completed", "failed")},
            "total",
            "completed",
            "failed",
        ),
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    },
    "id",
    "object",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "request_counts",
)

FILE_DELETED: Schema = obj(
    {"id": {"type": "string"}, "object": {"const": "file"}, "deleted": {"const": True}},
    "id",
    "object",
    "deleted",
)
_SECONDS: Schema = {"type": "integer", "minimum": EXPIRES_LEAST, "maximum": EXPIRES_MOST}
EXPIRES_AFTER: Schema = obj(
    {"anchor": {"const": "created_at"}, "seconds": _SECONDS},
    "anchor",
    "seconds",
    additionalProperties=False,
    description="Deleted this many seconds after the file's creation (30 days if not given).",
)

BATCH_REQUEST: Schema = obj(
    {
        "input_file_id": {
            "type": "string",
            "pattern": NO_NUL,
            "description": "A file uploaded with purpose batch.",
        },
        "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
        "completion_window": {
            "type": "string",
            "pattern": "^[0-9]{1,5}[mh]$",
            "default": "24h",
            "description": "From 1m to 168h.",
        },
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": 16,
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"type": "string", "maxLength": 512, "pattern": NO_NUL},
        },
        "output_expires_after": ref("ExpiresAfter"),
    },
    "input_file_id",
    "endpoint",
    additionalProperties=False,
)

FILE_UPLOAD: Schema = obj(
    {
        "file": {
            "type": "string",
            "contentMediaType": "application/octet-stream",
            "description": "A JSONL file: one request per line, UTF-8, not empty.",
        },
        "purpose": {"type": "string", "enum": [FilePurpose.BATCH.value]},
        "expires_after[anchor]": {"const": "created_at"},
        "expires_after[seconds]": {
            **_SECONDS,
            "description": "Deleted this many seconds after its upload (30 days if not given).",
        },
    },
    "file",
    "purpose",
    additionalProperties=False,
)
_FILE_ID = path_parameter("file_id", "The file's id.")


def _paths() -> dict[str, Schema]:
    return {
        "/v1/files": {
            "get": {
                "summary": "The tenant's files by upload time, a page at a time",
                "parameters": [
                    {"name": "purpose", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "after",
                        "in": "query",
                        "description": "The last file id of the previous page.",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 10_000,
                            "default": 10_000,
                        },
                    },
                    {
                        "name": "order",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"},
                    },
                ],
                "responses": {
                    "200": ok(
                        "A page of files.",
                        json_content(
                            list_of(
                                "File",
                                first_id={"type": ["string", "null"]},
                                last_id={"type": ["string", "null"]},
                                has_more={"type": "boolean"},
                            )
                        ),
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 429),
                },
            },
            "post": {
                "summary": "Upload a batch input file",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": ref("FileUpload")}},
                },
                "responses": {
                    "200": ok("The stored file.", json_content(ref("File"))),
                    **errors(400, *AUTH_ERRORS, 413, 429),
                },
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "summary": "A file",
                "parameters": [_FILE_ID],
                "responses": {
                    "200": ok("The file.", json_content(ref("File"))),
                    **errors(*AUTH_ERRORS, 404, 429),
                },
            },
            "delete": {
                "summary": "Delete a file (not one a running batch reads)",
                "parameters": [_FILE_ID],
                "responses": {
                    "200": ok("It is deleted.", json_content(ref("FileDeleted"))),
                    **errors(*AUTH_ERRORS, 404, 409, 429),
                },
            },
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "summary": "A file's content",
                "parameters": [_FILE_ID],
                "responses": {
                    "200": ok(
                        "The JSONL content.",
                        {"application/jsonl": {"schema": {"type": "string"}}},
                        {"Content-Disposition": {"schema": {"type": "string"}}},
                    ),
                    **errors(*AUTH_ERRORS, 404, 429),
                },
            }
        },
        "/v1/batches": {
            "get": {
                "summary": "The tenant's batches, newest first",
                "parameters": [
                    {
                        "name": "after",
                        "in": "query",
                        "description": "The last batch id of the previous page.",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    },
                ],
                "responses": {
                    "200": ok(
                        "A page of batches.",
                        json_content(
                            list_of(
                                "Batch",
                                first_id={"type": ["string", "null"]},
                                last_id={"type": ["string", "null"]},
                                has_more={"type": "boolean"},
                            )
                        ),
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 429),
                },
            },
            "post": {
                "summary": "Run a file of requests at batch priority",
                "requestBody": {"required": True, "content": json_content(ref("BatchRequest"))},
                "responses": {
                    "200": ok("The batch, validating.", json_content(ref("Batch"))),
                    **errors(400, *AUTH_ERRORS, 404, 413, 429),
                },
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "summary": "A batch",
                "parameters": [path_parameter("batch_id", "The batch's id.")],
                "responses": {
                    "200": ok("The batch.", json_content(ref("Batch"))),
                    **errors(*AUTH_ERRORS, 404, 429),
                },
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "summary": "Cancel a batch",
                "parameters": [path_parameter("batch_id", "The batch's id.")],
                "responses": {
                    "200": ok("The batch, cancelling.", json_content(ref("Batch"))),
                    **errors(*AUTH_ERRORS, 404, 409, 429),
                },
            }
        },
    }


PART = Part(
    name="batches",
    paths=_paths,
    schemas={
        "File": FILE,
        "FileDeleted": FILE_DELETED,
        "FileUpload": FILE_UPLOAD,
        "ExpiresAfter": EXPIRES_AFTER,
        "Batch": BATCH,
        "BatchRequest": BATCH_REQUEST,
    },
)
