"""Management API routes of rollouts and of a version's SLIs, one explicit path per endpoint."""

from __future__ import annotations

from django.urls import path

from rollouts import apis

urlpatterns = [
    path("rollouts", apis.RolloutListApi.as_view()),
    path("rollouts/<int:pk>", apis.RolloutDetailApi.as_view()),
    path("rollouts/<int:pk>/<slug:action>", apis.RolloutActionApi.as_view()),
    path("versions/<str:ref>/slis", apis.VersionSlisApi.as_view()),
]
