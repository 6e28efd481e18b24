"""Fixtures of the admin tests: the recording fake upstream and proxies in process.

``make_proxy(**settings)`` starts a proxy app (lifespan entered) on a store that every
proxy of the test shares, so two calls make two replicas of one deployment.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from admin_support import ADMIN_TOKEN, InProcessProxy

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream

MakeProxy = Callable[..., Awaitable[InProcessProxy]]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.fixture
async def make_proxy(fake: FakeUpstream, store_url: str, agents_dir: Path
                     ) -> AsyncIterator[MakeProxy]:
    async with contextlib.AsyncExitStack() as stack:

        async def make(**overrides: Any) -> InProcessProxy:
            settings = Settings(
                store_url=overrides.pop("store_url", store_url),
                upstream_url=fake.url,
                agents_dir=agents_dir,
                admin_token=overrides.pop("admin_token", ADMIN_TOKEN),
                **overrides,
            )
            app = create_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://testserver"))
            return InProcessProxy(app, client)

        yield make


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> InProcessProxy:
    return await make_proxy()
