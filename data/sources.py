"""Corpora: documents (one per file, or per hub row) split into train and val `datasets.Dataset`s.

`data.source` picks the loader:
  stdlib  the Python standard library's own .py files: present on every machine, nothing to download
  text    local text files, directories or globs (`data.paths`)
  hf      a hub dataset through `datasets.load_dataset` (needs the network or the local HF cache)
The split is by document, decided by a hash of its name (path relative to the stdlib, the path as
resolved, or the row index): no file is half in each split, and every machine makes the same split.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import socket
import sys
import sysconfig
import threading
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlparse

import datasets
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

log = logging.getLogger(__name__)

Document = tuple[str, str]  # (name, text)

THIRD_PARTY_DIRS = {"site-packages", "dist-packages"}  # installed packages sit inside the stdlib dir
BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a file as binary (as git does)


@dataclass
class Corpus:
    train: datasets.Dataset  # column "text", one row per document
    val: datasets.Dataset
    fingerprints: dict[str, str]  # per split; change with any text, name or split assignment
    summary: str  # one line for the start-of-run log


def load_corpus(cfg: DictConfig) -> Corpus:
    """Read the corpus that `cfg.source` names and split it by document."""
    if not 0 < cfg.val_fraction < 1:
        raise ValueError(f"data.val_fraction={cfg.val_fraction} must be between 0 and 1 (exclusive)")
    if cfg.source == "hf":
        return _load_hub(cfg)
    if cfg.source == "stdlib":
        docs, where = _stdlib_documents(cfg)
    elif cfg.source == "text":
        docs, where = _text_documents(cfg)
    else:
        raise ValueError(f"data.source={cfg.source!r} is unknown; use stdlib, text, hf or synthetic")
    docs = _select(docs, cfg.max_files, cfg.max_bytes)
    train, val = _split(docs, cfg.val_fraction)
    megabytes = sum(len(text.encode()) for _, text in docs) / 1e6
    summary = f"{where}: {len(docs)} files, {megabytes:.1f} MB; by file {len(train)} train / {len(val)} val"
    return Corpus(_to_dataset(train), _to_dataset(val), {"train": _fingerprint(train), "val": _fingerprint(val)}, summary)


def unit_hash(salt: str, name: str) -> float:
    """A stable pseudo-random number in [0, 1) for a name: the same on every machine and run."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:8], "big") / 2**64


# --- files --------------------------------------------------------------------------------------


def _stdlib_documents(cfg: DictConfig) -> tuple[list[Document], str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    named: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in THIRD_PARTY_DIRS and d != "__pycache__")
        for filename in sorted(filenames):
            path = Path(dirpath, filename)
            rel = path.relative_to(root).as_posix()  # names the file the same way on every machine
            if filename.endswith(".py") and not any(fnmatch(rel, pattern) for pattern in cfg.exclude):
                named.append((rel, path))
    if not named:
        raise ValueError(f"no .py files under the stdlib directory {root} (data.exclude={list(cfg.exclude)})")
    docs, _ = _read_files(named)  # empty files (many __init__.py) are normal here: skip them quietly
    return docs, f"Python {sys.version.split()[0]} stdlib ({root})"


def _text_documents(cfg: DictConfig) -> tuple[list[Document], str]:
    if not cfg.paths:
        raise ValueError("data.paths is empty: list text files, directories or globs, e.g. data.paths='[notes/*.md,book.txt]'")
    files: dict[str, Path] = {}
    not_found = []
    for entry in cfg.paths:
        pattern = to_absolute_path(str(entry))  # relative to the launch directory, even if Hydra changes cwd
        if os.path.isdir(pattern):
            matches = sorted(p for p in Path(pattern).rglob("*") if p.is_file())
        else:
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            not_found.append(str(entry))
        files.update((str(p), p) for p in matches)
    if not_found:
        raise ValueError(f"data.paths: no file matches {not_found} (relative paths start at {to_absolute_path('.')})")
    docs, skipped = _read_files(sorted(files.items()))
    if skipped:
        log.warning("skipped %d file(s) with no text: %s", len(skipped), _some(skipped))
    if not docs:
        raise ValueError(f"data.paths: no text in the {len(files)} matching file(s): {_some(skipped)}")
    return docs, f"text files {list(cfg.paths)}"


def _read_files(named: list[tuple[str, Path]]) -> tuple[list[Document], list[str]]:
    """Decode files as UTF-8, replacing undecodable bytes; skip binary and blank ones (returned by name)."""
    docs, skipped, binary, replaced = [], [], [], []
    for name, path in named:
        raw = path.read_bytes()
        if b"\0" in raw[:BINARY_SNIFF_BYTES]:
            binary.append(name)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            replaced.append(name)
        if text.strip():
            docs.append((name, text))
        else:
            skipped.append(name)
    if binary:
        log.warning("skipped %d binary file(s) (NUL bytes): %s", len(binary), _some(binary))
    if replaced:
        log.info("%d file(s) are not valid UTF-8; undecodable bytes became U+FFFD: %s", len(replaced), _some(replaced))
    return docs, skipped + binary


def _some(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _select(docs: list[Document], max_files: int | None, max_bytes: int | None) -> list[Document]:
    """Keep a deterministic subset: files in path-hash order (a spread over all packages) up to the caps."""
    for key, cap in (("max_files", max_files), ("max_bytes", max_bytes)):
        if cap is not None and cap < 1:
            raise ValueError(f"data.{key}={cap} must be >= 1, or null for no limit")
    if max_files is None and max_bytes is None:
        return docs
    kept, total = [], 0
    for doc in sorted(docs, key=lambda d: unit_hash("order", d[0])):
        if (max_files is not None and len(kept) >= max_files) or (max_bytes is not None and total >= max_bytes):
            break
        kept.append(doc)
        total += len(doc[1].encode())
    return sorted(kept)


def _split(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """Val takes files in path-hash order while they fit in val_fraction of the bytes (so a few big
    files cannot swing the share); at least one file, and one file's tail when there is only one."""
    sizes = [len(text.encode()) for _, text in docs]
    if len(docs) == 1:  # one file (a book, a dump): hold out its tail, cut at a line break
        (name, text), = docs
        cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction))) + 1 or int(len(text) * (1 - val_fraction))
        log.info("one document only: its last %.0f%% is the val split", 100 * (len(text) - cut) / len(text))
        return [(name, text[:cut])], [(name + "#tail", text[cut:])]
    budget, val = val_fraction * sum(sizes), set()
    for i in sorted(range(len(docs)), key=lambda i: unit_hash("split", docs[i][0])):
        if sizes[i] <= budget:
            val.add(i)
            budget -= sizes[i]
    val = val or {min(range(len(docs)), key=sizes.__getitem__)}
    return [d for i, d in enumerate(docs) if i not in val], [d for i, d in enumerate(docs) if i in val]


def _fingerprint(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for name, text in docs:
        h.update(f"{len(name)}:{name}{len(text)}:".encode())  # lengths make the concatenation unambiguous
        h.update(text.encode())
    return h.hexdigest()[:16]


def _to_dataset(docs: list[Document]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"name": [n for n, _ in docs], "text": [t for _, t in docs]})


# --- hub ----------------------------------------------------------------------------------------


def _load_hub(cfg: DictConfig) -> Corpus:
    if not os.path.exists(cfg.dataset):  # a local folder (hub layout, or data files) needs no network
        _check_hub_reachable(cfg)
    try:
        ds = datasets.load_dataset(cfg.dataset, cfg.config, split=cfg.split)
    except (ConnectionError, FileNotFoundError) as err:  # offline without a cached copy, or a wrong name
        raise ValueError(_hub_help(cfg, f"{type(err).__name__}: {err}")) from err
    if cfg.text_field not in ds.column_names:
        raise ValueError(f"data.text_field={cfg.text_field!r} is not a column of {cfg.dataset}; it has {ds.column_names}")
    ds = ds.select_columns([cfg.text_field])
    if cfg.text_field != "text":
        ds = ds.rename_column(cfg.text_field, "text")
    if cfg.max_docs is not None:
        ds = ds.select(range(min(int(cfg.max_docs), len(ds))))
    ds = ds.filter(lambda texts: [bool(t and t.strip()) for t in texts], input_columns="text", batched=True)
    if len(ds) < 2:
        raise ValueError(f"{cfg.dataset} split {cfg.split!r} has {len(ds)} non-empty rows; need at least 2 (train and val)")
    train_idx, val_idx = _split_rows([f"row{i}" for i in range(len(ds))], cfg.val_fraction)
    train, val = ds.select(train_idx), ds.select(val_idx)
    summary = f"hub dataset {cfg.dataset} ({cfg.config}, {cfg.split}): {len(ds)} rows; by row {len(train)} train / {len(val)} val"
    # datasets fingerprints hub data by its cached files and every transform applied since.
    return Corpus(train, val, {"train": train._fingerprint, "val": val._fingerprint}, summary)


def _split_rows(names: list[str], val_fraction: float) -> tuple[list[int], list[int]]:
    """For many similar rows: val gets those whose hash falls below val_fraction; each split keeps >= 1."""
    scores = [unit_hash("split", name) for name in names]
    val = [i for i, s in enumerate(scores) if s < val_fraction]
    train = [i for i, s in enumerate(scores) if s >= val_fraction]
    if not val and len(train) > 1:
        val = [min(train, key=scores.__getitem__)]
        train.remove(val[0])
    if not train and len(val) > 1:
        train = [max(val, key=scores.__getitem__)]
        val.remove(train[0])
    return train, val


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _check_hub_reachable(cfg: DictConfig) -> None:
    """Fail in seconds, not after minutes of retries, when the hub cannot be reached."""
    if _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE"):
        return  # datasets then reads its local cache only and fails fast by itself
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
    outcome: list[BaseException | None] = []

    def probe() -> None:  # in a thread, because name resolution ignores socket timeouts
        try:
            socket.create_connection(address, timeout=cfg.connect_timeout_s).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(cfg.connect_timeout_s)
    if not outcome or outcome[0] is not None:
        reason = outcome[0] if outcome else f"no answer within data.connect_timeout_s={cfg.connect_timeout_s}"
        raise ValueError(_hub_help(cfg, f"cannot connect to {address[0]}:{address[1]}: {reason}"))


def _hub_help(cfg: DictConfig, reason: str) -> str:
    cache_hint = (
        "HF_HUB_OFFLINE is set, so only a cached copy would do, and there is none."
        if _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")
        else "If the dataset is already in your Hugging Face cache, set HF_HUB_OFFLINE=1 to use that copy."
    )
    return (
        f"data=hf could not load {cfg.dataset!r} ({reason}). Offline? Use data=text data.paths='[your/*.txt]' "
        f"for local files or the default data=stdlib (embedded). {cache_hint}"
    )
