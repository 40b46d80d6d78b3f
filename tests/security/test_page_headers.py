"""Console and admin pages carry a strict Content-Security-Policy and the other safe headers."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

TEMPLATES = [*(ROOT / "templates").rglob("*.html"), *(ROOT / "console").rglob("*.html")]
# What a script-src and style-src of 'self' refuse to run or apply.
INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=|\son[a-z]+=", re.I)


@pytest.mark.parametrize("path", ["/console/login", "/admin/login/", "/console/no-such-page"])
def test_it_sends_a_strict_policy_and_the_safe_headers_on_every_page(path):
    answer = Client().get(path)
    directives = (part.partition(" ") for part in answer["Content-Security-Policy"].split("; "))
    policy = {name: value for name, _, value in directives}
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    assert answer["X-Content-Type-Options"] == "nosniff"
    assert answer["Referrer-Policy"] == "same-origin"
    assert answer["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_the_console_runs_no_inline_script_or_style(template):
    found = INLINE.findall(template.read_text())
    assert not found, f"{template.name}: {found} (move it to static/console/)"
