"""Writing a file so that readers see the old version or the new one, never half of one.

Every writer in the project (token cache, tokenizer, checkpoints, run summaries, result JSON)
goes through here: write to a temporary name in the same folder (same file system, so the final
`os.replace` is atomic on POSIX), rename over the target on success, remove the temporary file on
failure. The temporary name carries the pid, so two processes writing one target never share it.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `path`; whatever is written there replaces `path` when the
    block ends without an exception (for writers that want a path: torch.save, np.memmap, …)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there if the block failed


def atomic_write(path: Path | str, data: str | bytes) -> None:
    """Replace `path` by `data` (text is written as UTF-8) in one atomic step."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
