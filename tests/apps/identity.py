"""Test app for the worker's identity: a long task that counts how many times its body starts."""

from __future__ import annotations

import time
from typing import Any

from sluice import App

app = App("tests.apps.identity")


@app.task(bind=True)
def counted(self: Any, seconds: float) -> str:
    """Pushes one entry on ``test:ran:<id>`` each time its body starts, holds its slot ``seconds``,
    and returns the node name the worker goes by."""
    app.redis.rpush(f"test:ran:{self.request.id}", app.node_name(self.request))
    time.sleep(seconds)
    return app.node_name(self.request)
