"""The field tables of vLLM's operational endpoints, /tokenize and /detokenize
(inference.operations), declared as every other body's (inference.fields)."""

from __future__ import annotations

from inference.fields import CHAT_TEMPLATE_KWARGS, Field, honoured, refused
from inference.kinds import boolean, boolean_or_none, string
from inference.prompts import MESSAGES, MODEL, TOKENS
from inference.structured import TOOLS

# Every field of vLLM's TokenizeCompletionRequest, TokenizeChatRequest and DetokenizeRequest;
# a field in neither is refused, as on the other endpoints. tests/inference/test_params.py
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
