"""An embeddings body (`/v1/embeddings`, and a batch's embeddings lines): its field table and
its parser, which reads every field through its declaration.
"""

from __future__ import annotations

from typing import Any

from inference.body.fields import (
    CACHE_SALT,
    GENERATION_FIELDS,
    SERVICE_TIERS,
    TRUNCATE_PROMPT_TOKENS,
    TRUNCATION_SIDE,
    Field,
    honoured,
    ignored,
    refused,
    unsupported_refuse,
)
from inference.body.inputs import (
    INPUT,
    MODEL,
)
from inference.body.parser import EmbeddingRequest
from inference.body.types import (
    boolean,
    integer,
    one_of,
)

EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")


ENDIANNESS = ("native", "big", "little")


# The same for embeddings bodies: OpenAI's and vLLM's fields.
# bytes and bytes_only are vLLM's binary answers (docs/embeddings.md).
ENCODING_FORMATS = ("float", "base64", "bytes", "bytes_only")


EMBEDDING_FIELDS: dict[str, Field] = {
    "model": honoured(MODEL),
    "input": honoured(INPUT),
    "encoding_format": honoured(one_of(ENCODING_FORMATS)),
    "dimensions": honoured(
        integer(1, 1 << 16, doc="Fewer than the model's: cut and normalised again.")
    ),
    "user": GENERATION_FIELDS["user"],
    "service_tier": GENERATION_FIELDS["service_tier"],
    "timeout": GENERATION_FIELDS["timeout"],
    "request_id": GENERATION_FIELDS["request_id"],
    # Accepted as vLLM's server accepts it, and nothing to do: an encoder keeps no cache of
    # earlier inputs that a request could be served from.
    "cache_salt": ignored(CACHE_SALT),
    "priority": refused(0),
    "truncate_prompt_tokens": honoured(TRUNCATE_PROMPT_TOKENS),
    "truncation_side": honoured(TRUNCATION_SIDE),
    "add_special_tokens": refused(True),
    # vLLM's: base64 vectors in another number type or byte order (floats stay JSON numbers).
    "embed_dtype": honoured(
        one_of(EMBED_DTYPES, doc="The number type of base64 vectors (raw bits for bfloat16, fp8).")
    ),
    "endianness": honoured(one_of(ENDIANNESS, doc="The byte order of base64 vectors.")),
    "use_activation": honoured(
        boolean(
            default=True,
            doc="false: vectors as the model pools them, not normalised to unit length.",
        )
    ),
    # Removed from vLLM (its server refuses it too): use_activation says the same.
    "normalize": refused(),
    "padding": refused(),
    "mm_processor_kwargs": refused(),
}


def embeddings_parse(body: dict[str, Any]) -> EmbeddingRequest:
    """Return the typed request of an embeddings body, or raise a 400.

    Every field is read through its declaration in EMBEDDING_FIELDS.
    """
    model = MODEL.read(body, "model")
    unsupported_refuse(body, EMBEDDING_FIELDS)

    def read(name: str) -> Any:
        return EMBEDDING_FIELDS[name].read(body, name)

    tier = read("service_tier")
    return EmbeddingRequest(
        model=model,
        inputs=read("input"),
        encoding_format=read("encoding_format") or "float",
        dimensions=read("dimensions"),
        user=read("user"),
        priority=SERVICE_TIERS[tier] if tier is not None else "interactive",
        timeout=read("timeout"),
        truncate_prompt_tokens=read("truncate_prompt_tokens"),
        truncation_side=read("truncation_side"),
        embed_dtype=read("embed_dtype") or "float32",
        endianness=read("endianness") or "native",
        use_activation=read("use_activation"),
    )
