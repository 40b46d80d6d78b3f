"""Management API routes for the registry, one explicit path per endpoint.

Rollouts and SLIs have theirs in rollouts.urls.
"""

from __future__ import annotations

from django.urls import path

from models_registry import apis

urlpatterns = [
    path("aliases/<slug:name>", apis.AliasDetailApi.as_view()),
    path("aliases/<slug:name>/split", apis.AliasSplitApi.as_view()),
    path("aliases/<slug:name>/shadow", apis.AliasShadowApi.as_view()),
    path("aliases/<slug:name>/fallback", apis.AliasFallbackApi.as_view()),
    path("deployments", apis.DeploymentListApi.as_view()),
    path("models/<slug:name>/access", apis.ModelAccessApi.as_view()),
    path("models/<slug:name>/grants/<slug:slug>", apis.ModelGrantApi.as_view()),
]
