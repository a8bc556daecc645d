"""sluice's result backend against a real redis-server: a state is stored in one script that
keeps Celery's rule (a success is never overwritten), and a ComputeTask's STARTED state carries
its delivery-ledger claim, handed to the task on its request."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
from celery import states
from celery.app.task import Context

from sluice import keys
from sluice.tasks.base import CLAIMED
from sluice.tasks.ledger import Claim

pytestmark = pytest.mark.integration


def _request(app_module: ModuleType, task_id: str) -> Context:
    return Context(id=task_id, task=app_module.default_task.name, hostname="w@test", delivery_info={}, headers={})


def test_started_claims_the_attempt_and_a_success_is_never_overwritten(basic_app: ModuleType,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """In a worker, STARTED writes the ledger claim in the same step and leaves the claim it
    replaced on the request (none the first time, the first claim on a redelivery); after a
    SUCCESS, a late STARTED leaves the success in place, and still claims."""
    app, client = basic_app.app, basic_app.app.redis
    monkeypatch.setattr(app, "worker_instance", "instance-1")
    backend, task_id = app.backend, "task-claim-1"

    first = _request(basic_app, task_id)
    backend.store_result(task_id, {"pid": 1}, states.STARTED, request=first)
    assert getattr(first, CLAIMED) == (None,)
    stored = Claim.load(client.get(keys.delivery(task_id)))
    assert stored is not None and (stored.worker, stored.instance, stored.attempt) == ("w@test", "instance-1", 1)
    assert 0 < client.ttl(keys.delivery(task_id)) <= app.settings.visibility_timeout + 3600
    assert backend.get_state(task_id) == states.STARTED

    backend.store_result(task_id, 42, states.SUCCESS, request=first)
    again = _request(basic_app, task_id)
    backend.store_result(task_id, {"pid": 2}, states.STARTED, request=again)
    assert getattr(again, CLAIMED) == (stored,)
    meta = json.loads(client.get(backend.get_key_for_task(task_id)))
    assert (meta["status"], meta["result"]) == (states.SUCCESS, 42)


def test_outside_a_worker_a_state_is_stored_without_a_claim(basic_app: ModuleType) -> None:
    """No worker instance (a client storing a state): the state is stored, no ledger key appears."""
    app, task_id = basic_app.app, "task-claim-2"
    request = _request(basic_app, task_id)
    app.backend.store_result(task_id, {"pid": 1}, states.STARTED, request=request)
    assert app.backend.get_state(task_id) == states.STARTED
    assert not hasattr(request, CLAIMED) and not app.redis.exists(keys.delivery(task_id))


def test_with_results_in_another_redis_the_claim_stays_in_the_brokers_and_failures_keep_their_expiry(
        redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Results in another database than the ledger (the broker's): STARTED carries no claim
    (the task claims in the broker's Redis itself); a failure is stored with
    ``result_failure_expires``, a success with ``result_expires``, as Celery's backend does."""
    from sluice import App

    app = App("tests.other_backend", broker=redis_server.url, backend=redis_server.url.rsplit("/", 1)[0] + "/1")
    app.conf.result_failure_expires = 600
    task = app.task(name="tests.other_backend.noop")(_noop)
    monkeypatch.setattr(app, "worker_instance", "instance-2")
    request = Context(id="task-other-1", task=task.name, hostname="w@test", delivery_info={}, headers={})
    app.backend.store_result("task-other-1", {"pid": 1}, states.STARTED, request=request)
    assert not hasattr(request, CLAIMED)
    app.backend.store_result("task-other-2", ValueError("x"), states.FAILURE, request=request)
    app.backend.store_result("task-other-3", 1, states.SUCCESS, request=request)
    results = app.backend.client
    assert 0 < results.ttl(app.backend.get_key_for_task("task-other-2")) <= 600
    assert results.ttl(app.backend.get_key_for_task("task-other-3")) > 600


def _noop() -> None:
    """A task body no worker runs here."""
