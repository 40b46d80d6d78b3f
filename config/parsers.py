"""The management API's (/api/) parsers: DRF's, under the limits of every body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation, TooManyFieldsSent, TooManyFilesSent
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


class _FormLimits:
    """Turn Django's refusal of a form past its limits into DRF's 400, which answers JSON.

    Django refuses a form with more than DATA_UPLOAD_MAX_NUMBER_FIELDS fields (or files) by
    raising SuspiciousOperation, which DRF does not catch: the caller would get Django's HTML
    400 page instead of the management API's JSON error.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)  # type: ignore[misc]
        except TooManyFilesSent:
            most = settings.DATA_UPLOAD_MAX_NUMBER_FILES
            raise ParseError(f"Form parse error - the form has more than {most} files.") from None
        except TooManyFieldsSent:
            most = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
            raise ParseError(f"Form parse error - the form has more than {most} fields.") from None
        except SuspiciousOperation:
            raise ParseError("Form parse error - the form is past the server's limits.") from None


class FormParser(_FormLimits, parsers.FormParser):
    """DRF's url-encoded form parser, answering a form past Django's limits with a JSON 400."""


class MultiPartParser(_FormLimits, parsers.MultiPartParser):
    """DRF's multipart parser, answering a form past Django's limits with a JSON 400."""
