"""A cold turn on a long session, alone: the first delta turn on sessions of 10,000 stored
messages that the proxy's session cache does not hold, with the default strategy
(summarizing_window pages the history until its budget is full).

``bench/run.py`` measures this as one row of *Per-turn cost against stored history*; here
it is measured by itself, split by the turn's steps, and side by side with another
checkout, turn by turn: this host runs the same code up to a third slower from one minute
to the next, so the two checkouts take turns (one cold turn each, alternating which goes
first), and the comparison is of turns measured within milliseconds of each other.

*in process* (the default): each checkout's app (``create_app`` with its lifespan, as
``memory-proxy serve`` tunes the GC) runs in a child process of its own
(``bench/cold_turn_app.py``), driven through ``httpx.ASGITransport`` against the
benchmark's upstream (``bench/instant_upstream.py``, a process of its own). CPU per cold
turn is the child's ``time.process_time`` (the store's thread included, the client's own
share too), split by step: every step of ``proxy/turn/pipeline.py``, the store calls
under the session cache, SQLite's jobs on the store's thread and the upstream call are
wrapped in timers. ``--profile`` adds cProfile's top functions of the event loop's thread
and of the store's.

*server* (``--server``): ``memory-proxy serve`` for each checkout, the turns sent by this
process over HTTP; CPU per cold turn is the server's (``/proc/PID/task/*/schedstat``), as
``bench/run.py`` measures it.

Every checkout reads a copy of the same populated SQLite database (Redis: a database of
its own, written the same way), so each meets the same histories; the upstream request
bodies of the in-process runs are hashed (after the timed turns) and compared across
checkouts: the window the proxy sends must be the same.

    python bench/cold_turn.py                          # this checkout, SQLite
    python bench/cold_turn.py --baseline DIR           # side by side with DIR's packages
    python bench/cold_turn.py --backend both --server --baseline DIR

``--baseline DIR``: a directory holding another copy of the ``proxy``, ``strategies`` and
``storage`` packages (e.g. ``git worktree add DIR <commit>``), put ahead of this
repository on the children's ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cold_turn_app import (
    CACHE_MB,
    STEPS,
    STORE_CALLS,
    STORE_JOBS,
    import_path,
    request_body,
    turn_path,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TESTS = ROOT / "tests"
APP = HERE / "cold_turn_app.py"


class InProcess:
    """One checkout's app in a child process, a turn at a time."""

    def __init__(self, args: argparse.Namespace, impl: str | None, url: str, upstream: str,
                 agents: Path) -> None:
        command = [sys.executable, str(APP), "--url", url, "--upstream", upstream,
                   "--agents", str(agents), "--loop", args.loop]
        if impl:
            command += ["--impl", impl]
        if args.profile:
            command.append("--profile")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
        self.proxy = self._read()["proxy"]

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the child ended (exit {self.process.wait()})")
        return dict(json.loads(line))

    def _send(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        return self._read()

    def untimed(self, session: str) -> None:
        self._send(f"untimed {session}")

    def turn(self, session: str) -> dict[str, Any]:
        return self._send(f"turn {session}")

    def done(self) -> dict[str, Any]:
        out = self._send("done")
        self.process.wait(timeout=30)
        return out


class OverHttp:
    """One checkout's ``memory-proxy serve``, a turn at a time; its CPU per turn."""

    def __init__(self, args: argparse.Namespace, impl: str | None, url: str, upstream: str,
                 agents: Path) -> None:
        import servers

        path = [*([str(Path(impl).resolve())] if impl else []), str(ROOT)]
        self.server = servers.memory_proxy(
            f"cold-turn-{'baseline' if impl else 'current'}", upstream, url, agents,
            args.cpus, env={"PYTHONPATH": os.pathsep.join(path),
                            "MEMORY_PROXY_SESSION_CACHE_MB": str(CACHE_MB)},
        ).start()
        self.proxy = path[0]
        self.conn = http.client.HTTPConnection(servers.LOOPBACK, self.server.port, timeout=60)
        self.body = request_body()

    def _post(self, session: str) -> None:
        import populate

        self.conn.request("POST", turn_path(session), body=self.body, headers={
            "Authorization": f"Bearer {populate.API_KEY}", "Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"turn failed: {response.status} {data[:300]!r}")

    def untimed(self, session: str) -> None:
        self._post(session)

    def turn(self, session: str) -> dict[str, Any]:
        cpu = self.server.cpu_seconds()
        self._post(session)
        time.sleep(0.02)  # anything the turn left running in the background finishes
        return {"cpu_ms": (self.server.cpu_seconds() - cpu) * 1e3, "steps_ms": {},
                "store_calls": 0, "sent": 0}

    def done(self) -> dict[str, Any]:
        self.conn.close()
        self.server.stop()
        return {}


def populate_sessions(url: str, sessions: list[str], stored: int) -> None:
    import populate

    asyncio.run(populate.populate(url, populate.DEFAULT_AGENT, sessions, stored))


def run_round(args: argparse.Namespace, impls: list[tuple[str, str | None]],
              urls: dict[str, str], upstream: str, agents: Path,
              sessions: list[str]) -> dict[str, dict[str, Any]]:
    """One child (or server) per checkout; each session's cold turn in each, alternating
    which checkout goes first (then, with ``--warm``, each session's next turn: warm)."""
    runner = OverHttp if args.server else InProcess
    runs = {name: runner(args, impl, urls[name], upstream, agents) for name, impl in impls}
    out: dict[str, dict[str, Any]] = {name: {"turns": [], "warm": [], "proxy": run.proxy}
                                      for name, run in runs.items()}
    try:
        for name in runs:
            runs[name].untimed(sessions[0])
        for kind in ("turns", "warm") if args.warm else ("turns",):
            for index, session in enumerate(sessions[1:]):
                order = list(runs) if index % 2 == 0 else list(reversed(runs))
                for name in order:
                    out[name][kind].append(runs[name].turn(session))
    finally:
        for name, run in runs.items():
            out[name] |= run.done()
    return out


def report(args: argparse.Namespace, rounds: dict[str, list[dict[str, dict[str, Any]]]],
           impls: list[tuple[str, str | None]]) -> None:
    how = "server CPU (schedstat)" if args.server else "process CPU (in process, httpx client)"
    print(f"\nCOLD TURN: {args.stored:,} stored messages, default strategy, {args.sessions} "
          f"turns per round, {args.rounds} rounds; {how}, ms per turn")
    print(f"{'backend':8} {'turn':5} {'impl':9} {'mean':>7} {'median':>7} {'best rnd':>8} "
          f"{'sent':>6} {'rt/turn':>7}  bodies")
    for backend, runs in rounds.items():
        for kind, label in (("turns", "cold"), ("warm", "warm")):
            if not runs[0][impls[0][0]][kind]:
                continue
            for name, _ in impls:
                turns = [t for run in runs for t in run[name][kind]]
                by_round = [statistics.mean(t["cpu_ms"] for t in run[name][kind]) for run in runs]
                cpu = [t["cpu_ms"] for t in turns]
                print(f"{backend:8} {label:5} {name:9} {statistics.mean(cpu):7.2f} "
                      f"{statistics.median(cpu):7.2f} {min(by_round):8.2f} "
                      f"{statistics.mean(t['sent'] for t in turns):6.0f} "
                      f"{statistics.mean(t['store_calls'] for t in turns):7.2f}  "
                      f"{','.join(sorted({r[name].get('bodies', '-') for r in runs}))}")
            if len(impls) == 2:
                (old, _), (new, _) = impls
                pairs = [b["cpu_ms"] / a["cpu_ms"] for run in runs
                         for a, b in zip(run[old][kind], run[new][kind], strict=True)]
                mean_old = statistics.mean(t["cpu_ms"] for r in runs for t in r[old][kind])
                mean_new = statistics.mean(t["cpu_ms"] for r in runs for t in r[new][kind])
                print(f"{backend} {label}: {new} {mean_new:.2f} ms vs {old} {mean_old:.2f} ms "
                      f"per turn: {mean_new / mean_old:.2f}x (median of the paired turns' "
                      f"ratios {statistics.median(pairs):.2f}x)")
    if args.server:
        return
    print("\nCPU ms per cold turn by step (means; store.* are inside load and finish, sqlite.*"
          " on the store's thread inside those; upstream.chat, the call, is in the rest)")
    columns = [(backend, name) for backend in rounds for name, _ in impls]
    print(f"{'step':18}" + "".join(f"{f'{b}/{n}':>18}" for b, n in columns))

    def step_mean(column: tuple[str, str], step: str) -> float:
        backend, name = column
        turns = [t for run in rounds[backend] for t in run[name]["turns"]]
        if step == "(http, forward)":
            return statistics.mean(t["cpu_ms"] - sum(t["steps_ms"].get(s, 0.0) for s in STEPS)
                                   for t in turns)
        return statistics.mean(t["steps_ms"].get(step, 0.0) for t in turns)

    for step in (*STEPS, *(f"store.{c}" for c in STORE_CALLS), *STORE_JOBS.values(),
                 "upstream.chat", "(http, forward)"):
        print(f"{step:18}" + "".join(f"{step_mean(c, step):18.3f}" for c in columns))
    for backend, name in columns:
        for part in ("profile", "store_profile"):
            profile = rounds[backend][0][name].get(part)
            if profile:
                print(f"\ncProfile ({'the loop' if part == 'profile' else 'the store thread'}),"
                      f" {backend}/{name}, first round: own ms, cumulative ms, calls per turn")
                for where, calls, own, cumulative in profile:
                    print(f"  {own:7.3f} {cumulative:7.3f} {calls:8.0f}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "redis", "both"], default="sqlite")
    parser.add_argument("--sessions", type=int, default=20, help="cold turns per round")
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="a directory holding another proxy/, strategies/"
                        " and storage/")
    parser.add_argument("--server", action="store_true",
                        help="measure memory-proxy serve's CPU instead of running in process")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed turns")
    parser.add_argument("--warm", action="store_true",
                        help="then each session's next turn too (warm: the session cached)")
    parser.add_argument("--cpus", help="--server: pin the servers to these CPUs (e.g. 1)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    args = parser.parse_args()

    import_path(None)
    import populate
    import servers

    sys.path.append(str(TESTS))  # after bench/: tests/ has a servers module of its own
    from redis_server import RedisServer, flush_redis

    backends = ["sqlite", "redis"] if args.backend == "both" else [args.backend]
    impls: list[tuple[str, str | None]] = [("current", None)]
    if args.baseline:
        impls.insert(0, ("baseline", args.baseline))
    sessions = populate.session_ids(f"cold-{os.urandom(3).hex()}", args.sessions + 1)
    rounds: dict[str, list[dict[str, dict[str, Any]]]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory(prefix="cold-turn-") as tmp, \
            servers.instant_upstream(None) as upstream:
        agents = populate.write_agents(Path(tmp) / "agents")
        redis = RedisServer().start() if "redis" in backends else None
        try:
            template = Path(tmp) / "template.db"
            if "sqlite" in backends:
                began = time.perf_counter()
                populate_sessions(f"sqlite:///{template}", sessions, args.stored)
                print(f"populated {len(sessions)} sessions of {args.stored:,} in "
                      f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
            for index in range(args.rounds):
                for backend in backends:
                    urls = {}
                    for number, (name, _) in enumerate(impls):
                        if backend == "sqlite":
                            copy = Path(tmp) / f"{name}.db"
                            for suffix in ("", "-wal", "-shm"):
                                Path(f"{copy}{suffix}").unlink(missing_ok=True)
                                if suffix != "-shm" and Path(f"{template}{suffix}").exists():
                                    shutil.copyfile(f"{template}{suffix}", f"{copy}{suffix}")
                            urls[name] = f"sqlite:///{copy}"
                        else:
                            assert redis is not None
                            urls[name] = redis.url.rsplit("/", 1)[0] + f"/{number}"
                            flush_redis(urls[name])
                            populate_sessions(urls[name], sessions, args.stored)
                    run = run_round(args, impls, urls, upstream.url, agents, sessions)
                    rounds[backend].append(run)
                    print(f"round {index + 1} {backend}: " + ", ".join(
                        f"{name} {statistics.mean(t['cpu_ms'] for t in run[name]['turns']):.2f}"
                        f" ms ({run[name]['proxy']})" for name, _ in impls), file=sys.stderr)
        finally:
            if redis is not None:
                redis.close()
    report(args, rounds, impls)


if __name__ == "__main__":
    main()
