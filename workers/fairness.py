"""Fairness inside a worker's engine: request priorities, per-tenant caps, the prefill chunk.

Fair dispatch (dataplane.frontdoor) decides which tenant's job a worker takes next; what the
worker took then shares one engine. vLLM runs it with its priority policy
(`scheduling_policy="priority"`): the waiting request with the lowest priority number is
admitted first and, when KV-cache blocks run out, the running request with the highest is
preempted (ties go by arrival). Each request's number is its tenant's share of the sequences
running on the worker once it runs, so a tenant with little or nothing running goes ahead of a
flooding tenant's queued prompts, and a flooding tenant's sequences are the ones preempted.
Interactive work goes before batch work, whatever the shares.

A step's token budget (`max_num_batched_tokens`) is split so that no cohort of prompts fills
it: a prompt is prefilled in chunks of at most `prefill_chunk_tokens` per step (vLLM's
`long_prefill_token_threshold`, raised to the budget over the requests in the engine where the
engine supports that), which leaves room in every step for every sequence the engine runs and
one more: a newcomer's prompt starts at the next step however many long prompts arrived
before it.

Caps (`TenantCaps`) bound what one tenant holds on one worker, in sequences and in KV-cache
blocks; a tenant at a cap is not given more jobs until it drops below it (its jobs wait in the
queue, in their fair order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# A tenant's share of the worker's sequences, in thousandths: the priority of interactive work.
PRIORITY_SHARES = 1000
# Added to batch work's priority: after every interactive request, whatever its share.
BATCH_PRIORITY = PRIORITY_SHARES + 1


def engine_priority(
    *, priority_class: str, tenant_seqs: int, all_seqs: int, weight: float = 1.0
) -> int:
    """Return a request's vLLM priority: lower is admitted sooner and preempted later.

    `tenant_seqs` are the sequences its tenant runs on the worker, this request's included;
    `all_seqs` every tenant's, this request's included. The priority is the tenant's share of
    them in thousandths, divided by its dispatch weight; batch work comes after all of it.
    """
    share = tenant_seqs / max(all_seqs, 1) / max(weight, 1e-9)
    level = min(math.floor(share * PRIORITY_SHARES), PRIORITY_SHARES)
    return level + (BATCH_PRIORITY if priority_class == "batch" else 0)


def kv_blocks(tokens: Iterable[int], *, block_size: int) -> int:
    """Return the KV-cache blocks sequences of these lengths hold, one block list each.

    Blocks a sequence shares with another through the prefix cache count once per sequence:
    an upper bound, which a cap errs on the safe side of.
    """
    return sum(-(-count // block_size) for count in tokens if count > 0)


def prefill_chunk_tokens(*, budget: int, max_num_seqs: int) -> int:
    """Return the longest prefill chunk a request takes from a step shared with others.

    Every sequence the engine may run then fits a chunk into one step's budget.
    """
    return max(budget // max(max_num_seqs, 1), 1)


@dataclass(frozen=True)
class TenantCaps:
    """What one tenant may hold on one worker: sequences and KV-cache blocks (0: no cap)."""

    seqs: int = 0
    kv_blocks: int = 0

    def room(self, *, seqs: int, kv_blocks: int) -> int | None:
        """Return how many more jobs a tenant holding this much may take now (None: any).

        A job counts as one sequence here; one with several choices may take a tenant past
        its sequence cap by the rest of them, and then it takes nothing more until it is back
        under the cap.
        """
        if self.kv_blocks and kv_blocks >= self.kv_blocks:
            return 0
        if self.seqs:
            return max(self.seqs - seqs, 0)
        return None


def tenant_caps(
    *, max_num_seqs: int, kv_blocks_total: int, seqs_share: float, kv_share: float
) -> TenantCaps:
    """Return the caps of one tenant on a worker from the shares of its engine it may hold.

    A share of 1 or more is no cap; any other leaves a tenant one sequence and one block.
    """
    seqs = 0 if seqs_share >= 1 else max(math.floor(max_num_seqs * seqs_share), 1)
    kv = 0
    if kv_share < 1 and kv_blocks_total > 0:
        kv = max(math.floor(kv_blocks_total * kv_share), 1)
    return TenantCaps(seqs=seqs, kv_blocks=kv)
