"""What a Messages API turn costs the proxy next to a chat completions turn.

A full-history client (as Claude Code is) resends a growing tool-using conversation every
turn, through each surface, against the instant fake upstream on loopback; the proxy runs
in this process (``httpx.ASGITransport``), so the time per turn is the proxy's own work
plus the fake's answer over loopback, the same for both surfaces.

    python bench/messages_turn.py [--turns 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_messages import FakeMessages

TOOL_OUTPUT = "line of tool output " * 40
TOOLS_MESSAGES = [{"name": f"tool_{i}", "description": "does a thing " * 10,
                   "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}
                  for i in range(20)]
TOOLS_CHAT = [{"type": "function", "function": {"name": t["name"], "description":
               t["description"], "parameters": t["input_schema"]}} for t in TOOLS_MESSAGES]


def messages_history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out += [
            {"role": "user", "content": f"step {n}: look at file {n}"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": f"reasoning {n} " * 20, "signature": f"s{n}"},
                {"type": "tool_use", "id": f"toolu_{n}", "name": "tool_1",
                 "input": {"x": str(n)}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                          "content": TOOL_OUTPUT}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"done {n}"}]},
        ]
    return out


def chat_history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out += [
            {"role": "user", "content": f"step {n}: look at file {n}"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{n}", "type": "function",
                "function": {"name": "tool_1", "arguments": f'{{"x":"{n}"}}'}}]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": TOOL_OUTPUT},
            {"role": "assistant", "content": f"done {n}"},
        ]
    return out


async def run(surface: str, turns: int, fake: FakeMessages, tmp: str) -> list[float]:
    app = create_app(Settings(store_url=f"sqlite:///{tmp}/{surface}.db", upstream_url=fake.url,
                              anthropic_url=fake.base_url, agents_dir=Path(tmp)))
    times = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for n in range(1, turns + 1):
                if surface == "messages":
                    path, body = "/agents/bench/sessions/m/v1/messages", {
                        "model": "claude-sonnet-4-5", "max_tokens": 100, "tools": TOOLS_MESSAGES,
                        "system": "You are a coding agent.",
                        "messages": [*messages_history(n - 1),
                                     {"role": "user", "content": f"step {n}"}]}
                else:
                    path, body = "/agents/bench/sessions/c/v1/chat/completions", {
                        "model": "gpt-4o", "tools": TOOLS_CHAT, "messages": [
                            {"role": "system", "content": "You are a coding agent."},
                            *chat_history(n - 1), {"role": "user", "content": f"step {n}"}]}
                started = time.perf_counter()
                response = await client.post(path, json=body, headers={"x-api-key": "k",
                                                                       "authorization": "Bearer k"})
                times.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    args = parser.parse_args()
    with FakeMessages() as fake, tempfile.TemporaryDirectory() as tmp:
        for surface in ("chat", "messages", "chat", "messages"):
            times = asyncio.run(run(surface, args.turns, fake, tmp))
            late = times[len(times) // 2:]
            print(f"{surface:9s} turns={args.turns} median={statistics.median(times) * 1000:.2f} ms"
                  f" median(second half)={statistics.median(late) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
