"""Stopping cleanly on SIGTERM (a scheduler's stop, `kill`) and SIGINT (Ctrl-C)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[str]]:
    """While training, SIGTERM and SIGINT are noted in the list this yields instead of ending the
    process: the loop finishes its step, saves a checkpoint and returns. A second signal acts as it
    would have (Ctrl-C twice stops at once). Outside the main thread, where Python cannot catch
    signals, this does nothing."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) or signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)  # logged by the loop: handlers should do little
        signal.signal(signum, previous[signum])

    for s in previous:
        signal.signal(s, note)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
