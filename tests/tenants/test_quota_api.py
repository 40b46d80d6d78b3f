from __future__ import annotations

import base64

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tenants.models import AuditEvent, Quota

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("olivia", is_staff=True))
    return client


def test_staff_change_a_quota_and_the_change_is_audited(staff, world):
    response = staff.patch("/api/tenants/globex/quota", {"requests_per_minute": 42}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["requests_per_minute"] == 42
    assert Quota.objects.get(tenant=world.globex).requests_per_minute == 42
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.target_id == "globex" and event.actor is not None
    assert event.actor.username == "olivia"
    assert event.data["requests_per_minute"]["to"] == "42"


def test_an_invalid_value_names_the_field(staff, world):
    response = staff.patch("/api/tenants/globex/quota", {"max_concurrency": -1}, format="json")
    assert response.status_code == 400 and "max_concurrency" in response.json()


def test_staff_opt_a_tenant_in_to_output_capping(staff, world):
    assert staff.get("/api/tenants/globex/quota").json()["output_capping"] is False
    response = staff.patch("/api/tenants/globex/quota", {"output_capping": True}, format="json")
    assert response.status_code == 200, response.content
    assert Quota.objects.get(tenant=world.globex).output_capping is True
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.data["output_capping"] == {"from": "False", "to": "True"}


def test_an_output_capping_that_is_not_a_boolean_names_the_field(staff, world):
    response = staff.patch("/api/tenants/globex/quota", {"output_capping": "some"}, format="json")
    assert response.status_code == 400 and "output_capping" in response.json()


def test_an_unknown_tenant_is_404(staff, world):
    assert staff.get("/api/tenants/nobody/quota").status_code == 404


def test_tenant_users_cannot_use_the_management_api(world):
    client = APIClient()
    client.force_login(world.alice)
    assert client.get("/api/tenants/acme/quota").status_code == 403
    assert APIClient().get("/api/tenants/acme/quota").status_code == 403


def test_staff_can_use_basic_auth(world):
    User.objects.create_user("ops", password="s3cret-ops", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"ops:s3cret-ops").decode())
    response = client.patch("/api/tenants/acme/quota", {"max_concurrency": 9}, format="json")
    assert response.status_code == 200 and response.json()["max_concurrency"] == 9
