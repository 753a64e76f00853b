"""A reader for wandb's offline run file (offline-run-*/run-<id>.wandb): what `wandb sync` would upload.

wandb 0.31 writes it from its Go service and ships no Python reader. The format is LevelDB's log:
a 7-byte header (b":W&B", magic 0xBEE1 little-endian, version 0), then 32 KiB blocks of chunks,
each `crc32 (4 bytes LE) | length (2 bytes LE) | type (1 byte) | payload`, where crc32 is zlib's
over the type byte and the payload, and type says whether the chunk is a whole record (FULL) or the
FIRST, MIDDLE or LAST piece of one; a block's tail shorter than a chunk header is zero padding.
Each record is a serialized wandb.proto.wandb_internal_pb2.Record.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from wandb.proto import wandb_internal_pb2 as pb

HEADER = struct.Struct("<4sHB")  # ident, magic, version
MAGIC = 0xBEE1
CHUNK = struct.Struct("<IHB")  # crc32, payload length, type
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[pb.Record]:
    """The records of a .wandb file, in order; raises ValueError on a bad header, checksum or chunk order."""
    data = Path(path).read_bytes()
    ident, magic, version = HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", MAGIC, 0):
        raise ValueError(f"{path}: not a wandb run file (header {data[:HEADER.size]!r})")
    pos, pieces = HEADER.size, None
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # the block's tail cannot hold a chunk header: padding
            pos += left
            continue
        crc, length, kind = CHUNK.unpack_from(data, pos)
        if (crc, length, kind) == (0, 0, 0):  # zero padding up to the next block
            pos += left
            continue
        payload = data[pos + CHUNK.size : pos + CHUNK.size + length]
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: damaged chunk at byte {pos} (type {kind}, {length} bytes)")
        pos += CHUNK.size + length
        if kind == FULL:
            yield pb.Record.FromString(payload)
        elif kind == FIRST:
            pieces = [payload]
        elif kind in (MIDDLE, LAST) and pieces is not None:
            pieces.append(payload)
            if kind == LAST:
                yield pb.Record.FromString(b"".join(pieces))
                pieces = None
        else:
            raise ValueError(f"{path}: chunk type {kind} at byte {pos} out of order")


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


@dataclass
class OfflineRun:
    """What a run file says: the run record (id, name, group, ...), the config, the history rows
    (with their step), the summary after every update in order, the metric definitions and files."""

    run: pb.RunRecord
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[pb.MetricRecord] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    exit_code: int | None = None


def read_run(path: Path) -> OfflineRun:
    """Fold the records of one run file into an OfflineRun."""
    out = None
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out = OfflineRun(record.run)
            for item in record.run.config.update:
                out.config[_key(item)] = json.loads(item.value_json)
        elif out is None:
            continue  # the header comes before the run record
        elif kind == "config":
            for item in record.config.update:
                out.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            out.history.append({**row, "_step": record.history.step.num})
        elif kind == "summary":
            for item in record.summary.update:
                out.summary[_key(item)] = json.loads(item.value_json)
            for item in record.summary.remove:
                out.summary.pop(_key(item), None)
        elif kind == "metric":
            out.metrics.append(record.metric)
        elif kind == "files":
            out.files += [f.path for f in record.files.files]
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    if out is None:
        raise ValueError(f"{path}: no run record")
    return out


def offline_runs(run_folder: Path, timeout_s: float = 60) -> list[OfflineRun]:
    """Every offline run under <run_folder>/wandb, oldest first, once each file has its exit record.
    wandb's service process writes the file; on a loaded machine it may still be flushing when
    finish() returns, so this waits (up to timeout_s) for the exit record."""
    paths = sorted(Path(run_folder).glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout_s
    return [_read_closed(path, deadline) for path in paths]


def _read_closed(path: Path, deadline: float) -> OfflineRun:
    while True:
        try:
            run = read_run(path)
        except ValueError:  # a chunk still being written
            if time.monotonic() > deadline:
                raise
        else:
            if run.exit_code is not None or time.monotonic() > deadline:
                return run
        time.sleep(0.5)
