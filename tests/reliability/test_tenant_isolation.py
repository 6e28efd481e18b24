"""Nobody in where they don't belong.

- A client key never reads or writes another key's session, whatever form names it (the
  same session id included): sessions live under a hash of the key.
- Every admin surface (``/memory``, ``/admin/api``, the admin pages, Compact, Delete)
  answers only to the admin token, compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, RunningProxy, write_agent
from media_samples import data_url, png
from starlette.routing import BaseRoute, Mount, Route

import proxy.admin.auth
from proxy.http.app import routes
from proxy.testing.fake_upstream import FakeUpstream

KEY_A = "sk-tenant-a-0001"
KEY_B = "sk-tenant-b-0002"
SECRET_OF_A = "the vault code is 7261"


def chat(proxy: RunningProxy, key: str | None, *messages: str, path: str = "/v1",
         headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    """A turn of a full-history client: the messages alternate user, assistant, user..."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    history = [{"role": ("user", "assistant")[i % 2], "content": text}
               for i, text in enumerate(messages)]
    return httpx.post(f"{proxy.base}{path}/chat/completions",
                      json={"model": "gpt-4o", "messages": history, **body},
                      headers={**auth, **(headers or {})}, timeout=20)


FORMS = [
    pytest.param({"path": "/agents/shared/sessions/same/v1"}, id="path"),
    pytest.param({"headers": {"X-Agent-Id": "shared", "X-Session-Id": "same"}}, id="headers"),
    pytest.param({"metadata": {"agent_id": "shared", "session_id": "same"}}, id="metadata"),
    pytest.param({"path": "/agents/shared/v1", "user": "same"}, id="user"),
    pytest.param({"path": "/agents/shared/v1"}, id="fingerprint"),
]


@pytest.mark.parametrize("form", FORMS)
def test_a_key_never_sees_or_touches_another_keys_session_of_the_same_name(
    proxy: RunningProxy, fake: FakeUpstream, form: dict[str, Any]
) -> None:
    assert chat(proxy, KEY_A, "hi", **form).status_code == 200
    assert chat(proxy, KEY_A, "hi", "ok: hi", SECRET_OF_A, **form).status_code == 200
    for other in (KEY_B, None):  # another key, and no key at all
        assert chat(proxy, other, "hi", **form).status_code == 200
        sent = fake.chat_requests[-1].body["messages"]
        assert [m["content"] for m in sent] == ["hi"]
    if "fingerprint" not in str(form) and form.get("path") != "/agents/shared/v1":
        a = proxy.stored("shared", "same", api_key=KEY_A)
        b = proxy.stored("shared", "same", api_key=KEY_B)
        assert SECRET_OF_A in [m.content for m in a]
        assert [m.content for m in b] == ["hi", "ok: hi"]


@pytest.mark.parametrize("header", ["api-key", "x-api-key"])
def test_keys_sent_in_provider_key_headers_get_their_own_namespace(
    proxy: RunningProxy, fake: FakeUpstream, header: str
) -> None:
    path = "/agents/shared/sessions/same/v1"
    chat(proxy, None, "hi", "ok: hi", SECRET_OF_A, path=path, headers={header: KEY_A})
    for other in ({header: KEY_B}, {}):
        chat(proxy, None, "hi", path=path, headers=other)
        assert [m["content"] for m in fake.chat_requests[-1].body["messages"]] == ["hi"]
    assert SECRET_OF_A in [m.content for m in proxy.stored("shared", "same", api_key=KEY_A)]


@pytest.mark.parametrize("session", ["theirs", "same"])
def test_a_part_reference_naming_another_keys_media_is_refused_and_reaches_nobody(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, agents_dir: Path,
    session: str,
) -> None:
    write_agent(agents_dir, "eyes", llm={"model": "gpt-4o", "capabilities": ["image"]})
    proxy = make_proxy()
    image = data_url("image/png", png(32, 32))
    a_url = f"{proxy.base}/agents/eyes/sessions/same/v1/chat/completions"
    picture = [{"type": "text", "text": SECRET_OF_A},
               {"type": "image_url", "image_url": {"url": image}}]
    assert httpx.post(a_url, json={"model": "gpt-4o", "messages": [
        {"role": "user", "content": picture}]},
        headers={"Authorization": f"Bearer {KEY_A}"}, timeout=20).status_code == 200
    ref = proxy.stored("eyes", "same", api_key=KEY_A)[0].content[1]["part"]
    calls = len(fake.chat_requests)

    forged = [{"type": "text", "text": "what is this?"},
              {"type": "image_url", "image_url": {"detail": "high"}, "part": ref}]
    response = httpx.post(
        f"{proxy.base}/agents/eyes/sessions/{session}/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": forged}]},
        headers={"Authorization": f"Bearer {KEY_B}"}, timeout=20)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert len(fake.chat_requests) == calls  # the upstream saw nothing of it
    assert proxy.stored("eyes", session, api_key=KEY_B) == []
    key_b = proxy.key("eyes", session, KEY_B)
    assert proxy.call(proxy.services.store.get_parts(key_b, [ref["digest"]])) == {}


def admin_paths(found: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path) of every admin route, the mounted admin UI included."""
    for route in found:
        if isinstance(route, Mount):
            app: Any = route.app
            while not hasattr(app, "routes") and hasattr(app, "app"):
                app = app.app
            yield from admin_paths(list(getattr(app, "routes", [])), prefix + route.path)
        elif isinstance(route, Route):
            path = prefix + route.path
            if not path.startswith(("/memory", "/admin")):
                continue
            if path.startswith(("/admin/login", "/admin/logout")) or path == "/admin":
                continue  # the login form itself is public; logout only clears a cookie;
                # /admin only redirects to /admin/
            for method in sorted(route.methods or {"GET"}):
                if method != "HEAD":
                    yield method, path.format(agent="shared", session="same")


ADMIN_ROUTES = sorted(set(admin_paths(routes())))


def test_the_admin_surface_is_enumerated() -> None:
    paths = {path for _, path in ADMIN_ROUTES}
    assert "/memory/shared/same" in paths
    assert "/admin/api/agents/shared/sessions/same/compact" in paths
    assert ("DELETE", "/admin/api/agents/shared/sessions/same") in ADMIN_ROUTES


CREDENTIALS = {
    "none": None,
    "client-key": f"Bearer {KEY_A}",
    "wrong-token-same-length": "Bearer " + "x" * len(ADMIN_TOKEN),
    "token-prefix": "Bearer " + ADMIN_TOKEN[:-1],
    "wrong-scheme": "Basic " + ADMIN_TOKEN,
}


def test_every_admin_surface_refuses_anything_but_the_admin_token(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    chat(proxy, KEY_A, "hi", "ok", SECRET_OF_A, path="/agents/shared/sessions/same/v1")
    with httpx.Client(base_url=proxy.base, cookies={"mp_admin": "x" * len(ADMIN_TOKEN)}) as http:
        for name, credential in CREDENTIALS.items():
            headers = {"Authorization": credential} if credential else {}
            for method, path in ADMIN_ROUTES:
                json_body = {} if method in ("POST", "PUT") else None
                response = http.request(method, path, headers=headers, json=json_body)
                # (429: past ten wrong tokens the address is refused outright)
                assert response.status_code in (401, 403, 429), (name, method, path)
                assert SECRET_OF_A not in response.text
    # nothing was changed by the refused calls
    assert SECRET_OF_A in [m.content for m in proxy.stored("shared", "same", api_key=KEY_A)]


def test_the_admin_token_opens_them(proxy: RunningProxy, fake: FakeUpstream) -> None:
    chat(proxy, KEY_A, "hi", "ok", SECRET_OF_A, path="/agents/shared/sessions/same/v1")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    view = httpx.get(f"{proxy.base}/memory/shared/same", headers=auth)
    assert view.status_code == 200 and SECRET_OF_A in view.text


def test_admin_tokens_are_compared_in_constant_time(
    proxy: RunningProxy, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(proxy_auth_hmac(), "compare_digest", spy)
    assert httpx.get(f"{proxy.base}/memory/shared",
                     headers={"Authorization": "Bearer guess"}).status_code == 401
    assert (ADMIN_TOKEN.encode(), b"guess") in compared
    assert "==" not in token_comparison_source()


def proxy_auth_hmac() -> Any:
    """The ``hmac`` module as ``proxy.admin.auth`` sees it (patched there, nowhere else)."""
    return proxy.admin.auth.hmac


def token_comparison_source() -> str:
    import inspect

    return inspect.getsource(proxy.admin.auth.token_matches)
