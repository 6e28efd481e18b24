"""A compaction or summarization that runs while turns arrive loses none of them.

Delta writers keep sending turns to one session of an agent whose small context window
makes it compact (auto_compact) or summarize (summarizing_window) again and again, while
the summarizer answers slowly. Afterwards: every acknowledged message is stored once,
active, beside its reply; each summary covers exactly the messages its summarizer call
was shown; and (auto_compact) the next turn sends every message after the latest
compaction verbatim, the rest through the summary.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import CLIENT_KEY, RunningProxy, write_agent
from reliability_support import report, scaled

from proxy.testing.fake_upstream import FakeUpstream, Reply, echo_reply
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT

WRITERS = 8
TURNS_PER_WRITER = scaled(6, 25)
FILLER = " lorem" * 60
TRANSCRIPT = re.compile(r"## Transcript \(messages (\d+)-(\d+)\)")
TAG = re.compile(r"\bw\d+-t\d+\b")
OMITTED = re.compile(r"\[… (\d+) messages omitted")


def is_summarizer_call(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and str(messages[0].get("content", "")).startswith(
        SUMMARY_SYSTEM_PROMPT[:80])


class SlowSummarizer:
    """Answers turns at once and summarizer calls slowly, each with a numbered summary."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not is_summarizer_call(body):
            return echo_reply(body)
        with self.lock:
            self.calls.append(body)
            number = len(self.calls)
        return Reply.text(f"SUMMARY-{number} of earlier work", first_token_delay=0.4)


@pytest.fixture
def summarizer() -> SlowSummarizer:
    return SlowSummarizer()


@pytest.fixture
def fake(fake_upstream: FakeUpstream, summarizer: SlowSummarizer) -> FakeUpstream:
    fake_upstream.reset(default_reply=summarizer)
    return fake_upstream


def write(base: str, writer: int) -> None:
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client:
        for turn in range(TURNS_PER_WRITER):
            response = client.post(f"{base}/chat/completions", json={
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": f"w{writer}-t{turn}{FILLER}"}]})
            assert response.status_code == 200, response.text


def tags(text: Any) -> set[str]:
    return set(TAG.findall(str(text)))


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["auto_compact", "summarizing_window"])
@pytest.mark.parametrize("wait", [0.0, 15.0], ids=["turns-go-ahead", "turns-wait"])
def test_turns_arriving_during_compaction_are_all_kept(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, summarizer: SlowSummarizer,
    agents_dir: Path, kind: str, wait: float,
) -> None:
    config: dict[str, Any] = {"kind": kind}
    if kind == "auto_compact":
        config["compactAtRatio"] = 0.5
    else:
        config.update(autoSummarize=True, autoSummarizeRatio=0.5)
    write_agent(agents_dir, "compactor", llm={"model": "gpt-4o", "contextWindow": 3000},
                memoryConfig=config)
    # the transcript call: the checks below read the seqs each call was shown
    proxy = make_proxy(compaction_wait_seconds=wait, summarizer_calls_per_hour=1000,
                       summarizer_cached_prefix=False)
    base = proxy.url("compactor", "busy")
    started = time.monotonic()
    writers = [threading.Thread(target=write, args=(base, w)) for w in range(WRITERS)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(120)
    proxy.drain()

    # the store: every message once, active, beside its reply
    messages = proxy.stored("compactor", "busy")
    expected = {f"w{w}-t{t}" for w in range(WRITERS) for t in range(TURNS_PER_WRITER)}
    users = [m for m in messages if m.role == "user"]
    assert sorted(TAG.search(m.content).group() for m in users) == sorted(expected)
    for user, reply in zip(messages[::2], messages[1::2], strict=True):
        assert reply.role == "assistant" and reply.content.startswith(
            "ok: " + TAG.search(user.content).group())

    # each summary covers exactly what its summarizer call was shown
    summaries = proxy.snapshot("compactor", "busy").summaries
    assert summaries, "the load was meant to trigger summaries"
    by_seq = {m.seq: m for m in messages}
    for record in summaries:
        number = int(re.match(r"SUMMARY-(\d+)", record.text).group(1))
        shown = summarizer.calls[number - 1]["messages"][1]["content"]
        low, high = map(int, TRANSCRIPT.search(shown).groups())
        assert record.from_seq <= low and record.to_seq == high
        # every message the record folds was in the input of some call over its range (a
        # long range is summarized in chunks, each building on the summary before), and no
        # call's input left a message out
        seen: set[str] = set()
        for call in summarizer.calls:
            text = call["messages"][1]["content"]
            assert not OMITTED.search(text)
            first, last = map(int, TRANSCRIPT.search(text).groups())
            if record.from_seq <= first and last <= record.to_seq:
                seen |= tags(text)
        covered = {TAG.search(by_seq[s].content).group()
                   for s in range(record.from_seq, high + 1)
                   if s in by_seq and by_seq[s].role == "user"}
        assert covered <= seen

    if kind == "auto_compact":
        # once compaction has caught up (a turn or two later), the model gets every
        # message after the latest compaction verbatim and the rest through its summary
        for _ in range(3):
            proxy.client("compactor", "busy").chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "where were we?"}])
            proxy.drain()
        proxy.client("compactor", "busy").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "where were we?"}])
        sent = fake.chat_requests[-1].body["messages"]
        summaries = proxy.snapshot("compactor", "busy").summaries
        compaction = max((s for s in summaries if s.kind == "compaction"), key=lambda s: s.id)
        live = {TAG.search(m.content).group() for m in users if m.seq > compaction.to_seq}
        assert live <= tags([m.get("content") for m in sent])
        assert any(compaction.text in str(m.get("content")) for m in sent)
    report("compaction under load", kind=kind, turns_wait_seconds=wait,
           turns=len(expected), summaries=len(summaries),
           summarizer_calls=len(summarizer.calls),
           seconds=round(time.monotonic() - started, 1))
