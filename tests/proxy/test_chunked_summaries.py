"""A summary or compaction too long for one summarizer call is written in chunks, each
call building on the summary of the one before: every message it folds reaches a call."""

from __future__ import annotations

import httpx
from e2e import ADMIN_TOKEN, write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    scripted,
    sized,
    summarizer_requests,
)

from proxy.testing.fake_upstream import Reply
from strategies.tokens import count_message

WINDOW = 4000
INPUT_LIMIT = 0.6 * WINDOW


def transcript_seqs(request) -> list[int]:
    text = request.body["messages"][1]["content"]
    transcript = text.split("## Transcript", 1)[1]
    return [int(line[1:].split("]", 1)[0]) for line in transcript.splitlines()
            if line.startswith("[") and "]" in line and line[1:].split("]", 1)[0].isdigit()]


def input_tokens(request) -> int:
    return sum(count_message(m, MODEL) for m in request.body["messages"])


def compact(proxy, agent: str, session: str) -> httpx.Response:
    return httpx.post(f"{proxy.base}/admin/api/agents/{agent}/sessions/{session}/compact",
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=20)


def long_session(proxy, fake, agent: str, turns: int) -> DeltaSession:
    session = DeltaSession(proxy.client(agent, "s"), fake)
    for turn in range(turns):
        session.say(sized(f"U{turn} remember item {turn}", 300))
    return session


def test_every_message_an_automatic_compaction_folds_reaches_a_summarizer_call(
    make_proxy, fake, agents_dir
):
    # compaction at 0.8 x the window, the summarizer's input held to 0.6 x
    write_agent(agents_dir, "compact", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig={"kind": "auto_compact"})
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("compact", "s"), fake)
    turn = 0
    while not summarizer_requests(fake):
        session.say(sized(f"U{turn} remember item {turn}", 300))
        proxy.drain()
        turn += 1
        assert turn < 30, "no compaction"
    [record] = proxy.snapshot("compact", "s").summaries
    calls = summarizer_requests(fake)
    assert len(calls) >= 2
    seen = [seq for call in calls for seq in transcript_seqs(call)]
    assert seen == list(range(record.from_seq, record.to_seq + 1))
    assert all(input_tokens(call) <= INPUT_LIMIT for call in calls)
    assert all("omitted to fit" not in call.body["messages"][1]["content"] for call in calls)
    # each call after the first builds on the summary the one before wrote
    assert "## Previous summary" not in calls[0].body["messages"][1]["content"]
    for number, call in enumerate(calls[1:], start=1):
        assert f"SUMMARY-{number}:" in call.body["messages"][1]["content"]
    # the window restarts from the compaction, which holds the last call's summary
    session.say("and now?")
    sent = session.sent[-1].messages
    assert f"SUMMARY-{len(calls)}" in sent[0]["content"] + str(sent[1]["content"])


def test_a_compact_action_over_a_long_history_is_summarized_in_chunks(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "memo", llm={"model": MODEL, "contextWindow": WINDOW})
    scripted(fake)
    proxy = make_proxy()
    long_session(proxy, fake, "memo", 30)
    response = compact(proxy, "memo", "s")
    assert response.status_code == 200, response.text
    [record] = proxy.snapshot("memo", "s").summaries
    assert record.to_seq == 58  # everything before the current turn
    calls = summarizer_requests(fake)
    assert len(calls) >= 4
    assert [s for call in calls for s in transcript_seqs(call)] == list(range(1, 59))
    assert all(input_tokens(call) <= INPUT_LIMIT for call in calls)


def test_a_chunked_summary_stops_where_the_call_budget_ends_and_covers_only_what_was_read(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "memo", llm={"model": MODEL, "contextWindow": WINDOW})
    scripted(fake)
    proxy = make_proxy(summarizer_calls_per_hour=2)
    long_session(proxy, fake, "memo", 30)
    assert compact(proxy, "memo", "s").status_code == 200
    [record] = proxy.snapshot("memo", "s").summaries
    calls = summarizer_requests(fake)
    assert len(calls) == 2
    seen = [s for call in calls for s in transcript_seqs(call)]
    # the record covers exactly what the two calls read; the rest stays unsummarized
    assert seen == list(range(1, record.to_seq + 1))
    assert record.to_seq < 58
    # the budget is spent: a further Compact is refused, nothing else written
    assert compact(proxy, "memo", "s").status_code == 409
    assert len(proxy.snapshot("memo", "s").summaries) == 1


def test_a_chunk_that_fails_after_the_first_keeps_the_summary_of_what_was_read(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "memo", llm={"model": MODEL, "contextWindow": WINDOW})
    model = scripted(fake)
    model.summaries.extend([Reply.text("PART ONE: items 0 to 6."), Reply.error(500)])
    proxy = make_proxy()
    long_session(proxy, fake, "memo", 30)
    assert compact(proxy, "memo", "s").status_code == 200
    [record] = proxy.snapshot("memo", "s").summaries
    first, failed = summarizer_requests(fake)
    assert record.text == "PART ONE: items 0 to 6."
    assert record.to_seq == transcript_seqs(first)[-1] < transcript_seqs(failed)[0]
