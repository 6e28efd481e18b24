"""The Compact action (``POST /admin/api/agents/{agent}/sessions/{session}/compact``):
the strategy's compress() run now, its records written, the working memory refreshed."""

from __future__ import annotations

import httpx
import pytest
from e2e import ADMIN_TOKEN, write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    scripted,
    sized,
    summarizer_requests,
    tool_contents,
)

from proxy.testing.fake_upstream import Reply
from strategies.compression import STUB_HINT
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.validity import check_openai_messages

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def compact(proxy, agent: str, session: str, headers=AUTH) -> httpx.Response:
    return httpx.post(f"{proxy.base}/admin/api/agents/{agent}/sessions/{session}/compact",
                      headers=headers, timeout=20)


def tool_session(make_proxy, fake, agents_dir, name: str = "researcher"):
    """Five turns of one 700-token result, then a current turn that read four results;
    a 16,000-token window, so nothing was compressed or trimmed on the way."""
    write_agent(agents_dir, name, llm={"model": MODEL, "contextWindow": 16_000})
    model = scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client(name, "s"), fake, system="You research.")
    for turn in range(1, 6):
        session.tool_turn(turn, [sized(f"RESULT {turn}", 700)])
    session.tool_turn(6, [sized(f"RESULT 6.{j}", 700) for j in range(4)])
    return proxy, session, model


def test_compact_summarizes_compresses_and_shows_the_refreshed_memory(
    make_proxy, fake, agents_dir
):
    proxy, session, model = tool_session(make_proxy, fake, agents_dir)
    assert not any(STUB_HINT in t for t in tool_contents(session.sent[-1].messages).values())
    before = proxy.stored("researcher", "s")
    current = next(m.seq for m in reversed(before) if m.role == "user")

    response = compact(proxy, "researcher", "s")
    assert response.status_code == 200
    data = response.json()
    assert (data["strategy"], data["noop"], data["compressed"]) == ("summarizing_window", False, 1)
    assert [(s["kind"], s["from_seq"], s["to_seq"]) for s in data["summaries"]] == [
        ("summary", 1, current - 1)]

    # the summarizer saw everything before the current turn, with the full results
    [call] = summarizer_requests(fake)
    assert call.body["messages"][0]["content"].startswith(SUMMARY_SYSTEM_PROMPT)
    transcript = call.body["messages"][1]["content"]
    assert "RESULT 1:" in transcript and "RESULT 5:" in transcript
    assert "RESULT 6.0" not in transcript

    # stored: the summary record, the stub next to the untouched original
    snapshot = proxy.snapshot("researcher", "s")
    [record] = snapshot.summaries
    assert (record.from_seq, record.to_seq, record.text) == (1, current - 1,
                                                              model.summary_texts[0])
    stored = {m.tool_call_id: m for m in snapshot.messages if m.role == "tool"}
    assert {cid: m.content for cid, m in stored.items()} == session.results
    stubbed = {cid: m.compressed_content for cid, m in stored.items() if m.compressed_content}
    assert list(stubbed) == ["c6_0"]  # read, older than the newest three, above 500 tokens
    assert STUB_HINT in stubbed["c6_0"]

    # the refreshed working memory, in the response and at /memory
    memory = httpx.get(f"{proxy.base}/memory/researcher/s", headers=AUTH).json()
    for view in (data["memory"], memory):
        assert [(s["from_seq"], s["to_seq"], s["sent"]) for s in view["summaries"]] == [
            (1, current - 1, True)]
        assert view["totals"]["trimmed"] == current - 1
        assert view["totals"]["context_modified"] is True
        assert view["messages"][0]["kind"] == "system"
        assert record.text in view["messages"][0]["text"]
        [entry] = [m for m in view["messages"] if m.get("marker") == "compressed"]
        assert (entry["tool_call_id"], entry["text"]) == ("c6_0", stubbed["c6_0"])
        assert entry["stored_tokens"] == stored["c6_0"].tokens > entry["tokens"]
        assert view["totals"]["live_ratio"] < 0.2

    # and the model receives it so on the next request
    sent = session.say("go on")
    assert check_openai_messages(sent.messages) == []
    assert record.text in sent.messages[0]["content"]
    assert tool_contents(sent.messages)["c6_0"] == stubbed["c6_0"]
    assert not any(str(m["content"]).startswith("T1x1") for m in sent.messages[1:])


def test_compact_twice_summarizes_nothing_twice(make_proxy, fake, agents_dir):
    proxy, _session, _model = tool_session(make_proxy, fake, agents_dir)
    assert compact(proxy, "researcher", "s").json()["noop"] is False
    again = compact(proxy, "researcher", "s")
    assert again.status_code == 200
    assert again.json()["noop"] is True and again.json()["message"]
    assert len(summarizer_requests(fake)) == 1
    assert len(proxy.snapshot("researcher", "s").summaries) == 1


def test_compact_needs_the_admin_token(make_proxy, fake, agents_dir):
    proxy, _session, _model = tool_session(make_proxy, fake, agents_dir)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = compact(proxy, "researcher", "s", headers=headers)
        assert response.status_code == 401
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert summarizer_requests(fake) == []
    assert proxy.snapshot("researcher", "s").summaries == []
    assert all(m.compressed_content is None for m in proxy.stored("researcher", "s"))


def test_compact_of_an_unknown_session_is_a_404(proxy, fake):
    response = compact(proxy, "researcher", "nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"


@pytest.mark.parametrize("kind", ["windowed", "full", "none"])
def test_compact_is_a_noop_for_strategies_that_never_compress(make_proxy, fake, agents_dir, kind):
    write_agent(agents_dir, "plain", memoryConfig={"kind": kind})
    proxy = make_proxy()
    client = proxy.client("plain", "s")
    for n in range(3):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{n}"}])
    response = compact(proxy, "plain", "s")
    assert response.status_code == 200
    assert (response.json()["strategy"], response.json()["noop"]) == (kind, True)
    assert proxy.snapshot("plain", "s").summaries == []


def test_a_failing_summarizer_makes_compact_a_409_and_changes_no_summary(
    make_proxy, fake, agents_dir
):
    proxy, _session, model = tool_session(make_proxy, fake, agents_dir)
    model.summaries.append(Reply.error(500))
    response = compact(proxy, "researcher", "s")
    assert response.status_code == 409
    assert "summarizer failed" in response.json()["error"]["message"]
    assert proxy.snapshot("researcher", "s").summaries == []
    # the lossless stubs were still written; a retry summarizes
    assert compact(proxy, "researcher", "s").json()["summaries"]
