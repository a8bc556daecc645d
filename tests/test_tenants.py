"""Tenants at the call and in configuration, without a broker: how a call's tenant is found
(argument, header, ``with sluice.tenant``, the App's default), where its message goes (the
tenant's queue of the class, the tenant and charge headers), and the named errors for a bad
tenant name, a bad share, a share for an unknown class, and a task larger than its quota."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import sluice
from sluice import App, Compute, ConfigurationError, OverQuota, Settings
from sluice.headers import CHARGE, SENT, TENANT
from sluice.queues.catalog import Catalog, ResourceClass
from sluice.tenants import Share, split_queue, tenant_queue

CLASSES = list(Catalog.merged({"gpu": {"tenants": {"team-a": {"weight": 3, "quota": {"gpu": 2, "memory": "32Gi"}}}}}))


def _app(**kwargs: Any) -> App:
    return App("tests.tenants", broker="redis://127.0.0.1:1/0", classes=CLASSES, **kwargs)


def _route(app: App, task: Any, **options: Any) -> tuple[str, dict[str, Any]]:
    route = app.amqp.router.route(dict(options), task.name, (), {}, task)
    queue = route["queue"]
    return getattr(queue, "name", queue), {**(route.get("headers") or {}), **(options.get("headers") or {})}


def _task(app: App, name: str, **options: Any) -> Any:
    def body() -> None:
        """A task of the app under test (sent nowhere: only routed)."""

    return app.task(name=name, **options)(body)


@pytest.fixture
def app() -> App:
    return _app()


def test_a_call_without_a_tenant_goes_to_the_class_queue_with_its_charge_and_no_tenant_header(app: App) -> None:
    task = _task(app, "t.plain", compute=Compute(cpu="2", memory="1Gi"))
    queue, headers = _route(app, task)
    assert queue == "highmem"
    assert headers[CHARGE] == f"2000 {1 << 30} 0" and TENANT not in headers


def test_the_tenant_argument_header_context_and_app_default_are_taken_in_that_order() -> None:
    app = _app(tenant="app-wide")
    task = _task(app, "t.order")
    assert _route(app, task)[0] == tenant_queue("cpu", "app-wide")
    with sluice.tenant("ctx"):
        assert _route(app, task)[0] == "cpu~ctx"
        assert _route(app, task, headers={TENANT: "hdr"})[0] == "cpu~hdr"
        queue, headers = _route(app, task, tenant="arg", headers={TENANT: "hdr"})
        assert queue == "cpu~arg" and headers[TENANT] == "arg"
    assert _route(app, task, tenant="default")[0] == "cpu"   # the default tenant: the class's own queue


def test_an_explicit_class_queue_becomes_the_tenants_queue_of_it(app: App) -> None:
    """As an escalated retry is sent: to a named class, its tenant in its headers."""
    task = _task(app, "t.retried")
    assert _route(app, task, queue="highmem", headers={TENANT: "team-a"})[0] == "highmem~team-a"
    assert _route(app, task, queue="highmem~team-a", headers={TENANT: "team-a"})[0] == "highmem~team-a"


def test_a_call_with_a_priority_carries_its_publish_time_for_aging(app: App) -> None:
    task = _task(app, "t.prioritised")
    before = time.time()
    assert before - 1 <= _route(app, task, priority=6)[1][SENT] <= time.time() + 1
    assert SENT not in _route(app, task)[1]


def test_a_tenant_queue_splits_back_into_its_class_and_tenant() -> None:
    assert split_queue(tenant_queue("gpu", "team-a")) == ("gpu", "team-a")
    assert split_queue("gpu") == ("gpu", "default")
    assert split_queue("celery@host.dq2") == ("celery@host.dq2", "default")
    assert split_queue("myapp:emails") == ("myapp:emails", "default")       # a Celery user's own naming


@pytest.mark.parametrize("name", ["", "a b", "é", "x" * 65, "-lead", "a:b", 3])
def test_a_bad_tenant_name_is_a_configuration_error_naming_it_at_the_call(app: App, name: object) -> None:
    task = _task(app, "t.bad")
    with pytest.raises(ConfigurationError, match="is not a valid tenant name"):
        _route(app, task, tenant=name)
    with pytest.raises(ConfigurationError, match="is not a valid tenant name"):
        with sluice.tenant(name):  # type: ignore[arg-type]
            pass
    with pytest.raises(ConfigurationError, match="is not a valid tenant name"):
        _app(tenant=name)


def test_a_task_larger_than_its_tenants_quota_is_refused_at_publish(app: App) -> None:
    task = _task(app, "t.huge", compute=Compute(gpu=1, memory="48Gi"))
    with pytest.raises(OverQuota, match=r"tenant 'team-a'.*quota there \(memory=32Gi gpu=2\).*on memory"):
        _route(app, task, tenant="team-a")
    assert _route(app, task, tenant="team-b")[0] == "gpu~team-b"   # no quota for team-b


def test_shares_are_read_from_sluice_toml_per_class(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text(
        '[classes.gpu.tenants.team-a]\nweight = 3\nquota = {gpu = 4, memory = "256Gi"}\n'
        "[classes.gpu.tenants.team-b]\nweight = 1\n")
    gpu = Settings.load(cwd=tmp_path, env={}).catalog.get("gpu")
    assert gpu.share("team-a") == Share(weight=3, quota=Compute(gpu=4, memory="256Gi"))
    assert gpu.share("team-b") == Share(weight=1) and gpu.share("anyone") == Share()
    assert gpu.fetch_terms() == (f"8000 {64 << 30} 1", f"team-a 3.0 - {256 << 30} 4 team-b 1.0 - - -")


@pytest.mark.parametrize(("toml", "match"), [
    ("[classes.gpux.tenants.a]\nweight = 1\n", "tenants given for unknown resource class 'gpux'"),
    ("[classes.gpu.tenants.a]\nweight = 0\n", r"tenant 'a': weight=0 must be a number above 0"),
    ("[classes.gpu.tenants.a]\nweight = -2\n", "weight=-2"),
    ("[classes.gpu.tenants.a]\nweight = 1e9\n", "at most 1000"),
    ("[classes.gpu.tenants.a]\nquota = {gpu = 5000}\n", "gpu 5000 is not a count"),
    ("[classes.gpu.tenants.a]\nquota = {disk = 1}\n", "must be a table of cpu, memory, gpu"),
    ("[classes.gpu.tenants.a]\nshare = 1\n", r"unknown keys \['share'\]"),
    ("[classes.gpu.tenants.'a b']\nweight = 1\n", "'a b' is not a valid tenant name"),
    ("[classes.gpu]\ntenants = 3\n", "tenants must be a table of tenant tables"),
    ('tenant = "a b"\n', "'a b' is not a valid tenant name"),
])
def test_a_bad_share_in_sluice_toml_is_refused_at_load_naming_it(tmp_path: Path, toml: str, match: str) -> None:
    (tmp_path / "sluice.toml").write_text(toml)
    with pytest.raises(ConfigurationError, match=match):
        Settings.load(cwd=tmp_path, env={})


def test_shares_can_be_declared_in_code() -> None:
    pool = ResourceClass("pool", Compute(cpu="1", memory="1Gi"), tenants={"a": Share(weight=2)})
    assert pool.share("a").weight == 2
    with pytest.raises(ConfigurationError, match="weight=0"):
        ResourceClass("pool", Compute(cpu="1", memory="1Gi"), tenants={"a": {"weight": 0}})


def test_the_autoscalers_demand_counts_only_what_tenants_quotas_let_start() -> None:
    """capped may hold 2 cpus and holds 1: of its 10 waiting, 1 can start; default's 5 all can."""
    from sluice.deploy.autoscaler import replicas_needed
    from sluice.queues.status import ClassStatus, runnable

    pool = ResourceClass("pool", Compute(cpu="1", memory="1Gi"), slots=2, max_replicas=50,
                         tenants={"capped": Share(quota=Compute(cpu="2"))})
    can = runnable(pool, {"default": 5, "capped": 10}, {("pool", "capped"): Compute(cpu="1")})
    assert can == 6
    assert runnable(pool, {"capped": 10}, {("pool", "capped"): Compute(cpu="2")}) == 0
    status = ClassStatus(pool, queued=15, reserved=1, running=1, slots=2, busy=("w",), idle=(), runnable=can)
    assert replicas_needed(status, pool) == 4                 # (6 + 1) / 2 slots, not (15 + 1) / 2


def test_admission_fails_a_plain_producers_task_larger_than_its_tenants_quota() -> None:
    """The check no publish made, on the worker: OverQuota, stored as the task's result."""
    from sluice.workers.admission import RUN, decide

    pool = ResourceClass("pool", Compute(cpu="4", memory="8Gi"), tenants={"capped": Share(quota=Compute(cpu="2"))})
    catalog = Catalog([pool])
    verdict = decide("t.big", Compute(cpu="3", memory="1Gi"), "pool", catalog, "celery", tenant="capped")
    assert isinstance(verdict.error, OverQuota) and "tenant 'capped'" in str(verdict.error)
    assert decide("t.big", Compute(cpu="3", memory="1Gi"), "pool", catalog, "celery") is RUN
    assert decide("t.small", Compute(cpu="2", memory="1Gi"), "pool", catalog, "celery", tenant="capped") is RUN


def test_remote_functions_and_batch_runs_take_a_tenant_checked_before_anything_is_sent() -> None:
    def summarize(path: str) -> str:
        return path

    assert sluice.remote(tenant="team-b")(summarize).tenant == "team-b"
    with pytest.raises(ConfigurationError, match="'a b' is not a valid tenant name"):
        sluice.remote(tenant="a b")(summarize)
    from click.testing import CliRunner

    from sluice.cli.compute import compute

    refused = CliRunner().invoke(compute, ["no-such-task.py", "--tenant", "a b"])
    assert refused.exit_code == 2 and "'a b' is not a valid tenant name" in refused.output
