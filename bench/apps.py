"""The two apps bench/throughput.py compares: a sluice App and stock Celery with its defaults
(what a user would pick instead), on the same Redis."""

from __future__ import annotations

from celery import Celery

from sluice import App

sluice_app = App("bench.sluice")


@sluice_app.task(name="bench.noop", shared=False)
def noop() -> None:
    """Does nothing: the benchmark measures per-task overhead."""


plain_app = Celery("bench.plain", broker=sluice_app.conf.broker_url, backend=sluice_app.conf.result_backend)


@plain_app.task(name="bench.noop", shared=False)
def plain_noop() -> None:
    """The same no-op on the plain app."""
