"""The report's prompt-cache section (bench/cache.py's results): a row per strategy and
client kind, the phase's targets, and the section replaced in place by
``run.py --cache-only``."""

from __future__ import annotations

from typing import Any

from report_format import table, verdict

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
                    verdict(hits >= CACHE_HIT_TARGET and window["over_budget"] == 0)])
        ratios = [window["openai_cost"] / max(1.0, compact["openai_cost"]),
                  window["anthropic_cost"] / max(1.0, compact["anthropic_cost"])]
        out.append([f"summarizing_window defaults, {client}: effective input cost <= 1.1x "
                    "auto_compact's", f"OpenAI {ratios[0]:.2f}x, Anthropic {ratios[1]:.2f}x",
                    verdict(max(ratios) <= CACHE_COST_TARGET)])
        compact_hits = min(compact["openai_hit"], compact["anthropic_hit"])
        out.append([f"auto_compact defaults, {client}: hits >= 90%",
                    f"OpenAI {compact['openai_hit']:.1%}, Anthropic "
                    f"{compact['anthropic_hit']:.1%}",
                    verdict(compact_hits >= CACHE_COMPACT_TARGET)])
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
    lines += table(["strategy", "client", "requests (summarizer)", "prefix broken",
                    "tokens sent", "OpenAI hit", "Anthropic hit", "cost OpenAI",
                    "cost Anthropic", "largest window", "over budget", "kept"], rows)
    if with_targets:
        lines += table(["target", "measured", "verdict"], cache_targets(cache))
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
