"""``up.json``: what a running ``sluice up`` tells other processes on the machine about itself.

``sluice up`` (:mod:`sluice.deploy.local`) writes it in its home while it runs; an App, the CLI
and the signing code read it to find the embedded broker and the shared secret when none is
configured. One typed record, :class:`UpState`, with one encoder and one decoder.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class UpState:
    """A running ``sluice up``: its pid, where its broker and Flower are, its app, its children."""

    pid: int
    broker_url: str | None
    flower_url: str | None = None
    app: str = ""
    #: Child name -> pid.
    children: dict[str, int] = field(default_factory=dict)
    #: The secret its workers sign with (a client without one of its own uses it).
    remote_secret: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> UpState:
        """The record of ``text``; anything else is a ValueError."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            raise ValueError(f"not an up.json record: {text!r:.200}")
        children = data.get("children") or {}
        if not isinstance(children, dict) or not all(isinstance(pid, int) for pid in children.values()):
            raise ValueError(f"up.json children={children!r} is not a table of pids")
        return cls(
            pid=data["pid"],
            broker_url=_text(data, "broker_url"),
            flower_url=_text(data, "flower_url"),
            app=_text(data, "app") or "",
            remote_secret=_text(data, "remote_secret") or "",
            children={str(name): pid for name, pid in children.items()},
        )

    def write(self, home: Path) -> None:
        """Write this record at :func:`embedded_state_path` atomically, readable by its owner only."""
        path = embedded_state_path(home)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with open(tmp, "w", opener=lambda name, flags: os.open(name, flags, 0o600)) as out:
            out.write(self.encode())
        os.replace(tmp, path)


def _text(data: dict[str, object], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"up.json {key}={value!r} is not text")
    return value


def embedded_state_path(home: Path) -> Path:
    """Where a running ``sluice up`` writes its record, for other processes to find."""
    return home / "up.json"


def embedded_state(home: Path) -> UpState | None:
    """The record of a ``sluice up`` running on this machine, if one is running."""
    try:
        state = UpState.decode(embedded_state_path(home).read_bytes())
        os.kill(state.pid, 0)
        return state
    except (OSError, ValueError):
        return None


def embedded_broker_url(home: Path) -> str | None:
    """The broker URL of a ``sluice up`` running on this machine, if one is."""
    state = embedded_state(home)
    return (state.broker_url or None) if state else None
