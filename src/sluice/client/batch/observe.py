"""``--observe``: a live rich display of a run, or one plain line per interval when not on a terminal.

"in flight" counts items dispatched and not yet recorded: running, or queued in a chunk behind
them (the driver keeps more in flight than there are slots, so that no slot waits for work).
"""

from __future__ import annotations

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from sluice.client.batch.progress import Progress


class Observer:
    def __init__(self, console: Console, plain_every: float = 5.0) -> None:
        self.console = console
        self.plain = not console.is_terminal
        self.plain_every = plain_every
        self._last_plain = 0.0
        self._live: Live | None = None

    def __enter__(self) -> Observer:
        if not self.plain:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def __call__(self, progress: Progress) -> None:
        if self.plain:
            if time.monotonic() - self._last_plain >= self.plain_every or progress.plan_done and not progress.in_flight:
                self._last_plain = time.monotonic()
                print(self.line(progress), file=sys.stderr, flush=True)
            return
        assert self._live is not None
        self._live.update(self.render(progress))

    @staticmethod
    def eta(progress: Progress) -> str:
        if not progress.plan_done or not progress.rate():
            return "?"
        return f"{progress.in_flight / progress.rate():.0f}s"

    def line(self, p: Progress) -> str:
        quarantined = f" quarantined={','.join(p.quarantined)}" if p.quarantined else ""
        return (
            f"done={p.ok} failed={p.failed} cancelled={p.cancelled} in_flight={p.in_flight} "
            f"skipped={p.skipped} rate={p.rate():.1f}/s eta={self.eta(p)}{quarantined}"
        )

    def render(self, p: Progress) -> Group:
        cells = [
            ("done", p.ok),
            ("failed", p.failed),
            ("cancelled", p.cancelled),
            ("in flight", p.in_flight),
            ("skipped", p.skipped),
            ("rate", f"{p.rate():.1f}/s"),
            ("eta", self.eta(p)),
        ]
        summary = Table.grid(padding=(0, 2))
        summary.add_row(*(f"[bold]{label}[/bold] {value}" for label, value in cells))
        workers = Table("worker", "items", "state", box=None)
        for worker, count in sorted(p.per_worker.items()):
            workers.add_row(worker, str(count), "[red]quarantined[/red]" if worker in p.quarantined else "ok")
        return Group(summary, workers)
