"""The bodies of vLLM's operational endpoints, /tokenize and /detokenize: their field tables,
declared as every other body's (inference.body.fields), and their parsers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.base.errors import invalid
from inference.body.fields import (
    CHAT_TEMPLATE_KWARGS,
    Field,
    honoured,
    refused,
    unsupported_refuse,
)
from inference.body.inputs import MESSAGES, MODEL, TOKENS
from inference.body.tools import TOOLS
from inference.body.types import boolean, boolean_or_none, string

# Every field of vLLM's TokenizeCompletionRequest, TokenizeChatRequest and DetokenizeRequest;
# a field in neither is refused, as on the other endpoints. tests/inference/body/test_parser.py
# checks that these tables cover the installed vLLM's requests.
TOKENIZE_FIELDS: dict[str, Field] = {
    "model": honoured(MODEL),
    "prompt": honoured(string()),
    "messages": honoured(MESSAGES),
    "add_special_tokens": honoured(
        boolean_or_none(
            doc="Add the tokenizer's special tokens (BOS); default: true for a prompt, false "
            "for messages (the chat template writes its own)."
        )
    ),
    "add_generation_prompt": honoured(
        boolean(default=True, doc="Messages: end with the assistant's turn opened.")
    ),
    "continue_final_message": honoured(
        boolean(
            doc="Messages: leave the last one open, to be continued; not together with "
            "add_generation_prompt=true."
        )
    ),
    "return_token_strs": honoured(boolean(doc="Also answer each token's string.")),
    "chat_template_kwargs": honoured(CHAT_TEMPLATE_KWARGS),
    "tools": honoured(TOOLS),
    # A template of the client's own runs code of the client's in the frontend: vLLM, too,
    # refuses it unless its operator trusts request templates.
    "chat_template": refused(),
    "media_io_kwargs": refused(),
    "mm_processor_kwargs": refused(),
}
DETOKENIZE_FIELDS: dict[str, Field] = {
    "model": honoured(MODEL),
    "tokens": honoured(TOKENS),
}


@dataclass(frozen=True)
class TokenizeRequest:
    """A /tokenize body: a completion prompt, or chat messages to render with the template."""

    model: str
    prompt: str | None
    messages: list[dict[str, str]] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    continue_final_message: bool
    return_token_strs: bool
    # Messages: the tools and chat_template_kwargs the template is rendered with, as a chat
    # request's are.
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None


def tokenize_parse(body: dict[str, Any]) -> TokenizeRequest:
    """Return the typed request of a /tokenize body, or raise a 400 naming the field.

    As vLLM's: `messages` makes it a chat request (defaults: add_generation_prompt true,
    add_special_tokens false, as the template adds its own), else `prompt` is required
    (add_special_tokens true). Every field is read through TOKENIZE_FIELDS.
    """
    model = MODEL.read(body, "model")
    unsupported_refuse(body, TOKENIZE_FIELDS)

    def read(name: str) -> Any:
        return TOKENIZE_FIELDS[name].read(body, name)

    chat = body.get("messages") is not None
    if chat and body.get("prompt") is not None:
        raise invalid("prompt", "Send either 'prompt' or 'messages', not both.")
    return_token_strs = read("return_token_strs")
    special = read("add_special_tokens")
    if not chat:
        # add_generation_prompt and continue_final_message shape chat only: ignored here.
        # Tools and template variables would be too, so asking for them is refused.
        for name in ("tools", "chat_template_kwargs"):
            if body.get(name):
                raise invalid(name, f"'{name}' shape a conversation's prompt: send 'messages'.")
        return TokenizeRequest(
            model=model,
            prompt=string(required=True).read(body, "prompt"),
            messages=None,
            add_special_tokens=True if special is None else special,
            add_generation_prompt=False,
            continue_final_message=False,
            return_token_strs=return_token_strs,
        )
    add_generation_prompt = read("add_generation_prompt")
    continue_final_message = read("continue_final_message")
    if add_generation_prompt and continue_final_message:
        raise invalid(
            "continue_final_message",
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
        )
    return TokenizeRequest(
        model=model,
        prompt=None,
        messages=read("messages"),
        add_special_tokens=bool(special),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        return_token_strs=return_token_strs,
        tools=read("tools") if body.get("tools") is not None else None,
        template_kwargs=read("chat_template_kwargs"),
    )


@dataclass(frozen=True)
class DetokenizeRequest:
    model: str
    tokens: list[int]


def detokenize_parse(body: dict[str, Any]) -> DetokenizeRequest:
    """Return the typed request of a /detokenize body, or raise a 400 naming the field."""
    model = MODEL.read(body, "model")
    unsupported_refuse(body, DETOKENIZE_FIELDS)
    return DetokenizeRequest(model=model, tokens=DETOKENIZE_FIELDS["tokens"].read(body, "tokens"))
