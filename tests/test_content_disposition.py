"""Downloads keep their file's name, whatever its characters (RFC 6266)."""

from __future__ import annotations

import pytest
from django.http import HttpResponse

from config.http import content_disposition


@pytest.mark.parametrize(
    ("filename", "header"),
    [
        ("INV-2026-0001.pdf", 'attachment; filename="INV-2026-0001.pdf"'),
        (
            "facture-équipe.csv",
            "attachment; filename=\"facture-equipe.csv\"; filename*=UTF-8''facture-%C3%A9quipe.csv",
        ),
        (
            "日本.jsonl",
            "attachment; filename=\"download.jsonl\"; filename*=UTF-8''%E6%97%A5%E6%9C%AC.jsonl",
        ),
        # A quote or a line break cannot end the value or add a header.
        (
            'a"b\r\nX: y.jsonl',
            "attachment; filename=\"a_b__X: y.jsonl\"; filename*=UTF-8''a%22b%0D%0AX%3A%20y.jsonl",
        ),
    ],
)
def test_it_sends_any_name_as_an_ascii_header(filename, header):
    response = HttpResponse()
    response["Content-Disposition"] = content_disposition(filename)
    assert response.serialize_headers().decode("ascii").endswith(f"Content-Disposition: {header}")
