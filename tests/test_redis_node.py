"""The node script of the rendered Sentinel topology (``deploy --sentinel``), run for real: three
nodes, each a redis-server and a Sentinel started by ``redis_node.sh`` as its pod would start
them, on three loopback addresses. Node 0 starts as the master; a kill -9 of node 0 (its pod
dying) fails over to another node; node 0 started again asks the Sentinels and rejoins as a
replica of the new master, with the data, instead of coming back as a second master."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from sluice import redis_client
from sluice.config import Settings
from sluice.deploy import platform
from sluice.deploy.embedded import die_with_parent, find_redis_server, free_port
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

SCRIPT = Path(platform.__file__).with_name("redis_node.sh")
ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


class Node:
    """One pod of the StatefulSet: its Redis and its Sentinel, each the script's own process."""

    def __init__(self, index: int, directory: Path, env: dict[str, str]) -> None:
        self.address = ADDRESSES[index]
        self.directory = directory / f"node{index}"
        self.env = env | {"NODE": self.address, "REDIS_BIND": self.address, "DATA": str(self.directory / "data"),
                          "SENTINEL_DIR": str(self.directory / "sentinel")}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> Node:
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        for role in ("redis", "sentinel"):
            with open(self.directory / f"{role}.log", "ab") as log:
                self.processes.append(subprocess.Popen(["sh", str(SCRIPT), role], env=self.env, stdout=log,
                                                       stderr=subprocess.STDOUT, preexec_fn=die_with_parent))
        return self

    def kill(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(10)
        self.processes = []

    def log(self, role: str) -> str:
        return (self.directory / f"{role}.log").read_text()

    def redis(self) -> redis.Redis:
        return redis.Redis(self.address, int(self.env["REDIS_PORT"]), password=self.env["REDIS_PASSWORD"],
                           socket_timeout=2, decode_responses=True)

    def sentinel(self) -> redis.Redis:
        return redis.Redis(self.address, int(self.env["SENTINEL_PORT"]), password=self.env["REDIS_PASSWORD"],
                           socket_timeout=2, decode_responses=True)

    def replication(self) -> dict:
        try:
            return self.redis().info("replication")
        except redis.RedisError:
            return {}

    def sentinel_view(self) -> tuple[str | None, int]:
        """(the master this node's Sentinel names, how many other Sentinels it knows)."""
        try:
            master = self.sentinel().sentinel_master(platform.SENTINEL_MASTER)
            return master["ip"], int(master["num-other-sentinels"])
        except (redis.RedisError, KeyError):
            return None, 0


def test_nodes_start_fail_over_and_a_dead_master_rejoins_as_a_replica(tmp_path: Path) -> None:
    assert shutil.which("redis-cli"), "redis-cli (redis-tools) is on the PATH of every Redis image and of CI"
    password = secrets.token_hex(8)
    bin_dir = str(Path(find_redis_server()).parent)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REDIS_PASSWORD": password, "NODES": " ".join(ADDRESSES),
           "MASTER_SET": platform.SENTINEL_MASTER, "REDIS_PORT": str(free_port()),
           "SENTINEL_PORT": str(free_port()), "DOWN_AFTER_MS": "1000",
           # a vote that splits between the two Sentinels left is tried again within 6 s, not 120 s
           "FAILOVER_TIMEOUT_MS": "3000"}
    nodes = [Node(i, tmp_path, env) for i in range(3)]
    try:
        # a StatefulSet starts its pods in order, each once the one before is up
        for node in nodes:
            node.start()
            wait_for(lambda: node.replication().get("role"), 20, f"{node.address}'s Redis to answer")
        assert "starts as the master" in nodes[0].log("redis")
        assert all(f"starts as a replica of {ADDRESSES[0]}" in n.log("redis") for n in nodes[1:])
        wait_for(lambda: [nodes[0].replication().get(f"slave{i}", {}).get("state") for i in (0, 1)] == ["online"] * 2,
                 30, "both replicas to sync")
        wait_for(lambda: all(n.sentinel_view() == (ADDRESSES[0], 2) for n in nodes), 30,
                 "every Sentinel to watch node 0 and know the other two")

        nodes[0].redis().set("acknowledged", "before the failover")
        assert nodes[0].redis().wait(2, 5000) == 2
        nodes[0].kill()
        killed = time.monotonic()
        new_master = wait_for(lambda: {n.sentinel_view()[0] for n in nodes[1:]} - {ADDRESSES[0], None}, 30,
                              "the Sentinels to promote a replica")
        (promoted,) = new_master
        wait_for(lambda: next(n for n in nodes if n.address == promoted).replication().get("role") == "master", 20,
                 "the promoted replica to be the master")
        print(f"failover: {promoted} is the master {time.monotonic() - killed:.1f} s after node 0 was killed")

        nodes[0].start()
        wait_for(lambda: nodes[0].replication().get("master_link_status") == "up", 30, "node 0 to sync as a replica")
        assert f"starts as a replica of {promoted}" in nodes[0].log("redis").split("starts as the master", 1)[1]
        assert nodes[0].replication()["master_host"] == promoted
        assert nodes[0].redis().get("acknowledged") == "before the failover"

        # the rendered clients' form: every Sentinel, the master set, the Sentinels' password; the new
        # master takes writes once a replica is less than a second behind (min-replicas-to-write)
        promoted_node = next(n for n in nodes if n.address == promoted)
        wait_for(lambda: int(promoted_node.replication().get("min_slaves_good_slaves", 0)) >= 1, 20,
                 "a replica of the new master to be caught up")
        url = ";".join(f"sentinel://:{password}@{a}:{env['SENTINEL_PORT']}/0" for a in ADDRESSES)
        settings = Settings(sentinel_master=platform.SENTINEL_MASTER, sentinel_password=password)
        client = redis_client.connect(url, settings=settings)
        client.set("through the sentinels", "yes")
        assert promoted_node.redis().get("through the sentinels") == "yes"
    finally:
        for node in nodes:
            node.kill()
