"""Without an admin token the admin trusts this machine; a page of another site open in
the user's browser is on this machine too. Every state-changing admin route refuses what
such a page can send (a foreign ``Origin``, ``Sec-Fetch-Site: cross-site``, a
``text/plain`` or form body on a JSON route) with a 403, before anything runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from admin_support import CLIENT_KEY, InProcessProxy

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream

CROSS_SITE = [
    {"Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Content-Type": "text/plain"},
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site",
     "Content-Type": "text/plain"},
]
SESSION = "/agents/a/sessions/s"
WRITES = [
    ("POST", "/admin/api" + SESSION + "/compact"),
    ("DELETE", "/admin/api" + SESSION),
    ("PUT", "/admin/api/agents/a"),
    ("POST", "/admin/api/agents/a"),
    ("DELETE", "/admin/api/agents/a"),
    ("POST", "/admin" + SESSION + "/compact"),
    ("POST", "/admin/agents/a/edit"),
    ("POST", "/admin/agents/a/reset"),
    ("POST", "/admin/logout"),
]


@pytest.fixture
async def loopback(fake: FakeUpstream, store_url: str, agents_dir: Path
                   ) -> AsyncIterator[InProcessProxy]:
    """A token-less proxy bound to loopback, reached as http://127.0.0.1:4000."""
    settings = Settings(store_url=store_url, upstream_url=fake.url, agents_dir=agents_dir,
                        admin_token=None)
    app = create_app(settings)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:4000"))
        yield InProcessProxy(app, client)


@pytest.mark.parametrize("headers", CROSS_SITE, ids=["origin", "fetch-site", "text-plain", "all"])
async def test_a_cross_site_admin_write_is_a_403_and_changes_nothing(
    loopback: InProcessProxy, fake: FakeUpstream, headers: dict[str, str]
) -> None:
    for n in range(3):
        await loopback.chat("a", "s", f"turn {n}")
    upstream_calls = len(fake.chat_requests)
    before = await loopback.client.get("/admin/api" + SESSION)
    assert before.status_code == 200
    for method, path in WRITES:
        response = await loopback.client.request(
            method, path, headers=headers, content=b'{"memoryConfig": {"kind": "none"}}')
        assert response.status_code == 403, (method, path, response.text)
        if path.startswith("/admin/api/"):
            assert response.json()["error"]["code"] == "csrf_failed"
    after = await loopback.client.get("/admin/api" + SESSION)
    assert after.status_code == 200  # not deleted
    assert after.json()["strategy"] == before.json()["strategy"]  # not edited
    assert len(fake.chat_requests) == upstream_calls  # no summarizer call


async def test_same_site_admin_writes_without_a_token_still_work(
    loopback: InProcessProxy,
) -> None:
    await loopback.chat("a", "s", "hello", api_key=CLIENT_KEY)
    same_site = {"Origin": "http://127.0.0.1:4000", "Sec-Fetch-Site": "same-origin"}
    compact = await loopback.client.post("/admin/api" + SESSION + "/compact", headers=same_site)
    assert compact.status_code == 200, compact.text
    gone = await loopback.client.delete("/admin/api" + SESSION, headers=same_site)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
