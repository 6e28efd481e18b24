"""The admin JSON twins: agents, agent config save, session working memory, Compact."""

from __future__ import annotations

import pytest
from admin_support import BEARER, CLIENT_KEY, write_agent

from proxy.testing.fake_upstream import Reply
from strategies.config import SummarizingWindowConfig

PROTECTED = [
    ("GET", "/admin/api/agents"),
    ("GET", "/admin/api/agents/helper"),
    ("PUT", "/admin/api/agents/helper"),
    ("POST", "/admin/api/agents/helper"),
    ("DELETE", "/admin/api/agents/helper"),
    ("GET", "/admin/api/agents/helper/sessions/s1"),
    ("POST", "/admin/api/agents/helper/sessions/s1/compact"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize("token", [None, "wrong-token"], ids=["no-token", "wrong-token"])
async def test_every_json_twin_refuses_a_request_without_the_admin_token(
    proxy, method, path, token
):
    await proxy.chat("helper", "s1", "hi")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await proxy.client.request(
        method, path, headers=headers, json={"memoryConfig": {"kind": "none"}})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_the_client_api_key_is_not_an_admin_token(proxy):
    await proxy.chat("helper", "s1", "hi")
    response = await proxy.client.get(
        "/admin/api/agents", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert response.status_code == 401


async def test_agents_come_from_files_and_from_traffic_with_kind_and_session_counts(
    proxy, agents_dir
):
    write_agent(agents_dir, "planner", memoryConfig={"kind": "auto_compact"})
    proxy.services.agents.load()
    await proxy.chat("helper", "s1", "one")
    await proxy.chat("helper", "s2", "two")
    await proxy.chat("planner", "p1", "plan it")

    rows = {row["agent"]: row for row in (await proxy.api("GET", "/agents")).json()["agents"]}

    assert rows["helper"] | {"updated_at": None} == {
        "agent": "helper", "kind": "summarizing_window", "configured": False,
        "source": "default", "description": "", "in_files": False, "session_count": 2,
        "updated_at": None,
    }
    assert (rows["planner"]["kind"], rows["planner"]["source"]) == ("auto_compact", "file")
    assert rows["planner"]["session_count"] == 1


async def test_an_agent_known_only_from_its_file_is_listed_with_no_sessions(proxy, agents_dir):
    write_agent(agents_dir, "quiet", memoryConfig={"kind": "windowed", "windowSize": 4})
    proxy.services.agents.load()
    rows = (await proxy.api("GET", "/agents")).json()["agents"]
    assert [(r["agent"], r["kind"], r["session_count"]) for r in rows] == [
        ("quiet", "windowed", 0)]


async def test_a_rejected_agent_file_is_reported(proxy, agents_dir):
    (agents_dir / "broken.json").write_text('{"name": "broken", "memoryConfig": {"kind": "x"}}')
    proxy.services.agents.load()
    errors = (await proxy.api("GET", "/agents")).json()["file_errors"]
    assert "memoryConfig.kind" in errors["broken.json"]


async def test_an_unconfigured_agent_shows_the_defaults_it_runs_with(proxy):
    await proxy.chat("helper", "s1", "hi")
    detail = (await proxy.api("GET", "/agents/helper")).json()
    assert detail["kind"] == "summarizing_window"
    assert detail["configured"] is False
    assert detail["config"] == SummarizingWindowConfig().to_dict()
    assert [s["session"] for s in detail["sessions"]] == ["s1"]


async def test_a_saved_config_is_stored_as_the_full_definition_and_wins_over_the_file(
    proxy, agents_dir
):
    write_agent(agents_dir, "research", description="digs", llm={"model": "gpt-4o"},
                memoryConfig={"kind": "auto_compact"},
                tools=[{"name": "web_search", "maxResultChars": 2000}])
    proxy.services.agents.load()

    response = await proxy.api("PUT", "/agents/research", json={
        "memoryConfig": {"kind": "windowed", "windowSize": 7},
        "llm": {"contextWindow": 9000}, "historyMode": "delta"})

    assert response.status_code == 200, response.text
    detail = response.json()
    assert (detail["kind"], detail["source"], detail["configured"]) == ("windowed", "store", True)
    assert detail["config"] == {"kind": "windowed", "windowSize": 7, "windowStep": 1}
    assert detail["context_window"] == 9000
    assert await proxy.services.store.get_agent_config("research") == {
        "name": "research", "description": "digs",
        "llm": {"model": "gpt-4o", "contextWindow": 9000},
        "memoryConfig": {"kind": "windowed", "windowSize": 7},
        "tools": [{"name": "web_search", "maxResultChars": 2000}],
        "historyMode": "delta",
    }


async def test_leaving_out_memory_config_keeps_the_stored_setting(proxy):
    await proxy.api("PUT", "/agents/helper", json={"memoryConfig": {"kind": "none"}})
    response = await proxy.api("POST", "/agents/helper", json={"description": "new words"})
    assert response.json()["kind"] == "none"
    assert response.json()["definition"]["description"] == "new words"


async def test_a_null_memory_config_returns_the_agent_to_the_defaults(proxy):
    await proxy.api("PUT", "/agents/helper", json={"memoryConfig": {"kind": "none"}})
    detail = (await proxy.api("PUT", "/agents/helper", json={"memoryConfig": None})).json()
    assert (detail["kind"], detail["configured"]) == ("summarizing_window", False)


async def test_deleting_the_override_brings_back_the_file_definition(proxy, agents_dir):
    write_agent(agents_dir, "planner", memoryConfig={"kind": "auto_compact"})
    proxy.services.agents.load()
    await proxy.api("PUT", "/agents/planner", json={"memoryConfig": {"kind": "full"}})
    detail = (await proxy.api("DELETE", "/agents/planner")).json()
    assert (detail["kind"], detail["source"]) == ("auto_compact", "file")
    assert await proxy.services.store.get_agent_config("planner") is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"memoryConfig": {"kind": "windowed", "windowSize": 0}},
                     "memoryConfig.windowSize", id="out-of-range"),
        pytest.param({"memoryConfig": {"kind": "windowed", "windowSize": "20"}},
                     "memoryConfig.windowSize", id="wrong-type"),
        pytest.param({"memoryConfig": {"kind": "summarizing_window", "maxRatio": 0.5}},
                     "memoryConfig.maxRatio", id="unknown-field"),
        pytest.param({"memoryConfig": {"kind": "sliding"}}, "memoryConfig.kind",
                     id="unknown-kind"),
        pytest.param({"memoryConfig": {"kind": "auto_compact",
                                       "toolResultEviction": {"afterTurns": 0}}},
                     "memoryConfig.toolResultEviction.afterTurns", id="nested"),
        pytest.param({"memoryConfig": "windowed"}, "memoryConfig", id="not-an-object"),
    ],
)
async def test_a_config_that_breaks_the_schema_is_rejected_naming_the_field(proxy, body, field):
    await proxy.api("PUT", "/agents/helper", json={"memoryConfig": {"kind": "none"}})
    response = await proxy.api("PUT", "/agents/helper", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (field, "invalid_memory_config")
    assert field in error["message"]
    assert (await proxy.services.store.get_agent_config("helper"))["memoryConfig"] == {
        "kind": "none"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"llm": {"contextWindow": -5}}, "llm.contextWindow", id="context-window"),
        pytest.param({"historyMode": "sometimes"}, "historyMode", id="history-mode"),
        pytest.param({"colour": "blue"}, "colour", id="unknown-field"),
        pytest.param({"name": "someone-else"}, "name", id="renaming"),
    ],
)
async def test_a_definition_that_breaks_the_schema_is_rejected_naming_the_field(
    proxy, body, field
):
    response = await proxy.api("PUT", "/agents/helper", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_body_that_is_not_json_is_rejected(proxy):
    response = await proxy.api("PUT", "/agents/helper", content=b'{"memoryConfig": {',
                               headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


async def test_a_save_must_be_sent_as_json(proxy):
    response = await proxy.api("POST", "/agents/helper",
                               content=b'{"memoryConfig": {"kind": "none"}}',
                               headers={"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_save_from_another_site_is_refused(proxy):
    response = await proxy.api("PUT", "/agents/helper", json={"memoryConfig": {"kind": "none"}},
                               headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_saved_config_takes_effect_on_the_next_turn(proxy, fake):
    for n in range(3):
        await proxy.chat("helper", "s1", f"message {n}")
    assert len(fake.chat_requests[-1].body["messages"]) == 6  # system + 5

    await proxy.api("PUT", "/agents/helper",
                    json={"memoryConfig": {"kind": "windowed", "windowSize": 3}})
    response = await proxy.chat("helper", "s1", "message 3")

    assert response.headers["x-memory-strategy"] == "windowed"
    assert [m["content"] for m in fake.chat_requests[-1].body["messages"]] == [
        "Be brief.", "message 2", "ok: message 2", "message 3"]


async def test_the_json_session_view_is_the_memory_endpoint_view(proxy):
    await proxy.chat("helper", "s1", "first")
    await proxy.chat("helper", "s1", "second")
    admin = (await proxy.api("GET", "/agents/helper/sessions/s1")).json()
    memory = (await proxy.client.get("/memory/helper/s1", headers=BEARER)).json()
    assert admin == memory
    assert [(m["role"], m["text"]) for m in admin["messages"]] == [
        ("system", "Be brief."), ("user", "first"), ("assistant", "ok: first"),
        ("user", "second"), ("assistant", "ok: second")]
    assert all(m["tokens"] > 0 for m in admin["messages"])
    assert admin["totals"]["messages_sent"] == 4


async def test_sessions_with_one_id_under_two_api_keys_are_told_apart_by_namespace(proxy):
    await proxy.chat("helper", "shared", "from the first key")
    await proxy.chat("helper", "shared", "from the second key", api_key="sk-other-client")
    sessions = (await proxy.api("GET", "/agents/helper")).json()["sessions"]
    texts = set()
    for session in sessions:
        view = (await proxy.api("GET", "/agents/helper/sessions/shared",
                                params={"namespace": session["namespace"]})).json()
        texts.add(view["messages"][1]["text"])
    assert texts == {"from the first key", "from the second key"}


async def test_an_unknown_session_is_not_found(proxy):
    response = await proxy.api("GET", "/agents/helper/sessions/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"


async def small_window_agent(proxy, agents_dir, name: str, memory: dict) -> None:
    write_agent(agents_dir, name, llm={"model": "gpt-4o", "contextWindow": 2000},
                memoryConfig=memory)
    proxy.services.agents.load()
    for n in range(4):
        await proxy.chat(name, "long", f"question {n}: " + "why do windows slide? " * 30)


async def test_compact_summarizes_a_summarizing_window_session(proxy, fake, agents_dir):
    await small_window_agent(proxy, agents_dir, "sw", {"kind": "summarizing_window"})
    before = (await proxy.api("GET", "/agents/sw/sessions/long")).json()
    fake.queue(Reply.text("The user asked why windows slide, three times."))

    response = await proxy.api("POST", "/agents/sw/sessions/long/compact")

    assert response.status_code == 200, response.text
    result = response.json()
    assert result["noop"] is False
    assert [(s["kind"], s["from_seq"], s["to_seq"]) for s in result["summaries"]] == [
        ("summary", 1, 6)]
    after = result["memory"]
    assert after["summaries"][0]["text"] == "The user asked why windows slide, three times."
    assert after["summaries"][0]["sent"] is True
    assert after["totals"]["messages_sent"] < before["totals"]["messages_sent"]
    assert after["totals"]["window_tokens"] < before["totals"]["window_tokens"]
    summarizer_prompt = str(fake.chat_requests[-1].body["messages"])
    assert "question 0" in summarizer_prompt


async def test_compact_runs_a_full_compaction_for_auto_compact(proxy, fake, agents_dir):
    await small_window_agent(proxy, agents_dir, "ac", {"kind": "auto_compact",
                                                        "compactAtRatio": 0.99})
    fake.queue(Reply.text("Everything so far, in one summary."))
    result = (await proxy.api("POST", "/agents/ac/sessions/long/compact")).json()
    assert [s["kind"] for s in result["summaries"]] == ["compaction"]
    assert result["memory"]["totals"]["messages_sent"] < 8


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        ({"kind": "windowed", "windowSize": 4}, "windowed never compresses"),
        ({"kind": "full"}, "full"),
        ({"kind": "none"}, "none"),
    ],
    ids=["windowed", "full", "none"],
)
async def test_compact_does_nothing_for_strategies_that_never_compress(
    proxy, fake, agents_dir, memory, message
):
    await small_window_agent(proxy, agents_dir, "plain", memory)
    calls = len(fake.chat_requests)
    before = (await proxy.api("GET", "/agents/plain/sessions/long")).json()

    result = (await proxy.api("POST", "/agents/plain/sessions/long/compact")).json()

    assert result["noop"] is True
    assert message in result["message"]
    assert result["summaries"] == []
    assert len(fake.chat_requests) == calls
    assert result["memory"]["totals"] == before["totals"]
