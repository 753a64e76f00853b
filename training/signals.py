"""Stopping cleanly on SIGTERM (a scheduler's stop, `kill`) and SIGINT (Ctrl-C).

The first signal is acknowledged at once and stops the run after the current step (with a
checkpoint); a step can last minutes (the Triton interpreter), so the user must not be left
wondering whether it was seen. A second one stops now: it raises StopNow out of whatever the step
is doing, and the loop writes the summary (status interrupted) without touching the last
checkpoint, which is only ever replaced atomically.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any, Iterator

log = logging.getLogger(__name__)


class StopNow(KeyboardInterrupt):
    """A second SIGTERM/SIGINT during training: leave the step now. A KeyboardInterrupt, because
    code on the way re-raises those where it swallows anything else (tqdm's logging handler has a
    bare `except:` that lets only KeyboardInterrupt and SystemExit through)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def _again(name: str) -> str:
    return "press Ctrl-C again" if name == "SIGINT" else "send SIGTERM again"


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[str]]:
    """While training, SIGTERM and SIGINT are noted in the list this yields instead of ending the
    process: the loop finishes its step, saves a checkpoint and returns. A second signal raises
    StopNow. Outside the main thread, where Python cannot catch signals, this does nothing."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) or signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        received.append(name)
        if len(received) > 1:
            raise StopNow(name)
        # Python runs handlers in the main thread between bytecodes, and logging's locks are
        # re-entrant, so logging here is safe; it is what makes the acknowledgement immediate.
        log.info("%s: stopping after this step; %s to stop now", name, _again(name))

    for s in previous:
        signal.signal(s, note)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
