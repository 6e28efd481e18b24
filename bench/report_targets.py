"""The report's targets, each with its number and verdict, and for the unmet ones what
bounds them, read from the run's CPU accounting and profiles."""

from __future__ import annotations

from typing import Any

from report_format import HTTP_ONLY, ms, verdict
from sampling import Profile


def targets(r: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """The issue's targets, each with its number and verdict; and the unmet ones."""
    rows: list[list[Any]] = []
    unmet: list[str] = []

    def check(name: str, value: str, ok: bool | None) -> None:
        rows.append([name, value, verdict(ok)])
        if ok is False:
            unmet.append(name)

    added = r["latency_added"].get("C", {})
    check("added latency p50 at concurrency 1 (C vs A) ≤ 1 ms", ms(added.get("p50")),
          added.get("p50", 99) <= 1.0)
    check("added latency p99 at concurrency 1 (C vs A) ≤ 5 ms", ms(added.get("p99")),
          added.get("p99", 99) <= 5.0)
    c32 = r["throughput"][32]
    c_rps = c32["C"]["rps"] if c32["C"]["errors"] == 0 else 0.0
    # the redesign's bounds (one pipeline, library-backed edges, simple stores)
    check("throughput at concurrency 32, one worker (C) ≥ 1,200 req/s", f"{c_rps:,.0f} req/s",
          c_rps >= 1200)
    if "D" in c32:
        d_rps = c32["D"]["rps"]
        ratio = c_rps / d_rps if d_rps else 0.0
        check("throughput at concurrency 32 ≥ 10x LiteLLM's proxy (C / D)", f"{ratio:.1f}x",
              ratio >= 10)
    else:
        check("throughput ≥ 10x LiteLLM's proxy", "D not run", None)
    cold = r["histories"].get("10000", r["histories"].get(10000, {})).get("C", {})
    if "cold_cpu_ms" in cold:
        check("a cold turn at 10,000 stored ≤ 10 ms (C, proxy CPU per turn)",
              ms(cold["cold_cpu_ms"]), cold["cold_cpu_ms"] <= 10.0)
    sse = r["sse"]
    overhead = sse["C"]["ttfb_p50"] - sse["A"]["ttfb_p50"]
    check("SSE time-to-first-byte overhead p50 (C vs A) ≤ 1 ms", ms(overhead), overhead <= 1.0)
    spread = chunk_spread(r["chunks"])
    check("chunks forwarded as they arrive (slow stream: last-first arrival, C vs A)",
          f"{spread['C']:.0f} ms vs {spread['A']:.0f} ms over {spread['pieces_C']} reads",
          spread["pieces_C"] > 2 and spread["C"] >= 0.8 * spread["A"])
    window = r["window"]["C"]
    ratio = window["cpu_ms_10000"] / window["cpu_ms_100"] if window["cpu_ms_100"] else 0.0
    latency = window["p50_10000"] / window["p50_100"] if window["p50_100"] else 0.0
    check("windowed 100: a turn on 10,000 stored costs ≤ 1.2x one on 100 stored "
          "(proxy CPU per turn; p50 latency ratio beside it)",
          f"{ratio:.2f}x (latency {latency:.2f}x)", ratio <= 1.2)
    trips = max((c["round_trips"] for c in r["inprocess"]), default=0)
    check("≤ 3 store round trips per turn (worst scenario, both stores)", f"{trips:.1f}",
          trips <= 3)
    grows = tokenizing_grows(r["inprocess"])
    check("no tokenizing of already-stored messages (text tokenized per turn flat in history)",
          "flat" if not grows else "grows with history", not grows)
    ready = r["ready"]["C"]["ready_s"]
    check("ready to serve ≤ 2 s (spawn to /ready 200, SQLite)", f"{ready:.2f} s", ready <= 2)
    big = r["big"]["C"]
    check(f"RSS ≤ 150 MB with {big['sessions']:,} sessions stored (peak, SQLite)",
          f"{big['peak_rss_mb']:.0f} MB", big["peak_rss_mb"] <= 150)
    big_r = r["big"]["C'"]
    check(f"RSS ≤ 150 MB with {big_r['sessions']:,} sessions stored (peak, Redis)",
          f"{big_r['peak_rss_mb']:.0f} MB", big_r["peak_rss_mb"] <= 150)
    workers = r["workers"]
    one, two = workers[1][32]["rps"], workers[2][32]["rps"]
    check("`serve --workers 2` scales on Redis (req/s at concurrency 32, 2 vs 1 worker)",
          f"{two / one if one else 0:.2f}x ({one:,.0f} → {two:,.0f})",
          one > 0 and two / one >= 1.2)
    return rows, unmet


def chunk_spread(chunks: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("A", "C"):
        times = chunks.get(key) or [0.0]
        out[key] = (times[-1] - times[0]) * 1000
        out[f"pieces_{key}"] = len(times)
    return out


def tokenizing_grows(costs: list[dict[str, Any]]) -> bool:
    by = {(c["store"], c["scenario"]): c["tokenized_chars"] for c in costs}
    for store in ("sqlite", "redis"):
        small = by.get((store, "delta turn, 20 stored"))
        large = by.get((store, "delta turn, 10,000 stored"))
        if small is not None and large is not None and large > small * 1.1 + 200:
            return True
    return False


def bounds(r: dict[str, Any], unmet: list[str]) -> list[str]:
    """Data-driven explanations: where the time goes, from CPU accounting and profiles."""
    out: list[str] = []
    cpu_bound = [n for n in unmet if any(w in n for w in ("latency", "throughput", "first-byte"))]
    if cpu_bound:
        out += [f"- **{', '.join(cpu_bound)}**: " + _cpu_bound(r), ""]
    for name in unmet:
        if name in cpu_bound:
            continue
        out += [f"- **{name}**: " + _explain(name, r), ""]
    return out


def _cpu_bound(r: dict[str, Any]) -> str:
    lat, c32 = r["latency"], r["throughput"][32]
    c1, b1, a1 = lat["C"]["cpu_ms"], lat.get("B", {}).get("cpu_ms", 0.0), lat["A"]["cpu_ms"]
    text = (
        f"the proxy's CPU per request. At concurrency 1 it spends {c1:.2f} ms of CPU per turn "
        f"(the bare pass-through B, uvicorn with an aiohttp client: {b1:.2f} ms; the fake "
        f"upstream: {a1:.2f} ms) and waits {lat['C']['wait_ms']:.2f} ms per turn for a CPU "
        "held by other processes; added latency is about the sum. At concurrency 32 a turn "
        f"costs {c32['C']['cpu_ms']:.2f} ms of CPU, so one core passes at most "
        f"{1000 / c32['C']['cpu_ms'] if c32['C']['cpu_ms'] else 0:,.0f} turns/s; 1,200/s needs "
        "≤ 0.83 ms."
    )
    http_only = c32.get(HTTP_ONLY)
    if http_only and http_only["cpu_ms"]:
        b32 = c32.get("B", {}).get("cpu_ms", 0.0)
        text += (
            f" Of that, the proxy's HTTP path alone ({HTTP_ONLY}: the same server with "
            f"`x-memory: off`) costs {http_only['cpu_ms']:.2f} ms against B's "
            f"{b32:.2f} ms, so the memory work (load, window, mapping, the write, the "
            "bigger request upstream) is about "
            f"{c32['C']['cpu_ms'] - http_only['cpu_ms']:.2f} ms of the turn."
        )
    entry = r["profiles"].get("C")
    if entry and isinstance(entry["profile"], Profile):
        profile = entry["profile"]

        def share(function: str) -> float:
            return sum(v for f, v in profile.inclusive if f.split(" (")[0] == function)

        text += (
            " In the GIL profile at concurrency 32: store load "
            f"{share('load_snapshot'):.0%}, strategy select "
            f"{share('SummarizingWindowStrategy.select'):.0%}, the turn's write "
            f"{share('persist_turn'):.0%}, the upstream client {share('OpenAIUpstream.chat'):.0%}, "
            f"after-turn bookkeeping {share('schedule_after_turn'):.0%}, and "
            f"{profile.framework_only:.0%} in stacks with no memory-proxy frame (uvicorn, "
            "Starlette, asyncio, aiohttp)."
        )
    split = ((r.get("native") or {}).get("C") or {}).get("shares")
    if isinstance(split, dict):

        def part(prefix: str) -> float:
            return sum(v for k, v in split.items() if k.startswith(prefix))

        text += (
            f" Below Python (perf, every thread): {part('libpython'):.0%} of the CPU samples "
            f"fall in the CPython interpreter, {part('[kernel'):.0%} in the kernel (loopback "
            "sockets, and waking the processes on the other CPU: in this virtual machine a "
            "hypercall when that CPU idles, `kvm_kick_cpu`) and "
            f"{part('libsqlite3'):.0%} in SQLite."
        )
    b_tail = (r.get("latency_added") or {}).get("B")
    if b_tail:
        text += (
            f" The tail at concurrency 1: the bare pass-through B, which does no work of its "
            f"own, shows an added p99 of {b_tail['p99']:.2f} ms in the same rounds, so most of "
            "the p99 is the machine's (a shared virtual CPU: wake-ups, neighbours)."
        )
    return text


def _explain(name: str, r: dict[str, Any]) -> str:
    if "workers" in name:
        w = r["workers"]
        one, two = w[1][32], w[2][32]
        text = (
            "the CPU the workers can get. Two workers share the machine's two cores with wrk, "
            "the fake upstream, redis-server and the other processes running; the proxy got "
            f"{one['cpu_s']:.1f} s of CPU in the concurrency-32 cell with one worker and "
            f"{two['cpu_s']:.1f} s with two, so the second worker added "
            f"{two['cpu_s'] / one['cpu_s'] - 1:.0%} more CPU to serve with. "
        )
        if two.get("requests") and one.get("requests") and "others_cpu_s" in two:
            proxy_one = one["cpu_s"] / one["requests"] * 1000
            proxy_two = two["cpu_s"] / two["requests"] * 1000
            others = two["others_cpu_s"] / two["requests"] * 1000
            cores = r.get("cores") or 2
            most = cores * 1000 / (proxy_two + others)
            text += (
                f"Each request took {proxy_two:.2f} ms of the workers' CPU ({proxy_one:.2f} ms "
                f"with one worker) and {others:.2f} ms of the others'. At "
                f"{proxy_two + others:.2f} ms per request, {cores} cores never idle would serve "
                f"at most {most:,.0f} req/s: {most / one['rps']:.2f}x the one-worker rate, "
                f"against {two['rps'] / one['rps']:.2f}x measured, with the cores idle "
                f"{two['idle_share']:.0%} of the time. "
            )
        return text + (
            "At concurrency 64: "
            f"{w[1][64]['rps']:,.0f} -> {w[2][64]['rps']:,.0f} req/s. "
            "Scaling needs cores the load generator and upstream do not use."
        )
    if "windowed" in name:
        w = r["window"]["C"]
        return (f"proxy CPU per turn {w['cpu_ms_100']:.2f} ms at 100 stored vs "
                f"{w['cpu_ms_10000']:.2f} ms at 10,000 stored.")
    if "RSS" in name:
        return "resident memory of the proxy process; see the memory table."
    if "ready" in name:
        return "imports and the model map read at start-up; see the start-up table."
    if "round trips" in name or "tokenizing" in name:
        return "see the in-process table."
    return "see the tables above."
