"""ETA and countdown tasks run once, however long they wait against the visibility timeout.

kombu's Redis transport puts back any message unacknowledged for longer than the visibility
timeout, and a worker holds a countdown task unacknowledged until its time comes, so a
countdown longer than the timeout used to run twice. sluice's transport renews the lease of
every message a live worker holds. The scenario (tests/eta_scenario.py) takes over two and a
half minutes, so it starts when the suite is collected and this test, run last, checks it.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests import eta_scenario

pytestmark = [pytest.mark.integration, pytest.mark.starts_early.with_args(eta_scenario.start),
              pytest.mark.timeout(eta_scenario.COUNTDOWN + 320)]


def test_tasks_due_150s_later_against_a_10s_visibility_timeout_run_once_and_not_before_they_are_due(
        early: subprocess.Popen[bytes]) -> None:
    """Four tasks due in 150 s (the eta a 150 s countdown becomes) on two workers with a 10 s
    visibility timeout: each succeeds, ran once (one attempt, one run recorded, one completion),
    and its body started (by its own clock) no earlier than its eta."""
    early.wait(eta_scenario.COUNTDOWN + 300)
    directory = early.args[-1]
    outcome = json.loads(open(f"{directory}/outcome.json").read())
    assert "error" not in outcome, outcome["error"] + open(f"{directory}/scenario.log").read()
    assert outcome["visibility_timeout"] == eta_scenario.VISIBILITY_TIMEOUT
    assert [(t["state"], t["runs"], list(t["started"]), t["completed"]) for t in outcome["tasks"]] == \
        [("SUCCESS", ["small"], ["1"], 1)] * eta_scenario.TASKS
    early_starts = {t["id"]: t["started"]["1"] - outcome["eta"] for t in outcome["tasks"]
                    if t["started"]["1"] < outcome["eta"]}
    assert early_starts == {}, f"started this many seconds before the eta: {early_starts}"
