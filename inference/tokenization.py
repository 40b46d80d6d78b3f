"""Chat templating and tokenisation on the frontend, with each version's own tokenizer.

The tokenizer is the registry's (models_registry.tokenizer); here its failures become the
API's errors: a conversation the template refuses is the client's 400, a tokenizer that
cannot be loaded a 503 to retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.errors import ApiError
from models_registry import tokenizer as registry
from models_registry.tokenizer import (
    ChatMessageInvalid,
    ChatTemplateMissing,
    ChatTemplateRejected,
    TokenizerUnavailable,
)

# Prompts longer than this (in characters, or token ids) tokenise off the event loop.
INLINE_TOKENIZE_CHARS = 16_000


class Tokenizer(registry.Tokenizer):
    """A version's tokenizer whose refusals of a conversation are the API's 400s."""

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        try:
            return super().render_chat(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except ChatTemplateMissing as exc:
            raise _template_missing() from exc
        except ChatMessageInvalid as exc:
            raise ApiError(400, "invalid_value", str(exc), param="messages") from exc
        except ChatTemplateRejected as exc:
            raise ApiError(
                400,
                "invalid_value",
                f"This model's chat template rejected the messages: {exc}",
                param="messages",
            ) from exc

    def encode_with(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Encode text as vLLM's /tokenize does: with the special tokens (BOS) or without."""
        return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)

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
