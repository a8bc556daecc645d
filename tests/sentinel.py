"""A real Redis Sentinel topology on loopback ports, for failover tests: one master, one replica
and three ``redis-server --sentinel`` processes watching them (quorum 2), all with passwords."""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import redis

from sluice.deploy.embedded import die_with_parent, find_redis_server, free_port
from tests.conftest import wait_for

MASTER_NAME = "sluicemaster"


class SentinelCluster:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.password = secrets.token_hex(8)
        self.ports = {"master": free_port(), "replica": free_port()}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The broker URL, Celery's form: every Sentinel, the master's password."""
        return ";".join(f"sentinel://:{self.password}@127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def _start(self, name: str, config: str, *args: str) -> None:
        path = self.directory / f"{name}.conf"
        path.write_text(config)
        log = open(self.directory / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen([find_redis_server(), str(path), *args], stdout=log,
                                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        log.close()

    def start(self) -> SentinelCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        for role, port in self.ports.items():
            data = self.directory / role
            data.mkdir(exist_ok=True)
            replica_of = f"replicaof 127.0.0.1 {self.ports['master']}\n" if role == "replica" else ""
            self._start(role, f"port {port}\nbind 127.0.0.1\ndir {data}\nappendonly yes\nappendfsync everysec\n"
                              f"save \"\"\nrequirepass {self.password}\nmasterauth {self.password}\n{replica_of}")
        for i, port in enumerate(self.sentinel_ports):
            self._start(f"sentinel{i}", f"port {port}\nbind 127.0.0.1\nsentinel resolve-hostnames no\n"
                                        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.ports['master']} 2\n"
                                        f"sentinel auth-pass {MASTER_NAME} {self.password}\n"
                                        f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
                                        f"sentinel failover-timeout {MASTER_NAME} 10000\n", "--sentinel")
        wait_for(lambda: self.replicated(), 30, "the replica to sync with the master")
        wait_for(lambda: all(self._sees_replica(p) for p in self.sentinel_ports), 30, "every Sentinel to see the replica")
        return self

    def client(self, role: str) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[role], password=self.password, socket_timeout=5)

    def replicated(self) -> bool:
        """The replica is connected and has every write the master has acknowledged."""
        try:
            info = self.client("master").info("replication")
            replica = info.get("slave0") or {}
            return replica.get("state") == "online" and replica.get("offset") == info["master_repl_offset"]
        except redis.RedisError:
            return False

    def _sees_replica(self, port: int) -> bool:
        try:
            return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).sentinel_slaves(MASTER_NAME))
        except redis.RedisError:
            return False

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers names it now."""
        for port in self.sentinel_ports:
            try:
                host, master = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).sentinel_get_master_addr_by_name(
                    MASTER_NAME)
                return int(master)
            except (redis.RedisError, TypeError):
                continue
        return None

    def kill_master(self) -> float:
        """kill -9 the master; returns when (monotonic)."""
        self.processes["master"].kill()
        killed = time.monotonic()
        self.processes["master"].wait(10)
        return killed

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)

    def __enter__(self) -> SentinelCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
