"""The staff-only privacy settings of a tenant: API and admin, every change audited."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import AuditEvent, Tenant
from tenants.services import tenant_create, tenant_delete

pytestmark = pytest.mark.django_db


def test_staff_read_the_privacy_settings(staff, world):
    response = staff.get("/api/tenants/globex/privacy")
    assert response.status_code == 200
    assert response.json() == {"retention_days": 0, "no_training": True, "deleted_at": None}


def test_staff_change_them_and_the_change_is_audited(staff, world):
    response = staff.patch(
        "/api/tenants/globex/privacy", {"retention_days": 14, "no_training": False}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["retention_days"] == 14 and response.json()["no_training"] is False
    globex = Tenant.objects.get(slug="globex")
    assert (globex.retention_days, globex.no_training) == (14, False)
    event = AuditEvent.objects.filter(action="tenant.privacy_update").latest("id")
    assert event.target_id == "globex" and event.actor is not None
    assert event.actor.username == "petra"
    assert event.data == {
        "retention_days": {"from": 0, "to": 14},
        "no_training": {"from": True, "to": False},
    }


def test_an_unchanged_setting_writes_no_event(staff, world):
    before = AuditEvent.objects.count()
    response = staff.patch("/api/tenants/globex/privacy", {"no_training": True}, format="json")
    assert response.status_code == 200 and AuditEvent.objects.count() == before


@pytest.mark.parametrize("value", [-1, 3651, "forever"])
def test_an_invalid_retention_names_the_field(staff, world, value):
    response = staff.patch("/api/tenants/globex/privacy", {"retention_days": value}, format="json")
    assert response.status_code == 400 and "retention_days" in response.json()


def test_a_deleted_tenant_cannot_change(staff, world):
    tenant = tenant_create(slug="privacy-api-gone")
    tenant_delete(tenant=tenant)
    response = staff.patch(
        "/api/tenants/privacy-api-gone/privacy", {"retention_days": 1}, format="json"
    )
    assert response.status_code == 400 and "tenant" in response.json()
    assert staff.get("/api/tenants/privacy-api-gone/privacy").json()["deleted_at"] is not None


def test_an_unknown_tenant_is_404(staff, world):
    assert staff.get("/api/tenants/nobody/privacy").status_code == 404
    assert staff.patch("/api/tenants/nobody/privacy", {}, format="json").status_code == 404


def test_tenant_users_cannot_see_or_change_privacy(world):
    alice = APIClient()
    alice.force_login(world.alice)  # acme's admin, but not staff
    assert alice.get("/api/tenants/acme/privacy").status_code == 403
    patched = alice.patch("/api/tenants/acme/privacy", {"no_training": False}, format="json")
    assert patched.status_code == 403
    assert APIClient().get("/api/tenants/acme/privacy").status_code == 403
    assert Tenant.objects.get(slug="acme").no_training is True


def test_privacy_edited_in_the_admin_is_audited(world):
    tenant = tenant_create(slug="privacy-admin")
    operator = Client()
    operator.force_login(User.objects.create_superuser("root-privacy"))
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    form = {
        "slug": tenant.slug,
        "name": "Privacy Admin Ltd",
        "is_active": "on",
        "retention_days": 3,
        # no_training left out: an unticked box, so training is now permitted
        "quota-TOTAL_FORMS": 1,
        "quota-INITIAL_FORMS": 1,
        "quota-0-id": tenant.quota.pk,
        "quota-0-tenant": tenant.pk,
        "memberships-TOTAL_FORMS": 0,
        "memberships-INITIAL_FORMS": 0,
    }
    response = operator.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant.refresh_from_db()
    assert (tenant.name, tenant.retention_days, tenant.no_training) == (
        "Privacy Admin Ltd", 3, False,
    )  # fmt: skip
    event = AuditEvent.objects.filter(action="tenant.privacy_update").latest("id")
    assert event.target_id == "privacy-admin" and event.actor is not None
    assert event.actor.username == "root-privacy"
    assert event.data == {
        "retention_days": {"from": 0, "to": 3},
        "no_training": {"from": True, "to": False},
    }


def test_the_admin_does_not_delete_tenants(world):
    operator = Client()
    operator.force_login(User.objects.create_superuser("root-nodelete"))
    url = reverse("admin:tenants_tenant_delete", args=[world.globex.pk])
    assert operator.post(url, {"post": "yes"}).status_code == 403
    assert Tenant.objects.filter(slug="globex", deleted_at__isnull=True).exists()


def test_the_admin_shows_a_deleted_tenant_read_only(world):
    operator = Client()
    operator.force_login(User.objects.create_superuser("root-deleted"))
    tenant = tenant_create(slug="deleted-in-admin")
    tenant_delete(tenant=tenant)
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    page = operator.get(url)
    assert page.status_code == 200
    assert b'name="retention_days"' not in page.content  # shown, not editable
    refused = operator.post(url, {"slug": tenant.slug, "is_active": "on"})
    assert refused.status_code == 403
    tenant.refresh_from_db()
    assert not tenant.is_active
