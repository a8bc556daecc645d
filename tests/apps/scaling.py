"""Test app for the autoscaler: one class, one slot per worker, at most 3 replicas."""

import time

from sluice import App, Compute, ResourceClass

app = App("tests.apps.scaling", classes=[
    ResourceClass("batch", Compute(cpu="1", memory="1Gi"), slots=1, min_replicas=0, max_replicas=3)])


@app.task
def work(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
