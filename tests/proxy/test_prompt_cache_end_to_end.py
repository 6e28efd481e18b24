"""The provider's prompt cache through the real proxy: a stable prefix turn after turn,
cached tokens read from the upstream's usage and stored with the turn, the prefix changes
named, and the cache hints sent upstream (prompt_cache_key, cache_control)."""

from __future__ import annotations

import httpx
import orjson
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY, write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    agent_requests,
    scripted,
    sized,
    summarizer_requests,
)

from proxy.testing.fake_upstream import Reply
from proxy.turn.prompt_cache import cache_usage

WINDOW = 4000
BUDGET = 3200  # maxConversationRatio 0.8
SYSTEM = "You are a research helper."


def memory_view(proxy, agent: str, session: str) -> dict:
    response = httpx.get(f"{proxy.base}/memory/{agent}/{session}",
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    return response.json()


def cached_total(proxy) -> float:
    name = 'memory_proxy_cached_tokens_total{strategy="summarizing_window"} '
    lines = httpx.get(f"{proxy.base}/metrics").text.splitlines()
    return next((float(line[len(name):]) for line in lines if line.startswith(name)), 0.0)


def test_the_prefix_stays_byte_for_byte_until_the_budget_forces_a_trim(
    make_proxy, fake, agents_dir
):
    # the default (stablePrefix "auto") holds the prefix once the upstream reports caching
    write_agent(agents_dir, "stable", llm={"model": MODEL, "contextWindow": WINDOW})
    scripted(fake, caching=True)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("stable", "s"), fake, system=SYSTEM)
    for turn in range(1, 16):
        session.tool_turn(turn, [sized(f"RESULT {turn}", 400)])
    requests = agent_requests(fake)
    starts, trims = [], 0
    for before, after, sent in zip(requests, requests[1:], session.sent[1:], strict=False):
        change = sent.headers["x-memory-prefix-change"]
        old, new = before.body["messages"], after.body["messages"]
        assert orjson.dumps(after.body.get("tools")) == orjson.dumps(before.body.get("tools"))
        assert orjson.dumps(new[0]) == orjson.dumps(old[0])  # the system block
        if change == "none":
            # the request before is a prefix of this one, byte for byte
            assert [orjson.dumps(m) for m in new[: len(old)]] == [orjson.dumps(m) for m in old]
        else:
            trims += change.startswith("trim@")
        assert int(sent.headers["x-memory-window-tokens"]) <= BUDGET
        users = [m["content"] for m in new if m["role"] == "user"]
        starts.append(int(users[0].split(":")[0][1:].split("x")[0]))
    assert trims >= 1, "the session was meant to overflow its budget"
    assert starts == sorted(starts), "the window start never moves back"
    changed = sum(s.headers["x-memory-prefix-change"] != "none" for s in session.sent)
    assert changed <= trims + 1, "stubs and trims change the prefix together, seldom"

    view = memory_view(proxy, "stable", "s")
    reasons = {c["reason"] for t in view["cache"]["turns"] for c in t["prefix_changes"]}
    assert "trim" in reasons


def test_by_default_an_upstream_that_caches_nothing_gets_the_specs_refit_at_every_request(
    make_proxy, fake, agents_dir
):
    # stablePrefix "auto": a stable prefix only pays where a cache reads it; without a
    # cache reading the window is the spec's (stablePrefix false), request for request
    write_agent(agents_dir, "auto", llm={"model": MODEL, "contextWindow": WINDOW})
    write_agent(agents_dir, "spec", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig={"kind": "summarizing_window", "stablePrefix": False})
    scripted(fake)
    proxy = make_proxy()
    sent = {}
    for agent in ("auto", "spec"):
        before = len(agent_requests(fake))
        session = DeltaSession(proxy.client(agent, "s"), fake, system=SYSTEM)
        for turn in range(1, 16):
            session.tool_turn(turn, [sized(f"RESULT {turn}", 400)])
        sent[agent] = [r.body["messages"] for r in agent_requests(fake)[before:]]
    assert orjson.dumps(sent["auto"]) == orjson.dumps(sent["spec"])
    first = next(m["content"] for m in sent["spec"][-1] if m["role"] == "user")
    assert not first.startswith("T1x"), "the session was meant to overflow its budget"


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_cached_tokens_are_read_from_the_usage_and_stored_with_the_turn(
    make_proxy, fake, agents_dir, stream
):
    write_agent(agents_dir, "warm", llm={"model": MODEL, "contextWindow": WINDOW})
    usage = {"prompt_tokens": 1500, "completion_tokens": 5, "total_tokens": 1505,
             "prompt_tokens_details": {"cached_tokens": 1280}}
    fake.queue(Reply.text("first", usage={**usage, "prompt_tokens_details": {}}),
               Reply.text("second", usage=usage))
    proxy = make_proxy()
    before = cached_total(proxy)
    client = proxy.client("warm", "s")
    headers = []
    for text in ("hello", "again"):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": text}], stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}))
        list(raw.parse()) if stream else raw.parse()
        headers.append(dict(raw.headers))
    proxy.drain()
    if stream:  # a stream's headers go out before its usage arrives
        assert all("x-memory-cached-tokens" not in h for h in headers)
    else:
        assert [h["x-memory-cached-tokens"] for h in headers] == ["0", "1280"]

    replies = [m for m in proxy.stored("warm", "s") if m.role == "assistant"]
    assert [r.meta["cache"] for r in replies] == [
        {"prompt": 1500, "cached": 0, "written": 0},
        {"prompt": 1500, "cached": 1280, "written": 0},
    ]
    view = memory_view(proxy, "warm", "s")["cache"]
    assert [t["cached_tokens"] for t in view["turns"]] == [0, 1280]
    assert view["totals"]["cached_tokens"] == 1280 and view["totals"]["prompt_tokens"] == 3000
    assert view["totals"]["cached_share"] == round(1280 / 3000, 4)

    assert cached_total(proxy) - before == 1280  # the counters are the process's


def test_each_provider_reports_cached_tokens_in_its_own_shape():
    assert cache_usage({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}) == {
        "prompt": 10, "cached": 4, "written": 0}
    assert cache_usage({"prompt_tokens": 10, "cache_read_input_tokens": 6,
                        "cache_creation_input_tokens": 3}) == {
        "prompt": 10, "cached": 6, "written": 3}
    assert cache_usage({"usageMetadata": {"cachedContentTokenCount": 7}, "prompt_tokens": 9}
                       ) == {"prompt": 9, "cached": 7, "written": 0}
    assert cache_usage(None) is None
    assert cache_usage({"prompt_tokens_details": {"cached_tokens": "many"}})["cached"] == 0


def test_openai_requests_carry_the_sessions_prompt_cache_key_unless_the_client_sent_one(
    make_proxy, fake, agents_dir
):
    proxy = make_proxy()
    for session in ("a", "a", "b"):
        proxy.client("agent", session).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])
    proxy.client("agent", "c").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}],
        extra_body={"prompt_cache_key": "mine"})
    keys = [r.body.get("prompt_cache_key") for r in fake.chat_requests]
    assert keys[0] == keys[1] != keys[2] and keys[3] == "mine"
    assert keys[0].startswith("mp-") and "agent" not in keys[0] and CLIENT_KEY not in keys[0]


def test_anthropic_models_get_cache_control_breakpoints_unless_the_client_placed_its_own(
    make_proxy, fake, agents_dir
):
    # litellm_routing off: the anthropic/ model id goes to the recording fake as it is
    proxy = make_proxy(litellm_routing=False)
    client = proxy.client("agent", "s")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    client.chat.completions.create(model="anthropic/claude-x", messages=messages)
    client.chat.completions.create(model="anthropic/claude-x", messages=[
        messages[0], {"role": "user", "content": "again"}])
    own = [{"role": "system", "content": [{"type": "text", "text": SYSTEM,
                                           "cache_control": {"type": "ephemeral"}}]},
           {"role": "user", "content": "mine"}]
    client.chat.completions.create(model="anthropic/claude-x", messages=own)
    first, second, third = (r.body["messages"] for r in fake.chat_requests)
    assert [("cache_control" in m) for m in first] == [True, True]
    # system, the last message; the message before the new one is read from the cache
    assert [("cache_control" in m) for m in second] == [True, False, False, True]
    assert not any("cache_control" in m for m in third)
    assert third[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert "prompt_cache_key" not in fake.chat_requests[0].body


def test_summaries_and_stubs_render_to_the_same_bytes_at_every_turn(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "compacting", llm={"model": MODEL, "contextWindow": 1200},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.6,
                              "toolResultEviction": {"afterTurns": 1, "aboveTokens": 100}})
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("compacting", "s"), fake, system=SYSTEM)
    for turn in range(1, 15):
        session.tool_turn(turn, [sized(f"RESULT {turn}", 200)])
        proxy.drain()
    requests = [r.body["messages"] for r in agent_requests(fake)]
    summaries: dict[str, set[bytes]] = {}
    stubs: dict[str, set[bytes]] = {}
    for messages in requests:
        for message in messages:
            content = str(message.get("content"))
            if content.startswith("This session is being continued"):
                label = content.split("\n")[1]  # names the range it covers
                summaries.setdefault(label, set()).add(orjson.dumps(message))
            if message["role"] == "tool" and "evicted by memory-proxy" in content:
                stubs.setdefault(message["tool_call_id"], set()).add(orjson.dumps(message))
    assert summaries and stubs, "the session was meant to compact and evict"
    assert all(len(rendered) == 1 for rendered in summaries.values())
    assert all(len(rendered) == 1 for rendered in stubs.values())
    for before, after, sent in zip(requests, requests[1:], session.sent[1:], strict=False):
        if sent.headers["x-memory-prefix-change"] == "none":
            assert [orjson.dumps(m) for m in after[: len(before)]] == [
                orjson.dumps(m) for m in before]


def test_the_summarizer_call_reuses_the_sessions_cached_prefix(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "compacting", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.4})
    scripted(fake)
    proxy = make_proxy()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    client = proxy.client("compacting", "s")
    for turn in range(1, 12):
        client.chat.completions.create(model=MODEL, tools=tools, messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": sized(f"question {turn}", 150)}])
        proxy.drain()
        if summarizer_requests(fake):
            break
    [call] = summarizer_requests(fake)
    last = agent_requests(fake)[-1].body
    # the overflowing request again, byte for byte, with its tools; its reply; then the
    # instruction: the provider's cache serves everything but the last two messages
    assert orjson.dumps(call.body["messages"][:-2]) == orjson.dumps(last["messages"])
    assert orjson.dumps(call.body["tools"]) == orjson.dumps(last["tools"])
    assert call.body["tool_choice"] == "none"
    assert call.body["prompt_cache_key"] == last["prompt_cache_key"]
    assert call.body["messages"][-2]["role"] == "assistant"
    assert "the conversation above (messages 1-" in call.body["messages"][-1]["content"]
