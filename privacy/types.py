"""What the privacy app hands to its callers."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RetainedText:
    """One request's retained prompt and completion, decrypted."""

    request_id: str
    # Out of the repr, so tracebacks and debug logs never carry the text.
    prompt: str = field(repr=False)
    completion: str = field(repr=False)
    created_at: dt.datetime
    expires_at: dt.datetime
