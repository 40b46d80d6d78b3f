"""Console routes, one explicit path per page."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("login", views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("t/<slug:slug>/", views.overview, name="overview"),
    path("t/<slug:slug>/keys", views.keys, name="keys"),
    path("t/<slug:slug>/keys/<str:public_id>/revoke", views.key_revoke, name="key_revoke"),
    path("t/<slug:slug>/keys/<str:public_id>/rotate", views.key_rotate, name="key_rotate"),
    path("t/<slug:slug>/requests", views.requests_recent, name="requests"),
    path("t/<slug:slug>/responses", views.responses, name="responses"),
    path("t/<slug:slug>/responses/<str:response_id>", views.response, name="response"),
    path(
        "t/<slug:slug>/responses/<str:response_id>/delete",
        views.response_remove,
        name="response_remove",
    ),
    path("t/<slug:slug>/conversations", views.conversations, name="conversations"),
    path(
        "t/<slug:slug>/conversations/<str:conversation_id>",
        views.conversation,
        name="conversation",
    ),
    path(
        "t/<slug:slug>/conversations/<str:conversation_id>/delete",
        views.conversation_remove,
        name="conversation_remove",
    ),
    path("t/<slug:slug>/models", views.models, name="models"),
    path("t/<slug:slug>/usage", views.usage, name="usage"),
    path("t/<slug:slug>/invoices", views.invoices, name="invoices"),
    path("t/<slug:slug>/invoices/<int:pk>", views.invoice_detail, name="invoice"),
    path("ops/", views.ops, name="ops"),
    path("ops/live", views.ops_live, name="ops_live"),
    path("ops/aliases/<slug:name>", views.canary, name="canary"),
    path("ops/aliases/<slug:name>/split", views.canary_split, name="canary_split"),
    path("ops/aliases/<slug:name>/fallback", views.canary_fallback, name="canary_fallback"),
    path(
        "ops/aliases/<slug:name>/rollouts/<int:pk>/<slug:action>",
        views.canary_action,
        name="canary_action",
    ),
    path("ops/audit", views.audit, name="audit"),
    path("ops/versions", views.versions, name="versions"),
    path("ops/models", views.model_access, name="model_access"),
    path(
        "ops/models/<slug:name>/<slug:action>",
        views.model_access_change,
        name="model_access_change",
    ),
    path("ops/tenants", views.tenants, name="tenants"),
]
