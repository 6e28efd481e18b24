"""Fixtures of the reliability suite: the fake upstream, the proxy on loopback with either
store, and a flushed Redis. ``e2e`` (tests/proxy) provides ``RunningProxy``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))

from e2e import ADMIN_TOKEN, RunningProxy
from reliability_support import flush_redis
from servers import ThreadedServer

from proxy.app import create_app
from proxy.fake_upstream import FakeUpstream
from proxy.settings import Settings


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream.running() as upstream:
        yield upstream


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/memory.db"
    server = request.getfixturevalue("redis_server")
    flush_redis(server.url)
    return str(server.url)


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    return directory


@pytest.fixture
def make_proxy(
    fake: FakeUpstream, store_url: str, agents_dir: Path
) -> Iterator[Callable[..., RunningProxy]]:
    running: list[RunningProxy] = []

    def make(**overrides: Any) -> RunningProxy:
        settings = Settings(
            store_url=overrides.pop("store_url", store_url),
            upstream_url=overrides.pop("upstream_url", fake.url),
            agents_dir=overrides.pop("agents_dir", agents_dir),
            admin_token=overrides.pop("admin_token", ADMIN_TOKEN),
            **overrides,
        )
        app = create_app(settings)
        server = ThreadedServer(app).start()
        proxy = RunningProxy(server, app.state.services)
        running.append(proxy)
        return proxy

    yield make
    for proxy in running:
        proxy.server.stop()


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
