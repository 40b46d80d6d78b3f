"""The management API's (/api/) JSON parser: DRF's, under the limits of every JSON body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from config.json_body import BodyProblem, json_document


class JSONParser(parsers.JSONParser):
    """Parse a JSON body, refusing what config.json_body refuses with a 400 naming the field.

    DRF's own parser lets deep nesting through as a RecursionError (a 500) and lone surrogates
    through to PostgreSQL. NUL is refused in every string too: the management API stores what
    it is sent, and PostgreSQL's text and jsonb cannot hold it.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return json_document(stream.read().decode(encoding), nul=False)
        except UnicodeDecodeError:
            raise ParseError(f"JSON parse error - the body is not valid {encoding}.") from None
        except BodyProblem as problem:
            raise ParseError(f"JSON parse error - {problem.message}") from None
