"""Weights cache: a worker's local, content-addressed copy of a model version's files.

Layout under the cache root:

    blobs/sha256/<hex>           one verified blob per distinct content
    blobs/sha256/<hex>.part      a download in progress, kept so a retry can resume it
    blobs/sha256/<hex>.lock      flock held while a blob is fetched, linked or removed
    versions/<digest>/...        the version's files, hard links to the blobs
    versions/<digest>/.in_use    shared flock held by every process using the version
    versions/<digest>/.last_used mtime is the version's last use, for LRU eviction

A version directory appears by an atomic rename of a fully built staging directory, so a
directory under versions/ always holds every file, verified. A blob whose link count is 1 is
referenced by no version and may be removed. No Django, so any process can use it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse, urlunparse
from urllib.request import url2pathname

import httpx

from models_registry.manifest import file_sha256

_CHUNK = 1 << 20
_IN_USE = ".in_use"
_LAST_USED = ".last_used"
_RESERVED = {_IN_USE, _LAST_USED}
_VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class WeightsError(Exception):
    """A version's files could not be fetched into the cache."""


class HashMismatch(WeightsError):
    """A fetched file's bytes do not have the SHA-256 its manifest names."""

    def __init__(self, f: WeightFile, actual: str) -> None:
        super().__init__(
            f"{f.path}: sha256 mismatch, expected {f.sha256}, got {actual} "
            f"(from {uri_shown(f.uri)})"
        )
        self.path = f.path


class DownloadError(WeightsError):
    """A file could not be downloaded completely, even after resuming."""


@dataclass(frozen=True)
class WeightFile:
    path: str
    sha256: str
    size: int
    uri: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightFile:
        """Return the file described by a manifest entry {path, sha256, size, uri}."""
        return cls(
            path=str(data["path"]),
            sha256=str(data["sha256"]).lower(),
            size=int(data["size"]),
            uri=str(data["uri"]),
        )


@dataclass(frozen=True)
class Progress:
    """Bytes fetched so far: of the current file, and of the whole version."""

    path: str
    file_done: int
    file_size: int
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


class WeightsCache:
    """A local content-addressed cache of model versions, shared by the processes of a host."""

    def __init__(
        self,
        *,
        root: Path,
        max_bytes: int | None = None,
        retries: int = 3,
        timeout: float = 30.0,
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.retries = retries
        self.timeout = timeout
        self.blobs = self.root / "blobs" / "sha256"
        self.versions_dir = self.root / "versions"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.versions_dir.mkdir(parents=True, exist_ok=True)

    # -- versions -------------------------------------------------------------------------

    def version_dir(self, version: str) -> Path:
        """Return where a version's files live (whether or not it is cached)."""
        _check_version(version)
        return self.versions_dir / version

    def versions(self) -> list[str]:
        """Return the cached versions, least recently used first."""
        found = [p for p in self.versions_dir.iterdir() if _is_version_dir(p)]
        return [p.name for p in sorted(found, key=_last_used)]

    def fetch(
        self,
        version: str,
        files: Iterable[WeightFile],
        *,
        progress: ProgressCallback | None = None,
    ) -> Path:
        """Fetch every file of a version into the cache, verified; return the version directory.

        Files already cached (in this version or as a blob of another) are not fetched again.
        Raises HashMismatch or DownloadError naming the file; nothing of it is kept then.
        Hold `use()` to keep the version from being evicted.
        """
        vdir = self.version_dir(version)
        wanted = list(files)
        for f in wanted:
            _check_file(f)
        if not vdir.is_dir():
            self._version_build(version, wanted, progress)
        elif progress is not None:
            total = sum(f.size for f in wanted)
            for f in wanted:
                progress(Progress(f.path, f.size, f.size, total, total))
        _touch(vdir / _LAST_USED)
        self.evict(keep={version})
        return vdir

    @contextmanager
    def use(
        self,
        version: str,
        files: Iterable[WeightFile] | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> Iterator[Path]:
        """Pin a version in the cache for the block; yield its directory.

        With files, fetch the version first when it is missing; without, raise WeightsError.
        """
        wanted = list(files) if files is not None else None
        vdir = self.version_dir(version)
        while True:
            if wanted is not None and not vdir.is_dir():
                self.fetch(version, wanted, progress=progress)
            try:
                fd = _lock(vdir / _IN_USE, exclusive=False, create=False)
            except (FileNotFoundError, NotADirectoryError):
                # Evicted between the fetch and the lock: fetch it again.
                if wanted is None:
                    raise WeightsError(f"version {version} is not in the cache") from None
                continue
            break
        assert fd is not None
        try:
            _touch(vdir / _LAST_USED)
            yield vdir
        finally:
            _touch(vdir / _LAST_USED)
            os.close(fd)

    def _version_build(
        self, version: str, files: list[WeightFile], progress: ProgressCallback | None
    ) -> None:
        staging = self.versions_dir / f".staging-{version}-{uuid.uuid4().hex}"
        staging.mkdir()
        # Held while building, so eviction can tell a live staging dir from a crashed one.
        fd = _lock(staging / _IN_USE, exclusive=True)
        assert fd is not None
        try:
            total = sum(f.size for f in files)
            done = 0
            for f in files:
                base = done

                def report(n: int, f: WeightFile = f, base: int = base) -> None:
                    if progress is not None:
                        progress(Progress(f.path, n, f.size, base + n, total))

                self._blob_link(f, staging / f.path, report)
                done += f.size
            _touch(staging / _LAST_USED)
            try:
                os.rename(staging, self.versions_dir / version)
            except OSError as exc:
                # Another process finished the same version first; its copy is as good.
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            os.close(fd)

    # -- blobs ----------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        """Return where the blob of a content hash lives."""
        return self.blobs / sha256

    def _blob_link(self, f: WeightFile, dest: Path, report: Callable[[int], None]) -> None:
        """Make dest a link to the verified blob of f, fetching the blob unless it exists."""
        blob = self.blob_path(f.sha256)
        lock = _sibling(blob, ".lock")
        dest.parent.mkdir(parents=True, exist_ok=True)
        # The lock is held through the link: an unlinked blob (link count 1) is fair game for
        # eviction, and a second process must wait here rather than download it again.
        with _locked(lock):
            if not blob.is_file():
                part = _sibling(blob, ".part")
                try:
                    self._download(f, part, report)
                    actual = file_sha256(part)
                    if actual != f.sha256:
                        raise HashMismatch(f, actual)
                except HashMismatch:
                    part.unlink(missing_ok=True)
                    lock.unlink(missing_ok=True)
                    raise
                os.replace(part, blob)
            _link_or_copy(blob, dest)
        report(f.size)

    def _download(self, f: WeightFile, part: Path, report: Callable[[int], None]) -> None:
        scheme = urlparse(f.uri).scheme
        if scheme == "file":
            _copy_file(_file_uri_path(f.uri), part, report)
        elif scheme in ("http", "https"):
            self._download_http(f, part, report)
        else:
            raise WeightsError(f"{f.path}: unsupported uri scheme in {uri_shown(f.uri)!r}")

    def _download_http(self, f: WeightFile, part: Path, report: Callable[[int], None]) -> None:
        """Download a file to part, resuming what part holds; retry a cut-off transfer."""
        last_error = ""
        with httpx.Client(timeout=self.timeout, follow_redirects=True) as client:
            for _attempt in range(self.retries + 1):
                have = part.stat().st_size if part.exists() else 0
                if have > f.size:
                    have = 0
                    part.unlink()
                if have == f.size and have > 0:
                    return
                # Identity encoding, so that byte offsets are offsets into the file.
                headers = {"Accept-Encoding": "identity"}
                if have:
                    headers["Range"] = f"bytes={have}-"
                try:
                    with client.stream("GET", f.uri, headers=headers) as response:
                        have = _response_start(response, have, f)
                        with part.open("ab" if have else "wb") as out:
                            # Unchunked, so every byte received is on disk before a cut.
                            for chunk in response.iter_raw():
                                out.write(chunk)
                                have += len(chunk)
                                report(have)
                except httpx.TransportError as exc:
                    # What arrived is in part; the next attempt asks for the rest.
                    last_error = f"{type(exc).__name__}: {exc}"
                    continue
                if have >= f.size:
                    return
                last_error = f"connection closed after {have} of {f.size} bytes"
        raise DownloadError(
            f"{f.path}: download from {uri_shown(f.uri)} incomplete after "
            f"{self.retries + 1} attempts "
            f"({last_error})"
        )

    # -- eviction -------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Return the bytes the cache holds on disk, counting each hard-linked file once."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
        return total

    def evict(self, *, keep: Iterable[str] = ()) -> list[str]:
        """Evict least recently used versions until the cache fits max_bytes; return them.

        Never evicts a version in use (a process holds `use()` on it) nor one in keep. After
        each version, blobs no version links to any more are removed too.
        """
        if self.max_bytes is None:
            return []
        kept = set(keep)
        evicted: list[str] = []
        with _locked(self.root / ".evict.lock"):
            if self.size_bytes() <= self.max_bytes:
                return []
            # Orphaned partial downloads go too: over the limit, space beats a later resume.
            self._garbage_collect()
            for version in self.versions():
                if self.size_bytes() <= self.max_bytes:
                    break
                if version not in kept and self._version_remove(version):
                    evicted.append(version)
                    self._garbage_collect()
        return evicted

    def remove(self, version: str) -> bool:
        """Remove a version and the blobs only it used, unless a process uses it."""
        with _locked(self.root / ".evict.lock"):
            removed = self._version_remove(version)
            if removed:
                self._garbage_collect()
        return removed

    def _version_remove(self, version: str) -> bool:
        """Remove a version unless a process uses it; return whether it was removed."""
        vdir = self.versions_dir / version
        try:
            fd = _lock(vdir / _IN_USE, exclusive=True, wait=False, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if fd is None:
            return False
        try:
            trash = self.versions_dir / f".trash-{uuid.uuid4().hex}"
            os.rename(vdir, trash)
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def _garbage_collect(self) -> None:
        """Remove unreferenced blobs, orphaned partial downloads and abandoned directories."""
        for path in self.versions_dir.iterdir():
            if path.name.startswith(".trash-"):
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith(".staging-"):
                fd = _try_lock(path / _IN_USE)
                if fd is not None:
                    shutil.rmtree(path, ignore_errors=True)
                    os.close(fd)
        for path in self.blobs.iterdir():
            if path.suffix == ".lock":
                continue
            if path.suffix == "" and _link_count(path) != 1:
                continue
            blob = self.blob_path(path.name.split(".")[0])
            lock = _sibling(blob, ".lock")
            fd = _try_lock(lock, create=True)
            if fd is None:
                continue
            try:
                if path.suffix == ".part" or _link_count(path) == 1:
                    path.unlink(missing_ok=True)
                    if not blob.exists():
                        lock.unlink(missing_ok=True)
            finally:
                os.close(fd)


def uri_shown(uri: str) -> str:
    """Return a URI fit for messages and logs: no credentials, no query (signed URLs)."""
    parsed = urlparse(uri)
    host = parsed.hostname or ""
    if parsed.port:
        host = f"{host}:{parsed.port}"
    return urlunparse((parsed.scheme, host, parsed.path, "", "", ""))


# -- files and locks ----------------------------------------------------------------------


def _lock(path: Path, *, exclusive: bool, wait: bool = True, create: bool = True) -> int | None:
    """Open and flock a lock file; return its descriptor, or None when busy and not waiting.

    Locking again when the file was replaced or removed meanwhile lets a holder unlink it.
    Raises FileNotFoundError when create is False and the file is (or becomes) missing.
    """
    op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    while True:
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            current = os.stat(path)
            held = os.fstat(fd)
            same = (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        if not create:
            raise FileNotFoundError(errno.ENOENT, "lock file removed", str(path))


def _try_lock(path: Path, *, create: bool = False) -> int | None:
    """Return an exclusive lock on a lock file, or None when it is held (or gone)."""
    try:
        return _lock(path, exclusive=True, wait=False, create=create)
    except (FileNotFoundError, NotADirectoryError):
        return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on a lock file for the block, waiting for it."""
    fd = _lock(path, exclusive=True)
    assert fd is not None
    try:
        yield
    finally:
        os.close(fd)


def _response_start(response: httpx.Response, have: int, f: WeightFile) -> int:
    """Return the offset a response's body starts at: have for a matching 206, else 0."""
    if response.status_code == 206:
        match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
        if match and int(match.group(1)) == have:
            return have
        raise DownloadError(f"{f.path}: server answered a range other than bytes={have}-")
    if response.status_code == 200:
        return 0
    raise DownloadError(f"{f.path}: GET {uri_shown(f.uri)} answered {response.status_code}")


def _copy_file(source: Path, part: Path, report: Callable[[int], None]) -> None:
    if not source.is_file():
        raise WeightsError(f"no such file: {source}")
    done = 0
    with source.open("rb") as src, part.open("wb") as out:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            report(done)


def _file_uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise WeightsError(f"file uri on another host: {uri_shown(uri)!r}")
    return Path(url2pathname(unquote(parsed.path)))


def _link_or_copy(blob: Path, dest: Path) -> None:
    """Hard-link a blob into a version; copy it when the two are on different devices."""
    try:
        os.link(blob, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(blob, dest)


def _link_count(path: Path) -> int:
    try:
        return os.lstat(path).st_nlink
    except FileNotFoundError:
        return 0


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _touch(path: Path) -> None:
    # A version evicted meanwhile has nothing to touch; use() fetches it again.
    with contextlib.suppress(FileNotFoundError):
        path.touch()


def _last_used(vdir: Path) -> float:
    try:
        return (vdir / _LAST_USED).stat().st_mtime
    except FileNotFoundError:
        return vdir.stat().st_mtime


def _is_version_dir(path: Path) -> bool:
    return not path.name.startswith(".") and path.is_dir()


def _check_version(version: str) -> None:
    if not _VERSION_NAME.match(version):
        raise WeightsError(f"invalid version digest: {version!r}")


def _check_file(f: WeightFile) -> None:
    """Reject a file whose path would escape the version directory or shadow its bookkeeping."""
    rel = PurePosixPath(f.path)
    if rel.is_absolute() or not rel.parts or ".." in rel.parts or str(rel) in _RESERVED:
        raise WeightsError(f"invalid file path in manifest: {f.path!r}")
    if not _SHA256.match(f.sha256):
        raise WeightsError(f"{f.path}: invalid sha256 {f.sha256!r}")
    if f.size < 0:
        raise WeightsError(f"{f.path}: invalid size {f.size}")
