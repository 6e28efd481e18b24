"""Helpers of the admin tests: the proxy in process (httpx.ASGITransport) with its lifespan."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from proxy.services import Services

ADMIN_TOKEN = "admin-test-token-7f3a"
CLIENT_KEY = "sk-admin-tests-client"
BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
)


def write_agent(directory: Path, name: str, **definition: Any) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"name": name, **definition}))


def csrf_token_in(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert match, "page has no CSRF token"
    return match.group(1)


class InProcessProxy:
    """A proxy app running its lifespan in the test's loop, reached through httpx."""

    def __init__(self, app: Starlette, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    async def chat(self, agent: str, session: str, text: str, *, system: str = "Be brief.",
                   api_key: str = CLIENT_KEY) -> httpx.Response:
        """One delta turn; background work (summaries) is awaited before returning."""
        response = await self.client.post(
            f"/agents/{agent}/sessions/{session}/v1/chat/completions",
            headers={"Authorization": f"Bearer {api_key}"},
            json={"model": "gpt-4o", "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": text}]},
        )
        assert response.status_code == 200, response.text
        await self.services.drain()
        return response

    async def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**BEARER, **kwargs.pop("headers", {})}
        return await self.client.request(method, "/admin/api" + path, headers=headers, **kwargs)

    async def sign_in(self) -> None:
        """Log in through the form, as a browser does: cookies stay on the client."""
        page = await self.client.get("/admin/login")
        response = await self.client.post("/admin/login", data={
            "csrf_token": csrf_token_in(page.text), "token": ADMIN_TOKEN, "next": "/admin/"})
        assert response.status_code == 303, response.text

    async def form_token(self, path: str) -> str:
        page = await self.client.get(path)
        assert page.status_code == 200, page.text
        return csrf_token_in(page.text)
