"""Finance exports say whether the tenant's data may be used for training."""

from __future__ import annotations

import csv
import io

import pypdfium2
import pytest

from billing.invoices import invoice_build, invoice_csv_rows, invoice_issue
from billing.pdf import invoice_pdf
from tenants.services import tenant_privacy_update
from tests.privacy.conftest import OCTOBER, usage_add

pytestmark = pytest.mark.django_db


def _usage_csv(staff) -> list[dict[str, str]]:
    params = {"tenant": "acme", "from": "2026-10-01", "to": "2026-11-01", "export": "csv"}
    response = staff.get("/api/finance/usage", params)
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_the_usage_export_has_a_training_use_column(staff, world):
    usage_add(world, tenant=world.acme)
    rows = _usage_csv(staff)
    assert rows and {row["training_use"] for row in rows} == {"not permitted"}
    assert rows[0]["day"] == "2026-10-03" and rows[0]["requests"] == "1"
    tenant_privacy_update(tenant=world.acme, no_training=False)
    assert {row["training_use"] for row in _usage_csv(staff)} == {"permitted"}


def test_the_invoice_csv_says_it_on_every_row(world):
    usage_add(world, tenant=world.globex)
    invoice = invoice_build(tenant=world.globex, month=OCTOBER)
    rows = list(invoice_csv_rows(invoice))
    assert rows[0][-1] == "training_use"
    assert {row[-1] for row in rows[1:]} == {"not permitted"}
    assert rows[-1][3] == "TOTAL" and rows[-1][7] == "2.00"


def test_the_invoice_pdf_says_it_in_its_header(world):
    usage_add(world, tenant=world.globex)
    tenant_privacy_update(tenant=world.globex, no_training=False)
    invoice = invoice_issue(invoice=invoice_build(tenant=world.globex, month=OCTOBER))
    text = pypdfium2.PdfDocument(invoice_pdf(invoice))[0].get_textpage().get_text_range()
    assert "Training use" in text and "permitted" in text and "not permitted" not in text
