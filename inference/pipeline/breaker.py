"""Circuit breakers: an alias whose requests keep failing sends the next ones to its fallback.

A fallback (see `generation_submit`) takes a request the alias's deployment refuses up front:
a full queue, no worker, a deadline the queue cannot meet. A deployment can also take
requests and fail them: an engine raising on every request, workers dying mid-way, while
their heartbeats say they serve. Each such request is admitted, waits its turn, fails and
is retried by its client. The breaker learns this from the requests' own ends and, once
most of an alias's recent requests failed this way, sends its interactive requests straight
to the fallback for a while.

One breaker per alias and tenant, in each frontend's memory: every frontend learns from the
requests it relays, with no round trip on the request's path. A breaker that opens tells the
other frontends (dataplane.breakers), which hold that tenant's requests for the alias too
until it would turn half-open; its probe, on the frontend that opened it, decides for all.
A tenant's failures hold back its own requests only, so a tenant whose requests fail the
engine (a poison input, a model bug its prompts hit) cannot send every other tenant to the
fallback. Once the breakers of `min_tenants` tenants hold at the same time (here or
elsewhere), the deployment is failing for more than one tenant's traffic and every tenant's
interactive requests for the alias go on, those of tenants it has not failed yet included.
States of one tenant's breaker:

- closed: requests go to the alias. Its last `window` seconds of relayed ends are counted;
  once at least `min_requests` ended and `failure_share` of them failed on the platform's
  side (`engine_error`, `worker_lost`), it opens.
- open: for `open_seconds`, interactive requests go to the fallback, `circuit_open` their
  reason. An alias without a fallback is never held: its requests still go to it.
- half-open: after that, one request at a time goes to the alias as a probe. Its success
  closes the breaker; its failure opens it again. A probe that never ends (its client left)
  makes way for another after `open_seconds`. The ends of requests admitted before it
  opened are not counted: the probe decides.

Only the platform's failures count: a request's own error, a refusal, a cancellation or a
timeout says nothing of the model's health.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from dataplane.background import spawn
from dataplane.breakers import breaker_share
from dataplane.redis_client import control_client_new
from dataplane.types import Event, Failed, Finished
from inference.base.metrics import breaker_changed, breaker_observed

log = logging.getLogger(__name__)

# What a deployment's failure looks like at a request's end: its engine raised, its worker
# died. The same codes the API answers with 503 and a retry.
PLATFORM_FAILURES = frozenset({"engine_error", "worker_lost"})


@dataclass
class Breaker:
    """One alias's breaker (see the module's doc); `clock` is seconds, monotonic."""

    window: float
    min_requests: int
    failure_share: float
    open_seconds: float
    clock: Callable[[], float] = time.monotonic
    _ends: deque[tuple[float, bool]] = field(default_factory=deque)  # (when, failed)
    _opened_at: float | None = None
    _probe: tuple[str, float] | None = None  # the outstanding probe's request id, sent when

    @property
    def opened_at(self) -> float | None:
        """When it last opened (or opened again after a failed probe); None while closed."""
        return self._opened_at

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "open" if self.clock() - self._opened_at < self.open_seconds else "half_open"

    @property
    def holding(self) -> bool:
        """Whether it keeps its requests from the alias now: open, or half-open while its probe
        is out. A half-open breaker nobody probes (its tenant went quiet) holds nothing."""
        state = self.state
        if state == "closed":
            return False
        if state == "open":
            return True
        return self._probe is not None and self.clock() - self._probe[1] < self.open_seconds

    @property
    def idle(self) -> bool:
        """Closed, with no end in its window: nothing to remember."""
        return self._opened_at is None and (
            not self._ends or self.clock() - self._ends[-1][0] > self.window
        )

    def admits(self, request_id: str) -> bool:
        """Whether this interactive request goes to the alias: always while closed, as the
        probe while half-open."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        now = self.clock()
        if self._probe is not None and now - self._probe[1] < self.open_seconds:
            return False  # one probe at a time
        self._probe = (request_id, now)
        return True

    def ended(self, request_id: str, *, failed: bool) -> bool:
        """Count a relayed request's end; return True when this changed the state."""
        now = self.clock()
        if self._opened_at is not None:
            if self._probe is None or self._probe[0] != request_id:
                return False  # a request admitted before it opened: the probe decides
            self._probe = None
            if failed:
                self._opened_at = now
                return False
            self._opened_at = None
            self._ends.clear()
            return True
        self._ends.append((now, failed))
        while self._ends and now - self._ends[0][0] > self.window:
            self._ends.popleft()
        failures = sum(1 for _, bad in self._ends if bad)
        if len(self._ends) >= self.min_requests and failures >= self.failure_share * len(
            self._ends
        ):
            self._opened_at = now
            return True
        return False


# How many ends an alias's breakers count between two sweeps of its idle tenants' breakers.
_SWEEP_EVERY = 256


@dataclass
class AliasBreakers:
    """One alias's breakers, one per tenant whose requests for it this frontend relayed."""

    make: Callable[[], Breaker]
    min_tenants: int
    tenants: dict[int, Breaker] = field(default_factory=dict)
    _tripped: set[int] = field(default_factory=set)  # tenants whose breaker is not closed
    _counted: int = 0
    # Tenants whose breaker for the alias another frontend holds: tenant -> until (epoch s).
    elsewhere: dict[int, float] = field(default_factory=dict)

    def _held_elsewhere(self, tenant_id: int) -> bool:
        until = self.elsewhere.get(tenant_id)
        return until is not None and until > time.time()

    @property
    def holding_all(self) -> bool:
        """Whether enough tenants' breakers hold, here or elsewhere, that every tenant's
        requests go on."""
        holding = {tenant for tenant in self._tripped if self.tenants[tenant].holding}
        if self.elsewhere:
            now = time.time()
            holding |= {tenant for tenant, until in self.elsewhere.items() if until > now}
        return len(holding) >= self.min_tenants

    @property
    def worst(self) -> str:
        """The worst state of its tenants' breakers: open, half_open or closed."""
        states = {self.tenants[t].state for t in self._tripped if t in self.tenants}
        return "open" if "open" in states else "half_open" if "half_open" in states else "closed"

    def admits(self, tenant_id: int, request_id: str) -> bool:
        own = self.tenants.get(tenant_id)
        if own is not None and own.state != "closed":
            return own.admits(request_id)  # its own breaker decides, and probes
        if self._held_elsewhere(tenant_id):
            return False  # another frontend's breaker holds it (and probes)
        return not self.holding_all

    def ended(self, tenant_id: int, request_id: str, *, failed: bool) -> tuple[str, bool, bool]:
        """Count a request's end: (its tenant's breaker's new state or "", whether every
        tenant's requests are held back now where they were not before, whether the breaker
        opened, again or for the first time, or closed: what other frontends are told)."""
        before = self.holding_all
        breaker = self.tenants.get(tenant_id)
        if breaker is None:
            breaker = self.tenants[tenant_id] = self.make()
        opened_before = breaker.opened_at
        changed = breaker.ended(request_id, failed=failed)
        if breaker.state == "closed":
            self._tripped.discard(tenant_id)
        else:
            self._tripped.add(tenant_id)
        self._counted += 1
        if self._counted % _SWEEP_EVERY == 0:
            for tenant in [t for t, b in self.tenants.items() if b.idle]:
                del self.tenants[tenant]
            now = time.time()
            for tenant in [t for t, until in self.elsewhere.items() if until <= now]:
                del self.elsewhere[tenant]
        told = breaker.opened_at != opened_before
        return (breaker.state if changed else ""), (self.holding_all and not before), told


_breakers: dict[str, AliasBreakers] = {}


def _alias_breakers(alias: str) -> AliasBreakers:
    found = _breakers.get(alias)
    if found is None:

        def make() -> Breaker:
            return Breaker(
                window=settings.ROUNDHOUSE_BREAKER_WINDOW_SECONDS,
                min_requests=settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS,
                failure_share=settings.ROUNDHOUSE_BREAKER_FAILURE_SHARE,
                open_seconds=settings.ROUNDHOUSE_BREAKER_OPEN_SECONDS,
            )

        found = _breakers[alias] = AliasBreakers(
            make=make, min_tenants=max(1, settings.ROUNDHOUSE_BREAKER_MIN_TENANTS)
        )
    return found


def breakers_observe() -> None:
    """Set each alias's breaker state gauge to the worst state of its tenants' breakers here.

    Run every second by the process's change listener: an open breaker turns half-open with
    time alone, with no request to say so.
    """
    for alias, breakers in list(_breakers.items()):
        breaker_observed(model=alias, state=breakers.worst)


def breaker_admits(alias: str, tenant_id: int, request_id: str) -> bool:
    """Whether a tenant's interactive request for `alias` goes to it rather than to its
    fallback."""
    found = _breakers.get(alias)
    return found is None or found.admits(tenant_id, request_id)


def breaker_ended(alias: str, tenant_id: int, request_id: str, event: Event) -> None:
    """Count the terminal event of a tenant's request the alias's deployment took."""
    if isinstance(event, Finished):
        failed = False
    elif isinstance(event, Failed) and event.code in PLATFORM_FAILURES:
        failed = True
    else:
        return
    if settings.ROUNDHOUSE_BREAKER_MIN_REQUESTS <= 0:
        return  # breakers are off
    breakers = _alias_breakers(alias)
    state, all_held, told = breakers.ended(tenant_id, request_id, failed=failed)
    if told and _in_a_loop():
        opened = breakers.tenants[tenant_id].opened_at is not None
        until = time.time() + settings.ROUNDHOUSE_BREAKER_OPEN_SECONDS if opened else 0.0
        spawn(_told(alias, tenant_id, until))
    if state:
        breaker_changed(model=alias, state=state)
        breakers_observe()
        if state == "closed":
            log.info("breaker of %s for tenant %s closed: its probe succeeded", alias, tenant_id)
        else:
            log.warning(
                "breaker of %s for tenant %s opened: most of its recent requests failed on the "
                "platform's side; its interactive requests go to the fallback for %.0f s",
                alias,
                tenant_id,
                settings.ROUNDHOUSE_BREAKER_OPEN_SECONDS,
            )
    if all_held:
        breaker_changed(model=alias, state="open_all")
        log.warning(
            "breakers of %s hold for %d tenants: every tenant's interactive requests for it go "
            "to its fallback",
            alias,
            breakers.min_tenants,
        )


def _in_a_loop() -> bool:
    """Whether an event loop runs here to tell others from (a frontend's; not a unit test's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# One at a time per event loop, in the order the changes happened: an open told after the
# close that followed it would hold the tenant elsewhere for nothing.
_telling: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def _told(alias: str, tenant_id: int, until: float) -> None:
    """Tell the other frontends that a breaker here opened (until when) or closed (0)."""
    lock = _telling.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        client = control_client_new()
        try:
            await breaker_share(client, alias=alias, tenant_id=tenant_id, until=until)
        except Exception:
            log.warning("could not tell other frontends of %s's breaker", alias, exc_info=True)
        finally:
            await client.aclose()


def breaker_elsewhere(alias: str, tenant_id: int, until: float) -> None:
    """Apply another frontend's news of a tenant's breaker for an alias (until 0: closed)."""
    if until > time.time():
        _alias_breakers(alias).elsewhere[tenant_id] = until
    elif alias in _breakers:
        _breakers[alias].elsewhere.pop(tenant_id, None)


def breakers_elsewhere_replace(held: dict[tuple[str, int], float]) -> None:
    """Take what holds elsewhere as read whole (a listener that subscribed again)."""
    for breakers in _breakers.values():
        breakers.elsewhere.clear()
    for (alias, tenant_id), until in held.items():
        breaker_elsewhere(alias, tenant_id, until)


def breakers_reset() -> None:
    """Forget every breaker (tests)."""
    _breakers.clear()
