"""Management API routes for the registry and rollouts, one explicit path per endpoint."""

from __future__ import annotations

from django.urls import path

from models_registry import apis

urlpatterns = [
    path("rollouts", apis.RolloutListApi.as_view()),
    path("rollouts/<int:pk>", apis.RolloutDetailApi.as_view()),
    path("rollouts/<int:pk>/<slug:action>", apis.RolloutActionApi.as_view()),
    path("aliases/<slug:name>", apis.AliasDetailApi.as_view()),
    path("aliases/<slug:name>/split", apis.AliasSplitApi.as_view()),
    path("aliases/<slug:name>/shadow", apis.AliasShadowApi.as_view()),
    path("deployments", apis.DeploymentListApi.as_view()),
    path("versions/<str:ref>/slis", apis.VersionSlisApi.as_view()),
]
