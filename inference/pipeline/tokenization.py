"""Chat templating and tokenisation on the frontend, with each version's own tokenizer.

The tokenizer is the registry's (models_registry.tokenizer); here its failures become the
API's errors: a conversation the template refuses is the client's 400, a tokenizer that
cannot be loaded a 503 to retry. A request's prompts (or embedding inputs) become token ids
here, and one certainly longer than the context is refused before the template or the
tokenizer runs.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.base.errors import ApiError, invalid
from inference.base.metrics import prompt_rendered
from inference.body.fields import CHAT
from inference.body.inputs import MAX_MESSAGES
from inference.body.parser import EmbeddingRequest, GenerationRequest
from models_registry import tokenizer as registry
from models_registry.selectors import Route
from models_registry.tokenizer import (
    CONTENT_PARTS,
    ChatMessageInvalid,
    ChatTemplateKwargsRejected,
    ChatTemplateMissing,
    ChatTemplateRejected,
    TokenizerUnavailable,
)

# Prompts longer than this (in characters, or token ids), or conversations of more messages,
# are rendered and tokenised off the event loop (about a millisecond's work inline at most).
INLINE_TOKENIZE_CHARS = 16_000
INLINE_MESSAGES = 256


class Tokenizer(registry.Tokenizer):
    """A version's tokenizer whose refusals of a conversation are the API's 400s."""

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        documents: Sequence[Mapping[str, str]] | None = None,
    ) -> str:
        prompt_rendered()
        try:
            return super().render_chat(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=template_kwargs,
                documents=documents,
            )
        except ChatTemplateMissing as exc:
            raise _template_missing() from exc
        except ChatMessageInvalid as exc:
            raise ApiError(400, "invalid_value", str(exc), param="messages") from exc
        except ChatTemplateKwargsRejected as exc:
            raise ApiError(
                400,
                "invalid_value",
                f"This model's chat template failed on the chat_template_kwargs: {exc}",
                param="chat_template_kwargs",
            ) from exc
        except ChatTemplateRejected as exc:
            raise ApiError(
                400,
                "invalid_value",
                f"This model's chat template rejected the messages: {exc}",
                param="messages",
            ) from exc

    def encode_with(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Encode text as vLLM's /tokenize does: with the special tokens (BOS) or without."""
        return self.encode_ids(text, add_special_tokens=add_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str]:
        """The vocabulary entry of each token id (vLLM's `return_token_strs`)."""
        return [str(token) for token in self._hf.convert_ids_to_tokens(ids)]

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included, as vLLM's /detokenize writes it."""
        return str(self._hf.decode(ids))


def _template_missing() -> ApiError:
    return ApiError(
        400,
        "chat_template_missing",
        "This model has no chat template; call /v1/completions instead.",
        param="model",
    )


def tokenizer_for(*, digest: str, directory: Path) -> Tokenizer:
    """Return the cached tokenizer of a version, loading it once per process."""
    try:
        return registry.tokenizer_for(digest=digest, directory=directory, kind=Tokenizer)
    except TokenizerUnavailable as exc:
        raise ApiError(
            503,
            "tokenizer_unavailable",
            "The tokenizer of this model version could not be loaded.",
            retry_after=30,
        ) from exc


async def tokenizer_of(route: Route) -> Tokenizer:
    """A version's tokenizer, for a request on the event loop: the first time in this process
    it loads in a thread, so every other stream on the frontend goes on meanwhile."""
    if tokenizer_ready(route):
        return tokenizer_for(digest=route.version_digest, directory=route.artifact_dir)
    return await asyncio.to_thread(
        tokenizer_for, digest=route.version_digest, directory=route.artifact_dir
    )


def tokenizer_ready(route: Route) -> bool:
    """Whether a version's tokenizer is loaded in this process (see `tokenizer_of`)."""
    return registry.tokenizer_loaded(digest=route.version_digest, kind=Tokenizer)


def prepared_inline(request: GenerationRequest) -> bool:
    """Whether a request's prompts are cheap enough to render and tokenise on the event loop:
    short, of few messages, with no tools (their schemas go through the template) and no
    truncation to search for."""
    if request.tools is not None or request.truncate_turns:
        return False
    if sum(len(chat) for chat in request.chats()) > INLINE_MESSAGES:
        return False
    return prompt_chars(request) <= INLINE_TOKENIZE_CHARS


def prompt_chars(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(m["content"]) for chat in request.chats() for m in chat)
    return sum(len(p) for p in request.prompts if isinstance(p, str))


def prompt_ids(
    request: GenerationRequest, route: Route, *, context: int | None = None
) -> list[list[int]]:
    """Tokenise a request's prompts (a chat's conversation is one).

    A prompt that is certainly longer than `context` tokens (its text alone says so) is
    refused before the tokenizer runs: tokenising megabytes takes seconds.
    """
    return prompts_read(request, route, context=context)[0]


def prompts_read(
    request: GenerationRequest, route: Route, *, context: int | None = None
) -> tuple[list[list[int]], str | None]:
    """`prompt_ids`, and a chat's conversation as its template rendered it (None for
    completions): the text those ids encode, which return_prompt_text answers with."""
    tokenizer = tokenizer_for(digest=route.version_digest, directory=route.artifact_dir)
    vocab = tokenizer.vocab_size
    _vocabulary_check(request, vocab)
    keep = kept_tokens(request.truncate_prompt_tokens, context, generation=True)
    cut = _truncation(keep, request.truncation_side, default="left")
    prompts: list[list[int]] = []
    if request.endpoint == CHAT:
        chats = request.chats()
        texts = []
        for i, messages in enumerate(chats):
            param = f"messages[{i}]" if request.conversations else "messages"
            if cut is None:  # a conversation to be truncated may be as long as it likes
                _user_turn_floor_check(tokenizer, messages, context, param=param)
            text = _rendered(tokenizer, request, messages)
            # The template writes the special tokens (BOS) itself, unless the client asks.
            special = bool(request.add_special_tokens)
            prompts.append(_encoded(tokenizer, text, param, context, special=special, cut=cut))
            texts.append(text)
        return prompts, texts[0]
    for i, prompt in enumerate(request.prompts):
        param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
        if isinstance(prompt, list):
            if any(not 0 <= t < vocab for t in prompt):
                message = f"Token ids must be in [0, {vocab})."
                raise ApiError(400, "invalid_value", message, param=param)
            prompts.append(prompt if cut is None else cut.ids(prompt))
        else:
            # As vLLM's server encodes a completions prompt: with the special tokens (BOS)
            # unless the client turns them off.
            special = request.add_special_tokens is not False
            prompts.append(_encoded(tokenizer, prompt, param, context, special=special, cut=cut))
        if not prompts[-1]:
            # An empty text without special tokens, or a prompt cut to nothing: the engine
            # refuses a prompt of no tokens (vLLM's server: "The decoder prompt cannot be empty").
            message = f"'{param}' is empty: it has no tokens."
            raise ApiError(400, "invalid_value", message, param=param)
    return prompts, None


def turn_starts(messages: Sequence[Mapping[str, Any]], *, most: int | None = None) -> list[int]:
    """Where a conversation's kept messages may start once its oldest turns go, oldest first.

    Dropping a turn drops the oldest message and the tool answers that followed it; the
    instructions (a first system message) always stay, and so does the newest message. The
    first start keeps everything; with `most`, the first keeps at most that many messages
    (but never less than the newest).
    """
    head = _head(messages)
    starts = [head]
    start, end = head, len(messages)
    while end - start > 1:
        start += 1
        while end - start > 1 and messages[start]["role"] == "tool":
            start += 1
        starts.append(start)
    if most is None:
        return starts
    held = [s for s in starts if head + end - s <= most]
    return held or starts[-1:]


def kept_from(messages: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    """The conversation from `start` on (one of `turn_starts`), with its instructions."""
    return messages[: _head(messages)] + messages[start:]


def _head(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many of a conversation's first messages are its instructions (0 or 1)."""
    return 1 if messages and messages[0]["role"] == "system" else 0


def turns_fitted(
    request: GenerationRequest, route: Route, *, context: int, seconds: float
) -> GenerationRequest:
    """The request with its conversation's oldest turns dropped until its prompt fits.

    The Responses API's truncation "auto": as many of the newest turns as fit the context
    with the output's room (max_tokens, or one token) are kept, as dropping the oldest turn
    one at a time would keep. The cut is searched for from the newest end, each render's
    token count guessing where the next should be (`_CutSearch`), so a conversation of
    thousands of turns takes a handful of renders, none much longer than what is kept. When
    not even the newest turn fits, only it is kept: submitting it then says why. Past
    `seconds` the search stops with a 400: under a bounded number of messages and renders,
    only a conversation of extreme texts takes that long.
    """
    messages = request.messages
    assert messages is not None, "only a chat's conversation is truncated"
    # A conversation longer than a prompt may be keeps at most the newest turns one may hold.
    starts = turn_starts(messages, most=MAX_MESSAGES)
    deadline = time.monotonic() + seconds

    def counted(start: int) -> int | None:
        """The prompt's tokens kept from `start` on; None: certainly past the context."""
        if time.monotonic() > deadline:
            raise ApiError(
                400,
                "prompt_too_complex",
                f"Finding which turns fit the context took more than {seconds:g} s; send "
                "fewer or shorter messages, or set 'truncation' to 'disabled'.",
                param="truncation",
            )
        try:
            prompts, _ = prompts_read(_kept(request, start), route, context=context)
        except ApiError as exc:
            if exc.code != "context_length_exceeded":
                raise
            return None
        return len(prompts[0])

    kept = [_head(messages) + len(messages) - start for start in starts]
    search = _CutSearch(kept, budget=context - (request.max_tokens or 1), counted=counted)
    start = starts[search.cut(starts)]
    return request if start == _head(messages) else _kept(request, start)


class _CutSearch:
    """Where to cut a conversation: the fewest turns dropped that leave it within a budget.

    Candidates are indexed by turns dropped (0: none), so the messages kept fall as the index
    rises and every candidate from the cut on fits. Each render's token count guesses the
    next candidate, as if each kept message cost what those measured cost: from the newest
    turn the guess jumps near the cut (at most eight times the span kept while nothing is
    known not to fit, so no render is much longer than what is kept), then falls between
    the longest span that fits and the shortest that does not, halving that gap instead
    whenever a guess did not halve it. Turns of like sizes take three or four renders; none
    take more than about twice the log of the turns.
    """

    REACH = 8  # how many times the span kept a guess may reach while nothing is too long

    def __init__(
        self, kept: list[int], *, budget: int, counted: Callable[[int], int | None]
    ) -> None:
        self._kept = kept  # messages kept at each candidate, falling
        self._falling = [-k for k in kept]  # rising, for bisect
        self._budget = budget
        self._counted = counted
        self._tokens: dict[int, int | None] = {}

    def cut(self, starts: list[int]) -> int:
        """The index of the first candidate that fits (the last one, if none does)."""
        last = len(starts) - 1
        if last == 0 or not self._fits(last, starts):
            return last
        fits, too_long = last, -1  # -1: nothing is known not to fit yet
        halved, step = True, 1
        while fits - too_long > 1:
            if too_long < 0:
                # Each guess that fits reaches further than the last (at least twice as far).
                reach = self._index_keeping(self._kept[fits] * self.REACH)
                probe = min(max(self._guess(fits, too_long), reach), fits - step)
                step *= 2
            elif halved:
                probe = self._guess(fits, too_long)
            else:
                probe = (fits + too_long) // 2
            probe = min(max(probe, too_long + 1), fits - 1)
            gap = fits - too_long
            if self._fits(probe, starts):
                fits = probe
            else:
                too_long = probe
            halved = fits - too_long <= gap // 2
        return fits

    def _fits(self, index: int, starts: list[int]) -> bool:
        tokens = self._tokens[index] = self._counted(starts[index])
        return tokens is not None and tokens <= self._budget

    def _guess(self, fits: int, too_long: int) -> int:
        """The candidate whose kept messages should cost the budget, between the two."""
        kept, measured = self._kept[fits], self._tokens[fits] or 0
        beyond = self._tokens.get(too_long) if too_long >= 0 else None
        if beyond is None:
            rate = measured / max(kept, 1)  # tokens a message, as those kept cost
        else:
            rate = (beyond - measured) / max(self._kept[too_long] - kept, 1)
        if rate <= 0:
            return too_long + 1
        return self._index_keeping(kept + (self._budget - measured) / rate)

    def _index_keeping(self, messages: float) -> int:
        """The first candidate that keeps at most `messages` messages."""
        return bisect.bisect_left(self._falling, -messages)


def _kept(request: GenerationRequest, start: int) -> GenerationRequest:
    assert request.messages is not None
    return dataclasses.replace(request, messages=kept_from(request.messages, start))


def _rendered(
    tokenizer: Tokenizer, request: GenerationRequest, messages: list[dict[str, Any]] | None = None
) -> str:
    """A conversation of the request (its first, unless named) as the template writes it."""
    if messages is None:
        messages = request.messages
    assert messages is not None
    return tokenizer.render_chat(
        messages,
        tools=request.tools.tools if request.tools is not None else None,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        template_kwargs=request.chat_template_kwargs,
        documents=request.documents,
    )


def chat_rendered(request: GenerationRequest, route: Route) -> str:
    """A chat request's conversation as its version's template writes it: the text the
    model's prompt tokens encode (vLLM's return_prompt_text)."""
    tokenizer = tokenizer_for(digest=route.version_digest, directory=route.artifact_dir)
    return _rendered(tokenizer, request)


def kept_tokens(truncate: int | None, context: int | None, *, generation: bool) -> int | None:
    """How many prompt tokens vLLM's `truncate_prompt_tokens` keeps; None: no truncation.

    -1 keeps as many as the context takes, less one for the output on generation (an encoder
    takes its whole context). More than the context is a 400, as vLLM refuses it; so is 0.
    """
    if truncate is None or context is None:
        return None
    if truncate == 0:
        # vLLM cuts the prompt to nothing and then refuses the empty prompt: say why at once.
        raise invalid(
            "truncate_prompt_tokens",
            "truncate_prompt_tokens=0 leaves the prompt no tokens: keep at least one (-1 keeps "
            "as many as fit).",
        )
    if truncate > context:
        raise invalid(
            "truncate_prompt_tokens",
            f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len = "
            f"{context}. Please request a smaller truncation size.",
        )
    if truncate == -1:
        return max(context - 1, 0) if generation else context
    return truncate


@dataclass(frozen=True)
class Truncation:
    """A prompt cut to `keep` tokens from `side` ("left" keeps the last ones), as vLLM cuts.

    vLLM's side, unless the request names one, is the left on generation (the end of a prompt
    is what the model continues) and the right on an encoder (an input reads from its start).
    With a side named, the prompt's tokens are cut whatever they are. Without one, a text is
    cut the way the tokenizer truncates (vLLM hands it `truncation=True`): only the text's
    tokens, so the special tokens around them (BOS, an encoder's CLS and SEP) stay.
    """

    keep: int
    side: str
    named: bool = True

    def ids(self, ids: list[int]) -> list[int]:
        return _cut(ids, self.keep, self.side)

    def text(self, tokenizer: Any, text: str, *, special: bool, context: int | None) -> list[int]:
        limit = (tokenizer.max_token_chars or 0) * (context or 0)
        if limit and len(text) > limit:
            # Certainly more than the context's tokens: only the kept end is tokenised, as
            # vLLM trims a text it truncates (a megabyte costs the tokenizer seconds).
            text = text[-limit:] if self.side == "left" else text[:limit]
        if not special:
            return _cut(tokenizer.encode_text(text), self.keep, self.side)
        whole = tokenizer.encode_with(text, add_special_tokens=True)
        if len(whole) <= self.keep or self.named:
            return _cut(whole, self.keep, self.side)
        plain = tokenizer.encode_text(text)
        around = len(whole) - len(plain)
        start = next((i for i in range(around + 1) if whole[i : i + len(plain)] == plain), None)
        room = self.keep - around
        if start is None or room < 0:
            return _cut(whole, self.keep, self.side)
        return whole[:start] + _cut(plain, room, self.side) + whole[start + len(plain) :]


def _truncation(keep: int | None, side: str | None, *, default: str) -> Truncation | None:
    if keep is None:
        return None
    return Truncation(keep, side or default, named=side is not None)


def _cut(ids: list[int], keep: int, side: str) -> list[int]:
    if len(ids) <= keep:
        return ids
    if keep == 0:
        return []
    return ids[-keep:] if side == "left" else ids[:keep]


def _user_turn_floor_check(
    tokenizer: Any, messages: list[dict[str, Any]], context: int | None, *, param: str
) -> None:
    """Refuse a conversation one of whose user turns alone is certainly over the context.

    Checked before the chat template is rendered: rendering megabytes holds the interpreter
    for tens of milliseconds, other requests' included. A template keeps a user's words (it
    may trim the whitespace around them, never drop them), so their floor bounds the whole.
    """
    if context is None:
        return
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, str):
            continue
        parts = message.get(CONTENT_PARTS)
        if parts is not None:
            # A template that loops over parts may trim each and join them with nothing.
            content = "".join(p["text"].strip() for p in parts if isinstance(p.get("text"), str))
        floor = tokenizer.token_count_floor(content.strip())
        if floor >= context:
            raise ApiError(
                400,
                "context_length_exceeded",
                f"This model's maximum context length is {context} tokens. However, your "
                f"messages resulted in at least {floor} tokens.",
                param=param,
            )


def _encoded(
    tokenizer: Any,
    text: str,
    param: str,
    context: int | None,
    *,
    special: bool,
    cut: Truncation | None = None,
) -> list[int]:
    if cut is not None:
        return cut.text(tokenizer, text, special=special, context=context)
    floor = tokenizer.token_count_floor(text)
    if context is not None and floor >= context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, your "
            f"{param} resulted in at least {floor} tokens.",
            param=param,
        )
    if special:
        return list(tokenizer.encode_with(text, add_special_tokens=True))
    return list(tokenizer.encode_text(text))


def _vocabulary_check(request: GenerationRequest, vocab: int) -> None:
    """Refuse token ids outside the model's vocabulary, naming the field that holds them."""
    fields = {
        "stop_token_ids": request.stop_token_ids,
        "logit_bias": request.logit_bias or {},
        "allowed_token_ids": request.allowed_token_ids or (),
        "logprob_token_ids": request.logprob_token_ids or (),
    }
    for field, tokens in fields.items():
        for token in tokens:
            if token >= vocab:
                raise invalid(field, f"Token ids must be in [0, {vocab}), got {token}.")


def input_ids(request: EmbeddingRequest, route: Route, *, context: int) -> list[list[int]]:
    """Tokenise a request's inputs; one certainly longer than `context` is refused first."""
    tokenizer = tokenizer_for(digest=route.version_digest, directory=route.artifact_dir)
    keep = kept_tokens(request.truncate_prompt_tokens, context, generation=False)
    cut = _truncation(keep, request.truncation_side, default="right")
    if not request.tokenized:
        texts: list[str] = list(request.inputs)  # type: ignore[arg-type]
        if cut is not None:
            return [cut.text(tokenizer, text, special=True, context=context) for text in texts]
        for index, text in enumerate(texts):
            floor = tokenizer.token_count_floor(text)
            if floor > context:
                raise input_too_long(index, f"at least {floor}", context)
        return tokenizer.encode_inputs(texts)
    vocab = tokenizer.vocab_size
    for index, ids in enumerate(request.inputs):
        if any(t >= vocab for t in ids):  # type: ignore[operator]
            raise invalid(f"input[{index}]", f"Token ids must be in [0, {vocab}).")
    inputs: list[list[int]] = list(request.inputs)  # type: ignore[arg-type]
    return inputs if cut is None else [cut.ids(ids) for ids in inputs]


def input_too_long(index: int, tokens: str, context: int) -> ApiError:
    return ApiError(
        400,
        "context_length_exceeded",
        f"'input[{index}]' is {tokens} tokens; this model takes at most {context} tokens per "
        "input.",
        param=f"input[{index}]",
    )
