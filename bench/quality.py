"""What memory keeps: long conversations replayed through the proxy, and for each question
whether its evidence turns are still in the window the model would receive. No model is
involved: this measures what memory can still see, not how well a model answers.

    python bench/quality.py --quick            # one generated conversation, ~20 s
    python bench/quality.py                    # three generated conversations, ~5 min
    python bench/quality.py --locomo PATH      # the user's own copy of LoCoMo's file
    python bench/quality.py --quick --write    # and put the section into bench/RESULTS.md

Each conversation (bench/conversations.py) is replayed as a delta client through the real
app in this process (``create_app`` with its lifespan, requests through
``httpx.ASGITransport``, an embedded SQLite store) against the fake upstream on loopback
(``proxy.testing.fake_upstream``), which answers with the conversation's next turn, a tool call in
tool-using sessions, and summaries from an extractive stand-in (the first sentence of each
transcript item and of the previous summary, newest kept within the call's max_tokens):
summary recall measures what the mechanism lets through, not what a model would write.

Questions are asked through ``GET /memory/{agent}/{session}``: the window the strategy
chooses for the stored session, as a turn would send it (the question's own few tokens
aside). A turn would store the question; the inspection stores nothing, and the store's
meta (version, head, message count) is compared before and after every question.

Per configuration (strategy x context window): evidence recall in the window, exact (the
evidence text verbatim in a window message) and counting summary text (or in the summary
sent); by distance (tokens stored after the evidence when asked) and by question kind; what
its verbatim budget allows (the evidence within the newest messages the budget holds,
a compressed result counting as its stub); tokens sent per question; and prompt cache hits
of the replayed turns, scored with OpenAI's rule (the longest common prefix with the
previous request, counted when at least 1,024 tokens, in steps of 128).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (the repository's packages)
import httpx
import orjson
from conversations import Conversation, generate, read_locomo

from proxy.testing.fake_upstream import FakeUpstream, Reply, default_usage
from proxy.turn.identity import namespace_for
from strategies.compression import content_text
from strategies.records import LoadSpec, SessionKey, StoredMessage
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.tokens import count_message, count_text

MODEL = "gpt-4o"
API_KEY = "sk-bench-quality-0c1d2e3f4a5b6c7d8e9f"
ADMIN = "bench-quality-admin"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## Memory quality"
CACHE_MIN, CACHE_STEP = 1024, 128
DISTANCES = ((2_000, "< 2k"), (8_000, "2k-8k"), (32_000, "8k-32k"), (math.inf, "32k+"))

NO_PROMPT_CACHE = "summarizing_window, upstream that caches nothing"
# (label, memoryConfig, verbatim budget: ("ratio", r) of the window, ("last", n) messages,
# ("turn",) the current turn only, None: no fixed budget)
STRATEGIES: list[tuple[str, dict[str, Any], tuple[Any, ...] | None]] = [
    ("summarizing_window", {"kind": "summarizing_window"}, ("ratio", 0.8)),
    # the same defaults on a provider that reports no prompt caching: stablePrefix "auto"
    # keeps no stable prefix there (the spec's refit at every request)
    (NO_PROMPT_CACHE, {"kind": "summarizing_window"}, ("ratio", 0.8)),
    # a page of 100: the window pages through the history (maxHistoryFetch is a page size)
    ("summarizing_window, maxHistoryFetch 100",
     {"kind": "summarizing_window", "maxHistoryFetch": 100}, ("ratio", 0.8)),
    ("summarizing_window + autoSummarize",
     {"kind": "summarizing_window", "autoSummarize": True}, None),
    ("auto_compact", {"kind": "auto_compact"}, None),
    ("windowed 100", {"kind": "windowed", "windowSize": 100}, ("last", 100)),
    ("full", {"kind": "full"}, ("last", 500)),
    ("none", {"kind": "none"}, ("turn",)),
]


def is_summarizer(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return str(messages[0].get("content", "")).startswith(SUMMARY_SYSTEM_PROMPT)


_ITEM = re.compile(r"^\[(\d+)\] [A-Z ]+(?:\([^)]*\))?: ?(.*)$")


def first_sentence(text: str) -> str:
    text = text.strip().split("\n", 1)[0]
    match = re.search(r"[.!?](\s|$)", text)
    return text[: match.end()].strip() if match else text[:200]


def extractive_summary(body: dict[str, Any]) -> str:
    """The stand-in summarizer: the previous summary's lines, then the first sentence of
    each transcript item, the oldest dropped until the text fits the call's max_tokens."""
    content = str(body["messages"][1]["content"])
    lines: list[str] = []
    previous = re.search(r"## Previous summary \([^)]*\)\n(.*?)\n\n## Transcript", content, re.S)
    if previous:
        lines += [line for line in previous.group(1).splitlines() if line.strip()]
    transcript = content.split("## Transcript", 1)[-1]
    for line in transcript.splitlines():
        match = _ITEM.match(line)
        if match and match[2].strip():
            lines.append(first_sentence(match[2]))
    limit = int(body.get("max_tokens") or 1000)
    while len(lines) > 1 and count_text("\n".join(lines), MODEL) > limit:
        lines = lines[max(1, len(lines) // 10):]
    return "\n".join(lines) or "nothing to remember"


@dataclass
class CacheScore:
    requests: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Upstream:
    """The fake upstream's answers: the replay's scripted replies for the agent's calls,
    extractive summaries for the summarizer's; prompt sizes counted as the proxy counts
    them (so calibration stays near 1) and cache hits scored per session."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.sizes: dict[bytes, int] = {}
        self.previous: list[tuple[bytes, int]] = []
        self.cache = CacheScore()
        # the replies report cached tokens (OpenAI's usage shape); off: a provider with no
        # prompt cache (stablePrefix "auto" then keeps none)
        self.reports_cache = True

    def new_session(self) -> None:
        self.previous = []
        self.cache = CacheScore()

    def _sized(self, body: dict[str, Any]) -> list[tuple[bytes, int]]:
        sized = []
        for message in body.get("messages") or []:
            key = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            size = self.sizes.get(key)
            if size is None:
                size = self.sizes[key] = count_message(message, MODEL)
            sized.append((key, size))
        return sized

    def count(self, body: dict[str, Any]) -> int:
        return sum(size for _, size in self._sized(body)) + 3

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summarizer(body):
            return Reply.text(extractive_summary(body))
        sized = self._sized(body)
        cached = self._score(sized)
        reply = self.replies.popleft() if self.replies else Reply.text("OK.")
        if not self.reports_cache:
            return reply
        usage = default_usage(reply, sum(size for _, size in sized) + 3)
        # as a provider with a prompt cache reports it
        return dataclasses.replace(reply, usage={
            **usage, "prompt_tokens_details": {"cached_tokens": cached}})

    def _score(self, sized: list[tuple[bytes, int]]) -> int:
        total = sum(size for _, size in sized) + 3
        common = 0
        for (key, size), (before, _) in zip(sized, self.previous, strict=False):
            if key != before:
                # within the first message that differs: its common text prefix
                prefix = os.path.commonprefix([key.decode(), before.decode()])  # noqa: RUF071
                common += count_text(prefix, MODEL) if prefix else 0
                break
            common += size
        cached = 0 if common < CACHE_MIN else common // CACHE_STEP * CACHE_STEP
        if self.previous:
            self.cache.requests += 1
            self.cache.hits += cached > 0
            self.cache.prompt_tokens += total
            self.cache.cached_tokens += min(cached, total)
        self.previous = sized
        return cached


@dataclass
class Score:
    """Per configuration: evidence counts by kind and distance, tokens per question."""

    evidence: int = 0
    exact: int = 0
    with_summary: int = 0
    allowed: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [n, exact, summ]
    by_distance: dict[str, list[int]] = field(default_factory=dict)
    questions: int = 0
    window_tokens: int = 0
    over_window: int = 0
    checks: int = 0
    unchanged: int = 0
    cache: CacheScore = field(default_factory=CacheScore)

    def add(self, bucket: dict[str, list[int]], name: str, exact: bool, summary: bool) -> None:
        row = bucket.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += exact
        row[2] += summary

    def to_dict(self) -> dict[str, Any]:
        n = max(1, self.evidence)
        return {
            "evidence": self.evidence,
            "recall_exact": self.exact / n,
            "recall_with_summary": self.with_summary / n,
            "verbatim_budget_allows": self.allowed / n if self.allowed >= 0 else None,
            "by_kind": {k: {"n": v[0], "exact": v[1] / v[0], "with_summary": v[2] / v[0]}
                        for k, v in sorted(self.by_kind.items())},
            "by_distance": {k: {"n": v[0], "exact": v[1] / v[0], "with_summary": v[2] / v[0]}
                            for _, k in DISTANCES if (v := self.by_distance.get(k))},
            "questions": self.questions,
            "tokens_per_question": self.window_tokens / max(1, self.questions),
            "over_window": self.over_window,
            "store_checks": self.checks,
            "store_unchanged": self.unchanged,
            "cache": {"requests": self.cache.requests, "hits": self.cache.hits,
                      "prompt_tokens": self.cache.prompt_tokens,
                      "cached_tokens": self.cache.cached_tokens},
        }


def _distance(tokens: int) -> str:
    return next(name for bound, name in DISTANCES if tokens < bound)


def allowed_index(budget: tuple[Any, ...] | None, stored: list[StoredMessage],
                  context_window: int, system_tokens: int) -> int | None:
    """The index of the oldest stored message the strategy's verbatim budget holds."""
    if budget is None:
        return None
    if budget[0] == "last":
        return max(0, len(stored) - budget[1])
    turn = max((i for i, m in enumerate(stored) if m.role == "user"), default=0)
    if budget[0] == "turn":
        return turn
    room = budget[1] * context_window - system_tokens
    index = len(stored)
    for i in range(len(stored) - 1, -1, -1):
        message = stored[i]
        size = message.tokens
        if message.compressed_content is not None:
            size = count_message({"role": message.role,
                                  "content": message.compressed_content}, MODEL)
        if i < turn and size > room:
            break
        room -= size
        index = i
    return index


class Replay:
    """One configuration's replay of every conversation and its questions."""

    def __init__(self, client: httpx.AsyncClient, services: Any, upstream: Upstream,
                 agent: str, context_window: int, budget: tuple[Any, ...] | None) -> None:
        self.client, self.services, self.upstream = client, services, upstream
        self.agent, self.context_window, self.budget = agent, context_window, budget
        self.score = Score()
        self.score.allowed = 0 if budget is not None else -1

    def key(self, conversation: Conversation) -> SessionKey:
        return SessionKey(namespace_for(API_KEY), self.agent, conversation.id)

    async def post(self, conversation: Conversation, messages: list[dict[str, Any]]) -> Any:
        response = await self.client.post(
            f"/agents/{self.agent}/sessions/{conversation.id}/v1/chat/completions",
            json={"model": MODEL, "messages": messages})
        if response.status_code != 200:
            raise RuntimeError(f"turn failed: {response.status_code} {response.text[:300]}")
        await self.services.drain()
        return response.json()

    async def run(self, conversation: Conversation) -> None:
        self.upstream.new_session()
        a, b = conversation.speakers
        system = {"role": "system", "content": f"You are {b}, talking with {a}. Stay in "
                  "character and remember what you were told."}
        asked_after: dict[str, list[Any]] = {}
        for question in conversation.questions:
            asked_after.setdefault(question.ask_after or "", []).append(question)
        tools = {call_id(t.dia_id): t for t in conversation.turns() if t.tool}
        first = True
        for group, replies in exchanges(conversation):
            messages = [system] if first else []
            first = False
            messages += [{k: v for k, v in m.items() if k != "_ids"} for m in group]
            self.upstream.replies.extend(replies)
            reply = await self.post(conversation, messages)
            calls = reply["choices"][0]["message"].get("tool_calls")
            if calls:
                turn = tools[calls[0]["id"]]
                await self.post(conversation, [{"role": "tool", "tool_call_id": calls[0]["id"],
                                                "content": turn.tool["result"]}])
            for message in group:
                for dia_id in message.get("_ids", ()):
                    for question in asked_after.pop(dia_id, []):
                        await self.ask(conversation, question)
        for questions in asked_after.values():
            for question in questions:
                await self.ask(conversation, question)
        cache = self.upstream.cache
        total = self.score.cache
        total.requests += cache.requests
        total.hits += cache.hits
        total.prompt_tokens += cache.prompt_tokens
        total.cached_tokens += cache.cached_tokens

    async def ask(self, conversation: Conversation, question: Any) -> None:
        store = self.services.store
        key = self.key(conversation)
        before = (await store.load(key, LoadSpec(limit=0))).meta
        response = await self.client.get(f"/memory/{self.agent}/{conversation.id}",
                                         headers={"Authorization": f"Bearer {ADMIN}"})
        if response.status_code != 200:
            raise RuntimeError(f"/memory failed: {response.status_code} {response.text[:300]}")
        view = response.json()
        after = (await store.load(key, LoadSpec(limit=0))).meta
        score = self.score
        score.checks += 1
        score.unchanged += (before.version, before.head_seq, before.active_count) == (
            after.version, after.head_seq, after.active_count)
        verbatim = [m["text"] for m in view["messages"] if "seq" in m]
        derived = [m["text"] for m in view["messages"] if "seq" not in m]
        derived += [s["text"] for s in view["summaries"] if s["sent"]]
        stored = (await store.load(key, LoadSpec(limit=10**7))).messages
        oldest = allowed_index(self.budget, stored, self.context_window, after.system_tokens)
        tokens = int(view["totals"]["window_tokens"])
        score.questions += 1
        score.window_tokens += tokens
        score.over_window += tokens > self.context_window
        for dia_id in question.evidence:
            needle = conversation.needle(dia_id)
            exact = any(needle in text for text in verbatim)
            summary = exact or any(first_sentence(needle) in text for text in derived)
            where = next((i for i in range(len(stored) - 1, -1, -1)
                          if needle in content_text(stored[i].content)), None)
            if where is None:
                continue  # asked before its evidence was stored
            distance = sum(m.tokens for m in stored[where + 1:])
            score.evidence += 1
            score.exact += exact
            score.with_summary += summary
            if oldest is not None:
                message = stored[where]
                stub = message.compressed_content
                score.allowed += where >= oldest and (stub is None or needle in stub)
            score.add(score.by_kind, question.kind, exact, summary)
            score.add(score.by_distance, _distance(distance), exact, summary)


def call_id(dia_id: str) -> str:
    return "call_" + re.sub(r"[^A-Za-z0-9]+", "_", dia_id)


def exchanges(conversation: Conversation) -> list[tuple[list[dict[str, Any]], list[Reply]]]:
    """The client's requests and the fake's replies: the first speaker's consecutive
    turns as user messages, then the second speaker's as one reply (a tool call first
    when one of them used a tool). Each message carries the dia_ids it holds (``_ids``,
    dropped before sending)."""
    a = conversation.speakers[0]
    out: list[tuple[list[dict[str, Any]], list[Reply]]] = []
    group: list[dict[str, Any]] = []
    answer: list[Any] = []
    started = {s.turns[0].dia_id: s.date_time for s in conversation.sessions if s.turns}

    def close() -> None:
        if not group and not answer:
            return
        text = "\n".join(f"{t.speaker}: {t.text}" for t in answer) or "OK."
        replies = []
        tool = next((t for t in answer if t.tool), None)
        if tool is not None:
            replies.append(Reply.tool_calls([{"id": call_id(tool.dia_id),
                                              "name": tool.tool["name"],
                                              "arguments": tool.tool["arguments"]}]))
        replies.append(Reply.text(text))
        ids = [t.dia_id for t in answer]
        messages = group or [{"role": "user", "content": "(listening)", "_ids": []}]
        messages[-1]["_ids"] = [*messages[-1].get("_ids", []), *ids]
        out.append((messages, replies))

    for turn in conversation.turns():
        date = started.get(turn.dia_id)
        prefix = f"[{date}] " if date else ""
        if turn.speaker == a:
            if answer:
                close()
                group, answer = [], []
            group.append({"role": "user", "content": f"{prefix}{turn.speaker}: {turn.text}",
                          "_ids": [turn.dia_id]})
        else:
            if prefix and not group:
                group.append({"role": "user", "content": f"{prefix}(a new session)", "_ids": []})
            answer.append(turn)
    close()
    return out


def context_windows(conversations: list[Conversation]) -> dict[str, int]:
    """A quarter of the mean conversation's size, half of it, and a window every
    conversation fits in (its budget, 0.8 of it, holding the largest with room to spare)."""
    sizes = [conversation_tokens(c) for c in conversations]
    mean = sum(sizes) / len(sizes)
    quarter = max(1024, round(mean / 4 / 256) * 256)
    half = max(quarter, round(mean / 2 / 256) * 256)
    return {"quarter": quarter, "half": half,
            "fits": max(half, math.ceil(max(sizes) * 1.15 / 0.8 / 1024) * 1024)}


def conversation_tokens(conversation: Conversation) -> int:
    total = 0
    for turn in conversation.turns():
        total += count_message({"role": "user", "content": f"{turn.speaker}: {turn.text}"}, MODEL)
        if turn.tool:
            total += count_message({"role": "tool", "content": turn.tool["result"]}, MODEL)
    return total


Strategies = list[tuple[str, dict[str, Any], tuple[Any, ...] | None]]


def write_agents(directory: Path, windows: dict[str, int],
                 strategies: Strategies | None = None) -> list[tuple[str, str, int, Any]]:
    configs = []
    for label, memory, budget in STRATEGIES if strategies is None else strategies:
        for name, window in windows.items():
            agent = f"q-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}-{name}"
            (directory / f"{agent}.json").write_text(json.dumps({
                "name": agent, "llm": {"model": MODEL, "contextWindow": window},
                "memoryConfig": memory}))
            configs.append((label, name, window, (agent, budget)))
    return configs


async def measure_async(conversations: list[Conversation], source: str = "",
                        strategies: Strategies | None = None) -> dict[str, Any]:
    from proxy.http.app import create_app
    from proxy.settings import Settings

    started = time.perf_counter()
    windows = context_windows(conversations)
    upstream = Upstream()
    results: dict[str, Any] = {
        "source": source or f"{len(conversations)} conversations",
        "conversations": len(conversations),
        "turns": sum(len(c.turns()) for c in conversations),
        "questions": sum(len(c.questions) for c in conversations),
        "conversation_tokens": [conversation_tokens(c) for c in conversations],
        "windows": windows, "configs": [],
    }
    with tempfile.TemporaryDirectory() as tmp, FakeUpstream.running(
        default_reply=upstream, count_tokens=upstream.count, max_records=1
    ) as fake:
        agents = Path(tmp) / "agents"
        agents.mkdir()
        configs = write_agents(agents, windows, strategies)
        settings = Settings(store_url=f"sqlite:///{tmp}/quality.db", upstream_url=fake.url,
                            agents_dir=agents, admin_token=ADMIN, log_level="warning",
                            # replayed in seconds: the hourly budget would stop summaries a
                            # live conversation spread over days would get
                            summarizer_calls_per_hour=100_000)
        app = create_app(settings)
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://proxy", timeout=120,
            headers={"Authorization": f"Bearer {API_KEY}"},
        ) as client:
            for label, name, window, (agent, budget) in configs:
                upstream.reports_cache = not label.startswith(NO_PROMPT_CACHE)
                replay = Replay(client, app.state.services, upstream, agent, window, budget)
                for conversation in conversations:
                    await replay.run(conversation)
                results["configs"].append({"strategy": label, "window": name,
                                           "context_window": window, **replay.score.to_dict()})
                print(f"  {label} at {window:,} tokens: recall "
                      f"{replay.score.exact / max(1, replay.score.evidence):.3f}", flush=True)
    results["seconds"] = time.perf_counter() - started
    results["targets"] = targets(results)
    return results


def measure(*, quick: bool, locomo: Path | None = None,
            strategies: Strategies | None = None, count: int = 3) -> dict[str, Any]:
    """The phase run.py calls: generated conversations (or the user's LoCoMo copy)."""
    if locomo is not None:
        conversations = read_locomo(locomo)
        source = f"LoCoMo-format file {locomo.name}"
    elif quick:
        conversations = generate(1, sessions=12, turns=20, tool_every=3)
        source = "1 generated conversation (bench/conversations.py, seed 29)"
    else:
        conversations = generate(count, sessions=24, turns=24, tool_every=4, tool_rows=60)
        source = (f"{count} generated conversations (bench/conversations.py, "
                  f"seeds 29-{28 + count})")
    return asyncio.run(measure_async(conversations, source, strategies))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one generated conversation")
    parser.add_argument("--locomo", type=Path, help="a LoCoMo-format JSON file of your own")
    parser.add_argument("--write", action="store_true",
                        help="put the section into bench/RESULTS.md")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--strategy", action="append", default=[], metavar="LABEL=JSON",
                        help="replay this summarizing_window memoryConfig (a JSON object; "
                        "verbatim budget: its maxConversationRatio) instead of the standard "
                        f"strategies; a label starting {NO_PROMPT_CACHE!r} replays it on an "
                        "upstream that reports no prompt caching; repeatable")
    parser.add_argument("--conversations", type=int, default=3,
                        help="how many conversations to generate (seeds from 29 on)")
    args = parser.parse_args(argv)
    strategies: Strategies | None = None
    if args.strategy:
        strategies = []
        for spec in args.strategy:
            label, _, text = spec.partition("=")
            memory = json.loads(text)
            strategies.append((label, memory, ("ratio", memory.get("maxConversationRatio", 0.8))))
    results = measure(quick=args.quick, locomo=args.locomo, strategies=strategies,
                      count=args.conversations)
    print("\n".join(render(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.write:
        write_section(results)
    return 0 if all(t["met"] for t in results["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
