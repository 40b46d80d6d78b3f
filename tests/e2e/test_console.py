"""The console in a real browser: Playwright driving Debian's Chromium against the running stack.

Each role's journey, as its user would click through it. Every main page is saved as a
screenshot under build/screenshots/ (not tracked); `make screenshots` runs these tests and copies
them into docs/img/screenshots/, where the manual shows them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pypdfium2
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import ALIAS, ROOT

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "build" / "screenshots"
PASSWORD = "console-pw-1"


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Iterator[None]:
    """Playwright's sync API keeps an event loop in the test's thread, which makes Django
    refuse ORM calls there; these tests only set up rows between browser steps."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is missing: `make test` installs it (make browser)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"],
        )  # fmt: skip
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def people(world: Any, django_db_blocker: Any) -> dict[str, str]:
    """Give the fixture world's users passwords, and add an operator."""
    from django.contrib.auth.models import User

    with django_db_blocker.unblock():
        for user in (world.alice, world.fiona, world.gina):
            user.set_password(PASSWORD)
            user.save()
        User.objects.create_user("olga", password=PASSWORD, is_staff=True)
    return {"alice": "alice", "fiona": "fiona", "gina": "gina", "olga": "olga"}


@pytest.fixture
def page(browser: Browser, stack: Any) -> Iterator[Page]:
    context = browser.new_context(base_url=stack.base_url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations say yes
    # Whatever a test clicks through, no script fails and the pages' policy refuses nothing.
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Security Policy" in m.text else None)
    page.on("pageerror", lambda error: refused.append(str(error)))
    yield page
    context.close()
    assert not refused, refused


def _sign_in(page: Page, username: str) -> None:
    page.goto("/console/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _api_status(stack: Any, token: str) -> int:
    return httpx.get(
        f"{stack.base_url}/v1/models", headers={"Authorization": f"Bearer {token}"}
    ).status_code


def test_an_admin_creates_a_key_sees_it_once_and_revokes_it(page, stack, people, world):
    page.goto("/console/login")
    _shot(page, "login")
    _sign_in(page, "alice")
    expect(page.locator("h1")).to_contain_text("this month")
    _shot(page, "overview")
    page.click("text=API keys")
    page.fill("input[name=name]", "console-key")
    page.click("text=Create key")
    token = page.locator("#secret").inner_text().strip()
    assert token.startswith("rh-")
    _shot(page, "keys")
    assert _api_status(stack, token) == 200
    page.reload()  # shown once: never again
    expect(page.locator("#secret")).to_have_count(0)
    assert token not in page.content()
    row = page.locator("tr", has_text="console-key")
    row.locator("button.danger").click()
    expect(page.locator(".msg.success")).to_contain_text("revoked")
    deadline = time.monotonic() + 10
    while _api_status(stack, token) != 401 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _api_status(stack, token) == 401
    page.click("text=Usage")
    expect(page.locator("h1")).to_contain_text("Usage")
    _shot(page, "usage")
    page.click("text=Requests")
    expect(page.locator("h1")).to_contain_text("Recent requests")
    _shot(page, "requests")


def test_an_admin_reads_and_deletes_a_stored_response(page, stack, people, world):
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    with httpx.Client(base_url=stack.base_url, timeout=60) as api:
        made = api.post(
            "/v1/responses",
            json={
                "model": ALIAS,
                "input": "Say hello to the console.",
                "instructions": "Be brief.",
                "max_output_tokens": 6,
                "temperature": 0,
                "metadata": {"ticket": "T-1"},
            },
            headers=auth,
        )
        assert made.status_code == 200, made.text
        body = made.json()
        _sign_in(page, "alice")
        page.click("header >> text=Responses")
        expect(page.locator("h1")).to_contain_text("Stored responses")
        row = page.locator("tr", has_text=body["id"][:17])
        expect(row).to_contain_text(body["status"])  # "incomplete": max_output_tokens
        _shot(page, "responses")
        row.locator("a").click()
        expect(page.locator("h1")).to_contain_text(body["id"])
        output = body["output"][0]["content"][0]["text"]
        assert page.locator("#output-1").text_content() == output
        expect(page.locator("main")).to_contain_text("Say hello to the console.")
        expect(page.locator("main")).to_contain_text("Be brief.")
        expect(page.locator("main")).to_contain_text("T-1")
        _shot(page, "response")
        page.click("text=Delete")
        expect(page.locator(".msg.success")).to_contain_text(f"{body['id']} deleted")
        assert api.get(f"/v1/responses/{body['id']}", headers=auth).status_code == 404


def test_an_admin_reads_and_deletes_a_conversation(page, stack, people, world):
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    with httpx.Client(base_url=stack.base_url, timeout=60) as api:
        made = api.post(
            "/v1/conversations",
            json={
                "items": [{"role": "user", "content": "Plan the <b>launch</b>."}],
                "metadata": {"project": "P-7"},
            },
            headers=auth,
        )
        assert made.status_code == 200, made.text
        conversation = made.json()["id"]
        answered = api.post(
            "/v1/responses",
            json={
                "model": ALIAS,
                "input": "And the date?",
                "conversation": conversation,
                "max_output_tokens": 6,
                "temperature": 0,
            },
            headers=auth,
        )
        assert answered.status_code == 200, answered.text
        _sign_in(page, "alice")
        page.click("header >> text=Conversations")
        expect(page.locator("h1")).to_contain_text("Conversations")
        row = page.locator("tr", has_text=conversation[:17])
        expect(row).to_contain_text("3")  # its item, the turn's input and its answer
        _shot(page, "conversations")
        row.locator("a").click()
        expect(page.locator("h1")).to_contain_text(conversation)
        # The text is shown as text, never as markup.
        assert page.locator("#item-1").text_content() == "Plan the <b>launch</b>."
        assert page.locator("#item-3").text_content() == answered.json()["output_text"]
        expect(page.locator("main")).to_contain_text("P-7")
        _shot(page, "conversation")
        page.click("text=Delete")
        expect(page.locator(".msg.success")).to_contain_text(f"{conversation} deleted")
        assert api.get(f"/v1/conversations/{conversation}", headers=auth).status_code == 404


def test_rotating_a_key_keeps_the_old_one_working_for_the_overlap(page, stack, people):
    _sign_in(page, "alice")
    page.goto("/console/t/acme/keys")
    page.fill("input[name=name]", "rotating-key")
    page.click("text=Create key")
    old = page.locator("#secret").inner_text().strip()
    row = page.locator("tr", has_text="rotating-key")
    row.locator("select[name=overlap_hours]").select_option("24")
    row.locator("text=Rotate").click()
    new = page.locator("#secret").inner_text().strip()
    assert new.startswith("rh-") and new != old
    expect(page.locator(".msg.success").first).to_contain_text("keeps working until")
    assert _api_status(stack, new) == 200
    assert _api_status(stack, old) == 200  # the overlap: both work until the old one expires


def test_another_tenants_admin_gets_404(page, people):
    _sign_in(page, "gina")
    for path in ("/console/t/acme/", "/console/t/acme/keys", "/console/t/acme/invoices",
                 "/console/t/acme/responses"):  # fmt: skip
        response = page.goto(path)
        assert response is not None and response.status == 404, path
    response = page.goto("/console/t/globex/")
    assert response is not None and response.status == 200


def test_finance_downloads_an_invoice_pdf(page, people, world, django_db_blocker, tmp_path):
    from billing.invoices import invoice_build, invoice_issue

    last_month = dt.date.today().replace(day=1) - dt.timedelta(days=1)
    with django_db_blocker.unblock():
        invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=last_month))
    _sign_in(page, "fiona")
    page.goto("/console/t/acme/invoices")
    _shot(page, "invoices")
    page.click(f"text={invoice.number}")
    _shot(page, "invoice")
    with page.expect_download() as download:
        page.click("#pdf")
    path = tmp_path / "invoice.pdf"
    download.value.save_as(path)
    text = pypdfium2.PdfDocument(path)[0].get_textpage().get_text_range()
    assert invoice.number in text and "Total due" in text and "acme" in text
    # Finance people see money, not keys.
    response = page.goto("/console/t/acme/keys")
    assert response is not None and response.status == 404


def test_an_operator_moves_a_split_promotes_and_rolls_back_with_a_reason(
    page, people, world, demo_model_dir, django_db_blocker, stack, usage_of
):
    from models_registry.models import Alias, Rollout
    from models_registry.services import alias_set, deployment_create, model_version_register
    from rollouts.services import rollout_start

    with django_db_blocker.unblock():
        v2, _ = model_version_register(
            model_name="tiny-llama",
            source_dir=demo_model_dir,
            label="console-v2",
            sampling_defaults={"temperature": 0.9},
        )
        deployment_create(name="tiny-console-v2", version=v2, kv_cache_bytes=32 << 20)
        alias = alias_set(name="console-chat", version=world.version)
        first = rollout_start(alias=alias, canary=v2, steps=[10, 50, 100])
    # A few real requests, so the last hour has something to chart.
    served = [
        httpx.post(
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {world.acme_key}"},
            json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 8},
            timeout=60,
        ).headers["x-request-id"]
        for _ in range(3)
    ]  # fmt: skip
    assert len(usage_of(*served)) == 3
    _sign_in(page, "olga")
    expect(page.locator("#deployments")).to_contain_text("tiny-chat")
    # The last hour, charted per deployment from the usage records: the charts are drawn.
    expect(page.locator("#hour")).to_contain_text("tiny-chat")
    for chart in ("hour-tokens", "hour-ttft", "hour-failed"):
        assert page.locator(f"#{chart}").evaluate("c => Chart.getChart(c) !== undefined")
    # The worker reports its engine's KV-cache use with every heartbeat.
    expect(page.locator("#deployments tr", has_text="tiny-chat").first).to_contain_text("%")
    _shot(page, "operations")
    page.goto("/console/ops/aliases/console-chat")
    page.locator("input[type=range]").fill("30")
    page.fill("#split-form input[name=reason]", "more canary traffic")
    page.click("#split-form button")
    expect(page.locator("#split-percent")).to_have_text("30.0%")
    _shot(page, "canary")
    page.fill("input[data-action=promote]", "canary healthy for a day")
    page.locator("input[data-action=promote] + button").click()
    expect(page.locator(".msg.success")).to_contain_text("promote done")
    with django_db_blocker.unblock():
        assert Rollout.objects.get(pk=first.pk).state == "promoted"
        assert Alias.objects.get(name="console-chat").version == v2
        second = rollout_start(alias=Alias.objects.get(name="console-chat"), canary=world.version)
    page.reload()
    page.fill("input[data-action=rollback]", "TTFT regression seen by acme")
    page.locator("input[data-action=rollback] + button").click()
    expect(page.locator(".msg.success")).to_contain_text("rollback done")
    with django_db_blocker.unblock():
        assert Rollout.objects.get(pk=second.pk).state == "rolled_back"
    page.goto("/console/ops/audit?action=rollout.rollback")
    expect(page.locator("table")).to_contain_text("TTFT regression seen by acme")
    _shot(page, "audit")
    page.goto("/console/ops/versions")
    expect(page.locator("main")).to_contain_text(world.version.digest)
    _shot(page, "versions")
    page.goto("/console/ops/tenants")
    expect(page.locator("table")).to_contain_text("acme")
    _shot(page, "tenants")


def test_sign_in_locks_out_after_repeated_failures(page, people):
    for _ in range(5):
        page.goto("/console/login")
        page.fill("input[name=username]", "gina")
        page.fill("input[name=password]", "wrong")
        page.click("button[type=submit]")
    _sign_in(page, "gina")  # the right password, too late
    expect(page.locator(".msg.error")).to_contain_text(re.compile("Too many failed sign-ins"))


def test_model_output_and_names_are_escaped(page, people, world, django_db_blocker):
    from tenants.services import api_key_issue

    with django_db_blocker.unblock():
        api_key_issue(tenant=world.acme, name="<script>window.pwned=1</script>")
    _sign_in(page, "alice")
    page.goto("/console/t/acme/keys")
    assert page.evaluate("window.pwned") is None
    expect(page.locator("table")).to_contain_text("<script>window.pwned=1</script>")


def test_the_console_scripts_run_under_its_content_security_policy(page, people, world):
    _sign_in(page, "alice")
    for path, chart in (("/console/t/acme/", "#spend"), ("/console/t/acme/usage", "#usage")):
        answer = page.goto(path)
        assert (
            answer is not None and "script-src 'self'" in answer.headers["content-security-policy"]
        )
        page.wait_for_load_state()
        assert page.evaluate(f"Chart.getChart(document.querySelector('{chart}')) !== undefined")
    assert page.evaluate("typeof htmx") == "object"
    page.goto("/console/t/acme/keys")
    page.fill("input[name=name]", "csp-key")
    page.click("text=Create key")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click("button[data-copy=secret]")
    expect(page.locator("button[data-copy=secret]")).to_have_text("Copied")
    dialogs: list[str] = []
    page.once("dialog", lambda dialog: dialogs.append(dialog.message))
    page.locator("tr", has_text="csp-key").locator("button.danger").click()
    expect(page.locator(".msg.success")).to_contain_text("revoked")
    assert dialogs == ["Revoke csp-key? Requests with it fail at once."]


def _small_model(tmp_path: Path, name: str, *, adapter: bool = False) -> Path:
    """A registrable directory of a few bytes (no worker serves it here)."""
    source = tmp_path / name
    source.mkdir()
    (source / "config.json").write_text('{"max_position_embeddings": 256}')
    (source / "weights.bin").write_text(name)
    if adapter:
        (source / "adapter_config.json").write_text('{"r": 8}')
    return source


def test_an_operator_limits_a_model_grants_it_and_revokes_it(
    page, people, world, django_db_blocker, tmp_path
):
    from models_registry.models import Model
    from models_registry.services import model_version_register
    from tenants.models import AuditEvent

    with django_db_blocker.unblock():
        model_version_register(
            model_name="console-shared", source_dir=_small_model(tmp_path, "console-shared")
        )
    _sign_in(page, "olga")
    page.click("text=Model access")
    row = page.locator("#model-console-shared")
    expect(row.locator(".who-may")).to_have_text("every tenant")
    row.locator("input[name=reason]").first.fill("a pilot for acme")
    row.locator("text=Limit to grants").click()
    expect(page.locator(".msg.success")).to_contain_text("open to its grants alone")
    row.locator("form.grant select").select_option("acme")
    row.locator("form.grant input[name=reason]").fill("acme signed the pilot")
    row.locator("form.grant button").click()
    expect(page.locator(".msg.success")).to_contain_text("acme may call console-shared")
    expect(row.locator(".who-may")).to_contain_text("granted: acme")
    _shot(page, "model-access")
    row.locator("text=Revoke acme").click()
    expect(page.locator(".msg.success")).to_contain_text("acme may no longer call")
    expect(row.locator(".who-may")).to_contain_text("granted: nobody")
    with django_db_blocker.unblock():
        assert Model.objects.get(name="console-shared").limited
        events = AuditEvent.objects.filter(target_type="model", target_id="console-shared")
        assert [(e.action, e.actor and e.actor.username) for e in events] == [
            ("model.limit", "olga"),
            ("model.grant", "olga"),
            ("model.revoke", "olga"),
        ]
    page.goto("/console/ops/audit?action=model.grant")
    expect(page.locator("table")).to_contain_text("acme signed the pilot")


def test_a_tenant_admin_sees_its_models_its_adapter_and_use_and_narrows_a_key(
    page, people, world, django_db_blocker, tmp_path, stack, usage_of
):
    from models_registry.services import model_version_register

    with django_db_blocker.unblock():
        model_version_register(
            model_name="acme-console-adapter",
            source_dir=_small_model(tmp_path, "acme-console-adapter", adapter=True),
            base=world.version,
            owner=world.acme,
        )
        model_version_register(
            model_name="globex-console-model",
            source_dir=_small_model(tmp_path, "globex-console-model"),
            owner=world.globex,
        )
    served = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {world.acme_key}"},
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    ).headers["x-request-id"]
    assert len(usage_of(served)) == 1
    _sign_in(page, "alice")
    page.click("header >> text=Models")
    table = page.locator("#models")
    mine = page.locator("#model-acme-console-adapter")
    expect(mine).to_contain_text("yours")
    expect(mine).to_contain_text(f"adapter on {world.version.public_name}")
    platform = page.locator("#model-tiny-llama")
    expect(platform).to_contain_text("platform")
    expect(platform).to_contain_text(ALIAS)
    requests = int(platform.locator("td.num").first.inner_text())
    assert requests >= 1  # this month's use of the model, the request above among it
    expect(table).not_to_contain_text("globex-console-model")
    _shot(page, "models")
    page.click("text=API keys")
    page.fill("input[name=name]", "chat-only")
    page.check(f"input[name=allowed_models][value={ALIAS}]")
    page.click("text=Create key")
    token = page.locator("#secret").inner_text().strip()
    expect(page.locator("tr", has_text="chat-only")).to_contain_text(ALIAS)
    listed = httpx.get(
        f"{stack.base_url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert [card["id"] for card in listed.json()["data"]] == [ALIAS]
