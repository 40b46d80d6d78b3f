"""The weights cache against a real local HTTP server: verify, resume, dedupe, evict."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from models_registry.manifest import ArtifactError
from models_registry.models import ModelVersion
from models_registry.services import model_version_register
from workers.services import version_fetch, weight_files
from workers.weights import (
    DownloadError,
    HashMismatch,
    Progress,
    WeightFile,
    WeightsCache,
    WeightsError,
    uri_shown,
)

ROOT = Path(__file__).resolve().parents[2]


class WeightsServer(ThreadingHTTPServer):
    """Serve files from memory with Range support, and switches to misbehave."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.corrupt: set[str] = set()
        self.cut_once: dict[str, int] = {}  # close the connection after this many bytes, once
        self.chunk_delay = 0.0  # seconds between 64 KiB chunks, to make transfers overlap
        self.gets: Counter[str] = Counter()
        self.ranges: list[tuple[str, str | None]] = []
        self.served: Counter[str] = Counter()
        self.lock = threading.Lock()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class _Handler(BaseHTTPRequestHandler):
    server: WeightsServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        name = self.path.lstrip("/")
        rng = self.headers.get("Range")
        with srv.lock:
            srv.gets[name] += 1
            srv.ranges.append((name, rng))
            cut = srv.cut_once.pop(name, None)
        data = srv.files.get(name)
        if data is None:
            self.send_error(404)
            return
        if name in srv.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        if rng:
            match = re.fullmatch(r"bytes=(\d+)-", rng)
            assert match, rng
            start = int(match.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cut is not None:
            body = body[:cut]  # then the handler returns and HTTP/1.0 closes the connection
        for i in range(0, len(body), 1 << 16):
            piece = body[i : i + (1 << 16)]
            self.wfile.write(piece)
            with srv.lock:
                srv.served[name] += len(piece)
            if srv.chunk_delay:
                time.sleep(srv.chunk_delay)


@pytest.fixture
def server() -> Iterator[WeightsServer]:
    srv = WeightsServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _served(srv: WeightsServer, name: str, data: bytes) -> WeightFile:
    srv.files[name] = data
    return WeightFile(name, hashlib.sha256(data).hexdigest(), len(data), srv.url(name))


def _on_disk(tmp_path: Path, name: str, data: bytes) -> WeightFile:
    path = tmp_path / "source" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return WeightFile(name, hashlib.sha256(data).hexdigest(), len(data), path.as_uri())


def _blob_names(cache: WeightsCache) -> list[str]:
    return sorted(p.name for p in cache.blobs.iterdir())


def _age(cache: WeightsCache, version: str, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    os.utime(cache.version_dir(version) / ".last_used", (stamp, stamp))


def test_it_fetches_a_file_uri(tmp_path: Path) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    f = _on_disk(tmp_path, "config.json", b'{"hidden_size": 64}')
    nested = _on_disk(tmp_path, "shards/model-1.safetensors", os.urandom(5000))

    vdir = cache.fetch("v1", [f, nested])

    assert (vdir / "config.json").read_bytes() == b'{"hidden_size": 64}'
    assert (vdir / "shards/model-1.safetensors").stat().st_size == 5000
    assert (cache.blob_path(nested.sha256)).is_file()
    assert cache.versions() == ["v1"]


def test_it_fetches_over_http_verified_and_reports_progress(
    tmp_path: Path, server: WeightsServer
) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    data = os.urandom(300_000)
    f = _served(server, "model.safetensors", data)
    seen: list[Progress] = []

    vdir = cache.fetch("v1", [f], progress=seen.append)

    assert (vdir / "model.safetensors").read_bytes() == data
    assert seen[-1] == Progress("model.safetensors", 300_000, 300_000, 300_000, 300_000)
    assert server.gets["model.safetensors"] == 1


def test_it_stores_a_file_shared_by_two_versions_once(
    tmp_path: Path, server: WeightsServer
) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    shared = _served(server, "tokenizer.json", os.urandom(2000))

    a = cache.fetch("va", [shared, _served(server, "a.bin", b"a" * 100)])
    b = cache.fetch("vb", [shared, _served(server, "b.bin", b"b" * 100)])

    assert server.gets["tokenizer.json"] == 1
    assert (a / "tokenizer.json").stat().st_ino == (b / "tokenizer.json").stat().st_ino
    assert cache.blob_path(shared.sha256).stat().st_nlink == 3


def test_it_rejects_a_hash_mismatch_and_keeps_nothing_of_it(
    tmp_path: Path, server: WeightsServer
) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    f = _served(server, "model.safetensors", os.urandom(10_000))
    server.corrupt.add("model.safetensors")

    with pytest.raises(HashMismatch) as exc:
        cache.fetch("v1", [f])

    message = str(exc.value)
    assert "model.safetensors" in message
    assert f.sha256 in message
    actual = hashlib.sha256(
        bytes([server.files["model.safetensors"][0] ^ 0xFF]) + server.files["model.safetensors"][1:]
    ).hexdigest()
    assert actual in message
    assert _blob_names(cache) == []
    assert list(cache.versions_dir.iterdir()) == []


def test_it_resumes_a_truncated_download_with_a_range_request(
    tmp_path: Path, server: WeightsServer
) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    data = os.urandom(300_000)
    f = _served(server, "model.safetensors", data)
    server.cut_once["model.safetensors"] = 100_000

    vdir = cache.fetch("v1", [f])

    assert (vdir / "model.safetensors").read_bytes() == data
    assert server.ranges == [("model.safetensors", None), ("model.safetensors", "bytes=100000-")]
    assert server.served["model.safetensors"] < 2 * len(data)
    assert _blob_names(cache) == [f.sha256, f"{f.sha256}.lock"]


def test_it_gives_up_after_its_retries_and_keeps_the_partial_for_later(
    tmp_path: Path, server: WeightsServer
) -> None:
    cache = WeightsCache(root=tmp_path / "cache", retries=0)
    data = os.urandom(300_000)
    f = _served(server, "model.safetensors", data)
    server.cut_once["model.safetensors"] = 100_000

    with pytest.raises(DownloadError, match=r"model\.safetensors"):
        cache.fetch("v1", [f])
    assert cache.blob_path(f.sha256).with_name(f"{f.sha256}.part").stat().st_size == 100_000
    assert cache.versions() == []

    cache.fetch("v1", [f])
    assert server.ranges[-1] == ("model.safetensors", "bytes=100000-")


_FETCH = """
import json, sys
from pathlib import Path
from workers.weights import WeightFile, WeightsCache
cache = WeightsCache(root=Path(sys.argv[1]))
files = [WeightFile.from_dict(f) for f in json.loads(sys.argv[3])]
print(cache.fetch(sys.argv[2], files))
"""


def test_two_processes_fetching_one_version_download_each_file_once(
    tmp_path: Path, server: WeightsServer
) -> None:
    root = tmp_path / "cache"
    files = [_served(server, f"shard-{i}.bin", os.urandom(256 * 1024)) for i in range(3)]
    server.chunk_delay = 0.05
    manifest = json.dumps([f.__dict__ for f in files])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FETCH, str(root), "v1", manifest],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]

    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == str(root / "versions" / "v1")
    assert server.gets == Counter({f.path: 1 for f in files})
    for f in files:
        assert (root / "versions" / "v1" / f.path).read_bytes() == server.files[f.path]


def _three_versions(tmp_path: Path) -> WeightsCache:
    cache = WeightsCache(root=tmp_path / "cache")
    for i, version in enumerate(["v1", "v2", "v3"]):
        cache.fetch(version, [_on_disk(tmp_path, f"{version}.bin", os.urandom(1000))])
        _age(cache, version, seconds_ago=300 - 100 * i)
    return cache


def test_it_evicts_the_least_recently_used_version_above_the_limit(tmp_path: Path) -> None:
    cache = _three_versions(tmp_path)
    v1_blob = next(cache.version_dir("v1").glob("*.bin")).stat().st_ino

    evicted = WeightsCache(root=cache.root, max_bytes=2500).evict()

    assert evicted == ["v1"]
    assert cache.versions() == ["v2", "v3"]
    assert cache.size_bytes() == 2000
    assert all(p.stat().st_ino != v1_blob for p in cache.blobs.iterdir())


def test_it_never_evicts_a_version_in_use(tmp_path: Path) -> None:
    cache = _three_versions(tmp_path)
    limited = WeightsCache(root=cache.root, max_bytes=2500)

    with cache.use("v1") as vdir:
        _age(cache, "v1", seconds_ago=300)
        assert limited.evict() == ["v2"]
        assert (vdir / "v1.bin").stat().st_size == 1000
    assert cache.versions() == ["v3", "v1"]


_HOLD = """
import sys
from pathlib import Path
from workers.weights import WeightsCache
with WeightsCache(root=Path(sys.argv[1])).use(sys.argv[2]):
    print("ready", flush=True)
    sys.stdin.read()
"""


def test_it_never_evicts_a_version_another_process_uses(tmp_path: Path) -> None:
    cache = _three_versions(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(cache.root), "v1"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"ready\n"
        _age(cache, "v1", seconds_ago=300)

        assert WeightsCache(root=cache.root, max_bytes=2500).evict() == ["v2"]
        assert "v1" in cache.versions()
    finally:
        holder.communicate(b"", timeout=60)
    assert holder.returncode == 0


def test_a_blob_shared_by_two_versions_survives_evicting_one(tmp_path: Path) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    shared = _on_disk(tmp_path, "shared.bin", os.urandom(1000))
    only_a = _on_disk(tmp_path, "a.bin", os.urandom(1000))
    cache.fetch("va", [shared, only_a])
    cache.fetch("vb", [shared, _on_disk(tmp_path, "b.bin", os.urandom(1000))])
    _age(cache, "va", seconds_ago=200)
    _age(cache, "vb", seconds_ago=100)

    assert WeightsCache(root=cache.root, max_bytes=2500).evict() == ["va"]

    assert (cache.version_dir("vb") / "shared.bin").read_bytes() == (
        tmp_path / "source" / "shared.bin"
    ).read_bytes()
    assert cache.blob_path(shared.sha256).is_file()
    assert not cache.blob_path(only_a.sha256).exists()


def test_use_without_files_refuses_a_version_not_in_the_cache(tmp_path: Path) -> None:
    cache = WeightsCache(root=tmp_path / "cache")

    with pytest.raises(WeightsError, match="not in the cache"), cache.use("v9"):
        pass


def test_it_rejects_a_path_that_escapes_the_version(tmp_path: Path) -> None:
    cache = WeightsCache(root=tmp_path / "cache")
    f = _on_disk(tmp_path, "x.bin", b"x")

    with pytest.raises(WeightsError, match="invalid file path"):
        cache.fetch("v1", [WeightFile("../x.bin", f.sha256, f.size, f.uri)])


def _registered(tmp_path: Path, server: WeightsServer, **fields: Any) -> ModelVersion:
    """Register a small version whose files the server also serves, at its weights URI."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (source / "weights.bin").write_bytes(os.urandom(4096))
    for path in source.iterdir():
        server.files[f"small/{path.name}"] = path.read_bytes()
    version, _ = model_version_register(
        model_name="small", source_dir=source, weights_uri=server.url("small/"), **fields
    )
    return version


@pytest.fixture
def host_cache(tmp_path: Path, settings: Any) -> Path:
    settings.ROUNDHOUSE_WEIGHTS_CACHE_DIR = tmp_path / "host-cache"
    return settings.ROUNDHOUSE_WEIGHTS_CACHE_DIR


@pytest.mark.django_db
def test_fetch_weights_prefetches_a_registered_version_from_its_uri(
    tmp_path: Path, server: WeightsServer, host_cache: Path
) -> None:
    version = _registered(tmp_path, server, label="v1")
    out = io.StringIO()

    call_command("fetch_weights", "small@v1", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0] == f"{version.public_name}:"
    assert lines[1].startswith("  config.json ")
    assert lines[2].startswith("  weights.bin  4096 bytes")
    assert f"2 files in {host_cache}" in lines[3]
    assert server.gets == Counter({"small/config.json": 1, "small/weights.bin": 1})
    cached = host_cache / "versions" / version.digest / "weights.bin"
    assert cached.read_bytes() == server.files["small/weights.bin"]
    # The worker that starts later finds it there and downloads nothing.
    assert version_fetch(version=version) == cached.parent
    assert sum(server.gets.values()) == 2


@pytest.mark.django_db
def test_a_worker_refuses_a_version_whose_source_does_not_match_its_manifest(
    tmp_path: Path, server: WeightsServer, host_cache: Path
) -> None:
    version = _registered(tmp_path, server)
    server.corrupt.add("small/weights.bin")
    with pytest.raises(ArtifactError, match=r"weights\.bin \(sha256 mismatch\)"):
        version_fetch(version=version)
    assert not (host_cache / "versions" / version.digest).exists()


@pytest.mark.django_db
def test_a_cached_copy_changed_on_disk_is_fetched_again(
    tmp_path: Path, server: WeightsServer, host_cache: Path
) -> None:
    version = _registered(tmp_path, server)
    # Fetched (and pinned) by another process earlier, then altered on this host's disk.
    cache = WeightsCache(root=host_cache)
    cache.fetch(version.digest, weight_files(version=version))
    cached = host_cache / "versions" / version.digest / "weights.bin"
    cached.write_bytes(b"tampered")

    assert version_fetch(version=version) == cached.parent
    assert cached.read_bytes() == server.files["small/weights.bin"]
    assert server.gets["small/weights.bin"] == 2


def test_messages_show_no_credentials_or_signatures_of_a_uri():
    signed = "https://user:s3cret@store.example.com:8443/v/model.bin?X-Sig=abc123&expires=9"
    assert uri_shown(signed) == "https://store.example.com:8443/v/model.bin"
    assert uri_shown("file:///srv/artifacts/x/model.bin") == "file:///srv/artifacts/x/model.bin"
