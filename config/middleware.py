"""Response headers for the console, admin and management pages (the /v1 data plane bypasses
this stack: see config/asgi.py)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
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
