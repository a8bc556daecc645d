"""Retry policies and escalation arithmetic: pure functions, and checks at decoration time."""

from __future__ import annotations

import pytest

from sluice import (
    App,
    Backoff,
    Compute,
    ComputeEscalation,
    ResourceClass,
    RetryOn,
    RetryPolicy,
    Transient,
)
from sluice.errors import ConfigurationError, NoQueueFits
from sluice.tasks.retry import AttemptRecord, Reason, classify, decide, summarize

Gi = 1 << 30
POLICY = RetryPolicy(max_retries=3, retry_on=RetryOn.TRANSIENT, escalate=ComputeEscalation(factor=2.0, max_memory="64Gi"))


def test_reference_ladder_8_16_32_64_then_exhausted() -> None:
    compute, seen = Compute(cpu="4", memory="8Gi"), []
    for attempt in range(1, 5):
        seen.append(compute.memory)
        decision = decide(POLICY, compute, attempt, Reason.MEMORY)
        if not decision.retry:
            break
        assert decision.countdown == 0 and decision.compute.cpu == "4"  # other axes stay
        compute = decision.compute
    assert seen == ["8Gi", "16Gi", "32Gi", "64Gi"]
    assert decision.exhausted and not decision.retry


def test_growth_is_clamped_at_max_memory_and_a_kill_there_is_final() -> None:
    policy = RetryPolicy(max_retries=10, escalate=ComputeEscalation(factor=3.0, max_memory="20Gi"))
    first = decide(policy, Compute(memory="8Gi"), 1, Reason.MEMORY)
    assert first.compute.memory_bytes == 20 * Gi
    final = decide(policy, first.compute, 2, Reason.MEMORY)
    assert final.exhausted and not final.retry


@pytest.mark.parametrize(("retry_on", "retried"), [
    (RetryOn.NEVER, set()),
    (RetryOn.OOM, {Reason.MEMORY, Reason.WORKER_LOST}),
    (RetryOn.TRANSIENT, {Reason.MEMORY, Reason.WORKER_LOST, Reason.LOST, Reason.TRANSIENT}),
    (RetryOn.ANY, set(Reason)),
])
def test_which_reasons_each_policy_retries(retry_on: RetryOn, retried: set[Reason]) -> None:
    policy = RetryPolicy(max_retries=1, retry_on=retry_on)
    assert {r for r in Reason if decide(policy, Compute(memory="1Gi"), 1, r).retry} == retried


def test_non_memory_retries_back_off_at_the_same_size() -> None:
    policy = RetryPolicy(max_retries=5, retry_on=RetryOn.TRANSIENT, escalate=ComputeEscalation(),
                         backoff=Backoff(initial=1.0, factor=2.0, maximum=3.0))
    delays = [decide(policy, Compute(memory="1Gi"), n, Reason.TRANSIENT) for n in (1, 2, 3)]
    assert [d.countdown for d in delays] == [1.0, 2.0, 3.0]
    assert {d.compute.memory for d in delays} == {"1Gi"}


def test_no_policy_means_no_retry() -> None:
    assert not decide(None, Compute(memory="1Gi"), 1, Reason.MEMORY).retry


@pytest.mark.parametrize(("exc", "reason"), [
    (Transient("busy"), Reason.TRANSIENT), (ConnectionError("reset"), Reason.TRANSIENT),
    (TimeoutError(), Reason.TRANSIENT), (ValueError("bad row"), Reason.ERROR), (KeyError("id"), Reason.ERROR),
])
def test_classify(exc: BaseException, reason: Reason) -> None:
    assert classify(exc) == reason


@pytest.mark.parametrize(("make", "match"), [
    (lambda: ComputeEscalation(factor=1.0), "greater than 1"),
    (lambda: ComputeEscalation(factor=True), "greater than 1"),
    (lambda: ComputeEscalation(max_memory="lots"), "'lots'"),
    (lambda: RetryPolicy(max_retries=-1), "max_retries=-1"),
    (lambda: RetryPolicy(retry_on="oom"), "RetryOn.TRANSIENT"),
    (lambda: RetryPolicy(escalate=2.0), "ComputeEscalation"),
    (lambda: Backoff(initial=5, maximum=1), "maximum >= initial"),
])
def test_bad_policies_fail_at_construction(make: object, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        make()  # type: ignore[operator]


@pytest.fixture
def app() -> App:
    return App("t", broker="redis://127.0.0.1:1/0", classes=[
        ResourceClass("small", Compute(cpu="1", memory="1Gi")), ResourceClass("big", Compute(cpu="1", memory="8Gi"))])


def test_max_memory_below_the_task_memory_fails_at_decoration(app: App) -> None:
    with pytest.raises(ConfigurationError, match="below the task's memory 4Gi"):
        @app.task(compute=Compute(memory="4Gi"), retry=RetryPolicy(escalate=ComputeEscalation(max_memory="2Gi")))
        def job() -> None: ...


def test_max_memory_no_class_holds_fails_at_decoration(app: App) -> None:
    with pytest.raises(NoQueueFits, match="escalated to max_memory"):
        @app.task(compute=Compute(memory="1Gi"), retry=RetryPolicy(escalate=ComputeEscalation(max_memory="64Gi")))
        def job() -> None: ...


def test_retry_must_be_a_policy(app: App) -> None:
    with pytest.raises(ConfigurationError, match="must be a sluice.RetryPolicy"):
        @app.task(retry=3)
        def job() -> None: ...


def test_a_valid_policy_is_kept_on_the_task(app: App) -> None:
    policy = RetryPolicy(escalate=ComputeEscalation(max_memory="8Gi"))

    @app.task(compute=Compute(memory="1Gi"), retry=policy)
    def job() -> None: ...

    assert job.retry_policy is policy
    assert callable(job.retry)  # Celery's own Task.retry is not shadowed


def test_summary_lists_every_attempt() -> None:
    history = [AttemptRecord(1, "cpu", Compute(memory="8Gi"), Reason.MEMORY, "x", "w1"),
               AttemptRecord(2, "highmem", Compute(memory="16Gi"), Reason.MEMORY, "x", "w2")]
    assert summarize("etl.join", history) == (
        "etl.join failed after 2 attempt(s): killed for memory at 8Gi on cpu, killed for memory at 16Gi on highmem")
