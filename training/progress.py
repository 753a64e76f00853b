"""Progress inside a long step, so that silence never means "hung".

A step can take minutes (torch.compile's first step on a GPU, big shapes in the Triton
interpreter on a CPU). Two things speak up while one runs:
- a first step expected to be long announces each phase as it starts (micro-batch i/n forward,
  backward, the optimizer step), with the time spent so far;
- a heartbeat thread logs where any step is once it has run `first_every_s`, then again at doubling
  intervals up to `max_every_s`, so a run of hour-long steps prints a few lines an hour, not none.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from training.estimate import duration

log = logging.getLogger(__name__)

ANNOUNCE_ABOVE_S = 10.0  # a first step expected to take longer than this announces its phases


class StepProgress:
    """Tracks the running step's phase (set from the training thread) and reports on it."""

    def __init__(self, expected_s: float | None = None, first_every_s: float = 30.0, max_every_s: float = 600.0,
                 enabled: bool = True) -> None:
        self.expected_s = expected_s  # the start-up estimate of one step (None: not estimated, e.g. on a GPU)
        self.first_every_s, self.max_every_s, self.enabled = first_every_s, max_every_s, enabled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step: int | None = None  # 1-based number of the running step; None between steps
        self._phase = ""
        self._started = self._next_report = 0.0
        self._interval = first_every_s
        self._announce = False
        self._first_note = ""

    def __enter__(self) -> StepProgress:
        if self.enabled:
            self._thread = threading.Thread(target=self._heartbeat, name="step-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def begin(self, step: int, announce: bool = False, note: str = "") -> None:
        """Step `step` (1-based) starts; `announce`: log each of its phases as it begins."""
        with self._lock:
            self._step, self._phase, self._announce = step, "starting", announce and self.enabled
            self._started = time.monotonic()
            self._interval = self.first_every_s
            self._next_report = self._started + self._interval
            expected = f"estimated ~{duration(self.expected_s)} per step" if self.expected_s else ""
            self._first_note = "; ".join(filter(None, [expected, note]))  # told with the step's first phase

    def phase(self, text: str) -> None:
        """What the running step does now, e.g. "micro-batch 1/4 forward"."""
        with self._lock:
            self._phase = text
            step, announce, spent = self._step, self._announce, time.monotonic() - self._started
            note, self._first_note = self._first_note or f"{duration(spent)} into the step", ""
        if announce and step is not None:
            log.info("step %d: %s (%s)", step, text, note)

    def end(self) -> None:
        with self._lock:
            self._step = None

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.first_every_s / 4)):
            with self._lock:
                if self._step is None or time.monotonic() < self._next_report:
                    continue
                step, phase, spent = self._step, self._phase, time.monotonic() - self._started
                self._interval = min(2 * self._interval, self.max_every_s)
                self._next_report = time.monotonic() + self._interval
            expected = f" of ~{duration(self.expected_s)} estimated" if self.expected_s else ""
            log.info("step %d: still running (%s), %s in%s", step, phase, duration(spent), expected)
