"""vLLM's operational endpoints, at vLLM's paths: /health, /version, /tokenize, /detokenize.

Load-testing tools and clients written against vLLM's own server probe these; each answers
as vLLM's does (vllm/entrypoints/serve/instrumentator and tokenize), in the same shapes.
They sit at the root, not under /v1, as in vLLM: /v1 is the OpenAI API, which has no such
operations. /healthz and /readyz are the platform's own probes, here too.

/tokenize and /detokenize take an API key with the inference scope, and their `model` routes
as a chat request's does (the same 404 for a name the key cannot call); the routed version's
tokenizer answers. Each takes a request from the tenant's requests per minute and no tokens.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import time
import tomllib
from pathlib import Path

from django.db import connection
from django.http import HttpRequest, HttpResponse

from config.db import db_call
from dataplane.background import loops_failing
from dataplane.redis_client import ping_everywhere
from inference.base.errors import ApiError, invalid
from inference.edge.endpoint import (
    api_endpoint,
    json_response,
    request_principal,
    request_read,
)
from inference.operations.format import model_card
from inference.operations.protocol import TokenizeRequest, detokenize_parse, tokenize_parse
from inference.pipeline.admission import VERSION_HEADER
from inference.pipeline.auth import Principal
from inference.pipeline.clients import dispatch_get, model_names_get, routing_get
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.tokenization import (
    INLINE_MESSAGES,
    INLINE_TOKENIZE_CHARS,
    Tokenizer,
    tokenizer_of,
)
from models_registry.selectors import Route
from tenants.models import Scope

DISTRIBUTION = "roundhouse-serving"
_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.cache
def platform_version() -> str:
    """The platform's version: its installed distribution's, else its pyproject.toml's.

    One source either way (pyproject.toml's `version`): a checkout run in place has no
    installed distribution, and reads the file the distribution is built from.
    """
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(_PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def _database_ok() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("select 1")
    return True


async def _unready() -> str | None:
    """Why this process cannot serve requests now, or None when it can.

    Postgres and Redis must answer, and the reply-stream readers must be reading: a reader
    that failed and has not yet read well again makes this process unready.
    """
    try:
        await ping_everywhere(dispatch_get().redis)
        await db_call(_database_ok)
    except Exception as exc:
        return f"dependency unavailable: {type(exc).__name__}"
    if loops_failing("replies"):
        return "a reply-stream reader is failing"
    return None


@api_endpoint("GET")
async def healthz(request: HttpRequest, request_id: str) -> HttpResponse:
    """Report that this process serves requests (liveness)."""
    return json_response({"status": "ok"})


@api_endpoint("GET")
async def readyz(request: HttpRequest, request_id: str) -> HttpResponse:
    """Report whether Postgres and Redis answer and this process relays replies (readiness)."""
    problem = await _unready()
    if problem is not None:
        raise ApiError(503, "not_ready", problem)
    return json_response({"status": "ready"})


@api_endpoint("GET")
async def health(request: HttpRequest, request_id: str) -> HttpResponse:
    """vLLM's health check: 200 with an empty body when this frontend can serve, else 503.

    vLLM answers 503 (empty) when its engine is dead; a frontend's engine is its Postgres,
    Redis and reply readers, so this is /readyz's check, answered as vLLM answers.
    """
    return await _health_answer()


async def _health_answer() -> HttpResponse:
    return HttpResponse(status=200 if await _unready() is None else 503)


@api_endpoint("GET", "POST")
async def ping(request: HttpRequest, request_id: str) -> HttpResponse:
    """vLLM's SageMaker-style ping: its health check, answered to GET and POST alike."""
    return await _health_answer()


@api_endpoint("GET")
async def version(request: HttpRequest, request_id: str) -> HttpResponse:
    """vLLM's version endpoint, naming the platform's version (not an engine's)."""
    return json_response({"version": platform_version()})


async def _routed(principal: Principal, model: str) -> tuple[Route, Tokenizer]:
    """The route a request for `model` takes, as a chat request's would, and its tokenizer."""
    routing = await routing_get(model, principal=principal)
    route = routing.pick(tenant_id=principal.tenant_id, user=None)
    return route, await tokenizer_of(route)


def _tokens(tokenizer: Tokenizer, parsed: TokenizeRequest) -> list[int]:
    if parsed.messages is not None:
        text = tokenizer.render_chat(
            parsed.messages,
            tools=parsed.tools,
            add_generation_prompt=parsed.add_generation_prompt,
            continue_final_message=parsed.continue_final_message,
            template_kwargs=parsed.template_kwargs,
        )
    else:
        text = parsed.prompt or ""
    return tokenizer.encode_with(text, add_special_tokens=parsed.add_special_tokens)


def _inline(parsed: TokenizeRequest) -> bool:
    """Whether a prompt is short enough to render and tokenise on the event loop."""
    if parsed.messages is not None:
        if len(parsed.messages) > INLINE_MESSAGES:
            return False
        return sum(len(m["content"]) for m in parsed.messages) <= INLINE_TOKENIZE_CHARS
    return len(parsed.prompt or "") <= INLINE_TOKENIZE_CHARS


@api_endpoint("POST", counted=True)
async def tokenize(request: HttpRequest, request_id: str) -> HttpResponse:
    """vLLM's /tokenize: a prompt's or a conversation's token ids, with the routed tokenizer.

    `max_model_len` is the context this tenant gets on the routed deployment: the smaller of
    the deployment's and the tenant's `max_context_tokens`.
    """
    principal = await request_principal(request, Scope.INFERENCE)
    _, parsed = await request_read(request, tokenize_parse)
    route, tokenizer = await _routed(principal, parsed.model)
    if _inline(parsed):
        tokens = _tokens(tokenizer, parsed)
    else:
        tokens = await preprocessed(principal.tenant_id, _tokens, tokenizer, parsed)
    response = json_response(
        {
            "count": len(tokens),
            "max_model_len": min(route.context_length, principal.max_context_tokens),
            "tokens": tokens,
            "token_strs": tokenizer.token_strs(tokens) if parsed.return_token_strs else None,
        }
    )
    response[VERSION_HEADER] = route.version
    return response


@api_endpoint("POST", counted=True)
async def detokenize(request: HttpRequest, request_id: str) -> HttpResponse:
    """vLLM's /detokenize: the text of token ids (special tokens included), as `prompt`."""
    principal = await request_principal(request, Scope.INFERENCE)
    _, parsed = await request_read(request, detokenize_parse)
    route, tokenizer = await _routed(principal, parsed.model)
    vocab = tokenizer.vocab_size
    for index, token in enumerate(parsed.tokens):
        if token >= vocab:
            raise invalid(f"tokens[{index}]", f"Token ids must be in [0, {vocab}), got {token}.")
    if len(parsed.tokens) > INLINE_TOKENIZE_CHARS:
        text = await preprocessed(principal.tenant_id, tokenizer.decode, parsed.tokens)
    else:
        text = tokenizer.decode(parsed.tokens)
    response = json_response({"prompt": text})
    response[VERSION_HEADER] = route.version
    return response


async def _route_now(name: str, principal: Principal) -> Route | None:
    """Where a name routes now for the caller; None where it routes nowhere, or nowhere the
    caller may go (routing_get's 404)."""
    try:
        return (await routing_get(name, principal=principal)).primary
    except ApiError:
        return None


@api_endpoint("GET", counted=True)
async def models_list(request: HttpRequest, request_id: str) -> HttpResponse:
    """The names the key may call: each one routing_get takes for it, and no other."""
    principal = await request_principal(request, Scope.MODELS_READ)
    names = await model_names_get()
    routes = await asyncio.gather(*(_route_now(name, principal) for name, _ in names))
    data = [
        model_card(name, created, route, principal)
        for (name, created), route in zip(names, routes, strict=True)
        if route is not None
    ]
    return json_response({"object": "list", "data": data})


@api_endpoint("GET", counted=True)
async def models_detail(request: HttpRequest, request_id: str, name: str) -> HttpResponse:
    principal = await request_principal(request, Scope.MODELS_READ)
    routing = await routing_get(name, principal=principal)
    body = {
        **model_card(name, int(time.time()), routing.primary, principal),
        "version": routing.primary.version,
    }
    if routing.splits_for(tenant_id=principal.tenant_id):
        # Version -> percent of this tenant's traffic: another tenant's targeting stays unseen.
        body["traffic"] = routing.weights_for(tenant_id=principal.tenant_id)
    return json_response(body)
