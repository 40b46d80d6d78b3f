"""Cached prompt tokens are priced at their own price: usage records, invoices and exports."""

from __future__ import annotations

import csv
import datetime as dt
import importlib
import io
import uuid
from decimal import Decimal

import pypdfium2
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction
from rest_framework.test import APIClient

from billing.invoices import invoice_build, invoice_csv_rows, invoice_issue
from billing.models import PriceBook, UsageRecord
from billing.pdf import invoice_pdf
from billing.services import price_book_add, usage_ingest
from dataplane.types import Status, UsageEvent

pytestmark = pytest.mark.django_db
OCTOBER = dt.date(2026, 10, 1)
FIRST_OF_OCTOBER = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)


def _at(day: int, hour: int = 0) -> dt.datetime:
    return dt.datetime(2026, 10, day, hour, tzinfo=dt.UTC)


def _use(world, *, at: dt.datetime, prompt: int, cached: int, completion: int, **fields):
    """Ingest one request's usage event with cached prompt tokens, admitted and finished at `at`."""
    event = UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant_id=world.acme.pk,
        api_key_id=0,
        deployment="tiny-chat",
        model_version=world.version.digest,
        endpoint="chat.completions",
        status=Status.OK,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        enqueued_at=at.timestamp(),
        finished_at=at.timestamp(),
        **fields,
    )
    usage_ingest(events=[event])
    return UsageRecord.objects.get(request_id=event.request_id)


def _book(
    world,
    *,
    cached: str | None,
    at: dt.datetime = FIRST_OF_OCTOBER,
    discount: str = "0",
    inp: str = "0.0004",
    out: str = "0.0012",
):
    return price_book_add(
        version=world.version,
        input_per_1k=Decimal(inp),
        output_per_1k=Decimal(out),
        cached_input_per_1k=None if cached is None else Decimal(cached),
        batch_discount_pct=Decimal(discount),
        effective_from=at,
    )


def test_cached_tokens_cost_the_versions_input_price_without_a_price_book(world):
    # The version's own price: 0.5 in, 1.5 out per 1k, and no cached-input price.
    record = _use(world, at=_at(2), prompt=1000, cached=400, completion=1000)
    assert record.price_book is None
    assert record.cost == Decimal("2") and record.cached_cost == Decimal("0.2")


def test_cached_tokens_cost_the_input_price_when_the_book_sets_no_cached_price(world):
    _book(world, cached=None)
    record = _use(world, at=_at(2), prompt=1234, cached=777, completion=55)
    # (1234 x 0.0004 + 55 x 0.0012) / 1000, the cached tokens at the input price.
    assert record.cost == Decimal("0.0005596")
    assert record.cached_cost == Decimal("0.0003108")


def test_cached_tokens_pay_the_books_cached_input_price_exactly(world):
    _book(world, cached="0.0001")
    record = _use(world, at=_at(2), prompt=1234, cached=777, completion=55)
    # (457 x 0.0004 + 777 x 0.0001 + 55 x 0.0012) / 1000
    assert record.cost == Decimal("0.0003265")
    assert record.cached_cost == Decimal("0.0000777")
    assert record.price_book is not None


def test_batch_discount_and_response_cache_share_apply_to_cached_tokens_too(world):
    _book(world, cached="0.0001", discount="50")
    batch = _use(world, at=_at(2), prompt=1234, cached=777, completion=55, priority="batch")
    assert batch.cost == Decimal("0.00016325") and batch.cached_cost == Decimal("0.00003885")
    replayed = _use(
        world, at=_at(2), prompt=1000, cached=1000, completion=0, response_cache=True,
        bill_percent=10,
    )  # fmt: skip
    assert replayed.cost == replayed.cached_cost == Decimal("0.00001")


def test_a_price_book_without_cached_tokens_in_the_request_bills_as_before(world):
    _book(world, cached="0")
    record = _use(world, at=_at(2), prompt=1000, cached=0, completion=1000)
    assert record.cost == Decimal("0.0016") and record.cached_cost == Decimal(0)


def test_a_cached_price_must_lie_between_zero_and_the_input_price(world):
    with pytest.raises(ValidationError, match="between 0 and the input price"):
        _book(world, cached="0.0005")
    with pytest.raises(ValidationError, match="between 0 and the input price"):
        _book(world, cached="-0.0001")
    assert _book(world, cached="0.0004").cached_input_per_1k == Decimal("0.0004")
    # The database refuses one written past the service too.
    with pytest.raises(IntegrityError), transaction.atomic():
        PriceBook.objects.create(
            model_version=world.version,
            input_per_1k=Decimal("1"),
            output_per_1k=Decimal("1"),
            cached_input_per_1k=Decimal("2"),
            effective_from=_at(5),
        )


def test_the_price_book_api_takes_a_cached_input_price(world):
    staff = APIClient()
    staff.force_login(User.objects.create_user("cached-price-staff", is_staff=True))
    body = {
        "version": world.version.public_name,
        "input_per_1k": "0.0004",
        "output_per_1k": "0.0012",
        "cached_input_per_1k": "0.0001",
        "effective_from": "2026-10-01T00:00:00Z",
    }
    created = staff.post("/api/finance/price-books", body, format="json")
    assert created.status_code == 201, created.content
    assert PriceBook.objects.get(pk=created.json()["id"]).cached_input_per_1k == Decimal("0.0001")
    too_dear = {**body, "cached_input_per_1k": "0.001", "effective_from": "2026-10-02T00:00:00Z"}
    refused = staff.post("/api/finance/price-books", too_dear, format="json")
    assert refused.status_code == 400 and "cached_input_per_1k" in refused.json()
    plain = {**body, "effective_from": "2026-10-03T00:00:00Z"}
    del plain["cached_input_per_1k"]
    created = staff.post("/api/finance/price-books", plain, format="json")
    assert created.status_code == 201, created.content
    assert PriceBook.objects.get(pk=created.json()["id"]).cached_input_per_1k is None


def test_invoice_lines_show_cached_tokens_at_their_own_price(world):
    _book(world, inp="1", out="3", cached="0.1")
    # Each: (400 x 1 + 600 x 0.1 + 500 x 3) / 1000 = 1.96, of it 0.06 for the cached tokens.
    for day in (2, 3, 4):
        _use(world, at=_at(day), prompt=1000, cached=600, completion=500)
    invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    [line] = invoice.lines.all()
    assert (line.prompt_tokens, line.cached_tokens, line.completion_tokens) == (3000, 1800, 1500)
    assert line.cached_amount == Decimal("0.18") and line.amount == Decimal("5.88")
    assert invoice.total == Decimal("5.88")


def test_a_lines_cached_amount_and_the_rest_add_up_to_its_amount(world):
    _book(world, inp="1", out="1", cached="0.5")
    # Interactive: the rest (7 + 5) / 1000 = 0.012, cached 3 x 0.5 / 1000 = 0.0015.
    _use(world, at=_at(2), prompt=10, cached=3, completion=5)
    # Batch (no discount here): the rest 2 / 1000 = 0.002, cached 8 x 0.5 / 1000 = 0.004.
    _use(world, at=_at(2), prompt=10, cached=8, completion=0, priority="batch")
    invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    lines = {line.priority: line for line in invoice.lines.all()}
    # The parts sum to 0.0195 -> 0.02: the interactive rest keeps its cent, and the spare one
    # goes to the largest remainder, the batch line's cached part.
    assert (lines["interactive"].cached_amount, lines["interactive"].amount) == (
        Decimal("0.00"), Decimal("0.01"),
    )  # fmt: skip
    assert (lines["batch"].cached_amount, lines["batch"].amount) == (
        Decimal("0.01"), Decimal("0.01"),
    )  # fmt: skip
    assert invoice.total == Decimal("0.02")


def test_the_invoice_exports_carry_cached_tokens_and_their_amount(world):
    _book(world, inp="1", out="3", cached="0.1")
    _use(world, at=_at(2), prompt=1000, cached=600, completion=500)
    invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    rows = list(invoice_csv_rows(invoice))
    header, line, total = rows
    assert dict(zip(header, line, strict=True)) | {"invoice": ""} == {
        "invoice": "", "tenant": "acme", "period": "2026-10",
        "description": f"{world.version.public_name} (interactive)", "requests": "1",
        "prompt_tokens": "1000", "completion_tokens": "500", "amount": "1.96",
        "cached_tokens": "600", "cached_amount": "0.06", "currency": "USD",
        "training_use": world.acme.training_use,
    }  # fmt: skip
    assert total[3] == "TOTAL" and total[header.index("amount")] == "1.96"
    staff = APIClient()
    staff.force_login(User.objects.create_user("cached-export-staff", is_staff=True))
    detail = staff.get(f"/api/finance/invoices/{invoice.pk}").json()
    [json_line] = detail["lines"]
    assert json_line["cached_tokens"] == 600 and json_line["cached_amount"] == "0.06"
    downloaded = staff.get(f"/api/finance/invoices/{invoice.pk}/csv").content.decode()
    assert list(csv.reader(io.StringIO(downloaded))) == rows


def test_the_usage_export_carries_cached_tokens_and_their_cost(world):
    _book(world, cached="0.0001")
    _use(world, at=_at(2), prompt=1234, cached=777, completion=55, user="cache-user")
    _use(world, at=_at(3), prompt=1000, cached=0, completion=0, user="cache-user")
    staff = APIClient()
    staff.force_login(User.objects.create_user("cached-usage-staff", is_staff=True))
    params = {"tenant": "acme", "group_by": "user", "from": "2026-10-01", "to": "2026-11-01"}
    [row] = staff.get("/api/finance/usage", params).json()["rows"]
    assert row["cached_tokens"] == 777
    assert row["cost"] == "0.00072650" and row["cached_cost"] == "0.00007770"
    exported = staff.get("/api/finance/usage", {**params, "export": "csv"}).content.decode()
    [csv_row] = list(csv.DictReader(io.StringIO(exported)))
    assert csv_row["cached_tokens"] == "777" and csv_row["cached_cost"] == "0.00007770"


def test_the_pdf_shows_cached_tokens_and_their_amount(world):
    _book(world, inp="1", out="3", cached="0.1")
    _use(world, at=_at(2), prompt=12345, cached=6789, completion=500)
    invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    [line] = invoice.lines.all()
    text = pypdfium2.PdfDocument(invoice_pdf(invoice))[0].get_textpage().get_text_range()
    assert "Cached in" in text and "Cached amount" in text
    assert "12,345" in text and "6,789" in text
    assert f"{line.cached_amount:,.2f} USD" in text and f"{line.amount:,.2f} USD" in text


def test_an_issued_invoice_keeps_its_lines_when_a_cached_price_arrives(world):
    _use(world, at=_at(2), prompt=1000, cached=1000, completion=0)
    issued = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    _book(world, cached="0", at=_at(2, 12))
    _use(world, at=_at(3), prompt=1000, cached=1000, completion=0)  # free, and after issue
    again = invoice_build(tenant=world.acme, month=OCTOBER)
    assert again.pk == issued.pk
    [line] = again.lines.all()
    assert (line.cached_tokens, line.cached_amount, line.amount) == (
        1000, Decimal("0.50"), Decimal("0.50"),
    )  # fmt: skip


def test_the_migration_prices_earlier_records_cached_share_at_the_input_price(world):
    """Records written before cached tokens had a price get their cached share of the cost."""
    migration = importlib.import_module("billing.migrations.0009_cached_input_price")
    _book(world, cached=None, discount="50", at=_at(1))
    records = [
        _use(world, at=_at(2), prompt=1234, cached=777, completion=55),
        _use(world, at=_at(2), prompt=1234, cached=777, completion=55, priority="batch"),
        _use(world, at=dt.datetime(2026, 9, 2, tzinfo=dt.UTC), prompt=300, cached=100,
             completion=7),
    ]  # fmt: skip
    with connection.cursor() as cursor:
        # Check the records' foreign keys now: a table with pending checks cannot be altered.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "ALTER TABLE billing_usagerecord DISABLE TRIGGER billing_usagerecord_guard; "
            "UPDATE billing_usagerecord SET cached_cost = 0; "
            "ALTER TABLE billing_usagerecord ENABLE TRIGGER billing_usagerecord_guard;"
        )
        assert not UsageRecord.objects.filter(cached_cost__gt=0).exists()
        cursor.execute(migration.CACHED_COST_SQL)
    for record in records:
        assert UsageRecord.objects.get(pk=record.pk).cached_cost == record.cached_cost > 0
    # The records' guard is back in place.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        UsageRecord.objects.filter(pk=records[0].pk).update(cost=Decimal(0))
