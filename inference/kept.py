"""How long what a client asks the platform to keep lives: a stored response, a conversation.

The tenant's retention period when it sets one, else OpenAI's 30 days.
"""

from __future__ import annotations

import datetime as dt

DEFAULT_DAYS = 30


def kept_for(retention_days: int) -> dt.timedelta:
    """The lifetime of a kept object of a tenant with this retention period (0: none set)."""
    return dt.timedelta(days=retention_days if retention_days > 0 else DEFAULT_DAYS)
