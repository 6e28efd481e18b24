"""CPU per turn of the Responses surface beside chat completions, in process.

    python bench/responses_micro.py [--turns 300]

The app runs in this process (``create_app`` with its lifespan, requests through
``httpx.ASGITransport``) against ``FakeResponsesUpstream`` on loopback (its own thread).
Each case runs one session of ``--turns`` sequential turns, each a short user message
with the whole session as memory (summarizing_window's defaults), and reports the CPU
time per turn of the thread that runs the client and the proxy (the fake has its own) and
the wall time per turn:

- chat: ``POST /v1/chat/completions``, a delta client (path session);
- responses: ``POST /v1/responses`` chained by ``previous_response_id``, to the fake's
  Responses API (reasoning items kept and sent back);
- responses-to-chat: the same, ``MEMORY_PROXY_RESPONSES_API=chat`` (translated).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import _paths  # noqa: F401
import httpx

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_responses import FakeResponsesUpstream

HEADERS = {"authorization": "Bearer sk-bench"}


async def run_case(case: str, fake: FakeResponsesUpstream, turns: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(store_url=f"sqlite:///{tmp}/m.db", upstream_url=fake.url,
                            agents_dir=Path(tmp),
                            responses_api="chat" if case == "responses-to-chat" else "auto")
        app = create_app(settings)
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://proxy", headers=HEADERS, timeout=60
        ) as client:
            path = f"/agents/bench/sessions/{case}/v1"
            previous: str | None = None
            cpu, wall = time.thread_time(), time.perf_counter()
            for turn in range(turns):
                text = f"Turn {turn}: tell me one more thing about the plan."
                if case == "chat":
                    body: dict[str, Any] = {"model": "gpt-4o", "messages": [
                        {"role": "user", "content": text}]}
                    response = await client.post(f"{path}/chat/completions", json=body)
                else:
                    body = {"model": "gpt-4o", "input": text}
                    if previous:
                        body["previous_response_id"] = previous
                    response = await client.post(f"{path}/responses", json=body)
                    previous = response.json()["id"]
                response.raise_for_status()
            return ((time.thread_time() - cpu) / turns * 1000,
                    (time.perf_counter() - wall) / turns * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    with FakeResponsesUpstream(reasoning=True) as fake:
        for case in ("chat", "responses", "responses-to-chat"):
            cpu, wall = asyncio.run(run_case(case, fake, args.turns))
            print(f"{case:18} {cpu:6.2f} ms CPU/turn  {wall:6.2f} ms wall/turn")


if __name__ == "__main__":
    main()
