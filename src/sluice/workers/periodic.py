"""Periodic: a daemon thread that calls ``tick()`` every ``interval`` seconds until stopped.

The worker's watchdog, heartbeat and orphan reaper are each one of these. A failing tick is
logged and the next one runs: a background duty that dies silently is worse than a noisy one.
Whatever talks to Redis runs on the thread itself, never on the caller of :meth:`stop`: a tick
or :meth:`finish` may be waiting out a Redis outage (about two minutes a command), and a worker
told to stop must not wait with it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

log = logging.getLogger("sluice.worker")


class Periodic(threading.Thread, ABC):
    """Subclasses implement :meth:`tick`; ``tick_first`` runs one tick before the first wait."""

    tick_first = False

    def __init__(self, name: str, interval: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self._stop_event = threading.Event()

    @abstractmethod
    def tick(self) -> object:
        """One round of the duty."""

    def run(self) -> None:
        if self.tick_first:
            self._safe_tick()
        while not self._stop_event.wait(self.interval):
            self._safe_tick()
        try:
            self.finish()
        except Exception:
            log.exception("%s failed to finish", self.name)

    def finish(self) -> None:
        """Runs once on this thread after the last tick, once stopped (a last write, say)."""

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:
            log.exception("%s failed; it runs again in %.2fs", self.name, self.interval)

    def stop(self, wait: float = 0.0) -> None:
        """Tick no more; wait up to ``wait`` seconds for the tick in progress and :meth:`finish`.
        Past that the thread is left to end on its own (a daemon: it cannot hold up an exit)."""
        self._stop_event.set()
        if wait > 0 and self.is_alive():
            self.join(wait)
