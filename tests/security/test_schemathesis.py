"""Schemathesis against the running platform with its own OpenAPI documents: /v1 and /api.

Every operation gets generated requests, valid and invalid. Each answer must be no 5xx and
must match the document: a documented status, content type, headers and body. An operation
that needs credentials must refuse a request without them, and one with wrong ones.

Generation hits the real engine, so the fuzzing tenant may generate a few tokens a request.
Most requests name objects made here (the tenant's file, batch and request; the operator's
tenant, alias and invoice), so successful answers are checked too; nothing else in the
session's world is ever named, so nothing else changes.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import zlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from billing.invoices import invoice_build
from inference.openapi.document import openapi_document
from models_registry.services import alias_set
from tenants.services import api_key_issue, tenant_create
from tests.conftest import ALIAS, ENCODER

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
    unsupported_method,
    allow_header_conformance,
]
FUZZ = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
MAX_TOKENS = 8  # the fuzzing tenant's cap: every generation is short
OPERATOR = ("schemathesis-ops", "schemathesis-pw")
TENANT = "wonka"  # the operator's tenant, alias and invoice: what the management fuzzing changes
TENANT_ALIAS = "wonka-chat"
NO_ROLLOUT = 2_000_000_000  # acting on a real rollout moves live traffic: only a 404 here


def _patient(document: dict[str, Any]) -> dict[str, Any]:
    """Return the document with client deadlines of a minute or more.

    A client that gives itself less time than a generation takes gets 503 deadline_exceeded
    by design (tests/e2e cover it); here every other answer is under test.
    """
    document = copy.deepcopy(document)
    for name in ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest"):
        document["components"]["schemas"][name]["properties"]["timeout"]["minimum"] = 60
    for item in document["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "x-request-timeout":
                    parameter["schema"] = {"type": "number", "minimum": 60}
    return document


def _management_document() -> dict[str, Any]:
    generated = SchemaGenerator().get_schema(request=None, public=True)
    document: dict[str, Any] = json.loads(OpenApiJsonRenderer().render(generated))
    return document


# Credentials are the test's to send (a generated session cookie would muddle the auth check).
OWN_CREDENTIALS = {"generation": {"with-security-parameters": False}}
v1 = schemathesis.openapi.from_dict(
    _patient(openapi_document()), config=schemathesis.Config.from_dict(OWN_CREDENTIALS)
)
# What the management fuzzing may change is the operator's own: their tenant and alias here,
# their invoice in the test. Rollout actions name no rollout at all.
OPERATOR_OWN = [
    ("/api/rollouts/{id}/{action}", {"path.id": NO_ROLLOUT}),
    ("/api/rollouts", {"body.alias": TENANT_ALIAS}),
    ("/api/finance/invoices/build", {"body.tenant": TENANT}),
    ("/api/finance/adjustments", {"body.tenant": TENANT}),
]
api = schemathesis.openapi.from_dict(
    _management_document(),
    config=schemathesis.Config.from_dict(
        {
            **OWN_CREDENTIALS,
            "parameters": {"path.slug": TENANT, "path.name": TENANT_ALIAS},
            "operations": [
                {"include-path": path, "parameters": parameters}
                for path, parameters in OPERATOR_OWN
            ],
        }
    ),
)


# --- /v1 ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fuzzed:
    """The /v1 objects of the fuzzing tenant, by the name its requests give them."""

    key: str
    own: dict[str, str]  # path parameter or body field -> one of the tenant's objects


def _tenant_key(slug: str) -> str:
    tenant = tenant_create(slug=slug)
    quota = tenant.quota
    quota.max_tokens_per_request = MAX_TOKENS
    quota.requests_per_minute = 100_000
    quota.tokens_per_minute = 10_000_000
    quota.save()
    return api_key_issue(tenant=tenant, name="schemathesis").token


@pytest.fixture(scope="module")
def fuzzed(stack: Any, encoder: Any, django_db_blocker: Any) -> Fuzzed:
    with django_db_blocker.unblock():
        key = _tenant_key("vandelay")
    chat = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": chat}
    with httpx.Client(base_url=stack.base_url, headers=_bearer(key), timeout=60) as client:
        uploaded = client.post(
            "/v1/files",
            files={"file": ("in.jsonl", json.dumps(line).encode())},
            data={"purpose": "batch"},
        )
        file_id = uploaded.json()["id"]
        batch = client.post(
            "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        )
        answered = client.post("/v1/chat/completions", json={**chat, "stream": True})
        responded = client.post(
            "/v1/responses", json={"model": ALIAS, "input": "hi", "background": True}
        )
    assert uploaded.status_code == batch.status_code == answered.status_code == 200
    assert responded.status_code == 200, responded.text
    own = {
        "file_id": file_id,
        "input_file_id": file_id,
        "batch_id": batch.json()["id"],
        "after": batch.json()["id"],
        "request_id": answered.headers["x-request-id"],
        "response_id": responded.json()["id"],
        "previous_response_id": responded.json()["id"],
    }
    return Fuzzed(key=key, own=own)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _aim(case: Case, own: dict[str, Any]) -> None:
    """Point most of a case's references at objects that exist; the rest stay as generated.

    Which ones is decided by the case itself, so a run repeats exactly.
    """
    generated = repr((case.path_parameters, case.query, case.headers, case.body))
    for container in (case.path_parameters, case.query, case.headers, case.body):
        if not isinstance(container, MutableMapping):
            continue
        for name, value in own.items():
            if name in container and zlib.crc32(f"{name}{generated}".encode()) % 10 < 7:
                container[name] = value


@v1.parametrize()
@FUZZ
def test_v1_answers_every_request_as_its_schema_says(
    case: Case, stack: Any, fuzzed: Fuzzed
) -> None:
    model = ENCODER if case.operation.path == "/v1/embeddings" else ALIAS
    # Generated keys repeat across different bodies (a 422); most requests get their body's own.
    key = hashlib.sha256(repr(case.body).encode()).hexdigest()
    _aim(case, {**fuzzed.own, "model": model, "name": ALIAS, "Idempotency-Key": key})
    case.call_and_validate(base_url=stack.base_url, headers=_bearer(fuzzed.key), checks=CHECKS)


def test_the_v1_schema_is_served_without_a_key(stack: Any) -> None:
    response = httpx.get(f"{stack.base_url}/v1/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.json() == openapi_document()


# --- the management API ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def invoice_id(world: Any, django_db_blocker: Any) -> int:
    """Return the operator's invoice; make the operator, their tenant and alias too."""
    with django_db_blocker.unblock():
        User.objects.create_user(OPERATOR[0], password=OPERATOR[1], is_staff=True)
        tenant = tenant_create(slug=TENANT)
        alias_set(name=TENANT_ALIAS, version=world.version)
        return invoice_build(tenant=tenant, month=dt.date(2001, 2, 1)).pk


def _basic(username: str, password: str) -> dict[str, str]:
    return {
        "Authorization": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    }


@api.parametrize()
@FUZZ
def test_the_management_api_answers_every_request_as_its_schema_says(
    case: Case, stack: Any, invoice_id: int
) -> None:
    if case.operation.path.startswith("/api/finance/invoices/{id}"):
        case.path_parameters = {**(case.path_parameters or {}), "id": invoice_id}
    case.call_and_validate(base_url=stack.base_url, headers=_basic(*OPERATOR), checks=CHECKS)


def test_the_management_schema_is_served_without_signing_in(stack: Any) -> None:
    response = httpx.get(f"{stack.base_url}/api/schema?format=json", timeout=30)
    assert response.status_code == 200
    assert response.json() == _management_document()


@pytest.fixture
def client(stack: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        yield client


def test_every_management_operation_refuses_callers_who_are_not_staff(
    client: httpx.Client, invoice_id: int, world: Any
) -> None:
    alice = ("alice", "pw-alice")  # acme's admin: she may read acme's finance, nothing else
    for result in api.get_all_operations():
        assert isinstance(result, Ok)
        operation = result.ok()
        action = next((p for p in operation.path_parameters if p.name == "action"), None)
        path = operation.path.format(
            slug="acme",
            name=ALIAS,
            id=invoice_id,
            ref=world.version.public_name,
            public_id="rh-missing",
            action=action.definition["schema"]["enum"][0] if action else "",
        )
        for auth in (None, (OPERATOR[0], "wrong"), alice):
            response = client.request(operation.method.upper(), path, auth=auth)
            if auth == alice and operation.method == "get" and "/finance/" in path:
                continue
            assert response.status_code == 403, (operation.label, auth, response.text)
