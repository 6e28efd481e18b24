"""Suite-wide guards and fixtures.

No test may leave the machine: any connection or name lookup to a non-loopback address
fails the test that made it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e import ADMIN_TOKEN, RunningProxy
from redis_cluster import RedisCluster
from redis_server import RedisServer, flush_redis
from servers import ThreadedServer

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "testserver"}


class OutsideNetworkError(RuntimeError):
    """A test tried to reach a host that is not this machine."""


def _is_local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str) or host in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _guard_address(sock: socket.socket, address: object) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
        if not _is_local(address[0]):
            raise OutsideNetworkError(f"test tried to connect to {address!r}")


def _connect(self: socket.socket, address: object) -> None:
    _guard_address(self, address)
    return _real_connect(self, address)  # type: ignore[arg-type]


def _connect_ex(self: socket.socket, address: object) -> int:
    _guard_address(self, address)
    return _real_connect_ex(self, address)  # type: ignore[arg-type]


def _getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
    if host is not None and not _is_local(host):
        raise OutsideNetworkError(f"test tried to resolve {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def no_outside_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", _getaddrinfo)
    yield


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real ``redis-server`` for the session, on a free loopback port."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One real Redis Cluster for the session (three masters, three replicas)."""
    with RedisCluster() as cluster:
        yield cluster


# End-to-end fixtures: the recording fake upstream and the proxy on loopback (real HTTP,
# either store). Folders with other needs (tests/admin) override them by name.


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
        proxy.close_clients()
        proxy.server.stop()


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
