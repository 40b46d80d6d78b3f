"""Key names: one module spells them, and what it spells is the stored data's format."""

from __future__ import annotations

import re
from pathlib import Path

from dataplane import keys

ROOT = Path(__file__).resolve().parents[2]
# Product code and the benchmarks; the tests and the data plane itself are not searched.
SKIP = {".venv", "node_modules", "tests", "dataplane", "build", ".data", ".git"}
# A Redis key literal: a string that starts with the platform's key prefix.
KEY_LITERAL = re.compile(r"""(?:['"]|f['"]|\{)sy:|sy:\{""")


def _python_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in SKIP or "migrations" in parts:
            continue
        found.append(path)
    return found


def test_no_module_outside_the_data_plane_spells_a_redis_key():
    files = _python_files()
    assert any(p.parts[-2:] == ("pipeline", "submission.py") for p in files)  # the walk finds code
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if KEY_LITERAL.search(line)
    ]
    assert offenders == []


def test_the_pattern_catches_key_literals():
    assert KEY_LITERAL.search('x = "sy:batch:1:lease"')
    assert KEY_LITERAL.search("x = f'sy:{{t{tenant}}}:rc:'")
    assert KEY_LITERAL.search('x = f"{prefix}:sy:{deployment}"')
    assert not KEY_LITERAL.search('fingerprint = f"sy-{version}"')


def test_key_strings_are_the_stored_ones():
    # Changing any of these strings strands the data already in Redis.
    k = keys.deployment_keys("d")
    assert k.jobs == "sy:{d}:jobs"
    assert k.queue_interactive == "sy:{d}:q:interactive"
    assert k.ready_batch == "sy:{d}:ready:batch"
    assert k.workers == keys.heartbeats_key("d") == "sy:{d}:workers"
    assert k.usage == keys.usage_key("d") == "sy:{d}:usage"
    assert k.ledger == keys.ledger_key("d") == "sy:{d}:ledger"
    assert k.handoffs == "sy:{d}:handoffs"
    assert len(k) == 20  # the Lua prelude unpacks twenty keys
    assert keys.reply_key("d", "r1") == "sy:{d}:reply:r1"
    assert keys.reply_wake_key("d", "x") == "sy:{d}:wake:x"
    assert keys.cancel_key("d", "r1") == "sy:{d}:cancel:r1"
    assert keys.final_key("d", "r1") == "sy:{d}:final:r1"
    assert keys.fence_key("d", "r1") == "sy:{d}:fence:r1"
    assert keys.dead_usage_key("d") == "sy:{d}:usage:dead"
    assert keys.cancel_channel("d") == "sy:{d}:cancel"
    assert keys.handoff_channel("d", "w") == "sy:{d}:handoff:w"
    assert keys.gauges_key("d") == "sy:{d}:gauges"
    assert keys.retire_key("d") == "sy:{d}:retire"
    assert keys.autoscale_key("d") == "sy:{d}:autoscale"
    assert keys.whereabouts_key("r1") == "sy:{rr1}:where"
    assert keys.deployment_of(keys.usage_key("llama-chat")) == "llama-chat"
    assert keys.ledger_field(0, "admitted") == "1970010100:admitted"
    assert tuple(keys.quota_keys(7, "r1", "202501")) == (
        "sy:{t7}:rpm",
        "sy:{t7}:tpm",
        "sy:{t7}:inflight",
        "sy:{t7}:spent:202501",
        "sy:{t7}:held:r1",
    )
    assert keys.idempotency_key(7, "ab") == "sy:{t7}:idem:ab"
    assert keys.answer_cache_prefix(7) == "sy:{t7}:rc:"
    assert keys.login_attempts_key("Alice") == "sy:login-attempts:alice"
    assert keys.batch_lease_key("b1") == "sy:batch:b1:lease"
    assert keys.KEY_REVOCATIONS_CHANNEL == "sy:keys:revoked"
    assert keys.CONTROL_CHANGES_CHANNEL == "sy:control:changed"
    assert keys.DJANGO_CACHE_PREFIX == "sy:cache"
    assert keys.INGEST_GROUP == "ingest"
