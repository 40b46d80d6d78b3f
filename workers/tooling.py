"""What a generative worker makes of the engine's raw output, as vLLM's own server does.

Two things: log probabilities shaped like vLLM's chat server shapes them (the frontend cuts
the alternatives to what its endpoint shows), and a chat request's output parsed into tool
calls and a reasoning model's thinking with vLLM's own parser classes, so a model answers
here exactly as under `vllm serve --enable-auto-tool-choice --tool-call-parser <name>
--reasoning-parser <name>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.types import (
    RankedLogprob,
    Reasoning,
    Sampling,
    Structured,
    TokenLogprob,
    ToolCallDelta,
    Tools,
    TopLogprob,
)

# vLLM's floor for a log probability: -inf is not JSON.
_LOGPROB_FLOOR = -9999.0


def _decoded(logprob: Any, token_id: int, tokenizer: Any) -> str:
    """A token's text: what the engine's detokenizer said, else the tokenizer's decoding."""
    if logprob.decoded_token is not None:
        return str(logprob.decoded_token)
    return str(tokenizer.decode([token_id]))


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def _position(
    token_id: int, step: Mapping[int, Any] | None, tokenizer: Any, *, as_ids: bool
) -> TokenLogprob:
    """One position: the chosen token with its probability and every alternative the engine
    returned, in the engine's order (the likeliest first, the chosen one among them).

    A position without the chosen token's entry (a prompt's first token) has no probability.
    With `as_ids` each token is named `token_id:<id>`, as vLLM's server names them; the chosen
    token's bytes stay its text's.
    """
    entry = None if step is None else step.get(token_id)
    if entry is None or step is None:
        text = _id_named(token_id) if as_ids else str(tokenizer.decode([token_id]))
        return TokenLogprob(token=text, logprob=None, bytes=_utf8(text))
    top = []
    for other_id, other in step.items():
        other_text = _id_named(other_id) if as_ids else _decoded(other, other_id, tokenizer)
        top.append(
            TopLogprob(
                token=other_text,
                logprob=max(other.logprob, _LOGPROB_FLOOR),
                bytes=_utf8(other_text),
            )
        )
    return TokenLogprob(
        token=_id_named(token_id) if as_ids else _decoded(entry, token_id, tokenizer),
        logprob=max(entry.logprob, _LOGPROB_FLOOR),
        bytes=None if entry.decoded_token is None else _utf8(entry.decoded_token),
        top=top,
    )


def logprobs_shaped(
    token_ids: Sequence[int],
    steps: Sequence[Mapping[int, Any] | None],
    tokenizer: Any,
    *,
    as_ids: bool = False,
) -> list[TokenLogprob]:
    """The log probabilities of `token_ids`, one vLLM `Logprob` dict (or None) per token."""
    pairs = zip(token_ids, steps, strict=False)
    return [_position(token_id, step, tokenizer, as_ids=as_ids) for token_id, step in pairs]


def ranked_shaped(steps: Sequence[Mapping[int, Any] | None]) -> list[list[RankedLogprob] | None]:
    """A prompt's log probabilities as vLLM's `prompt_logprobs` field lists them: per position
    (None for the first) the prompt's token, then the likeliest ones, in the engine's order,
    each with its id, rank and text; -inf at the floor, as vLLM's server clamps it."""
    return [
        None
        if step is None
        else [
            RankedLogprob(
                token_id=token_id,
                logprob=max(entry.logprob, _LOGPROB_FLOOR),
                rank=entry.rank,
                decoded=entry.decoded_token,
            )
            for token_id, entry in step.items()
        ]
        for step in steps
    ]


def _id_named(token_id: int) -> str:
    """A token named by its id, as vLLM's return_tokens_as_token_ids writes it."""
    return f"token_id:{token_id}"


# A named tool choice comes as an object; vLLM's request model knows it by this type.
def _is_named(choice: Any) -> bool:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
    )

    return type(choice) is ChatCompletionNamedToolChoiceParam


_parser_classes: dict[tuple[str | None, str | None, bool], Any] = {}


def _parser_class(
    tool_parser: str | None, reasoning_parser: str | None, *, tokenizer: Any, model_config: Any
) -> Any:
    """vLLM's parser class for a tool parser and a reasoning parser (either may be None), as
    its server composes them; built (and checked) once per pair."""
    harmony = model_config is not None and model_config.hf_config.model_type == "gpt_oss"
    key = (tool_parser, reasoning_parser, harmony)
    if key not in _parser_classes:
        import inspect

        from vllm.parser import ParserManager

        # vLLM 0.26's get_parser takes no tokenizer (later ones check the parser against it).
        checked = "tokenizer" in inspect.signature(ParserManager.get_parser).parameters
        extra: dict[str, Any] = {"tokenizer": tokenizer} if checked else {}
        if reasoning_parser is not None:
            extra["reasoning_parser_name"] = reasoning_parser
        _parser_classes[key] = ParserManager.get_parser(
            tool_parser_name=tool_parser, enable_auto_tools=True, is_harmony=harmony, **extra
        )
    return _parser_classes[key]


def _structured_of(params: Any) -> Structured | None:
    """vLLM's StructuredOutputsParams as the wire's constraint (None: no constraint)."""
    if params is None:
        return None
    schema = params.json
    return Structured(
        json=json.dumps(schema) if isinstance(schema, dict) else schema,
        json_object=bool(params.json_object),
        regex=params.regex,
        choice=params.choice,
        grammar=params.grammar,
        whitespace_pattern=params.whitespace_pattern,
        structural_tag=params.structural_tag,
        disable_any_whitespace=params.disable_any_whitespace,
        disable_additional_properties=params.disable_additional_properties,
    )


@dataclass(frozen=True)
class Thinking:
    """A reasoning model's request as its engine needs it, as vLLM's chat server passes it:
    whether the thinking has ended already (`ended`: in the prompt, or hidden from the answer,
    so a grammar applies from the first token; None: the engine looks at the prompt), and the
    chat template's variables for the engine's own reasoning parser."""

    ended: bool | None
    template_kwargs: dict[str, Any]

    def generate_kwargs(self) -> dict[str, Any]:
        """The arguments vLLM's `AsyncLLM.generate` takes for it."""
        return {
            "reasoning_ended": self.ended,
            "reasoning_parser_kwargs": {"chat_template_kwargs": self.template_kwargs},
        }


class OutputParsing:
    """A chat job's output parsing: its tools, a reasoning model's thinking, or both. vLLM's
    request as its server would hold it, and its parser class.

    Built once per job; `choice()` gives each choice its own parser (they are stateful).
    """

    def __init__(
        self,
        tools: Tools | None,
        *,
        tokenizer: Any,
        model_config: Any = None,
        stream: bool,
        reasoning: Reasoning | None = None,
    ) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        self.tokenizer = tokenizer
        self.model_config = model_config
        self.stream = stream
        self.reasoning = reasoning
        self.template_kwargs = {} if reasoning is None else json.loads(reasoning.template_kwargs)
        self.parser_class = _parser_class(
            None if tools is None else tools.parser,
            None if reasoning is None else reasoning.parser,
            tokenizer=tokenizer,
            model_config=model_config,
        )
        # The messages are already the prompt's tokens: the parsers never read them.
        body: dict[str, Any] = {"messages": [{"role": "user", "content": ""}], "model": ""}
        if tools is not None:
            body |= {
                "tools": json.loads(tools.tools),
                "tool_choice": json.loads(tools.choice),
                "parallel_tool_calls": tools.parallel,
            }
        if reasoning is not None:
            body["include_reasoning"] = reasoning.include
        self.request = ChatCompletionRequest.model_validate(body)
        self._shaper: Any = None  # the parser that shaped the request (kept for thinking())
        self._adjust()

    def _adjust(self) -> None:
        """Let the parser shape the request, as vLLM's renderer does before generating.

        A forced choice ("required", a named function) gets the parser's own constraint (a
        JSON schema or a structural tag), and the parser picks skip_special_tokens. A
        reasoning model's parser always shapes it.
        """
        if self.request.tool_choice == "none" and self.reasoning is None:
            return
        self._shaper = self.new_parser()
        self.request = self._shaper.adjust_request(self.request)

    def new_parser(self) -> Any:
        kwargs = {"chat_template_kwargs": self.template_kwargs} if self.reasoning else {}
        return self.parser_class(
            self.tokenizer, self.request.tools, model_config=self.model_config, **kwargs
        )

    def thinking(self, prompt_token_ids: list[int]) -> Thinking | None:
        """What the engine needs of a reasoning model's request (None: not one), as vLLM's
        chat server resolves it after shaping the request."""
        if self.reasoning is None:
            return None
        resolve = getattr(self.request, "resolve_reasoning_ended", None)  # absent in vLLM 0.26
        ended = None if resolve is None else resolve(self._shaper, prompt_token_ids)
        return Thinking(ended=ended, template_kwargs=self.template_kwargs)

    def sampling(self, sampling: Sampling) -> Sampling:
        """The job's sampling with the parser's adjustments; its constraint wins over the
        request's own, as in vLLM."""
        structured = sampling.structured
        if self.request.structured_outputs is not None:
            structured = _structured_of(self.request.structured_outputs)
        return msgspec.structs.replace(
            sampling,
            skip_special_tokens=self.request.skip_special_tokens,
            structured=structured,
        )

    def choice(self) -> ChoiceParsing:
        return ChoiceParsing(self, self.new_parser())

    @property
    def named(self) -> bool:
        return _is_named(self.request.tool_choice)

    @property
    def single_call(self) -> bool:
        """Whether the request asked for one tool call at most (parallel_tool_calls false)."""
        return self.request.parallel_tool_calls is False


@dataclass
class Parsed:
    """What one step of a choice's output says: content, tool-call pieces and thinking."""

    text: str = ""
    tool_calls: list[ToolCallDelta] | None = None
    reasoning: str = ""


@dataclass
class ChoiceParsing:
    """One choice's parsing (tool calls, thinking): streamed step by step, or the whole output at
    its end."""

    calling: OutputParsing
    parser: Any
    streamed_calls: bool = False
    auto_called: bool = False
    produced: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    def step(
        self, text: str, token_ids: Sequence[int], *, prompt_token_ids: list[int], finished: bool
    ) -> Parsed | None:
        """Take a step of output; return what the client sees of it now (None: nothing yet).

        A non-streaming choice keeps its text and answers once, when it finishes.
        """
        if not self.calling.stream:
            self.text.append(text)
            self.token_ids.extend(token_ids)
            return self._whole(prompt_token_ids) if finished else None
        if not text and not token_ids and not self.produced:
            return None  # vLLM's server skips an empty first output (chunked prefill)
        self.produced += len(token_ids)
        if self.calling.reasoning is not None:
            self.token_ids.extend(token_ids)  # counted for the thinking's tokens at the end
        message = self.parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=self.calling.request,
            prompt_token_ids=prompt_token_ids,
            finished=finished,
        )
        if message is None:
            return None
        calls = None
        if message.tool_calls:
            self.streamed_calls = True
            calls = [
                ToolCallDelta(
                    index=call.index,
                    id=call.id,
                    name=call.function.name if call.function else None,
                    arguments=(call.function.arguments or "") if call.function else "",
                )
                for call in message.tool_calls
                if not self.calling.single_call or call.index == 0
            ]
        return Parsed(
            text=message.content or "", tool_calls=calls, reasoning=message.reasoning or ""
        )

    def reasoning_tokens(self, *, whole: bool = False) -> int:
        """How many of the choice's tokens were thinking, as vLLM's server counts them.

        A stream's parser counts as it was fed, and vLLM's engine hands over several tokens at
        once when its reader falls behind, which can drop one from that count (a step holding
        the last thought and the end token counts neither). `whole` counts the output in one
        pass instead, as vLLM's whole answer does: the same tokens, the same count, whatever
        the engine's grouping — what the usage record bills.
        """
        if whole and self.calling.stream and self.token_ids:
            return int(self.calling.new_parser().count_reasoning_tokens(tuple(self.token_ids)))
        return int(self.parser.count_reasoning_tokens(tuple(self.token_ids)))

    def _whole(self, prompt_token_ids: list[int]) -> Parsed:
        """The complete output parsed, as vLLM's non-streaming chat answer builds it."""
        try:
            from vllm.renderers.chat_utils import make_tool_call_id
        except ImportError:  # vLLM 0.26: still in entrypoints
            from vllm.entrypoints.chat_utils import make_tool_call_id  # type: ignore[no-redef]

        request = self.calling.request
        if hasattr(self.parser, "set_prompt_token_ids"):  # absent in vLLM 0.26
            self.parser.set_prompt_token_ids(prompt_token_ids)
        reasoning, content, calls = self.parser.parse(
            "".join(self.text),
            request,
            enable_auto_tools=True,
            model_output_token_ids=self.token_ids,
        )
        if not request.include_reasoning:
            reasoning = None
        forced = self.calling.named or request.tool_choice == "required"
        if request.tool_choice in ("none", None):
            calls = []
        elif not forced:
            self.auto_called = bool(calls)
        if forced:
            content = content or ""
        found = [
            ToolCallDelta(
                index=index,
                id=call.id or make_tool_call_id(),
                name=call.name,
                arguments=call.arguments,
            )
            for index, call in enumerate(calls or [])
        ]
        if self.calling.single_call:
            found = found[:1]
        return Parsed(text=content or "", tool_calls=found or None, reasoning=reasoning or "")

    def finish_reason(self, engine_reason: str | None) -> str:
        """The choice's finish reason as vLLM's server gives it.

        "tool_calls" when the model called tools, except for a named choice, which keeps the
        engine's. Streaming decides by what was streamed and the engine's "stop"; the whole
        answer by what auto parsing found (whatever stopped it), or "required" with "stop".
        """
        reason = engine_reason or "stop"
        if self.calling.stream:
            called = self.streamed_calls and not self.calling.named and reason == "stop"
        else:
            required = self.calling.request.tool_choice == "required"
            called = self.auto_called or (required and reason == "stop")
        return "tool_calls" if called else reason
