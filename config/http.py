"""HTTP header values shared by the apps that send files."""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

# What may stand inside a quoted filename as it is: printable ASCII but quote and backslash.
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def content_disposition(filename: str) -> str:
    """Return a Content-Disposition value that downloads a file under its own name.

    Any name works (RFC 6266): one that is not plain ASCII travels as `filename*` in UTF-8,
    beside an ASCII approximation for clients that read only `filename`.
    """
    if filename and all(c in _PLAIN for c in filename):
        return f'attachment; filename="{filename}"'
    if not filename:
        return 'attachment; filename="download"'
    ascii_name = unicodedata.normalize("NFKD", filename).encode("ascii", "ignore").decode()
    fallback = "".join(c if c in _PLAIN else "_" for c in ascii_name).strip()
    if not fallback or fallback.startswith("."):  # nothing left but, perhaps, the extension
        fallback = f"download{fallback}"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"
