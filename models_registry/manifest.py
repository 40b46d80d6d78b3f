"""Manifests: the content of a model version, hashed file by file, and its digest."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = 1
_CHUNK = 1 << 20


class ArtifactError(Exception):
    """A version's files do not match its manifest."""


def file_sha256(path: Path) -> str:
    """Return the hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_files(source_dir: Path) -> list[dict[str, Any]]:
    """Return every regular file under a directory with its size and hash, in path order."""
    files = []
    for path in sorted(p for p in source_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(source_dir).as_posix()
        files.append({"path": rel, "size": path.stat().st_size, "sha256": file_sha256(path)})
    return files


def manifest_digest(manifest: dict[str, Any]) -> str:
    """Return the version id: the SHA-256 of the canonical JSON of the manifest."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Mismatch:
    path: str
    reason: str


def manifest_verify(*, manifest: dict[str, Any], directory: Path) -> list[Mismatch]:
    """Return every file of the manifest that is missing, resized or changed in a directory."""
    problems = []
    for entry in manifest["files"]:
        path = directory / entry["path"]
        if not path.is_file():
            problems.append(Mismatch(entry["path"], "missing"))
        elif path.stat().st_size != entry["size"]:
            problems.append(Mismatch(entry["path"], "size changed"))
        elif file_sha256(path) != entry["sha256"]:
            problems.append(Mismatch(entry["path"], "sha256 mismatch"))
    return problems
