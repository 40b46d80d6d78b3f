"""The management API and the console answer hostile input with a 400 or a form error."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiKey
from tenants.services import api_key_issue, api_key_rotate

pytestmark = pytest.mark.django_db

DEEP = 10_000


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("olivia", is_staff=True))
    return client


def _send(client: APIClient, method: str, path: str, raw: str):
    return getattr(client, method)(path, data=raw, content_type="application/json")


@pytest.mark.parametrize(
    ("method", "path", "raw", "field"),
    [
        ("patch", "/api/tenants/acme/quota", "[" * DEEP + "]" * DEEP, "nests"),
        ("patch", "/api/tenants/acme/quota", '{"max_concurrency": ' + "[" * 40 + "]" * 40 + "}",
         "'max_concurrency'"),
        ("post", "/api/rollouts", '{"alias": "\\ud800", "canary": "x"}', "'alias'"),
        ("post", "/api/rollouts", '{"alias": "a", "canary": "x", "reason": "\\u0000"}', "'reason'"),
        ("post", "/api/rollouts", '{"alias": "a", "guardrails": {"\\udfff": 1}}', "surrogate"),
        ("patch", "/api/tenants/acme/quota", '{"max_concurrency": NaN}', "'max_concurrency'"),
    ],
)  # fmt: skip
def test_the_management_api_answers_a_hostile_body_with_a_400_naming_the_field(
    staff, world, method, path, raw, field
):
    response = _send(staff, method, path, raw)
    assert response.status_code == 400, response.content[:300]
    detail = response.json()["detail"]
    assert field in detail and len(detail) < 200


def test_the_management_api_still_takes_a_normal_body(staff, world):
    response = _send(staff, "patch", "/api/tenants/globex/quota", '{"max_concurrency": 7}')
    assert response.status_code == 200 and response.json()["max_concurrency"] == 7


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", "&".join(["max_concurrency=1"] * 1001)),
        ("multipart/form-data; boundary=b",
         "".join('--b\r\nContent-Disposition: form-data; name="tenants"\r\n\r\n0\r\n'
                 for _ in range(1001)) + "--b--\r\n"),
    ],
)  # fmt: skip
def test_a_form_past_djangos_field_limit_gets_the_apis_json_400(staff, world, content_type, body):
    response = staff.patch("/api/tenants/acme/quota", data=body, content_type=content_type)
    assert response.status_code == 400, response.content[:300]
    assert "fields" in response.json()["detail"]


def test_a_key_expires_within_ten_years(world):
    with pytest.raises(ValidationError) as caught:
        api_key_issue(
            tenant=world.acme, name="forever", expires_at=timezone.now() + dt.timedelta(days=3651)
        )
    assert "expires_at" in caught.value.message_dict


def test_a_rotation_overlaps_at_most_thirty_days(world):
    key = api_key_issue(tenant=world.acme, name="rotating").key
    with pytest.raises(ValidationError) as caught:
        api_key_rotate(key=key, overlap=dt.timedelta(hours=721))
    assert "overlap" in caught.value.message_dict


@pytest.fixture
def alice(world) -> Client:
    client = Client()
    client.force_login(world.alice)
    return client


@pytest.mark.parametrize("days", ["3000000", "3651", "0", "-1", "1" + "0" * 5000, "²", "abc"])
def test_the_console_refuses_an_expiry_out_of_range_with_a_form_error(alice, days):
    before = ApiKey.objects.count()
    response = alice.post(
        "/console/t/acme/keys", {"name": "k", "expires_in_days": days}, follow=True
    )
    assert response.status_code == 200
    assert "whole number of days" in response.content.decode()
    assert ApiKey.objects.count() == before


def test_the_console_issues_a_key_that_expires_in_ten_years(alice, world):
    response = alice.post("/console/t/acme/keys", {"name": "decade", "expires_in_days": "3650"})
    assert response.status_code == 302
    key = ApiKey.objects.filter(tenant=world.acme, name="decade").get()
    assert key.expires_at is not None
    assert key.expires_at - timezone.now() > dt.timedelta(days=3649)


@pytest.mark.parametrize("hours", ["99999999999", "721", "-5", "x"])
def test_the_console_refuses_a_rotation_overlap_out_of_range(alice, world, hours):
    key = api_key_issue(tenant=world.acme, name="to-rotate").key
    response = alice.post(
        f"/console/t/acme/keys/{key.public_id}/rotate", {"overlap_hours": hours}, follow=True
    )
    assert response.status_code == 200
    assert "whole number of hours" in response.content.decode()
    key.refresh_from_db()
    assert key.expires_at is None  # not rotated
