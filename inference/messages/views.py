"""`/v1/messages` (whole or streamed) and `/v1/messages/count_tokens`: Anthropic's Messages API.

The request runs on the chat path (inference.messages.protocol); its errors are in Anthropic's
shape (inference.base.errors.ApiError.response), and a key may come as `x-api-key`
(inference.pipeline.auth).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jinja2
import jinja2.ext
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dataplane.types import Failed, Finished
from inference.base.errors import ApiError
from inference.base.metrics import RequestClock
from inference.body.parser import GenerationRequest, template_kwargs_with_effort
from inference.edge.endpoint import (
    api_endpoint,
    finished_check,
    generation_submitted,
    idempotency_key,
    json_response,
    request_clock,
    request_principal,
    request_read,
    sse_response,
    whole_replayed,
)
from inference.messages.format import PING, MessageBuilder
from inference.messages.protocol import EFFORTS, MESSAGES, messages_chat, needs_of, thinking_shown
from inference.pipeline import relay
from inference.pipeline.admission import VERSION_HEADER, Submitted, request_ended
from inference.pipeline.auth import Principal, unnarrowed
from inference.pipeline.clients import dispatch_get, routing_get
from inference.pipeline.collect import completion_collect
from inference.pipeline.event_streams import builder_stream
from inference.pipeline.idempotency import Original
from inference.pipeline.preprocessing import preprocessed
from inference.pipeline.tokenization import Tokenizer, prompts_read, tokenizer_of
from models_registry.selectors import Route
from tenants.models import Scope

# Per model version (its digest): what converting a Messages request needs of its template.
_merges_inline_system: dict[str, bool] = {}
_thinking_off_effort: dict[str, str] = {}


def _rejects_inline_system(template: str | None) -> bool:
    """Whether a chat template refuses a system message after the first (Qwen's templates
    raise unless the system message leads). Probed as vLLM's Messages server probes it: a
    system, user, system, user conversation rendered in a bare sandbox, so both merge the
    inline system messages for the same templates."""
    if not template:
        return True
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    turns = [{"role": role, "content": "t"} for role in ("system", "user", "system", "user")]
    try:
        environment.from_string(template).render(messages=turns, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def _effort_rendered(tokenizer: Tokenizer, effort: str) -> str | None:
    try:
        return tokenizer.render_chat(
            [{"role": "user", "content": "Hi"}],
            template_kwargs=template_kwargs_with_effort(None, effort),
        )
    except ApiError:
        return None


def _effort_that_turns_thinking_off(tokenizer: Tokenizer) -> str:
    """The reasoning effort `thinking: {"type": "disabled"}` sends: "none", unless the template
    refuses it or writes it as one of the real efforts (one that reads an unknown effort as
    its highest); then "low". As vLLM's Messages server chooses it."""
    off = _effort_rendered(tokenizer, "none")
    if off is None or any(_effort_rendered(tokenizer, e) == off for e in EFFORTS):
        return "low"
    return "none"


async def _chat_request(
    request: HttpRequest, principal: Principal, *, count: bool
) -> tuple[dict[str, Any], GenerationRequest, Route | None]:
    """The body, and its chat request; a body whose conversion depends on the template (a
    system message inside `messages`, thinking turned off) is converted for the version it
    routes to, which comes with it (None: not routed yet)."""
    tenant = principal.tenant_id
    # Checked before any lookup (a large body off the event loop).
    body, chat = await request_read(
        request, functools.partial(messages_chat, count=count, tenant_id=tenant)
    )
    needs = needs_of(body)
    if not (needs.inline_system or needs.thinking_disabled):
        return body, chat, None
    routing = await routing_get(chat.model, principal=principal)
    route = routing.pick(tenant_id=tenant, user=chat.user)
    digest = route.version_digest
    tokenizer = await tokenizer_of(route)
    merge, effort = False, "none"
    if needs.inline_system:
        if digest not in _merges_inline_system:
            _merges_inline_system[digest] = any(
                _rejects_inline_system(tokenizer.chat_template(tools=tools))
                for tools in (False, True)
            )
        merge = _merges_inline_system[digest]
    if needs.thinking_disabled:
        if digest not in _thinking_off_effort:
            _thinking_off_effort[digest] = _effort_that_turns_thinking_off(tokenizer)
        effort = _thinking_off_effort[digest]
    convert = functools.partial(
        messages_chat,
        body,
        count=count,
        merge_inline_system=merge,
        disabled_effort=effort,
        tenant_id=tenant,
    )
    return body, await preprocessed(tenant, convert), route


@api_endpoint("POST", counted=True)
async def messages_create(request: HttpRequest, request_id: str) -> HttpResponseBase:
    principal = await request_principal(request, Scope.INFERENCE)
    key = idempotency_key(request)
    body, chat, _ = await _chat_request(request, principal, count=False)
    clock = request_clock(request)
    submitted = await generation_submitted(
        request,
        principal=principal,
        chat=chat,
        body=body,
        request_id=request_id,
        api=MESSAGES,
        key=key,
        replay=functools.partial(_replay, chat=chat, body=body, clock=clock, principal=principal),
    )
    if not isinstance(submitted, Submitted):
        return submitted
    builder = MessageBuilder(
        message_id=f"msg_{request_id}",
        model=submitted.route.served_name,
        prompt_tokens=sum(len(ids) for ids in submitted.job.inputs()),
        thinking_shown=thinking_shown(body),
    )
    events = relay.events(dispatch_get(), submitted)
    response: HttpResponseBase
    if chat.stream:

        async def settled(event: Finished | Failed) -> None:
            request_ended(submitted, event)

        stream = builder_stream(events, builder, clock, name=builder.message_id, at_end=settled)
        response = sse_response(stream, keepalive=PING)
    else:
        on_end = functools.partial(request_ended, submitted)
        response = json_response(await completion_collect(events, builder, on_end))
        clock.skip()
    return submitted.headed(response)


async def _replay(
    original: Original,
    chat: GenerationRequest,
    body: dict[str, Any],
    clock: RequestClock,
    *,
    principal: Principal,
) -> HttpResponseBase | None:
    """The message the key's first request answered, again from its reply stream (kept as
    long as the key), or None when that request failed (this one then runs in its place).

    The tenant's safety policy filters the replayed text as it filtered the original's. The
    prompt's size a stream opens with is counted again with the answering version's
    tokenizer (the reply stream keeps the output, not the prompt).
    """
    if not chat.stream:
        await finished_check(original)
    prompt_tokens = 0
    if chat.stream:
        with contextlib.suppress(ApiError):  # a version that routes nowhere now: not counted
            route = (await routing_get(original.model, principal=unnarrowed(principal))).primary
            ids, _ = await preprocessed(principal.tenant_id, prompts_read, chat, route)
            prompt_tokens = sum(len(prompt) for prompt in ids)
    builder = MessageBuilder(
        message_id=f"msg_{original.request_id}",
        model=original.model,
        prompt_tokens=prompt_tokens,
        thinking_shown=thinking_shown(body),
    )
    events = await relay.original_events(original, tenant_id=principal.tenant_id)
    if chat.stream:
        stream = builder_stream(events, builder, clock, name=builder.message_id)
        return sse_response(stream, keepalive=PING)
    return await whole_replayed(events, builder)


@api_endpoint("POST", counted=True)
async def messages_count_tokens(request: HttpRequest, request_id: str) -> HttpResponse:
    """The input tokens a Messages request would take: its conversation, system prompt and
    tools as the routed version's template writes them."""
    principal = await request_principal(request, Scope.INFERENCE)
    _, chat, route = await _chat_request(request, principal, count=True)
    if route is None:
        routing = await routing_get(chat.model, principal=principal)
        route = routing.pick(tenant_id=principal.tenant_id, user=chat.user)
    ids, _ = await preprocessed(principal.tenant_id, prompts_read, chat, route)
    count = sum(len(prompt) for prompt in ids)
    response = json_response(
        {"input_tokens": count, "context_management": {"original_input_tokens": count}}
    )
    response[VERSION_HEADER] = route.version
    return response
