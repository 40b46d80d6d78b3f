"""`/v1/openapi.json`: the API's OpenAPI document, served without a key."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from inference.edge.endpoint import (
    api_endpoint,
    json_response,
)
from inference.openapi.document import openapi_json


@api_endpoint("GET")
async def openapi(request: HttpRequest, request_id: str) -> HttpResponse:
    """Serve this API's OpenAPI document; no key needed."""
    return json_response(openapi_json())
