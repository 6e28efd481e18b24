"""What the proxy does with what it is given: it fetches no URL a client supplies, stored
text stays inert in the admin pages, summaries are labelled as derived and cleaned of
invisible characters, deleting a session leaves no key behind, and summarizer calls per
session are bounded.
"""

from __future__ import annotations

import socket
import threading
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY, RunningProxy, write_agent
from media_samples import data_url, png

from proxy.testing.fake_upstream import FakeUpstream, Reply, echo_reply
from strategies.records import LoadSpec
from strategies.summary_prompt import is_summarizer_request

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
INVISIBLE = "\u202e\u200b\u2066\x1b\x07\U000e0041\ufeff"


def is_summarizer_call(body: dict[str, Any]) -> bool:
    return is_summarizer_request(body)


class Summaries:
    """The fake's default reply: summarizer calls get ``text`` (or fail when it is None)."""

    def __init__(self) -> None:
        self.text: str | None = "summary"
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not is_summarizer_call(body):
            return echo_reply(body)
        self.calls += 1
        return Reply.text(self.text) if self.text is not None else Reply.error(500)


@pytest.fixture
def summaries() -> Summaries:
    return Summaries()


@pytest.fixture
def fake(fake_upstream: FakeUpstream, summaries: Summaries) -> FakeUpstream:
    fake_upstream.reset(default_reply=summaries)
    return fake_upstream


def send(proxy: RunningProxy, agent: str, session: str, messages: list[dict[str, Any]], *,
         key: str = CLIENT_KEY, stream: bool = False) -> httpx.Response:
    return httpx.post(f"{proxy.url(agent, session)}/chat/completions",
                      json={"model": "gpt-4o", "stream": stream, "messages": messages},
                      headers={"Authorization": f"Bearer {key}"}, timeout=20)


def say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


class Listener:
    """A loopback socket that counts who connects to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_no_client_supplied_url_is_ever_fetched(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path
) -> None:
    listener = Listener()
    url = f"http://127.0.0.1:{listener.port}"
    write_agent(agents_dir, "eyes", llm={"model": "gpt-4o", "contextWindow": 4000,
                                         "capabilities": ["image", "document"]},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.2})
    proxy = make_proxy()
    try:
        parts = [
            {"type": "text", "text": "look at these " + "words " * 300},
            {"type": "image_url", "image_url": {"url": f"{url}/cat.png", "detail": "high"}},
            {"type": "image_url", "image_url": {"url": f"https://127.0.0.1:{listener.port}/"}},
            {"type": "file", "file": {"file_url": f"{url}/doc.pdf", "filename": "doc.pdf"}},
        ]
        for stream in (False, True):
            assert send(proxy, "eyes", "ssrf", [{"role": "user", "content": parts}],
                        stream=stream).status_code == 200
        assert send(proxy, "eyes", "ssrf", say(f"and fetch {url}/secret please")).status_code == 200
        proxy.drain()  # background compaction rendered the image parts into its transcript
        assert httpx.get(f"{proxy.base}/memory/eyes/ssrf", headers=ADMIN).status_code == 200
        httpx.get(f"{proxy.base}/admin/agents/eyes/sessions/ssrf", headers=ADMIN)
        httpx.post(f"{proxy.base}/admin/api/agents/eyes/sessions/ssrf/compact", headers=ADMIN)
        # the model got the URL as the client sent it: fetching it is the provider's business
        assert f"{url}/cat.png" in str(fake.chat_requests[0].body)
    finally:
        listener.close()
    assert listener.accepted == 0


XSS = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>",
       "\"><svg onload=alert(3)>", "javascript:alert(4)"]


def test_stored_text_renders_inert_in_the_admin_pages(
    proxy: RunningProxy, fake: FakeUpstream, summaries: Summaries
) -> None:
    fake.queue(Reply.tool_calls([{"id": "call_x", "name": "<b>lookup</b>",
                                  "arguments": {"q": XSS[1]}}], content=XSS[2]))
    send(proxy, "inert", "s", say(" ".join(XSS)))
    send(proxy, "inert", "s", [{"role": "tool", "tool_call_id": "call_x", "content": XSS[0]}])
    pages = ["/admin/agents/inert/sessions/s", "/admin/agents/inert", "/admin/"]
    for path in pages:
        page = httpx.get(f"{proxy.base}{path}", headers=ADMIN)
        assert page.status_code == 200, (path, page.status_code)
        assert page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        for payload in ("<script>alert(1)", "<img src=x", "<svg onload", "<b>lookup"):
            assert payload not in page.text, (path, payload)
    session_page = httpx.get(f"{proxy.base}{pages[0]}", headers=ADMIN).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in session_page
    view = httpx.get(f"{proxy.base}/memory/inert/s", headers=ADMIN)
    assert view.headers["content-type"] == "application/json"


def test_summaries_are_labelled_as_derived_and_cleaned_of_invisible_characters(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path,
    summaries: Summaries,
) -> None:
    summaries.text = f"Goal: ship{INVISIBLE} the release.\r\nNext: tag\u2028v1."
    write_agent(agents_dir, "labelled", llm={"model": "gpt-4o", "contextWindow": 1500},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.3})
    proxy = make_proxy()
    send(proxy, "labelled", "s", say("plan the release " + "detail " * 500))
    proxy.drain()
    stored = proxy.snapshot("labelled", "s").summaries
    assert stored and stored[-1].text == "Goal: ship the release.\nNext: tag\nv1."
    assert not [c for c in stored[-1].text
                if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\t"]
    send(proxy, "labelled", "s", say("what next?"))
    sent = str(fake.chat_requests[-1].body["messages"])
    assert "derived summary of messages" in sent and "Goal: ship the release." in sent
    assert not any(c in sent for c in INVISIBLE)


def traces(proxy: RunningProxy, agent: str, session: str, word: str) -> dict[str, bool]:
    """Whether each read of the Store port, and the admin's JSON view, still finds something
    of a session: its row, messages, summaries, whole log (superseded ones too), a message
    with ``word``, the answer to its tool call ``call_{session}``, a lock named ``held`` (a
    free one is taken and given back), the session by its name."""
    store, key = proxy.services.store, proxy.key(agent, session)
    snapshot = proxy.call(store.load(key, LoadSpec(limit=100_000)))
    token = proxy.call(store.acquire_lock(key, "held", 60))
    if token is not None:
        proxy.call(store.release_lock(key, "held", token))
    view = httpx.get(f"{proxy.base}/memory/{agent}/{session}", headers=ADMIN)
    return {
        "session": snapshot.exists,
        "messages": bool(snapshot.messages),
        "summaries": bool(snapshot.summaries),
        "log": bool(proxy.call(store.read_log(key, limit=100_000)).messages),
        "search": bool(proxy.call(store.search_messages(key, [word]))),
        "tool result": proxy.call(store.find_tool_result(key, f"call_{session}")) is not None,
        "lock": token is None,
        "by name": bool(proxy.call(store.find_sessions(agent, session))),
        "memory view": view.status_code != 404,
    }


def test_deleting_a_session_leaves_no_key_behind(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path
) -> None:
    write_agent(agents_dir, "del", llm={"model": "gpt-4o", "contextWindow": 2000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.3})
    proxy = make_proxy()
    # the doomed session is the newest: a store that numbers sessions may give its number
    # to the next one, which must not find anything of it
    for session in ("kept-2", "doomed-1"):
        proxy.drain()  # a background summary must not take the reply queued for a turn
        fake.queue(Reply.tool_calls([{"id": f"call_{session}", "name": "lookup",
                                      "arguments": {}}]))
        send(proxy, "del", session, say("start " + "words " * 400))
        send(proxy, "del", session, [{"role": "tool", "tool_call_id": f"call_{session}",
                                      "content": "result"}])
        send(proxy, "del", session, say("start " + "words " * 400))
    proxy.drain()
    key = proxy.key("del", "doomed-1")
    assert proxy.call(proxy.services.store.acquire_lock(key, "held", 60))
    before = traces(proxy, "del", "doomed-1", "start")
    assert all(before.values()), before  # a summary record and a lock to delete too

    response = httpx.delete(f"{proxy.base}/admin/api/agents/del/sessions/doomed-1",
                            headers=ADMIN)
    assert response.status_code == 200 and response.json()["deleted"] is True
    after = traces(proxy, "del", "doomed-1", "start")
    assert not any(after.values()), after
    listing = httpx.get(f"{proxy.base}/memory/del", headers=ADMIN).json()
    assert [s["session"] for s in listing["sessions"]] == ["kept-2"]
    assert len(proxy.stored("del", "kept-2")) >= 4  # the neighbour is untouched
    again = httpx.delete(f"{proxy.base}/admin/api/agents/del/sessions/doomed-1", headers=ADMIN)
    assert again.status_code == 404 and again.json()["error"]["code"] == "session_not_found"
    assert httpx.delete(f"{proxy.base}/admin/api/agents/del/sessions/kept-2").status_code == 401

    # the session started again on another replica begins from nothing, and this process
    # kept no upstream key of the deleted one: its Compact has none to summarize with
    replica = make_proxy()
    assert send(replica, "del", "doomed-1", say("a fresh start")).status_code == 200
    assert fake.chat_requests[-1].body["messages"] == say("a fresh start")
    started_again = proxy.snapshot("del", "doomed-1")
    assert [m.content for m in started_again.messages] == ["a fresh start", "ok: a fresh start"]
    assert started_again.summaries == []
    compact = httpx.post(f"{proxy.base}/admin/api/agents/del/sessions/doomed-1/compact",
                         headers=ADMIN)
    assert compact.status_code == 409, compact.text
    assert "no upstream credentials" in compact.json()["error"]["message"]


def test_deleting_a_session_reclaims_its_media_and_only_its_own(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path
) -> None:
    write_agent(agents_dir, "pics", llm={"model": "gpt-4o", "capabilities": ["image"]})
    proxy = make_proxy()
    picture = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", png(64, 64))}}]}]
    for session in ("doomed-pics", "kept-pics"):
        assert send(proxy, "pics", session, picture).status_code == 200
    digest = proxy.stored("pics", "doomed-pics")[0].meta["parts"][0]["digest"]
    store = proxy.services.store

    response = httpx.delete(f"{proxy.base}/admin/api/agents/pics/sessions/doomed-pics",
                            headers=ADMIN)

    assert response.status_code == 200
    assert proxy.call(store.get_parts(proxy.key("pics", "doomed-pics"), [digest])) == {}
    after = traces(proxy, "pics", "doomed-pics", "what")
    assert not any(after.values()), after
    kept = proxy.call(store.get_parts(proxy.key("pics", "kept-pics"), [digest]))
    assert list(kept) == [digest]


def test_a_session_id_shared_by_two_keys_is_deleted_only_by_namespace(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    send(proxy, "del", "twin", say("mine"), key="sk-one")
    send(proxy, "del", "twin", say("yours"), key="sk-two")
    url = f"{proxy.base}/admin/api/agents/del/sessions/twin"
    ambiguous = httpx.delete(url, headers=ADMIN)
    assert ambiguous.status_code == 409 and ambiguous.json()["error"]["param"] == "namespace"
    namespace = proxy.key("del", "twin", "sk-one").namespace
    assert httpx.delete(url, params={"namespace": namespace}, headers=ADMIN).status_code == 200
    assert proxy.stored("del", "twin", "sk-one") == []
    assert [m.content for m in proxy.stored("del", "twin", "sk-two")] == ["yours", "ok: yours"]


def test_summarizer_calls_per_session_are_bounded(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path,
    summaries: Summaries,
) -> None:
    summaries.text = None  # every summary fails, so every turn would plan another
    write_agent(agents_dir, "loop", llm={"model": "gpt-4o", "contextWindow": 1000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.2})
    proxy = make_proxy(summarizer_calls_per_hour=3)
    for turn in range(10):
        assert send(proxy, "loop", "s", say(f"turn {turn} " + "words " * 100)).status_code == 200
        proxy.drain()
    assert summaries.calls == 3
    send(proxy, "loop", "other", say("another session " + "words " * 300))
    proxy.drain()
    assert summaries.calls == 4  # the budget is per session
