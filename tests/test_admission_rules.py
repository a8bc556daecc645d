"""Admission's verdict as a pure function: run, forward to the smallest class that fits, or fail."""

from __future__ import annotations

import pytest

from sluice import Catalog, Compute
from sluice.errors import NoQueueFits
from sluice.workers.admission import RUN, decide

DEFAULT = Catalog.merged({})   # cpu 1/2Gi, highmem 4/64Gi, gpu 8/64Gi/1


@pytest.mark.parametrize(("compute", "source", "verdict"), [
    (Compute(cpu="1", memory="512Mi"), "cpu", None),              # fits its class: run
    (Compute(cpu="1", memory="512Mi"), "highmem", None),          # an explicit bigger class holds it: run
    (Compute(cpu="1", memory="512Mi"), "gpu", None),              # explicit gpu queue, no gpu needed: run
    (Compute(cpu="1", memory="512Mi"), "run-1234", None),         # not a class (a batch run's queue): run
    (Compute(cpu="1", memory="4Gi"), "cpu", "highmem"),           # memory over the slot
    (Compute(cpu="2", memory="1Gi"), "cpu", "highmem"),           # cpu over the slot
    (Compute(cpu="1", memory="8Gi", gpu=1), "highmem", "gpu"),    # needs a gpu
    (Compute(cpu="1", memory="512Mi"), "celery", "cpu"),          # the intake always forwards
    (Compute(cpu="1", memory="32Gi"), "celery", "highmem"),
])
def test_verdict(compute: Compute, source: str, verdict: str | None) -> None:
    decided = decide("t", compute, source, DEFAULT, "celery")
    assert (decided is RUN) == (verdict is None)
    assert decided.forward_to == verdict and decided.error is None


def test_a_task_no_class_holds_is_failed_naming_the_classes() -> None:
    decided = decide("t", Compute(cpu="1", memory="512Gi"), "celery", DEFAULT, "celery")
    assert decided.forward_to is None and isinstance(decided.error, NoQueueFits)
    assert "512Gi" in str(decided.error) and "highmem" in str(decided.error)


def test_a_forward_back_to_a_queue_it_was_forwarded_from_is_a_loop_and_fails() -> None:
    """Workers with a different ladder sent it cpu -> highmem; this one would send it back."""
    decided = decide("t", Compute(cpu="1", memory="1Gi"), "highmem-small", Catalog.merged(
        {"highmem-small": {"cpu": "1", "memory": "512Mi"}}), "celery", trail=("cpu", "x"))
    assert decided.forward_to is None and isinstance(decided.error, NoQueueFits)
    assert "cpu -> x -> highmem-small -> cpu" in str(decided.error)
