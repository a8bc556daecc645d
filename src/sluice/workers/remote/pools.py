"""What each pool process keeps between remote calls: its templates, a spare sandbox, and the
sandboxes whose calls have replied but that are not ended yet.

Keeping them is what takes starting and ending a sandbox out of a call's latency: a call forks
from a warm template, finds a sandbox already forked for it, and leaves its own to be ended after
its result is stored (:func:`close_retired`, connected to ``task_postrun``). Their state is kept
apart from the sandbox so that the one place of module-level state is plain to see.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sluice.errors import SandboxDied
from sluice.workers.remote.forked import Forked
from sluice.workers.remote.template import Templates

if TYPE_CHECKING:
    from sluice.workers.remote.sandbox import Sandbox

#: Templates a pool process keeps, least recently used dropped first. Each is an idle Python
#: process of about 15 MB resident (its spare sandbox shares those pages), and the watchdog
#: counts both in the memory of the pool process that started them, as it counted the spare
#: interpreter that sandboxes were before templates.
TEMPLATES_KEPT = 2

# Module globals, because this state is per process: templates and sandboxes are children of the
# pool process that started them (they die with it), the watchdog counts them in its memory, and
# each Celery pool process runs its own calls.
_templates = Templates(TEMPLATES_KEPT)
#: Sandboxes whose calls have replied, ended by :func:`close_retired`.
_retired: list[Sandbox] = []
#: A sandbox forked ahead of the next call (it has run nothing), for the environment last used.
_spare: Forked | None = None


def fork(env: Path | None) -> Forked:
    """A new sandbox for ``env``, forked from this process's template of it."""
    return Forked.start(env, _templates)


def forget_template(env: Path | None) -> None:
    """Stop the template of ``env`` (an environment about to be removed)."""
    _templates.forget(env)


def take_spare(env: Path | None) -> Forked | None:
    """The spare sandbox, if it was forked for ``env`` and is alive; any other spare is ended."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None and spare.env == env and spare.alive():
        return spare
    if spare is not None:
        spare.end()
        spare.clean_up()
    return None


def retire(sandbox: Sandbox) -> None:
    """Leave ``sandbox``, whose call has replied, for :func:`close_retired` to end."""
    _retired.append(sandbox)


def close_retired(**_: object) -> None:
    """End the sandboxes whose calls have replied and fork a spare for the next call. Connected
    to ``task_postrun``, which Celery sends once the task's result is stored, so neither ending a
    sandbox (its process tree is found and killed, its exit awaited) nor forking the next one is
    part of a call's latency."""
    global _spare
    if not _retired:
        return
    env = _retired[-1].env
    while _retired:
        _retired.pop().close()
    if _spare is None and env in _templates:  # not forgotten: its environment stays
        try:
            _spare = fork(env)
        except SandboxDied:
            pass  # the next call forks its own and says why if it cannot
