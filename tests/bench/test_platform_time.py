"""bench/platform_time.py runs a base commit on this checkout's database and ingester only
when the shared files have only gained since that commit, and counts what a closed loop's
requests cost in calls."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import redis

from bench.platform_time import _schema_kept, calls_read


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _commit(root: Path, files: dict[str, str | None]) -> str:
    for name, text in files.items():
        path = root / name
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "step")
    return _git(root, "rev-parse", "HEAD")


def test_a_base_runs_only_where_the_schema_and_usage_records_only_gained(tmp_path):
    _git(tmp_path, "init", "-q")
    base = _commit(
        tmp_path,
        {
            "billing/migrations/0001_initial.py": "one\n",
            "dataplane/types.py": "class UsageEvent:\n    tokens: int = 0\n",
            "billing/views.py": "x = 1\n",
        },
    )
    assert _schema_kept(base, tmp_path)
    # Another migration, a field added to the usage records, any other file: kept.
    grown = _commit(
        tmp_path,
        {
            "billing/migrations/0002_more.py": "two\n",
            "dataplane/types.py": "class UsageEvent:\n    tokens: int = 0\n    cost: int = 0\n",
            "billing/views.py": "x = 2\n",
        },
    )
    assert _schema_kept(base, tmp_path)
    # A migration the base ran, removed: not kept.
    removed = _commit(tmp_path, {"billing/migrations/0002_more.py": None})
    assert not _schema_kept(grown, tmp_path)
    assert _schema_kept(base, tmp_path)
    # A migration the base ran, changed: not kept.
    changed = _commit(tmp_path, {"billing/migrations/0001_initial.py": "one, changed\n"})
    assert not _schema_kept(removed, tmp_path)
    # A field taken out of the usage records: not kept.
    _commit(tmp_path, {"dataplane/types.py": "class UsageEvent:\n    cost: int = 0\n"})
    assert not _schema_kept(changed, tmp_path)


def test_a_loops_calls_are_the_frontends_system_calls_and_valkeys_script_calls_a_request(
    settings,
):
    valkey = redis.Redis.from_url(settings.REDIS_URL)
    me = psutil.Process()
    readable, writable = os.pipe()
    before = calls_read(me, valkey)
    for _ in range(4):
        valkey.eval("return 1", 0)
        # As an event loop reads and writes its sockets (redis-py's own sockets here send and
        # receive with calls the process's read and write counts leave out).
        os.write(writable, b"x")
        os.read(readable, 1)
    after = calls_read(me, valkey)
    per = after.per_request(before, 2)
    assert per is not None
    assert per.scripts == 2.0  # four script calls, two requests
    assert per.syscalls >= 4.0  # four writes and four reads, two requests
    assert after.per_request(before, 0) is None
