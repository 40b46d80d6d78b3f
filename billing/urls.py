"""Finance API routes, one explicit path per endpoint."""

from __future__ import annotations

from django.urls import path

from billing import apis

urlpatterns = [
    path("invoices", apis.InvoiceListApi.as_view()),
    path("invoices/build", apis.InvoiceBuildApi.as_view()),
    path("invoices/<int:pk>", apis.InvoiceDetailApi.as_view()),
    path("invoices/<int:pk>/csv", apis.InvoiceCsvApi.as_view()),
    path("invoices/<int:pk>/pdf", apis.InvoicePdfApi.as_view()),
    path("invoices/<int:pk>/<slug:action>", apis.InvoiceActionApi.as_view()),
    path("usage", apis.UsageApi.as_view()),
    path("budget", apis.BudgetApi.as_view()),
    path("adjustments", apis.AdjustmentCreateApi.as_view()),
    path("price-books", apis.PriceBookCreateApi.as_view()),
]
