"""vLLM's batch chat body (`/v1/chat/completions/batch`): its field table and its parser.

Chat's and completions' own table and parser are in inference.body, beneath every surface,
because the Responses, Messages and WebSocket surfaces turn their requests into chat.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from inference.body.fields import (
    CHAT,
    GENERATION_FIELDS,
    Field,
    honoured,
    refused,
    unsupported_refuse,
)
from inference.body.inputs import (
    CONVERSATIONS,
    MODEL,
)
from inference.body.parser import GenerationRequest, generation_parse

# vLLM's /v1/chat/completions/batch: a chat body whose `messages` holds conversations, each
# answered as one choice. Its answer is one chat completion, so what has no place in it is
# refused (vLLM's server refuses n, beams and structural tags; it drops the rest silently, or,
# for `stream`, answers with the last tokens alone).
CHAT_BATCH = "chat.completions.batch"  # the endpoint its usage records name


CHAT_BATCH_FIELDS: dict[str, Field] = {
    **{name: field for name, field in GENERATION_FIELDS.items() if field.only in (None, CHAT)},
    "messages": honoured(CONVERSATIONS),
    "stream": refused(False),
    "stream_options": refused(),
    "n": refused(1),
    "use_beam_search": refused(False),
    "early_stopping": refused(False),  # a beam search's, in vLLM's batch request only
    "tools": refused(),
    "functions": refused(),
    "tool_choice": refused("none"),
    "function_call": refused("none"),
    "parallel_tool_calls": refused(),
    "prompt_logprobs": refused(),
    "return_prompt_text": refused(False),
}


def chat_batch_parse(body: dict[str, Any], *, tenant_id: int | None = None) -> GenerationRequest:
    """Return the typed request of a /v1/chat/completions/batch body, or raise a 400.

    vLLM's batch chat: `messages` holds conversations, and every other field is a chat
    request's, applied to each one. What its answer has no place for (a stream, tool calls,
    n choices, beams, the prompts' logprobs or rendered text) is refused, naming the field.
    """
    MODEL.read(body, "model")
    unsupported_refuse(body, CHAT_BATCH_FIELDS, endpoint=CHAT)
    conversations = CHAT_BATCH_FIELDS["messages"].read(body, "messages")
    # The other fields read as one chat's: its rules between fields hold for the batch.
    first = generation_parse(
        {**body, "messages": body["messages"][0]}, endpoint=CHAT, tenant_id=tenant_id
    )
    return dataclasses.replace(first, messages=conversations[0], conversations=tuple(conversations))
