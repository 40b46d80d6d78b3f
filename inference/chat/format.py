"""Response bodies and stream chunks exactly as OpenAI's API shapes them, and a chat or
completions request's events written as server-sent events.

The formatter is the one every other surface's answer is built on: the Responses and Messages
APIs turn their requests into chat, and their events into their own from chat's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.types import (
    Delta,
    Event,
    Failed,
    Finished,
    Job,
    RankedLogprob,
    TokenLogprob,
    ToolCallDelta,
)
from inference.base.errors import internal_error
from inference.base.metrics import RequestClock
from inference.body.fields import CHAT
from inference.body.parser import GenerationRequest
from inference.pipeline import relay
from inference.pipeline.admission import request_failure
from inference.pipeline.collect import OnEnd, events_close
from inference.pipeline.tokenization import (
    chat_rendered,
    tokenizer_for,
)
from models_registry.selectors import Route

_json = msgspec.json.Encoder()
log = logging.getLogger(__name__)


def usage_body(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    reasoning_tokens: int | None = None,
    created_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens`: prompt tokens served from the prefix cache;
    `reasoning_tokens`: the completion tokens a reasoning model spent thinking (None: the
    model has no reasoning parser, and the details are left out, as vLLM's server does);
    `created_cache_tokens`: prompt tokens the request computed and wrote to the prefix cache,
    which vLLM's server reports beside `cached_tokens` on chat (None: left out)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        if created_cache_tokens is not None:
            usage["prompt_tokens_details"]["created_cache_tokens"] = created_cache_tokens
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def finished_usage(finished: Finished, *, chat: bool = False) -> dict[str, Any]:
    """The usage object of a finished request; a chat's also counts the prompt tokens it wrote
    to the prefix cache, as vLLM's chat server does (its completions server does not)."""
    return usage_body(
        finished.prompt_tokens,
        finished.completion_tokens,
        finished.cached_tokens,
        finished.reasoning_tokens,
        finished.cache_created_tokens if chat else None,
    )


@dataclass(frozen=True)
class Shape:
    """What a request asked its answer to hold beyond text.

    `logprobs`: chat's top_logprobs (alternatives per token) or completions' logprobs count;
    None: no logprobs. `echo`: the text each prompt's choices start with (completions' prompts,
    or chat's last message when it is the assistant's), one per prompt.
    """

    n: int = 1
    prompts: int = 1
    logprobs: int | None = None
    echo: tuple[str, ...] = ()
    # tool_choice "required" or a named function: a message of tool calls has content ""
    # (as vLLM's server answers); after `auto` it has none (null).
    forced_tools: bool = False
    # vLLM's return_token_ids: each prompt's token ids (None where not known here, as on a
    # replay: then each choice's first delta brings its prompt's) and each choice's output
    # ids go with the answer.
    token_ids: bool = False
    prompt_token_ids: tuple[list[int], ...] | None = None
    # vLLM's return_prompt_text (chat): the rendered template, on the body or each choice's
    # first chunk; None: not asked (or not known: a replay whose version routes nowhere).
    prompt_text: str | None = None
    # vLLM's include_reasoning false: a reasoning model's answer leaves out its thinking and,
    # as vLLM's server does, its logprobs and output token ids (they would show the thinking).
    thinking_hidden: bool = False
    # vLLM's batch chat (a choice per conversation): as its server answers, no prompt's token
    # ids on the body.
    batch: bool = False
    # Each prompt's answer's role where one is not the assistant's (add_generation_prompt
    # false); empty: the assistant's.
    roles: tuple[str, ...] = ()
    # vLLM's continuous_usage_stats: every chunk carries its choice's usage so far, and for a
    # model with a reasoning parser (`thinking`) its thinking tokens so far.
    continuous_usage: bool = False
    thinking: bool = False
    # Completions' echo with max_tokens 0: the choices hold their prompts alone, the one token
    # the engine made left out of their text and logprobs (GenerationRequest.prompt_only).
    prompt_only: bool = False

    def kept(self, delta: Delta) -> Delta:
        """A delta as the answer holds it: without its output when the prompt is all."""
        if not self.prompt_only:
            return delta
        return msgspec.structs.replace(
            delta, text="", logprobs=None if delta.logprobs is None else []
        )

    def role(self, index: int) -> str:
        """The role a chat choice's message is in."""
        roles = self.roles
        return roles[min(index // self.n, len(roles) - 1)] if roles else "assistant"

    def prompt_ids(self, index: int) -> list[int] | None:
        """The token ids of the prompt a choice answers (None: not known here)."""
        prompts = self.prompt_token_ids
        return prompts[min(index // self.n, len(prompts) - 1)] if prompts else None

    @property
    def choices(self) -> int:
        return self.n * self.prompts


@dataclass
class _Choice:
    """One choice's answer so far (a non-streaming response, or a stream's offsets)."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offset: int = 0  # completions' text_offset of the next token
    tokens: int = 0  # output tokens so far (a stream's continuous usage)
    thought: int = 0  # of them, thinking
    started: bool = False  # a chat stream sent this choice's role
    token_ids: list[int] = field(default_factory=list)
    prompt_ranked: list[list[RankedLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = None  # its prompt's, where the worker sent them

    def add(self, delta: Delta) -> None:
        self.prompt_from(delta)
        if delta.prompt_logprobs:
            self.logprobs[:0] = delta.prompt_logprobs
        if delta.prompt_ranked is not None:
            self.prompt_ranked = delta.prompt_ranked
        if delta.token_ids:
            self.token_ids.extend(delta.token_ids)
        self.text.append(delta.text)
        if delta.reasoning:
            self.reasoning.append(delta.reasoning)
        if delta.tool_calls:
            self.calls = _calls_merged(self.calls, delta.tool_calls)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)

    def prompt_from(self, delta: Delta) -> None:
        if delta.prompt_token_ids is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = delta.prompt_token_ids


def _calls_merged(calls: list[ToolCallDelta], pieces: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Whole tool calls from their pieces: a call's name and arguments, by its index."""
    by_index = {call.index: call for call in calls}
    for piece in pieces:
        held = by_index.get(piece.index)
        if held is None:
            by_index[piece.index] = piece
        else:
            by_index[piece.index] = ToolCallDelta(
                index=piece.index,
                id=held.id or piece.id,
                name=(held.name or "") + (piece.name or "") or None,
                arguments=held.arguments + piece.arguments,
            )
    return [by_index[i] for i in sorted(by_index)]


def _call_body(call: ToolCallDelta, *, whole: bool) -> dict[str, Any]:
    """A tool call as OpenAI shapes it: whole in a message, in pieces in a stream."""
    function: dict[str, Any] = {}
    if call.name is not None or whole:
        function["name"] = call.name or ""
    function["arguments"] = call.arguments
    body: dict[str, Any] = {"index": call.index} if not whole else {}
    if call.id is not None or whole:
        body["id"] = call.id
        body["type"] = "function"
    body["function"] = function
    return body


# A count of alternatives that keeps all the engine listed at a position.
EVERY_ALTERNATIVE = sys.maxsize


def token_logprobs(entries: list[TokenLogprob], top: int) -> list[dict[str, Any]]:
    """Each token with its log probability, bytes and first `top` alternatives: chat's
    `logprobs.content`, and a Responses output text's `logprobs`."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob if entry.logprob is not None else -9999.0,
            "bytes": entry.bytes,
            "top_logprobs": [
                {"token": alt.token, "logprob": alt.logprob, "bytes": alt.bytes}
                for alt in entry.top[:top]
            ],
        }
        for entry in entries
    ]


def _chat_logprobs(entries: list[TokenLogprob], top: int) -> dict[str, Any]:
    """Chat's logprobs: each token with its bytes and its first `top` alternatives."""
    return {"content": token_logprobs(entries, top), "refusal": None}


def _prompt_logprobs(ranked: list[list[RankedLogprob] | None]) -> list[Any]:
    """vLLM's `prompt_logprobs` field: per prompt position (null for the first) its tokens by
    id, each with its logprob, rank and text."""
    return [
        None
        if position is None
        else {
            str(entry.token_id): {
                "logprob": entry.logprob,
                "rank": entry.rank,
                "decoded_token": entry.decoded,
            }
            for entry in position
        }
        for position in ranked
    ]


def _completion_logprobs(entries: list[TokenLogprob], top: int, offset: int) -> dict[str, Any]:
    """Completions' logprobs: tokens, their logprobs, the top `top` + 1 and text offsets."""
    offsets: list[int] = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [entry.logprob for entry in entries],
        "tokens": [entry.token for entry in entries],
        "top_logprobs": [
            None
            if entry.logprob is None
            else {alt.token: alt.logprob for alt in entry.top[: top + 1]}
            for entry in entries
        ],
    }


def shape_of(
    request: GenerationRequest,
    *,
    decode: Callable[[list[int]], str],
    prompt_token_ids: tuple[list[int], ...] | None = None,
    prompt_text: str | None = None,
) -> Shape:
    """The shape of a request's answer; `decode` writes token-id prompts back as text (echo).

    `prompt_token_ids`: each prompt's tokens as the engine got them (return_token_ids).
    """
    echo: tuple[str, ...] = ()
    chats = request.chats()
    # As vLLM's server answers: in the assistant's role after a generation prompt, else in the
    # role of the message the answer continues (or follows).
    roles = tuple(
        "assistant" if request.add_generation_prompt else chat[-1]["role"] for chat in chats
    )
    if request.echo and chats:
        # Each conversation's choice opens with its last message, when it is in that role.
        echo = tuple(
            chat[-1]["content"] if chat[-1]["role"] == role else ""
            for chat, role in zip(chats, roles, strict=True)
        )
    elif request.echo and request.return_token_ids:
        # As vLLM's server answers: the prompt comes back as its token ids, not its text.
        echo = ("",) * len(request.prompts)
    elif request.echo:
        echo = tuple(p if isinstance(p, str) else decode(p) for p in request.prompts)
    return Shape(
        n=request.n,
        prompts=max(len(request.prompts), len(request.conversations), 1),
        batch=bool(request.conversations),
        roles=roles if any(role != "assistant" for role in roles) else (),
        # With logprob_token_ids each position lists every entry the engine returned (the
        # sampled token and those ids), as vLLM's server does.
        logprobs=None
        if not request.include_reasoning
        else EVERY_ALTERNATIVE
        if request.logprob_token_ids
        else request.logprobs,
        echo=echo,
        forced_tools=request.tools is not None
        and (request.tools.named or request.tools.choice == "required"),
        token_ids=request.return_token_ids,
        prompt_token_ids=prompt_token_ids if request.answered_with_prompt_ids else None,
        continuous_usage=request.continuous_usage,
        prompt_text=prompt_text if request.return_prompt_text else None,
        thinking_hidden=not request.include_reasoning,
        prompt_only=request.prompt_only,
    )


class Formatter:
    """Build the bodies of one response: ids, model and timestamps fixed at creation."""

    def __init__(
        self,
        *,
        endpoint: str,
        request_id: str,
        model: str,
        created: int,
        fingerprint: str,
        shape: Shape | None = None,
    ) -> None:
        self.chat = endpoint == CHAT
        self.id = f"chatcmpl-{request_id}" if self.chat else f"cmpl-{request_id}"
        self.model = model
        self.created = created
        self.fingerprint = fingerprint
        self.shape = shape or Shape()
        self._choices: dict[int, _Choice] = {}
        self._resumed = False

    def resumed(self) -> None:
        """The client saw this stream's start already (it resumes it): no role chunk again."""
        self._resumed = True

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def _choice(self, index: int) -> _Choice:
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = _Choice(started=self._resumed)
            echo = self.shape.echo
            if echo:
                choice.text.append(echo[min(index // self.shape.n, len(echo) - 1)])
        return choice

    def add(self, delta: Delta) -> None:
        """Keep a delta of a non-streaming response."""
        self._choice(delta.index).add(self.shape.kept(delta))

    def _logprobs(self, entries: list[TokenLogprob], choice: _Choice) -> dict[str, Any] | None:
        top = self.shape.logprobs
        if top is None:
            return None
        if self.chat:
            return _chat_logprobs(entries, top)
        body = _completion_logprobs(entries, top, choice.offset)
        if entries:
            choice.offset = body["text_offset"][-1] + len(entries[-1].token)
        return body

    def complete(self, finished: Finished) -> bytes:
        """Return the body of a non-streaming response from the deltas kept and its end."""
        reasons = finished.reasons()
        choices = []
        scored: dict[int, list[Any]] = {}  # each prompt's prompt_logprobs, built once
        for index in range(max(len(reasons), self.shape.choices)):
            kept = self._choice(index)
            text = "".join(kept.text)
            reason = reasons[index] if index < len(reasons) else finished.finish_reason
            logprobs = self._logprobs(kept.logprobs, kept)
            if self.chat:
                message: dict[str, Any] = {
                    "role": self.shape.role(index),
                    # null when the answer is all tool calls or all thinking (vLLM's server).
                    "content": text
                    if text
                    or self.shape.forced_tools
                    or not (kept.calls or finished.reasoning_tokens is not None)
                    else None,
                    "refusal": None,
                }
                if finished.reasoning_tokens is not None:
                    # The model has a reasoning parser: vLLM's server names the field always.
                    message["reasoning"] = "".join(kept.reasoning) or None
                if kept.calls:
                    message["tool_calls"] = [_call_body(c, whole=True) for c in kept.calls]
                choice: dict[str, Any] = {
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "stop_reason": finished.stop_reason(index),
                }
            else:
                choice = {
                    "index": index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "stop_reason": finished.stop_reason(index),
                }
                if self.shape.token_ids:
                    choice["prompt_token_ids"] = self._prompt_ids(index)
                # Each choice lists its prompt's, which came with the prompt's first choice.
                ranked = self._choice(index - index % self.shape.n).prompt_ranked
                if ranked is not None:
                    choice["prompt_logprobs"] = scored.setdefault(
                        index // self.shape.n, _prompt_logprobs(ranked)
                    )
            if self.shape.token_ids:
                choice["token_ids"] = None if self.shape.thinking_hidden else kept.token_ids
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion")
        if self.chat and self.shape.token_ids and not self.shape.batch:
            body["prompt_token_ids"] = self._prompt_ids(0)
        if self.shape.prompt_text is not None:
            body["prompt_text"] = self.shape.prompt_text
        # Chat has one prompt: its logprobs go on the body, as vLLM's server writes them.
        ranked = self._choice(0).prompt_ranked if self.chat else None
        if ranked is not None:
            body["prompt_logprobs"] = _prompt_logprobs(ranked)
        body["choices"] = choices
        body["usage"] = finished_usage(finished, chat=self.chat)
        return _json.encode(body)

    def _prompt_ids(self, index: int) -> list[int] | None:
        """The token ids of the prompt a choice answers: the frontend's, else the worker's
        (a replay, which has no job)."""
        known = self.shape.prompt_ids(index)
        return known if known is not None else self._choice(index).prompt_token_ids

    def chunk(self, delta: Delta, *, include_usage: bool) -> bytes | None:
        """Return the SSE event carrying a delta, or None when it carries nothing to send."""
        delta = self.shape.kept(delta)
        choice = self._choice(delta.index)
        choice.prompt_from(delta)
        choice.tokens += delta.tokens
        choice.thought += delta.thinking_tokens
        entries = [*(delta.prompt_logprobs or []), *(delta.logprobs or [])]
        text = delta.text
        if not self.chat and self.shape.echo and not choice.started:
            text = "".join(choice.text) + text  # the echoed prompt opens the choice
        ids = delta.token_ids if self.shape.token_ids else None  # the worker drops hidden ones
        thought = delta.reasoning
        if not (
            text
            or thought
            or delta.tool_calls
            or entries
            or ids
            or (self.chat and not choice.started)
        ):
            return None
        logprobs = (
            self._logprobs(entries, choice) if entries or delta.logprobs is not None else None
        )
        return self._chunk(
            delta.index,
            text,
            None,
            include_usage,
            delta.tool_calls,
            logprobs,
            ids or [],
            reasoning=thought,
        )

    def _chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        include_usage: bool,
        calls: list[ToolCallDelta] | None = None,
        logprobs: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
        *,
        reasoning: str = "",
        stop_reason: str | int | None = None,
    ) -> bytes:
        """One SSE event of one choice. With return_token_ids, each carries its tokens' ids,
        and a choice's first one its prompt's (chat: on the body, as vLLM writes it)."""
        choice = self._choice(index)
        first = not choice.started
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = self.shape.role(index)
                echo = "".join(choice.text)
                text = echo + text
            if text or (first and not calls and not reasoning):
                delta["content"] = text
            if reasoning:
                delta["reasoning"] = reasoning
            if calls:
                delta["tool_calls"] = [_call_body(c, whole=False) for c in calls]
            body_choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion.chunk")
            if first and self.shape.token_ids:
                body["prompt_token_ids"] = self._prompt_ids(index)
            if first and self.shape.prompt_text is not None:
                body["prompt_text"] = self.shape.prompt_text
        else:
            body_choice = {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            body = self._envelope("text_completion")
            if first and (self.shape.token_ids or self.shape.echo):
                # vLLM's server opens an echoed stream's choice with its prompt's ids too.
                body_choice["prompt_token_ids"] = self._prompt_ids(index)
        if finish_reason is not None:
            # vLLM's: the stop string or token id that ended the choice (null: neither).
            body_choice["stop_reason"] = stop_reason
        if self.shape.token_ids:
            body_choice["token_ids"] = None if self.shape.thinking_hidden else token_ids or []
        choice.started = True
        body["choices"] = [body_choice]
        if include_usage:
            body["usage"] = self._running_usage(index) if self.shape.continuous_usage else None
        return b"data: " + _json.encode(body) + b"\n\n"

    def _running_usage(self, index: int) -> dict[str, Any]:
        """A choice's usage so far, as vLLM's continuous_usage_stats writes it on a chunk: its
        prompt's tokens, the tokens it has produced and, of a reasoning model, its thinking."""
        prompt = self._prompt_ids(index)
        prompt_tokens = len(prompt) if prompt is not None else 0
        choice = self._choice(index)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": choice.tokens,
            "total_tokens": prompt_tokens + choice.tokens,
        }
        if self.shape.thinking:
            usage["completion_tokens_details"] = {"reasoning_tokens": choice.thought}
        return usage

    def finish_chunks(self, finished: Finished, *, include_usage: bool) -> list[bytes]:
        """Return the events that end every choice of a stream (and its usage, if asked)."""
        reasons = finished.reasons()
        chunks = []
        for index in range(max(len(reasons), self.shape.choices)):
            reason = reasons[index] if index < len(reasons) else finished.finish_reason
            text = ""
            if not self.chat and self.shape.echo and not self._choice(index).started:
                text = "".join(self._choice(index).text)
            stop = finished.stop_reason(index)
            chunks.append(self._chunk(index, text, reason, include_usage, stop_reason=stop))
        if include_usage:
            chunks.append(self.usage_chunk(finished))
        return chunks

    def usage_chunk(self, finished: Finished) -> bytes:
        """Return the final chunk that carries usage (`stream_options.include_usage`)."""
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = finished_usage(finished, chat=self.chat)
        return b"data: " + _json.encode(body) + b"\n\n"


def error_chunk(body: dict[str, Any]) -> bytes:
    """Return an SSE event carrying an error, which OpenAI's SDKs raise as an APIError."""
    return b"data: " + _json.encode(body) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def answer_shape(
    request: GenerationRequest,
    route: Route,
    job: Job | None = None,
    *,
    rendered: str | None = None,
) -> Shape:
    """The shape of a request's answer; token-id prompts echo as the tokenizer writes them,
    and the job's prompts are the token ids a return_token_ids answer carries.

    `rendered`: the chat template as submission rendered it (return_prompt_text); rendered
    here when not given (a replay, which was not submitted).
    """

    def decode(ids: list[int]) -> str:
        tokenizer = tokenizer_for(digest=route.version_digest, directory=route.artifact_dir)
        return tokenizer.decode(ids)

    # Split only when the answer carries them: most requests never need the copies.
    wanted = job is not None and request.answered_with_prompt_ids
    prompts = tuple(job.inputs()) if wanted and job is not None else None
    if request.return_prompt_text and rendered is None:
        rendered = chat_rendered(request, route)
    shape = shape_of(request, decode=decode, prompt_token_ids=prompts, prompt_text=rendered)
    if job is not None and job.reasoning is not None and request.continuous_usage:
        shape = dataclasses.replace(shape, thinking=True)
    return shape


def formatter_for(
    *,
    endpoint: str,
    request_id: str,
    model: str,
    version: str | None,
    created: int,
    shape: Shape | None = None,
) -> Formatter:
    """The response builder of a request; a replay builds the same one from its record.

    Its `system_fingerprint` names the answering version; None: a version not known (a batch
    line resumed by another runner)."""
    return Formatter(
        endpoint=endpoint,
        request_id=request_id,
        model=model,
        created=created,
        shape=shape,
        fingerprint="rh" if version is None else f"rh-{version}",
    )


async def sse_chunks(
    events: AsyncIterator[Event],
    include_usage: bool,
    formatter: Formatter,
    on_end: OnEnd,
    clock: RequestClock,
    *,
    cursor: relay.Cursor | None = None,
) -> AsyncIterator[bytes]:
    """Write a request's events as SSE; with a cursor, each write carries its stream id.

    A client that loses the stream resumes it after the last id it saw
    (`GET /v1/requests/{id}/stream` with `Last-Event-ID`). Tenants whose output is filtered
    get no ids: their text is held back, so the stream's position is not theirs.
    """
    ended = False
    try:
        async for chunk in _chunks(events, include_usage, formatter, on_end, clock):
            ended = chunk.endswith(DONE)
            yield chunk if cursor is None else b"id: " + cursor.last.encode() + b"\n" + chunk
        clock.lap("relay")
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the client is gone: nobody is left to tell
    except BaseException as exc:
        # Whatever broke mid-stream, the client still gets one terminal event; the request,
        # if it still runs, is cancelled as its events are closed below.
        log.error("the stream of %s failed", formatter.id, exc_info=True)
        if not ended:
            yield error_chunk(internal_error().body())
            yield DONE
        if not isinstance(exc, Exception):
            raise
    finally:
        await events_close(events)
        clock.finish()


async def _chunks(
    events: AsyncIterator[Event],
    include_usage: bool,
    formatter: Formatter,
    on_end: OnEnd,
    clock: RequestClock,
) -> AsyncIterator[bytes]:
    async for event in events:
        if isinstance(event, Finished | Failed):
            clock.skip()  # the worker timed everything up to its terminal event
        if isinstance(event, Delta):
            chunk = formatter.chunk(event, include_usage=include_usage)
            if chunk is not None:
                yield chunk
        elif isinstance(event, Finished):
            if on_end is not None:
                on_end(event)
            # The end's events (each choice's finish, the usage, [DONE]) go in one write.
            yield b"".join([*formatter.finish_chunks(event, include_usage=include_usage), DONE])
            return
        elif isinstance(event, Failed):
            if on_end is not None:
                on_end(event)
            yield error_chunk(request_failure(event).body()) + DONE
            return


async def done_only() -> AsyncIterator[bytes]:
    yield DONE
