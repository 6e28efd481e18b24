"""bench/RESULTS.md from the numbers of one run (``results`` as run.py collects them)."""

from __future__ import annotations

from typing import Any

import native
import quality_report
from sampling import Profile

# the throughput phase's extra row: C's own server with ``x-memory: off`` on every request
HTTP_ONLY = "C-off"

OWN_CODE = ("proxy/", "storage/", "strategies/")
# where a turn's CPU goes: (label, frame prefix) matched against the inclusive profile
COMPONENTS = (
    ("the turn pipeline (proxy/turn/pipeline.py serve)", "serve"),
    ("load step (proxy/turn/load.py)", "load_snapshot"),
    ("sync step (proxy/turn/sync.py)", "sync"),
    ("strategy select", "SummarizingWindowStrategy.select"),
    ("mapper", "MessageToLlmMessageMapper.map"),
    ("upstream call (OpenAIUpstream; runs in a task of its own)", "OpenAIUpstream.chat"),
    ("persist_turn: the turn's write", "persist_turn"),
    ("after-turn bookkeeping (proxy/background/after_turn.py)", "schedule_after_turn"),
    ("token counting", "count_message"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _verdict(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "n/a"}[ok]


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def targets(r: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """The issue's targets, each with its number and verdict; and the unmet ones."""
    rows: list[list[Any]] = []
    unmet: list[str] = []

    def check(name: str, value: str, ok: bool | None) -> None:
        rows.append([name, value, _verdict(ok)])
        if ok is False:
            unmet.append(name)

    added = r["latency_added"].get("C", {})
    check("added latency p50 at concurrency 1 (C vs A) ≤ 1 ms", _ms(added.get("p50")),
          added.get("p50", 99) <= 1.0)
    check("added latency p99 at concurrency 1 (C vs A) ≤ 5 ms", _ms(added.get("p99")),
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
              _ms(cold["cold_cpu_ms"]), cold["cold_cpu_ms"] <= 10.0)
    sse = r["sse"]
    overhead = sse["C"]["ttfb_p50"] - sse["A"]["ttfb_p50"]
    check("SSE time-to-first-byte overhead p50 (C vs A) ≤ 1 ms", _ms(overhead), overhead <= 1.0)
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


def _profile_lines(key: str, entry: dict[str, Any]) -> list[str]:
    profile = entry["profile"]
    if not isinstance(profile, Profile):
        return [f"{key}: {profile}", ""]
    out = [f"**{key}** under wrk at concurrency 32 ({entry['rps']:,.0f} req/s while sampled), "
           f"{profile.samples} samples taken only while a thread held the GIL (py-spy --gil: "
           "where the Python CPU goes); raw stacks in "
           f"bench/out/profiles/{profile.raw.name}.", ""]
    rows = []
    for label, function in COMPONENTS:
        share = sum(s for f, s in profile.inclusive if f.split(" (")[0] == function)
        rows.append([label, f"{share:.1%}"])
    rows.append(["stacks with no memory-proxy frame: uvicorn, Starlette, asyncio, aiohttp",
                 f"{profile.framework_only:.1%}"])
    out += ["Where the samples fall (inclusive, so the rows overlap):", ""]
    out += _table(["part of the turn", "share of samples"], rows)
    out += ["Top self time:", ""]
    out += _table(["frame", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in profile.self_time[:12]])
    own = [(f, s) for f, s in profile.inclusive
           if any(m in f for m in OWN_CODE) and "proxy/cli.py" not in f]
    out += ["memory-proxy's own code, inclusive time (callees included):", ""]
    out += _table(["frame", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in own[:15]])
    return out


def host_speed(speed: dict[str, float] | None) -> str:
    """The host's speed over the run (bench/hostspeed.py), for the machine line."""
    if not speed:
        return ""
    return (
        f"Host speed: a fixed loop on the server's CPU took {speed['fastest']:.1f} ms at its "
        f"fastest, {speed['median']:.1f} ms median and {speed['slowest']:.1f} ms at its slowest "
        f"({speed['probes']:.0f} probes between measurements: the median "
        f"{speed['median'] / speed['fastest']:.2f} times the fastest). "
    )


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    keys = list(r["targets"])
    lines = [
        "# memory-proxy benchmark results",
        "",
        f"Produced by `{r['command']}` on {m['date']} (commit {m['commit']}), "
        f"{r['seconds'] / 60:.1f} minutes.",
        "",
        f"Machine: {m['cpu']}, {m['memory']}, Python {m['python']}, Linux {m['kernel']}. "
        f"Load average before/after: {r['load_before']} / {r['load_after']}. "
        + (f"Steal over the run (time this machine's CPUs had work but the hypervisor ran "
           f"other guests): {r['steal_percent']:.1f}% of its CPU time. "
           if "steal_percent" in r else "")
        + host_speed(r.get("host_speed"))
        + f"CPU layout: client (wrk or aiohttp), fake upstream and redis-server on CPU "
        f"{r['cpus']['environment']}; the server under test alone on CPU {r['cpus']['server']} "
        "(taskset), so A is measured with the same client and upstream as everything else.",
        "",
        "Targets: " + "; ".join(f"**{k}** {v}" for k, v in r["targets"].items()) + ".",
        "",
    ]
    if r.get("litellm"):
        lines += [f"D (LiteLLM's proxy) is not in this run: {r['litellm']}", ""]
    for note in r["notes"]:
        lines += [f"Note: {note}", ""]
    if r.get("main_cache_mb"):
        counts = r.get("session_cache", {})
        ratios = []
        for key, c in counts.items():
            turns = c.get("hits_total", 0) + c.get("misses_total", 0)
            if turns:
                ratios.append(f"{key} {100 * c['hits_total'] / turns:.0f}% of {turns:,.0f} turns")
        lines += [
            f"C and C' run with `MEMORY_PROXY_SESSION_CACHE_MB={r['main_cache_mb']}` in the "
            "phases below (the default, 16 MB, holds about a sixth of the shared pool's "
            f"{r['plan']['pool_sessions']:,} sessions as they grow over the run), so the "
            "measured turns find their session in the cache: an agent's next turn on a "
            "session this process served before. Cache hits over the run: "
            + (", ".join(ratios) or "not read") + ". What a cold turn (a session read from "
            "the store) costs is in *Per-turn cost against stored history*; the memory check "
            "runs a proxy with the defaults.", ""]

    rows, unmet = targets(r)
    if r.get("cache"):
        for row in cache_targets(r["cache"]):
            rows.append(row)
            if row[2] == _verdict(False):
                unmet.append(row[0])
    lines += ["## Targets", "", *_table(["target", "measured", "verdict"], rows)]

    lines += ["## Added latency at concurrency 1", "",
              f"wrk, one connection, {r['plan']['rounds']} interleaved rounds of "
              f"{r['plan']['round_seconds']:.0f} s per target; medians of the rounds. Delta "
              "client turns on sessions of the shared pool (20 stored messages at the start, "
              "default strategy). Server CPU is the CPU time of the target's process(es) per "
              "request (for A, the fake upstream's).", ""]
    rows = []
    for k in keys:
        lat, added = r["latency"][k], r["latency_added"].get(k)
        rows.append([k, _ms(lat["p50"]), _ms(lat["p99"]),
                     _ms(added["p50"]) if added else "-", _ms(added["p99"]) if added else "-",
                     _ms(lat["cpu_ms"]), _ms(lat["wait_ms"]), lat["errors"]])
    lines += _table(["target", "p50", "p99", "added p50 vs A", "added p99 vs A",
                     "server CPU / request", "server run-queue wait / request", "errors"], rows)
    lines += ["Run-queue wait is the time the server's threads were ready to run but had no CPU "
              "(from /proc/PID/task/*/schedstat): what other load on the machine added to its "
              "latency in this run.", ""]

    lines += ["## Throughput", "",
              f"wrk, {r['plan'].get('throughput_rounds', 1)} interleaved rounds of "
              f"{r['plan']['throughput_seconds']:.0f} s per cell (the targets in a rotated order "
              "each round); requests/s (p50 / p99 latency; errors), medians of the rounds, as is "
              "the CPU per request. One worker process per server.", ""]
    rows = []
    for k in [*keys, *([HTTP_ONLY] if HTTP_ONLY in r["throughput"][32] else [])]:
        row = [k]
        for by in r["throughput"].values():
            cell = by[k]
            err = f"; {cell['errors']} errors" if cell["errors"] else ""
            row.append(f"{cell['rps']:,.0f} ({cell['p50']:.1f} / {cell['p99']:.1f} ms{err})")
        best, at = r["max_rps"][k]
        cpu = r["throughput"][32][k]["cpu_ms"]
        row += [f"{best:,.0f} (c={at})", _ms(cpu), f"{1000 / cpu:,.0f}" if cpu else "-"]
        rows.append(row)
    lines += _table(["target", *[f"c={c}" for c in r["throughput"]],
                     "max without errors", "CPU / request at c=32",
                     "one core's worth (1 s / CPU per request)"], rows)
    lines += ["The last column is the rate one fully available core would sustain at the "
              "measured CPU cost: the bound when the machine is shared, as here. "
              f"**{HTTP_ONLY}** is C's own server with `x-memory: off` on every request: the "
              "request parsed and forwarded, the reply sent back, no memory work (what the "
              "proxy's HTTP path costs alone).", ""]

    lines += ["## Streams", "",
              f"Time to first body byte, aiohttp client at concurrency 1, "
              f"{r['plan']['sse_requests']} streamed turns per target.", ""]
    rows = []
    for k in keys:
        s = r["sse"][k]
        rows.append([k, _ms(s["ttfb_p50"]), _ms(s["ttfb_p99"]),
                     _ms(s["ttfb_p50"] - r["sse"]["A"]["ttfb_p50"]) if k != "A" else "-",
                     s["errors"]])
    lines += _table(["target", "TTFB p50", "TTFB p99", "overhead p50 vs A", "errors"], rows)
    chunks = r["chunks"]
    lines += ["A fake upstream that sends one event every 20 ms (12 events): arrival of each "
              "read at the client, ms after the request:", "",
              "- A: " + ", ".join(f"{t * 1000:.0f}" for t in chunks["A"]),
              "- C: " + ", ".join(f"{t * 1000:.0f}" for t in chunks["C"]), ""]
    long = r.get("long_streams")
    if long:
        lines += ["Long replies: a fake that streams 300 events in one write, aiohttp client at "
                  "concurrency 8. CPU of the server per streamed turn (B forwards bytes "
                  "without reading them; C parses every event to store the reply):", ""]
        rows = [[k, _ms(v["cpu_ms"]), _ms(v["p50"]), v["errors"]] for k, v in long.items()]
        lines += _table(["target", "CPU / streamed turn", "latency p50", "errors"], rows)

    lines += ["## Per-turn cost against stored history", "",
              f"aiohttp client at concurrency 1, {r['plan']['history_requests']} delta turns per "
              "target and size, default strategy (summarizing_window: reads history in pages "
              "of maxHistoryFetch = 500 messages until its budget, 0.8 of the 128,000-token "
              "default window, is full, and sends what fits it, so the window grows with the "
              "history until the budget holds it). Latency in ms; CPU is the proxy's per turn. "
              "**Warm**: the measured turns, on sessions the proxy served before (its session "
              "cache holds them; a load reads the session's head only). **Cold**: the turn "
              "before, the first one on each session of the pool (the session is read and "
              "decoded from the store): what a turn costs after a restart, on another replica, "
              "or once the cache has evicted the session; one turn at a time, back to back, each "
              "turn's CPU read around it, the median of the pool's turns.", ""]
    rows = []
    for size, by in r["histories"].items():
        a = by["A"]["p50"]
        row = [f"{int(size):,}", f"{a:.2f}"]
        for k in ("C", "C'"):
            m = by[k]
            row += [f"{m['p50']:.2f} (+{m['p50'] - a:.2f})", f"{m['p99']:.2f}",
                    f"{m['cpu_ms']:.2f}"]
            if "cold_p50" in m:
                row += [f"{m['cold_p50']:.2f}", f"{m['cold_cpu_ms']:.2f}"]
            else:
                row += ["-", "-"]
        rows.append(row)
    lines += _table(["stored", "A p50", "C warm p50 (added)", "C warm p99", "C warm CPU/turn",
                     "C cold p50", "C cold CPU/turn", "C' warm p50 (added)", "C' warm p99",
                     "C' warm CPU/turn", "C' cold p50", "C' cold CPU/turn"], rows)
    full = {size: by["full"] for size, by in r["histories"].items() if "full" in by}
    if full:
        lines += ["Full-history clients (the usual kind: every request resends the whole "
                  "conversation, which the proxy matches against what it stored), the same "
                  "measurement on pools of their own; A gets requests of the same size. The "
                  "delta column repeats the warm CPU per turn of the table above.", ""]
        rows = []
        for size, by in full.items():
            a = by["A"]["p50"]
            row = [f"{int(size):,}", f"{a:.2f}"]
            for k in ("C", "C'"):
                m, delta = by[k], r["histories"][size][k]
                row += [f"{m['p50']:.2f} (+{m['p50'] - a:.2f})", f"{m['cpu_ms']:.2f}",
                        f"{delta['cpu_ms']:.2f}", f"{m.get('cold_cpu_ms', 0):.2f}"]
            rows.append(row)
        lines += _table(["stored", "A p50", "C warm p50 (added)", "C warm CPU/turn",
                         "C delta CPU/turn", "C cold CPU/turn", "C' warm p50 (added)",
                         "C' warm CPU/turn", "C' delta CPU/turn", "C' cold CPU/turn"], rows)
    lines += ["Windowed agent (`windowed`, windowSize 100): the same window, 100 vs 10,000 "
              "stored messages.", ""]
    rows = []
    for k, w in r["window"].items():
        rows.append([k, f"{w['p50_100']:.2f}", f"{w['p50_10000']:.2f}",
                     f"{w['p50_10000'] / w['p50_100']:.2f}x" if w["p50_100"] else "-",
                     f"{w['cpu_ms_100']:.2f} / {w['cpu_ms_10000']:.2f}", w["errors"]])
    lines += _table(["store", "p50, 100 stored", "p50, 10,000 stored", "ratio",
                     "proxy CPU/turn (100 / 10,000)", "errors"], rows)

    lines += ["## Store round trips and tokenizing per turn", "",
              "Counted in process (the app with its lifespan, requests through "
              "httpx.ASGITransport): Store method calls, round trips (Redis: command packets "
              "sent, a pipeline is one; SQLite: store jobs and groups of appends, each one "
              "transaction, run inline on the event loop), Redis commands from INFO "
              "commandstats, and the text handed to tiktoken (roles and names are counted "
              "once per process). Averages over the measured turns, background work "
              "included.", ""]
    rows = []
    for c in r["inprocess"]:
        calls = ", ".join(f"{k} {v:g}" for k, v in c["store_calls"].items())
        commands = ", ".join(f"{k} {v:g}" for k, v in c["redis_commands"].items()) or "-"
        rows.append([c["store"], c["scenario"], f"{c['round_trips']:g}", calls, commands,
                     f"{c['tokenize_calls']:g} / {c['tokenized_chars']:,.0f}"])
    lines += _table(["store", "turn", "round trips", "store calls", "redis commands",
                     "tokenizer calls / chars"], rows)

    lines += ["## Memory and start-up", ""]
    rows = [[k, f"{v:.0f} MB"] for k, v in r["peak_rss_mb"].items()]
    lines += ["Peak RSS (VmHWM) of each target's process over the whole run above:", ""]
    lines += _table(["target", "peak RSS"], rows)
    rows = []
    for k, b in r["big"].items():
        rows.append([k, f"{b['sessions']:,} x {b['messages_each']}", f"{b['populate_s']:.1f} s",
                     f"{b['ready_s']:.2f} s", f"{b['idle_rss_mb']:.0f} MB",
                     f"{b['turns']:,} turns at {b['rps']:,.0f} req/s ({b['errors']} errors)",
                     f"{b['peak_rss_mb']:.0f} MB"])
    lines += ["A fresh proxy over a store holding many sessions, then turns spread over all "
              "of them (wrk, concurrency 32):", ""]
    lines += _table(["store", "sessions x messages", "store filled in", "ready in",
                     "RSS idle", "load", "peak RSS"], rows)
    tok = r.get("tokenizer_memory")
    if tok:
        lines += [f"Most of that is the tokenizer: the app's imports take {tok['imports_mb']:.0f} "
                  f"MB, loading o200k_base adds {tok['o200k_mb']:.0f} MB and cl100k_base "
                  f"{tok['cl100k_mb']:.0f} MB more. This run's model (gpt-4o-mini) uses "
                  "o200k_base only; a proxy that also counts for a model on cl100k_base (the "
                  "fallback for unknown model ids) holds both, about "
                  f"{tok['cl100k_mb']:.0f} MB above the peaks shown.", ""]
    rows = [[k, f"{v['ready_s']:.2f} s", f"{v['first_turn_s'] * 1000:.0f} ms",
             f"{v['idle_rss_mb']:.0f} MB"] for k, v in r["ready"].items()]
    if r.get("litellm_ready_s"):
        rows.append(["D", f"{r['litellm_ready_s']:.2f} s", "-", "-"])
    lines += ["Start-up: spawn of `memory-proxy serve` to `GET /ready` = 200 (median), then "
              "the first turn (the tokenizer is loaded on it: most of its time, and about "
              "70 MB of the RSS):", ""]
    lines += _table(["target", "ready", "first turn", "RSS after it"], rows)

    lines += ["## Workers on Redis", "",
              "`memory-proxy serve --workers N`, not pinned (the workers may use both cores; "
              "wrk, the fake upstream and redis-server share CPU 0 with them). Both servers run "
              "side by side and are measured in alternation; medians of the rounds (CPU: "
              "summed over them). *Others* is the CPU wrk, the fake upstream and redis-server "
              "spent meanwhile, per request; *idle* the share of the machine's CPU time no "
              "process used. *(cluster)*: the same on a Redis Cluster of six redis-server "
              "processes on loopback (three masters, three replicas), all six charged.", ""]
    rows = []
    cells = [(count, by) for count, by in r["workers"].items()]
    # the cluster row: two workers on a Redis Cluster (three masters, three replicas)
    cells += [(f"{count} (cluster)", by) for count, by in r.get("workers_cluster", {}).items()]
    for count, by in cells:
        for c, v in by.items():
            rows.append([count, c, f"{v['rps']:,.0f}", f"{v['p50']:.1f} / {v['p99']:.1f} ms",
                         v["errors"], f"{v['cpu_s']:.1f} s", _per_request(v, "cpu_s"),
                         _per_request(v, "others_cpu_s"),
                         f"{v['idle_share']:.0%}" if "idle_share" in v else "-"])
    lines += _table(["workers", "concurrency", "req/s", "p50 / p99", "errors", "proxy CPU",
                     "proxy CPU / request", "others / request", "idle"], rows)

    if "quality" in r:
        lines += quality_report.render(r["quality"])
    if r.get("cache"):
        lines += cache_section(r["cache"], with_targets=False)

    lines += ["## Profiles", ""]
    for k, entry in r["profiles"].items():
        lines += _profile_lines(k, entry)

    lines += native_section(r)
    lines += ["## What bounds the unmet targets", ""]
    lines += bounds(r, unmet) or ["Every target is met in this run.", ""]
    return "\n".join(lines)


def _per_request(cell: dict[str, Any], key: str) -> str:
    """CPU seconds summed over a workers cell, per request, in ms ("-" if not recorded)."""
    if not cell.get("requests") or key not in cell:
        return "-"
    return f"{cell[key] / cell['requests'] * 1000:.2f} ms"


def native_section(r: dict[str, Any]) -> list[str]:
    entry = (r.get("native") or {}).get("C")
    if not entry:
        return []
    lines = ["**C** under wrk at concurrency 32 again, sampled by `perf` on every thread "
             "(native code included), by what the samples ran:", ""]
    shares = entry["shares"]
    if isinstance(shares, str):
        return [*lines, f"Not measured: {shares}.", ""]
    rows = [[native.kind(dso), f"{share:.1%}"] for dso, share in list(shares.items())[:8]]
    return [*lines, *_table(["code", "share of CPU samples"], rows),
            "The kernel's share moves with how busy the other CPU is: waking a process there "
            "(wrk, the fake upstream) costs a hypercall when that CPU idles.", ""]


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


# the cache phase's targets (bench/cache.py): hit ratios under both rules, cost against
# auto_compact's on the same session
CACHE_HIT_TARGET = 0.88
CACHE_COMPACT_TARGET = 0.90
CACHE_COST_TARGET = 1.1


def _cache_row(rows: list[dict[str, Any]], name: str, client: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["name"] == name and r["client"] == client), None)


def cache_targets(cache: dict[str, Any]) -> list[list[Any]]:
    """[target, measured, verdict] rows for the cache phase, per client kind."""
    rows = cache["rows"]
    out = []
    for client in ("delta", "full-history"):
        window = _cache_row(rows, "summarizing_window, defaults", client)
        compact = _cache_row(rows, "auto_compact, defaults", client)
        if window is None or compact is None:
            continue
        hits = min(window["openai_hit"], window["anthropic_hit"])
        out.append([f"summarizing_window defaults, {client}: hits >= 88% (both rules), "
                    "never over budget",
                    f"OpenAI {window['openai_hit']:.1%}, Anthropic {window['anthropic_hit']:.1%}"
                    f", {window['over_budget']} over budget",
                    _verdict(hits >= CACHE_HIT_TARGET and window["over_budget"] == 0)])
        ratios = [window["openai_cost"] / max(1.0, compact["openai_cost"]),
                  window["anthropic_cost"] / max(1.0, compact["anthropic_cost"])]
        out.append([f"summarizing_window defaults, {client}: effective input cost <= 1.1x "
                    "auto_compact's", f"OpenAI {ratios[0]:.2f}x, Anthropic {ratios[1]:.2f}x",
                    _verdict(max(ratios) <= CACHE_COST_TARGET)])
        compact_hits = min(compact["openai_hit"], compact["anthropic_hit"])
        out.append([f"auto_compact defaults, {client}: hits >= 90%",
                    f"OpenAI {compact['openai_hit']:.1%}, Anthropic "
                    f"{compact['anthropic_hit']:.1%}",
                    _verdict(compact_hits >= CACHE_COMPACT_TARGET)])
    return out


def cache_section(cache: dict[str, Any], *, with_targets: bool = True) -> list[str]:
    """The prompt-cache phase: one row per strategy and client kind."""
    context = cache["context_window"]
    lines = ["## Prompt cache over a long agent session", "",
             f"`bench/cache.py`: a deterministic coding-agent session of {cache['turns']} turns "
             "(~1,000-token system prompt, 6 tools, 1-3 tool calls per turn with results of "
             f"300-3,000 tokens; contextWindow {context:,}) through the proxy and the fake "
             "upstream, every request scored as OpenAI's cache (exact prefix of whole blocks, "
             "from 1,024 tokens in 128-token steps) and Anthropic's (prefixes up to the "
             "`cache_control` breakpoints the proxy places) would serve it. Cost: uncached 1x, "
             "cached 0.1x, Anthropic writes 1.25x, in millions of token-equivalents, "
             "summarizer calls included. *Kept*: the window's share of the conversation's "
             "messages (mean, lowest).", ""]
    rows = []
    for r in cache["rows"]:
        rows.append([
            r["name"], r["client"], f"{r['requests']} ({r['summarizer_calls']})",
            r["prefix_broken"], f"{r['tokens'] / 1e6:.2f} M", f"{r['openai_hit']:.1%}",
            f"{r['anthropic_hit']:.1%}", f"{r['openai_cost'] / 1e6:.2f}",
            f"{r['anthropic_cost'] / 1e6:.2f}",
            f"{r['largest_window']:,} ({r['largest_window'] / context:.0%})",
            r["over_budget"], f"{r['kept_share_mean']:.0%} / {r['kept_share_min']:.0%}",
        ])
    lines += _table(["strategy", "client", "requests (summarizer)", "prefix broken",
                     "tokens sent", "OpenAI hit", "Anthropic hit", "cost OpenAI",
                     "cost Anthropic", "largest window", "over budget", "kept"], rows)
    if with_targets:
        lines += _table(["target", "measured", "verdict"], cache_targets(cache))
    return lines


CACHE_HEADING = "## Prompt cache over a long agent session"


def with_cache_section(text: str, cache: dict[str, Any]) -> str:
    """RESULTS.md ``text`` with its prompt-cache section (and those targets) replaced by
    ``cache``'s, the rest of the run left as it was (``run.py --cache-only``)."""
    lines = text.split("\n")
    if CACHE_HEADING in lines:
        start = lines.index(CACHE_HEADING)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        del lines[start:end]
    at = lines.index("## Profiles") if "## Profiles" in lines else len(lines)
    section = cache_section(cache, with_targets=True)
    section[2] += f" (this section: `python bench/run.py --cache-only`, {cache['turns']} turns.)"
    lines[at:at] = section
    return "\n".join(lines)
