"""Per-tenant turns: how many of one tenant's requests may hold a scarce resource at once.

A frontend's event loop, its preprocessing threads, its database threads and its body reads
are shared by every tenant. A tenant that sends many expensive requests at once waits for its
own turns, so its flood slows itself and not the others: each tenant holds at most its share
of the resource, whatever it sends. A tenant with no turn held or awaited is forgotten, its
semaphore too: a process that runs one event loop after another (a Celery task each) never
finds one bound to a loop that has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Counts(dict[int, int]):
    """How many of each tenant's requests are in some state; a tenant at 0 is forgotten."""

    def enter(self, tenant_id: int) -> None:
        self[tenant_id] = self.get(tenant_id, 0) + 1

    def leave(self, tenant_id: int) -> int:
        """Count one out; return how many are left."""
        left = self[tenant_id] - 1
        if left:
            self[tenant_id] = left
        else:
            del self[tenant_id]
        return left


class Turns:
    """At most `per_tenant()` turns of each tenant's at a time; the others wait for one.

    A tenant with no turn taken or awaited is forgotten, so the table holds only the tenants
    active now.
    """

    def __init__(self, per_tenant: Callable[[], int]) -> None:
        self._per_tenant = per_tenant
        self._held: dict[int, asyncio.Semaphore] = {}
        self._users = Counts()  # per tenant: its requests holding or awaiting a turn

    def tenants(self) -> set[int]:
        """The tenants with a turn taken or awaited (the others are forgotten)."""
        return set(self._held)

    async def take(self, tenant_id: int) -> Callable[[], None]:
        """Wait for a turn of the tenant's; return what ends it (calling it again is a no-op)."""
        semaphore = self._held.get(tenant_id)
        if semaphore is None:
            semaphore = self._held[tenant_id] = asyncio.Semaphore(max(1, self._per_tenant()))
        self._users.enter(tenant_id)
        try:
            await semaphore.acquire()
        except BaseException:
            self._leave(tenant_id)  # it gave up waiting (its client went away)
            raise
        over = False

        def release() -> None:
            nonlocal over
            if over:
                return
            over = True
            semaphore.release()
            self._leave(tenant_id)

        return release

    def _leave(self, tenant_id: int) -> None:
        if not self._users.leave(tenant_id):  # nobody holding or waiting: forget the tenant
            del self._held[tenant_id]
