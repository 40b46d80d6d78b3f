"""Every URL of the platform, one explicit path per endpoint."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

from inference import urls as inference_urls
from inference.base import prometheus
from inference.operations import views as operations
from tenants import apis as tenants_apis

urlpatterns = [
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
    # Before the rest of /v1, which answers every other path with a JSON 404.
    path("v1/", include("batches.urls")),
    path("v1/", include(inference_urls)),
    # The management API's OpenAPI document (/v1's is at /v1/openapi.json).
    path("api/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/", include("tenants.urls")),
    path("api/", include("models_registry.urls")),
    path("api/", include("rollouts.urls")),
    path("api/finance/", include("billing.urls")),
    re_path(r"^api/(?P<path>[\s\S]*)$", tenants_apis.not_found),
    path("healthz", operations.healthz),
    path("readyz", operations.readyz),
    # vLLM's own operational endpoints, at vLLM's paths (inference.operations.views).
    path("health", operations.health),
    path("ping", operations.ping),
    path("version", operations.version),
    path("tokenize", operations.tokenize),
    path("detokenize", operations.detokenize),
    path("", RedirectView.as_view(pattern_name="console:home"), name="root"),
    path("metrics", prometheus.metrics, name="metrics"),
]
