"""Price books, invoices and exports over real usage records in PostgreSQL."""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid
from decimal import Decimal

import pypdfium2
import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from billing.invoices import (
    adjustment_add,
    cents_allocate,
    invoice_build,
    invoice_issue,
    invoice_mark_paid,
    invoice_void,
)
from billing.models import Invoice, InvoiceState, IssuedInvoiceError, UsageRecord
from billing.pdf import invoice_pdf
from billing.services import price_book_add, usage_ingest
from dataplane.types import Status, UsageEvent
from tenants.models import AppendOnlyError
from tenants.services import tenant_create

pytestmark = pytest.mark.django_db
UTC = dt.UTC
OCTOBER = dt.date(2026, 10, 1)


def _at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0):
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def _use(world, *, at: dt.datetime, tenant=None, prompt=1000, completion=1000, **fields):
    """Ingest one request's usage event, admitted and finished at `at`."""
    tenant = tenant or world.acme
    event = UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant_id=tenant.pk,
        api_key_id=0,
        deployment="tiny-chat",
        model_version=world.version.digest,
        endpoint="chat.completions",
        status=Status.OK,
        prompt_tokens=prompt,
        completion_tokens=completion,
        enqueued_at=at.timestamp(),
        finished_at=at.timestamp(),
        **fields,
    )
    usage_ingest(events=[event])
    return UsageRecord.objects.get(request_id=event.request_id)


def test_a_price_change_mid_month_bills_each_request_at_its_own_price(world):
    before = _use(world, at=_at(2026, 10, 10))  # the version's price: 0.5 in, 1.5 out per 1k
    price_book_add(
        version=world.version,
        input_per_1k=Decimal("1"),
        output_per_1k=Decimal("3"),
        effective_from=_at(2026, 10, 15),
    )
    after = _use(world, at=_at(2026, 10, 20))
    assert before.cost == Decimal("2") and before.price_book is None
    assert after.cost == Decimal("4") and after.price_book is not None
    # A late event of a request admitted before the change still pays the old price.
    late = _use(world, at=_at(2026, 10, 14, 23, 59))
    assert late.cost == Decimal("2")
    invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    assert invoice.total == Decimal("8.00")


def test_batch_requests_get_the_price_books_discount(world):
    price_book_add(
        version=world.version,
        input_per_1k=Decimal("1"),
        output_per_1k=Decimal("1"),
        batch_discount_pct=Decimal("50"),
        effective_from=_at(2026, 10, 1),
    )
    assert _use(world, at=_at(2026, 10, 2), priority="batch").cost == Decimal("1")
    assert _use(world, at=_at(2026, 10, 2)).cost == Decimal("2")
    lines = {line.priority: line.amount for line in invoice_build(
        tenant=world.acme, month=OCTOBER).lines.all()}  # fmt: skip
    assert lines == {"batch": Decimal("1.00"), "interactive": Decimal("2.00")}


def test_price_books_never_change(world):
    book = price_book_add(
        version=world.version,
        input_per_1k=Decimal("1"),
        output_per_1k=Decimal("1"),
        effective_from=_at(2026, 10, 1),
    )
    book.note = "edited"
    with pytest.raises(AppendOnlyError):
        book.save()
    with pytest.raises(DatabaseError, match="price books never change"), transaction.atomic():
        type(book).objects.filter(pk=book.pk).update(note="edited")


def test_months_are_utc_calendar_months(world):
    _use(world, at=_at(2026, 10, 31, 23, 59, 59))
    _use(world, at=_at(2026, 11, 1, 0, 0, 0), prompt=0, completion=2000)
    october = invoice_build(tenant=world.acme, month=OCTOBER)
    assert october.period_start == OCTOBER and october.period_end == dt.date(2026, 11, 1)
    assert october.total == Decimal("2.00")


def test_a_tenant_without_usage_gets_a_zero_invoice(world):
    quiet = tenant_create(slug="quiet")
    invoice = invoice_build(tenant=quiet, month=OCTOBER)
    assert invoice.total == Decimal("0.00") and not invoice.lines.exists()


def test_a_month_that_has_not_ended_cannot_be_invoiced(world):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="has not ended"):
        invoice_build(tenant=world.acme, month=dt.date.today())


def test_shadow_copies_are_not_invoiced(world):
    _use(world, at=_at(2026, 10, 3))
    _use(world, at=_at(2026, 10, 3), shadow=True)
    assert invoice_build(tenant=world.acme, month=OCTOBER).total == Decimal("2.00")


def test_rebuilding_a_draft_replaces_it_and_issuing_freezes_it(world):
    _use(world, at=_at(2026, 10, 3))
    draft = invoice_build(tenant=world.acme, month=OCTOBER)
    _use(world, at=_at(2026, 10, 4))
    rebuilt = invoice_build(tenant=world.acme, month=OCTOBER)
    assert rebuilt.pk == draft.pk and rebuilt.total == Decimal("4.00")
    issued = invoice_issue(invoice=rebuilt)
    assert issued.number and issued.number.startswith("SY-202610-")
    _use(world, at=_at(2026, 10, 5))  # late usage after issue: the issued invoice stays
    assert invoice_build(tenant=world.acme, month=OCTOBER).total == Decimal("4.00")


def test_an_issued_invoice_cannot_be_edited_through_the_orm_or_the_database(world):
    _use(world, at=_at(2026, 10, 3))
    invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    invoice.total = Decimal("1.00")
    with pytest.raises(IssuedInvoiceError):
        invoice.save()
    line = invoice.lines.first()
    assert line is not None
    with pytest.raises(IssuedInvoiceError):
        line.save()
    with pytest.raises(DatabaseError, match="cannot be changed"), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(total=Decimal("1.00"))
    with pytest.raises(DatabaseError, match="cannot change"), transaction.atomic():
        invoice.lines.update(amount=Decimal("0"))
    with pytest.raises(DatabaseError, match="cannot be deleted"), transaction.atomic():  # noqa: SIM117
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM billing_invoice WHERE id = %s", [invoice.pk])
    # Settling it is the one change an issued invoice takes.
    paid = invoice_mark_paid(invoice=invoice)
    assert paid.state == InvoiceState.PAID and paid.total == Decimal("2.00")


def test_adjustments_land_on_the_next_invoice_and_a_void_releases_them(world):
    _use(world, at=_at(2026, 10, 3))
    adjustment_add(tenant=world.acme, amount=Decimal("-0.50"), reason="outage credit")
    invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    assert invoice.adjustments_total == Decimal("-0.50") and invoice.total == Decimal("1.50")
    assert "Adjustment: outage credit" in [line.description for line in invoice.lines.all()]
    invoice_void(invoice=invoice_issue(invoice=invoice), reason="wrong address")
    again = invoice_build(tenant=world.acme, month=OCTOBER)
    assert again.pk != invoice.pk and again.total == Decimal("1.50")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.decimals(min_value=0, max_value=1000, places=8), min_size=1, max_size=12))
def test_line_amounts_add_up_to_the_exact_total_to_the_cent(amounts):
    lines = cents_allocate(amounts)
    exact = sum(amounts, Decimal(0))
    assert sum(lines, Decimal(0)) == exact.quantize(Decimal("0.01"), rounding="ROUND_HALF_UP")
    assert all(
        abs(line - amount) < Decimal("0.01") for line, amount in zip(lines, amounts, strict=True)
    )


def test_the_pdf_shows_the_tenant_period_lines_and_total(world, tmp_path):
    for day in range(1, 4):
        _use(world, at=_at(2026, 10, day), prompt=1234, completion=567)
    invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    pdf = pypdfium2.PdfDocument(invoice_pdf(invoice))
    assert len(pdf) == 1
    page = pdf[0]
    image = page.render(scale=2).to_pil()
    image.save(tmp_path / "invoice.png")
    assert image.width > 1000  # a real page was drawn
    text = page.get_textpage().get_text_range()
    assert invoice.number in text and "acme" in text
    assert "2026-10-01 to 2026-11-01" in text
    assert f"{invoice.total:,.2f} USD" in text and "Total due" in text
    assert "tiny-llama@" in text and "3,702" in text  # 3 x 1,234 prompt tokens


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("fran", is_staff=True))
    return client


def test_finance_users_see_their_own_tenants_invoices_only(world):
    _use(world, at=_at(2026, 10, 3))
    _use(world, at=_at(2026, 10, 3), tenant=world.globex)
    acme_invoice = invoice_build(tenant=world.acme, month=OCTOBER)
    globex_invoice = invoice_build(tenant=world.globex, month=OCTOBER)
    fiona = APIClient()
    fiona.force_login(world.fiona)  # acme's finance member
    listed = fiona.get("/api/finance/invoices").json()
    assert [i["id"] for i in listed] == [acme_invoice.pk]
    assert fiona.get(f"/api/finance/invoices/{globex_invoice.pk}").status_code == 404
    assert fiona.get(f"/api/finance/invoices/{globex_invoice.pk}/pdf").status_code == 404
    assert fiona.post(f"/api/finance/invoices/{acme_invoice.pk}/issue").status_code == 403
    bob = APIClient()
    bob.force_login(world.bob)  # a plain member sees no money
    assert bob.get("/api/finance/invoices").json() == []
    assert bob.get(f"/api/finance/invoices/{acme_invoice.pk}").status_code == 404


def test_staff_build_issue_and_export_through_the_api(staff, world):
    _use(world, at=_at(2026, 10, 3), user="alice-laptop")
    built = staff.post("/api/finance/invoices/build", {"tenant": "acme", "month": "2026-10"})
    assert built.status_code == 201, built.content
    pk = built.json()["id"]
    issued = staff.post(f"/api/finance/invoices/{pk}/issue")
    assert issued.status_code == 200 and issued.json()["state"] == "issued"
    assert staff.post(f"/api/finance/invoices/{pk}/issue").status_code == 400
    rows = list(
        csv.reader(io.StringIO(staff.get(f"/api/finance/invoices/{pk}/csv").content.decode()))
    )
    assert rows[0][:4] == ["invoice", "tenant", "period", "description"]
    assert rows[-1][3] == "TOTAL" and rows[-1][7] == "2.00"
    pdf = staff.get(f"/api/finance/invoices/{pk}/pdf")
    assert pdf["Content-Type"] == "application/pdf" and pdf.content.startswith(b"%PDF")


def test_usage_aggregates_by_user_and_day_with_a_csv_export(staff, world):
    _use(world, at=_at(2026, 10, 3), user="u1")
    _use(world, at=_at(2026, 10, 3), user="u2")
    _use(world, at=_at(2026, 10, 4), user="u1")
    params = {"tenant": "acme", "from": "2026-10-01", "to": "2026-11-01"}
    by_user = staff.get("/api/finance/usage", {**params, "group_by": "user"}).json()["rows"]
    assert [(r["user"], r["requests"], r["cost"]) for r in by_user] == [
        ("u1", 2, "4.00000000"), ("u2", 1, "2.00000000"),
    ]  # fmt: skip
    by_day = staff.get("/api/finance/usage", {**params, "group_by": "day", "export": "csv"})
    lines = by_day.content.decode().splitlines()
    assert lines[0].startswith("day,requests") and lines[1].startswith("2026-10-03,2,")
    assert staff.get("/api/finance/usage", {"group_by": "day"}).status_code == 400  # no tenant
    assert staff.get("/api/finance/usage", {**params, "group_by": "x"}).status_code == 400


def test_the_admin_shows_an_issued_invoice_and_refuses_to_change_it(world, client):
    _use(world, at=_at(2026, 10, 3))
    invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    page = client.get(f"/admin/billing/invoice/{invoice.pk}/change/")
    assert page.status_code == 200 and invoice.number in page.content.decode()
    posted = client.post(f"/admin/billing/invoice/{invoice.pk}/change/", {"total": "1.00"})
    assert posted.status_code == 403
    deleted = client.post(f"/admin/billing/invoice/{invoice.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    assert Invoice.objects.get(pk=invoice.pk).total == Decimal("2.00")


def test_usage_records_cannot_be_changed_or_deleted(world):
    record = _use(world, at=_at(2026, 10, 3))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        UsageRecord.objects.filter(pk=record.pk).update(cost=Decimal("0"))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        UsageRecord.objects.filter(pk=record.pk).delete()


def test_the_api_has_no_way_to_edit_an_invoice(staff, world):
    _use(world, at=_at(2026, 10, 3))
    invoice = invoice_issue(invoice=invoice_build(tenant=world.acme, month=OCTOBER))
    url = f"/api/finance/invoices/{invoice.pk}"
    for method in (staff.put, staff.patch, staff.delete):
        assert method(url, {"total": "0.00"}, format="json").status_code == 405
    assert Invoice.objects.get(pk=invoice.pk).total == Decimal("2.00")
