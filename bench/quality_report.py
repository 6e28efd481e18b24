"""The memory-quality section of bench/RESULTS.md (bench/quality.py's results): its targets,
each with its measured value and verdict, and its tables; ``--write`` puts it into the report
in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quality_score import DISTANCES

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## Memory quality"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's targets, each with its measured value and verdict."""
    configs = {(c["strategy"], c["window"]): c for c in results["configs"]}
    out = []
    for label in ("summarizing_window", "summarizing_window, maxHistoryFetch 100"):
        fits = configs.get((label, "fits"))
        if not fits:
            continue
        # tool results read and under pressure are compressed by rule (the original stays
        # in the store, a fetch_tool_result call away): the target is the conversation's
        talk = [v for k, v in fits["by_kind"].items() if k != "tool"]
        kept = sum(v["exact"] * v["n"] for v in talk) / max(1, sum(v["n"] for v in talk))
        tool = fits["by_kind"].get("tool")
        measured = f"{kept:.3f} of the conversation's turns" + (
            f" (tool results: {tool['exact']:.3f}, compressed under pressure)" if tool else "")
        out.append({"target": f"at a window every conversation fits in, {label} keeps "
                    ">= 99% of the evidence", "measured": measured, "met": kept >= 0.99})
    short = [c for c in results["configs"] if c["window"] == "quarter"
             and c["verbatim_budget_allows"] is not None]
    if short:
        worst = min(short, key=lambda c: c["recall_exact"] - c["verbatim_budget_allows"])
        gap = worst["recall_exact"] - worst["verbatim_budget_allows"]
        out.append({"target": "at a quarter of the conversation's size, no strategy keeps less "
                    "than its verbatim budget allows",
                    "measured": f"smallest margin {gap:+.3f} ({worst['strategy']}: "
                    f"{worst['recall_exact']:.3f} kept, {worst['verbatim_budget_allows']:.3f} "
                    "allowed)", "met": gap >= 0})
    plain = configs.get(("summarizing_window", "quarter"))
    summarized = configs.get(("summarizing_window + autoSummarize", "quarter"))
    if plain and summarized:
        out.append({"target": "summaries only add (autoSummarize, counting summary text, vs "
                    "the same window without summaries, exact)",
                    "measured": f"{summarized['recall_with_summary']:.3f} vs "
                    f"{plain['recall_exact']:.3f}",
                    "met": summarized["recall_with_summary"] >= plain["recall_exact"]})
    unchanged = all(c["store_unchanged"] == c["store_checks"] for c in results["configs"])
    out.append({"target": "questions leave the stored session unchanged",
                "measured": f"{sum(c['store_checks'] for c in results['configs']):,} checks",
                "met": unchanged})
    return out


def render(results: dict[str, Any]) -> list[str]:
    """The report's section (markdown lines)."""
    windows = results["windows"]
    lines = [SECTION, "",
             f"`bench/quality.py`: {results['source']}, {results['turns']:,} turns, "
             f"{results['questions']:,} questions, {results['seconds']:.0f} s; conversations of "
             + ", ".join(f"{t:,}" for t in results["conversation_tokens"])
             + " tokens. Context windows: "
             + ", ".join(f"{name} {size:,}" for name, size in windows.items())
             + ". Replayed through the proxy in process against the fake upstream; questions "
             "asked through `/memory` (the window as a turn would send it), the stored session "
             "checked unchanged after each. *Exact*: the evidence text verbatim in a window "
             "message; *+ summary*: or in the summary sent (an extractive stand-in summarizer, "
             "not a model); *allowed*: what the strategy's verbatim budget holds. Cache: prompt "
             "tokens a provider would serve from its prefix cache (OpenAI's rule: the common "
             "prefix with the previous request, from 1,024 tokens, in steps of 128).", ""]
    lines += ["| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'met' if t['met'] else '**not met**'} |"
              for t in results["targets"]]
    lines += ["", "| strategy | window | exact | + summary | allowed | tokens / question | "
              "over the window | cache hits | cached tokens |", "|---" * 9 + "|"]
    for c in results["configs"]:
        cache = c["cache"]
        allowed = c["verbatim_budget_allows"]
        lines.append(
            f"| {c['strategy']} | {c['context_window']:,} | {c['recall_exact']:.3f} | "
            f"{c['recall_with_summary']:.3f} | {'-' if allowed is None else f'{allowed:.3f}'} | "
            f"{c['tokens_per_question']:,.0f} | {c['over_window']} | "
            f"{cache['hits'] / max(1, cache['requests']):.0%} | "
            f"{cache['cached_tokens'] / max(1, cache['prompt_tokens']):.0%} |")
    kinds = sorted({k for c in results["configs"] for k in c["by_kind"]})
    distances = [name for _, name in DISTANCES
                 if any(name in c["by_distance"] for c in results["configs"])]
    lines += ["", "Exact recall (+ summary) by question kind and by distance (tokens stored "
              "after the evidence when asked):", ""]
    head = ["strategy", "window", *kinds, *distances]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in results["configs"]:
        cells = [c["strategy"], f"{c['context_window']:,}"]
        for bucket, names in ((c["by_kind"], kinds), (c["by_distance"], distances)):
            for name in names:
                v = bucket.get(name)
                cells.append(f"{v['exact']:.2f} ({v['with_summary']:.2f})" if v else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def write_section(results: dict[str, Any], path: Path = RESULTS) -> None:
    """Replace (or append) the section in the report, keeping the rest as it is."""
    text = path.read_text() if path.exists() else "# memory-proxy benchmark results\n"
    section = "\n".join(render(results))
    start = text.find(SECTION)
    profiles = text.find("\n## Profiles")
    if start < 0 and profiles >= 0:  # where run.py's report puts it
        text = text[:profiles + 1] + section + "\n" + text[profiles + 1:]
    elif start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")
