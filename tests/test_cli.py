"""The sluice command: help, explain, and bad input named clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def sluice(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200"} | env)


COMMANDS = ["autoscale", "check", "compute", "dead-letters", "demo", "deploy", "explain", "metrics", "profile", "revoke", "runs",
            "status", "up", "worker"]


def _section(text: str, title: str) -> list[str]:
    """The lines of one section of click's help (``Commands:``, ``Options:``), up to the next."""
    lines = text.splitlines()
    start = lines.index(f"{title}:") + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


def test_python_m_sluice_help_lists_every_command_with_the_first_words_of_its_help() -> None:
    """`python -m sluice --help` lists each command, in order, one per line, with its one-line help
    as click shortens it: the start of the first sentence of the command's own docstring; the
    "Start here" lines name only commands that exist."""
    from sluice.cli import main

    result = sluice("--help")
    assert result.returncode == 0, result.stderr
    listed = {}
    for line in _section(result.stdout, "Commands"):
        name, _, short = line.strip().partition(" ")
        listed[name] = short.strip()
    assert list(listed) == COMMANDS
    for name, short in listed.items():
        first = " ".join(main.commands[name].help.split("\n\n")[0].split())
        assert short, f"{name} is listed without its help"
        assert first.startswith(short.removesuffix("...")), (name, short, first)
    start_here = {line.split()[1] for line in result.stdout.splitlines() if line.strip().startswith("sluice ")}
    assert start_here and start_here <= set(COMMANDS), start_here


def test_worker_help_lists_its_options_with_their_values_and_which_is_required() -> None:
    """`sluice worker --help`: -A/--app (required), -q/--queue, --allow-no-gpu (a flag),
    -l/--loglevel (default INFO) and -h/--help, each with the kind of value it takes."""
    result = sluice("worker", "--help")
    assert result.returncode == 0, result.stderr
    options = {}
    for line in _section(result.stdout, "Options"):
        if line.startswith("  -"):
            declared, _, rest = line.strip().partition("  ")
            flags, _, metavar = declared.rpartition(" ") if declared.split()[-1].isupper() else (declared, "", "")
            current = options[flags] = [metavar, rest.strip()]
        else:
            current[1] += " " + line.strip()
    assert {flags: metavar for flags, (metavar, _) in options.items()} == {
        "-A, --app": "TEXT", "-q, --queue": "TEXT", "--allow-no-gpu": "", "-l, --loglevel": "TEXT", "-h, --help": ""}
    assert options["-A, --app"][1].endswith("[required]")
    assert options["-l, --loglevel"][1] == "[default: INFO]"
    assert "[required]" not in " ".join(text for flags, (_, text) in options.items() if flags != "-A, --app")


def test_the_command_loads_what_a_command_runs_only_when_it_runs() -> None:
    """`sluice --help` (and every command) starts without the batch driver, the demo app,
    prometheus_client or the kubernetes client: cli/ imports them in the command that needs them."""
    probe = "import sys, json; import sluice.cli; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                           timeout=60, cwd=ROOT).stdout))
    assert not loaded & {"sluice.client.batch.launch", "sluice.client.batch.driver", "sluice.demo",
                         "sluice.deploy.metrics", "prometheus_client", "kubernetes"}, sorted(loaded)


@pytest.mark.usefixtures("redis_server")
def test_explain_prints_effective_compute_and_class() -> None:
    result = sluice("explain", "-A", "tests.apps.basic")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:7]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["tests.apps.basic.big_task"] == ["memory=4Gi", "cpu=1 memory=4Gi", "-", "-", "highmem"]
    assert rows["tests.apps.basic.default_task"] == ["(default)", "cpu=1 memory=512Mi", "-", "-", "cpu"]


@pytest.mark.usefixtures("redis_server")
def test_explain_piped_keeps_whole_rows() -> None:
    """Piped (no terminal, no COLUMNS), `sluice explain` prints each task on one line with its
    whole name: rich would otherwise fit the table to 80 columns and cut the names."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "sluice", "explain", "-A", "tests.apps.basic"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    names = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    from tests.apps import basic

    assert len(names) >= 5 and set(names) <= set(basic.app.tasks), result.stdout   # whole names, none cut
    assert "tests.apps.basic.default_task" in names
    assert max(len(line) for line in result.stdout.splitlines()) > 80


@pytest.mark.usefixtures("redis_server")
def test_worker_rejects_an_unknown_class() -> None:
    result = sluice("worker", "-A", "tests.apps.basic", "--queue", "hugemem")
    assert result.returncode == 2
    assert "unknown resource class 'hugemem'" in result.stderr and "cpu, highmem, gpu" in result.stderr


def test_bad_config_is_one_clear_line() -> None:
    result = sluice("status", SLUICE_DEFAULT_MEMORY="lots")
    assert result.returncode == 2
    assert "memory 'lots' is not a quantity" in result.stderr   # one-line errors go to stderr, not into piped output
    assert "Traceback" not in result.stdout + result.stderr


def test_check_exit_codes(redis_server: object) -> None:
    import time

    from sluice import keys

    client = redis_server.client()  # type: ignore[attr-defined]
    assert sluice("check", "--worker", "ghost@nowhere").returncode == 3
    client.set(keys.worker_heartbeat("old@host"), json.dumps({"ts": time.time() - 600}))
    stale = sluice("check", "--worker", "old@host")
    assert stale.returncode == 4 and "STALE_HEARTBEAT" in stale.stdout
    client.set(keys.worker_heartbeat("fresh@host"), json.dumps({"ts": time.time()}))
    assert sluice("check", "--worker", "fresh@host").returncode == 0
    down = sluice("check", "--worker", "fresh@host", SLUICE_BROKER_URL="redis://127.0.0.1:1/0")
    assert down.returncode == 5 and "BROKER_DOWN" in down.stdout


def test_status_watch_reads_the_cluster_again_until_ctrl_c(redis_client: object) -> None:
    """`sluice status --watch` keeps a live view: two messages already waiting on cpu show in the
    first read; a third published while it watches shows in a later one; Ctrl-C (SIGINT) ends it
    with exit 0. (Run as on a terminal, TTY_COMPATIBLE and TTY_INTERACTIVE, with the cursor moves
    rich's live view makes taken out: on a plain pipe it prints only the last view.)"""
    import re
    import signal
    import time

    def publish() -> None:
        redis_client.lpush("cpu", json.dumps({"body": "", "headers": {}, "properties": {  # type: ignore[attr-defined]
            "delivery_tag": f"t{time.monotonic_ns()}", "delivery_info": {"exchange": "", "routing_key": "cpu"}}}))

    publish()
    publish()
    watching = subprocess.Popen([sys.executable, "-m", "sluice", "status", "--watch", "--interval", "0.3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1",
                                                  "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"})
    try:
        time.sleep(2.5)
        publish()
        time.sleep(2.0)
    finally:
        watching.send_signal(signal.SIGINT)
        out, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, err
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", out)
    queued = [line.split("│")[2].strip() for line in text.splitlines() if line.startswith("│ cpu ")]
    assert queued[0] == "2" and queued[-1] == "3", out
    assert "sluice status at" in out
