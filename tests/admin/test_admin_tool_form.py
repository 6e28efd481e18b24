"""The agent form's tool references: each sets "Max result chars" (``maxResultChars``),
validated, saved in the stored override like the Memory (JSON) field; and the same
through the JSON twin."""

from __future__ import annotations

import re

import pytest
from admin_support import CLIENT_KEY, write_agent

from proxy.turn.identity import namespace_for
from strategies.records import LoadSpec, SessionKey

TOOLS = [{"name": "web_search", "maxResultChars": 2000, "description": "searches the web"},
         {"name": "fetch_tool_result"}]


@pytest.fixture
def research(proxy, agents_dir):
    write_agent(agents_dir, "research", memoryConfig={"kind": "windowed"}, tools=TOOLS)
    proxy.services.agents.load()
    return proxy


async def save(proxy, **limits: str):
    """Post the prefilled form with the given ``tool_max_<i>`` values."""
    page = (await proxy.client.get("/admin/agents/research/edit")).text
    fields = dict(re.findall(r'name="([a-z_0-9]+)" (?:type="[a-z]+" )?value="([^"]*)"', page))
    fields.update(re.findall(r'<input type="hidden" name="([a-z_0-9]+)" value="([^"]*)"', page))
    data = {**fields, "history_mode": "auto", "memory": "", **limits}
    return await proxy.client.post("/admin/agents/research/edit", data=data)


async def test_the_form_shows_each_tool_with_its_max_result_chars(research):
    await research.sign_in()
    page = (await research.client.get("/admin/agents/research/edit")).text
    assert re.search(r'<input id="tool_max_0" name="tool_max_0"[^>]*value="2000"', page)
    assert re.search(r'<input id="tool_max_1" name="tool_max_1"[^>]*value=""', page)
    assert page.count("Max result chars") >= 2
    assert 'name="tool_name_1" value="fetch_tool_result"' in page


async def test_saving_a_limit_stores_it_and_keeps_the_rest_of_each_tool(research):
    await research.sign_in()
    response = await save(research, tool_max_0="", tool_max_1="12,000")
    assert response.status_code == 303, response.text
    stored = await research.services.store.get_agent_config("research")
    assert stored["tools"] == [{"name": "web_search", "description": "searches the web"},
                               {"name": "fetch_tool_result", "maxResultChars": 12000}]
    detail = (await research.api("GET", "/agents/research")).json()
    assert detail["definition"]["tools"] == stored["tools"]
    page = (await research.client.get("/admin/agents/research/edit")).text
    assert re.search(r'<input id="tool_max_1"[^>]*value="12000"', page)


async def test_the_saved_limit_cuts_the_next_tool_result(research):
    await research.sign_in()
    assert (await save(research, tool_max_0="50")).status_code == 303
    call = {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}}
    messages = [{"role": "user", "content": "search"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "x" * 500}]
    response = await research.client.post(
        "/agents/research/sessions/s/v1/chat/completions",
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        json={"model": "gpt-4o", "messages": messages})
    assert response.status_code == 200, response.text
    snapshot = await research.services.store.load(
        SessionKey(namespace_for(CLIENT_KEY), "research", "s"), LoadSpec())
    tool = next(m for m in snapshot.messages if m.role == "tool")
    assert tool.content.startswith("x" * 50) and "x" * 51 not in tool.content


@pytest.mark.parametrize("typed", ["0", "-5", "lots", "1.5"])
async def test_a_bad_limit_is_rejected_naming_the_tool_and_keeping_the_text(research, typed):
    await research.sign_in()
    response = await save(research, tool_max_1=typed)
    assert response.status_code == 400
    assert "tools.1.maxResultChars" in response.text
    assert "Max result chars of fetch_tool_result" in response.text
    assert re.search(r'<input id="tool_max_1"[^>]*value="' + re.escape(typed)
                     + r'"[^>]*aria-invalid="true"', response.text)
    assert await research.services.store.get_agent_config("research") is None


async def test_the_json_twin_saves_and_validates_max_result_chars(research):
    bad = await research.api("PUT", "/agents/research", json={
        "tools": [{"name": "web_search", "maxResultChars": 0}]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tools.0.maxResultChars"
    good = await research.api("PUT", "/agents/research", json={
        "tools": [{"name": "web_search", "maxResultChars": 300}]})
    assert good.status_code == 200
    assert good.json()["definition"]["tools"] == [{"name": "web_search", "maxResultChars": 300}]
