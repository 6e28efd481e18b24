"""``serve --workers 1`` against ``2`` on Redis, and two workers on a Redis Cluster (phase 8
in bench/README.md): not pinned, so two workers can use both cores."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import phases
import populate
import servers
from load import SessionPool
from machine import idle_ticks, reaped_children_cpu
from phases import Target
from servers import ROOT

if TYPE_CHECKING:
    from run_phases import Run


def workers(run: Run, fake: servers.Server, redis: servers.Server, redis_url: str) -> dict:
    """One and two workers side by side: both servers up at once, measured in
    alternation over ``plan.rounds`` rounds; medians of the rounds (CPU summed). Besides
    the proxy's CPU, each cell charges what the rest of the machine spent on the same
    requests (wrk, the fake upstream, redis-server) and how long the cores sat idle:
    what bounds the second worker."""
    targets = {count: workers_target(run, f"workers-{count}", fake, redis_url, count)
               for count in (1, 2)}
    return measure_workers(run, targets, fake, redis.cpu_seconds)


def workers_cluster(run: Run, fake: servers.Server) -> dict:
    """Two workers on a Redis Cluster (three masters, three replicas, on loopback; the
    test suite's fixture): the cluster row of the workers table. *Others* charges all
    six redis-server processes."""
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_cluster import RedisCluster

    with RedisCluster() as cluster:
        def nodes_cpu() -> float:
            return sum(servers.cpu_seconds(node.process.pid) for node in cluster.nodes
                       if node.process is not None)

        targets = {2: workers_target(run, "workers-cluster", fake, cluster.url, 2)}
        return measure_workers(run, targets, fake, nodes_cpu)


def workers_target(run: Run, name: str, fake: servers.Server, url: str, count: int) -> Target:
    server = run.start(servers.memory_proxy(
        name, fake.url + "/v1", url, run.agents, None, workers=count))
    target = Target(f"C' x{count}", "", server.url, server,
                    SessionPool(populate.DEFAULT_AGENT, name.replace("-", ""), 2000))
    phases.wrk_run(target, 16, 2, run.env_cpus)  # every worker up and warm
    return target


def measure_workers(run: Run, targets: dict[int, Target], fake: servers.Server,
                    store_cpu: Callable[[], float]) -> dict:
    cells: dict[int, dict[int, list[dict]]] = {count: {32: [], 64: []} for count in targets}
    for _ in range(run.plan.rounds):
        for concurrency in (32, 64):
            for count, target in targets.items():
                others = store_cpu() + fake.cpu_seconds() + reaped_children_cpu()
                idle, total = idle_ticks()
                result, cpu, _ = phases.charged(target, partial(
                    phases.wrk_run, target, concurrency, run.plan.workers_seconds, run.env_cpus))
                idle_after, total_after = idle_ticks()
                cells[count][concurrency].append(
                    {"rps": result.rps, "p50": result.p50, "p99": result.p99,
                     "errors": result.errors, "cpu_s": cpu, "requests": result.requests,
                     "others_cpu_s": store_cpu() + fake.cpu_seconds()
                     + reaped_children_cpu() - others,
                     "idle_share": (idle_after - idle) / max(1, total_after - total)})
    for target in targets.values():
        run.stop(target.server)
    return {
        count: {
            concurrency: {
                **{key: statistics.median(each[key] for each in runs)
                   for key in ("rps", "p50", "p99", "idle_share")},
                **{key: sum(each[key] for each in runs)
                   for key in ("errors", "cpu_s", "others_cpu_s", "requests")},
                "rounds": len(runs),
            }
            for concurrency, runs in by.items()
        }
        for count, by in cells.items()
    }
