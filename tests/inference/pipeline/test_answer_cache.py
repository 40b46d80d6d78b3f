"""Which requests the response cache may answer, and under which key."""

from __future__ import annotations

import msgspec

from dataplane.types import Job, Reasoning, Sampling
from inference.pipeline.answer_cache import cache_key, cacheable


def _job(**fields: object) -> Job:
    base: dict[str, object] = {
        "request_id": "r1",
        "tenant_id": 7,
        "api_key_id": 1,
        "deployment": "d",
        "model_version": "v" * 64,
        "endpoint": "chat.completions",
        "prompt_token_ids": [1, 2, 3],
        "sampling": Sampling(max_tokens=16, temperature=0.0),
        "enqueued_at": 0.0,
        "deadline": 1.0,
    }
    return Job(**{**base, **fields})  # type: ignore[arg-type]


def test_only_greedy_requests_of_real_clients_are_cacheable():
    assert cacheable(_job())
    assert not cacheable(_job(sampling=Sampling(max_tokens=16, temperature=0.7)))
    assert not cacheable(_job(shadow=True))
    assert not cacheable(_job(input_lengths=[3]))
    # The cache keeps text alone: a reasoning model's thinking would be lost from a hit.
    assert not cacheable(_job(reasoning=Reasoning(parser="qwen3")))


def test_settings_greedy_decoding_ignores_share_a_key():
    greedy = _job()
    seeded = _job(sampling=Sampling(max_tokens=16, temperature=0.0, seed=42, top_p=0.5, top_k=9))
    assert cache_key(seeded) == cache_key(greedy)
    assert cache_key(_job(request_id="another")) == cache_key(greedy)


def test_anything_that_changes_the_answer_changes_the_key():
    key = cache_key(_job())
    sampling = Sampling(max_tokens=16, temperature=0.0)
    changed = [
        _job(prompt_token_ids=[1, 2, 4]),
        _job(prompt_token_ids=[12, 3]),  # not the same as [1, 23] or [1, 2, 3]
        _job(model_version="w" * 64),
        _job(adapter="a" * 64),
        _job(endpoint="completions"),
        _job(sampling=msgspec.structs.replace(sampling, max_tokens=17)),
        _job(sampling=msgspec.structs.replace(sampling, stop=["\n"])),
        _job(cache_salt="user-1"),  # a client's salt keeps its answers apart too
    ]
    assert len({cache_key(job) for job in changed} | {key}) == len(changed) + 1


def test_each_tenant_has_its_own_keys_in_its_own_hash_slot():
    ours, theirs = cache_key(_job()), cache_key(_job(tenant_id=8))
    assert ours != theirs
    assert ours.startswith("sy:{t7}:") and theirs.startswith("sy:{t8}:")
