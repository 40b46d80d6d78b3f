"""Budget alerts: tell a tenant's admins and finance people as its month spend climbs.

Each threshold (50, 80 and 100 % of the monthly budget) is sent once per tenant and month,
by email through Django's email backend, and stays as the tenant's banner for the month. The
hard cap itself is enforced at admission (`budget_exceeded`), not here.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import ROUND_HALF_UP

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.invoices import CENT
from billing.models import BudgetAlert
from billing.selectors import month_start, tenant_month_spend
from tenants.models import Membership, Role, Tenant

log = logging.getLogger(__name__)
THRESHOLDS = (50, 80, 100)


def _recipients(tenant: Tenant) -> list[str]:
    members = Membership.objects.filter(tenant=tenant, role__in=[Role.ADMIN, Role.FINANCE])
    return sorted({m.user.email for m in members.select_related("user") if m.user.email})


def budget_alerts_check(*, now: dt.datetime | None = None) -> list[BudgetAlert]:
    """Send the alerts every tenant has newly crossed this month; return them."""
    now = now or timezone.now()
    month = month_start(now).date()
    sent = []
    tenants = Tenant.objects.filter(is_active=True, quota__monthly_budget__gt=0)
    for tenant in tenants.select_related("quota"):
        budget = tenant.quota.monthly_budget
        spent = tenant_month_spend(tenant_id=tenant.pk, now=now)
        done = set(
            BudgetAlert.objects.filter(tenant=tenant, month=month).values_list(
                "threshold", flat=True
            )
        )
        crossed = [t for t in THRESHOLDS if t not in done and spent * 100 >= budget * t]
        if not crossed:
            continue
        # One email for the highest threshold crossed since the last check.
        recipients = _recipients(tenant)
        alerts = []
        try:
            with transaction.atomic():
                for threshold in crossed:
                    alerts.append(
                        BudgetAlert.objects.create(
                            tenant=tenant,
                            month=month,
                            threshold=threshold,
                            spent=spent.quantize(CENT, rounding=ROUND_HALF_UP),
                            budget=budget,
                            recipients=recipients,
                        )
                    )
        except IntegrityError:
            continue  # another checker sent it first
        top = alerts[-1]
        if recipients:
            send_mail(
                subject=f"[Roundhouse] {tenant.slug}: {top.threshold}% of the monthly budget",
                message=top.message,
                from_email=settings.DEFAULT_FROM_EMAIL,
                recipient_list=recipients,
                fail_silently=False,
            )
        log.info("budget alert for %s: %s%%", tenant.slug, top.threshold)
        sent.extend(alerts)
    return sent


def budget_banner(*, tenant: Tenant, now: dt.datetime | None = None) -> BudgetAlert | None:
    """Return this month's highest budget alert of a tenant, for the console's banner."""
    month = month_start(now).date()
    return BudgetAlert.objects.filter(tenant=tenant, month=month).order_by("-threshold").first()
