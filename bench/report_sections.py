"""The measured sections of bench/RESULTS.md, one function each, in the report's order:
latency, throughput, streams, per-turn cost against stored history, store round trips,
memory and start-up, workers. Each takes ``results`` as run.py collects them and returns
its markdown lines."""

from __future__ import annotations

from typing import Any

from report_format import HTTP_ONLY, ms, table


def latency_section(r: dict[str, Any]) -> list[str]:
    """Added latency at concurrency 1 (wrk, interleaved rounds)."""
    keys = list(r["targets"])
    lines = ["## Added latency at concurrency 1", "",
             f"wrk, one connection, {r['plan']['rounds']} interleaved rounds of "
             f"{r['plan']['round_seconds']:.0f} s per target; medians of the rounds. Delta "
             "client turns on sessions of the shared pool (20 stored messages at the start, "
             "default strategy). Server CPU is the CPU time of the target's process(es) per "
             "request (for A, the fake upstream's).", ""]
    rows = []
    for k in keys:
        lat, added = r["latency"][k], r["latency_added"].get(k)
        rows.append([k, ms(lat["p50"]), ms(lat["p99"]),
                     ms(added["p50"]) if added else "-", ms(added["p99"]) if added else "-",
                     ms(lat["cpu_ms"]), ms(lat["wait_ms"]), lat["errors"]])
    lines += table(["target", "p50", "p99", "added p50 vs A", "added p99 vs A",
                    "server CPU / request", "server run-queue wait / request", "errors"], rows)
    lines += ["Run-queue wait is the time the server's threads were ready to run but had no CPU "
              "(from /proc/PID/task/*/schedstat): what other load on the machine added to its "
              "latency in this run.", ""]
    return lines


def throughput_section(r: dict[str, Any]) -> list[str]:
    """Throughput at every concurrency, with the C-off row."""
    keys = list(r["targets"])
    lines = ["## Throughput", "",
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
        row += [f"{best:,.0f} (c={at})", ms(cpu), f"{1000 / cpu:,.0f}" if cpu else "-"]
        rows.append(row)
    lines += table(["target", *[f"c={c}" for c in r["throughput"]],
                    "max without errors", "CPU / request at c=32",
                    "one core's worth (1 s / CPU per request)"], rows)
    lines += ["The last column is the rate one fully available core would sustain at the "
              "measured CPU cost: the bound when the machine is shared, as here. "
              f"**{HTTP_ONLY}** is C's own server with `x-memory: off` on every request: the "
              "request parsed and forwarded, the reply sent back, no memory work (what the "
              "proxy's HTTP path costs alone).", ""]
    return lines


def streams_section(r: dict[str, Any]) -> list[str]:
    """Time to first byte, a slow stream's chunks and long replies."""
    keys = list(r["targets"])
    lines = ["## Streams", "",
             f"Time to first body byte, aiohttp client at concurrency 1, "
             f"{r['plan']['sse_requests']} streamed turns per target.", ""]
    rows = []
    for k in keys:
        s = r["sse"][k]
        rows.append([k, ms(s["ttfb_p50"]), ms(s["ttfb_p99"]),
                     ms(s["ttfb_p50"] - r["sse"]["A"]["ttfb_p50"]) if k != "A" else "-",
                     s["errors"]])
    lines += table(["target", "TTFB p50", "TTFB p99", "overhead p50 vs A", "errors"], rows)
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
        rows = [[k, ms(v["cpu_ms"]), ms(v["p50"]), v["errors"]] for k, v in long.items()]
        lines += table(["target", "CPU / streamed turn", "latency p50", "errors"], rows)
    return lines


def histories_section(r: dict[str, Any]) -> list[str]:
    """Per-turn cost against stored history: delta and full-history clients, the
    windowed agent."""
    lines = ["## Per-turn cost against stored history", "",
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
    lines += table(["stored", "A p50", "C warm p50 (added)", "C warm p99", "C warm CPU/turn",
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
        lines += table(["stored", "A p50", "C warm p50 (added)", "C warm CPU/turn",
                        "C delta CPU/turn", "C cold CPU/turn", "C' warm p50 (added)",
                        "C' warm CPU/turn", "C' delta CPU/turn", "C' cold CPU/turn"], rows)
    lines += ["Windowed agent (`windowed`, windowSize 100): the same window, 100 vs 10,000 "
              "stored messages, on as many sessions at either size, each served once before "
              "the measured turns (which are warm at both sizes).", ""]
    rows = []
    for k, w in r["window"].items():
        rows.append([k, f"{w['p50_100']:.2f}", f"{w['p50_10000']:.2f}",
                     f"{w['p50_10000'] / w['p50_100']:.2f}x" if w["p50_100"] else "-",
                     f"{w['cpu_ms_100']:.2f} / {w['cpu_ms_10000']:.2f}", w["errors"]])
    lines += table(["store", "p50, 100 stored", "p50, 10,000 stored", "ratio",
                    "proxy CPU/turn (100 / 10,000)", "errors"], rows)
    return lines


def inprocess_section(r: dict[str, Any]) -> list[str]:
    """Store round trips and tokenizing per turn, counted in process."""
    lines = ["## Store round trips and tokenizing per turn", "",
             "Counted in process (the app with its lifespan, requests through "
             "httpx.ASGITransport): Store method calls, round trips (Redis: command packets "
             "sent, a pipeline is one; SQLite: jobs sent to the store's thread, each one "
             "transaction), Redis commands from INFO "
             "commandstats, and the text handed to tiktoken (roles and names are counted "
             "once per process). Averages over the measured turns, background work "
             "included.", ""]
    rows = []
    for c in r["inprocess"]:
        calls = ", ".join(f"{k} {v:g}" for k, v in c["store_calls"].items())
        commands = ", ".join(f"{k} {v:g}" for k, v in c["redis_commands"].items()) or "-"
        rows.append([c["store"], c["scenario"], f"{c['round_trips']:g}", calls, commands,
                     f"{c['tokenize_calls']:g} / {c['tokenized_chars']:,.0f}"])
    lines += table(["store", "turn", "round trips", "store calls", "redis commands",
                    "tokenizer calls / chars"], rows)
    return lines


def memory_section(r: dict[str, Any]) -> list[str]:
    """Peak RSS, many sessions stored, the tokenizer's memory, start-up."""
    lines = ["## Memory and start-up", ""]
    rows = [[k, f"{v:.0f} MB"] for k, v in r["peak_rss_mb"].items()]
    lines += ["Peak RSS (VmHWM) of each target's process over the whole run above:", ""]
    lines += table(["target", "peak RSS"], rows)
    rows = []
    for k, b in r["big"].items():
        rows.append([k, f"{b['sessions']:,} x {b['messages_each']}", f"{b['populate_s']:.1f} s",
                     f"{b['ready_s']:.2f} s", f"{b['idle_rss_mb']:.0f} MB",
                     f"{b['turns']:,} turns at {b['rps']:,.0f} req/s ({b['errors']} errors)",
                     f"{b['peak_rss_mb']:.0f} MB"])
    lines += ["A fresh proxy over a store holding many sessions, then turns spread over all "
              "of them (wrk, concurrency 32):", ""]
    lines += table(["store", "sessions x messages", "store filled in", "ready in",
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
    lines += table(["target", "ready", "first turn", "RSS after it"], rows)
    return lines


def workers_section(r: dict[str, Any]) -> list[str]:
    """`serve --workers 1` and `2` on Redis, and 2 on a Redis Cluster."""
    lines = ["## Workers on Redis", "",
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
    lines += table(["workers", "concurrency", "req/s", "p50 / p99", "errors", "proxy CPU",
                    "proxy CPU / request", "others / request", "idle"], rows)
    return lines


def _per_request(cell: dict[str, Any], key: str) -> str:
    """CPU seconds summed over a workers cell, per request, in ms ("-" if not recorded)."""
    if not cell.get("requests") or key not in cell:
        return "-"
    return f"{cell[key] / cell['requests'] * 1000:.2f} ms"
