"""A real Redis Cluster on loopback, for tests: three masters, three replicas.

Six ``redis-server --cluster-enabled yes`` processes on free ports, each in a temporary
directory, joined by ``redis-cli --cluster create ... --cluster-replicas 1``::

    cluster = RedisCluster().start()
    store = RedisStore(cluster.url)            # redis+cluster://127.0.0.1:<port>/0
    node = cluster.master_of("mp:{tag}:meta")  # the master serving a key's slot
    node.kill()                                # SIGKILL: its replica takes over
    cluster.wait_promoted(node)                # every live node sees the replica serve
    cluster.close()                            # stop every node, remove the directories

``cluster-node-timeout`` is short (the default is 15 s) so a failover completes within a
test's time; ``cluster-require-full-coverage no`` keeps the other slots serving meanwhile.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ports import free_port
from redis import Redis
from redis.crc import key_slot
from redis.exceptions import RedisError
from redis_server import REDIS_SERVER, RedisServer

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
NODE_TIMEOUT_MS = 1000


class ClusterNode(RedisServer):
    """One node of the cluster: a ``RedisServer`` started in cluster mode."""

    def __init__(self, port: int, data_dir: Path, node_timeout_ms: int) -> None:
        super().__init__(port=port, data_dir=data_dir, appendonly=True)
        self.node_timeout_ms = node_timeout_ms

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.data_dir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-require-full-coverage", "no",
            # a replica whose link to its master is stale still takes over (a test kills
            # the master under load; the default 10 x node-timeout would do too)
            "--cluster-replica-validity-factor", "0",
            # a replica's first sync starts at once (the default waits 5 s for more
            # replicas to join the same transfer)
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip

    def cli(self, *args: str) -> Any:
        """A command's reply from this node (the synchronous client: fixtures are sync)."""
        with Redis(host="127.0.0.1", port=self.port, socket_timeout=2) as client:
            return client.execute_command(*args)

    def slots(self) -> list[tuple[int, int, int]]:
        """``(first slot, last slot, master port)`` of every range, as this node sees it."""
        try:
            reply = self.cli("CLUSTER", "SLOTS")
        except RedisError:
            return []
        return [(int(first), int(last), int(master[1])) for first, last, master, *_ in reply]

    def info_cluster(self) -> str:
        try:
            return bytes(self.cli("CLUSTER", "INFO")).decode()
        except RedisError:
            return ""


class RedisCluster:
    """Six nodes (three masters, three replicas) on free loopback ports."""

    def __init__(self, *, masters: int = 3, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="memory-proxy-cluster-"))
        self.nodes: list[ClusterNode] = []
        for index in range(masters * 2):
            folder = self.root / f"node-{index}"
            folder.mkdir()
            self.nodes.append(ClusterNode(free_port(bus=True), folder, node_timeout_ms))

    @property
    def url(self) -> str:
        """The store URL: any node is a starting point, the client finds the others."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30) -> RedisCluster:
        for node in self.nodes:
            node.start()
        created = subprocess.run(
            [REDIS_CLI, "--cluster", "create",
             *(f"127.0.0.1:{node.port}" for node in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
        if created.returncode != 0:
            self.close()
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}")
        self.wait_ok(timeout)
        self.wait_replicated(timeout)
        return self

    def wait_replicated(self, timeout: float = 30) -> None:
        """Until every replica's link to its master is up and its first sync done: before
        it, a master that dies takes with it what no replica has yet."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [node.cli("INFO", "replication") for node in self.nodes if node.ping()]
            replicas = [info for info in infos if info.get("role") == "slave"]
            if len(replicas) == len(self.nodes) // 2 and all(
                    info.get("master_link_status") == "up"
                    and not info.get("master_sync_in_progress") for info in replicas):
                return
            time.sleep(0.1)
        raise RuntimeError("the replicas did not finish their first sync")

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says ``cluster_state:ok`` and sees all slots served."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [node for node in self.nodes if node.ping()]
            if all("cluster_state:ok" in node.info_cluster() for node in live) and \
                    all(_covered(node.slots()) for node in live):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not become ready")

    def master_of(self, key: str) -> ClusterNode:
        """The node that serves ``key``'s slot now."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            if not node.ping():
                continue
            for first, last, port in node.slots():
                if first <= slot <= last:
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no master serves slot {slot}")

    def wait_promoted(self, dead: ClusterNode, timeout: float = 30) -> None:
        """Until every live node agrees that a replica serves ``dead``'s slots."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [node.slots() for node in self.nodes if node is not dead and node.ping()]
            if views and all(_covered(v) and dead.port not in {p for *_, p in v}
                             for v in views):
                self.wait_ok(max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.05)
        raise RuntimeError(f"no replica took over from node {dead.port}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SentinelServer(RedisServer):
    """One ``redis-server --sentinel`` watching ``master`` as ``service`` (quorum 1)."""

    def __init__(self, master: RedisServer, service: str = "mymaster") -> None:
        super().__init__()
        self.master = master
        self.service = service

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/0"

    def _command(self) -> list[str]:
        config = self.data_dir / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.data_dir}\n"
            f"logfile {self.log_path}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
        )
        return [self.binary, str(config), "--sentinel"]


def _covered(ranges: list[tuple[int, int, int]]) -> bool:
    return sum(last - first + 1 for first, last, _ in ranges) == 16384


__all__ = ["REDIS_SERVER", "ClusterNode", "RedisCluster", "SentinelServer"]
