"""A run's long-lived processes (the fake upstream, redis-server, the servers under test) and
the phases that use them, in their order (bench/README.md): ``Run.measure`` fills the
results run.py writes. The history pools and their phases are in run_histories.py, the
workers phase in run_workers.py, the measurements themselves in phases.py."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict
from pathlib import Path

import cache as prompt_cache_bench
import inprocess
import load
import phases
import populate
import quality
import run_histories
import run_workers
import servers
from hostspeed import HostSpeed
from load import SessionPool
from phases import Target
from report_format import HTTP_ONLY
from run_plan import CONCURRENCIES, HISTORIES, Plan
from servers import OUT

# the session cache of the C and C' servers of the main phases: room for the shared pool's
# sessions as they grow over the run (the default, 16 MB, holds about a sixth of them; the
# memory check further down runs a proxy with the defaults)
MAIN_CACHE_MB = 256


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
        pools = run_histories.populate_pools(plan, sqlite_url, redis_url)

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

        # the phases whose figures have absolute bounds and little margin come first
        # (latency, time to first byte, the cold turn), throughput after them
        self.step("latency at concurrency 1 (wrk, interleaved rounds)")
        latency = phases.latency_rounds(targets, plan.rounds, plan.round_seconds, env)
        results["latency"] = {k: self.summary(m) for k, m in latency.items()}
        results["latency_added"] = {
            k: {"p50": phases.added_p50(latency, k), "p99": phases.added_p50(latency, k, "p99")}
            for k in by_key if k != "A"
        }

        self.step("streams: time to first byte")
        sse = asyncio.run(phases.closed_rounds(targets, plan.sse_requests, plan.rounds,
                                               stream=True))
        results["sse"] = {k: {"ttfb_p50": m.ttfb_ms(50), "ttfb_p99": m.ttfb_ms(99),
                              "errors": m.errors()} for k, m in sse.items()}
        results["chunks"] = self.chunk_check(upstream, sqlite_url)
        results["long_streams"] = self.long_streams(sqlite_url)

        self.step("histories of " + ", ".join(map(str, HISTORIES)) + " stored messages")
        results["histories"] = run_histories.histories(plan, by_key, pools)
        results["window"] = run_histories.windowed(plan, by_key, pools)

        self.step("throughput (wrk) at concurrency " + ", ".join(map(str, CONCURRENCIES)))
        # C's own server with memory off: what its HTTP path alone costs
        http_only = Target(HTTP_ONLY, "C with `x-memory: off`", c_sqlite.url, c_sqlite,
                           headers={"x-memory": "off"})
        tput = phases.throughput([*targets, http_only], CONCURRENCIES, plan.throughput_seconds,
                                 env, plan.throughput_rounds, between=self.speed.probe)
        results["throughput"] = {c: {k: self.summary(m) for k, m in by.items()}
                                 for c, by in tput.items()}
        results["max_rps"] = {k: phases.max_rps(tput, k) for k in [*by_key, HTTP_ONLY]}
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
        results["workers"] = run_workers.workers(self, fake, redis, redis_url)
        self.step("--workers 2 on a Redis Cluster (unpinned)")
        results["workers_cluster"] = run_workers.workers_cluster(self, fake)

        self.step("memory quality: conversations replayed for every strategy (bench/quality.py)")
        results["quality"] = quality.measure(quick=plan.quick, locomo=self.locomo)

        self.step("prompt cache over a long agent session (bench/cache.py, in process)")
        results["cache"] = asyncio.run(prompt_cache_bench.measure(plan.cache_turns))

    def summary(self, measured: phases.Measured) -> dict[str, float]:
        return {"p50": measured.p50(), "p99": measured.p99(), "rps": measured.rps(),
                "errors": measured.errors(), "requests": measured.requests(),
                "cpu_ms": measured.cpu_per_request_ms(),
                "wait_ms": measured.wait_per_request_ms()}

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
