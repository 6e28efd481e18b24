"""Strings a client chooses cannot grow the proxy's memory: identifier-like fields past
256 characters are a 400 naming the field (nothing sent upstream, nothing stored), the
caches keyed by such strings never remember a longer one, the session cache counts ids
and keys in its estimate, and the optional request limits answer with their own 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e import CLIENT_KEY, RunningProxy
from reliability_support import is_openai_error, report

from proxy import model_info
from proxy.http.limits import MAX_IDENTIFIER_CHARS
from proxy.testing.fake_upstream import FakeUpstream
from proxy.turn.identity import namespace_for
from storage.cached import CachedStore
from strategies import tokens
from strategies.records import LoadSpec, SessionKey, SessionMeta, SessionSnapshot, StoredMessage

AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
LONG = "x" * (MAX_IDENTIFIER_CHARS + 1)
HUGE = "y" * (1 << 20)
USER = {"role": "user", "content": "hi"}


def call(call_id: str = "c1", name: str = "lookup") -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def tool_turn(call_id: str = "c1", name: str = "lookup") -> list[dict[str, object]]:
    return [USER, {"role": "assistant", "content": None, "tool_calls": [call(call_id, name)]},
            {"role": "tool", "tool_call_id": call_id, "content": "42"}]


def tools(name: str) -> list[dict[str, object]]:
    return [{"type": "function", "function": {"name": name, "parameters": {}}}]


OVERSIZE = [
    pytest.param({"model": LONG, "messages": [USER]}, "model", id="model"),
    pytest.param({"model": HUGE, "messages": [USER]}, "model", id="model-1MB"),
    pytest.param({"messages": [{**USER, "name": HUGE}]}, "messages[0].name", id="name"),
    pytest.param({"messages": tool_turn(call_id=LONG)}, "messages[1].tool_calls[0].id",
                 id="tool-call-id"),
    pytest.param({"messages": tool_turn(name=LONG)}, "messages[1].tool_calls[0].function.name",
                 id="tool-call-name"),
    pytest.param({"messages": [USER], "tools": tools(HUGE)}, "tools[0].function.name",
                 id="tool-definition-name"),
]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.mark.parametrize("body, param", OVERSIZE)
def test_an_oversize_identifier_is_a_400_naming_the_field(
    proxy: RunningProxy, fake: FakeUpstream, body: dict[str, object], param: str
) -> None:
    for stream in (False, True):
        response = httpx.post(f"{proxy.url('a', 's')}/chat/completions", headers=AUTH,
                              json={"model": "gpt-4o", **body, "stream": stream}, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()
        assert is_openai_error(error)
        assert error["error"]["param"] == param
        assert error["error"]["code"] == "string_above_max_length"
    assert fake.chat_requests == []
    assert proxy.stored("a", "s") == []


def test_identifiers_at_the_bound_still_pass(proxy: RunningProxy, fake: FakeUpstream) -> None:
    at_bound = "z" * MAX_IDENTIFIER_CHARS
    response = httpx.post(f"{proxy.url('a', 's')}/chat/completions", headers=AUTH, json={
        "model": "gpt-4o", "messages": [{**USER, "name": at_bound}], "tools": tools(at_bound)},
        timeout=30)
    assert response.status_code == 200, response.text


CACHES: list[tuple[str, Callable[..., object], Callable[[str], tuple[object, ...]]]] = [
    ("encoding_for_model", tokens.encoding_for_model, lambda s: (s,)),
    ("cached_counter", tokens.cached_counter, lambda s: (s,)),
    ("get_model_info", model_info.get_model_info, lambda s: (s,)),
    ("namespace_for", namespace_for, lambda s: (s,)),
]


@pytest.mark.parametrize("name, cached, args", CACHES, ids=[c[0] for c in CACHES])
def test_caches_keyed_by_client_strings_never_remember_a_long_one(
    name: str, cached: Callable[..., object], args: Callable[[str], tuple[object, ...]]
) -> None:
    before = cached.cache_info().currsize  # type: ignore[attr-defined]
    for n in range(50):
        cached(*args(f"{n}-" + "m" * 100_000))
    assert cached.cache_info().currsize == before  # type: ignore[attr-defined]
    # what its keys can hold: maxsize strings of at most the identifier bound
    assert cached.key_chars_bound == (  # type: ignore[attr-defined]
        cached.cache_info().maxsize * MAX_IDENTIFIER_CHARS)  # type: ignore[attr-defined]


def test_token_counts_of_long_names_and_models_are_right_but_not_remembered() -> None:
    message = {"role": "assistant", "name": "n" * 5000, "content": "hi",
               "tool_calls": [call(name="f" * 5000)]}
    assert tokens.count_message(message, "m" * 5000) == tokens.count_message(
        message, "gpt-3.5-turbo")


def snapshot_of(*messages: StoredMessage) -> SessionSnapshot:
    return SessionSnapshot(SessionMeta(head_seq=len(messages), version=1), list(messages), [],
                           exists=True)


class OneSnapshot:
    """A store whose every session is ``messages`` (enough of the port for the cache)."""

    def __init__(self, messages: list[StoredMessage]) -> None:
        self.messages = messages

    async def load(
        self, key: SessionKey, spec: LoadSpec, *, probe: object = (), held_version: object = None
    ) -> SessionSnapshot:
        return snapshot_of(*self.messages)


def test_the_session_cache_counts_ids_names_and_key_strings() -> None:
    spec = LoadSpec(limit=500)

    def held(session: str, call_id: str, name: str | None = None) -> int:
        messages = [
            StoredMessage("assistant", None, tokens=5, seq=1, tool_calls=[call(call_id)]),
            StoredMessage("tool", "42", tokens=3, seq=2, tool_call_id=call_id, name=name),
        ]
        cache = CachedStore(OneSnapshot(messages), max_bytes=1 << 20)  # type: ignore[arg-type]
        asyncio.run(cache.load(SessionKey("ns", "agent", session), spec))
        return cache.size

    short = held("s", "c")
    assert held("s" * 128, "c") - short >= 127
    assert held("s", "c" * 256) - short >= 2 * 255
    assert held("s", "c", name="n" * 256) - short >= 256


def test_many_turns_with_long_models_do_not_grow_the_caches(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    sizes = [tokens.encoding_for_model.cache_info().currsize,  # type: ignore[attr-defined]
             model_info.get_model_info.cache_info().currsize]  # type: ignore[attr-defined]
    refused = 0
    with httpx.Client(timeout=30, headers=AUTH) as client:
        for n in range(20):
            response = client.post(f"{proxy.url('a', f's{n}')}/chat/completions", json={
                "model": f"{n}-" + "m" * 1_000_000, "messages": [USER]})
            refused += response.status_code == 400
    assert refused == 20 and fake.chat_requests == []
    assert [tokens.encoding_for_model.cache_info().currsize,  # type: ignore[attr-defined]
            model_info.get_model_info.cache_info().currsize] == sizes  # type: ignore[attr-defined]
    report("long model strings", turns=20, model_bytes=1_000_000, refused=refused,
           cache_growth=0)


def test_the_optional_request_limits_answer_with_their_own_4xx(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream
) -> None:
    proxy = make_proxy(max_messages_per_request=3, max_forwarded_header_bytes=300)
    url = f"{proxy.url('a', 's')}/chat/completions"
    many = httpx.post(url, headers=AUTH, json={"model": "gpt-4o", "messages": [USER] * 4})
    assert many.status_code == 400 and is_openai_error(many.json())
    assert (many.json()["error"]["param"], many.json()["error"]["code"]) == (
        "messages", "too_many_messages")
    big = httpx.post(url, headers={**AUTH, "OpenAI-Beta": "b" * 300},
                     json={"model": "gpt-4o", "messages": [USER]})
    assert big.status_code == 431 and is_openai_error(big.json())
    assert big.json()["error"]["code"] == "request_headers_too_large"
    assert fake.chat_requests == []
    fine = httpx.post(url, headers=AUTH, json={"model": "gpt-4o", "messages": [USER] * 3})
    assert fine.status_code == 200, fine.text


def test_a_key_past_its_session_limit_gets_a_403_and_its_sessions_go_on(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream
) -> None:
    proxy = make_proxy(max_sessions_per_key=2)

    def turn(session: str, key: str = CLIENT_KEY) -> httpx.Response:
        return httpx.post(f"{proxy.url('a', session)}/chat/completions",
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": "gpt-4o", "messages": [USER]}, timeout=30)

    assert turn("s1").status_code == 200 and turn("s2").status_code == 200
    refused = turn("s3")
    assert refused.status_code == 403 and is_openai_error(refused.json())
    assert refused.json()["error"]["code"] == "too_many_sessions"
    assert proxy.stored("a", "s3") == []
    assert turn("s1").status_code == 200  # an existing session goes on
    assert turn("s3", key="sk-another-client").status_code == 200  # another key's own count
