"""The App: declaration-time checks, routing by compute through task_routes, safe defaults.

Messages are really published to the test redis-server; the queue lists show where they went.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import redis

from sluice import App, Compute, ResourceClass
from sluice.deploy.embedded import EmbeddedRedis
from sluice.errors import ConfigurationError, NoQueueFits
from sluice.queues.broker.layout import RedisLayout

#: The default kombu layout: the test apps use the default transport options.
LAYOUT = RedisLayout()


def test_delay_routes_by_effective_compute(basic_app: ModuleType, redis_client: redis.Redis) -> None:
    basic_app.default_task.delay()
    basic_app.big_task.delay()
    basic_app.big_task.delay()
    assert LAYOUT.queue_depth(redis_client, "cpu") == 1
    assert LAYOUT.queue_depth(redis_client, "highmem") == 2


def test_explicit_queue_wins_for_that_call_only(basic_app: ModuleType, redis_client: redis.Redis) -> None:
    """Among the classes that hold the task (a 4Gi task: highmem, gpu); one too small is refused."""
    basic_app.big_task.apply_async(queue="gpu")
    assert (LAYOUT.queue_depth(redis_client, "gpu"), LAYOUT.queue_depth(redis_client, "highmem")) == (1, 0)
    basic_app.big_task.delay()
    assert (LAYOUT.queue_depth(redis_client, "gpu"), LAYOUT.queue_depth(redis_client, "highmem")) == (1, 1)
    with pytest.raises(NoQueueFits, match="queue 'cpu' holds cpu=1 memory=2Gi gpu=0; .*: highmem, gpu"):
        basic_app.big_task.apply_async(queue="cpu")
    assert LAYOUT.queue_depth(redis_client, "cpu") == 0


def test_effective_compute_inherits_per_axis(basic_app: ModuleType) -> None:
    assert basic_app.app.effective_compute(basic_app.big_task.name) == Compute(cpu="1", memory="4Gi")
    assert basic_app.default_task.effective_compute == Compute(cpu="1", memory="512Mi")


def test_safe_defaults(basic_app: ModuleType) -> None:
    conf = basic_app.app.conf
    assert conf.task_acks_late and conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.broker_transport_options["visibility_timeout"] == 6 * 3600
    assert conf.task_default_queue == "cpu"


def test_no_queue_fits_at_decoration(redis_server: EmbeddedRedis) -> None:
    app = App("t", broker=redis_server.url)
    with pytest.raises(NoQueueFits, match="too_big"):
        @app.task(compute=Compute(memory="1Ti"))
        def too_big() -> None: ...


def test_compute_must_be_a_compute(redis_server: EmbeddedRedis) -> None:
    app = App("t", broker=redis_server.url)
    with pytest.raises(ConfigurationError, match="must be a sluice.Compute"):
        @app.task(compute={"memory": "1Gi"})
        def typo() -> None: ...


def test_custom_catalog_and_default_compute(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> None:
    app = App("t", broker=redis_server.url, default_compute=Compute(memory="100Mi"),
              classes=[ResourceClass("small", Compute(cpu="1", memory="150Mi")),
                       ResourceClass("large", Compute(cpu="1", memory="600Mi"))])

    @app.task(compute=Compute(memory="300Mi"))
    def medium() -> None: ...

    @app.task
    def plain() -> None: ...

    assert app.route(medium.name).name == "large"
    assert app.route(plain.name).name == "small"
    medium.delay()
    assert LAYOUT.queue_depth(redis_client, "large") == 1


def test_default_compute_that_fits_nowhere_fails_at_app_creation(redis_server: EmbeddedRedis) -> None:
    with pytest.raises(NoQueueFits, match="default compute"):
        App("t", broker=redis_server.url, default_compute=Compute(memory="1Ti"))


def test_non_redis_broker_rejected() -> None:
    with pytest.raises(ConfigurationError, match="amqp://x"):
        App("t", broker="amqp://x")


def test_a_sentinel_broker_needs_its_master_name_and_sentinel_urls() -> None:
    """`sentinel://` brokers are accepted (Celery's form, ';' between Sentinels); without a master
    name, or with a part that is not a Sentinel URL, the App says so at construction."""
    import pytest

    from sluice import App
    from sluice.config import Settings
    from sluice.errors import ConfigurationError

    url = "sentinel://:pw@127.0.0.1:26379/0;sentinel://127.0.0.1:26380/0"
    with pytest.raises(ConfigurationError, match="SLUICE_SENTINEL_MASTER"):
        App("tests.sentinel.nameless", broker=url, settings=Settings.load(env={}))
    with pytest.raises(ConfigurationError, match="'redis://h:1' is not sentinel://host:port"):
        App("tests.sentinel.mixed", broker="sentinel://h:26379;redis://h:1",
            settings=Settings.load(env={"SLUICE_SENTINEL_MASTER": "m"}))
    app = App("tests.sentinel.named", broker=url,
              settings=Settings.load(env={"SLUICE_SENTINEL_MASTER": "m", "SLUICE_SENTINEL_PASSWORD": "s"}))
    assert app.conf.broker_transport == "sluice-sentinel"
    for options in (app.conf.broker_transport_options, app.conf.result_backend_transport_options):
        assert options["master_name"] == "m" and options["sentinel_kwargs"]["password"] == "s"
    assert type(app.backend).__name__ == "ComputeSentinelBackend"


def test_a_class_queue_publish_lands_without_a_declare_and_another_queue_is_declared(
        basic_app: ModuleType, redis_client: redis.Redis) -> None:
    """On a flushed database (no queue bindings at all) a routed ``.delay()`` lands in its class's
    list with no declare (no binding written), and so does an explicit class queue; a queue the
    caller names outside the classes is declared as kombu always does."""
    basic_app.big_task.delay()
    basic_app.big_task.apply_async(queue="gpu")
    assert (LAYOUT.queue_depth(redis_client, "highmem"), LAYOUT.queue_depth(redis_client, "gpu")) == (1, 1)
    assert redis_client.keys("_kombu.binding.*") == []
    basic_app.big_task.apply_async(queue="custom")
    assert LAYOUT.queue_depth(redis_client, "custom") == 1
    assert redis_client.keys("_kombu.binding.*") == [b"_kombu.binding.custom"]


@pytest.mark.parametrize(("url", "env", "scheme", "broker_kind"), [
    ("redis://:secret@127.0.0.1:6390/2", {}, "redis", "Redis"),
    ("sentinel://127.0.0.1:26390", {"SLUICE_SENTINEL_MASTER": "mymaster"}, "sentinel", "RedisSentinel"),
])
def test_flower_picks_its_redis_broker_from_a_sluice_apps_connection_which_still_uses_sluices_transport(
        url: str, env: dict[str, str], scheme: str, broker_kind: str) -> None:
    """Flower chooses how to read queue lengths from the scheme of ``app.connection().as_uri()``
    (its Broker page and /api/queues/length): a sluice App's connection names the Redis scheme
    (redis, sentinel), not the transport alias (which Flower answered with "broker is not
    supported"), with the password, and the connection itself still uses sluice's transport."""
    from flower.utils import broker as flower_broker

    from sluice.config import Settings
    from sluice.queues.broker import transport

    app = App("tests.flower", broker=url, settings=Settings.load(env=env))
    with app.connection() as connection:
        uri = connection.as_uri(include_password=True)
        assert connection.transport_cls == transport.alias_for(url)
        assert isinstance(connection.transport, transport.Transport)
    assert uri.startswith(f"{scheme}://") and ("secret" in uri) == ("secret" in url)
    chosen = flower_broker.Broker(uri, broker_options=app.conf.broker_transport_options)
    assert type(chosen).__name__ == broker_kind
