"""A tenant's safety policy on the request path: screen the input, filter the output stream.

The input is screened before admission (a blocked request costs the tenant nothing and never
reaches a queue); PII is redacted in place when the pack says so. The output is filtered as it
streams, in the relay, so SSE, JSON bodies, WebSockets and batches all get the same text: PII
redacted, and toxic or denied text stopped before it is sent, the generation aborted in the
engine and ended with `finish_reason: "content_filter"`; the tenant is billed for the tokens
generated up to the stop. Every intervention is recorded for the tenant, without the text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
from django.conf import settings

from config.db import db_call
from dataplane.background import spawn
from dataplane.types import Delta, Event, Failed, Finished, ToolCallDelta
from inference.base.errors import ApiError
from inference.body.parser import GenerationRequest
from inference.pipeline.control_cache import RefreshingCache
from models_registry.tokenizer import CONTENT_PARTS
from safety.detectors import Finding
from safety.policy import Policy
from safety.selectors import policy_load
from safety.services import interventions_record

log = logging.getLogger(__name__)

# Text longer than this is screened off the event loop: the classifier is CPU work.
_INLINE_CHARS = 4_000


def _load(key: tuple[int, str]) -> Policy | None:
    tenant_id, version = key
    return policy_load(tenant_id=tenant_id, version=version)


_policies: RefreshingCache[tuple[int, str], Policy | None] = RefreshingCache(
    _load, ttl=lambda: settings.ROUNDHOUSE_ROUTE_CACHE_SECONDS, grace=30.0, kind="policies"
)


async def policy_get(*, tenant_id: int, version: str) -> Policy | None:
    """Return the policy of a tenant's request that a version serves, cached briefly.

    `version`: the served version's id (`Route.version`, the part of a served name after
    `@`, or a digest), never the name the client sent: an alias, its model's name and a
    pinned version reach one model and get one policy (safety.selectors.policy_load).
    """
    return await _policies.get((tenant_id, version[:12]))


def served_version(served_name: str) -> str:
    """The version id of a served name (`model@version`, as responses name their model)."""
    return served_name.partition("@")[2]


def _record(
    request_id: str, tenant_id: int, stage: str, findings: Sequence[Finding], action: str
) -> None:
    # The audit of what a policy did never holds up the client and never fails its request.
    async def write() -> None:
        try:
            await db_call(
                interventions_record,
                tenant_id=tenant_id,
                request_id=request_id,
                stage=stage,
                findings=list(findings),
                action=action,
            )
        except Exception:
            log.warning("could not record a %s intervention", stage, exc_info=True)

    spawn(write())


def _screened(policy: Policy, texts: list[str]) -> tuple[list[str], list[Finding], str]:
    """Each text as the policy lets it through, what it found, and the strongest action."""
    out: list[str] = []
    found: list[Finding] = []
    action = "allow"
    for text in texts:
        verdict = policy.check_input(text)
        found.extend(verdict.findings)
        if verdict.action == "block":
            return [], found, "block"
        if verdict.action == "redact":
            action = "redact"
        out.append(verdict.text)
    return out, found, action


def token_output_check(request: GenerationRequest, *, policy: Policy | None) -> None:
    """Refuse token-level output where the tenant's policy screens the output text.

    The screen reads text and redacts or stops it; log probabilities and token ids name the
    tokens themselves, so they would carry what the screen took out of the text.
    """
    if policy is None or not policy.apply_to_output:
        return
    asked = "logprobs" if request.logprobs is not None else None
    if asked is None and request.prompt_logprobs is not None:
        asked = "prompt_logprobs"  # the likeliest tokens at each position are the model's
    if asked is None and request.return_token_ids:
        asked = "return_token_ids"
    if asked is not None:
        raise ApiError(
            400,
            "unsupported_parameter",
            f"'{asked}' is not available here: this tenant's safety policy screens the "
            "output text, and token-level output would carry what the screen removes.",
            param=asked,
        )


def _redacted(message: dict[str, Any], text: str) -> dict[str, Any]:
    """A message with its screened text; a redacted one's parts give way to that one text (a
    template that loops over content writes it as one part)."""
    if text == message["content"]:
        return message
    return {**{k: v for k, v in message.items() if k != CONTENT_PARTS}, "content": text}


async def input_screen(
    request: GenerationRequest, *, policy: Policy | None, tenant_id: int, request_id: str
) -> GenerationRequest:
    """Return the request as its tenant's policy lets it through, or raise 400 if it blocks."""
    if policy is None or not policy.apply_to_input:
        return request
    chats = request.chats()
    if chats:
        texts = [str(m["content"]) for chat in chats for m in chat]
        param = "messages"
    else:
        # Token-id prompts: nothing to read.
        texts, param = [p for p in request.prompts if isinstance(p, str)], "prompt"
        if not texts:
            return request
    if sum(len(t) for t in texts) > _INLINE_CHARS:
        passed, found, action = await asyncio.to_thread(_screened, policy, texts)
    else:
        passed, found, action = _screened(policy, texts)
    if action == "allow":
        return request
    if action == "block":
        _record(request_id, tenant_id, "input", found, "block")
        detectors = ", ".join(sorted({f.detector for f in found}))
        raise ApiError(
            400,
            "content_policy_violation",
            f"The input was blocked by this tenant's content policy ({detectors}).",
            param=param,
        )
    _record(request_id, tenant_id, "input", found, "redact")
    if chats:
        screened = iter(passed)
        return request.with_chats([[_redacted(m, next(screened)) for m in chat] for chat in chats])
    redacted = iter(passed)
    prompts = tuple(next(redacted) if isinstance(p, str) else p for p in request.prompts)
    return dataclasses.replace(
        request, prompts=prompts, prompt=prompts[0] if len(prompts) == 1 else None
    )


async def output_filtered(
    events: AsyncIterator[Event],
    *,
    policy: Policy,
    tenant_id: int,
    request_id: str,
    prompt_tokens: int,
    stop: Callable[[], Awaitable[object]],
) -> AsyncIterator[Event]:
    """Yield a request's events with its text and tool arguments filtered; end with
    content_filter on a stop.

    `stop` aborts the request in the engine. Deltas keep their token counts so that streamed
    usage still adds up; text held back for checking goes out with a later delta or at the end.
    A stop reports `prompt_tokens` (0 when the caller does not know them: an attached reader).
    """
    screens: dict[int, Any] = {}  # one per choice: each choice's text is read on its own
    # One per tool call of a choice: a call's arguments are text the client acts on, read
    # like the content (a denied term in them stops the stream; PII in them is redacted).
    call_screens: dict[tuple[int, int], Any] = {}
    # One per choice for a reasoning model's thinking, which the client reads too.
    thought_screens: dict[int, Any] = {}
    thought_over: set[int] = set()  # choices whose answer began: their thinking has ended
    tokens = 0
    try:
        async for event in events:
            if isinstance(event, Delta):
                tokens += event.tokens
                screen = screens.setdefault(event.index, policy.output_filter())
                step = screen.feed(event.text)
                calls, call_stop = _calls_screened(event, call_screens, policy)
                thought, thought_stop = event.reasoning, False
                thinking = thought_screens.get(event.index)
                if thought:
                    thinking = thought_screens.setdefault(event.index, policy.output_filter())
                    screened = thinking.feed(thought)
                    thought, thought_stop = screened.text, screened.stop is not None
                answering = bool(event.text or event.tool_calls)
                if thinking is not None and answering and event.index not in thought_over:
                    # The answer began, so the thinking is over: what its screen held back
                    # goes out now, ahead of the answer, not after it at the end.
                    thought_over.add(event.index)
                    held = thinking.finish()
                    thought += held.text
                    thought_stop = thought_stop or held.stop is not None
                if step.stop is not None or call_stop or thought_stop:
                    if step.text or calls or thought:
                        yield msgspec.structs.replace(
                            event, text=step.text, tool_calls=calls, reasoning=thought
                        )
                    await stop()
                    yield Finished(
                        finish_reason="content_filter",
                        prompt_tokens=prompt_tokens,
                        completion_tokens=tokens,
                    )
                    return
                if step.text or event.tokens or calls or thought or event.logprobs:
                    yield msgspec.structs.replace(
                        event, text=step.text, tool_calls=calls, reasoning=thought
                    )
                continue
            if isinstance(event, Finished | Failed):
                stopped = False
                for index, screen in screens.items():
                    step = screen.finish()
                    if step.text:
                        yield Delta(text=step.text, tokens=0, index=index)
                    stopped = stopped or step.stop is not None
                for index, screen in thought_screens.items():
                    if index in thought_over:
                        continue
                    step = screen.finish()
                    if step.text:
                        yield Delta(text="", tokens=0, index=index, reasoning=step.text)
                    stopped = stopped or step.stop is not None
                for (index, call), screen in call_screens.items():
                    step = screen.finish()
                    if step.text:
                        held = [ToolCallDelta(index=call, arguments=step.text)]
                        yield Delta(text="", tokens=0, index=index, tool_calls=held)
                    stopped = stopped or step.stop is not None
                if stopped and isinstance(event, Finished):
                    event = msgspec.structs.replace(event, finish_reason="content_filter")
            yield event
    finally:
        for screen in [*screens.values(), *call_screens.values(), *thought_screens.values()]:
            if screen.redactions:
                _record(request_id, tenant_id, "output", screen.redactions, "redact")
            if screen.stopped is not None:
                _record(request_id, tenant_id, "output", [screen.stopped], "stop")


def _calls_screened(
    event: Delta, screens: dict[tuple[int, int], Any], policy: Policy
) -> tuple[list[ToolCallDelta] | None, bool]:
    """A delta's tool-call pieces with their arguments screened; True when one must stop."""
    if not event.tool_calls:
        return event.tool_calls, False
    calls: list[ToolCallDelta] = []
    for piece in event.tool_calls:
        screen = screens.setdefault((event.index, piece.index), policy.output_filter())
        step = screen.feed(piece.arguments)
        if step.stop is not None:
            return calls or None, True
        calls.append(msgspec.structs.replace(piece, arguments=step.text))
    return calls, False
