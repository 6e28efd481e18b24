"""The report's profiles: where the Python CPU of C and C' goes under load (py-spy --gil,
bench/sampling.py), and what C's CPU samples ran below Python (perf, bench/native.py)."""

from __future__ import annotations

from typing import Any

import native
from report_format import table
from sampling import Profile

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


def profiles_section(r: dict[str, Any]) -> list[str]:
    lines = ["## Profiles", ""]
    for k, entry in r["profiles"].items():
        lines += _profile_lines(k, entry)
    return lines


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
    out += table(["part of the turn", "share of samples"], rows)
    out += ["Top self time:", ""]
    out += table(["frame", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in profile.self_time[:12]])
    own = [(f, s) for f, s in profile.inclusive
           if any(m in f for m in OWN_CODE) and "proxy/cli.py" not in f]
    out += ["memory-proxy's own code, inclusive time (callees included):", ""]
    out += table(["frame", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in own[:15]])
    return out


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
    return [*lines, *table(["code", "share of CPU samples"], rows),
            "The kernel's share moves with how busy the other CPU is: waking a process there "
            "(wrk, the fake upstream) costs a hypercall when that CPU idles.", ""]
