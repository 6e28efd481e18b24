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
tool-using sessions, and summaries from an extractive stand-in (quality_upstream.py).

Questions are asked through ``GET /memory/{agent}/{session}``: the window the strategy
chooses for the stored session, as a turn would send it (the question's own few tokens
aside). A turn would store the question; the inspection stores nothing, and the store's
meta (version, head, message count) is compared before and after every question.

What is scored per configuration (strategy x context window) is in quality_score.py; the
report's section and its targets are in quality_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (the repository's packages)
import httpx
from conversations import Conversation, generate, read_locomo
from pydantic import SecretStr
from quality_report import render, targets, write_section
from quality_score import Score, allowed_index, distance_name
from quality_upstream import MODEL, Upstream, first_sentence

from proxy.testing.fake_upstream import FakeUpstream, Reply
from proxy.turn.identity import namespace_for
from strategies.compression import content_text
from strategies.records import LoadSpec, SessionKey
from strategies.tokens import count_message

API_KEY = "sk-bench-quality-0c1d2e3f4a5b6c7d8e9f"
ADMIN = "bench-quality-admin"

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
                assert turn.tool is not None  # the turns that call a tool carry it
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
            score.add(score.by_distance, distance_name(distance), exact, summary)


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
                            agents_dir=agents, admin_token=SecretStr(ADMIN), log_level="warning",
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
