"""The history pools of a run and the per-turn cost against them (phases 1 and 5 in
bench/README.md): sessions written straight through the Store API, the shared pool with 20
stored messages each and a pool per history size (delta clients, full-history clients, the
windowed agent), then every size measured cold and warm."""

from __future__ import annotations

import asyncio

import load
import phases
import populate
from load import SessionPool
from phases import Target
from run_plan import FULL_HISTORIES, HISTORIES, Plan


def populate_pools(plan: Plan, sqlite_url: str, redis_url: str) -> dict[str, SessionPool]:
    """The shared pool (20 stored messages each) and one pool per history size."""
    pools: dict[str, SessionPool] = {}
    for store, url in (("sqlite", sqlite_url), ("redis", redis_url)):
        wanted = [(store, SessionPool(populate.DEFAULT_AGENT, "pool", plan.pool_sessions), 20)]
        for size in HISTORIES:
            pool = SessionPool(populate.DEFAULT_AGENT, f"h{size}", history_sessions(plan, size))
            wanted.append((f"{store}-h{size}", pool, size))
        for size in FULL_HISTORIES:
            pool = SessionPool(populate.DEFAULT_AGENT, f"f{size}", history_sessions(plan, size))
            wanted.append((f"{store}-f{size}", pool, size))
        for size in (100, 10000):
            # as many sessions at either size, so both are measured in the same state
            pool = SessionPool(populate.WINDOWED_AGENT, f"w{size}",
                               history_sessions(plan, 10000))
            wanted.append((f"{store}-w{size}", pool, size))
        for name, pool, size in wanted:
            asyncio.run(populate.populate(url, pool.agent, pool.sessions(), size))
            pools[name] = pool
    return pools


def history_sessions(plan: Plan, size: int) -> int:
    # each measured turn adds 2 messages: enough sessions that growth stays small
    budget = 8000 if plan.quick else 40000  # stored messages per pool
    # and at least 8 sessions (2 in a quick run): each gives one cold turn
    return max(2 if plan.quick else 8, min(plan.history_requests + 2, budget // size))


def histories(plan: Plan, by_key: dict[str, Target], pools: dict[str, SessionPool]) -> dict:
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
            chosen, plan.history_requests, plan.rounds, pools=size_pools,
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
            out[size]["full"] = full_history(plan, by_key, pools, size)
    return out


def full_history(plan: Plan, by_key: dict[str, Target], pools: dict[str, SessionPool],
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
        [by_key[k] for k in ("A", "C", "C'")], plan.history_requests, plan.rounds,
        pools=full_pools, resend=resend))
    out = {k: {"p50": m.latency_ms(50), "p99": m.latency_ms(99),
               "cpu_ms": m.cpu_per_request_ms(), "errors": m.errors()}
           for k, m in measured.items()}
    for key, m in cold.items():
        out[key] |= {"cold_p50": m.latency_ms(50), "cold_cpu_ms": m.cpu_per_request_ms(),
                     "errors": out[key]["errors"] + m.errors()}
    return out


def windowed(plan: Plan, by_key: dict[str, Target], pools: dict[str, SessionPool]) -> dict:
    out = {}
    for key, store in (("C", "sqlite"), ("C'", "redis")):
        target = by_key[key]
        small = Target(f"{key} 100", "", target.base_url, target.server, pools[f"{store}-w100"])
        large = Target(f"{key} 10000", "", target.base_url, target.server,
                       pools[f"{store}-w10000"])
        for side in (small, large):  # each session served once: the rounds are warm turns
            assert side.pool is not None
            asyncio.run(phases.cold_turns(side, side.pool))
        measured = asyncio.run(phases.closed_rounds(
            [by_key["A"], small, large], plan.history_requests, plan.rounds))
        a, s, la = measured["A"], measured[small.key], measured[large.key]
        out[key] = {
            "A_p50": a.latency_ms(50), "p50_100": s.latency_ms(50),
            "p50_10000": la.latency_ms(50), "cpu_ms_100": s.cpu_per_request_ms(),
            "cpu_ms_10000": la.cpu_per_request_ms(),
            "errors": s.errors() + la.errors(),
        }
    return out
