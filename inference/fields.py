"""What the platform does with every field of a request body: honoured, accepted or refused.

One table per endpoint. A refused field is a 400 `unsupported_parameter` naming it, unless it
asks for nothing (null, or one of its unused values); so is a field in no table, as OpenAI's
API refuses an argument it does not know. docs/api.md lists every table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from config.json_body import shown
from inference.errors import ApiError


@dataclass(frozen=True)
class Field:
    """What Roundhouse does with one body field.

    honoured: it shapes the answer. ignored: accepted, and it cannot change the answer
    (metadata, hints; each says why in its table).
    refused: a 400 `unsupported_parameter` naming it, unless its value is null or one of
    `unused`, the values that ask for nothing (n=1, logprobs=false).
    """

    decision: str
    unused: tuple[Any, ...] = ()


HONOURED = Field("honoured")
IGNORED = Field("ignored")


def refused(*unused: Any) -> Field:
    return Field("refused", unused)


# Every field of OpenAI's and of vLLM's chat and completions bodies. A field in neither is
# refused, as OpenAI's API refuses it (vLLM's server logs it and answers as if it were not
# there): a client that asks for something is told when it does not happen.
# tests/inference/test_params.py checks that every field of the installed vLLM's requests is
# here.
GENERATION_FIELDS: dict[str, Field] = {
    "model": HONOURED,
    "messages": HONOURED,  # chat
    "prompt": HONOURED,  # completions
    "max_tokens": HONOURED,
    "max_completion_tokens": HONOURED,  # chat
    "temperature": HONOURED,
    "top_p": HONOURED,
    "top_k": HONOURED,
    "seed": HONOURED,
    "stop": HONOURED,
    "ignore_eos": HONOURED,
    "min_tokens": HONOURED,
    "presence_penalty": HONOURED,
    "frequency_penalty": HONOURED,
    "stream": HONOURED,
    "stream_options": HONOURED,
    "user": HONOURED,
    "service_tier": HONOURED,
    "timeout": HONOURED,  # Roundhouse's own
    "metadata": IGNORED,
    "prompt_cache_key": IGNORED,
    "safety_identifier": IGNORED,
    "parallel_tool_calls": HONOURED,  # chat, with tools
    "request_id": IGNORED,  # vLLM's; every request gets an id of ours (x-request-id)
    "stream_interval": IGNORED,  # vLLM's chunking of a stream; the text is the same
    "n": HONOURED,
    "best_of": refused(1),
    "use_beam_search": refused(False),
    "logprobs": HONOURED,
    "top_logprobs": HONOURED,  # chat
    "prompt_logprobs": refused(),
    "logprob_token_ids": refused(),
    "echo": HONOURED,
    "suffix": refused(""),
    "logit_bias": HONOURED,
    "allowed_token_ids": refused(),
    "bad_words": HONOURED,
    "stop_token_ids": HONOURED,
    "include_stop_str_in_output": HONOURED,
    "skip_special_tokens": HONOURED,
    "spaces_between_special_tokens": HONOURED,
    "repetition_penalty": HONOURED,
    "length_penalty": refused(1.0),
    "min_p": HONOURED,
    "repetition_detection": refused(),
    "watermarking": refused(),
    "thinking_token_budget": refused(),
    "reasoning_effort": refused(),
    "include_reasoning": refused(True),
    "verbosity": refused(),
    "tools": HONOURED,  # chat
    "functions": HONOURED,  # chat, OpenAI's older name: mapped onto tools
    "tool_choice": HONOURED,  # chat
    "function_call": HONOURED,  # chat, mapped onto tool_choice
    "response_format": HONOURED,
    "structured_outputs": HONOURED,
    "guided_json": refused(),
    "guided_regex": refused(),
    "guided_choice": refused(),
    "guided_grammar": refused(),
    "guided_decoding_backend": refused(),
    "guided_whitespace_pattern": refused(),
    "chat_template": refused(),
    "chat_template_kwargs": refused(),
    "add_generation_prompt": HONOURED,  # chat
    "continue_final_message": HONOURED,  # chat
    "add_special_tokens": refused(),
    "documents": refused(),
    "truncate_prompt_tokens": refused(),
    "truncation_side": refused(),
    "priority": refused(0),  # vLLM's; service_tier chooses Roundhouse's class
    "store": refused(False),  # nothing is stored to fetch later
    "modalities": refused(["text"]),
    "audio": refused(),
    "prediction": refused(),
    "web_search_options": refused(),
    "prompt_embeds": refused(),
    "mm_payload": refused(),
    "mm_processor_kwargs": refused(),
    "media_io_kwargs": refused(),
    "return_mm_kwargs": refused(False),
    "return_prompt_text": refused(False),
    "return_token_ids": refused(False),
    "return_token_offsets": refused(False),
    "return_tokens_as_token_ids": refused(False),
    "routed_experts_prompt_start": refused(),
    "session_id": refused(),
    "kv_transfer_params": refused(),
    "ec_transfer_params": refused(),
    "vllm_xargs": refused(),
    # vLLM's prefix-cache isolation: workers do not salt their prefix cache per request yet.
    "cache_salt": refused(),
}

# The same for embeddings bodies: OpenAI's and vLLM's fields.
EMBEDDING_FIELDS: dict[str, Field] = {
    "model": HONOURED,
    "input": HONOURED,
    "encoding_format": HONOURED,
    "dimensions": HONOURED,
    "user": HONOURED,
    "service_tier": HONOURED,
    "timeout": HONOURED,
    "request_id": IGNORED,
    "cache_salt": refused(),
    "priority": refused(0),
    "truncate_prompt_tokens": refused(),
    "truncation_side": refused(),
    "add_special_tokens": refused(True),
    "embed_dtype": refused("float32"),
    "endianness": refused("native"),
    "use_activation": refused(),
    "normalize": refused(),
    "padding": refused(),
    "mm_processor_kwargs": refused(),
}


def _same(value: Any, unused: Any) -> bool:
    """Whether a value equals an unused one, as JSON compares them (1 == 1.0, but not true)."""
    if isinstance(value, bool) or isinstance(unused, bool):
        return value is unused
    if isinstance(value, int | float) and isinstance(unused, int | float):
        return value == unused
    return type(value) is type(unused) and value == unused


def unsupported_refuse(body: dict[str, Any], fields: dict[str, Field]) -> None:
    """Refuse every refused field the body sets to something other than null or unused."""
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            message = f"Unrecognized request argument supplied: {shown(name)}."
            raise ApiError(400, "unsupported_parameter", message, param=shown(name))
        if field.decision != "refused" or value is None:
            continue
        if any(_same(value, unused) for unused in field.unused):
            continue
        hint = " or ".join(json.dumps(unused) for unused in field.unused)
        message = f"'{name}' is not supported; leave it out" + (
            f" or send {hint}." if hint else "."
        )
        raise ApiError(400, "unsupported_parameter", message, param=name)


# --- vLLM's /tokenize and /detokenize ----------------------------------------------------------

# Every field of vLLM's TokenizeCompletionRequest, TokenizeChatRequest and DetokenizeRequest;
# a field in neither is refused, as on the other endpoints. tests/inference/test_params.py
# checks that these tables cover the installed vLLM's requests.
TOKENIZE_FIELDS: dict[str, Field] = {
    "model": HONOURED,
    "prompt": HONOURED,
    "messages": HONOURED,
    "add_special_tokens": HONOURED,
    "add_generation_prompt": HONOURED,
    "continue_final_message": HONOURED,
    "return_token_strs": HONOURED,
    # A template of the client's own runs code of the client's in the frontend: vLLM, too,
    # refuses it unless its operator trusts request templates.
    "chat_template": refused(),
    "chat_template_kwargs": refused({}),
    "tools": refused([]),
    "media_io_kwargs": refused(),
    "mm_processor_kwargs": refused(),
}
DETOKENIZE_FIELDS: dict[str, Field] = {
    "model": HONOURED,
    "tokens": HONOURED,
}
