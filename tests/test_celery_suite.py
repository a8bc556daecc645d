"""The runner of Celery's integration suite (tests/compat/celery_suite.py): how it reads pytest's
JUnit report, what it counts as a difference from stock Celery, and that every known difference
is written in the README's "Differences from Celery" (the suite itself runs in CI after this
suite, and by hand for the three-way figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat import celery_suite
from tests.conftest import ROOT

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="t.integration.test_tasks.test_tasks" name="test_simple_call" file="t/integration/test_tasks.py"/>
  <testcase classname="t.integration.test_tasks.test_tasks" name="test_retry" file="t/integration/test_tasks.py">
    <failure message="assert ['STARTED', 'RETRY'] == ['RETRY']">...</failure></testcase>
  <testcase classname="t.integration.test_tasks.test_tasks" name="test_teardown_error" file="t/integration/test_tasks.py"/>
  <testcase classname="t.integration.test_tasks.test_tasks" name="test_teardown_error" file="t/integration/test_tasks.py">
    <error message="teardown failed">...</error></testcase>
  <testcase classname="t.integration.test_worker" name="test_django" file="t/integration/test_worker.py">
    <skipped message="Django absent"/></testcase>
</testsuite></testsuites>
"""
TASKS = "t/integration/test_tasks.py::test_tasks"


def test_a_report_gives_each_test_one_outcome_and_an_error_after_a_pass_is_a_failure(tmp_path: Path) -> None:
    """Passed, failed and skipped by pytest's node id; a test reported twice (its call
    passed, its teardown errored) is failed."""
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    assert celery_suite.outcomes_of(report) == {
        f"{TASKS}::test_simple_call": "passed",
        f"{TASKS}::test_retry": "failed",
        f"{TASKS}::test_teardown_error": "failed",
        "t/integration/test_worker.py::test_django": "skipped",
    }


def _run(**outcomes: str) -> dict[str, object]:
    return {"passed": 0, "failed": 0, "skipped": 0, "seconds": 1,
            "outcomes": {f"{TASKS}::{name}": outcome for name, outcome in outcomes.items()}}


def test_a_difference_is_a_test_that_passes_on_stock_celery_and_fails_on_sluice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A test failing on both ways is the environment's, not a difference; one passing on the
    baseline and failing on sluice is, and it is undocumented unless it is a known difference."""
    monkeypatch.setattr(celery_suite, "KNOWN", {f"{TASKS}::test_retry": "**STARTED is stored**"})
    runs = {"celery": _run(test_retry="passed", test_django="failed", test_chord="passed"),
            "sluice": _run(test_retry="failed", test_django="failed", test_chord="failed")}
    figures, undocumented = celery_suite.summary(runs)
    assert figures["sluice"]["differences"] == [f"{TASKS}::test_chord", f"{TASKS}::test_retry"]
    assert undocumented == figures["sluice"]["undocumented"] == [f"{TASKS}::test_chord"]


def test_without_the_baseline_every_failure_on_sluice_not_known_is_undocumented(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runs only the sluice way: there, any failure that is not a known difference fails it."""
    monkeypatch.setattr(celery_suite, "KNOWN", {f"{TASKS}::test_retry": "**STARTED is stored**"})
    _, undocumented = celery_suite.summary({"sluice": _run(test_retry="failed", test_chord="failed",
                                                           test_simple_call="passed")})
    assert undocumented == [f"{TASKS}::test_chord"]


def test_every_known_difference_is_explained_in_the_readme() -> None:
    """Each known difference names the README's bullet that explains it (its bold lead), and
    the README's "Differences from Celery" section holds that bullet and names the test."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Differences from Celery", 1)[1].split("\n### ", 1)[0]
    for test, lead in celery_suite.KNOWN.items():
        assert f"- {lead}" in section, f"{test}: no README bullet {lead!r}"
        assert test.rsplit("::", 1)[1] in section, f"{test}: not named in the README's differences"
