"""Chat templating and tokenisation on the frontend, with each version's own tokenizer."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from inference.errors import ApiError

_lock = threading.Lock()
_tokenizers: dict[str, Tokenizer] = {}
# Text that a tokenizer which drops and rewrites nothing decodes back as it was: runs of
# whitespace, control characters, combining marks, compatibility forms, CJK and an emoji.
_PROBE = "  a\t\n\x00\x01 e\u0301\u0301 \ufb01 \u216b \u65e5\u672c\u8a9e \U0001f642   x  "


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
        return list(self._fast.encode(text, add_special_tokens=False).ids)

    def encode_inputs(self, texts: list[str]) -> list[list[int]]:
        """Encode many encoder inputs at once (the tokenizer parallelises the batch)."""
        return [list(e.ids) for e in self._fast.encode_batch(texts, add_special_tokens=True)]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode_text(self.render_chat(messages))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Return a conversation as the model's chat template writes it, ready to encode."""
        if not getattr(self._hf, "chat_template", None):
            raise ApiError(
                400,
                "chat_template_missing",
                "This model has no chat template; call /v1/completions instead.",
                param="model",
            )
        try:
            rendered = self._hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:
            # The template refused the conversation (`raise_exception` in its text, such as
            # roles that must alternate): the client's messages are at fault.
            raise ApiError(
                400,
                "invalid_value",
                f"This model's chat template rejected the messages: {exc}",
                param="messages",
            ) from exc
        return str(rendered)

    @property
    def vocab_size(self) -> int:
        return len(self._hf)


def tokenizer_for(*, digest: str, directory: Path) -> Tokenizer:
    """Return the cached tokenizer of a version, loading it once per process."""
    tokenizer = _tokenizers.get(digest)
    if tokenizer is None:
        with _lock:
            tokenizer = _tokenizers.get(digest)
            if tokenizer is None:
                try:
                    tokenizer = Tokenizer(directory)
                except Exception as exc:
                    raise ApiError(
                        503,
                        "tokenizer_unavailable",
                        "The tokenizer of this model version could not be loaded.",
                        retry_after=30,
                    ) from exc
                _tokenizers[digest] = tokenizer
                # A tokenizer (and the modules its loading imported) lives as long as the
                # process: out of the collector's reach, like what was loaded at start-up.
                gc.collect()
                gc.freeze()
    return tokenizer
