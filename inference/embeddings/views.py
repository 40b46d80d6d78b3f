"""`/v1/embeddings`: a request's inputs become vectors, answered as the client reads them."""

from __future__ import annotations

import functools

from django.http import HttpRequest, HttpResponseBase

from inference.edge.endpoint import (
    api_endpoint,
    client_timeout,
    pieces_response,
    request_clock,
    request_principal,
    request_read,
    request_trace,
)
from inference.embeddings.format import embeddings_collect
from inference.embeddings.protocol import embeddings_parse
from inference.pipeline import relay
from inference.pipeline.admission import request_ended
from inference.pipeline.clients import dispatch_get
from inference.pipeline.submission import embedding_submit
from tenants.models import Scope


@api_endpoint("POST", counted=True)
async def embeddings(request: HttpRequest, request_id: str) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    _, parsed = await request_read(request, embeddings_parse)
    clock = request_clock(request)
    submitted = await embedding_submit(
        principal=principal,
        request=parsed,
        request_id=request_id,
        timeout=client_timeout(request, parsed.timeout),
        clock=clock,
        trace=request_trace(request),
        request_taken=True,
    )
    route = submitted.route
    answer = await embeddings_collect(
        relay.events(dispatch_get(), submitted),
        parsed,
        model=route.served_name,
        on_end=functools.partial(request_ended, submitted),
        request_id=request_id,
    )
    clock.skip()
    # The answer is encoded as its client reads it: here it is the vectors (docs/embeddings.md).
    response = pieces_response(answer.pieces, content_type=answer.content_type)
    clock.lap("relay")
    clock.finish()
    if answer.metadata is not None:
        response["metadata"] = answer.metadata
    return submitted.headed(response)
