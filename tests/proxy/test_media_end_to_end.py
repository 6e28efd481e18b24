"""Media end to end: the official openai client sends images and a PDF through the proxy
to the recording fake; blocks on the turn they arrive, placeholders later, bytes stored once."""

from __future__ import annotations

import contextlib
import socket
import sqlite3

import httpx
import openai
import pytest
from e2e import ADMIN_TOKEN, write_agent
from media_samples import b64, data_url, pdf, png, wav
from media_support import RecordingMapper, RecordingPartReader

from proxy.testing.fake_upstream import Reply
from storage.redis_client import connect, disconnect
from storage.sqlite import SqliteStore
from strategies.tokens import count_message

IMAGE = data_url("image/png", png(1024, 768))
DOCUMENT = data_url("application/pdf", pdf(2))
VISION = {"model": "gpt-4o", "capabilities": ["image", "document"]}


def with_media(text: str = "What is in these?") -> list[dict]:
    return [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": IMAGE}},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": DOCUMENT}},
    ]


def sent(fake, index: int = -1) -> list[dict]:
    return fake.chat_requests[index].body["messages"]


def media_types(messages: list[dict]) -> set[str]:
    return {p.get("type") for m in messages if isinstance(m.get("content"), list)
            for p in m["content"]} - {"text"}


def stored_part_count(proxy) -> int:
    store = proxy.services.store.store  # behind the session cache
    if isinstance(store, SqliteStore):
        with contextlib.closing(sqlite3.connect(store.path)) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM session_parts").fetchone()[0])

    async def count() -> int:
        client = connect(store.url)  # a client of its own, beside the store's
        keys = await client.keys("mp:*:media")
        total = sum([await client.hlen(key) for key in keys])
        await disconnect(client)
        return total

    return proxy.call(count())


def memory(proxy, agent: str, session: str) -> dict:
    response = httpx.get(f"{proxy.base}/memory/{agent}/{session}",
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_blocks_go_up_on_the_first_turn_and_placeholders_afterwards(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "vision", llm=VISION)
    proxy = make_proxy()
    client = proxy.client("vision", "s1")

    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                              "content": with_media()}])
    first = sent(fake)[0]["content"]
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "And?"}])
    later = sent(fake)[0]["content"]

    assert first[0]["text"].startswith("[Attachments: ")
    assert "report.pdf (application/pdf, 2 pages" in first[0]["text"]
    assert first[1:] == with_media()
    assert isinstance(later, str)
    lines = later.splitlines()
    assert lines[0] == first[0]["text"]
    assert lines[1] == "What is in these?"
    assert lines[2].startswith("[image: sha256:") and "image/png, 1024x768" in lines[2]
    assert lines[3].startswith("[document: report.pdf — application/pdf, 2 pages")
    assert all(line.endswith("— not shown to the model]") for line in lines[2:])
    assert "base64" not in later
    # the record holds references; the bytes live in the part store
    record = proxy.stored("vision", "s1")[0]
    assert "base64" not in str(record.content)
    assert [p["kind"] for p in record.meta["parts"]] == ["image", "document"]
    assert stored_part_count(proxy) == 2


def test_a_part_is_stored_once_per_session_across_turns(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "vision", llm=VISION)
    proxy = make_proxy()
    client = proxy.client("vision", "full")
    history = [{"role": "user", "content": with_media()}]
    for n in range(3):
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"next {n}"}]
    proxy.client("vision", "other").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": with_media("Again")}])

    stored = proxy.stored("vision", "full")
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    assert stored_part_count(proxy) == 4  # two in each session (a part is its session's)
    # the full-history client resent the data URLs; the model got placeholders
    assert media_types(sent(fake, -2)) == set()
    assert media_types(sent(fake, -1)) == {"image_url", "file"}


@pytest.mark.parametrize(
    "llm",
    [
        pytest.param({"model": "gpt-4o", "capabilities": []}, id="declared-without-image"),
        pytest.param({"model": "gpt-3.5-turbo"}, id="litellm-says-no-vision"),
    ],
)
def test_a_model_without_vision_never_receives_image_blocks(make_proxy, fake, agents_dir, llm):
    write_agent(agents_dir, "blind", llm=llm)
    proxy = make_proxy()
    client = proxy.client("blind", "s")
    client.chat.completions.create(model=llm["model"], messages=[
        {"role": "user", "content": [{"type": "text", "text": "see"},
                                     {"type": "image_url", "image_url": {"url": IMAGE}}]}])
    client.chat.completions.create(model=llm["model"], messages=[{"role": "user", "content": "?"}])

    for request in fake.chat_requests:
        assert media_types(request.body["messages"]) == set()
    assert "[image: sha256:" in sent(fake, 0)[0]["content"]


def test_a_current_turn_tool_loop_reads_the_stored_part_back(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "vision", llm=VISION)
    RecordingPartReader.asked.clear()
    proxy = make_proxy(part_reader="media_support:RecordingPartReader")
    client = proxy.client("vision", "loop")
    fake.queue(Reply.tool_calls([{"id": "call_1", "name": "zoom", "arguments": {"x": 1}}]),
               Reply.text("It is a chart."))

    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                              "content": with_media()}])
    assert RecordingPartReader.asked == []  # the new parts were in the request
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "tool", "tool_call_id": "call_1", "content": "zoomed"}])
    in_loop = sent(fake)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "ok"}])

    assert [m["role"] for m in in_loop] == ["user", "assistant", "tool"]
    assert in_loop[0]["content"][1:] == with_media()
    stored = proxy.stored("vision", "loop")[0]
    assert RecordingPartReader.asked == [[p["digest"] for p in stored.meta["parts"]]]
    assert media_types(sent(fake)) == set()


def test_a_remote_image_is_passed_on_and_never_fetched_by_the_proxy(
    make_proxy, fake, agents_dir, monkeypatch
):
    write_agent(agents_dir, "vision", llm=VISION)
    proxy = make_proxy()
    attempts: list[object] = []
    real_connect = socket.socket.connect

    def spy(sock: socket.socket, address: object) -> None:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    remote = {"type": "image_url",
              "image_url": {"url": "https://images.example.com/cat.png?sig=abc", "detail": "low"}}
    client = proxy.client("vision", "remote")
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": [{"type": "text", "text": "cat?"}, remote]}])
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "and?"}])

    assert sent(fake, 0)[0]["content"][-1] == remote
    assert sent(fake)[0]["content"].splitlines()[-1] == (
        "[image: https://images.example.com/cat.png — not shown to the model]")
    assert attempts == []
    assert stored_part_count(proxy) == 0


def test_audio_travels_as_a_block_to_a_model_that_hears(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "ears",
                llm={"model": "gpt-4o-audio-preview", "capabilities": ["audio"]})
    proxy = make_proxy()
    clip = {"type": "input_audio", "input_audio": {"data": b64(wav(1.5)), "format": "wav"}}
    client = proxy.client("ears", "a")
    client.chat.completions.create(model="gpt-4o-audio-preview", messages=[
        {"role": "user", "content": [{"type": "text", "text": "transcribe"}, clip]}])
    client.chat.completions.create(model="gpt-4o-audio-preview",
                                   messages=[{"role": "user", "content": "again"}])

    assert sent(fake, 0)[0]["content"][-1] == clip
    assert "[audio: sha256:" in sent(fake)[0]["content"]
    assert "1.5 s" in sent(fake)[0]["content"]


def test_memory_shows_the_text_and_tokens_the_model_received(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "vision", llm=VISION)
    proxy = make_proxy()
    client = proxy.client("vision", "view")

    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": with_media()}])
    received = sent(fake)[0]
    view = memory(proxy, "vision", "view")
    entry = view["messages"][0]
    lines = entry["text"].splitlines()

    assert entry["tokens"] == count_message(received, "gpt-4o")
    assert int(raw.headers["x-memory-window-tokens"]) == count_message(received, "gpt-4o")
    image_digest = entry["parts"][0]["digest"]
    assert lines[2] == (f"[image: {image_digest[:19]} — image/png, 1024x768, 175 B"
                        " — sent to the model]")
    assert lines[3].startswith("[document: report.pdf — application/pdf, 2 pages")
    assert [(p["kind"], p["sent_as"]) for p in entry["parts"]] == [("image", "block"),
                                                                   ("document", "block")]

    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "And?"}])
    received = sent(fake)[0]
    entry = memory(proxy, "vision", "view")["messages"][0]

    assert entry["text"] == received["content"]
    assert entry["tokens"] == count_message(received, "gpt-4o")
    assert [p["sent_as"] for p in entry["parts"]] == ["placeholder", "placeholder"]


def test_a_replacement_mapper_sees_every_message_with_its_part_references(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "vision", llm=VISION)
    RecordingMapper.seen.clear()
    proxy = make_proxy(mapper="media_support:RecordingMapper")
    client = proxy.client("vision", "mapped")
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                              "content": with_media()}])

    ((role, content),) = RecordingMapper.seen
    assert role == "user"
    assert [p.get("part", {}).get("kind") for p in content] == [None, "image", "document"]
    assert sent(fake)[0]["content"][1:] == with_media()


def test_an_invalid_data_url_is_a_400_and_nothing_is_stored(make_proxy, fake, agents_dir):
    proxy = make_proxy()
    client = proxy.client("vision", "bad")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@not base64@@"}}]}])

    assert "content part 0 (image_url)" in caught.value.message
    assert fake.chat_requests == []
    assert proxy.stored("vision", "bad") == []


def test_a_turn_that_fails_upstream_stores_no_media(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "vision", llm=VISION)
    proxy = make_proxy()
    fake.queue(Reply.error(500))
    with pytest.raises(openai.InternalServerError):
        proxy.client("vision", "failed").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": with_media()}])

    assert proxy.stored("vision", "failed") == []
    assert stored_part_count(proxy) == 0


def test_a_message_cut_by_the_message_cap_keeps_its_media(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "capped", llm={**VISION, "contextWindow": 8000})
    proxy = make_proxy()
    client = proxy.client("capped", "s1")
    long = "Describe this photo in the light of my notes. " + "note " * 4000
    content = [{"type": "text", "text": long}, {"type": "image_url", "image_url": {"url": IMAGE}}]

    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                              "content": content}])
    first = sent(fake)[0]["content"]
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "And?"}])
    later = sent(fake)[0]["content"]

    # the current turn: the text is cut by maxMessageRatio, the image still goes as a block
    assert isinstance(first, list)
    text = "\n".join(p["text"] for p in first if p["type"] == "text")
    assert "truncated by memory-proxy" in text and len(text) < len(long)
    assert [p for p in first if p["type"] == "image_url"] == [content[1]]
    # a later turn: still cut, the image named by its placeholder
    assert isinstance(later, str)
    assert "truncated by memory-proxy" in later
    assert any(line.startswith("[image: sha256:") and line.endswith("not shown to the model]")
               for line in later.splitlines())
    assert "[image_url]" not in later
    view = memory(proxy, "capped", "s1")
    assert view["messages"][0]["marker"] == "truncated"
