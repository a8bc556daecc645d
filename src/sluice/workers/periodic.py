"""Periodic: a daemon thread that calls ``tick()`` every ``interval`` seconds until stopped.

The worker's watchdog, heartbeat and orphan reaper are each one of these. A failing tick is
logged and the next one runs: a background duty that dies silently is worse than a noisy one.
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

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:
            log.exception("%s failed; it runs again in %.2fs", self.name, self.interval)

    def stop(self) -> None:
        self._stop_event.set()
