"""autoSummarize end to end: a delta client (the openai SDK) -> the proxy -> the recording
fake upstream, on summarizing_window's 4,000-token test agent
(test_summarizing_window_end_to_end.py): old ranges are summarized once, in bounded steps,
each building on the summary before it, after the turn and never failing or delaying one.
"""

from __future__ import annotations

import threading

import pytest
from e2e import CLIENT_KEY, wait_for, write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    agent_requests,
    modified,
    scripted,
    sized,
    summarizer_requests,
)
from test_summarizing_window_end_to_end import SYSTEM, WINDOW

from proxy.background import summarizer
from proxy.background.summarizer import run_plan
from proxy.testing.fake_upstream import Reply
from strategies.base import SummarizePlan
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.validity import check_openai_messages

# --- autoSummarize -------------------------------------------------------------------------


def summarizing_agent(agents_dir, name: str, **config) -> None:
    llm = {"model": MODEL, "contextWindow": WINDOW}
    if "summarizerModel" in config:
        llm["summarizerModel"] = config.pop("summarizerModel")
    write_agent(agents_dir, name, llm=llm,
                memoryConfig={"kind": "summarizing_window", "autoSummarize": True, **config})


def chat_until_summarized(proxy, session: DeltaSession, start: int, *, summaries: int) -> int:
    """Talk in 300-token turns until ``summaries`` summarizer calls were made; the turn
    number reached."""
    turn = start
    while len(summarizer_requests(session.fake)) < summaries:
        turn += 1
        assert turn < start + 40, "no summary was asked for"
        session.say(sized(f"U{turn} please remember item {turn}", 300))
        proxy.drain()
    return turn


def transcript_seqs(request) -> list[int]:
    text = request.body["messages"][1]["content"]
    transcript = text.split("## Transcript", 1)[1]
    return [int(line[1:].split("]", 1)[0]) for line in transcript.splitlines()
            if line.startswith("[") and "]" in line and line[1:].split("]", 1)[0].isdigit()]


@pytest.mark.parametrize("placement", ["SYSTEM_PROMPT", "USER_MESSAGE"])
def test_auto_summarize_summarizes_old_ranges_once_and_builds_on_the_previous_summary(
    make_proxy, fake, agents_dir, placement
):
    summarizing_agent(agents_dir, "memo", summaryPlacement=placement)
    model = scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("memo", "s"), fake, system=SYSTEM)
    turn = chat_until_summarized(proxy, session, 0, summaries=1)
    # no summary was due before: the live window first passed 0.75 x 4,000 on this turn
    before, now = (int(s.headers["x-memory-window-tokens"]) for s in session.sent[-2:])
    assert before + 20 <= 3000 < now + 20

    [call] = summarizer_requests(fake)
    assert call.body["model"] == MODEL
    assert call.body["max_tokens"] == 600  # a summary may take 15% of a small window
    assert call.body["messages"][0]["content"].startswith(SUMMARY_SYSTEM_PROMPT)
    assert "Previous summary" not in call.body["messages"][1]["content"]
    [first] = proxy.snapshot("memo", "s").summaries
    assert (first.kind, first.from_seq) == ("summary", 1)
    assert first.text == model.summary_texts[0]
    assert transcript_seqs(call) == list(range(1, first.to_seq + 1))
    assert first.to_seq % 2 == 0  # a whole turn: the cut lands before a user message

    # the next turn carries the summary in place of what it covers
    sent = session.say("what do you remember?")
    body = sent.messages
    assert check_openai_messages(body) == []
    assert modified(sent.headers)
    if placement == "SYSTEM_PROMPT":
        system = body[0]["content"]
        assert system.startswith(SYSTEM)
        assert "## Earlier conversation" in system and first.text in system
        assert body[1]["role"] == "user" and first.text not in body[1]["content"]
    else:
        assert body[0] == {"role": "system", "content": SYSTEM}
        assert body[1]["role"] == "user"
        assert body[1]["content"].startswith("This session is being continued")
        assert first.text in body[1]["content"]
    covered = {f"U{n} please" for n in range(1, first.to_seq // 2 + 1)}
    assert not any(str(m["content"]).startswith(tuple(covered)) for m in body[1:])

    # the conversation grows again: a second summary builds on the first
    chat_until_summarized(proxy, session, turn + 1, summaries=2)
    second_call = summarizer_requests(fake)[1]
    prompt = second_call.body["messages"][1]["content"]
    assert f"## Previous summary (messages 1-{first.to_seq})" in prompt
    assert first.text in prompt
    first_record, second = proxy.snapshot("memo", "s").summaries
    assert first_record == first
    assert second.from_seq == 1 and second.to_seq > first.to_seq
    # no range is summarized twice: the new transcript starts right after the first
    assert transcript_seqs(second_call) == list(range(first.to_seq + 1, second.to_seq + 1))

    sent = session.say("and now?")
    text = str(sent.messages[0]["content"]) + str(sent.messages[1]["content"])
    assert second.text in text and first.text not in text


def test_the_summarizer_model_is_the_one_the_definition_names(make_proxy, fake, agents_dir):
    summarizing_agent(agents_dir, "cheap", summarizerModel="gpt-4o-mini")
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("cheap", "s"), fake)
    chat_until_summarized(proxy, session, 0, summaries=1)
    [call] = summarizer_requests(fake)
    assert call.body["model"] == "gpt-4o-mini"
    assert all(r.body["model"] == MODEL for r in agent_requests(fake))
    assert proxy.snapshot("cheap", "s").summaries[0].model == "gpt-4o-mini"


def test_auto_summarize_stays_off_unless_configured(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "plain", llm={"model": MODEL, "contextWindow": WINDOW})
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("plain", "s"), fake)
    for turn in range(1, 12):
        session.say(sized(f"U{turn} item", 300))
    proxy.drain()
    assert summarizer_requests(fake) == []
    assert proxy.snapshot("plain", "s").summaries == []
    assert modified(session.sent[-1].headers)  # trimmed instead


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_slow_summarization_delays_no_turn_and_loses_no_message(
    make_proxy, fake, agents_dir, stream
):
    summarizing_agent(agents_dir, "slow")
    model = scripted(fake)
    # the summary is held until the test releases it: a turn that waited for it would
    # never be answered (the client would time out)
    written = threading.Event()
    model.summaries.append(Reply.text("SLOW SUMMARY of the early turns", until=written))
    proxy = make_proxy()
    session = DeltaSession(proxy.client("slow", "s"), fake, stream=stream)
    turn = 0
    while not summarizer_requests(fake):
        turn += 1
        assert turn < 20
        session.say(sized(f"U{turn} item", 300))  # delivered before the summary exists
        # let a summary planned after this turn reach the fake
        wait_for(lambda: summarizer_requests(fake), timeout=0.05, fail=False)
    assert proxy.snapshot("slow", "s").summaries == []
    # turns keep arriving while the summarizer is still writing
    for extra in range(3):
        sent = session.say(f"meanwhile {extra}")
        assert sent.text == f"noted (meanwhile {extra})"
        assert check_openai_messages(sent.messages) == []
    assert proxy.snapshot("slow", "s").summaries == []
    written.set()
    proxy.drain()

    [record] = proxy.snapshot("slow", "s").summaries
    assert record.text == "SLOW SUMMARY of the early turns"
    stored = proxy.stored("slow", "s")
    # every message is stored, the ones sent during the summarization included
    assert [m.content for m in stored if m.role == "user"][-3:] == [
        "meanwhile 0", "meanwhile 1", "meanwhile 2"]
    assert len(stored) == 2 * (turn + 3)
    assert record.to_seq < stored[-6].seq  # the summary covers only what it was given
    sent = session.say("after the summary")
    assert "SLOW SUMMARY" in sent.messages[0]["content"]
    assert [m["content"] for m in sent.messages if m["role"] == "user"][-4:] == [
        "meanwhile 0", "meanwhile 1", "meanwhile 2", "after the summary"]


def test_a_failing_summarizer_never_fails_the_request(make_proxy, fake, agents_dir):
    summarizing_agent(agents_dir, "flaky")
    model = scripted(fake)
    model.summaries.append(Reply.error(500))
    proxy = make_proxy()
    session = DeltaSession(proxy.client("flaky", "s"), fake)
    turn = chat_until_summarized(proxy, session, 0, summaries=1)
    assert proxy.snapshot("flaky", "s").summaries == []
    # the next turn is answered (trimming keeps its window valid) and the summary is
    # asked for again
    sent = session.say(sized(f"U{turn + 1} item", 300))
    assert sent.text.startswith(f"noted (U{turn + 1} item")
    assert check_openai_messages(sent.messages) == []
    proxy.drain()
    assert len(summarizer_requests(fake)) == 2
    [record] = proxy.snapshot("flaky", "s").summaries
    assert record.text == model.summary_texts[0]
    assert len(proxy.stored("flaky", "s")) == 2 * (turn + 1)


def test_a_short_page_never_lets_a_summary_cover_messages_it_did_not_read(
    make_proxy, fake, agents_dir
):
    # six messages a page: small turns first, so the page has moved past message 1 when
    # the first summary is due; it must still be written from message 1 on
    summarizing_agent(agents_dir, "short", maxHistoryFetch=6, autoSummarizeRatio=0.3)
    scripted(fake)
    proxy = make_proxy(summarizer_cached_prefix=False)  # the transcript shows the seqs read
    session = DeltaSession(proxy.client("short", "s"), fake)
    for turn in range(5):
        session.say(f"small {turn}")
    chat_until_summarized(proxy, session, 10, summaries=1)
    [first] = proxy.snapshot("short", "s").summaries
    assert first.from_seq == 1
    calls = len(summarizer_requests(fake))  # one, or more for a range taking chunks
    seen = [s for r in summarizer_requests(fake) for s in transcript_seqs(r)]
    assert seen == list(range(1, first.to_seq + 1))
    # the page moves on past the first summary's end: the second one reads the gap
    for turn in range(40, 46):
        session.say(f"filler {turn}")
    proxy.drain()
    chat_until_summarized(proxy, session, 50, summaries=calls + 1)
    second = proxy.snapshot("short", "s").summaries[-1]
    seen = [s for r in summarizer_requests(fake)[calls:] for s in transcript_seqs(r)]
    assert seen == list(range(first.to_seq + 1, second.to_seq + 1))


def test_a_plan_overtaken_by_a_newer_summary_builds_on_it(make_proxy, fake, agents_dir):
    """A plan made before another run stored its summary (a turn's after-turn work racing
    the previous one) is rebased under the lock: nothing is summarized twice."""
    summarizing_agent(agents_dir, "raced")
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("raced", "s"), fake)
    turn = chat_until_summarized(proxy, session, 0, summaries=1)
    for n in range(turn + 1, turn + 4):
        session.say(f"short {n}")
    proxy.drain()
    [first] = proxy.snapshot("raced", "s").summaries
    stored = proxy.stored("raced", "s")
    key = proxy.key("raced", "s")
    agent = proxy.services.agents.resolve("raced")

    def run(to_seq: int):
        plan = SummarizePlan(kind="summary", from_seq=1, to_seq=to_seq,
                             messages=[m for m in stored if m.seq <= to_seq], reason="test")
        return proxy.call(run_plan(proxy.services, key, agent, MODEL, plan,
                                   headers={"authorization": f"Bearer {CLIENT_KEY}"},
                                   context_window=WINDOW, expect_boundary=None))

    # everything the stale plan covers is summarized already: no call, no record
    assert run(first.to_seq) is None
    assert len(summarizer_requests(fake)) == 1
    # it reaches further: only the rest is summarized, on top of the stored summary
    record = run(stored[-3].seq)
    assert (record.from_seq, record.to_seq) == (1, stored[-3].seq)
    call = summarizer_requests(fake)[-1]
    assert f"## Previous summary (messages 1-{first.to_seq})" in call.body["messages"][1]["content"]
    assert transcript_seqs(call) == list(range(first.to_seq + 1, stored[-3].seq + 1))


def test_a_long_unsummarized_stretch_is_summarized_in_bounded_steps(
    make_proxy, fake, agents_dir, monkeypatch
):
    monkeypatch.setattr(summarizer, "MAX_PLAN_MESSAGES", 5)
    summarizing_agent(agents_dir, "steps")
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("steps", "s"), fake)
    turn = chat_until_summarized(proxy, session, 0, summaries=3)
    records = proxy.snapshot("steps", "s").summaries
    # each step reads at most five messages, stops before a user message and builds on
    # the record before it
    assert [(r.from_seq, r.to_seq) for r in records[:3]] == [(1, 4), (1, 8), (1, 12)]
    assert [transcript_seqs(c) for c in summarizer_requests(fake)[:3]] == [
        [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert len(proxy.stored("steps", "s")) == 2 * turn
