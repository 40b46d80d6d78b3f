"""Hostile query strings and form values against every console and admin page: never a 5xx.

The console and Django's admin are the staff's and tenant admins' doors, and what they type
(or a crafted link makes their browser send) reaches filters, searches, paginators and forms.
Each console page is asked with each value in each query parameter the console reads, and
each form is posted with it, as a tenant admin and as staff; each admin list is asked with
hostile searches, orderings and filters.
"""

from __future__ import annotations

import itertools

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db

HOSTILE = [
    "",
    "-1",
    "0",
    "1e400",
    "nan",
    "-inf",
    "9" * 400,
    "\x00",
    "a\x00b",
    "a" * 5_000,
    "%00",
    "../..",
    "1.5",
    "\u202e",
]
PAGES = [
    "/console/",
    "/console/t/acme/",
    "/console/t/acme/keys",
    "/console/t/acme/models",
    "/console/t/acme/requests",
    "/console/t/acme/responses",
    "/console/t/acme/usage",
    "/console/t/acme/invoices",
    "/console/ops/",
    "/console/ops/live",
    "/console/ops/audit",
    "/console/ops/versions",
    "/console/ops/tenants",
    "/console/ops/models",
]
PARAMS = ["page", "group_by", "action", "target"]  # every query parameter the console reads
FORMS = {
    "/console/t/acme/keys": ["name", "scopes", "expires_in_days", "allowed_models"],
    "/console/t/acme/keys/nosuchkey/rotate": ["overlap_hours"],
    "/console/ops/aliases/nosuchalias/split": ["version", "percent", "reason"],
    # The platform model is open: a grant or a revoke of it changes nothing, whatever is sent.
    "/console/ops/models/tiny-llama/grant": ["tenant", "reason"],
    "/console/ops/models/tiny-llama/revoke": ["tenant", "reason"],
}


@pytest.mark.parametrize("who", ["tenant admin", "staff"])
def test_no_console_page_or_form_answers_a_hostile_value_with_a_5xx(world, who):
    if who == "staff":
        user = User.objects.create_user("console-inputs-staff", password="-", is_staff=True)
    else:
        user = world.alice
    client = Client(raise_request_exception=False)
    client.force_login(user)
    failed = []
    for page, param, value in itertools.product(PAGES, PARAMS, HOSTILE):
        status = client.get(page, {param: value}).status_code
        if status >= 500:
            failed.append((page, param, value[:20], status))
    for form, value in itertools.product(FORMS, HOSTILE):
        status = client.post(form, {field: value for field in FORMS[form]}).status_code
        if status >= 500:
            failed.append((form, "form", value[:20], status))
    assert not failed, failed


def test_no_admin_list_answers_a_hostile_search_or_filter_with_a_5xx(world):
    user = User.objects.create_superuser("console-inputs-root", password="-")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    failed = []
    for model in admin.site._registry:
        changelist = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for param, value in itertools.product(
            ["q", "o", "p", "status", "tenant__id__exact"], HOSTILE
        ):
            status = client.get(changelist, {param: value}).status_code
            if status >= 500:
                failed.append((changelist, param, value[:20], status))
    assert not failed, failed


def test_a_nul_in_a_console_form_gets_the_consoles_page_saying_what_to_fix(world):
    client = Client(raise_request_exception=False)
    client.force_login(world.alice)
    form = "/console/t/acme/keys"
    back = "http://testserver/console/t/acme/keys"
    refused = client.post(form, {"name": "ci\x00bot"}, HTTP_REFERER=back)
    assert refused.status_code == 400 and refused["Content-Type"].startswith("text/html")
    page = refused.content.decode()
    assert "NUL character" in page and "nothing was changed" in page
    assert f'href="{back}"' in page
    # A referrer elsewhere is no way back: the page links the console's home only.
    elsewhere = client.post(form, {"name": "ci\x00bot"}, HTTP_REFERER="https://evil.example/")
    assert "evil.example" not in elsewhere.content.decode()
    # The admin keeps its plain refusal.
    root = User.objects.create_superuser("console-nul-root", password="-")
    client.force_login(root)
    plain = client.get("/admin/billing/usagerecord/", {"status": "\x00"})
    assert plain.status_code == 400 and plain["Content-Type"].startswith("text/plain")
