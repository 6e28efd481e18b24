"""auto_compact through the real proxy: compaction after the response, the restarted
window, placement, the safety trim, eviction on the wire and the Compact button."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import httpx
import pytest
from e2e import ADMIN_TOKEN, wait_for, write_agent

from proxy.testing.fake_upstream import FakeUpstream, Reply
from strategies.summary_prompt import is_summarizer_request
from strategies.tokens import count_message
from strategies.validity import check_openai_messages

CONTEXT_WINDOW = 2000
SYSTEM = {"role": "system", "content": "You are a patient assistant."}
BUNDLED = Path(__file__).resolve().parents[2] / "agent-definitions"


@pytest.fixture
def make_proxy(make_proxy):
    """The summarizer's transcript call, whose input these tests read (the call on the
    session's cached prefix: tests/proxy/test_prompt_cache_end_to_end.py)."""
    return functools.partial(make_proxy, summarizer_cached_prefix=False)


def is_summarizer(body: dict) -> bool:
    return is_summarizer_request(body)


def prompt_tokens(body: dict) -> int:
    """What the window really weighs (the fake reports it, so calibration stays at 1)."""
    return sum(count_message(m, "gpt-4o") for m in body.get("messages") or [])


class Model:
    """The fake's default reply: short answers to the agent, numbered summaries (held
    until ``gate`` is set when ``held``, or a 500 when ``fail``) to the summarizer."""

    def __init__(self, fake: FakeUpstream, *, held: bool = False, fail: bool = False) -> None:
        self.fail, self.summaries = fail, 0
        self.gate = threading.Event()
        if not held:
            self.gate.set()
        fake.default_reply = self
        fake.count_tokens = prompt_tokens

    def __call__(self, body: dict) -> Reply:
        if not is_summarizer(body):
            return Reply.text("Noted.")
        self.summaries += 1
        if self.fail:
            return Reply.error(500)
        return Reply.text(f"SUMMARY {self.summaries}: the user sent numbered turns of alpha.",
                          until=self.gate)


def summarizer_calls(fake: FakeUpstream) -> list[dict]:
    return [r.body for r in fake.chat_requests if is_summarizer(r.body)]


def fresh_runs(fake: FakeUpstream) -> int:
    """Compactions started from nothing: one call each without a previous summary (a
    compaction too long for one call goes on in calls that build on the one before)."""
    return sum("## Previous summary" not in b["messages"][1]["content"]
               for b in summarizer_calls(fake))


def transcripts(calls: list[dict]) -> str:
    return "\n".join(b["messages"][1]["content"].split("## Transcript", 1)[1] for b in calls)


def agent_calls(fake: FakeUpstream) -> list[dict]:
    return [r.body for r in fake.chat_requests if not is_summarizer(r.body)]


def turn_text(n: int) -> str:
    return f"turn {n}: " + "alpha " * 250


def send(client, n: int, *, stream: bool = False):
    """One delta turn; returns the response headers."""
    messages = [SYSTEM, {"role": "user", "content": turn_text(n)}]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, stream=stream)
    parsed = raw.parse()
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
    return raw.headers


def write_compacting_agent(agents_dir, name="compact", **memory):
    write_agent(agents_dir, name, llm={"model": "gpt-4o", "contextWindow": CONTEXT_WINDOW},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5, **memory})


def until_compacted(proxy, client, fake, *, stream=False, start=1, limit=10) -> int:
    """Send turns until one triggers a compaction; returns that turn's number."""
    seen = len(summarizer_calls(fake))
    for n in range(start, start + limit):
        send(client, n, stream=stream)
        proxy.drain()
        if len(summarizer_calls(fake)) > seen:
            return n
    raise AssertionError("no compaction")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_an_overflowing_turn_is_compacted_and_the_window_restarts_from_the_summary(
    make_proxy, fake, agents_dir, stream
):
    Model(fake)
    write_compacting_agent(agents_dir)
    proxy = make_proxy()
    client = proxy.client("compact", "s1")
    last = until_compacted(proxy, client, fake, stream=stream)
    assert last >= 3  # verbatim until the window crossed 50% of 2000 tokens
    before, overflowing = agent_calls(fake)[-2:]
    # the window after a turn (its prompt and the short reply) is what crosses the ratio
    assert prompt_tokens(before) < CONTEXT_WINDOW * 0.5 < prompt_tokens(overflowing) + 10
    for body in agent_calls(fake):
        assert [m["content"] for m in body["messages"][1:] if m["role"] == "user"] == [
            turn_text(n) for n in range(1, len(body["messages"]) // 2 + 1)]

    # four turns of 255 tokens do not fit one call's input (0.6 x 2,000 tokens): two
    # calls, the second building on the first's summary
    calls = summarizer_calls(fake)
    assert len(calls) == 2 and fresh_runs(fake) == 1
    assert "(messages 1-" in calls[0]["messages"][1]["content"]
    assert "SUMMARY 1" in calls[1]["messages"][1]["content"]
    transcript = transcripts(calls)
    assert all(transcript.count(f"USER: turn {n}:") == 1 for n in range(1, last + 1))
    for call in calls:
        assert sum(count_message(m, "gpt-4o") for m in call["messages"]) <= 0.6 * CONTEXT_WINDOW

    snapshot = proxy.snapshot("compact", "s1")
    [record] = snapshot.summaries
    assert (record.kind, record.from_seq, record.to_seq) == ("compaction", 1, 2 * last)
    assert snapshot.meta.boundary_seq == 2 * last
    assert len(proxy.stored("compact", "s1")) == 2 * last  # a boundary, not a deletion

    headers = send(client, last + 1, stream=stream)
    sent = agent_calls(fake)[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "user"]
    assert sent[1]["content"].startswith("This session is being continued")
    assert "SUMMARY 2" in sent[1]["content"]
    assert sent[2]["content"] == turn_text(last + 1)
    assert headers["x-memory-context-modified"] == "true"
    assert int(headers["x-memory-window-tokens"]) < CONTEXT_WINDOW * 0.5
    proxy.drain()
    assert len(summarizer_calls(fake)) == 2  # one overflow, one compaction


def test_the_summary_lands_in_the_system_prompt_when_configured(make_proxy, fake, agents_dir):
    Model(fake)
    write_compacting_agent(agents_dir, summaryPlacement="SYSTEM_PROMPT")
    proxy = make_proxy()
    client = proxy.client("compact", "s2")
    last = until_compacted(proxy, client, fake)
    send(client, last + 1)
    sent = agent_calls(fake)[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[0]["content"].startswith(SYSTEM["content"])
    assert "## Earlier conversation" in sent[0]["content"]
    assert f"SUMMARY {len(summarizer_calls(fake))}" in sent[0]["content"]
    # the summarizer was told where its text goes
    assert "Earlier conversation" in summarizer_calls(fake)[0]["messages"][0]["content"]


def test_a_later_compaction_builds_on_the_earlier_one(make_proxy, fake, agents_dir):
    Model(fake)
    write_compacting_agent(agents_dir)
    proxy = make_proxy()
    client = proxy.client("compact", "s3")
    first = until_compacted(proxy, client, fake)
    earlier = len(summarizer_calls(fake))
    second = until_compacted(proxy, client, fake, start=first + 1)
    later = summarizer_calls(fake)[earlier:]
    prompt = later[0]["messages"][1]["content"]
    assert f"## Previous summary (messages 1-{2 * first})" in prompt
    assert f"SUMMARY {earlier}" in prompt
    assert f"## Transcript (messages {2 * first + 1}-" in prompt
    transcript = transcripts(later)
    assert all(transcript.count(f"USER: turn {n}:") == 1 for n in range(first + 1, second + 1))
    # the earlier turns reach it through the summary only
    assert "turn 1:" not in json.dumps(later)

    send(client, second + 1)
    sent = json.dumps(agent_calls(fake)[-1]["messages"])
    latest = earlier + len(later)
    assert f"SUMMARY {latest}" in sent and f"SUMMARY {earlier}:" not in sent
    records = proxy.snapshot("compact", "s3").summaries
    assert [(r.from_seq, r.to_seq) for r in records] == [
        (1, 2 * first), (2 * first + 1, 2 * second)]
    assert len(proxy.stored("compact", "s3")) == 2 * (second + 1)


def test_compaction_never_delays_the_response_and_the_next_turn_waits_for_it(
    make_proxy, fake, agents_dir
):
    model = Model(fake, held=True)
    write_compacting_agent(agents_dir)
    proxy = make_proxy()
    client = proxy.client("compact", "s4")
    for n in range(1, 4):
        send(client, n)
    send(client, 4)  # crosses the ratio: answered while its compaction's call is held
    wait_for(lambda: summarizer_calls(fake))
    assert proxy.snapshot("compact", "s4").summaries == []  # the compaction is under way
    # turn 5 arrives while the compaction runs: it is not sent on until the summary is
    # written, then the window restarts from it
    fifth = threading.Thread(target=send, args=(client, 5))
    fifth.start()
    held_back = not wait_for(lambda: len(agent_calls(fake)) == 5, timeout=0.3, fail=False)
    model.gate.set()
    fifth.join(20)
    assert held_back and not fifth.is_alive()
    sent = agent_calls(fake)[-1]["messages"]
    assert f"SUMMARY {len(summarizer_calls(fake))}" in sent[1]["content"]
    assert sent[-1]["content"] == turn_text(5)
    proxy.drain()
    assert fresh_runs(fake) == 1


def test_a_turn_that_stops_waiting_is_served_safely_and_nothing_is_lost(
    make_proxy, fake, agents_dir
):
    model = Model(fake, held=True)
    write_compacting_agent(agents_dir)
    proxy = make_proxy(compaction_wait_seconds=0.05)
    client = proxy.client("compact", "s5")
    for n in range(1, 5):
        send(client, n)  # turn 4 crosses the ratio
    send(client, 5)  # served while the compaction's call is still held
    sent = agent_calls(fake)[-1]["messages"]
    assert not any("SUMMARY" in str(m["content"]) for m in sent)
    assert check_openai_messages(sent) == []
    assert prompt_tokens({"messages": sent}) <= CONTEXT_WINDOW
    model.gate.set()
    proxy.drain()
    # turn 5 overflowed too, but the running compaction held the lock: one compaction
    assert fresh_runs(fake) == 1
    [record] = proxy.snapshot("compact", "s5").summaries
    assert record.to_seq == 8  # turns 1-4; turn 5 landed after the planned range
    send(client, 6)
    contents = [m["content"] for m in agent_calls(fake)[-1]["messages"]]
    assert f"SUMMARY {len(summarizer_calls(fake))}" in contents[1]
    assert contents[2:] == [turn_text(5), "Noted.", turn_text(6)]
    assert len(proxy.stored("compact", "s5")) == 12


def test_a_failed_compaction_never_lets_the_window_exceed_the_context_window(
    make_proxy, fake, agents_dir
):
    model = Model(fake, fail=True)
    write_compacting_agent(agents_dir)
    proxy = make_proxy()
    client = proxy.client("compact", "s6")
    for n in range(1, 13):
        headers = send(client, n)
        proxy.drain()
        sent = agent_calls(fake)[-1]["messages"]
        assert prompt_tokens({"messages": sent}) <= CONTEXT_WINDOW
        assert int(headers["x-memory-window-tokens"]) <= CONTEXT_WINDOW
        assert check_openai_messages(sent) == []
        assert sent[-1]["content"] == turn_text(n)
    assert model.summaries >= 2  # it kept trying; nothing was written
    snapshot = proxy.snapshot("compact", "s6")
    assert snapshot.summaries == [] and snapshot.meta.boundary_seq == 0
    assert len(snapshot.messages) == 24
    # the oldest turns were left out of the window, newest first kept
    assert turn_text(1) not in json.dumps(agent_calls(fake)[-1]["messages"])


def test_the_compact_button_runs_a_full_compaction(make_proxy, fake, agents_dir):
    Model(fake)
    write_compacting_agent(agents_dir)
    proxy = make_proxy()
    client = proxy.client("compact", "s7")
    send(client, 1)
    send(client, 2)
    proxy.drain()
    assert summarizer_calls(fake) == []  # under the ratio
    url = f"{proxy.base}/admin/api/agents/compact/sessions/s7/compact"
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    response = httpx.post(url, headers=auth, timeout=20)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["strategy"] == "auto_compact" and body["noop"] is False
    assert [(s["kind"], s["from_seq"], s["to_seq"]) for s in body["summaries"]] == [
        ("compaction", 1, 4)]
    send(client, 3)
    sent = agent_calls(fake)[-1]["messages"]
    assert "SUMMARY 1" in sent[1]["content"]
    assert sent[2:] == [{"role": "user", "content": turn_text(3)}]
    # pressed again with nothing live but the new turn: that turn is compacted
    assert httpx.post(url, headers=auth, timeout=20).json()["summaries"][0]["from_seq"] == 5
    assert httpx.post(url, timeout=20).status_code == 401


def test_older_tool_results_are_evicted_on_the_wire_and_kept_in_the_store(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "evict", llm={"model": "gpt-4o", "contextWindow": 50_000},
                memoryConfig={"kind": "auto_compact",
                              "toolResultEviction": {"afterTurns": 1, "aboveTokens": 200}},
                tools=[{"name": "fetch_tool_result"}])
    proxy = make_proxy()
    client = proxy.client("evict", "e")
    big, small = "B" + " beta" * 400, "tiny result"
    fake.queue(Reply.tool_calls([{"id": "c_big", "name": "read", "arguments": {}},
                                 {"id": "c_small", "name": "read", "arguments": {}}]),
               Reply.text("Read both."))
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": "read both files"}])
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "tool", "tool_call_id": "c_big", "content": big},
        {"role": "tool", "tool_call_id": "c_small", "content": small}])
    # within the current turn the results go in full
    assert [m["content"] for m in fake.chat_requests[-1].body["messages"][-2:]] == [big, small]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "and now?"}])
    assert raw.headers["x-memory-context-modified"] == "true"
    sent = {m.get("tool_call_id"): m["content"] for m in fake.chat_requests[-1].body["messages"]}
    assert sent["c_small"] == small  # under aboveTokens
    assert sent["c_big"].startswith("[tool result evicted by memory-proxy")
    assert 'tool_call_id="c_big"' in sent["c_big"]
    stored = {m.tool_call_id: m for m in proxy.stored("evict", "e") if m.role == "tool"}
    assert stored["c_big"].content == big and stored["c_big"].compressed_content is None


def test_the_bundled_agents_are_auto_compact_and_described():
    from proxy.agents import parse_definition

    names = sorted(p.stem for p in BUNDLED.glob("*.json"))
    assert {"assistant-with-tools", "research-lead", "planner"} <= set(names)
    for name in ("assistant-with-tools", "research-lead", "planner"):
        definition, config = parse_definition(json.loads((BUNDLED / f"{name}.json").read_text()))
        assert definition.name == name
        assert config.kind == "auto_compact"
        assert len(definition.description) > 40
        assert definition.llm.contextWindow and definition.llm.model
        if config.toolResultEviction is not None:
            # eviction points the model at fetch_tool_result: the agent must offer it
            assert any(t.name == "fetch_tool_result" for t in definition.tools)
