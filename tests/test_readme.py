"""The README's quick start, run as written: its code blocks are cut out of README.md and run
against a real `sluice up` (console script, embedded Redis, real workers), so the quick start
cannot drift from what sluice does. The same cluster then shows what a first day needs:
`sluice demo` beside it on the same home, a second `sluice up` refused, no secret in any argv,
data files the user's alone, a worker told to shut down started again, and SIGHUP (the
terminal closing) stopping everything."""

from __future__ import annotations

import builtins
import fcntl
import json
import os
import pty
import queue
import re
import select
import socket
import stat
import subprocess
import symtable
import sys
import termios
import threading
from pathlib import Path

import psutil
import pytest

from sluice import keys
from tests.conftest import ROOT, wait_for

BIN = Path(sys.executable).parent
#: Colours and cursor moves a terminal gets (rich highlights numbers, for one).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block in the README's quick start section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start: `.delay()`", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def undefined_names(code: str) -> set[str]:
    """Names a Python block uses that it neither defines nor imports (nor are builtins)."""
    top = symtable.symtable(code, "<README block>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    missing: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            name = symbol.get_name()
            used_from_module = symbol.is_global() or table is top
            if symbol.is_referenced() and used_from_module and name not in defined and not hasattr(builtins, name):
                missing.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    return missing


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S),
                         ids=lambda block: block.splitlines()[0][:40])
def test_every_python_block_of_the_readme_defines_what_it_uses(block: str) -> None:
    """A newcomer pastes a block and it runs: no block leans on a name (an `app`, say) that only
    another block or the reader's imagination defines."""
    assert undefined_names(block) == set(), block


class Terminal:
    """A pseudo-terminal that a command runs on as its controlling terminal, as in a shell
    window: :meth:`close` is the window closing (the kernel sends the session SIGHUP)."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.lines: queue.Queue[str] = queue.Queue()
        self._open = True
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        slave = self.slave

        def take_terminal() -> None:   # runs in the child after setsid: this pty becomes its terminal
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                                   preexec_fn=take_terminal, **kwargs)  # type: ignore[call-overload]
        os.close(slave)
        self._reader.start()
        return process

    def _read(self) -> None:
        pending = b""
        while self._open:
            if not select.select([self.master], [], [], 0.1)[0]:
                continue
            try:
                chunk = os.read(self.master, 4096)
            except OSError:   # EIO: every process let go of the terminal
                return
            pending += chunk
            *done, pending = pending.split(b"\n")
            for line in done:
                self.lines.put(ANSI.sub("", line.decode(errors="replace")).rstrip("\r"))

    def close(self) -> None:
        self._open = False
        self._reader.join(5)
        os.close(self.master)


@pytest.mark.integration
def test_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    """Every command of the quick start exits 0 against the `sluice up` it starts; the task
    reaches a worker that knows it (the result comes back) and routes to highmem."""
    (python_lang, tasks_py), (_, up_block), (_, client_block) = quick_start_blocks()
    assert python_lang == "python" and tasks_py.startswith("# myapp/tasks.py")
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "tasks.py").write_text(tasks_py)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= {"SLUICE_HOME": str(tmp_path / "home"), "SLUICE_GPU_COUNT": "0", "PATH": f"{BIN}:{env['PATH']}",
            "PYTHONPATH": str(ROOT)}
    [up_command] = [line.split("#")[0].strip() for line in up_block.splitlines() if line.strip()]
    assert up_command == "sluice up -A myapp.tasks"
    terminal = Terminal()
    up = terminal.start(["bash", "-c", f"exec {up_command}"], cwd=tmp_path, env=env | {"COLUMNS": "200"})
    printed: list[str] = []

    def said(text: str) -> bool:
        while not terminal.lines.empty():
            printed.append(terminal.lines.get())
        return any(text in line for line in printed)

    try:
        wait_for(lambda: said("Ctrl-C stops everything"), 90, "sluice up to print its banner")
        assert said("app      myapp.tasks")
        exports = [line.strip() for line in printed if line.startswith("export ")]
        assert [e.split("=")[0] for e in exports] == ["export SLUICE_BROKER_URL", "export SLUICE_REMOTE_SECRET"]
        url = exports[0].split("=", 1)[1]
        # "paste the two export lines": the block's own export lines are replaced by the printed ones.
        script = "\n".join(exports + [line for line in client_block.splitlines() if not line.startswith("export ")])
        import redis

        client = redis.Redis.from_url(url)
        host = socket.gethostname()
        for name in ("cpu", "highmem"):
            wait_for(lambda n=name: client.exists(keys.worker_heartbeat(f"{n}@{host}")), 60, f"{name} worker")
        run = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=100)
        assert run.returncode == 0, run.stdout + run.stderr
        explained = next(line for line in run.stdout.splitlines() if "myapp.tasks.skewed_join" in line)
        assert "highmem" in explained, explained
        assert "\nNone\n" in run.stdout, run.stdout   # skewed_join's body is `...`: its result is None
        assert client.llen("highmem") == 0

        _demo_runs_beside_it(env, tmp_path)
        _a_second_up_is_refused(env, tmp_path, up.pid)
        _no_secret_in_any_argv(up.pid, url)
        _data_files_are_private(tmp_path / "home")
        _a_worker_shut_down_by_celery_control_is_started_again(env, tmp_path, url, client, host, said)
        family = psutil.Process(up.pid).children(recursive=True)
        assert len(family) >= 4
        terminal.close()   # the window closes: the kernel hangs up the session (SIGHUP)
        code = up.wait(90)
    finally:
        if up.poll() is None:   # the test failed midway: stop the cluster the way a user would
            up.terminate()
            up.wait(90)
    assert code == 0
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == [], f"SIGHUP left behind: {alive}"
    assert not (tmp_path / "home" / "up.json").exists()


def _demo_runs_beside_it(env: dict[str, str], cwd: Path) -> None:
    """`sluice demo` on the same home keeps its own Redis: it finishes, and `sluice up`'s
    queues and workers are untouched."""
    demo = subprocess.run(["sluice", "demo", "--timeout", "120"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=100)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "trained 3 epochs" in demo.stdout and "join_tables" in demo.stdout
    assert (cwd / "home" / "demo" / "logs" / "worker-cpu.log").exists()


def _a_second_up_is_refused(env: dict[str, str], cwd: Path, first: int) -> None:
    """A second `sluice up` on the same home refuses, naming the first, and starts nothing."""
    second = subprocess.run(["sluice", "up", "-A", "myapp.tasks"], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"is already in use by sluice up (pid {first})" in second.stderr, second.stdout + second.stderr


def _no_secret_in_any_argv(up_pid: int, url: str) -> None:
    """What `ps` shows of every process `sluice up` started holds neither the Redis password nor
    Flower's."""
    password = url.split(":")[2].split("@")[0]
    family = [psutil.Process(up_pid), *psutil.Process(up_pid).children(recursive=True)]
    assert any(p.name() == "redis-server" for p in family)
    for process in family:
        argv = " ".join(process.cmdline())
        assert password not in argv, f"the Redis password is in pid {process.pid}'s argv: {argv}"
        assert "basic-auth" not in argv, f"Flower's credentials are in pid {process.pid}'s argv: {argv}"


def _data_files_are_private(home: Path) -> None:
    """The embedded Redis's data (its AOF included), the logs and up.json: 0600 files in 0700
    directories."""
    found = list(home.rglob("*"))
    assert any(p.name.endswith(".aof") for p in found) and (home / "up.json") in found
    for path in [home, *found]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}: others can read it"


def _a_worker_shut_down_by_celery_control_is_started_again(env: dict[str, str], cwd: Path, url: str,
                                                           client: object, host: str, said: object) -> None:
    """`celery control shutdown` of a worker under `sluice up`: it is started again, and
    `sluice up` says so."""
    heartbeat = keys.worker_heartbeat(f"cpu@{host}")
    before = json.loads(client.get(heartbeat))["instance"]  # type: ignore[attr-defined]
    # (A worker told to shut down does not reply, so the command ends "No nodes replied".)
    subprocess.run(["celery", "-A", "myapp.tasks", "control", "shutdown", "-d", f"cpu@{host}"], cwd=cwd,
                   env=env | {"SLUICE_BROKER_URL": url}, capture_output=True, text=True, timeout=60)
    wait_for(lambda: said("worker-cpu exited with code 0"), 60, "sluice up to see the worker stop")  # type: ignore[operator]
    wait_for(lambda: said("restarted worker-cpu"), 30, "sluice up to start it again")  # type: ignore[operator]
    wait_for(lambda: (beat := client.get(heartbeat)) and json.loads(beat)["instance"] != before,  # type: ignore[attr-defined]
             60, "the restarted cpu worker's heartbeat")
