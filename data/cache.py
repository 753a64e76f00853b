"""Build-once cache entries: a metadata json that vouches for the files, and a build lock.

An entry is one or more files plus `<entry>.meta.json`, written last, that records each file's size
and sha256. Loading re-checks both, so a truncated copy, a file left half-written by a killed run or
one edited by hand is rebuilt (with a warning) instead of being trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from data.files import atomic_write

log = logging.getLogger(__name__)


def digest(*parts: Any) -> str:
    """Short stable hash of JSON-serialisable parts: the key that names a cache entry."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_meta(meta_path: Path, files: list[Path], info: dict[str, Any]) -> None:
    """Record size and sha256 of `files` (siblings of `meta_path`); call after they are complete."""
    records = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
    atomic_write(meta_path, json.dumps({"files": records, **info}, indent=1))


def load_meta(meta_path: Path) -> dict[str, Any] | None:
    """The metadata of an intact entry, or None when it must be (re)built (reason logged if it existed)."""
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        for name, record in meta["files"].items():
            path = meta_path.parent / name
            if not path.exists():
                problem = "is missing"
            elif path.stat().st_size != record["size"]:
                problem = f"has {path.stat().st_size} bytes, {meta_path.name} says {record['size']}"
            elif sha256_file(path) != record["sha256"]:
                problem = f"does not match the sha256 in {meta_path.name}"
            else:
                continue
            log.warning("cache file %s %s (stale or corrupted); rebuilding it", path, problem)
            return None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        log.warning("cache metadata %s is unreadable (%s); rebuilding the entry", meta_path, err)
        return None
    return meta


@contextlib.contextmanager
def build_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive lock so that concurrent runs (DDP ranks, sweep jobs) build an entry once; others wait."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path):  # released when the block ends, or by the OS when the process dies
        yield
