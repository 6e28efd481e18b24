"""The session's Transcript view and its JSON twin: every stored message, paged, with
compaction points, compressed and superseded items marked, and the JSON lines export."""

from __future__ import annotations

import orjson
from admin_support import BEARER, CLIENT_KEY
from markupsafe import escape

from proxy.turn.identity import namespace_for
from strategies.records import SessionKey, SummaryRecord

PAGE = "/admin/agents/helper/sessions/s1/transcript"


async def recorded(proxy, turns: int = 3) -> SessionKey:
    for n in range(turns):
        await proxy.chat("helper", "s1", f"question {n} <b>bold</b>")
    key = SessionKey(namespace_for(CLIENT_KEY), "helper", "s1")
    await proxy.services.store.set_compressed(key, {2: "[stub of answer 0]"})
    await proxy.services.store.add_summary(
        key, SummaryRecord("compaction", "two questions so far", 1, 4))
    return key


async def test_the_twin_lists_every_stored_message_with_markers(proxy):
    await recorded(proxy)
    data = (await proxy.api("GET", "/agents/helper/sessions/s1/transcript")).json()
    assert [m["seq"] for m in data["messages"]] == [1, 2, 3, 4, 5, 6]
    assert data["messages"][1]["compressed_content"] == "[stub of answer 0]"
    assert [m["compacted"] for m in data["messages"]] == [True] * 4 + [False] * 2
    assert [s["kind"] for s in data["summaries"]] == ["compaction"]


async def test_the_page_shows_the_originals_stubs_and_the_compaction_point(proxy):
    await recorded(proxy)
    data = (await proxy.api("GET", "/agents/helper/sessions/s1/transcript")).json()
    response = await proxy.client.get(PAGE, headers=BEARER)
    assert response.status_code == 200
    page = response.text
    for message in data["messages"]:
        assert f'data-seq="{message["seq"]}"' in page
        assert str(escape(message["text"])) in page
    assert "<b>bold</b>" not in page
    assert page.count('class="badge marker marker-compressed">compressed<') == 1
    assert "[stub of answer 0]" in page
    point = page.index('class="compaction-point"')
    assert page.index('data-seq="4"') < point < page.index('data-seq="5"')
    assert 'data-to-seq="4"' in page
    assert "/admin/agents/helper/sessions/s1/transcript" in (
        await proxy.client.get("/admin/agents/helper/sessions/s1", headers=BEARER)).text


async def test_the_page_is_paged_with_a_next_link(proxy):
    await recorded(proxy)
    first = (await proxy.client.get(PAGE + "?limit=4", headers=BEARER)).text
    assert 'data-seq="4"' in first and 'data-seq="5"' not in first
    assert 'id="next-page"' in first and "after=4" in first
    second = (await proxy.client.get(PAGE + "?limit=4&after=4", headers=BEARER)).text
    assert 'data-seq="5"' in second and 'data-seq="4"' not in second
    assert 'id="next-page"' not in second and 'id="first-page"' in second


async def test_the_twin_exports_json_lines(proxy):
    await recorded(proxy)
    response = await proxy.api("GET", "/agents/helper/sessions/s1/transcript",
                               params={"format": "jsonl"})
    assert response.status_code == 200
    lines = [orjson.loads(line) for line in response.text.splitlines()]
    assert [line["type"] for line in lines] == ["session"] + ["message"] * 4 + ["summary"] + [
        "message"] * 2


async def test_a_bad_page_parameter_is_a_400_in_the_twin(proxy):
    await recorded(proxy, turns=1)
    response = await proxy.api("GET", "/agents/helper/sessions/s1/transcript",
                               params={"limit": "5000"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "limit"
