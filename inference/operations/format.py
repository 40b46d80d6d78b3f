"""The bodies the operational endpoints answer with that are more than a line: a model's card
as vLLM's server lists it."""

from __future__ import annotations

from typing import Any

from inference.pipeline.auth import Principal
from models_registry.selectors import Route


def model_card(name: str, created: int, route: Route, principal: Principal) -> dict[str, Any]:
    """A model as vLLM's server lists it: `root`, the version that answers it now, and
    `max_model_len`, the context this tenant may use there (the version's and its own limit's
    smaller; what /tokenize reports). Clients size their prompts from it. `owned_by` names the
    tenant a model was built for (only it sees the model), else the platform."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": route.owner or "roundhouse",
        "root": route.served_name,
        "max_model_len": min(route.context_length, principal.max_context_tokens),
    }
