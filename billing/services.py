"""Price usage, record it exactly once per request, and bill it on monthly invoices."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from billing.models import PriceBook
from dataplane.types import UsageEvent
from models_registry.models import ModelVersion
from tenants.models import ApiKey, Tenant
from tenants.services import audit_record

_THOUSAND = Decimal(1000)
_HUNDRED = Decimal(100)


def _when(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC)


def _maybe_when(ts: float | None) -> dt.datetime | None:
    return _when(ts) if ts is not None else None


@dataclass(frozen=True)
class Price:
    """The prices a request pays: a price book's, or its version's registered ones.

    Cached tokens (prompt tokens served from the prefix cache) are part of the prompt; they
    pay the cached-input price, or the input price where none is set (no discount by default).
    """

    input_per_1k: Decimal
    output_per_1k: Decimal
    batch_discount_pct: Decimal = Decimal(0)
    book: PriceBook | None = None
    cached_input_per_1k: Decimal | None = None

    @property
    def cached_per_1k(self) -> Decimal:
        """Return what a thousand cached prompt tokens cost."""
        if self.cached_input_per_1k is None:
            return self.input_per_1k
        return self.cached_input_per_1k

    def _discounted(self, amount: Decimal, priority: str) -> Decimal:
        if priority == "batch" and self.batch_discount_pct:
            return amount * (_HUNDRED - self.batch_discount_pct) / _HUNDRED
        return amount

    def cached_cost(self, *, prompt_tokens: int, cached_tokens: int, priority: str) -> Decimal:
        """Return the part of a request's cost its cached prompt tokens pay."""
        cached = min(cached_tokens, prompt_tokens)
        return self._discounted(self.cached_per_1k * cached / _THOUSAND, priority)

    def cost(
        self, *, prompt_tokens: int, completion_tokens: int, priority: str, cached_tokens: int = 0
    ) -> Decimal:
        """Return what a request costs: uncached prompt, cached prompt and completion tokens."""
        uncached = prompt_tokens - min(cached_tokens, prompt_tokens)
        rest = self._discounted(
            (self.input_per_1k * uncached + self.output_per_1k * completion_tokens) / _THOUSAND,
            priority,
        )
        cached = self.cached_cost(
            prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, priority=priority
        )
        return rest + cached


def usage_cost(*, version: ModelVersion, prompt_tokens: int, completion_tokens: int) -> Decimal:
    """Return what tokens cost at a version's registered prices (no price book, no discount).

    A version's registered price has no cached-input price: its cached tokens cost the input
    price, so they need not be told apart here.
    """
    price = Price(version.price_input_per_1k, version.price_output_per_1k)
    return price.cost(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, priority="")


class PriceBooks:
    """The price books of some versions, to look up the one in force at a moment."""

    def __init__(self, versions: Iterable[ModelVersion]) -> None:
        self._books: dict[int, list[PriceBook]] = {}
        self._starts: dict[int, list[dt.datetime]] = {}
        books = PriceBook.objects.filter(model_version_id__in={v.pk for v in versions}).order_by(
            "effective_from"
        )
        for book in books:
            self._books.setdefault(book.model_version_id, []).append(book)
            self._starts.setdefault(book.model_version_id, []).append(book.effective_from)

    def at(self, version: ModelVersion, moment: dt.datetime) -> Price:
        books = self._books.get(version.pk, [])
        index = bisect.bisect_right(self._starts.get(version.pk, []), moment) - 1
        if index < 0:
            return Price(version.price_input_per_1k, version.price_output_per_1k)
        book = books[index]
        return Price(
            book.input_per_1k,
            book.output_per_1k,
            book.batch_discount_pct,
            book,
            cached_input_per_1k=book.cached_input_per_1k,
        )


def _maybe_str(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def price_current(version: ModelVersion) -> Price:
    """Return the prices a request admitted now pays for a version."""
    return PriceBooks([version]).at(version, timezone.now())


def price_book_add(
    *,
    version: ModelVersion,
    input_per_1k: Decimal,
    output_per_1k: Decimal,
    effective_from: dt.datetime,
    batch_discount_pct: Decimal = Decimal(0),
    cached_input_per_1k: Decimal | None = None,
    note: str = "",
    actor: User | None = None,
) -> PriceBook:
    """Set a version's prices from a moment on; earlier requests keep the prices they had.

    Without a cached-input price, prompt tokens served from the prefix cache cost the input
    price; with one, it lies between 0 and the input price.
    """
    if input_per_1k < 0 or output_per_1k < 0:
        raise ValidationError({"price": "prices cannot be negative"})
    if cached_input_per_1k is not None and not 0 <= cached_input_per_1k <= input_per_1k:
        raise ValidationError(
            {"cached_input_per_1k": "must be between 0 and the input price per 1k"}
        )
    if not 0 <= batch_discount_pct <= 100:
        raise ValidationError({"batch_discount_pct": "must be between 0 and 100"})
    if effective_from.tzinfo is None:
        raise ValidationError({"effective_from": "give a time zone (UTC is stored)"})
    if PriceBook.objects.filter(model_version=version, effective_from=effective_from).exists():
        raise ValidationError({"effective_from": "a price book already starts at this moment"})
    with transaction.atomic():
        before = price_current(version)
        book = PriceBook.objects.create(
            model_version=version,
            input_per_1k=input_per_1k,
            output_per_1k=output_per_1k,
            batch_discount_pct=batch_discount_pct,
            cached_input_per_1k=cached_input_per_1k,
            effective_from=effective_from,
            note=note,
            created_by=actor,
        )
        audit_record(
            action="price_book.add",
            target_type="model_version",
            target_id=version.public_name,
            actor=actor,
            reason=note,
            before={"input_per_1k": str(before.input_per_1k),
                    "output_per_1k": str(before.output_per_1k),
                    "cached_input_per_1k": _maybe_str(before.cached_input_per_1k)},
            after={"input_per_1k": str(input_per_1k), "output_per_1k": str(output_per_1k),
                   "cached_input_per_1k": _maybe_str(cached_input_per_1k),
                   "batch_discount_pct": str(batch_discount_pct),
                   "effective_from": effective_from.isoformat()},
        )  # fmt: skip
    return book


@dataclass(frozen=True)
class IngestResult:
    recorded: int
    refused: list[UsageEvent]
    costs: dict[str, Decimal]  # request id -> cost, for every event not refused
    # tenant slug -> (prompt, completion) tokens of the records this call wrote (not replays)
    tenant_tokens: dict[str, tuple[int, int]] = field(default_factory=dict)
    # (deployment, short version) -> (list-price cost, prompt + completion tokens) of the billed
    # records this call wrote: shadow copies bill nothing and count in neither
    version_billed: dict[tuple[str, str], tuple[Decimal, int]] = field(default_factory=dict)


def usage_ingest(*, events: list[UsageEvent]) -> IngestResult:
    """Write usage records for events not yet recorded.

    Idempotent: the request id is unique, so a replayed event (an ingester that crashed before
    acknowledging) is skipped rather than counted twice. Events whose tenant or version no
    longer exists are returned as refused instead of failing the whole batch.
    """
    if not events:
        return IngestResult(recorded=0, refused=[], costs={})
    versions = {
        v.digest: v
        for v in ModelVersion.objects.filter(digest__in={e.model_version for e in events})
    }
    tenants = dict(
        Tenant.objects.filter(pk__in={e.tenant_id for e in events}).values_list("pk", "slug")
    )
    keys = set(
        ApiKey.objects.filter(pk__in={e.api_key_id for e in events}).values_list("pk", flat=True)
    )
    prices = PriceBooks(versions.values())
    rows: list[tuple[object, ...]] = []
    refused = []
    costs: dict[str, Decimal] = {}
    now = timezone.now()
    for event in events:
        version = versions.get(event.model_version)
        if version is None or event.tenant_id not in tenants:
            refused.append(event)
            continue
        admitted = _when(event.enqueued_at)
        # Priced once, at the price book in force when the request was admitted.
        price = prices.at(version, admitted)
        cost = cached_cost = Decimal(0)
        if not event.shadow:
            cost = price.cost(
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                cached_tokens=event.cached_tokens,
                priority=event.priority,
            )
            cached_cost = price.cached_cost(
                prompt_tokens=event.prompt_tokens,
                cached_tokens=event.cached_tokens,
                priority=event.priority,
            )
            if event.bill_percent != 100:
                cost = cost * event.bill_percent / _HUNDRED
                cached_cost = cached_cost * event.bill_percent / _HUNDRED
        costs[event.request_id] = cost
        rows.append(
            (
                event.request_id,
                event.tenant_id,
                event.api_key_id if event.api_key_id in keys else None,
                version.pk,
                event.deployment,
                event.endpoint,
                str(event.status),
                event.finish_reason,
                event.error_code,
                event.prompt_tokens,
                event.completion_tokens,
                event.cached_tokens,
                event.cache_created_tokens,
                event.reasoning_tokens,
                event.trace_id,
                cost,
                cached_cost,
                event.shadow,
                event.response_cache,
                event.fallback_from,
                event.capped_max_tokens or None,
                event.user,
                event.priority,
                price.book.pk if price.book else None,
                admitted,
                _maybe_when(event.started_at),
                _maybe_when(event.first_token_at),
                _when(event.finished_at),
                now,
            )
        )
    new = _copy_in(rows)
    recorded = len(new)
    tokens: dict[str, tuple[int, int]] = {}
    billed: dict[tuple[str, str], tuple[Decimal, int]] = {}
    for event in events:
        if event.request_id in new:
            new.discard(event.request_id)  # a request repeated within the batch counts once
            slug = tenants[event.tenant_id]
            prompt, completion = tokens.get(slug, (0, 0))
            tokens[slug] = (prompt + event.prompt_tokens, completion + event.completion_tokens)
            if not event.shadow:
                key = (event.deployment, versions[event.model_version].version)
                cost, used = billed.get(key, (Decimal(0), 0))
                billed[key] = (
                    cost + costs[event.request_id],
                    used + event.prompt_tokens + event.completion_tokens,
                )
    return IngestResult(
        recorded=recorded,
        refused=refused,
        costs=costs,
        tenant_tokens=tokens,
        version_billed=billed,
    )


_COLUMNS = (
    "request_id", "tenant_id", "api_key_id", "model_version_id", "deployment", "endpoint",
    "status", "finish_reason", "error_code", "prompt_tokens", "completion_tokens",
    "cached_tokens", "cache_created_tokens", "reasoning_tokens", "trace_id", "cost",
    "cached_cost", "shadow", "response_cache", "fallback_from", "capped_max_tokens", "user",
    "priority", "price_book_id",
    "enqueued_at", "started_at", "first_token_at", "finished_at", "ingested_at",
)  # fmt: skip
_COLUMN_LIST = ", ".join(f'"{c}"' for c in _COLUMNS)


def _copy_in(rows: list[tuple[object, ...]]) -> set[str]:
    """Insert rows whose request id is not recorded yet; return the request ids that were new.

    COPY into a session-private staging table, then one INSERT … ON CONFLICT DO NOTHING:
    a batch is one statement whatever its size, and a replayed request id is skipped by
    the unique index rather than counted twice.
    """
    if not rows:
        return set()
    with transaction.atomic(), connection.cursor() as cursor:
        # The column list is the module's own constant: no input reaches this SQL.
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS usage_staging ON COMMIT DELETE ROWS AS "  # nosec B608
            f"SELECT {_COLUMN_LIST} FROM billing_usagerecord WITH NO DATA"
        )
        with cursor.copy(f"COPY usage_staging ({_COLUMN_LIST}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO billing_usagerecord ({_COLUMN_LIST}) "  # nosec B608
            f"SELECT {_COLUMN_LIST} FROM usage_staging "
            "ON CONFLICT (request_id) DO NOTHING RETURNING request_id"
        )
        return {row[0] for row in cursor.fetchall()}
