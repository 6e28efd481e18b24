"""Prompt-cache hits of a long coding-agent session through the real proxy.

A deterministic session (``Script``: a ~1,000-token system prompt, 6 tools, 1-3 tool calls
per turn with results of 300-3,000 tokens, 200 turns; 40 with ``--quick``) is driven
through ``create_app`` (in process, requests through ``httpx.ASGITransport``) against the
fake upstream, whose replies play the agent's side. Every request the fake receives is
scored as a provider's cache would serve it (``score``):

- OpenAI: the longest prefix (whole blocks: the tools, then each message) any earlier
  request of the session began with, cached from 1,024 tokens on in 128-token steps.
- Anthropic: the blocks up to a ``cache_control`` breakpoint are written to the cache; a
  later request reads the longest written prefix that ends at most 20 blocks before one
  of its own breakpoints; writes cost 1.25x. The proxy runs with ``cache_breakpoints:
  all``, so the breakpoints scored are the ones it placed on the requests the fake
  received (as it places them for Anthropic models); they do not count in the bytes.

Effective input cost counts uncached tokens 1x, cached 0.1x and Anthropic's writes 1.25x,
summarizer calls included. ``python bench/cache.py [--quick]`` prints the table;
bench/run.py runs it as one phase and bench/report_cache.py reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (the repository's packages)
import httpx
import orjson

from proxy.testing.fake_upstream import FakeUpstream, Reply, default_usage
from proxy.turn.cache_hints import anthropic_breakpoints
from strategies.summary_prompt import SUMMARY_INSTRUCTION_LEAD, SUMMARY_SYSTEM_PROMPT
from strategies.tokens import count_message, count_text

MODEL = "gpt-4o-mini"
API_KEY = "sk-bench-cache-3b9e1f7a2c5d4e6f"
CONTEXT_WINDOW = 32_000
OPENAI_MIN, OPENAI_STEP = 1024, 128
ANTHROPIC_MIN, ANTHROPIC_LOOKBACK = 1024, 20
READ_PRICE, WRITE_PRICE = 0.1, 1.25

# (row, memoryConfig, X-Memory header); the client kinds are crossed with every row but
# the last, which is a full-history client's by nature
ROWS: list[tuple[str, dict[str, Any] | None, str | None]] = [
    ("summarizing_window, defaults", {"kind": "summarizing_window"}, None),
    ("summarizing_window, spec per-request", {"kind": "summarizing_window",
                                              "stablePrefix": False}, None),
    ("summarizing_window, no compression", {"kind": "summarizing_window",
                                            "compressToolResults": False}, None),
    ("auto_compact, defaults", {"kind": "auto_compact"}, None),
    ("auto_compact, eviction 1/500", {"kind": "auto_compact", "toolResultEviction":
                                      {"afterTurns": 1, "aboveTokens": 500}}, None),
    ("windowed 20", {"kind": "windowed", "windowSize": 20}, None),
]
NO_MEMORY = "no memory (X-Memory: off)"

TOOLS = [
    ("read_file", "Read a file of the repository and return its text with line numbers.",
     {"path": "string", "start_line": "integer", "end_line": "integer"}),
    ("write_file", "Replace a file's whole content, creating it when it does not exist.",
     {"path": "string", "content": "string"}),
    ("grep", "Search the repository for a regular expression; returns matching lines.",
     {"pattern": "string", "path": "string"}),
    ("run_tests", "Run the test suite or one test file and return the runner's output.",
     {"target": "string", "flags": "string"}),
    ("list_dir", "List the files and folders under a path, one per line, with sizes.",
     {"path": "string"}),
    ("run_shell", "Run a shell command in the repository and return its output.",
     {"command": "string", "timeout_seconds": "integer"}),
]
RULES = [
    "Read the relevant files before you change them, and keep each change small.",
    "Run the tests that cover what you touched after every change, and read their output.",
    "Prefer the project's existing helpers over new code; never duplicate a function.",
    "Explain what you are about to do in one sentence before each tool call.",
    "When a test fails, read the failure, find the cause, and fix the code, not the test.",
    "Keep the public interfaces stable unless the task asks for a change to them.",
    "Write clear commit messages that say what changed and why, in the project's style.",
    "Never print secrets, tokens or passwords, and never write them into files.",
    "Ask the user before deleting files or rewriting history; otherwise go ahead.",
    "Stop and summarize when the task is done: what changed, what was tested, what is left.",
]
WORDS = ("config parser request window token store session cache value result index "
         "buffer stream handler worker record message summary budget client server").split()


def system_prompt() -> str:
    lines = ["You are a careful software engineer working in a Python repository through "
             "tools. The repository is a web service with a storage layer, a request "
             "pipeline and a test suite. Follow these rules:"]
    for part in range(4):
        for number, rule in enumerate(RULES, 1):
            lines.append(f"{part * len(RULES) + number}. {rule}")
    lines.append("Answer in plain text; use code blocks for code and commands.")
    return "\n".join(lines)


def tool_definitions() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            key: {"type": kind, "description": f"The {key.replace('_', ' ')}."}
            for key, kind in params.items()}, "required": [next(iter(params))]}}}
        for name, description, params in TOOLS]


@dataclass
class Call:
    name: str
    arguments: str
    result: str


@dataclass
class ScriptTurn:
    user: str
    calls: list[Call]
    answer: str


def code_text(rng: random.Random, tokens: int, path: str) -> str:
    """A tool result of about ``tokens`` tokens: numbered lines of code-like text."""
    lines: list[str] = []
    count = 0
    number = rng.randint(1, 400)
    while count < tokens:
        a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
        line = f"{path}:{number}:    {a}_{b} = self.{c}_{rng.randint(0, 99)}({a}, {b}={c})"
        lines.append(line)
        count += count_text(line, MODEL) + 1
        number += 1
    return "\n".join(lines)


def script(turns: int, seed: int = 24) -> list[ScriptTurn]:
    rng = random.Random(seed)
    out = []
    for index in range(turns):
        calls = []
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(TOOLS)[0]
            path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
            calls.append(Call(name, json.dumps({"path": path}),
                              code_text(rng, rng.randint(300, 3000), path)))
        task = " ".join(rng.choice(WORDS) for _ in range(12))
        out.append(ScriptTurn(
            user=f"Turn {index}. Next step: look at the {task} and fix what is wrong.",
            calls=calls,
            answer=f"Done with turn {index}: the {rng.choice(WORDS)} handling now passes "
                   f"its tests. Next I would look at the {rng.choice(WORDS)} module.",
        ))
    return out


def agent_reply(turns: list[ScriptTurn]) -> Callable[[dict[str, Any]], Reply]:
    """The fake upstream's side: the next tool call of the turn named in the last user
    message, or its answer once every call has its result; a summary for the summarizer."""
    summaries = iter(range(1_000_000))
    cache = Scorer()  # what the provider's cache holds, reported in each reply's usage

    def reply(body: dict[str, Any]) -> Reply:
        if is_summarizer(body):
            n = next(summaries)
            return Reply.text(f"Summary {n}: the agent works through the repository turn by "
                              "turn, reading files and running tests. " * 12)
        scored = cache.score(body, summarizer=False)
        reply = answer(body)
        return dataclasses.replace(reply, usage={
            **default_usage(reply, prompt_tokens(body)),
            "prompt_tokens_details": {"cached_tokens": scored.openai_cached}})

    def answer(body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        last = messages[-1]
        if last.get("role") == "tool":  # call ids name the turn and the call
            number, done = (int(x) for x in str(last["tool_call_id"]).split("_")[1:])
            done += 1
        else:
            number, done = int(str(last["content"]).split(".", 1)[0].split()[1]), 0
        turn = turns[number]
        if done < len(turn.calls):
            call = turn.calls[done]
            return Reply.tool_calls([{"id": f"call_{number}_{done}", "name": call.name,
                                      "arguments": call.arguments}])
        return Reply.text(turn.answer)

    return reply


def is_summarizer(body: dict[str, Any]) -> bool:
    """A summarizer call: the classic one (its own system prompt) or one on the session's
    prefix (the summary instruction last)."""
    messages = body.get("messages") or [{}]
    return (SUMMARY_SYSTEM_PROMPT[:40] in str(messages[0].get("content"))
            or str(messages[-1].get("content")).startswith(SUMMARY_INSTRUCTION_LEAD))


# ---- scoring ----

_block_tokens: dict[bytes, int] = {}


def blocks(body: dict[str, Any]) -> list[tuple[bytes, int]]:
    """The request as a provider caches it: the tools, then each message, as sent
    (bytes, key order included), with their tokens."""
    out = []
    items: list[Any] = [("tools", body["tools"])] if body.get("tools") else []
    items += body.get("messages") or []
    for item in items:
        if isinstance(item, dict) and "cache_control" in item:
            item = {k: v for k, v in item.items() if k != "cache_control"}
        raw = orjson.dumps(item)
        tokens = _block_tokens.get(raw)
        if tokens is None:
            if isinstance(item, tuple):
                tokens = count_text(orjson.dumps(item[1]).decode(), MODEL)
            else:
                tokens = count_message(item, MODEL)
            _block_tokens[raw] = tokens
        out.append((raw, tokens))
    return out


def chain(parts: list[tuple[bytes, int]]) -> list[bytes]:
    """The hash of every prefix of whole blocks."""
    digest = hashlib.blake2b(digest_size=16)
    out = []
    for raw, _tokens in parts:
        digest.update(hashlib.blake2b(raw, digest_size=16).digest())
        out.append(digest.copy().digest())
    return out


def prompt_tokens(body: dict[str, Any]) -> int:
    return sum(t for _raw, t in blocks(body))


@dataclass
class Scored:
    tokens: int
    openai_cached: int
    anthropic_read: int
    anthropic_write: int
    summarizer: bool
    kept_share: float = 0.0
    prefix_kept: bool = True  # the previous request is a prefix of this one


@dataclass
class Scorer:
    openai_seen: set[bytes] = field(default_factory=set)
    anthropic_written: set[bytes] = field(default_factory=set)
    previous: list[bytes] = field(default_factory=list)

    def score(self, body: dict[str, Any], summarizer: bool) -> Scored:
        parts = blocks(body)
        hashes = chain(parts)
        sizes = [t for _raw, t in parts]
        cumulative = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        matched = max((i + 1 for i, h in enumerate(hashes) if h in self.openai_seen), default=0)
        prefix = cumulative[matched - 1] if matched else 0
        cached = 0 if prefix < OPENAI_MIN else prefix - (prefix - OPENAI_MIN) % OPENAI_STEP
        self.openai_seen.update(hashes)

        offset = 1 if body.get("tools") else 0
        messages = body.get("messages") or []
        marked = [i for i, m in enumerate(messages) if "cache_control" in m]
        # a request without the proxy's marks (X-Memory: off) gets the default placement
        marks = [offset + i for i in (marked or anthropic_breakpoints(messages))]
        read_at = 0
        for mark in marks:
            for index in range(mark, max(-1, mark - ANTHROPIC_LOOKBACK - 1), -1):
                if hashes[index] in self.anthropic_written:
                    read_at = max(read_at, index + 1)
                    break
        read = cumulative[read_at - 1] if read_at else 0
        read = read if read >= ANTHROPIC_MIN else 0
        last_mark = cumulative[marks[-1]] if marks else 0
        write = max(0, last_mark - read) if last_mark >= ANTHROPIC_MIN else 0
        self.anthropic_written.update(hashes[m] for m in marks)
        kept = True
        if not summarizer:
            kept = hashes[: len(self.previous)] == self.previous
            self.previous = hashes
        return Scored(cumulative[-1] if cumulative else 0, cached, read, write, summarizer,
                      prefix_kept=kept)


# ---- driving ----

@dataclass
class Row:
    name: str
    client: str
    requests: int = 0
    summarizer_calls: int = 0
    prefix_broken: int = 0
    tokens: int = 0
    openai_cached: int = 0
    anthropic_read: int = 0
    anthropic_write: int = 0
    largest_window: int = 0
    over_budget: int = 0
    kept_share_mean: float = 0.0
    kept_share_min: float = 1.0

    def add(self, s: Scored, budget: int | None) -> None:
        self.requests += 1
        self.summarizer_calls += s.summarizer
        self.prefix_broken += not s.prefix_kept
        self.tokens += s.tokens
        self.openai_cached += s.openai_cached
        self.anthropic_read += s.anthropic_read
        self.anthropic_write += s.anthropic_write
        if not s.summarizer:
            self.largest_window = max(self.largest_window, s.tokens)
            self.over_budget += bool(budget and s.tokens > budget)

    @property
    def openai_hit(self) -> float:
        return self.openai_cached / max(1, self.tokens)

    @property
    def anthropic_hit(self) -> float:
        return self.anthropic_read / max(1, self.tokens)

    @property
    def openai_cost(self) -> float:
        return self.tokens - self.openai_cached + READ_PRICE * self.openai_cached

    @property
    def anthropic_cost(self) -> float:
        uncached = self.tokens - self.anthropic_read - self.anthropic_write
        return uncached + READ_PRICE * self.anthropic_read + WRITE_PRICE * self.anthropic_write

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "openai_hit": self.openai_hit,
                "anthropic_hit": self.anthropic_hit, "openai_cost": self.openai_cost,
                "anthropic_cost": self.anthropic_cost}


def agent_name(index: int) -> str:
    return f"cache-bench-{index}"


Rows = list[tuple[str, dict[str, Any] | None, str | None]]


def write_agents(directory: Path, rows: Rows) -> None:
    for index, (_name, config, _header) in enumerate(rows):
        definition = {"name": agent_name(index),
                      "llm": {"model": MODEL, "contextWindow": CONTEXT_WINDOW},
                      "memoryConfig": config}
        (directory / f"{agent_name(index)}.json").write_text(json.dumps(definition))


def budget_of(config: dict[str, Any] | None) -> int | None:
    if config and config.get("kind") == "summarizing_window":
        return round(config.get("maxConversationRatio", 0.8) * CONTEXT_WINDOW)
    return None


async def drive(client: httpx.AsyncClient, services: Any, fake: FakeUpstream,
                turns: list[ScriptTurn], agent: str, session: str, full: bool,
                header: str | None) -> list[dict[str, Any]]:
    """One session, turn after turn: a delta client sends the new messages only, a
    full-history client its whole conversation. Returns the bodies the fake received."""
    system = {"role": "system", "content": system_prompt()}
    tools = tool_definitions()
    conversation: list[dict[str, Any]] = []
    headers = {"x-memory": header} if header else {}
    url = f"/agents/{agent}/sessions/{session}/v1/chat/completions"
    shares: list[float] = []
    fake.reset()
    for turn in turns:
        new: list[dict[str, Any]] = [{"role": "user", "content": turn.user}]
        while True:
            conversation.extend(new)
            messages = [system, *(conversation if full else new)]
            response = await client.post(url, headers=headers, content=orjson.dumps(
                {"model": MODEL, "messages": messages, "tools": tools}))
            if response.status_code != 200:
                raise RuntimeError(f"turn failed: {response.status_code} {response.text[:300]}")
            await services.drain()
            sent = fake.chat_requests[-1].body if fake.chat_requests else {}
            window = [m for m in sent.get("messages", []) if m.get("role") != "system"]
            shares.append(min(1.0, len(window) / max(1, len(conversation))))
            message = response.json()["choices"][0]["message"]
            reply = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                reply["tool_calls"] = message["tool_calls"]
            conversation.append(reply)
            calls = message.get("tool_calls") or []
            if not calls:
                break
            call = calls[0]
            number, done = (int(x) for x in call["id"].split("_")[1:])
            new = [{"role": "tool", "tool_call_id": call["id"],
                    "content": turns[number].calls[done].result}]
    bodies = [dict(r.body, _shares=None) for r in fake.chat_requests]
    bodies[0]["_shares"] = shares
    return bodies


async def measure(turns: int, clients: tuple[bool, ...] = (False, True),
                  no_memory: bool = True, rows: Rows | None = None) -> dict[str, Any]:
    from proxy.http.app import create_app
    from proxy.settings import Settings

    session_script = script(turns)
    fake = FakeUpstream(default_reply=agent_reply(session_script), count_tokens=prompt_tokens)
    configs = ROWS if rows is None else rows
    rows_out: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, fake:
        agents = Path(tmp) / "agents"
        agents.mkdir()
        write_agents(agents, configs)
        settings = Settings(store_url=f"sqlite:///{tmp}/cache.db", upstream_url=fake.url,
                            agents_dir=agents, log_level="warning", cache_breakpoints="all")
        app = create_app(settings)
        services = app.state.services
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://proxy", timeout=120,
            headers={"Authorization": f"Bearer {API_KEY}"},
        ) as client:
            plan = [(i, name, config, header, full) for i, (name, config, header)
                    in enumerate(configs) for full in clients]
            if no_memory:
                plan.append((0, NO_MEMORY, None, "off", True))
            for index, name, config, header, full in plan:
                session = f"{'full' if full else 'delta'}-{index}-{header or 'on'}"
                bodies = await drive(client, services, fake, session_script, agent_name(index),
                                     session, full, header)
                row = Row(name, "full-history" if full else "delta")
                scorer = Scorer()
                shares = bodies[0]["_shares"]
                for body in bodies:
                    body.pop("_shares")
                    row.add(scorer.score(body, is_summarizer(body)), budget_of(config))
                row.kept_share_mean = sum(shares) / max(1, len(shares))
                row.kept_share_min = min(shares, default=1.0)
                rows_out.append(row)
                print(f"  {name}, {row.client}: {row.requests} requests, OpenAI "
                      f"{row.openai_hit:.0%}, Anthropic {row.anthropic_hit:.0%}", flush=True)
    return {"turns": turns, "context_window": CONTEXT_WINDOW,
            "rows": [r.summary() for r in rows_out]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 turns instead of 200")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--row", action="append", default=[], metavar="LABEL=JSON",
                        help="measure this memoryConfig (a JSON object) instead of the "
                        "standard rows; repeatable")
    parser.add_argument("--clients", default="delta,full-history",
                        help="client kinds, comma-separated: delta, full-history")
    parser.add_argument("--no-plain", action="store_true",
                        help="leave out the no-memory row")
    args = parser.parse_args(argv)
    turns = args.turns or (40 if args.quick else 200)
    rows: Rows | None = None
    if args.row:
        rows = []
        for spec in args.row:
            label, _, config = spec.partition("=")
            rows.append((label, json.loads(config), None))
    kinds = {"delta": False, "full-history": True}
    clients = tuple(kinds[k.strip()] for k in args.clients.split(","))
    results = asyncio.run(measure(turns, clients, not args.no_plain, rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    import report_cache

    print("\n".join(report_cache.cache_section(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
