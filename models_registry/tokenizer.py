"""A model version's tokenizer and chat template, loaded from its verified artifact directory.

The frontend tokenises prompts with it (inference.pipeline.tokenization turns its failures into the
API's errors) and a capacity measurement builds prompts of an exact length with it. Its
failures are plain exceptions: what a client is told about them is the caller's business.
"""

from __future__ import annotations

import functools
import gc
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jinja2.meta
from jinja2 import TemplateError

from models_registry.content_format import reads_content_parts

_lock = threading.Lock()
# The key of a parsed chat message that holds its content as parts, for a template that loops
# over content (see `chat_conversation`); absent when the content was one string kept as it is.
CONTENT_PARTS = "content_parts"
_tokenizers: dict[tuple[str, type[Tokenizer]], Tokenizer] = {}
# Text that a tokenizer which drops and rewrites nothing decodes back as it was: runs of
# whitespace, control characters, combining marks, compatibility forms, CJK and an emoji.
_PROBE = "  a\t\n\x00\x01 e\u0301\u0301 \ufb01 \u216b \u65e5\u672c\u8a9e \U0001f642   x  "


class TokenizerError(Exception):
    """A tokenizer that cannot be loaded or a conversation its template cannot write."""


class TokenizerUnavailable(TokenizerError):
    """The version's tokenizer files could not be loaded."""


class ChatTemplateMissing(TokenizerError):
    """The version has no chat template: it takes prompts, not conversations."""


class ChatTemplateRejected(TokenizerError):
    """The chat template refused the conversation; the message is the template's reason."""


class ChatTemplateKwargsRejected(TokenizerError):
    """The chat template failed on a variable of the request's chat_template_kwargs."""


class ChatMessageInvalid(TokenizerError):
    """A message or tool no chat template is given: vLLM refuses it before rendering."""


class Tokenizer:
    """A version's tokenizer and chat template."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        # A verified local directory (local_files_only): nothing is downloaded.
        self._hf: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)  # nosec B615
        self._fast = self._hf.backend_tokenizer
        # Some tokenizer files pad or truncate every encoding (all-MiniLM-L6-v2's pad to 128):
        # lengths are checked against the context here, and padding is the engine's business.
        self._fast.no_padding()
        self._fast.no_truncation()
        self._max_token_chars = self._longest_token()

    def _longest_token(self) -> int | None:
        """The most characters of text one token can stand for; None if unknown.

        Known only for a lossless tokenizer (its probe decodes back unchanged: nothing is
        normalised away or dropped), where every character of a text is part of some token
        and no token stands for more characters than its vocabulary entry spells.
        """
        ids = self._fast.encode(_PROBE, add_special_tokens=False).ids
        if self._fast.decode(ids, skip_special_tokens=False) != _PROBE:
            return None
        return max(len(token) for token in self._fast.get_vocab(with_added_tokens=True))

    def token_count_floor(self, text: str) -> int:
        """A lower bound of `len(encode_text(text))` found without tokenising (0: none known).

        A prompt whose floor exceeds the context is refused without the cost of tokenising it.
        """
        if not self._max_token_chars:
            return 0
        return len(text) // self._max_token_chars

    def encode_text(self, text: str) -> list[int]:
        return self.encode_ids(text, add_special_tokens=False)

    def encode_ids(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """A text's token ids.

        Through the tokenizer's batch call: the same ids as `encode`, without the offsets
        nobody reads, and it lets go of the interpreter while it works. A single `encode`
        holds it: a long prompt tokenised on a frontend's preprocessing thread froze the
        event loop beside it for as long as it took (270 ms for a 540 KB text).
        """
        return list(
            self._fast.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        )

    @property
    def max_token_chars(self) -> int | None:
        """The most characters one token stands for (see `_longest_token`); None if unknown."""
        return self._max_token_chars

    def encode_inputs(self, texts: list[str]) -> list[list[int]]:
        """Encode many encoder inputs at once (the tokenizer parallelises the batch)."""
        return [list(e.ids) for e in self._fast.encode_batch_fast(texts, add_special_tokens=True)]

    def chat_template(self, *, tools: bool = False) -> str | None:
        """The chat template's text a conversation is written with (with tools, or without:
        a tokenizer may keep a template of each); None when the version has none."""
        if not getattr(self._hf, "chat_template", None):
            return None
        return str(self._hf.get_chat_template(None, tools=[] if tools else None))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        return self.encode_text(self.render_chat(messages, tools=tools))

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
        """Return a conversation as the model's chat template writes it, ready to encode.

        `messages` are OpenAI's (role, content, name, tool_calls, tool_call_id) and `tools` the
        request's function tools; both reach the template as vLLM's server gives them, so the
        prompt is the one vLLM would run (see `chat_conversation` and `chat_tools`). By default
        with the generation prompt (what a chat request runs); /tokenize may leave it out, or
        leave the last message open for the model to continue (vLLM's options).
        `template_kwargs` are a request's chat_template_kwargs: as vLLM's server does, the
        template gets those it reads (Qwen3's `enable_thinking`, say) and the rest go unused.
        `documents` reach the template as vLLM's server gives them (its `documents`
        variable): a RAG template lists them, one that does not read them leaves them out.
        """
        if not getattr(self._hf, "chat_template", None):
            raise ChatTemplateMissing("this model version has no chat template")
        tool_dicts = chat_tools(tools) if tools is not None else None
        template = self.chat_template(tools=tool_dicts is not None) or ""
        conversation = chat_conversation(messages, parts=reads_content_parts(template))
        developer = any(m["role"] == "developer" for m in conversation)
        extra = {}
        if template_kwargs:
            wanted = template_variables(template) - TEMPLATE_KWARGS_SET_HERE
            extra = {k: v for k, v in template_kwargs.items() if k in wanted}
        if developer and not _knows_developer(template):
            conversation = _developer_as_system(conversation)
        try:
            rendered = self._hf.apply_chat_template(
                conversation,
                tools=tool_dicts,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                documents=None if documents is None else [dict(d) for d in documents],
                **extra,
            )
        except TemplateError as exc:
            # The template refused the conversation (`raise_exception` in its text, such as
            # roles that must alternate): the client's messages are at fault.
            raise ChatTemplateRejected(str(exc)) from exc
        except (TypeError, ValueError) as exc:
            if extra:
                # A variable the client set that the template cannot use (a string where it
                # adds numbers, say): the client's input is at fault, not the template.
                raise ChatTemplateKwargsRejected(str(exc)) from exc
            if not continue_final_message or isinstance(exc, TypeError):
                raise
            # transformers cannot continue a conversation whose last message it cannot find.
            raise ChatTemplateRejected(str(exc)) from exc
        return str(rendered)

    @property
    def vocab_size(self) -> int:
        return len(self._hf)


# Entries of a request's chat_template_kwargs that are not passed on, as in vLLM's server: what
# render_chat sets from the request's own fields (which win), and the rendering's own options.
TEMPLATE_KWARGS_SET_HERE = frozenset(
    {"add_generation_prompt", "continue_final_message", "tokenize"}
)
# Names a request's chat_template_kwargs may not hold: they would stand for the conversation or
# its tools, which the request's own fields give, or replace the version's template (which
# vLLM's server refuses too unless told to trust requests' templates).
TEMPLATE_KWARGS_REFUSED = frozenset(
    {"messages", "conversation", "tools", "documents", "chat_template"}
)


@functools.lru_cache(maxsize=64)
def template_variables(template: str) -> frozenset[str]:
    """Return the variables a chat template reads that it does not set itself."""
    # Parsed in the environment transformers renders it in (its `generation` tag included).
    from transformers.utils.chat_template_utils import _compile_jinja_template

    environment = _compile_jinja_template(template).environment
    return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(template)))


def _content_text(content: Any) -> str:
    """A message's content as one string: text parts joined by newlines, None as "".

    The API's parsing (inference.body.inputs) has already written each part as vLLM's server does;
    what is left here is joining them.
    """
    if content is None:
        return ""
    parts = [content] if isinstance(content, str) else list(content)
    texts = []
    for part in parts:
        text = (
            part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        )
        if not isinstance(text, str) or (isinstance(part, dict) and part.get("type") != "text"):
            raise ChatMessageInvalid("only text content parts can be rendered")
        if text:
            texts.append(text)
    return "\n".join(texts)


def _tool_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the object templates expect ({} when not a JSON object).

    Malformed arguments stay in a conversation's history for good: vLLM renders them as {}
    rather than fail every later turn, and so does this.
    """
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ChatMessageInvalid("assistant tool_calls must be an array")
    result = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ChatMessageInvalid("assistant tool_calls must be objects of type 'function'")
        # In the order of vLLM's parsed messages (a template may write a call as JSON).
        rendered: dict[str, Any] = {"id": call["id"]} if "id" in call else {}
        rendered["function"] = {
            "arguments": _tool_arguments(function.get("arguments")),
            "name": function.get("name"),
        }
        rendered["type"] = call.get("type", "function")
        result.append(rendered)
    return result


def _content_parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A message's content as a list of parts (CONTENT_PARTS, or its string as one part)."""
    parts = message.get(CONTENT_PARTS)
    if parts is not None:
        return [dict(part) for part in parts]
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [
        {"type": "text", "text": part} if isinstance(part, str) else dict(part) for part in content
    ]


def _tool_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A tool message's parts as vLLM's server gives them: one string when they are all text
    (most templates write a tool's answer as a string), else the parts (tool references)."""
    if any(part.get("type") != "text" for part in parts):
        return parts
    return "\n".join(part.get("text") or "" for part in parts)


def chat_conversation(
    messages: Sequence[Mapping[str, Any]], *, parts: bool = False
) -> list[dict[str, Any]]:
    """Return OpenAI chat messages as vLLM's server hands them to a chat template.

    Content becomes a string (text parts joined by newlines, None as ""), or with `parts` (a
    template that loops over content: models_registry.content_format) a list of parts, None as
    no parts (a tool message's text parts still one string); an assistant's
    tool calls keep their ids and names and carry their arguments as an object (parsed from
    the JSON string the API sends; {} when they are not one), and an empty list of them is
    dropped; a tool message keeps its tool_call_id, and any message its `name`. An
    assistant's `reasoning` (an earlier answer's thinking) goes as `reasoning` and
    `reasoning_content`.
    """
    conversation = []
    for message in messages:
        role = str(message["role"])
        content: str | list[dict[str, Any]]
        if not parts:
            content = _content_text(message.get("content"))
        elif role == "tool":
            content = _tool_content(_content_parts(message))
        else:
            content = _content_parts(message)
        rendered: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and message.get("tool_calls") is not None:
            calls = _tool_calls(message["tool_calls"])
            if calls:
                rendered["tool_calls"] = calls
        if role == "assistant" and isinstance(message.get("reasoning"), str):
            # Under both names, as vLLM's server hands an earlier answer's thinking over.
            rendered["reasoning"] = rendered["reasoning_content"] = message["reasoning"]
        elif role == "tool" and "tool_call_id" in message:
            rendered["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            rendered["name"] = message["name"]
        if role == "developer":
            rendered["tools"] = message.get("tools")
        conversation.append(rendered)
    return conversation


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return a request's function tools as vLLM's server hands them to a chat template.

    Each is `{"type": "function", "function": {"name", "description", "parameters"}}` in that
    order, a missing description or parameters as None, `strict` only when given.
    """
    result = []
    for tool in tools:
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise ChatMessageInvalid("tools must be objects of type 'function'")
        if not isinstance(function.get("name"), str):
            raise ChatMessageInvalid("a tool's function must have a name")
        rendered: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            rendered["strict"] = function["strict"]
        deferred = function.get("defer_loading")
        if deferred is None:
            deferred = tool.get("defer_loading")
        if deferred is not None:
            rendered["defer_loading"] = deferred
        entry: dict[str, Any] = {"type": "function", "function": rendered}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        result.append(entry)
    return result


def _knows_developer(template: str) -> bool:
    """Whether a chat template has its own way with the developer role (vLLM's test)."""
    return '"developer"' in template or "'developer'" in template


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write developer messages as system ones, merged into one first system message (vLLM's)."""
    converted = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"}
        if m["role"] == "developer"
        else m
        for m in conversation
    ]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if systems in ([], [0]):
        return converted
    texts = (_joined(m["content"]) for m in converted if m["role"] == "system")
    merged = "\n\n".join(text for text in texts if text)
    return [
        {"role": "system", "content": merged},
        *(m for m in converted if m["role"] != "system"),
    ]


def _joined(content: str | list[dict[str, Any]]) -> str:
    """A system message's content as one string: its parts' texts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(str(part["text"]) for part in content if "text" in part)


T = TypeVar("T", bound=Tokenizer)


def tokenizer_loaded(*, digest: str, kind: type[Any]) -> bool:
    """Whether this process has loaded a version's tokenizer (as a `kind`) already."""
    return (digest, kind) in _tokenizers


def tokenizer_for(*, digest: str, directory: Path, kind: type[T]) -> T:
    """Return the cached tokenizer of a version, loading it (as a `kind`) once per process.

    Raises TokenizerUnavailable when its files cannot be loaded.
    """
    tokenizer = _tokenizers.get((digest, kind))
    if tokenizer is None:
        with _lock:
            tokenizer = _tokenizers.get((digest, kind))
            if tokenizer is None:
                try:
                    tokenizer = kind(directory)
                except Exception as exc:
                    raise TokenizerUnavailable(str(exc) or type(exc).__name__) from exc
                _tokenizers[digest, kind] = tokenizer
                # A tokenizer (and the modules its loading imported) lives as long as the
                # process: out of the collector's reach, like what was loaded at start-up.
                gc.collect()
                gc.freeze()
    assert isinstance(tokenizer, kind)  # the cache is keyed by kind
    return tokenizer
