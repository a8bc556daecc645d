"""Quarantine: stop feeding a worker that keeps failing a run's chunks for infrastructure reasons.

Every retried or failed chunk's attempt history names the worker of each failed attempt; a
worker with ``after`` such failures has its consumer of the run's queue cancelled (Celery's
``cancel_consumer``), never the last healthy worker, and is listed in the checkpoint.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sluice.client.batch.progress import Progress
from sluice.tasks.history import read_many


class Quarantine:
    """Counts infrastructure failures per worker, from the chunks' attempt histories."""

    def __init__(self, app: Any, queue: str, after: int, progress: Progress) -> None:
        self.app, self.queue, self.after, self.progress = app, queue, after, progress
        self.failures: Counter[str] = Counter()
        self._seen: set[tuple[str, int]] = set()

    def observe(self, chunk_ids: list[str]) -> None:
        """Count the attempts of ``chunk_ids`` not counted yet (their histories read in one round
        trip), then :meth:`decide`."""
        if chunk_ids:
            for chunk_id, history in read_many(self.app.redis, chunk_ids).items():
                for attempt in history:
                    marker = (chunk_id, attempt.attempt)
                    if marker not in self._seen:
                        self._seen.add(marker)
                        self.failures[attempt.worker] += 1
        self.decide()

    def decide(self) -> None:
        """Quarantine each worker at the limit, unless no other worker is healthy: one that has
        delivered a record and is not quarantined. Run after every count and every poll, since
        the healthy peer's first record may come after the last failure was counted."""
        quarantined = self.progress.quarantined
        for worker, count in self.failures.items():
            healthy = set(self.progress.per_worker) - set(quarantined) - {worker}
            if count >= self.after and worker not in quarantined and healthy:
                quarantined.append(worker)
                self.app.control.cancel_consumer(self.queue, destination=[worker])
