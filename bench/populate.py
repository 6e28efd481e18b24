"""Stored histories for the benchmark, written straight through the Store API.

Driving thousands of turns through the proxy to build a 10,000-message session would take
minutes; ``append_turn`` with precomputed tokens and fingerprints takes a second. The
sessions are keyed exactly as the proxy keys the benchmark client's requests (same API
key namespace, agent and session ids), so the proxy finds them.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any, Literal

from proxy.turn.history_sync import fingerprint
from proxy.turn.identity import namespace_for
from storage.registry import open_store
from strategies.records import SessionKey, StoredMessage, TurnWrite
from strategies.tokens import count_message

MODEL = "gpt-4o-mini"
API_KEY = "sk-bench-5f1c0a9e2b7d4c6a8e3f1b0d9c7a5e4f"  # also LiteLLM's master key
DEFAULT_AGENT = "bench"  # no definition: the default strategy (summarizing_window)
WINDOWED_AGENT = "bench-window100"  # windowed, windowSize 100
BATCH = 500

USER_TEXT = (
    "Here is the next part of the report, turn {i}: the numbers for the third quarter came "
    "in a little below plan, mostly because shipping costs rose again."
)
ASSISTANT_TEXT = (
    "Thanks, noted for turn {i}. Shipping costs were already the main driver last quarter, "
    "so the gap to plan is consistent with the trend. I would split the variance into "
    "volume and rate effects, check whether the new carrier contract started on time, and "
    "compare against the same quarter last year before revising the forecast. Do you want "
    "me to draft that breakdown now, or wait for the regional figures?"
)


def write_agents(directory: Path) -> Path:
    """The benchmark's agent definitions; the default agent has none (defaults apply)."""
    directory.mkdir(parents=True, exist_ok=True)
    definition = {
        "name": WINDOWED_AGENT,
        "llm": {"model": MODEL, "contextWindow": 128000},
        "memoryConfig": {"kind": "windowed", "windowSize": 100},
        "historyMode": "delta",
    }
    (directory / f"{WINDOWED_AGENT}.json").write_text(json.dumps(definition))
    return directory


def session_key(agent: str, session: str) -> SessionKey:
    return SessionKey(namespace_for(API_KEY), agent, session)


@functools.cache
def _tokens(role: str) -> int:
    # the texts of one role differ only in the turn number: count one of each once
    text = (USER_TEXT if role == "user" else ASSISTANT_TEXT).format(i=0)
    return count_message({"role": role, "content": text}, MODEL)


def history(count: int, start: int = 0) -> list[StoredMessage]:
    """``count`` alternating user/assistant messages (user first), distinct texts."""
    out = []
    for index in range(start, start + count):
        role: Literal["user", "assistant"] = "user" if index % 2 == 0 else "assistant"
        text = (USER_TEXT if role == "user" else ASSISTANT_TEXT).format(i=index // 2)
        message: dict[str, Any] = {"role": role, "content": text}
        out.append(StoredMessage(
            role=role, content=text, tokens=_tokens(role),
            fingerprint=fingerprint(message), created_at=1_700_000_000.0 + index,
        ))
    return out


async def populate(
    store_url: str, agent: str, sessions: list[str], messages: int, *, parallel: int = 16
) -> None:
    """Give each of ``sessions`` ``messages`` stored messages (in batches of 500),
    ``parallel`` sessions at a time."""
    store = open_store(store_url)
    await store.open()

    async def fill(session: str) -> None:
        key = session_key(agent, session)
        for start in range(0, messages, BATCH):
            batch = history(min(BATCH, messages - start), start)
            await store.append_turn(key, TurnWrite(messages=batch, model=MODEL))

    try:
        for index in range(0, len(sessions), parallel):
            await asyncio.gather(*(fill(s) for s in sessions[index : index + parallel]))
    finally:
        await store.close()


def session_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]
