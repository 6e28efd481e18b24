"""The chat routes (proxy/http/app.py): ordinary Starlette routes, so the paths are the
routing table's and middleware added to the app sees every chat request."""

from __future__ import annotations

import httpx
import pytest
from e2e import CLIENT_KEY

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import Reply


@pytest.mark.parametrize(
    ("path", "session"),
    [
        ("/v1/chat/completions", None),
        ("/chat/completions", None),
        ("/agents/helper/v1/chat/completions", None),
        ("/agents/helper/sessions/s-1/v1/chat/completions", "s-1"),
        ("/agents//v1/chat/completions", 404),
        ("/agents/helper/sessions//v1/chat/completions", 404),
        ("/agents/a/b/v1/chat/completions", 404),
        ("/agents/a/sessions/b/c/v1/chat/completions", 404),
        ("/v2/chat/completions", 404),
    ],
)
async def test_chat_paths_are_served_and_nothing_else_is(fake, agents_dir, tmp_path, path, session):
    fake.queue(Reply.text("routed"))
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path}/m.db", upstream_url=fake.url,
                              agents_dir=agents_dir))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        response = await client.post(
            path, json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
    if session == 404:
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"
        return
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "routed"
    if session is not None:
        assert response.headers["x-memory-session"] == session


async def test_middleware_added_to_the_app_sees_chat_requests(fake, agents_dir, tmp_path):
    """A user's middleware (CORS, auth, tracing) wraps the chat route like any other."""
    seen: list[str] = []

    class Tracing:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http":
                seen.append(scope["path"])

                async def tagged(message):
                    if message["type"] == "http.response.start":
                        message["headers"] = [*message["headers"], (b"x-traced", b"yes")]
                    await send(message)

                await self.app(scope, receive, tagged)
                return
            await self.app(scope, receive, send)

    fake.queue(Reply.text("traced"))
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path}/m.db", upstream_url=fake.url,
                              agents_dir=agents_dir))
    app.add_middleware(Tracing)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        response = await client.post(
            "/agents/helper/sessions/traced/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "traced"
    assert response.headers["x-traced"] == "yes"
    assert seen == ["/agents/helper/sessions/traced/v1/chat/completions"]


def test_a_get_on_a_chat_path_is_refused_with_405_in_openai_shape(proxy):
    response = httpx.get(f"{proxy.base}/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_post_on_an_unknown_path_is_a_404_in_openai_shape(proxy):
    response = httpx.post(f"{proxy.base}/agents//v1/chat/completions", json={})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_the_app_serves_chat_under_a_root_path(fake, store_url, agents_dir):
    fake.queue(Reply.text("rooted"))
    app = create_app(Settings(store_url=store_url, upstream_url=fake.url, agents_dir=agents_dir))
    transport = httpx.ASGITransport(app=app, root_path="/memory-proxy")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        response = await client.post(
            "/memory-proxy/agents/helper/sessions/rooted/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "rooted"
    assert response.headers["x-memory-session"] == "rooted"


def test_a_bad_body_gets_a_400_in_openai_shape(proxy):
    response = httpx.post(
        f"{proxy.base}/v1/chat/completions", content=b"{not json",
        headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["code"] == "invalid_json"


def test_a_serving_process_freezes_start_up_objects_and_raises_gc_thresholds():
    import subprocess
    import sys

    script = (
        "import asyncio, gc\n"
        "from proxy.http.app import create_app, GC_THRESHOLDS\n"
        "from proxy.settings import Settings\n"
        "async def main():\n"
        "    app = create_app(Settings(store_url='sqlite:///:memory:', tune_gc=True,\n"
        "                              upstream_url='http://127.0.0.1:9/v1'))\n"
        "    async with app.router.lifespan_context(app):\n"
        "        assert gc.get_freeze_count() > 10000, gc.get_freeze_count()\n"
        "        assert gc.get_threshold() == GC_THRESHOLDS\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_apps_built_in_process_leave_the_gc_alone(proxy):
    import gc

    assert gc.get_threshold()[0] == 700
