"""``/memory/{agent}/{session}/transcript``: the whole stored record through HTTP, paged
and as a JSON lines export, with stubs, superseded messages, compactions and media."""

from __future__ import annotations

import httpx
import orjson
import pytest
from e2e import ADMIN_TOKEN
from media_samples import data_url, png

from proxy.testing.fake_upstream import Reply
from strategies.records import SummaryRecord

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
AGENT = "recorder"


def transcript(proxy, session: str = "s", **params) -> httpx.Response:
    return httpx.get(f"{proxy.base}/memory/{AGENT}/{session}/transcript", headers=AUTH,
                     params=params)


@pytest.fixture
def recorded(proxy):
    """A session of four turns; then its first tool-free answer compressed, the turns up
    to seq 4 compacted, and the last turn rewound (full history resent shorter)."""
    client = proxy.client(AGENT, "s")
    image = {"type": "image_url", "image_url": {"url": data_url("image/png", png(8, 6))}}
    history = []
    for text in ("first question", "second question", "third question"):
        content = [{"type": "text", "text": text}, image] if text == "first question" else text
        history.append({"role": "user", "content": content})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    # a rewind: the client resends its history without the third turn, and a new question
    client.chat.completions.create(
        model="gpt-4o", messages=[*history[:4], {"role": "user", "content": "instead this"}],
        extra_headers={"X-Memory-History": "full"},
    )
    key = proxy.key(AGENT, "s")
    store = proxy.services.store
    proxy.call(store.set_compressed(key, {2: "[compressed answer]"}))
    proxy.call(store.add_summary(key, SummaryRecord("compaction", "they asked twice", 1, 4)))
    return proxy


def test_the_transcript_lists_every_stored_message_with_its_original_and_stub(recorded):
    response = transcript(recorded)
    assert response.status_code == 200
    data = response.json()
    stored = recorded.call(recorded.services.store.read_log(recorded.key(AGENT, "s")))
    assert [m["seq"] for m in data["messages"]] == [m.seq for m in stored.messages]
    assert [m["seq"] for m in data["messages"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    second = data["messages"][1]
    assert second["compressed_content"] == "[compressed answer]"
    assert second["text"] == stored.messages[1].content  # the original, not the stub
    assert [m["superseded"] for m in data["messages"]] == [False] * 4 + [True] * 2 + [False] * 2
    assert [m["compacted"] for m in data["messages"]] == [True] * 4 + [False] * 4
    assert data["messages"][0]["summarized_by"] == [data["summaries"][0]["id"]]
    assert all(m["tokens"] > 0 for m in data["messages"])
    # only a reply carries its turn's cached tokens (the fake reports none cached)
    assert {m["cached_tokens"] for m in data["messages"] if m["role"] == "assistant"} == {0}
    assert all(m["cached_tokens"] is None for m in data["messages"] if m["role"] == "user")
    assert data["summaries"][0] | {"id": 0, "created_at": 0} == {
        "id": 0, "kind": "compaction", "from_seq": 1, "to_seq": 4, "tokens": 0, "model": "",
        "text": "they asked twice", "created_at": 0,
    }
    assert data["boundary_seq"] == 4
    assert data["next_after"] is None


def test_media_parts_are_named_not_inlined(recorded):
    first = transcript(recorded).json()["messages"][0]
    (part,) = first["parts"]
    assert part["kind"] == "image" and (part["width"], part["height"]) == (8, 6)
    assert part["line"].startswith("[image: ")
    assert first["text"] == "first question\n" + part["line"]
    assert "base64" not in orjson.dumps(first).decode()


def test_the_transcript_pages_by_seq_with_a_next_cursor(recorded):
    first = transcript(recorded, limit=3).json()
    assert [m["seq"] for m in first["messages"]] == [1, 2, 3]
    assert first["next_after"] == 3
    rest = transcript(recorded, after=first["next_after"], limit=100).json()
    assert [m["seq"] for m in rest["messages"]] == [4, 5, 6, 7, 8]
    assert rest["next_after"] is None


def test_the_jsonl_export_streams_the_whole_session_with_summaries_in_place(recorded):
    with httpx.stream("GET", f"{recorded.base}/memory/{AGENT}/s/transcript", headers=AUTH,
                      params={"format": "jsonl"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        assert "attachment" in response.headers["content-disposition"]
        lines = [orjson.loads(line) for line in response.iter_lines() if line]
    assert [line["type"] for line in lines] == [
        "session", "message", "message", "message", "message", "summary",
        "message", "message", "message", "message",
    ]
    assert lines[0]["head_seq"] == 8
    assert [line["seq"] for line in lines if line["type"] == "message"] == list(range(1, 9))
    assert lines[5]["to_seq"] == 4


def test_the_export_pages_through_a_session_longer_than_a_page(proxy, monkeypatch):
    monkeypatch.setattr("proxy.admin.transcript.EXPORT_PAGE", 3)
    client = proxy.client(AGENT, "long")
    for i in range(4):
        client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": f"q{i}"}])
    response = transcript(proxy, "long", format="jsonl")
    seqs = [orjson.loads(line)["seq"] for line in response.text.splitlines()[1:]]
    assert seqs == list(range(1, 9))


def test_the_transcript_needs_the_admin_token_and_a_stored_session(recorded):
    url = f"{recorded.base}/memory/{AGENT}/s/transcript"
    assert httpx.get(url).status_code == 401
    missing = transcript(recorded, "nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "session_not_found"


@pytest.mark.parametrize("params", [{"limit": "0"}, {"limit": "x"}, {"after": "-1"},
                                    {"format": "xml"}])
def test_bad_paging_parameters_are_a_400_in_openai_shape(recorded, params):
    response = transcript(recorded, **params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == next(iter(params))
    assert error["type"] == "invalid_request_error"


def test_a_reply_shows_the_cached_tokens_its_upstream_reported(proxy, fake):
    fake.queue(Reply.text("cached answer", usage={
        "prompt_tokens": 1300, "completion_tokens": 3, "total_tokens": 1303,
        "prompt_tokens_details": {"cached_tokens": 1152}}))
    proxy.client(AGENT, "cached").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
    messages = transcript(proxy, "cached").json()["messages"]
    assert [(m["role"], m["cached_tokens"]) for m in messages] == [
        ("user", None), ("assistant", 1152)]
