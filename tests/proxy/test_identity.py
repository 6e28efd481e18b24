"""Agent and session identification, in DESIGN.md's priority order, and key namespaces."""

from __future__ import annotations

import httpx
import pytest
from e2e import CLIENT_KEY, write_agent

from proxy.errors import BadRequest
from proxy.turn.identity import identify, namespace_for

USER = [{"role": "user", "content": "hello"}]


def ident(path=None, headers=None, body=None, key="k", system=(), conversation=USER):
    return identify(
        path_params=path or {},
        headers=headers or {},
        body=body or {},
        api_key=key,
        system=list(system),
        conversation=list(conversation),
    )


@pytest.mark.parametrize(
    "path, headers, body, expected",
    [
        pytest.param(
            {"agent": "pa", "session": "ps"},
            {"x-agent-id": "ha", "x-session-id": "hs"},
            {"metadata": {"agent_id": "ma", "session_id": "ms"}, "user": "u"},
            ("pa", "ps", "path"),
            id="path-wins",
        ),
        pytest.param(
            {},
            {"x-agent-id": "ha", "x-session-id": "hs"},
            {"metadata": {"agent_id": "ma", "session_id": "ms"}, "user": "u"},
            ("ha", "hs", "header"),
            id="headers-next",
        ),
        pytest.param(
            {},
            {"x-session-affinity": "aff"},
            {},
            ("default", "aff", "header"),
            id="session-affinity-header",
        ),
        pytest.param(
            {},
            {},
            {"metadata": {"agent_id": "ma", "session_id": "ms"}, "user": "u"},
            ("ma", "ms", "metadata"),
            id="metadata-next",
        ),
        pytest.param(
            {},
            {"x-claude-code-session-id": "3f1c2a9e-77d4-4e0b-9a51-0c3d2b1a0f00",
             "session_id": "codex"},
            {"metadata": {"session_id": "ms"}},
            ("default", "3f1c2a9e-77d4-4e0b-9a51-0c3d2b1a0f00", "header"),
            id="claude-code-header-before-codex-and-body",
        ),
        pytest.param({}, {"session-id": "cx-1", "x-opencode-session": "oc"}, {},
                     ("default", "cx-1", "header"), id="codex-header"),
        pytest.param({}, {"session_id": "cx-2"}, {}, ("default", "cx-2", "header"),
                     id="codex-underscore-header"),
        pytest.param({}, {"x-opencode-session": "ses_9"}, {"prompt_cache_key": "pk"},
                     ("default", "ses_9", "header"), id="opencode-header-before-body"),
        pytest.param({}, {}, {"metadata": {"session_id": "ms"}, "prompt_cache_key": "pk"},
                     ("default", "ms", "metadata"), id="metadata-before-prompt-cache-key"),
        pytest.param({}, {}, {"prompt_cache_key": "pk-1", "user": "u"},
                     ("default", "pk-1", "prompt_cache_key"), id="prompt-cache-key"),
        pytest.param({}, {}, {"user": "u-42"}, ("default", None, "fingerprint"),
                     id="user-is-not-a-session-by-default"),
        pytest.param({"agent": "pa"}, {}, {}, ("pa", None, "fingerprint"), id="fingerprint-last"),
    ],
)
def test_identification_follows_the_priority_order(path, headers, body, expected):
    identity = ident(path, headers, body)
    agent, session, source = expected
    assert (identity.agent, identity.source) == (agent, source)
    if session is not None:
        assert identity.session == session


def test_the_user_field_keys_sessions_only_for_an_agent_that_opts_in():
    def opted(agent: str) -> bool:
        return agent == "support"

    body = {"user": "u-42"}
    chosen = identify(path_params={"agent": "support"}, headers={}, body=body, api_key="k",
                      system=[], conversation=USER, user_as_session=opted)
    assert (chosen.session, chosen.source) == ("u-42", "user")
    other = identify(path_params={"agent": "other"}, headers={}, body=body, api_key="k",
                     system=[], conversation=USER, user_as_session=opted)
    assert other.source == "fingerprint"


def test_an_id_an_agent_sends_for_itself_is_never_refused():
    odd = "conversation/42 with spaces"
    first = ident(headers={"x-claude-code-session-id": odd})
    assert first.source == "header" and first.session.startswith("h-")
    assert ident(headers={"x-claude-code-session-id": odd}).session == first.session
    assert ident(body={"prompt_cache_key": odd}).session == first.session
    with pytest.raises(BadRequest):
        ident(headers={"x-session-id": odd})  # ours: a malformed one is the client's error


def test_the_fingerprint_depends_on_agent_system_prompt_and_first_user_message():
    base = ident({"agent": "a"}, system=[{"role": "system", "content": "S"}])
    same = ident(
        {"agent": "a"},
        system=[{"role": "system", "content": "S"}],
        conversation=[
            *USER,
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "later"},
        ],
    )
    assert base.session == same.session
    assert (
        ident({"agent": "b"}, system=[{"role": "system", "content": "S"}]).session != base.session
    )
    assert (
        ident({"agent": "a"}, system=[{"role": "system", "content": "T"}]).session != base.session
    )
    assert (
        ident(
            {"agent": "a"},
            system=[{"role": "system", "content": "S"}],
            conversation=[{"role": "user", "content": "other"}],
        ).session
        != base.session
    )


def test_the_namespace_is_a_hash_of_the_key_and_never_the_key():
    assert namespace_for("sk-secret") == namespace_for("sk-secret")
    assert namespace_for("sk-secret") != namespace_for("sk-other")
    assert "sk-secret" not in namespace_for("sk-secret")
    assert namespace_for(None) == "anon"


@pytest.mark.parametrize("bad", ["a/b", "{tag}", "x" * 129, "spa ce", "ü"])
def test_malformed_identifiers_are_rejected(bad):
    with pytest.raises(BadRequest):
        ident(headers={"x-session-id": bad})


def post(proxy, path="/v1", *, messages=USER, headers=None, key=CLIENT_KEY, **body):
    return httpx.post(
        f"{proxy.base}{path}/chat/completions",
        json={"model": "gpt-4o", "messages": messages, **body},
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    )


def test_each_identification_form_reaches_its_session(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "by-user", userAsSession=True)
    proxy = make_proxy()
    post(proxy, "/agents/pa/sessions/ps/v1")
    post(proxy, headers={"X-Agent-Id": "ha", "X-Session-Id": "hs"})
    post(proxy, metadata={"agent_id": "ma", "session_id": "ms"})
    post(proxy, headers={"X-Claude-Code-Session-Id": "cc-1"})
    post(proxy, headers={"session_id": "codex-1"})
    post(proxy, prompt_cache_key="pck-1")
    post(proxy, "/agents/by-user/v1", user="u-1")
    reply = post(proxy, user="u-2")
    assert len(proxy.stored("pa", "ps")) == 2
    assert len(proxy.stored("ha", "hs")) == 2
    assert len(proxy.stored("ma", "ms")) == 2
    assert len(proxy.stored("default", "cc-1")) == 2
    assert len(proxy.stored("default", "codex-1")) == 2
    assert len(proxy.stored("default", "pck-1")) == 2
    assert len(proxy.stored("by-user", "u-1")) == 2
    # without the opt-in, a person's id is not a conversation
    assert reply.headers["x-memory-session"].startswith("fp-")
    assert proxy.stored("default", "u-2") == []
    # our metadata keys are not forwarded (providers reject unknown metadata without store)
    assert all("metadata" not in r.body for r in fake.chat_requests)
    assert fake.chat_requests[5].body["prompt_cache_key"] == "pck-1"
    assert fake.chat_requests[6].body["user"] == "u-1"


def test_a_full_history_client_without_session_id_continues_by_fingerprint(proxy, fake):
    first = post(proxy, "/agents/fp/v1", messages=USER)
    session = first.headers["x-memory-session"]
    assert session.startswith("fp-")
    answer = first.json()["choices"][0]["message"]["content"]
    again = post(
        proxy,
        "/agents/fp/v1",
        messages=[
            *USER,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "more"},
        ],
    )
    assert again.headers["x-memory-session"] == session
    second = again.json()["choices"][0]["message"]["content"]
    assert [m.content for m in proxy.stored("fp", session)] == ["hello", answer, "more", second]


def test_memory_off_is_a_plain_pass_through(proxy, fake):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    response = post(
        proxy,
        "/agents/off/sessions/s/v1",
        messages=messages,
        headers={"X-Memory": "off"},
        metadata={"agent_id": "x"},
    )
    assert response.status_code == 200
    assert "x-memory-session" not in response.headers
    assert fake.chat_requests[-1].body["messages"] == messages
    assert proxy.stored("off", "s") == []


def test_two_keys_with_the_same_session_id_never_share_a_session(proxy, fake):
    post(
        proxy,
        "/agents/t/sessions/same/v1",
        key="sk-alice",
        messages=[{"role": "user", "content": "alice secret"}],
    )
    post(
        proxy,
        "/agents/t/sessions/same/v1",
        key="sk-bob",
        messages=[{"role": "user", "content": "bob asks"}],
    )
    bob_saw = fake.chat_requests[-1].body["messages"]
    assert all("alice" not in str(m["content"]) for m in bob_saw)
    assert next(m.content for m in proxy.stored("t", "same", api_key="sk-alice")) == "alice secret"
    assert next(m.content for m in proxy.stored("t", "same", api_key="sk-bob")) == "bob asks"
