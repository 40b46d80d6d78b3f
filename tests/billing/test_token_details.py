"""A usage record keeps the parts of its counts that are not priced apart: the prompt tokens a
request wrote to the prefix cache and a reasoning model's thinking tokens; the finance usage
API and its CSV sum them beside the rest."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.billing.test_cached_tokens import _use

pytestmark = pytest.mark.django_db
AT = dt.datetime(2026, 10, 2, tzinfo=dt.UTC)


def test_a_record_keeps_cache_writes_and_thinking_without_pricing_them(world):
    plain = _use(world, at=AT, prompt=100, cached=0, completion=20)
    detailed = _use(
        world, at=AT, prompt=100, cached=0, completion=20,
        cache_created_tokens=96, reasoning_tokens=12,
    )  # fmt: skip
    assert (plain.cache_created_tokens, plain.reasoning_tokens) == (0, 0)
    assert (detailed.cache_created_tokens, detailed.reasoning_tokens) == (96, 12)
    # Written cache blocks cost nothing extra, and thinking is output like the rest.
    assert detailed.cost == plain.cost


def test_the_usage_api_and_its_csv_sum_them(world):
    for created, thought in ((96, 12), (32, 0)):
        _use(
            world, at=AT, prompt=100, cached=0, completion=20, user="details-user",
            cache_created_tokens=created, reasoning_tokens=thought,
        )  # fmt: skip
    staff = APIClient()
    staff.force_login(User.objects.create_user("details-staff", is_staff=True))
    params = {"tenant": "acme", "group_by": "user", "from": "2026-10-01", "to": "2026-11-01"}
    [row] = staff.get("/api/finance/usage", params).json()["rows"]
    assert (row["cache_created_tokens"], row["reasoning_tokens"]) == (128, 12)
    exported = staff.get("/api/finance/usage", {**params, "export": "csv"}).content.decode()
    [line] = list(csv.DictReader(io.StringIO(exported)))
    assert (line["cache_created_tokens"], line["reasoning_tokens"]) == ("128", "12")
