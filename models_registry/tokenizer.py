"""A model version's tokenizer and chat template, loaded from its verified artifact directory.

The frontend tokenises prompts with it (inference.tokenization turns its failures into the
API's errors) and a capacity measurement builds prompts of an exact length with it. Its
failures are plain exceptions: what a client is told about them is the caller's business.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import TemplateError

_lock = threading.Lock()
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

    def render_chat(
        self,
        messages: list[dict[str, str]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """Return a conversation as the model's chat template writes it, ready to encode.

        By default with the generation prompt (what a chat request runs); /tokenize may leave
        it out, or leave the last message open for the model to continue (vLLM's options).
        """
        if not getattr(self._hf, "chat_template", None):
            raise ChatTemplateMissing("this model version has no chat template")
        try:
            rendered = self._hf.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except TemplateError as exc:
            # The template refused the conversation (`raise_exception` in its text, such as
            # roles that must alternate): the client's messages are at fault.
            raise ChatTemplateRejected(str(exc)) from exc
        except ValueError as exc:
            if not continue_final_message:
                raise
            # transformers cannot continue a conversation whose last message it cannot find.
            raise ChatTemplateRejected(str(exc)) from exc
        return str(rendered)

    @property
    def vocab_size(self) -> int:
        return len(self._hf)


T = TypeVar("T", bound=Tokenizer)


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
