"""File downloads from a real frontend (uvicorn) over real sockets, against real PostgreSQL.

A download is streamed a chunk at a time as its client takes it, a client that stops taking
it is cut off after the write timeout, and one tenant's parallel downloads take only its share
of the frontend's database threads. The frontend here is one of the module's own, with a short
write timeout and no traffic but these tests'.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Process, _free_port, _http_ok, _spawn, _wait_for, roomy_key

# Long enough for a test to act on a stalled download before it is cut off.
WRITE_TIMEOUT_SECONDS = 10
MiB = 1024 * 1024


@dataclass(frozen=True)
class Frontend:
    base_url: str
    port: int
    process: Process

    def rss(self) -> int:
        """The frontend's resident memory, in bytes."""
        status = Path(f"/proc/{self.process.popen.pid}/status").read_text()
        (kib,) = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
        return int(kib) * 1024


@dataclass(frozen=True)
class BigFile:
    key: str
    file_id: str
    size: int
    digest: str


@pytest.fixture(scope="module")
def frontend(world: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    logs = tmp_path_factory.mktemp("downloads-frontend")
    port = _free_port()
    args = ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
            str(port), "--no-access-log"]  # fmt: skip
    env = {
        "ROUNDHOUSE_WRITE_TIMEOUT_SECONDS": str(WRITE_TIMEOUT_SECONDS),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("downloads-metrics")),
    }
    process = _spawn("frontend", args, logs, env)
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_for(process, lambda: _http_ok(f"{base_url}/healthz"), timeout=180)
        yield Frontend(base_url=base_url, port=port, process=process)
    finally:
        process.popen.terminate()
        try:
            process.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.popen.kill()


@pytest.fixture(scope="module")
def big(world: Any, django_db_blocker: Any) -> BigFile:
    """A 24 MiB batch file of a tenant of its own."""
    from batches.services import file_create
    from tenants.models import Tenant

    line = {"custom_id": "", "method": "POST", "url": "/v1/completions",
            "body": {"model": "tiny-chat", "prompt": "x" * 1000, "max_tokens": 2}}  # fmt: skip
    lines = []
    for i in range(24 * MiB // 1100):
        line["custom_id"] = f"l{i}"
        lines.append(json.dumps(line))
    content = ("\n".join(lines) + "\n").encode()
    with django_db_blocker.unblock():
        key = roomy_key("downloads")
        tenant = Tenant.objects.get(slug="downloads")
        file = file_create(tenant_id=tenant.pk, filename="big.jsonl", purpose="batch",
                           content=content)  # fmt: skip
    return BigFile(key, file.id, len(content), hashlib.sha256(content).hexdigest())


def _download(frontend: Frontend, big: BigFile) -> str:
    """Download the file whole, as a client that reads as fast as it can; return its digest."""
    digest = hashlib.sha256()
    url = f"{frontend.base_url}/v1/files/{big.file_id}/content"
    auth = {"Authorization": f"Bearer {big.key}"}
    with httpx.stream("GET", url, headers=auth, timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert int(response.headers["content-length"]) == big.size
        for part in response.iter_raw():
            digest.update(part)
    return digest.hexdigest()


def _stalled(frontend: Frontend, big: BigFile) -> tuple[socket.socket, dict[str, str], int]:
    """Ask for the file, read its headers, then read no more; return the socket, the headers
    and how many of the body's bytes came with them."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # set before connecting
    sock.settimeout(60)
    sock.connect(("127.0.0.1", frontend.port))
    sock.sendall(
        f"GET /v1/files/{big.file_id}/content HTTP/1.1\r\nHost: localhost\r\n"
        f"Authorization: Bearer {big.key}\r\n\r\n".encode()
    )
    received = b""
    while b"\r\n\r\n" not in received:
        part = sock.recv(1024)
        assert part, f"the connection closed before its headers: {received!r}"
        received += part
    head, body = received.split(b"\r\n\r\n", 1)
    status, *fields = head.decode("latin-1").split("\r\n")
    assert " 200 " in status, received
    headers = {k.strip().lower(): v.strip() for k, v in (f.split(":", 1) for f in fields)}
    return sock, headers, len(body)


def _drain(sock: socket.socket) -> int:
    """Read what is left until the connection ends; return how many bytes that was."""
    total = 0
    try:
        while part := sock.recv(256 * 1024):
            total += len(part)
    except ConnectionResetError:
        pass
    return total


def test_a_download_is_streamed_and_a_reader_that_stops_holds_a_chunk_or_two(frontend, big):
    assert _download(frontend, big) == big.digest
    before = frontend.rss()
    readers = [_stalled(frontend, big) for _ in range(8)]
    try:
        assert all(int(h["content-length"]) == big.size for _, h, _ in readers)
        time.sleep(1)  # the frontend sends each what it can; then it waits on their sockets
        grown = frontend.rss() - before
    finally:
        for sock, _, _ in readers:
            sock.close()
    # Loosely: a held download is a chunk or two, not the 24 MiB file (the whole file each
    # was 8 x 24 MiB and more).
    assert grown < 8 * big.size / 2, f"eight stalled downloads grew the frontend {grown} bytes"


def test_a_reader_that_stops_reading_is_cut_off_after_the_write_timeout(frontend, big):
    sock, headers, early = _stalled(frontend, big)
    with sock:
        said = f"cut off the client of request {headers['x-request-id']}"
        _wait_for(frontend.process, lambda: said in frontend.process.tail(400), timeout=120)
        # The rest never comes: the connection ends short of the file.
        assert early + _drain(sock) < big.size
    # Cut on purpose, not a response the application forgot to finish.
    assert "returned without completing response" not in frontend.process.tail(400)
    # The frontend serves on: the same file downloads whole to a client that reads it.
    assert _download(frontend, big) == big.digest


def test_a_file_deleted_while_it_downloads_ends_the_download_short(
    frontend, big, django_db_blocker
):
    from batches.services import file_create
    from tenants.models import Tenant

    # 12 MiB: more than the sockets between can hold.
    content = (b'{"pad": "' + b"p" * 1000 + b'"}\n') * (12 * MiB // 1012)
    with django_db_blocker.unblock():
        tenant = Tenant.objects.get(slug="downloads")
        doomed = file_create(tenant_id=tenant.pk, filename="doomed.jsonl", purpose="batch",
                             content=content)  # fmt: skip
    file = BigFile(big.key, doomed.id, len(content), "")
    sock, headers, early = _stalled(frontend, file)
    with sock:
        deleted = httpx.delete(
            f"{frontend.base_url}/v1/files/{doomed.id}",
            headers={"Authorization": f"Bearer {big.key}"},
            timeout=30,
        )
        assert deleted.status_code == 200, deleted.text
        # Read on: what the sockets held comes, then the connection ends short of the file.
        received = early + _drain(sock)
    assert received < len(content)
    said = f"cut request {headers['x-request-id']} short"
    _wait_for(frontend.process, lambda: said in frontend.process.tail(400), timeout=60)


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_one_tenants_parallel_downloads_take_its_share_of_the_database_and_spare_the_others(
    frontend, big, world, django_db_blocker
):
    from django.db import connection, transaction

    def waiting_chunk_reads() -> int:
        """The frontend's chunk reads waiting on the test's lock, each holding a db thread."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%batches_filechunk%%' AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])

    seen: list[int] = []
    with ThreadPoolExecutor(8) as pool, django_db_blocker.unblock():
        with transaction.atomic():
            # Every chunk read waits until the test lets go: each holds its thread as a slow
            # read of a large file would.
            with connection.cursor() as cursor:
                cursor.execute("LOCK TABLE batches_filechunk IN ACCESS EXCLUSIVE MODE")
            downloads = [pool.submit(_download, frontend, big) for _ in range(8)]

            def share_taken() -> bool:
                seen.append(waiting_chunk_reads())
                return seen[-1] >= 2

            _until(share_taken, "two of its chunk reads wait")
            listed = httpx.get(
                f"{frontend.base_url}/v1/files",
                headers={"Authorization": f"Bearer {world.globex_key}"},
                timeout=30,
            )
            seen.append(waiting_chunk_reads())
        assert [d.result(timeout=120) for d in downloads] == [big.digest] * 8
    # Another tenant's list was answered while the downloads waited, and they never held
    # more than their tenant's share (2 of the frontend's 4 threads).
    assert listed.status_code == 200, listed.text
    assert max(seen) == 2, seen


def test_a_tenants_downloads_go_out_a_few_at_a_time_and_others_go_on(
    frontend, big, django_db_blocker
):
    """Its two stalled downloads hold the tenant's turns: its third gets its head and waits
    for a turn, while another tenant's download goes out whole; the third then goes on."""
    from batches.services import file_create
    from tenants.models import Tenant

    with django_db_blocker.unblock():
        other_key = roomy_key("downloads-other")
        other = Tenant.objects.get(slug="downloads-other")
        content = (b'{"pad": "' + b"p" * 1000 + b'"}\n') * (MiB // 1012)
        small = file_create(tenant_id=other.pk, filename="s.jsonl", purpose="batch",
                            content=content)  # fmt: skip
    theirs = BigFile(other_key, small.id, len(content), hashlib.sha256(content).hexdigest())
    stalled = [_stalled(frontend, big) for _ in range(2)]
    waiting, _, early = _stalled(frontend, big)  # the tenant's third: its head comes
    try:
        assert early == 0
        assert _download(frontend, theirs) == theirs.digest  # the other tenant's goes on
        waiting.settimeout(3)
        with pytest.raises(TimeoutError):
            waiting.recv(1)  # none of the third's body while the two hold the turns
    finally:
        for sock, _, _ in stalled:
            sock.close()
    with waiting:
        waiting.settimeout(60)
        assert waiting.recv(1)  # a turn came free: the third goes on
