"""The admin HTML pages over HTTP: login, CSRF, headers, the edit form, the session view."""

from __future__ import annotations

import html
import json
import re

import httpx
import pytest
from admin_support import ADMIN_TOKEN, BEARER, CSP, csrf_token_in, write_agent
from markupsafe import escape

from proxy.testing.fake_upstream import Reply
from strategies.config import SummarizingWindowConfig

PAGES = [
    "/admin/",
    "/admin/agents/helper",
    "/admin/agents/helper/edit",
    "/admin/agents/helper/sessions/s1",
    "/admin/agents/helper/sessions/s1/transcript",
]


def textarea(page: str) -> str:
    match = re.search(r'<textarea id="memory"[^>]*>(.*?)</textarea>', page, re.S)
    assert match, "no Memory (JSON) field"
    return html.unescape(match.group(1))


def assert_security_headers(response: httpx.Response) -> None:
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


@pytest.mark.parametrize("path", PAGES)
async def test_a_page_without_the_admin_token_answers_401_with_the_login_form(proxy, path):
    await proxy.chat("helper", "s1", "secret plans")
    response = await proxy.client.get(path)
    assert response.status_code == 401
    assert 'action="/admin/login"' in response.text
    assert "secret plans" not in response.text
    assert_security_headers(response)


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_answers_with_the_token_and_sends_the_strict_headers(proxy, path):
    await proxy.chat("helper", "s1", "hi")
    response = await proxy.client.get(path, headers=BEARER)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert_security_headers(response)


@pytest.mark.parametrize("path", ["/admin/login", "/admin/static/admin.css",
                                  "/admin/static/admin.js", "/admin/no-such-page"])
async def test_the_login_page_static_files_and_errors_send_the_strict_headers(proxy, path):
    response = await proxy.client.get(path)
    assert_security_headers(response)


async def test_pages_use_no_inline_script_style_or_event_handlers(proxy):
    await proxy.chat("helper", "s1", "hi")
    for path in [*PAGES, "/admin/login"]:
        page = (await proxy.client.get(path, headers=BEARER)).text
        assert re.search(r"<script(?![^>]*\bsrc=)", page) is None, path
        assert re.search(r"<style|\sstyle=", page) is None, path
        assert re.search(r"<[^>]*\son[a-z]+=", page) is None, path


async def test_signing_in_sets_a_strict_http_only_admin_cookie(proxy):
    page = await proxy.client.get("/admin/login")
    response = await proxy.client.post("/admin/login", data={
        "csrf_token": csrf_token_in(page.text), "token": ADMIN_TOKEN,
        "next": "/admin/agents/helper"})

    assert response.status_code == 303
    assert response.headers["location"] == "/admin/agents/helper"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("mp_admin=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin" in cookie
    assert "Secure" not in cookie
    assert (await proxy.client.get("/admin/")).status_code == 200


async def test_the_admin_cookie_is_secure_over_https(proxy):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app),
                                 base_url="https://testserver") as client:
        page = await client.get("/admin/login")
        assert "Secure" in page.headers["set-cookie"]  # the CSRF cookie too
        response = await client.post("/admin/login", data={
            "csrf_token": csrf_token_in(page.text), "token": ADMIN_TOKEN})
    assert response.status_code == 303
    assert "Secure" in response.headers["set-cookie"]


async def test_a_wrong_token_keeps_the_login_form_with_an_error(proxy):
    page = await proxy.client.get("/admin/login")
    response = await proxy.client.post("/admin/login", data={
        "csrf_token": csrf_token_in(page.text), "token": "guess"})
    assert response.status_code == 401
    assert "That admin token is not valid." in response.text
    assert "mp_admin" not in response.headers.get("set-cookie", "")


async def test_login_only_redirects_to_admin_pages(proxy):
    page = await proxy.client.get("/admin/login")
    response = await proxy.client.post("/admin/login", data={
        "csrf_token": csrf_token_in(page.text), "token": ADMIN_TOKEN,
        "next": "//evil.example/admin"})
    assert response.headers["location"] == "/admin/"


async def test_a_login_post_without_the_csrf_token_is_refused(proxy):
    await proxy.client.get("/admin/login")
    response = await proxy.client.post("/admin/login", data={"token": ADMIN_TOKEN})
    assert response.status_code == 403
    assert "mp_admin" not in response.headers.get("set-cookie", "")


async def test_signing_out_clears_the_admin_cookie(proxy):
    await proxy.sign_in()
    token = await proxy.form_token("/admin/")
    response = await proxy.client.post("/admin/logout", data={"csrf_token": token})
    assert response.status_code == 303
    assert 'mp_admin=""' in response.headers["set-cookie"]
    assert (await proxy.client.get("/admin/")).status_code == 401


async def save_form(proxy, agent: str = "helper", **fields: str) -> httpx.Response:
    token = await proxy.form_token(f"/admin/agents/{agent}/edit")
    data = {"csrf_token": token, "description": "", "model": "", "context_window": "",
            "history_mode": "auto", "memory": "", **fields}
    return await proxy.client.post(f"/admin/agents/{agent}/edit", data=data)


@pytest.mark.parametrize(
    "csrf",
    [None, "0" * 64, "tampered"],
    ids=["missing", "wrong", "garbage"],
)
async def test_a_form_post_without_a_valid_csrf_token_is_refused(proxy, csrf):
    await proxy.sign_in()
    data = {"memory": '{"kind": "none"}', **({"csrf_token": csrf} if csrf else {})}
    response = await proxy.client.post("/admin/agents/helper/edit", data=data)
    assert response.status_code == 403
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_csrf_token_only_works_with_the_cookie_it_was_made_for(proxy):
    await proxy.sign_in()
    token = await proxy.form_token("/admin/agents/helper/edit")
    proxy.client.cookies.set("mp_csrf", "another-browsers-nonce", path="/admin")
    response = await proxy.client.post("/admin/agents/helper/edit",
                                       data={"csrf_token": token, "memory": '{"kind": "none"}'})
    assert response.status_code == 403
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_form_post_from_another_site_is_refused(proxy):
    await proxy.sign_in()
    token = await proxy.form_token("/admin/agents/helper/edit")
    response = await proxy.client.post(
        "/admin/agents/helper/edit", data={"csrf_token": token, "memory": '{"kind": "none"}'},
        headers={"Origin": "https://evil.example"})
    assert response.status_code == 403


async def test_a_form_post_needs_the_admin_token_too(proxy):
    token = await proxy.form_token("/admin/login")
    response = await proxy.client.post("/admin/agents/helper/edit",
                                       data={"csrf_token": token, "memory": '{"kind": "none"}'})
    assert response.status_code == 401
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_the_edit_form_is_prefilled_with_the_defaults_an_unconfigured_agent_runs_with(
    proxy
):
    await proxy.sign_in()
    page = await proxy.client.get("/admin/agents/helper/edit")
    assert json.loads(textarea(page.text)) == SummarizingWindowConfig().to_dict()


async def test_the_edit_form_is_prefilled_with_the_file_definition(proxy, agents_dir):
    write_agent(agents_dir, "planner", description="plans", llm={"contextWindow": 32000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.6},
                historyMode="delta")
    proxy.services.agents.load()
    await proxy.sign_in()
    page = (await proxy.client.get("/admin/agents/planner/edit")).text
    assert json.loads(textarea(page)) == {"kind": "auto_compact", "compactAtRatio": 0.6,
                                          "summaryPlacement": "USER_MESSAGE",
                                          "toolResultEviction": None}
    assert 'value="plans"' in page and 'value="32000"' in page
    assert '<option value="delta" selected>' in page


async def test_saving_valid_json_stores_it_and_shows_the_new_kind(proxy):
    await proxy.sign_in()
    response = await save_form(proxy, memory='{"kind": "windowed", "windowSize": 12}',
                               description="Keeps a dozen", context_window="16000")
    assert response.status_code == 303
    assert response.headers["location"] == "/admin/agents/helper?saved=1"
    stored = await proxy.services.store.get_agent_config("helper")
    assert stored["memoryConfig"] == {"kind": "windowed", "windowSize": 12}
    assert stored["llm"] == {"contextWindow": 16000}
    assert stored["description"] == "Keeps a dozen"
    detail = await proxy.client.get(response.headers["location"])
    assert 'id="active-kind">windowed<' in detail.text
    assert "Saved." in detail.text


async def test_invalid_json_is_rejected_with_a_clear_message_and_the_text_kept(proxy):
    await proxy.sign_in()
    typed = '{"kind": "windowed",\n "windowSize": 12,,}'
    response = await save_form(proxy, memory=typed)
    assert response.status_code == 400
    assert "Memory (JSON) is not valid JSON" in response.text
    assert "line 2" in response.text
    assert textarea(response.text) == typed
    assert 'id="memory" name="memory" class="mono" rows="16" spellcheck="false"' in response.text
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_config_that_breaks_the_schema_is_rejected_naming_the_field(proxy):
    await proxy.sign_in()
    typed = '{"kind": "windowed", "windowSize": 0}'
    response = await save_form(proxy, memory=typed)
    assert response.status_code == 400
    assert "memoryConfig.windowSize" in response.text
    assert re.search(r'<textarea id="memory"[^>]*aria-invalid="true"', response.text)
    assert textarea(response.text) == typed
    assert await proxy.services.store.get_agent_config("helper") is None


async def test_a_bad_context_window_is_rejected_naming_the_field(proxy):
    await proxy.sign_in()
    response = await save_form(proxy, context_window="lots", memory='{"kind": "none"}')
    assert response.status_code == 400
    assert "llm.contextWindow" in response.text
    assert re.search(r'<input id="context_window"[^>]*aria-invalid="true"', response.text)
    assert textarea(response.text) == '{"kind": "none"}'


async def test_a_blank_memory_field_keeps_the_stored_setting(proxy):
    await proxy.sign_in()
    await save_form(proxy, memory='{"kind": "none"}')
    response = await save_form(proxy, memory="   ", description="still stateless")
    assert response.status_code == 303
    stored = await proxy.services.store.get_agent_config("helper")
    assert stored["memoryConfig"] == {"kind": "none"}
    assert stored["description"] == "still stateless"


async def test_removing_the_override_brings_back_the_file(proxy, agents_dir):
    write_agent(agents_dir, "planner", memoryConfig={"kind": "auto_compact"})
    proxy.services.agents.load()
    await proxy.sign_in()
    await save_form(proxy, "planner", memory='{"kind": "full"}')
    token = await proxy.form_token("/admin/agents/planner/edit")
    response = await proxy.client.post("/admin/agents/planner/reset", data={"csrf_token": token})
    assert response.headers["location"] == "/admin/agents/planner?reset=1"
    assert await proxy.services.store.get_agent_config("planner") is None


async def test_the_agents_page_lists_each_agent_with_its_kind_and_session_count(
    proxy, agents_dir
):
    write_agent(agents_dir, "planner", memoryConfig={"kind": "auto_compact"})
    proxy.services.agents.load()
    await proxy.chat("helper", "a", "x")
    await proxy.chat("helper", "b", "y")
    page = (await proxy.client.get("/admin/", headers=BEARER)).text
    rows = dict(re.findall(
        r'<tr data-agent="([^"]+)">.*?data-kind="([^"]+)"', page, re.S))
    assert rows == {"helper": "summarizing_window", "planner": "auto_compact"}
    helper_row = page.split('data-agent="helper"')[1].split("</tr>")[0]
    assert '<td class="num">2</td>' in helper_row


async def test_stored_html_in_messages_stays_inert_text(proxy):
    attack = '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>'
    await proxy.chat("helper", "s1", attack)
    page = (await proxy.client.get("/admin/agents/helper/sessions/s1", headers=BEARER)).text
    assert "<img src=x" not in page and "<script>window" not in page
    assert str(escape(attack)) in page


async def test_the_session_page_shows_the_working_memory_of_the_json_twin(proxy, agents_dir):
    write_agent(agents_dir, "tight", llm={"contextWindow": 1000})
    proxy.services.agents.load()
    await proxy.chat("tight", "s1", "short question")
    await proxy.chat("tight", "s1", "long paste: " + "lorem ipsum dolor " * 200)
    await proxy.chat("tight", "s1", "thanks")
    view = (await proxy.api("GET", "/agents/tight/sessions/s1")).json()
    page = (await proxy.client.get("/admin/agents/tight/sessions/s1", headers=BEARER)).text

    truncated = [m for m in view["messages"] if m.get("marker") == "truncated"]
    assert truncated, "the long paste is capped by maxMessageRatio"
    assert 'class="badge marker marker-truncated">truncated<' in page
    assert f"(stored {truncated[0]['stored_tokens']:,})" in page
    for message in view["messages"]:
        assert str(escape(message["text"])) in page
        assert f"{message['tokens']:,} tokens" in page
    assert f'id="live-ratio">{view["totals"]["live_ratio"] * 100:.1f}%<' in page


async def test_a_media_part_is_named_on_its_own_line(proxy):
    response = await proxy.client.post(
        "/agents/helper/sessions/m/v1/chat/completions",
        headers={"Authorization": "Bearer sk-media"},
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]})
    assert response.status_code == 200
    await proxy.chat("helper", "m", "and now?", api_key="sk-media")
    page = (await proxy.client.get("/admin/agents/helper/sessions/m", headers=BEARER)).text
    assert re.search(r'<span class="media-line">\[image: https://example.com/cat.png[^<]*\]</span>',
                     page)


async def test_the_compact_button_shows_that_windowed_does_nothing(proxy, agents_dir):
    write_agent(agents_dir, "recent", memoryConfig={"kind": "windowed", "windowSize": 4})
    proxy.services.agents.load()
    await proxy.chat("recent", "s1", "hello")
    await proxy.sign_in()
    page = await proxy.client.get("/admin/agents/recent/sessions/s1")
    assert "windowed never compresses: Compact does nothing." in page.text
    response = await proxy.client.post("/admin/agents/recent/sessions/s1/compact",
                                       data={"csrf_token": csrf_token_in(page.text)})
    assert response.status_code == 200
    assert "Compact did nothing." in response.text
    assert "windowed never compresses: older messages simply fall off" in response.text


async def test_the_compact_button_summarizes_and_shows_the_new_window(proxy, fake, agents_dir):
    write_agent(agents_dir, "sw", llm={"contextWindow": 2000})
    proxy.services.agents.load()
    for n in range(4):
        await proxy.chat("sw", "s1", f"question {n}: " + "why do windows slide? " * 30)
    await proxy.sign_in()
    token = await proxy.form_token("/admin/agents/sw/sessions/s1")
    fake.queue(Reply.text("Four questions about sliding windows."))

    response = await proxy.client.post("/admin/agents/sw/sessions/s1/compact",
                                       data={"csrf_token": token})

    assert response.status_code == 200
    assert "Compacted." in response.text
    assert "Wrote a summary of messages #1\N{EN DASH}#6" in response.text
    assert "Four questions about sliding windows." in response.text
    assert re.search(r"8 → 2 messages", response.text)


async def test_the_compact_button_needs_the_csrf_token(proxy):
    await proxy.chat("helper", "s1", "hello")
    await proxy.sign_in()
    response = await proxy.client.post("/admin/agents/helper/sessions/s1/compact", data={})
    assert response.status_code == 403


async def test_a_loopback_proxy_without_a_token_serves_admin_to_loopback_clients(make_proxy):
    proxy = await make_proxy(admin_token=None)
    proxy.client.base_url = "http://127.0.0.1:4000"
    await proxy.chat("helper", "s1", "hi")
    assert (await proxy.client.get("/admin/")).status_code == 200
    response = await save_form(proxy, memory='{"kind": "none"}')
    assert response.status_code == 303
    assert (await proxy.client.get("/admin/api/agents")).status_code == 200


@pytest.mark.parametrize("path", ["/admin/", "/admin/api/agents"])
async def test_without_a_token_a_request_for_another_host_name_is_refused(make_proxy, path):
    proxy = await make_proxy(admin_token=None)
    response = await proxy.client.get(path, headers={"Host": "rebound.example:4000"})
    assert response.status_code == 403
    assert "localhost or 127.0.0.1" in response.text


async def test_a_proxy_bound_elsewhere_refuses_admin_until_a_token_is_set(make_proxy):
    proxy = await make_proxy(admin_token=None, host="0.0.0.0")
    response = await proxy.client.get("/admin/")
    assert response.status_code == 403
    assert "MEMORY_PROXY_ADMIN_TOKEN" in response.text


async def test_the_session_page_charts_window_tokens_and_cached_share_per_request(
    proxy, fake
):
    usage = {"prompt_tokens": 400, "completion_tokens": 2, "total_tokens": 402,
             "prompt_tokens_details": {"cached_tokens": 300}}
    fake.queue(Reply.text("one", usage={**usage, "prompt_tokens_details": {}}),
               Reply.text("two", usage=usage))
    await proxy.chat("helper", "warm", "first")
    await proxy.chat("helper", "warm", "second")
    view = (await proxy.api("GET", "/agents/helper/sessions/warm")).json()
    page = (await proxy.client.get("/admin/agents/helper/sessions/warm", headers=BEARER)).text
    assert view["cache"]["totals"]["cached_tokens"] == 300
    assert 'id="cached-tokens">300<' in page and 'id="cached-share">37.5%<' in page
    chart = page[page.index('<svg id="cache-chart"'):page.index("</svg>")]
    assert chart.count('class="cache-bar"') == 2
    assert "300 of 400 cached" in chart
