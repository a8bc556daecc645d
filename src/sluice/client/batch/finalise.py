"""The end of a run: wait until nothing is held (so local workers can stop at once), and after
Ctrl-C record every unfinished item as cancelled."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import redis

from sluice.keys import RunPart
from sluice.tasks.batch.records import Failure, encode

if TYPE_CHECKING:
    from sluice.client.batch.driver import Driver


def wait_for_acks(driver: Driver, timeout: float = 5.0) -> bool:
    """After the last record: wait until no message of this run is held unacknowledged (a worker
    acknowledges a chunk just after caching its records), so that its workers can be stopped at
    once instead of warmly. False if some message is still held at ``timeout``."""
    queue = driver.settings.queue
    tag = f".{driver.settings.run_id[:8]}@"  # in this run's local workers' own queues (sticky retries)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            held = [item.queue for item in driver.layout.held(driver.client)]
        except redis.RedisError:
            return False  # cannot tell: stop them warmly
        if not any(q == queue or tag in q for q in held):
            return True
        time.sleep(0.01)
    return False


def finish_interrupted(driver: Driver, private_queue: bool) -> None:
    """After the workers stopped: take what they wrote; record every other in-flight id as
    cancelled and forget it was dispatched (resume runs it again); drop its messages."""
    client = driver.client
    while client.llen(driver.key(RunPart.READY)):
        driver.collect(block=False)
    driver.app.control.revoke(list(driver.chunks))
    if private_queue:  # the run-private queue's waiting and held messages: its workers are gone
        client.delete(*driver.layout.queue_lists(driver.settings.queue))
        driver.layout.drop_held(client, driver.settings.queue)
    if driver.waiting:
        client.srem(driver.key(RunPart.SKIP), *driver.waiting)
    driver.write([encode(Failure.cancelled(i)) for i in sorted(driver.waiting)])
    driver.checkpoint(force=True)
