from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from dataplane.keys import heartbeats_key
from dataplane.redis_client import redis_sync_client
from models_registry.models import Deployment, DeploymentState
from models_registry.services import deployment_create
from workers.services import deployments_reconcile

pytestmark = pytest.mark.django_db


def _deployment(world, name: str, state: str) -> Deployment:
    deployment = deployment_create(name=name, version=world.version)
    long_ago = timezone.now() - dt.timedelta(minutes=5)
    Deployment.objects.filter(pk=deployment.pk).update(state=state, updated_at=long_ago)
    return deployment


def test_a_ready_deployment_without_live_workers_becomes_stopped(world):
    deployment = _deployment(world, "silent", DeploymentState.READY)
    deployments_reconcile()
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.STOPPED


def test_a_stopped_deployment_with_a_live_worker_becomes_ready(world):
    deployment = _deployment(world, "revived", DeploymentState.STOPPED)
    redis_sync_client().zadd(heartbeats_key("revived"), {"w1": time.time() + 30})
    deployments_reconcile()
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY


def test_a_stopped_deployment_still_routes_so_clients_get_503_not_404(world):
    from billing.services import price_current
    from models_registry.selectors import route_resolve

    Deployment.objects.filter(name="tiny-chat").update(state=DeploymentState.STOPPED)
    route = route_resolve(name="tiny-chat", price_of=price_current)
    assert route is not None and route.deployment == "tiny-chat"
