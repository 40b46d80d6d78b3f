"""Render an invoice as a one-document PDF a person would send (fpdf2, core fonts only)."""

from __future__ import annotations

from decimal import Decimal

from fpdf import FPDF

from billing.models import Invoice

# "Tokens in" counts the cached ones too; "Cached amount" is the part of "Amount" they cost.
_COLUMNS = (("Description", 56), ("Requests", 16), ("Tokens in", 20), ("Cached in", 20),
            ("Tokens out", 20), ("Cached amount", 25), ("Amount", 23))  # fmt: skip


def _money(amount: Decimal, currency: str) -> str:
    return f"{amount:,.2f} {currency}"


def _latin1(text: str) -> str:
    # The PDF core fonts cover Latin-1; anything else is shown as "?" rather than failing.
    return text.encode("latin-1", "replace").decode("latin-1")


def invoice_pdf(invoice: Invoice) -> bytes:
    """Return the invoice as PDF bytes: issuer, tenant, period, lines and totals."""
    pdf = FPDF(format="A4")
    pdf.set_title(f"Invoice {invoice.number or 'draft'}")
    pdf.set_author("Roundhouse")
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 18)
    pdf.cell(0, 10, "Roundhouse", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", "", 11)
    heading = "INVOICE" if invoice.state != "draft" else "DRAFT INVOICE (not issued)"
    pdf.cell(0, 8, heading, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)
    facts = [
        ("Invoice number", invoice.number or "-"),
        ("Billed to", f"{invoice.tenant.name or invoice.tenant.slug} ({invoice.tenant.slug})"),
        ("Period", f"{invoice.period_start:%Y-%m-%d} to {invoice.period_end:%Y-%m-%d} (UTC, "
                   "end exclusive)"),
        ("Issued", f"{invoice.issued_at:%Y-%m-%d}" if invoice.issued_at else "-"),
        ("Status", invoice.state),
        ("Training use", invoice.tenant.training_use),
    ]  # fmt: skip
    for label, value in facts:
        pdf.set_font("Helvetica", "B", 10)
        pdf.cell(40, 6, label)
        pdf.set_font("Helvetica", "", 10)
        pdf.cell(0, 6, _latin1(value), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)
    pdf.set_font("Helvetica", "B", 8)
    pdf.set_fill_color(230, 230, 230)
    for title, width in _COLUMNS:
        pdf.cell(width, 7, title, border=1, fill=True, align="L" if width > 30 else "R")
    pdf.ln()
    pdf.set_font("Helvetica", "", 8)
    lines = list(invoice.lines.all())
    if not lines:
        pdf.cell(sum(w for _, w in _COLUMNS), 6, "No usage in this period.", border=1)
        pdf.ln()
    for line in lines:
        values = (
            _latin1(line.description)[:44],
            f"{line.requests:,}",
            f"{line.prompt_tokens:,}",
            f"{line.cached_tokens:,}",
            f"{line.completion_tokens:,}",
            _money(line.cached_amount, invoice.currency),
            _money(line.amount, invoice.currency),
        )
        for (_, width), value in zip(_COLUMNS, values, strict=True):
            pdf.cell(width, 6, value, border=1, align="L" if width > 30 else "R")
        pdf.ln()
    pdf.ln(3)
    totals = [
        ("Usage", invoice.usage_total),
        ("Adjustments", invoice.adjustments_total),
        ("Total due", invoice.total),
    ]
    for label, amount in totals:
        pdf.set_font("Helvetica", "B" if label == "Total due" else "", 10)
        pdf.cell(152, 7, label, align="R")
        pdf.cell(28, 7, _money(amount, invoice.currency), align="R", new_x="LMARGIN", new_y="NEXT")
    pdf.ln(6)
    pdf.set_font("Helvetica", "", 8)
    pdf.multi_cell(
        0,
        4,
        "Each request is priced once, at the price book in force when it was admitted. "
        "Tokens in include the cached input tokens (prompt tokens served from the prefix cache); "
        "those are priced at the cached-input price, which is the input price unless a lower "
        "one is set, and Cached amount is the part of Amount they cost. "
        "Corrections to an issued invoice appear as adjustments on a later one.",
    )
    return bytes(pdf.output())
