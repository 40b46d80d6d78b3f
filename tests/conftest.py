"""The shared fixture world and the running platform the end-to-end tests talk to.

World: tenant acme (admin alice, member bob, finance fiona) and tenant globex (admin gina), the
tiny demo model registered as `tiny-llama` behind the alias `tiny-chat`, and one deployment.
It is committed once per session, because the frontend, worker and ingester processes of the
end-to-end tests read it from their own connections.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command

from models_registry.demo_model import demo_model_build
from models_registry.models import Deployment, ModelVersion
from models_registry.services import alias_set, deployment_create, model_version_register
from tenants.models import ApiKey, Scope, Tenant
from tenants.services import api_key_issue, api_key_revoke, membership_add, tenant_create

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENT = "tiny-chat"
ALIAS = "tiny-chat"
ACME_MAX_TOKENS = 200
ENCODER = "minilm"  # all-MiniLM-L6-v2, on its own encoder worker when a test asks for it
ENCODER_PRICE_PER_1K = Decimal("0.02")
CONTEXT = 2048


@dataclass(frozen=True)
class World:
    acme: Tenant
    globex: Tenant
    alice: User
    bob: User
    fiona: User
    gina: User
    acme_key: str
    globex_key: str
    revoked_key: str
    expired_key: str
    models_only_key: str
    limited_keys: dict[str, str]
    version: ModelVersion
    deployment: Deployment


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker: Any) -> None:
    """Migrate the session's own embedded database in place (it is new for every session)."""
    with django_db_blocker.unblock():
        call_command("migrate", verbosity=0)


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model_build(out_dir=tmp_path_factory.mktemp("models") / "tiny-llama")


def _world(model_dir: Path) -> World:
    acme = tenant_create(slug="acme", name="Acme")
    globex = tenant_create(slug="globex", name="Globex")
    alice = membership_add(tenant=acme, username="alice", role="admin", password="pw-alice").user
    bob = membership_add(tenant=acme, username="bob", role="member").user
    fiona = membership_add(tenant=acme, username="fiona", role="finance").user
    gina = membership_add(tenant=globex, username="gina", role="admin").user
    acme.quota.max_tokens_per_request = ACME_MAX_TOKENS
    acme.quota.save()
    revoked = api_key_issue(tenant=acme, name="revoked")
    api_key_revoke(key=revoked.key)
    expired = api_key_issue(tenant=acme, name="expired")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    ApiKey.objects.filter(pk=expired.key.pk).update(expires_at=past)
    version, _ = model_version_register(
        model_name="tiny-llama",
        source_dir=model_dir,
        price_input_per_1k=Decimal("0.5"),
        price_output_per_1k=Decimal("1.5"),
        tool_parser="hermes",
    )
    alias_set(name=ALIAS, version=version)
    deployment = deployment_create(
        name=DEPLOYMENT,
        version=version,
        max_num_seqs=32,
        max_model_len=CONTEXT,
        kv_cache_bytes=64 << 20,
        enforce_eager=True,
    )
    return World(
        acme=acme,
        globex=globex,
        alice=alice,
        bob=bob,
        fiona=fiona,
        gina=gina,
        acme_key=api_key_issue(tenant=acme, name="tests").token,
        globex_key=api_key_issue(tenant=globex, name="tests").token,
        revoked_key=revoked.token,
        expired_key=expired.token,
        models_only_key=api_key_issue(
            tenant=acme, name="models-only", scopes=[Scope.MODELS_READ]
        ).token,
        limited_keys=_limited_tenants(),
        version=version,
        deployment=deployment,
    )


LIMITED: dict[str, dict[str, Any]] = {
    "initech": {"requests_per_minute": 2},
    "hooli": {"max_concurrency": 1},
    "umbrella": {"monthly_budget": Decimal("0.00")},
    "pied-piper": {"requests_per_minute": 5},
    "wayne": {"requests_per_minute": 5},
    "soylent": {"requests_per_minute": 3},
    # Response cache: opted in at half price, opted in at full price, and a one-second cache.
    "cyberdyne": {"response_cache_seconds": 60, "response_cache_bill_percent": 50},
    "tyrell": {"response_cache_seconds": 60},
    "massive": {"response_cache_seconds": 1},
}


def _limited_tenants() -> dict[str, str]:
    """Create one tenant per tight limit (so each test owns its counters); return their keys."""
    keys = {}
    for slug, quota in LIMITED.items():
        tenant = tenant_create(slug=slug)
        for field, value in quota.items():
            setattr(tenant.quota, field, value)
        tenant.quota.save()
        keys[slug] = api_key_issue(tenant=tenant, name="tests").token
    return keys


@pytest.fixture(scope="session")
def world(django_db_setup: None, django_db_blocker: Any, demo_model_dir: Path) -> World:
    with django_db_blocker.unblock():
        return _world(demo_model_dir)


INGESTER_HOST = "127.0.0.6"


def own_deployment(name: str, model_name: str, price: Decimal, model_dir: Path) -> ModelVersion:
    """Register the demo model under a version of its own (another price makes another
    version, so it routes only to its own workers) and deploy it small, for a test's workers."""
    version, _ = model_version_register(
        model_name=model_name, source_dir=model_dir, price_input_per_1k=price
    )
    deployment_create(
        name=name,
        version=version,
        max_num_seqs=8,
        max_model_len=2048,
        kv_cache_bytes=32 << 20,
        enforce_eager=True,
    )
    return version


def roomy_key(slug: str, **quota: int) -> str:
    """A key of a tenant of its own with room for a test's load (and any quota given)."""
    tenant = tenant_create(slug=slug)
    tenant.quota.requests_per_minute = 100_000
    tenant.quota.tokens_per_minute = 10_000_000
    tenant.quota.max_concurrency = 100
    for field, value in quota.items():
        setattr(tenant.quota, field, value)
    tenant.quota.save()
    return api_key_issue(tenant=tenant, name="tests").token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    metrics_url: str = ""  # where it serves Prometheus metrics, if it does

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _spawn(
    name: str, args: list[str], logs: Path, env_extra: dict[str, str] | None = None
) -> Process:
    log = logs / f"{name}.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "PYTHONUNBUFFERED": "1",
        **(env_extra or {}),
    }
    popen = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Process(name=name, popen=popen, log=log)


def _wait_for(process: Process, ready: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            pytest.fail(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        if ready():
            return
        time.sleep(0.25)
    pytest.fail(f"{process.name} not ready after {timeout}s:\n{process.tail()}")


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Stack:
    """The platform running as real processes: frontend (uvicorn), worker (vLLM), ingester."""

    base_url: str
    worker: Process
    frontend: Process
    ingester: Process
    worker_metrics_url: str
    ingester_metrics_url: str


@pytest.fixture(scope="session")
def stack(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("logs")
    port, worker_metrics, ingester_metrics = _free_port(), _free_port(), _free_port()
    worker = _spawn(
        "worker",
        [
            "manage.py", "run_worker", "--deployment", DEPLOYMENT,
            "--metrics-port", str(worker_metrics),
        ],
        logs,
    )  # fmt: skip
    # The ingester on a host of its own (its metrics listen there only).
    ingester = _spawn(
        "ingester",
        ["manage.py", "run_ingester", "--metrics-port", str(ingester_metrics)],
        logs,
        {"ROUNDHOUSE_BIND_ADDRESS": INGESTER_HOST, "ROUNDHOUSE_HOST_NAME": "ingester-host"},
    )
    # The frontend runs as production does: metrics in multi-process files.
    multiproc = tmp_path_factory.mktemp("prometheus-multiproc")
    frontend = _spawn(
        "frontend",
        [
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
        ],
        logs,
        env_extra={"PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
    )
    processes = [worker, ingester, frontend]
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_for(frontend, lambda: _http_ok(f"{base_url}/healthz"), timeout=120)
        _wait_for(worker, lambda: "ready: serving" in worker.tail(400), timeout=600)
        yield Stack(
            base_url=base_url,
            worker=worker,
            frontend=frontend,
            ingester=ingester,
            worker_metrics_url=f"http://127.0.0.1:{worker_metrics}/metrics",
            ingester_metrics_url=f"http://{INGESTER_HOST}:{ingester_metrics}/metrics",
        )
    finally:
        for process in processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.popen.kill()


@pytest.fixture(scope="session")
def encoder(
    stack: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    """The packaged all-MiniLM-L6-v2, registered like any version, on its own encoder worker."""
    from models_registry.packaged import minilm_dir
    from models_registry.services import alias_set, deployment_create, model_version_register

    with django_db_blocker.unblock():
        version, _ = model_version_register(
            model_name="all-minilm-l6-v2",
            source_dir=minilm_dir(),
            task="embedding",
            price_input_per_1k=ENCODER_PRICE_PER_1K,
        )
        alias_set(name=ENCODER, version=version)
        deployment_create(name=ENCODER, version=version, dtype="auto", max_batch_size=32)
    logs = tmp_path_factory.mktemp("encoder-logs")
    port = _free_port()
    worker = _spawn(
        "encoder",
        ["manage.py", "run_worker", "--deployment", ENCODER, "--metrics-port", str(port)],
        logs,
    )
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    try:
        _wait_for(worker, lambda: "ready: serving" in worker.tail(200), timeout=300)
        yield worker
    finally:
        worker.popen.send_signal(signal.SIGTERM)
        try:
            worker.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.popen.kill()


@pytest.fixture
def artifact_root() -> Path:
    return Path(settings.ROUNDHOUSE_ARTIFACT_ROOT)


@pytest.fixture
def usage_of(django_db_blocker: Any) -> Any:
    """Return a function that waits for the usage records of request ids to be ingested."""
    from billing.models import UsageRecord

    def wait(*request_ids: str, timeout: float = 60.0) -> list[UsageRecord]:
        deadline = time.monotonic() + timeout
        with django_db_blocker.unblock():
            while True:
                records = list(UsageRecord.objects.filter(request_id__in=request_ids))
                if len(records) >= len(set(request_ids)) or time.monotonic() > deadline:
                    return records
                time.sleep(0.2)

    return wait


# The image's tests build a container image first (minutes from nothing): `make pytest-image`
# runs them on their own, after the suite.
collect_ignore = [] if os.environ.get("ROUNDHOUSE_TEST_IMAGE") else ["image"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked run_last after all others (after pytest-django's own ordering)."""
    items.sort(key=lambda item: item.get_closest_marker("run_last") is not None)
