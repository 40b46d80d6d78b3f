"""Chat templating and tokenisation on the frontend, with each version's own tokenizer.

The tokenizer is the registry's (models_registry.tokenizer); here its failures become the
API's errors: a conversation the template refuses is the client's 400, a tokenizer that
cannot be loaded a 503 to retry.
"""

from __future__ import annotations

from pathlib import Path

from inference.errors import ApiError
from models_registry import tokenizer as registry
from models_registry.tokenizer import (
    ChatTemplateMissing,
    ChatTemplateRejected,
    TokenizerUnavailable,
)


class Tokenizer(registry.Tokenizer):
    """A version's tokenizer whose refusals of a conversation are the API's 400s."""

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        try:
            return super().render_chat(messages)
        except ChatTemplateMissing as exc:
            raise ApiError(
                400,
                "chat_template_missing",
                "This model has no chat template; call /v1/completions instead.",
                param="model",
            ) from exc
        except ChatTemplateRejected as exc:
            raise ApiError(
                400,
                "invalid_value",
                f"This model's chat template rejected the messages: {exc}",
                param="messages",
            ) from exc


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
