"""Log redaction: no log record carries an API key's secret or a bearer credential.

The filter is installed on every handler (config.settings LOGGING), so what a library or an
exception message would echo (a header, a request line, a key) is redacted whoever logged it.
It knows the shape of the platform's API keys (tenants.keys); public ids stay readable.
"""

from __future__ import annotations

import logging
import re

from tenants.keys import PREFIXES as KEY_PREFIXES
from tenants.keys import PUBLIC_ID_LENGTH

# An API key's secret (what follows `rh-`, or the former `sy-`, and its 12-character public
# id), and any bearer
# credential: what a log line must never carry.
_KEY_PREFIX = "(?:" + "|".join(re.escape(p) for p in KEY_PREFIXES) + ")"
_KEY_SECRET = re.compile(rf"\b({_KEY_PREFIX}[A-Za-z0-9]{{{PUBLIC_ID_LENGTH}}})[A-Za-z0-9_-]{{16,}}")
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?!\[redacted\])[^\s'\"]+")
# A credential in a URL's query, as a server's request line prints it (`/v1/ws?key=...`: the
# server reads keys from headers only, but clients put them there): its whole value, whatever
# its shape, unless it is a key already redacted to its public id.
_QUERY_KEY = re.compile(
    rf"(?i)([?&](?:api_)?key=)(?!(?:{_KEY_PREFIX}[A-Za-z0-9]{{{PUBLIC_ID_LENGTH}}})?"
    r"\[redacted\])[^&\s'\"#]+"
)


def redact(text: str) -> str:
    """Return text with API key secrets and bearer credentials replaced; public ids stay."""
    text = _QUERY_KEY.sub(r"\1[redacted]", _KEY_SECRET.sub(r"\1[redacted]", text))
    return _BEARER.sub(r"\1[redacted]", text)


class RedactFilter(logging.Filter):
    """Redact credentials from every record's message and traceback, whoever logged it.

    Prompts and completions are never logged by the platform's own code; this catches what a
    library or an exception message would echo (a header, a request line, a key).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
