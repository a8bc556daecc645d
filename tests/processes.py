"""Finding a `sluice compute` driver's local workers from outside, for tests and bench/chaos.py
that kill them (no pytest here: a benchmark imports it)."""

from __future__ import annotations

import subprocess

import psutil


def driver_workers(driver: subprocess.Popen[str]) -> list[psutil.Process]:
    """The local workers' main processes (live children of the driver running celery)."""
    found = []
    for child in psutil.Process(driver.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "celery" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found
