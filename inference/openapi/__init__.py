"""The OpenAPI document of the /v1 API: see inference.openapi.document."""

from inference.openapi.document import openapi_document, openapi_json

__all__ = ["openapi_document", "openapi_json"]
