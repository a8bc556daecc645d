"""``python -m sluice`` is the ``sluice`` command."""

from sluice.cli import run

run()
