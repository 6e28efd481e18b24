"""The chat route's own dispatch (proxy/http/app.py ProxyApp, proxy/surfaces/chat.py
chat_path_params): the same paths as the routing table, answered without it."""

from __future__ import annotations

import httpx
import pytest
from e2e import CLIENT_KEY

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.surfaces.chat import chat_path_params
from proxy.testing.fake_upstream import Reply


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/chat/completions", {}),
        ("/chat/completions", {}),
        ("/agents/helper/v1/chat/completions", {"agent": "helper"}),
        ("/agents/helper/sessions/s-1/v1/chat/completions", {"agent": "helper", "session": "s-1"}),
        ("/agents//v1/chat/completions", None),
        ("/agents/helper/sessions//v1/chat/completions", None),
        ("/agents/a/b/v1/chat/completions", None),
        ("/agents/a/sessions/b/c/v1/chat/completions", None),
        ("/v1/chat/completions/", None),
        ("/v2/chat/completions", None),
    ],
)
def test_chat_paths_yield_their_parameters_and_nothing_else_matches(path, params):
    assert chat_path_params(path) == params


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


def test_a_bad_body_gets_a_400_in_openai_shape_from_the_fast_path(proxy):
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
