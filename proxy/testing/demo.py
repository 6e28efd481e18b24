"""``memory-proxy demo``: a scripted tool-using agent session against a built-in fake model.

Everything runs in this process on loopback: the fake upstream (``proxy/testing/fake_upstream.py``)
plays a research agent that reads big files, the proxy runs with a temporary SQLite store
and an auto_compact agent with a small context window, and a plain HTTP client (aiohttp)
drives the session. Turn by turn it prints what memory-proxy did: the window's size,
evicted tool results, hidden ``fetch_tool_result`` round trips, compactions and where the
summary landed. No API key, no network, a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn

from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream, Reply
from proxy.turn.identity import namespace_for
from strategies.compression import FETCH_TOOL
from strategies.records import LoadSpec, SessionKey
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.tokens import count_message

AGENT = "demo-researcher"
# the closing hint: a base URL that keeps memory (the path form names agent and session)
NEXT_URL = "http://127.0.0.1:4000/agents/assistant-with-tools/sessions/my-first-session/v1"
SESSION = "demo"
API_KEY = "demo-key-no-real-model"
MODEL = "gpt-4o"
CONTEXT_WINDOW = 3000
DEFINITION = {
    "name": AGENT,
    "description": "The demo's research agent: reads big files with a client tool.",
    "llm": {"model": MODEL, "contextWindow": CONTEXT_WINDOW},
    "memoryConfig": {
        "kind": "auto_compact",
        "compactAtRatio": 0.5,
        "summaryPlacement": "USER_MESSAGE",
        "toolResultEviction": {"afterTurns": 1, "aboveTokens": 300},
    },
    "tools": [{"name": "read_file"}, {"name": FETCH_TOOL}],
}
SYSTEM = "You are a research assistant. Read files with read_file and report what they say."
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]},
    },
}
# (the user's words, the file the agent reads or None to answer from memory)
SCRIPT = [
    ("Read reports/q1-sales.csv: which region sold the most?", "reports/q1-sales.csv"),
    ("Now read reports/q2-sales.csv.", "reports/q2-sales.csv"),
    ("Go through logs/support-june.txt for recurring complaints.", "logs/support-june.txt"),
    ("Back to the Q1 file from earlier: what exactly did its first row say?", None),
    ("Read docs/roadmap.md.", "docs/roadmap.md"),
    ("Read reports/q3-sales.csv.", "reports/q3-sales.csv"),
    ("Check logs/incidents.txt as well.", "logs/incidents.txt"),
    ("Sum up where we are.", None),
]
EVICTED = re.compile(r'tool result evicted by memory-proxy .*tool_call_id="([^"]*)"')
SUMMARY_LABEL = "(derived summary of messages"


def file_text(path: str) -> str:
    """A deterministic, bulky file: what a real tool returns (600+ tokens)."""
    regions = ("North", "South", "East", "West", "Central")
    lines = [f"# {path}"]
    for i in range(40):
        lines.append(f"{regions[i % 5]},{2024 + i // 60}-{i % 12 + 1:02d},"
                     f"units={(i * 37) % 900 + 100},note=row {i} of {path}")
    return "\n".join(lines)


def prompt_tokens(body: dict[str, Any]) -> int:
    return sum(count_message(m, MODEL) for m in body.get("messages") or ())


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content or "")


class DemoModel:
    """The fake upstream's answers: a research agent, and a summarizer."""

    def __init__(self) -> None:
        self.fetched = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        if messages and _text(messages[0]).startswith(SUMMARY_SYSTEM_PROMPT):
            return self.summarize(_text(messages[-1]))
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return self.after_tool(messages, last)
        wanted = _text(last)
        for user_text, path in SCRIPT:
            if wanted.startswith(user_text.split(":")[0]) and path:
                return Reply.tool_calls([{"name": "read_file", "arguments": {"path": path}}])
        if "earlier" in wanted:
            ids = [i for m in messages for i in EVICTED.findall(_text(m))]
            if ids:
                return Reply.tool_calls([{"name": FETCH_TOOL,
                                          "arguments": {"tool_call_id": ids[0]}}])
        return Reply.text(self.analysis("the conversation so far", "everything read"))

    def after_tool(self, messages: list[dict[str, Any]], result: dict[str, Any]) -> Reply:
        call: dict[str, Any] = next((c for m in messages for c in m.get("tool_calls") or ()
                     if c.get("id") == result.get("tool_call_id")), {})
        content = _text(result)
        first_row = content.splitlines()[1] if "\n" in content else content[:80]
        if call.get("function", {}).get("name") == FETCH_TOOL:
            with self._lock:
                self.fetched += 1
            return Reply.text(f"I reloaded the full Q1 file: its first row reads '{first_row}'.")
        return Reply.text(self.analysis(content.splitlines()[0].lstrip("# "), first_row))

    @staticmethod
    def analysis(subject: str, detail: str) -> str:
        return (f"Here is what {subject} shows. The first entry is '{detail}'. North and West "
                "lead on units, South trails, and the notes repeat a few themes: delivery "
                "delays, a pricing question and two data-quality issues worth a follow-up. "
                "I would compare this with the other quarters before drawing conclusions, "
                "and keep an eye on the Central region, whose numbers swing month to month.")

    @staticmethod
    def summarize(transcript: str) -> Reply:
        files = sorted(set(re.findall(r"[a-z]+/[a-z0-9-]+\.(?:csv|txt|md)", transcript)))
        return Reply.text(
            "The user is reviewing project files with the research assistant. Files read so "
            f"far: {', '.join(files) or 'none'}. North and West lead on units; support logs "
            "show delivery delays and a pricing question. Open task: compare the quarters "
            "and report where things stand."
        )


@dataclass
class TurnRow:
    turn: int
    asked: str
    window: int = 0
    evicted: int = 0
    fetched: int = 0
    events: list[str] = field(default_factory=list)


class Demo:
    """One demo run: the fake, the proxy on a free port, the scripted client."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.model = DemoModel()
        # the fake reports prompt sizes as the proxy counts them: the table's numbers and
        # the compaction trigger then agree (a real model's counts calibrate the estimate)
        self.fake = FakeUpstream(default_reply=self.model, count_tokens=prompt_tokens)
        self.key = SessionKey(namespace_for(API_KEY), AGENT, SESSION)
        self.compactions_seen = 0

    async def run(self, turns: int) -> int:
        from proxy.http.app import create_app

        agents = self.directory / "agents"
        agents.mkdir()
        (agents / f"{AGENT}.json").write_text(json.dumps(DEFINITION))
        await asyncio.to_thread(self.fake.start)
        server: uvicorn.Server | None = None
        serving: asyncio.Task[None] | None = None
        try:
            app = create_app(Settings(
                store_url=f"sqlite:///{self.directory / 'memory.db'}",
                upstream_url=self.fake.url,
                upstream_api_key=None,
                agents_dir=agents,
                admin_token=None,
            ))
            self.services = app.state.services
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            server = uvicorn.Server(
                uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started:
                if serving.done():
                    raise RuntimeError("the proxy did not start")
                await asyncio.sleep(0.01)
            self.url = f"http://127.0.0.1:{port}/agents/{AGENT}/sessions/{SESSION}/v1"
            async with aiohttp.ClientSession() as http:
                self.http = http
                print_header()
                for number in range(1, turns + 1):
                    print_row(await self.turn(number))
                await self.footer()
        except (RuntimeError, OSError, aiohttp.ClientError) as exc:
            print(f"memory-proxy demo failed: {exc}", file=sys.stderr)
            return 1
        finally:
            if server is not None and serving is not None:
                server.should_exit = True
                await asyncio.gather(serving, return_exceptions=True)
            await asyncio.to_thread(self.fake.stop)
        return 0

    async def post(self, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
        body = {"model": MODEL, "messages": messages, "tools": [READ_FILE]}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with self.http.post(f"{self.url}/chat/completions", json=body,
                                  headers=headers) as response:
            data = await response.json()
            if response.status != 200:
                raise RuntimeError(f"proxy answered {response.status}: {data}")
            return data, int(response.headers.get("x-memory-window-tokens", "0"))

    async def turn(self, number: int) -> TurnRow:
        asked, _ = SCRIPT[(number - 1) % len(SCRIPT)]
        row = TurnRow(number, asked)
        seen = len(self.fake.chat_requests)
        fetched = self.model.fetched
        summaries = len(await self.summaries())
        # a delta client: the system prompt once, then only what is new
        outgoing: list[dict[str, Any]] = [{"role": "user", "content": asked}]
        if number == 1:
            outgoing.insert(0, {"role": "system", "content": SYSTEM})
        while True:
            data, window = await self.post(outgoing)
            row.window = max(row.window, window)
            message = data["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            if not calls:
                break
            outgoing = [{"role": "tool", "tool_call_id": c["id"],
                         "content": file_text(json.loads(c["function"]["arguments"])["path"])}
                        for c in calls]
        await self.services.drain()
        requests = [r.body for r in self.fake.chat_requests[seen:]
                    if not _text(r.body["messages"][0]).startswith(SUMMARY_SYSTEM_PROMPT)]
        row.evicted = max((evicted_in(b["messages"]) for b in requests), default=0)
        row.fetched = self.model.fetched - fetched
        placed = where_summary_is(requests[0]["messages"]) if requests else None
        if placed and self.compactions_seen < summaries:
            self.compactions_seen = summaries
            row.events.append(f"window restarts from the summary, sent as {placed}")
        elif placed:
            row.events.append("verbatim, after the summary")
        if row.fetched:
            row.events.append(f"{FETCH_TOOL} answered from the store, unseen by the client")
        for record in (await self.summaries())[summaries:]:
            row.events.append(f"compacted messages {record.from_seq}-{record.to_seq} into one "
                              f"summary of {record.tokens} tokens")
        return row

    async def summaries(self) -> list[Any]:
        snapshot = await self.services.store.load(self.key, LoadSpec(limit=0))
        return [s for s in snapshot.summaries if s.kind == "compaction"]

    async def footer(self) -> None:
        snapshot = await self.services.store.load(self.key, LoadSpec(limit=100_000))
        ratio = DEFINITION["memoryConfig"]["compactAtRatio"]  # type: ignore[index]
        print()
        print(f"The store kept all {len(snapshot.messages)} messages and "
              f"{len(snapshot.summaries)} compaction record(s): eviction and compaction")
        print("change what is sent, never what is stored. Compaction fires once the window "
              f"after a turn passes {ratio:.0%}")
        print("of the context window, and runs after the response: it never delays one.")
        print()
        print("Next: `memory-proxy serve`, then point any OpenAI client's base URL at")
        print(f"  {NEXT_URL}")
        print("one URL per conversation: the agent (bundled ones in ./agent-definitions) and a "
              "session id of yours.")


def evicted_in(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "tool" and EVICTED.search(_text(m)))


def where_summary_is(messages: list[dict[str, Any]]) -> str | None:
    for message in messages:
        if SUMMARY_LABEL in _text(message):
            return "SYSTEM_PROMPT" if message.get("role") == "system" else "USER_MESSAGE"
    return None


COLUMNS = "{:>4}  {:<44}  {:>6}  {:>6}  {:>7}  {}"


def print_header() -> None:
    print(f'memory-proxy demo: agent "{AGENT}" against a built-in fake model '
          "(no API key, no network)")
    print(f"  context window {CONTEXT_WINDOW:,} tokens, memoryConfig "
          f"{json.dumps(DEFINITION['memoryConfig'])}")
    print("  window: tokens of the turn's largest request (X-Memory-Window-Tokens); evicted: "
          "older tool results sent as a pointer stub")
    print()
    print(COLUMNS.format("turn", "the user asks", "window", "of ctx", "evicted", "memory"))


def print_row(row: TurnRow) -> None:
    asked = row.asked if len(row.asked) <= 44 else row.asked[:43] + "…"
    share = f"{row.window / CONTEXT_WINDOW:.0%}"
    events = row.events or ["verbatim"]
    print(COLUMNS.format(row.turn, asked, f"{row.window:,}", share, row.evicted, events[0]))
    for event in events[1:]:
        print(COLUMNS.format("", "", "", "", "", event))


def run_demo(turns: int = len(SCRIPT)) -> int:
    """Run the scripted session and print it; returns the process exit code."""
    with tempfile.TemporaryDirectory(prefix="memory-proxy-demo-") as directory:
        return asyncio.run(Demo(Path(directory)).run(max(1, turns)))
