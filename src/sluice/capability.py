"""Capability: what one part of sluice (batch runs, remote functions, assets) adds to an App.

An App installs a list of capabilities (``sluice.default_capabilities()`` unless told
otherwise), as dramatiq's broker installs its middleware list: the core (units, compute, errors,
config, keys, app, the core worker) imports none of them. A capability declares:

* ``tasks``: task bodies registered under fixed names (bound, ``shared=False``), so every
  worker of the app can run them, with ``task_options`` (name -> ``@app.task`` options);
* ``accepted_task_options``: the ``@app.task`` options it adds to the core's (``compute``,
  ``retry``) and Celery's, as dramatiq's middleware declare ``actor_options``; an app accepts
  those of the capabilities it installs, so the core names none of them;
* ``bootsteps``: worker bootsteps added to the app's worker blueprint; a step that adds
  heartbeat fields does so through the core step (``worker.sluice.add_heartbeat_fields``);
* ``worker_options``: extra ``celery worker`` command-line options (``app.user_options``);
* ``signals``: Celery signal handlers, connected once per process;
* ``settings``: its settings section (a :class:`sluice.config.Section`, each setting declared
  with :func:`sluice.config.setting`), read with the rest of the settings and validated when
  they are loaded;
* ``check``: declaration-time checks against the app (e.g. a setting naming a class).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click
    from celery.utils.dispatch import Signal

    from sluice.app import App
    from sluice.config import Section


@dataclass(frozen=True)
class Capability:
    """One capability's additions to an App (see the module docstring)."""

    name: str
    tasks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    accepted_task_options: tuple[str, ...] = ()
    bootsteps: tuple[type, ...] = ()
    worker_options: tuple[click.Option, ...] = ()
    signals: tuple[tuple[Signal, Callable[..., Any]], ...] = ()
    settings: type[Section] | None = None
    check: Callable[[App], object] | None = None

    def install(self, app: App) -> None:
        """Add everything this capability declares to ``app``."""
        for name, body in self.tasks.items():
            app.task(name=name, bind=True, shared=False, **self.task_options.get(name, {}))(body)
        for step in self.bootsteps:
            app.steps["worker"].add(step)
        for option in self.worker_options:
            app.user_options["worker"].add(option)
        for signal, handler in self.signals:
            signal.connect(handler, weak=False, dispatch_uid=f"sluice.{self.name}.{handler.__name__}")
        if self.check is not None:
            self.check(app)
