"""The admin pages in a real headless Chromium: sign in, edit, inspect, Compact, stay inert.

Playwright drives Debian's ``/usr/bin/chromium`` (it cannot download its own browser);
the proxy is served on loopback by ``ThreadedServer``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from admin_support import ADMIN_TOKEN, CLIENT_KEY, write_agent
from servers import ThreadedServer

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream, Reply

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run",
]
ATTACK = 'Look: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>'


@dataclass
class Deployment:
    base: str
    fake: FakeUpstream


def seed(base: str) -> None:
    """Traffic to look at: one session with an HTML-bearing message and enough history
    for Compact to summarize."""
    system = {"role": "system", "content": "You are a careful research lead."}
    with httpx.Client(base_url=base, timeout=20,
                      headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client:
        turns = [ATTACK] + [f"Question {n}: " + "how do memory windows slide? " * 12
                            for n in range(3)]
        for text in turns:
            response = client.post(
                "/agents/research-lead/sessions/s-1/v1/chat/completions",
                json={"model": "gpt-4o", "messages": [system, {"role": "user", "content": text}]})
            assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("admin-browser")
    agents = root / "agents"
    agents.mkdir()
    write_agent(agents, "research-lead", description="Plans research.",
                llm={"model": "gpt-4o", "contextWindow": 3000},
                tools=[{"name": "web_search", "maxResultChars": 20000}])
    write_agent(agents, "planner", memoryConfig={"kind": "auto_compact"})
    with FakeUpstream.running() as fake:
        app = create_app(Settings(store_url=f"sqlite:///{root}/memory.db", upstream_url=fake.url,
                                  agents_dir=agents, admin_token=ADMIN_TOKEN))
        server = ThreadedServer(app).start()
        try:
            seed(server.base)
            server.call(app.state.services.drain())
            yield Deployment(server.base, fake)
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def csp_violations() -> list[str]:
    return []


@pytest.fixture
def page(browser, deployment, csp_violations):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(5000)

    def on_console(message) -> None:
        if "Content Security Policy" in message.text:
            csp_violations.append(message.text)

    page.on("console", on_console)
    yield page
    context.close()


def sign_in(page, base: str, target: str = "/admin/") -> None:
    page.goto(base + target)
    assert page.locator("h1").inner_text() == "Sign in"
    page.fill("#token", ADMIN_TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(base + target)


def test_an_admin_signs_in_and_edits_an_agent_in_the_browser(page, deployment, csp_violations):
    base = deployment.base
    sign_in(page, base)
    rows = page.locator("#agents tbody tr")
    assert rows.count() == 2
    assert page.locator('tr[data-agent="planner"] .kind').inner_text() == "auto_compact"

    page.click("a:has-text('planner')")
    assert page.locator("#active-kind").inner_text() == "auto_compact"
    page.click("text=Edit agent")
    assert json.loads(page.input_value("#memory"))["kind"] == "auto_compact"

    broken = '{"kind": "windowed",\n  "windowSize": 8,,}'
    page.fill("#memory", broken)
    page.click("button:has-text('Save')")
    page.wait_for_selector("#form-error")
    assert "Memory (JSON) is not valid JSON" in page.inner_text("#form-error")
    assert page.input_value("#memory") == broken

    page.fill("#memory", '{"kind": "windowed", "windowSize": 0}')
    page.click("button:has-text('Save')")
    page.wait_for_selector("#form-error")
    assert page.inner_text("#form-error .error-field") == "memoryConfig.windowSize"
    assert page.get_attribute("#memory", "aria-invalid") == "true"

    page.fill("#memory", '{"kind": "windowed", "windowSize": 8}')
    page.click("button:has-text('Save')")
    page.wait_for_url("**/admin/agents/planner?saved=1")
    assert page.locator("#active-kind").inner_text() == "windowed"
    assert json.loads(page.inner_text("#effective-config")) == {"kind": "windowed",
                                                                 "windowSize": 8,
                                                                 "windowStep": 1}
    assert csp_violations == []


def test_stored_html_stays_text_and_compact_changes_the_window(
    page, deployment, csp_violations
):
    base = deployment.base
    sign_in(page, base, "/admin/agents/research-lead/sessions/s-1")

    first = page.locator('article[data-seq="1"] .msg-text')
    assert first.inner_text() == ATTACK
    assert page.locator("#messages img, main script").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    sent_before = int(page.inner_text("#messages-sent"))
    assert page.inner_text("#summary-count") == "0"

    deployment.fake.queue(Reply.text("The user asked three questions about memory windows."))
    page.click("#compact")
    page.wait_for_selector("#compact-result")

    assert "Compacted." in page.inner_text("#compact-result")
    assert page.inner_text("#summary-count") == "1"
    assert "three questions about memory windows" in page.inner_text("#summaries")
    assert int(page.inner_text("#messages-sent")) < sent_before
    assert page.evaluate("typeof window.__pwned") == "undefined"

    # the Transcript view beside it: every stored message, the summary's point marked
    page.click("#transcript-tab")
    page.wait_for_selector("#transcript")
    assert page.locator('#transcript article[data-seq="1"] .msg-text').inner_text() == ATTACK
    assert page.locator("#transcript article").count() == 8
    point = page.locator(".compaction-point")
    assert point.count() == 1
    assert point.get_attribute("data-kind") == "summary"
    point.locator("summary").click()
    assert "three questions about memory windows" in point.inner_text()
    assert page.locator("#transcript img, main script").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert csp_violations == []


def test_an_admin_sets_a_tools_max_result_chars_in_the_agent_form(
    page, deployment, csp_violations
):
    base = deployment.base
    sign_in(page, base, "/admin/agents/research-lead/edit")
    assert page.input_value("#tool_max_0") == "20000"
    assert "Max result chars" in page.inner_text('label[for="tool_max_0"]')

    page.fill("#tool_max_0", "lots")
    page.click("button:has-text('Save')")
    page.wait_for_selector("#form-error")
    assert page.inner_text("#form-error .error-field") == "tools.0.maxResultChars"
    assert page.get_attribute("#tool_max_0", "aria-invalid") == "true"
    assert page.input_value("#tool_max_0") == "lots"

    page.fill("#tool_max_0", "5000")
    page.click("button:has-text('Save')")
    page.wait_for_url("**/admin/agents/research-lead?saved=1")
    page.goto(base + "/admin/agents/research-lead/edit")
    assert page.input_value("#tool_max_0") == "5000"
    assert csp_violations == []
