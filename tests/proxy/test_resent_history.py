"""A full-history client's resent conversation: matching it against a page
(``sync_support.match_page``, a reference) answers what the store's probe answers, and a
proxy with the session cache sends and stores what one without it does."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import RunningProxy
from sync_support import match_page

import proxy.turn.history_sync as history_sync
from proxy.testing.fake_upstream import Reply
from proxy.turn.sync import new_record
from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, TurnWrite

MODEL = "gpt-4o-mini"
KEY = SessionKey("ns", "agent", "s")
ALL = LoadSpec(limit=10_000, since="all")


def client_message(rng: random.Random, index: int) -> dict:
    """A message as a client sends it: text, text parts, tool calls and results."""
    kind = rng.choice(["user", "assistant", "parts", "calls", "tool", "empty"])
    if kind == "parts":
        return {"role": "user", "content": [{"type": "text", "text": f"part {index}"},
                                            {"type": "text", "text": " more"}]}
    if kind == "calls":
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{index}", "type": "function",
             "function": {"name": "f", "arguments": f'{{"n": {index}}}'}}]}
    if kind == "tool":
        return {"role": "tool", "tool_call_id": f"c{index}", "content": f"result {index}"}
    if kind == "empty":
        return {"role": "assistant", "content": ""}
    return {"role": kind, "content": f"{kind} says {index % 7}"}  # repeats: equal texts


def variant(rng: random.Random, message: dict) -> dict:
    """The same message as the client may send it again, or an edited one."""
    choice = rng.random()
    if choice < 0.3 and isinstance(message.get("content"), str) and message["content"]:
        # canonically the same: one text part
        return {**message, "content": [{"type": "text", "text": message["content"]}]}
    if choice < 0.5:
        return {**message, "content": f"edited {rng.random()}"}
    if choice < 0.6:
        return {**message, "role": "user" if message["role"] != "user" else "assistant"}
    return dict(message)


async def test_matching_a_page_answers_what_the_store_answers_a_probe(tmp_path: Path) -> None:
    rng = random.Random(7)
    store = SqliteStore(f"sqlite:///{tmp_path}/m.db")
    await store.open()
    try:
        for scenario in range(150):
            key = SessionKey("ns", "agent", f"s{scenario}")
            sent: list[dict] = []
            for turn in range(rng.randint(1, 5)):
                batch = [client_message(rng, 10 * turn + i) for i in range(rng.randint(1, 4))]
                records = [new_record(m, history_sync.fingerprint(m), MODEL, 1.0) for m in batch]
                write = TurnWrite(records)
                if sent and rng.random() < 0.25:  # a rewind: the tail is superseded
                    keep = rng.randint(0, len(sent))
                    write.supersede_after, sent = keep, sent[:keep]
                    write.messages = records
                    page = (await store.load(key, ALL)).messages
                    write.supersede_after = page[keep - 1].seq if keep else 0
                await store.append_turn(key, write)
                sent += batch
            page = (await store.load(key, ALL)).messages
            assert [m.fingerprint for m in page] == [history_sync.fingerprint(m) for m in sent]

            resent = [variant(rng, m) if rng.random() < 0.15 else dict(m) for m in sent]
            resent = resent[: rng.randint(0, len(resent))] if rng.random() < 0.2 else resent
            resent += [client_message(rng, 100 + i) for i in range(rng.randint(0, 2))]
            fingerprints = history_sync.Fingerprints(resent)
            probed = await store.load(key, ALL, probe=fingerprints.probe())

            local = match_page(history_sync.Fingerprints(resent), page)
            assert local == (probed.matched, probed.matched_seq), scenario
    finally:
        await store.close()


def test_a_page_match_skips_the_fingerprints_of_unchanged_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page_messages = [{"role": "user", "content": f"q{i}"} if i % 2 == 0
                     else {"role": "assistant", "content": f"a{i}"} for i in range(40)]
    page = [new_record(m, history_sync.fingerprint(m), MODEL, 1.0) for m in page_messages]
    for seq, record in enumerate(page, start=1):
        record.seq = seq
    computed: list[Any] = []
    real = history_sync.fingerprint
    monkeypatch.setattr(history_sync, "fingerprint",
                        lambda message: computed.append(message) or real(message))
    resent = history_sync.Fingerprints([*page_messages, {"role": "user", "content": "new"}])

    assert match_page(resent, page) == (40, 40)
    assert computed == []  # not one fingerprint computed
    assert resent[40] == real({"role": "user", "content": "new"})
    assert computed == [{"role": "user", "content": "new"}]


def full_history_turns(proxy: RunningProxy, fake, session: str) -> list[list[dict]]:
    """A client that resends everything: six turns, one edit of an earlier message (a
    rewind) and a tool round trip; returns what the upstream received."""
    client = proxy.client("resend", session)
    start = len(fake.chat_requests)
    history: list[dict] = [{"role": "system", "content": "Be brief."}]

    def ask(messages: list[dict], reply: Reply) -> dict:
        fake.queue(reply)
        answer = client.chat.completions.create(model=MODEL, messages=messages)
        message = answer.choices[0].message
        out = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        return out

    for n in range(4):
        history.append({"role": "user", "content": f"question {n}"})
        history.append(ask(history, Reply.text(f"answer {n}")))
    edited = [*history[:3], {"role": "user", "content": "question 1, edited"}]
    history = [*edited, ask(edited, Reply.text("answer to the edit"))]
    history.append({"role": "user", "content": "look it up"})
    history.append(ask(history, Reply.tool_calls([
        {"id": "call_1", "name": "lookup", "arguments": {"q": "x"}}])))
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "found"})
    history.append(ask(history, Reply.text("done")))
    proxy.drain()
    return [r.body["messages"] for r in fake.chat_requests[start:]]


def test_full_history_turns_send_and_store_what_an_uncached_proxy_does(
    make_proxy, fake
) -> None:
    cached = make_proxy()
    with_cache = full_history_turns(cached, fake, "a")
    uncached = make_proxy(session_cache_mb=0)
    without_cache = full_history_turns(uncached, fake, "b")

    assert with_cache == without_cache
    rows = [(m.role, m.content, m.seq) for m in cached.stored("resend", "a")]
    assert rows == [(m.role, m.content, m.seq) for m in uncached.stored("resend", "b")]
    assert any(m.content == "question 1" for m in cached.stored("resend", "a")) is False


def test_a_session_grown_past_the_cached_page_is_matched_by_the_store(make_proxy, fake):
    first, second = make_proxy(), make_proxy()
    history: list[dict] = []
    for n, proxy in enumerate([first, first, second, first]):
        history.append({"role": "user", "content": f"q{n}"})
        fake.queue(Reply.text(f"a{n}"))
        proxy.client("grown", "s1").chat.completions.create(model=MODEL, messages=history)
        history.append({"role": "assistant", "content": f"a{n}"})

    assert [m["content"] for m in fake.chat_requests[-1].body["messages"]] == [
        "q0", "a0", "q1", "a1", "q2", "a2", "q3"]
    assert [m.content for m in first.stored("grown", "s1")] == [
        "q0", "a0", "q1", "a1", "q2", "a2", "q3", "a3"]


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "plain"},
    {"role": "assistant", "content": "naïve “quotes” \u2028 and \\ escapes"},
    {"role": "system", "content": "x", "name": "ops"},
    {"role": "developer", "content": "y", "extra": None},
    {"role": "assistant", "content": "", "tool_calls": []},
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": "with calls", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
    {"role": "user", "content": [{"type": "text", "text": "plain"}]},
])
def test_fingerprints_are_those_of_the_canonical_form(message: dict) -> None:
    # the fast path for plain text must give what every stored fingerprint was made with
    canonical = orjson.dumps(history_sync.canonical(message), option=orjson.OPT_SORT_KEYS)
    assert history_sync.fingerprint(message) == hashlib.sha1(canonical).hexdigest()


def test_resent_hashes_answer_what_computing_them_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = [
        {"role": "user", "content": "same text"},
        {"role": "assistant", "content": "same text"},  # another role: another fingerprint
        {"role": "assistant", "content": "x", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
        {"role": "user", "content": [{"type": "text", "text": "parts"}]},
    ]
    fps = [history_sync.fingerprint(m) for m in messages]
    chains = history_sync.probe_chains(fps)
    computed = count_computations(monkeypatch)
    hashes = history_sync.ResentHashes(max_bytes=2_000)

    for _ in range(3):  # computed, then remembered
        assert [hashes.fingerprint(m) for m in messages] == fps
        assert hashes.chains(fps) == chains

    first = 2 * len(messages)  # every fingerprint and chain, once
    assert len(computed) == first + 2 * 3
    # later turns compute only what is not plain text (a tool call, a tool result, parts)
    assert computed[first:] == [("fingerprint", m["content"]) for m in messages[2:]] * 2


def test_resent_hashes_start_over_past_max_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    computed = count_computations(monkeypatch)
    hashes = history_sync.ResentHashes(max_bytes=2_000)
    texts = [{"role": "user", "content": f"text {n} " * 20} for n in range(50)]
    fps = [f"{n:040x}" for n in range(50)]
    for message, fp in zip(texts, fps, strict=True):
        assert hashes.fingerprint(message) == history_sync.fingerprint(message)
        assert hashes.chains([fp]) == history_sync.probe_chains([fp])

    def remembered(ask: Callable[[Any], object], items: list[Any]) -> int:
        """How many of the latest ``items`` are answered without computing (it remembers
        since it last started over: newest first, up to the first it computes again)."""
        del computed[:]
        for count, item in enumerate(reversed(items)):
            ask(item)
            if computed:
                return count
        return len(items)

    text_bytes = len(texts[0]["content"])
    chain_bytes = 3 * 40  # the previous chain, the fingerprint, the chain: 40 hex digits each
    assert remembered(hashes.fingerprint, texts) * text_bytes <= 2_000
    assert remembered(lambda fp: hashes.chains([fp]), fps) * chain_bytes <= 2_000


def count_computations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What is computed (sha1 of a canonical message, a chain hash) from now on."""
    computed: list[tuple[str, Any]] = []
    fingerprint, chain_hash = history_sync.fingerprint, history_sync.chain_hash

    def counted_fingerprint(message: Any) -> str:
        computed.append(("fingerprint", message.get("content")))
        return fingerprint(message)

    def counted_chain(previous: str, fp: str) -> str:
        computed.append(("chain", fp))
        return chain_hash(previous, fp)

    monkeypatch.setattr(history_sync, "fingerprint", counted_fingerprint)
    monkeypatch.setattr(history_sync, "chain_hash", counted_chain)
    return computed
