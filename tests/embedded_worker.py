"""Start a worker the way Celery's pytest fixtures do (``celery.contrib.testing.worker.start_worker``,
a bare WorkController in this process, prefork pool) and keep it until SIGTERM.

Usage: ``python -m tests.embedded_worker APP_MODULE QUEUE NODENAME``."""

from __future__ import annotations

import importlib
import signal
import sys
import threading

from celery.contrib.testing.worker import start_worker


def main(module: str, queue: str, nodename: str) -> None:
    app = importlib.import_module(module).app
    app.amqp.queues.select([queue])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with start_worker(app, pool="prefork", concurrency=2, perform_ping_check=False, hostname=nodename):
        print("started", flush=True)
        stop.wait(timeout=300)  # bounded: a worker whose test died goes away on its own


if __name__ == "__main__":
    main(*sys.argv[1:4])
