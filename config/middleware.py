"""The console, admin and management pages' own middleware: their response headers, and the
refusal of NUL characters (the /v1 data plane bypasses this stack: see config/asgi.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponseBadRequest, HttpResponseBase, QueryDict
from django.shortcuts import render
from django.utils.deprecation import MiddlewareMixin


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Add the Content-Security-Policy header unless a view set its own.

    Scripts and styles come from this site's static files only: no inline script, style
    element or attribute, eval or third-party origin runs, so an escaping slip in a template
    cannot turn into script.
    """

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        policy = settings.ROUNDHOUSE_CONTENT_SECURITY_POLICY
        if policy:
            response.headers.setdefault("Content-Security-Policy", policy)
        return response


class NulRefusedMiddleware(MiddlewareMixin):
    """Refuse a console or admin request whose query or form holds the NUL character: 400.

    PostgreSQL cannot store or compare text holding one, so a filter, search or form field
    with one would otherwise reach the database and fail there as a 500. No value these pages
    take can hold it. The management API (/api/) validates its own input and answers in JSON.
    """

    def process_request(self, request: HttpRequest) -> HttpResponseBase | None:
        if request.path.startswith("/api/"):
            return None
        if _holds_nul(request.GET) or (
            request.method == "POST"
            and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data")
            and _holds_nul(request.POST)
        ):
            if request.path.startswith("/console/"):
                # The console's own page: what went wrong and how to go back to the form.
                back = request.META.get("HTTP_REFERER", "")
                where = urlsplit(back)
                ours = where.netloc == request.get_host() and where.path.startswith("/console/")
                context = {"back": back if ours else ""}
                return render(request, "400_nul.html", context, status=400)
            return HttpResponseBadRequest(
                "A query or form value holds the NUL character.", content_type="text/plain"
            )
        return None


def _holds_nul(values: QueryDict) -> bool:
    return any("\x00" in key or any("\x00" in v for v in vs) for key, vs in values.lists())
