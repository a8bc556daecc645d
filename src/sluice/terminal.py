"""The rich console every command prints through."""

from __future__ import annotations

import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or, piped, as wide as each line (rich would fold at 80 columns,
    cutting tables and splitting paths and log lines a reader or a ``grep`` looks for)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 1000)
