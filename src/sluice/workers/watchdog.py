"""The memory watchdog: holds each running task to its effective memory, as a pod limit would.

It runs as a thread in the worker's main process. Several times a second it measures the
resident memory of each busy pool process together with its children, and SIGKILLs the tree of
one that exceeds its task's limit, after recording the kill in Redis so the failure (and later
an escalation) can tell a memory kill from a crash. Each run's peak is recorded in the task's
memory profile when the run ends (``sluice.tasks.memory_profile``).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil
import redis

from sluice import keys
from sluice.tasks import memory_profile
from sluice.tasks.memory_kill import MemoryKill
from sluice.workers.periodic import Periodic

log = logging.getLogger("sluice.watchdog")


@dataclass(frozen=True)
class Watched:
    """A running task as the watchdog needs it: who runs it and how much it may hold."""

    task_id: str
    task: str
    pid: int
    limit: int
    resource_class: str


def tree_rss(members: list[psutil.Process]) -> int | None:
    """Resident bytes of a process tree (members that vanish count as 0); None when the root is dead."""
    total = 0
    for index, member in enumerate(members):
        try:
            total += member.memory_info().rss
        except psutil.Error:
            if index == 0:
                return None
    return total


def descendants(process: psutil.Process) -> list[psutil.Process]:
    """``process.children(recursive=True)``, without its scan of every process on the machine
    when the kernel lists no child of ``process`` (``/proc/PID/task/*/children``): the common
    case of a pool process or a sandbox that started nothing, checked in microseconds."""
    try:
        task_dir = f"/proc/{process.pid}/task"
        if not any(open(f"{task_dir}/{tid}/children").read().strip() for tid in os.listdir(task_dir)):
            return []
    except OSError:  # no such listing (not Linux, or an older kernel): ask psutil
        pass
    return process.children(recursive=True)


class ProcessTree:
    """A process and its descendants, measured often and cheaply: who is in the tree (a scan of
    every process on the machine) is refreshed every ``refresh`` seconds, while each member's
    resident memory is read on every :meth:`rss`."""

    def __init__(self, root: psutil.Process, refresh: float) -> None:
        self.root = root
        self.refresh = refresh
        self._members = [root]
        self._refreshed = -math.inf

    def rss(self, now: float) -> int | None:
        """Resident bytes of the tree; None when the root is dead."""
        if now - self._refreshed >= self.refresh:
            try:
                self._members = [self.root, *descendants(self.root)]
            except psutil.Error:
                self._members = [self.root]
            self._refreshed = now
        return tree_rss(self._members)


def _zombie(process: psutil.Process | None) -> bool:
    try:
        return process is None or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_tree(process: psutil.Process) -> None:
    """SIGKILL the children first, then the process itself."""
    try:
        children = descendants(process)
    except psutil.Error:
        children = []
    for member in [*children, process]:
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue


class MemoryWatchdog(Periodic):
    """Polls ``running()`` every ``interval`` seconds and kills tasks over their limit.

    Cheap enough to run at 20 Hz beside a busy worker: a task is first measured one interval
    after it was first seen (a no-op task costs nothing), and a tree's membership (which needs a
    scan of every process) is refreshed every ``tree_refresh`` seconds while each member's RSS is
    read on every tick. When a busy pool process is found dead (killed here or by anyone else),
    ``on_dead`` is called once for it, so the pool can notice at once rather than on its next
    periodic check.
    """

    def __init__(
        self,
        running: Callable[[], Iterable[Watched]],
        client: redis.Redis,
        hostname: str,
        interval: float = 0.05,
        tree_refresh: float = 0.5,
        on_dead: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__("sluice-memory-watchdog", interval)
        self.running = running
        self.client = client
        self.hostname = hostname
        self.tree_refresh = tree_refresh
        self.on_dead = on_dead
        self._processes: dict[int, psutil.Process] = {}
        self._trees: dict[int, ProcessTree] = {}
        self._first_seen: dict[str, float] = {}
        self._reported: set[int] = set()
        self._peaks: dict[str, tuple[str, int]] = {}  #: task id -> (task name, highest rss seen)
        self._killed: set[tuple[str, int]] = set()  #: (task id, pid) killed here: its run is observed

    def tick(self) -> list[MemoryKill]:
        return self.check_once()

    def _process(self, pid: int) -> psutil.Process | None:
        process = self._processes.get(pid)
        if process is None or not process.is_running():
            try:
                process = self._processes[pid] = psutil.Process(pid)
            except psutil.Error:
                self._processes.pop(pid, None)
                return None
        return process

    def _tree(self, process: psutil.Process) -> ProcessTree:
        tree = self._trees.get(process.pid)
        if tree is None or tree.root is not process:
            tree = self._trees[process.pid] = ProcessTree(process, self.tree_refresh)
        return tree

    def check_once(self, now: float | None = None) -> list[MemoryKill]:
        """One pass over the running tasks; returns the kills made."""
        now = time.monotonic() if now is None else now
        kills = []
        watched = list(self.running())
        live_pids = {w.pid for w in watched}
        for pid in set(self._processes) - live_pids:
            self._processes.pop(pid, None)
            self._trees.pop(pid, None)
        self._reported &= live_pids
        self._killed = {k for k in self._killed if k[1] in live_pids}
        live_ids = {w.task_id for w in watched}
        for task_id in set(self._first_seen) - live_ids:
            del self._first_seen[task_id]
        for item in watched:
            if now - self._first_seen.setdefault(item.task_id, now) < self.interval:
                continue
            process = self._process(item.pid)
            rss = None if process is None else self._tree(process).rss(now)
            if rss is None or _zombie(process):
                self._report_dead(item.pid)
                continue
            if (item.task_id, item.pid) in self._killed:
                continue
            if rss > self._peaks.get(item.task_id, ("", 0))[1]:
                self._peaks[item.task_id] = (item.task, rss)
            if rss > item.limit:
                kills.append(self._kill(item, process, rss))  # reported dead on a later tick, once a zombie
        self._observe_finished(live_ids)
        return kills

    def _observe_finished(self, live_ids: set[str]) -> None:
        """Record the peak of each run that ended since the last tick (one round trip for all)."""
        finished = set(self._peaks) - live_ids
        if not finished:
            return
        pipe = self.client.pipeline(transaction=False)
        for task_id in finished:
            memory_profile.observe(pipe, *self._peaks.pop(task_id))
        try:
            pipe.execute()
        except redis.RedisError as exc:  # an observation is a statistic: lose it rather than stop watching
            log.warning("could not record %d run(s)' peak memory: %s", len(finished), exc)

    def _report_dead(self, pid: int) -> None:
        if pid not in self._reported:
            self._reported.add(pid)
            self.on_dead()

    def _kill(self, item: Watched, process: psutil.Process, rss: int) -> MemoryKill:
        kill = MemoryKill(
            item.task_id, item.task, rss, item.limit, item.resource_class, self.hostname, item.pid, time.time()
        )
        pipe = self.client.pipeline()
        kill.store(pipe)
        pipe.incr(keys.stat("memory_kills", item.resource_class))
        memory_profile.observe(pipe, item.task, max(rss, item.limit), killed=True)
        self._peaks.pop(item.task_id, None)
        self._killed.add((item.task_id, item.pid))
        pipe.execute()
        log.warning("%s; sending SIGKILL to pid %d", kill.message, item.pid)
        kill_tree(process)
        self._trees.pop(item.pid, None)
        return kill
