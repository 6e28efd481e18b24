"""bench/RESULTS.md from the numbers of one run (``results`` as run.py collects them).

The document's head, its targets table and the order of its sections are here; the targets
and what bounds the unmet ones are in report_targets.py, the measured sections in
report_sections.py, the profiles in report_profiles.py, the prompt cache in report_cache.py
and the memory quality in quality_report.py.
"""

from __future__ import annotations

from typing import Any

import quality_report
from report_cache import cache_section, cache_targets
from report_format import table, verdict
from report_profiles import native_section, profiles_section
from report_sections import (
    histories_section,
    inprocess_section,
    latency_section,
    memory_section,
    streams_section,
    throughput_section,
    workers_section,
)
from report_targets import bounds, targets


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
            if row[2] == verdict(False):
                unmet.append(row[0])
    lines += ["## Targets", "", *table(["target", "measured", "verdict"], rows)]

    lines += latency_section(r)
    lines += throughput_section(r)
    lines += streams_section(r)
    lines += histories_section(r)
    lines += inprocess_section(r)
    lines += memory_section(r)
    lines += workers_section(r)

    if "quality" in r:
        lines += quality_report.render(r["quality"])
    if r.get("cache"):
        lines += cache_section(r["cache"], with_targets=False)
    lines += profiles_section(r)
    lines += native_section(r)
    lines += ["## What bounds the unmet targets", ""]
    lines += bounds(r, unmet) or ["Every target is met in this run.", ""]
    return "\n".join(lines)
