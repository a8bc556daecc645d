"""Celery's event dispatcher, with a shorter way out for events on the sluice transport.

Every ``.delay()`` sends a task-sent event (``task_send_sent_event``: Flower shows each
attempt's queue). Celery publishes it through a kombu Producer as it publishes a task: the
event exchange declared again (a copy bound to the channel each time), the publish wrapped for
retries, the body serialized through kombu's registry; about a fifth of a ``.delay()``. Once the
exchange is declared on a sluice channel, :class:`EventDispatcher` hands the event to the channel
itself (``ReliableChannel.publish_event``): the message kombu would build, on the same reply-less
PUBLISH. Another transport, a key-prefixed channel, an exchange not yet declared there, or a
connection error: kombu's way, as before. The App installs it with :class:`Events`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from celery.app.events import Events as CeleryEvents
from celery.events.dispatcher import EventDispatcher as CeleryEventDispatcher
from celery.events.event import Event, group_from
from celery.utils.time import utcoffset


class EventDispatcher(CeleryEventDispatcher):
    """Celery's dispatcher; :meth:`publish` skips kombu's Producer where the channel can take it,
    and :meth:`send_buffered` buffers many events of one kind at once."""

    def publish(
        self, type: str, fields: dict[str, Any], producer: Any, blind: bool = False, Event: Any = Event, **kwargs: Any
    ) -> Any:  # noqa: N803 - Celery's signature
        channel = getattr(producer, "channel", None)
        direct = getattr(channel, "publish_event", None)
        if channel is not None and direct is not None and channel.takes_events(self.exchange.name):
            event = Event(
                type,
                hostname=self.hostname,
                utcoffset=utcoffset(),
                pid=self.pid,
                clock=None if blind else self.clock.forward(),
                **fields,
            )
            try:
                with self.mutex:
                    return direct(self.exchange.name, type.replace("-", "."), event, self.headers, self.delivery_mode)
            except channel.connection_errors:
                pass  # kombu's way below reconnects and retries as its policy says
        return super().publish(type, fields, producer, blind=blind, Event=Event, **kwargs)

    def send_buffered(self, type: str, common: dict[str, Any], each: Iterable[dict[str, Any]]) -> None:
        """Buffer one event per item of ``each`` (its fields over ``common``), to go out with the
        next :meth:`flush` in one message (e.g. ``task.multi``, which Flower reads), whether or
        not the group is in ``buffer_group``: what ``send()`` does for a buffered group, with the
        shared fields merged once, not per event
        (``delay_many``: a twentieth of its time). Each event has its own clock and timestamp."""
        group = group_from(type)
        if not self.enabled or (self.groups and group not in self.groups):
            return
        shared = Event(type, hostname=self.hostname, utcoffset=utcoffset(), pid=self.pid, **common)
        forward, now = self.clock.forward, time.time
        self._group_buffer[group].extend(
            {**shared, **fields, "clock": forward(), "timestamp": now()} for fields in each
        )


class Events(CeleryEvents):
    """``app.events`` with sluice's dispatcher (``App.events_cls``)."""

    dispatcher_cls = f"{__name__}:EventDispatcher"
