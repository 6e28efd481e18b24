"""Added latency at concurrency 1, two or more checkouts side by side in one run.

bench/run.py measures one checkout; on a shared host whose speed drifts by a third from
one minute to the next, two of its runs cannot be compared. This runs A (the instant fake
upstream), B (the pass-through floor) and memory-proxy from each given checkout (C0, C1,
...; embedded SQLite, the shared pool of 3,000 sessions of 20 messages) in interleaved
wrk rounds, as run.py's latency phase does, and prints each one's p50 and p99, added
against A in the same round, its CPU and run-queue wait per request.

    python bench/latency_side_by_side.py /path/to/before /path/to/after --rounds 5

Each checkout runs its own ``proxy`` package (``PYTHONPATH``); the histories are written
by this checkout's bench/populate.py.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import phases
import populate
import servers
from load import SessionPool
from phases import Target

ENV_CPUS, SUT_CPUS = "0", "1"  # client and upstream; the server under test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sessions", type=int, default=3000)
    args = parser.parse_args()
    agents = populate.write_agents(servers.OUT / "agents")
    started: list[servers.Server] = []
    try:
        fake = servers.instant_upstream(ENV_CPUS).start()
        started.append(fake)
        upstream = fake.url + "/v1"
        floor = servers.passthrough(upstream, SUT_CPUS).start()
        started.append(floor)
        targets = [Target("A", "", fake.url, fake), Target("B", "", floor.url, floor)]
        for index, checkout in enumerate(args.checkouts):
            database = servers.OUT / f"side-by-side-{index}.db"
            for old in servers.OUT.glob(f"{database.name}*"):
                old.unlink()
            pool = SessionPool(populate.DEFAULT_AGENT, "pool", args.sessions)
            asyncio.run(populate.populate(f"sqlite:///{database}", pool.agent,
                                          pool.sessions(), 20))
            server = servers.memory_proxy(
                f"side-by-side-{index}", upstream, f"sqlite:///{database}", agents, SUT_CPUS,
                env={"MEMORY_PROXY_SESSION_CACHE_MB": "256", "PYTHONPATH": str(checkout)},
            )
            server.cwd = checkout
            started.append(server.start())
            targets.append(Target(f"C{index}", str(checkout), server.url, server, pool))
        phases.warm_up(targets, ENV_CPUS)
        measured = phases.latency_rounds(targets, args.rounds, args.seconds, ENV_CPUS)
        for target in targets:
            m = measured[target.key]
            added = "" if target.key == "A" else (
                f"added p50 {phases.added_p50(measured, target.key):.3f} ms"
                f" p99 {phases.added_p50(measured, target.key, 'p99'):.3f} ms  ")
            print(f"{target.key:3} p50 {m.p50():.3f} ms p99 {m.p99():.3f} ms  {added}"
                  f"CPU/request {m.cpu_per_request_ms():.3f} ms"
                  f" run-queue wait/request {m.wait_per_request_ms():.3f} ms"
                  f"  {target.label}")
    finally:
        for server in reversed(started):
            server.stop()


if __name__ == "__main__":
    main()
