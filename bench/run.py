"""The benchmark, one command: ``python bench/run.py`` (``--quick`` for a smoke run).

Starts every process as a child of this one, measures the targets side by side, and
writes bench/RESULTS.md (raw numbers in bench/out/results.json). See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import _paths  # noqa: F401  (the repository's packages)
import cache as prompt_cache_bench
import inprocess
import load
import phases
import populate
import quality
import report
import report_cache
import sampling
import servers
from hostspeed import HostSpeed
from load import SessionPool
from phases import Target
from report_format import HTTP_ONLY
from servers import LITELLM_VENV, OUT, ROOT, TOOLS_VENV

CONCURRENCIES = (1, 8, 32, 64)
# the session cache of the C and C' servers of the main phases: room for the shared pool's
# sessions as they grow over the run (the default, 16 MB, holds about a sixth of them; the
# memory check further down runs a proxy with the defaults)
MAIN_CACHE_MB = 256
HISTORIES = (1, 20, 100, 1000, 10000)
# sizes measured with full-history clients too (10,000 would resend 3 MB every turn)
FULL_HISTORIES = (20, 100, 1000)


@dataclass
class Plan:
    quick: bool
    rounds: int
    round_seconds: float
    throughput_seconds: float
    sse_requests: int
    history_requests: int
    inprocess_turns: int
    profile_seconds: float
    pool_sessions: int
    big_sessions: int  # the "10,000 sessions stored" memory check
    big_session_messages: int
    ready_repeats: int
    workers_seconds: float  # each round of the workers phase
    throughput_rounds: int = 3  # each a cell of throughput_seconds per target and concurrency
    cache_turns: int = 200  # the prompt-cache phase's session (bench/cache.py)

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, 2, 1, 1, 40, 24, 2, 3, 600, 10000, 2, 1, 1, throughput_rounds=1,
                       cache_turns=40)
        return cls(False, 5, 2, 2, 300, 150, 5, 8, 3000, 10000, 10, 3, 2)


def cpu_layout() -> tuple[str | None, str | None]:
    """(environment CPUs, server CPUs): client, fake upstream and redis on core 0, the
    server under test alone on core 1. No pinning on a one-core machine."""
    if (os.cpu_count() or 1) < 2:
        return None, None
    return "0", "1"


def ensure_venv(venv: Path, packages: list[str], allowed: bool) -> str | None:
    """Create ``venv`` with ``packages`` unless it exists; None on success, else why not."""
    if (venv / "bin" / "python").exists():
        return None
    if not allowed:
        return f"{venv.relative_to(ROOT)} is missing and --no-install was given"
    print(f"installing {' '.join(packages)} into {venv.relative_to(ROOT)} ...", flush=True)
    log = OUT / "logs" / f"install-{venv.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=out, stderr=out)
        if made.returncode == 0:
            made = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages],
                                  stdout=out, stderr=out)
    if made.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"pip install {' '.join(packages)} failed: {' / '.join(tail)}"
    return None


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "cpu": f"{os.cpu_count()} x {cpu}",
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cpu_fields() -> list[int]:
    """The machine's CPU time so far, in ticks, by kind (the ``cpu`` line of /proc/stat:
    user, nice, system, idle, iowait, irq, softirq, steal)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def cpu_ticks() -> tuple[int, int]:
    """The machine's steal and total CPU time so far, in ticks: steal is the time the
    hypervisor ran other guests while this one had work to run."""
    fields = _cpu_fields()
    return fields[7], sum(fields)


def idle_ticks() -> tuple[int, int]:
    """The machine's idle (idle + iowait) and total CPU time so far, in ticks."""
    fields = _cpu_fields()
    return fields[3] + fields[4], sum(fields)


def reaped_children_cpu() -> float:
    """CPU seconds of this process's children that have exited and been waited for (wrk)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~2 min)")
    parser.add_argument("--no-install", action="store_true",
                        help="do not create bench/out/venv-* (LiteLLM's proxy, py-spy)")
    parser.add_argument("--skip-litellm", action="store_true", help="leave out target D")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--locomo", type=Path,
                        help="a LoCoMo-format JSON file of your own for the memory-quality phase")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from bench/out/results.json, measure nothing")
    parser.add_argument("--cache-only", action="store_true",
                        help="run the prompt-cache phase alone (bench/cache.py, in process) "
                             "and rewrite its section of the report")
    args = parser.parse_args(argv)
    if args.cache_only:
        turns = Plan.make(args.quick).cache_turns
        output = Path(args.output)
        measured = asyncio.run(prompt_cache_bench.measure(turns))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "cache.json").write_text(json.dumps(measured, indent=1))
        output.write_text(report_cache.with_cache_section(output.read_text(), measured))
        return 0
    if args.report_only:
        Path(args.output).write_text(report.render(saved_results()))
        return 0
    plan = Plan.make(args.quick)
    command = "python bench/run.py" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": command, "plan": asdict(plan), "machine": machine(),
                     "load_before": loadavg(), "notes": []}
    started = time.perf_counter()
    steal_before, total_before = cpu_ticks()

    litellm_reason = None
    if args.skip_litellm:
        litellm_reason = "left out with --skip-litellm"
    else:
        litellm_reason = ensure_venv(LITELLM_VENV, ["litellm[proxy]"], not args.no_install)
        litellm_reason = litellm_reason or servers.litellm_available()
    tools_reason = ensure_venv(TOOLS_VENV, ["py-spy"], not args.no_install)
    if tools_reason:
        results["notes"].append(f"no profile: {tools_reason}")
    results["litellm"] = litellm_reason

    env_cpus, sut_cpus = cpu_layout()
    results["cpus"] = {"environment": env_cpus, "server": sut_cpus}
    with Run(plan, env_cpus, sut_cpus, litellm_reason, args.locomo) as run:
        run.measure(results)
        results["host_speed"] = run.speed.summary()
    results["seconds"] = time.perf_counter() - started
    results["load_after"] = loadavg()
    steal_after, total_after = cpu_ticks()
    results["steal_percent"] = (
        100 * (steal_after - steal_before) / max(1, total_after - total_before)
    )
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    Path(args.output).write_text(report.render(results))
    print(f"wrote {args.output} in {results['seconds']:.0f} s", flush=True)
    return 0


def saved_results() -> dict:
    """results.json as ``measure`` left it: integer keys back, profiles re-read."""
    results = json.loads((OUT / "results.json").read_text())
    for name in ("throughput", "histories", "workers"):
        results[name] = {int(k): v for k, v in results[name].items()}
    for counts in results["workers"].values():
        for key in list(counts):
            counts[int(key)] = counts.pop(key)
    for key, entry in results["profiles"].items():
        raw = OUT / "profiles" / f"{key.replace(chr(39), '2')}.txt"
        if raw.exists():
            entry["profile"] = sampling.summarize(raw)
    return results


class Run:
    """The long-lived processes of a run and the phases that use them."""

    def __init__(self, plan: Plan, env_cpus: str | None, sut_cpus: str | None,
                 litellm_reason: str | None, locomo: Path | None = None) -> None:
        self.plan = plan
        self.locomo = locomo
        self.env_cpus, self.sut_cpus = env_cpus, sut_cpus
        self.litellm_reason = litellm_reason
        self.started: list[servers.Server] = []
        self.agents = populate.write_agents(OUT / "agents")
        # probed at every step and after every throughput round: how fast the host ran
        self.speed = HostSpeed(sut_cpus)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        for server in reversed(self.started):
            server.stop()

    def start(self, server: servers.Server) -> servers.Server:
        self.started.append(server)
        if server.name.startswith("redis"):
            return servers.start_redis(server)
        return server.start()

    def launch(self, server: servers.Server) -> servers.Server:
        """Spawn without waiting (slow starters overlap with other work)."""
        self.started.append(server)
        return server.launch()

    def stop(self, server: servers.Server) -> None:
        server.stop()
        self.started.remove(server)

    def step(self, what: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)
        self.speed.probe()

    def measure(self, results: dict) -> None:
        plan, env, sut = self.plan, self.env_cpus, self.sut_cpus
        self.step("starting the fake upstream and redis")
        fake = self.start(servers.instant_upstream(env))
        upstream = fake.url + "/v1"
        redis = self.start(servers.redis_server(env))
        redis_url = f"redis://127.0.0.1:{redis.port}/0"
        sqlite_url, _ = phases.store_file("bench")
        litellm = None
        if self.litellm_reason is None:  # slow to start: it starts while histories are stored
            litellm = self.launch(servers.litellm_proxy(upstream, populate.MODEL, sut))

        self.step("storing histories")
        pools = self.populate_pools(sqlite_url, redis_url)

        self.step("starting B, C, C', D")
        passthrough = self.launch(servers.passthrough(upstream, sut))
        cache = {"MEMORY_PROXY_SESSION_CACHE_MB": str(MAIN_CACHE_MB)}
        results["main_cache_mb"] = MAIN_CACHE_MB
        c_sqlite = self.launch(servers.memory_proxy("memory-proxy-sqlite", upstream, sqlite_url,
                                                    self.agents, sut, env=cache))
        c_redis = self.launch(servers.memory_proxy("memory-proxy-redis", upstream, redis_url,
                                                   self.agents, sut, env=cache))
        for server in (passthrough, c_sqlite, c_redis):
            server.wait_ready()
        targets = [
            Target("A", "client straight to the fake upstream (bench/instant_upstream.py: the "
                   "test fake's instant replies, the same bytes, at half its CPU)", fake.url, fake),
            Target("B", "bare pass-through proxy (the Python floor)", passthrough.url,
                   passthrough),
            Target("C", "memory-proxy, embedded SQLite store", c_sqlite.url, c_sqlite,
                   pools["sqlite"]),
            Target("C'", "memory-proxy, Redis store", c_redis.url, c_redis, pools["redis"]),
        ]
        if litellm is not None:
            try:
                litellm.wait_ready(timeout=120)
                targets.append(Target("D", "LiteLLM proxy (no database, no callbacks)",
                                      litellm.url, litellm))
                results["litellm_ready_s"] = litellm.ready_seconds
            except RuntimeError as exc:
                self.litellm_reason = f"LiteLLM's proxy did not start: {exc}"
        results["litellm"] = self.litellm_reason
        results["targets"] = {t.key: t.label for t in targets}
        by_key = {t.key: t for t in targets}

        self.step("warm-up")
        phases.warm_up(targets, env)

        self.step("latency at concurrency 1 (wrk, interleaved rounds)")
        latency = phases.latency_rounds(targets, plan.rounds, plan.round_seconds, env)
        results["latency"] = {k: self.summary(m) for k, m in latency.items()}
        results["latency_added"] = {
            k: {"p50": phases.added_p50(latency, k), "p99": phases.added_p50(latency, k, "p99")}
            for k in by_key if k != "A"
        }

        self.step("throughput (wrk) at concurrency " + ", ".join(map(str, CONCURRENCIES)))
        # C's own server with memory off: what its HTTP path alone costs
        http_only = Target(HTTP_ONLY, "C with `x-memory: off`", c_sqlite.url, c_sqlite,
                           headers={"x-memory": "off"})
        tput = phases.throughput([*targets, http_only], CONCURRENCIES, plan.throughput_seconds,
                                 env, plan.throughput_rounds, between=self.speed.probe)
        results["throughput"] = {c: {k: self.summary(m) for k, m in by.items()}
                                 for c, by in tput.items()}
        results["max_rps"] = {k: phases.max_rps(tput, k) for k in [*by_key, HTTP_ONLY]}

        self.step("streams: time to first byte")
        sse = asyncio.run(phases.closed_rounds(targets, plan.sse_requests, plan.rounds,
                                               stream=True))
        results["sse"] = {k: {"ttfb_p50": m.ttfb_ms(50), "ttfb_p99": m.ttfb_ms(99),
                              "errors": m.errors()} for k, m in sse.items()}
        results["chunks"] = self.chunk_check(upstream, sqlite_url)
        results["long_streams"] = self.long_streams(sqlite_url)

        self.step("histories of " + ", ".join(map(str, HISTORIES)) + " stored messages")
        results["histories"] = self.histories(by_key, pools)
        results["window"] = self.windowed(by_key, pools)
        results["pool_turns"] = {k: p.turns_per_session() for k, p in
                                 (("sqlite", pools["sqlite"]), ("redis", pools["redis"]))}

        self.step("profiles under load (py-spy, perf)")
        results["profiles"] = {}
        for target in (by_key["C"], by_key["C'"]):
            profile, result = phases.profile_under_load(
                target, plan.profile_seconds, 32, env, target.key.replace("'", "2"), gil=True)
            results["profiles"][target.key] = {"profile": profile, "rps": result.rps}
        split, result = phases.native_split(by_key["C"], plan.profile_seconds, 32, env, "C")
        results["native"] = {"C": {"shares": split, "rps": result.rps}}
        results["peak_rss_mb"] = {t.key: t.server.peak_rss_mb() for t in targets}
        results["redis_cpu_s"] = redis.cpu_seconds()
        results["cores"] = os.cpu_count() or 1
        results["session_cache"] = {key: phases.session_cache_counts(by_key[key].base_url)
                                    for key in ("C", "C'")}

        self.step("store round trips and tokenizing per turn (in process)")
        results["inprocess"] = self.inprocess(upstream, redis.port)

        for server in [passthrough, c_sqlite, c_redis] + [t.server for t in targets
                                                           if t.key == "D"]:
            self.stop(server)

        self.step("time to ready")
        results["ready"] = {
            "C": phases.time_to_ready(lambda: servers.memory_proxy(
                "ready-sqlite", upstream, phases.store_file("ready")[0], self.agents, sut),
                plan.ready_repeats),
            "C'": phases.time_to_ready(lambda: servers.memory_proxy(
                "ready-redis", upstream, redis_url.replace("/0", "/3"), self.agents, sut),
                plan.ready_repeats),
        }

        results["tokenizer_memory"] = phases.tokenizer_memory()

        self.step(f"memory with {plan.big_sessions:,} sessions stored")
        results["big"] = self.many_sessions(upstream, redis.port)

        self.step("--workers 1 and 2 on Redis (unpinned)")
        results["workers"] = self.workers(fake, redis, redis_url)
        self.step("--workers 2 on a Redis Cluster (unpinned)")
        results["workers_cluster"] = self.workers_cluster(fake)

        self.step("memory quality: conversations replayed for every strategy (bench/quality.py)")
        results["quality"] = quality.measure(quick=plan.quick, locomo=self.locomo)

        self.step("prompt cache over a long agent session (bench/cache.py, in process)")
        results["cache"] = asyncio.run(prompt_cache_bench.measure(plan.cache_turns))

    def summary(self, measured: phases.Measured) -> dict[str, float]:
        return {"p50": measured.p50(), "p99": measured.p99(), "rps": measured.rps(),
                "errors": measured.errors(), "requests": measured.requests(),
                "cpu_ms": measured.cpu_per_request_ms(),
                "wait_ms": measured.wait_per_request_ms()}

    def populate_pools(self, sqlite_url: str, redis_url: str) -> dict[str, SessionPool]:
        """The shared pool (20 stored messages each) and one pool per history size."""
        pools: dict[str, SessionPool] = {}
        for store, url in (("sqlite", sqlite_url), ("redis", redis_url)):
            wanted = [(store, SessionPool(populate.DEFAULT_AGENT, "pool", self.plan.pool_sessions),
                       20)]
            for size in HISTORIES:
                pool = SessionPool(populate.DEFAULT_AGENT, f"h{size}", self.history_sessions(size))
                wanted.append((f"{store}-h{size}", pool, size))
            for size in FULL_HISTORIES:
                pool = SessionPool(populate.DEFAULT_AGENT, f"f{size}", self.history_sessions(size))
                wanted.append((f"{store}-f{size}", pool, size))
            for size in (100, 10000):
                pool = SessionPool(populate.WINDOWED_AGENT, f"w{size}",
                                   self.history_sessions(size))
                wanted.append((f"{store}-w{size}", pool, size))
            for name, pool, size in wanted:
                asyncio.run(populate.populate(url, pool.agent, pool.sessions(), size))
                pools[name] = pool
        return pools

    def history_sessions(self, size: int) -> int:
        # each measured turn adds 2 messages: enough sessions that growth stays small
        budget = 8000 if self.plan.quick else 40000  # stored messages per pool
        # and at least 8 sessions (2 in a quick run): each gives one cold turn
        return max(2 if self.plan.quick else 8, min(self.plan.history_requests + 2, budget // size))

    def histories(self, by_key: dict[str, Target], pools: dict[str, SessionPool]) -> dict:
        """Per size: one turn on every session of the pool first (cold: the proxy reads the
        session from its store), then the measured rounds (warm: the session is in its
        cache and only the head is read)."""
        out = {}
        chosen = [by_key[k] for k in ("A", "C", "C'")]
        for size in HISTORIES:
            size_pools = {"C": pools[f"sqlite-h{size}"], "C'": pools[f"redis-h{size}"]}
            cold = {key: asyncio.run(phases.cold_turns(by_key[key], pool))
                    for key, pool in size_pools.items()}
            measured = asyncio.run(phases.closed_rounds(
                chosen, self.plan.history_requests, self.plan.rounds, pools=size_pools,
            ))
            out[size] = {k: {"p50": m.latency_ms(50), "p99": m.latency_ms(99),
                             "cpu_ms": m.cpu_per_request_ms(), "errors": m.errors()}
                         for k, m in measured.items()}
            for key, m in cold.items():
                out[size][key] |= {"cold_p50": m.latency_ms(50),
                                   "cold_cpu_ms": m.cpu_per_request_ms(),
                                   "cold_turns": m.requests(), "errors": out[size][key]["errors"]
                                   + m.errors()}
            if size in FULL_HISTORIES:
                out[size]["full"] = self.full_history(by_key, pools, size)
        return out

    def full_history(self, by_key: dict[str, Target], pools: dict[str, SessionPool],
                     size: int) -> dict:
        """The same as ``histories`` with full-history clients: every turn resends the
        session's whole conversation (``size`` stored messages and the turns since). A gets
        requests of the same size."""
        history = [{"role": m.role, "content": m.content} for m in populate.history(size)]
        resend = {"A": load.Resender(history, grow=False), "C": load.Resender(history),
                  "C'": load.Resender(history)}
        full_pools = {"C": pools[f"sqlite-f{size}"], "C'": pools[f"redis-f{size}"]}
        cold = {key: asyncio.run(phases.cold_turns(by_key[key], pool, resend[key]))
                for key, pool in full_pools.items()}
        measured = asyncio.run(phases.closed_rounds(
            [by_key[k] for k in ("A", "C", "C'")], self.plan.history_requests, self.plan.rounds,
            pools=full_pools, resend=resend))
        out = {k: {"p50": m.latency_ms(50), "p99": m.latency_ms(99),
                   "cpu_ms": m.cpu_per_request_ms(), "errors": m.errors()}
               for k, m in measured.items()}
        for key, m in cold.items():
            out[key] |= {"cold_p50": m.latency_ms(50), "cold_cpu_ms": m.cpu_per_request_ms(),
                         "errors": out[key]["errors"] + m.errors()}
        return out

    def windowed(self, by_key: dict[str, Target], pools: dict[str, SessionPool]) -> dict:
        out = {}
        for key, store in (("C", "sqlite"), ("C'", "redis")):
            target = by_key[key]
            small = Target(f"{key} 100", "", target.base_url, target.server, pools[f"{store}-w100"])
            large = Target(f"{key} 10000", "", target.base_url, target.server,
                           pools[f"{store}-w10000"])
            measured = asyncio.run(phases.closed_rounds(
                [by_key["A"], small, large], self.plan.history_requests, self.plan.rounds))
            a, s, la = measured["A"], measured[small.key], measured[large.key]
            out[key] = {
                "A_p50": a.latency_ms(50), "p50_100": s.latency_ms(50),
                "p50_10000": la.latency_ms(50), "cpu_ms_100": s.cpu_per_request_ms(),
                "cpu_ms_10000": la.cpu_per_request_ms(),
                "errors": s.errors() + la.errors(),
            }
        return out

    def chunk_check(self, upstream_unused: str, sqlite_url: str) -> dict:
        """A fake that streams 12 events 20 ms apart, straight and through memory-proxy."""
        slow = self.start(servers.fake_upstream(
            self.env_cpus, extra=("--delay-between-chunks", "0.02", "--reply-words", "10"),
            name="fake-slow"))
        proxy = self.start(servers.memory_proxy("memory-proxy-slow", slow.url + "/v1",
                                                sqlite_url, self.agents, self.sut_cpus))
        try:
            a = Target("A", "", slow.url, slow)
            c = Target("C", "", proxy.url, proxy)
            path = SessionPool(populate.DEFAULT_AGENT, "chunks", 1).path(0)
            asyncio.run(phases.chunk_timing(a, c, path))  # warm
            timing = asyncio.run(phases.chunk_timing(a, c, path))
        finally:
            self.stop(proxy)
            self.stop(slow)
        return timing

    def long_streams(self, sqlite_url: str) -> dict:
        """CPU per streamed turn when a reply is long: a fake that streams 300 events, all
        in one write (a fast model, or a proxy catching up under load), through B and C at
        concurrency 8. What each event costs on its way through."""
        fake = self.start(servers.fake_upstream(self.env_cpus, extra=("--reply-words", "300"),
                                                name="fake-long"))
        b = self.start(servers.passthrough(fake.url + "/v1", self.sut_cpus))
        c = self.start(servers.memory_proxy("memory-proxy-long", fake.url + "/v1", sqlite_url,
                                            self.agents, self.sut_cpus))
        out: dict = {}
        try:
            pool = SessionPool(populate.DEFAULT_AGENT, "long", 200)
            for key, server, sessions in (("B", b, None), ("C", c, pool)):
                requests = 200 if self.plan.quick else 1200
                asyncio.run(load.closed_loop(server.url, requests=100, concurrency=8,
                                             pool=sessions, stream=True))  # warm
                cpu = server.cpu_seconds()
                result = asyncio.run(load.closed_loop(server.url, requests=requests,
                                                      concurrency=8, pool=sessions, stream=True))
                out[key] = {"cpu_ms": (server.cpu_seconds() - cpu) / max(1, result.requests)
                            * 1000, "p50": load.percentile(result.latencies, 50) * 1000,
                            "errors": result.errors}
        finally:
            for server in (c, b, fake):
                self.stop(server)
        return out

    def inprocess(self, upstream: str, redis_port: int) -> list[dict]:
        costs = []
        for store_url, port in ((phases.store_file("inprocess")[0], None),
                                (f"redis://127.0.0.1:{redis_port}/1", redis_port)):
            costs += asyncio.run(inprocess.measure(
                store_url, upstream, self.agents, turns=self.plan.inprocess_turns,
                tag="inproc", redis_port=port))
        return [asdict(c) for c in costs]

    def many_sessions(self, upstream: str, redis_port: int) -> dict:
        plan, out = self.plan, {}
        pool = SessionPool(populate.DEFAULT_AGENT, "many", plan.big_sessions)
        for key, url in (("C", phases.store_file("many")[0]),
                         ("C'", f"redis://127.0.0.1:{redis_port}/2")):
            began = time.perf_counter()
            asyncio.run(populate.populate(url, pool.agent, pool.sessions(),
                                          plan.big_session_messages))
            filled = time.perf_counter() - began
            server = self.start(servers.memory_proxy(f"many-{key}", upstream, url, self.agents,
                                                     self.sut_cpus))
            idle = server.rss_mb()
            target = Target(key, "", server.url, server, pool)
            # full run: enough turns to touch about every session once
            seconds = 2.0 if plan.quick else max(2.0, plan.big_sessions / 1500)
            result = phases.wrk_run(target, 32, seconds, self.env_cpus)
            out[key] = {"sessions": plan.big_sessions, "messages_each": plan.big_session_messages,
                        "populate_s": filled, "ready_s": server.ready_seconds,
                        "idle_rss_mb": idle, "turns": result.requests, "rps": result.rps,
                        "errors": result.errors, "peak_rss_mb": server.peak_rss_mb(),
                        "rss_mb": server.rss_mb()}
            self.stop(server)
        return out

    def workers(self, fake: servers.Server, redis: servers.Server, redis_url: str) -> dict:
        """One and two workers side by side: both servers up at once, measured in
        alternation over ``plan.rounds`` rounds; medians of the rounds (CPU summed). Besides
        the proxy's CPU, each cell charges what the rest of the machine spent on the same
        requests (wrk, the fake upstream, redis-server) and how long the cores sat idle:
        what bounds the second worker."""
        targets = {count: self.workers_target(f"workers-{count}", fake, redis_url, count)
                   for count in (1, 2)}
        return self.measure_workers(targets, fake, redis.cpu_seconds)

    def workers_cluster(self, fake: servers.Server) -> dict:
        """Two workers on a Redis Cluster (three masters, three replicas, on loopback; the
        test suite's fixture): the cluster row of the workers table. *Others* charges all
        six redis-server processes."""
        sys.path.insert(0, str(ROOT / "tests"))
        from redis_cluster import RedisCluster

        with RedisCluster() as cluster:
            def nodes_cpu() -> float:
                return sum(servers.cpu_seconds(node.process.pid) for node in cluster.nodes
                           if node.process is not None)

            targets = {2: self.workers_target("workers-cluster", fake, cluster.url, 2)}
            return self.measure_workers(targets, fake, nodes_cpu)

    def workers_target(self, name: str, fake: servers.Server, url: str, count: int) -> Target:
        server = self.start(servers.memory_proxy(
            name, fake.url + "/v1", url, self.agents, None, workers=count))
        target = Target(f"C' x{count}", "", server.url, server,
                        SessionPool(populate.DEFAULT_AGENT, name.replace("-", ""), 2000))
        phases.wrk_run(target, 16, 2, self.env_cpus)  # every worker up and warm
        return target

    def measure_workers(self, targets: dict[int, Target], fake: servers.Server,
                        store_cpu: Callable[[], float]) -> dict:
        cells: dict[int, dict[int, list[dict]]] = {count: {32: [], 64: []} for count in targets}
        for _ in range(self.plan.rounds):
            for concurrency in (32, 64):
                for count, target in targets.items():
                    others = store_cpu() + fake.cpu_seconds() + reaped_children_cpu()
                    idle, total = idle_ticks()
                    result, cpu, _ = phases.charged(
                        target, lambda t=target, c=concurrency: phases.wrk_run(
                            t, c, self.plan.workers_seconds, self.env_cpus))
                    idle_after, total_after = idle_ticks()
                    cells[count][concurrency].append(
                        {"rps": result.rps, "p50": result.p50, "p99": result.p99,
                         "errors": result.errors, "cpu_s": cpu, "requests": result.requests,
                         "others_cpu_s": store_cpu() + fake.cpu_seconds()
                         + reaped_children_cpu() - others,
                         "idle_share": (idle_after - idle) / max(1, total_after - total)})
        for target in targets.values():
            self.stop(target.server)
        return {
            count: {
                concurrency: {
                    **{key: statistics.median(run[key] for run in runs)
                       for key in ("rps", "p50", "p99", "idle_share")},
                    **{key: sum(run[key] for run in runs)
                       for key in ("errors", "cpu_s", "others_cpu_s", "requests")},
                    "rounds": len(runs),
                }
                for concurrency, runs in by.items()
            }
            for count, by in cells.items()
        }


if __name__ == "__main__":
    sys.exit(main())
