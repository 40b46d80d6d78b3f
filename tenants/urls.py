"""Management API routes for tenants, one explicit path per endpoint."""

from __future__ import annotations

from django.urls import path

from tenants.apis import KeyModelsApi, QuotaDetailApi, TenantPrivacyApi

urlpatterns = [
    path("tenants/<slug:slug>/quota", QuotaDetailApi.as_view()),
    path("tenants/<slug:slug>/privacy", TenantPrivacyApi.as_view()),
    path("tenants/<slug:slug>/keys/<str:public_id>/models", KeyModelsApi.as_view()),
]
