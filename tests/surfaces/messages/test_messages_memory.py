"""Memory on the Messages surface: compaction after the response (its summarizer call sent
to the Messages upstream), prompt-cache telemetry from Anthropic's usage, the proxy's
breakpoints, the working-memory view, and a session shared with chat completions."""

from __future__ import annotations

import anthropic
import httpx
import orjson
from e2e import ADMIN_TOKEN, CLIENT_KEY, write_agent

from proxy.testing.fake_messages import thinking
from proxy.testing.fake_upstream import Reply
from strategies.summary_prompt import SUMMARY_INSTRUCTION_LEAD, SUMMARY_SYSTEM_PROMPT

MODEL = "claude-sonnet-4-5"


def client(proxy, agent: str, session: str) -> anthropic.Anthropic:
    made = anthropic.Anthropic(base_url=f"{proxy.base}/agents/{agent}/sessions/{session}",
                               api_key=CLIENT_KEY, max_retries=0, timeout=20)
    proxy.clients.append(made)
    return made


def is_summarizer(body: dict) -> bool:
    raw = orjson.dumps([body.get("system"), body.get("messages")]).decode()
    return SUMMARY_SYSTEM_PROMPT[:60] in raw or SUMMARY_INSTRUCTION_LEAD[:60] in raw


def test_auto_compact_summarizes_through_the_messages_upstream(messages_proxy, fake, agents_dir):
    write_agent(agents_dir, "compactor", llm={"model": MODEL, "contextWindow": 2000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5})
    proxy = messages_proxy(summarizer_cached_prefix=False)

    def reply(body: dict) -> Reply:
        return Reply.text("SUMMARY: the user sent turns about alpha." if is_summarizer(body)
                          else "Noted.")

    fake.default_reply = reply
    api = client(proxy, "compactor", "long")
    for n in range(4):
        api.messages.create(model=MODEL, max_tokens=50, messages=[
            {"role": "user", "content": f"turn {n}: " + "alpha " * 250}])
        proxy.drain()
    calls = [r for r in fake.message_requests if is_summarizer(r.body)]
    assert calls, "a compaction ran"
    assert calls[0].headers.get("authorization") or calls[0].headers.get("x-api-key")
    last = fake.message_requests[-1].body
    assert not is_summarizer(last)
    assert "SUMMARY: the user sent turns about alpha." in orjson.dumps(last["messages"]).decode()
    assert last["messages"][0]["role"] == "user"


def test_the_summarizer_call_on_the_cached_prefix_goes_to_the_messages_upstream(
    messages_proxy, fake, agents_dir
):
    write_agent(agents_dir, "compactor", llm={"model": MODEL, "contextWindow": 4000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.3})
    proxy = messages_proxy()
    fake.default_reply = lambda body: Reply.text(
        "SUMMARY: alpha turns." if is_summarizer(body) else "Noted.")
    api = client(proxy, "compactor", "prefix")
    for n in range(6):
        api.messages.create(model=MODEL, max_tokens=50, messages=[
            {"role": "user", "content": f"turn {n}: " + "alpha " * 250}])
        proxy.drain()
    (call, *_) = [r.body for r in fake.message_requests if is_summarizer(r.body)]
    # the turn's request again, the instruction last, in the Messages API's shape
    instruction = call["messages"][-1]["content"][-1]["text"]
    assert instruction.startswith(SUMMARY_INSTRUCTION_LEAD)
    assert call["messages"][0]["content"][0]["text"].startswith("turn 0:")
    assert "SUMMARY: alpha turns." in orjson.dumps(fake.message_requests[-1].body).decode()


def test_cached_tokens_are_read_from_anthropics_usage(proxy, fake):
    usage = {"input_tokens": 20, "cache_read_input_tokens": 1500,
             "cache_creation_input_tokens": 30, "output_tokens": 5}
    fake.queue(Reply(content="cached answer", finish_reason="stop", usage=usage))
    raw = client(proxy, "cache", "c1").messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-memory-cached-tokens"] == "1500"
    reply = proxy.stored("cache", "c1")[-1]
    assert reply.meta["cache"] == {"prompt": 1550, "cached": 1500, "written": 30}


def test_the_proxy_places_breakpoints_when_the_client_places_none(proxy, fake):
    api = client(proxy, "marks", "m1")
    api.messages.create(model=MODEL, max_tokens=50, system="You help.",
                        messages=[{"role": "user", "content": "first"}])
    api.messages.create(model=MODEL, max_tokens=50, system="You help.",
                        messages=[{"role": "user", "content": "second"}])
    body = fake.message_requests[-1].body
    marks = [b for b in body["system"] if "cache_control" in b] + [
        b for m in body["messages"] for b in m["content"] if "cache_control" in b]
    assert 2 <= len(marks) <= 4
    assert "cache_control" in body["messages"][-1]["content"][-1]


def test_a_messages_session_shows_in_memory_with_its_thinking_named(proxy, fake):
    fake.queue(thinking(Reply.text("answer"), "private reasoning", signature="S1"))
    client(proxy, "viewer", "v1").messages.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "question"}])
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    memory = httpx.get(f"{proxy.base}/memory/viewer/v1", headers=headers).json()
    rendered = orjson.dumps(memory).decode()
    assert "question" in rendered and "answer" in rendered
    transcript = httpx.get(f"{proxy.base}/memory/viewer/v1/transcript", headers=headers).json()
    assert "[messages thinking: 17 chars, signed]" in orjson.dumps(transcript).decode()


def test_one_session_served_by_both_surfaces(proxy, fake):
    """A conversation started through chat completions goes on through the Messages API
    with its memory, and back."""
    chat = proxy.client("both", "shared")
    chat.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "The password is SWORDFISH."}])
    client(proxy, "both", "shared").messages.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "What is it?"}])
    sent = fake.message_requests[-1].body["messages"]
    assert "SWORDFISH" in orjson.dumps(sent).decode()
    chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Again?"}])
    assert "What is it?" in orjson.dumps(fake.chat_requests[-1].body["messages"]).decode()
    assert [m.role for m in proxy.stored("both", "shared")] == ["user", "assistant"] * 3
