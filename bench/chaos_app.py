"""The `.delay()` side of bench/chaos.py: one task that marks its start and its completion in
files (see bench/chaos_task.py) and retries what infrastructure did to it."""

from __future__ import annotations

import time

from bench.chaos_task import mark
from sluice import App, Backoff, RetryOn, RetryPolicy

app = App("bench.chaos")


@app.task(bind=True, name="bench.chaos.step",
          retry=RetryPolicy(max_retries=10, retry_on=RetryOn.TRANSIENT, backoff=Backoff(initial=0.2, maximum=1.0)))
def step(self, seconds: float, marks_dir: str) -> None:
    mark(marks_dir, "start", self.request.id)
    time.sleep(seconds)
    mark(marks_dir, "done", self.request.id)
