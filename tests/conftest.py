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
from servers import AppHosts

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _share_the_default_tls_context() -> None:
    """Every httpx client (the openai SDK's, on httpx or its fork httpx2) builds a TLS
    context from a CA bundle, about 20 ms each, though the suite speaks plain HTTP on
    loopback: clients made with the default ``verify`` share one per bundle. Any other
    ``verify``/``cert`` builds its own as before."""
    import importlib

    for name in ("httpx._transports.default", "httpx2._transports.default"):
        try:
            transports = importlib.import_module(name)
        except ImportError:
            continue
        build = transports.create_ssl_context
        shared: dict[tuple[str | None, str | None], Any] = {}

        def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True,
                               *, build: Any = build, shared: dict[Any, Any] = shared) -> Any:
            if verify is not True or cert is not None:
                return build(verify, cert, trust_env)
            bundle = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) \
                if trust_env else (None, None)
            if bundle not in shared:
                shared[bundle] = build(verify, cert, trust_env)
            return shared[bundle]

        transports.create_ssl_context = create_ssl_context


_share_the_default_tls_context()

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


@pytest.fixture(scope="session")
def app_hosts() -> Iterator[AppHosts]:
    """Loopback servers shared by the session's tests: a test mounts its own app on one."""
    hosts = AppHosts()
    yield hosts
    hosts.close()


@pytest.fixture(scope="module")
def fake_upstream() -> Iterator[FakeUpstream]:
    """The module's one fake upstream; tests reach it through ``fake`` (reset for each)."""
    with FakeUpstream.running() as upstream:
        yield upstream


@pytest.fixture
def fake(fake_upstream: FakeUpstream) -> FakeUpstream:
    """The module's fake upstream, as new: no script, no records, the default replies.
    A module needing other defaults overrides this with ``fake_upstream.reset(...)``."""
    fake_upstream.reset()
    return fake_upstream


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
    fake: FakeUpstream, store_url: str, agents_dir: Path, app_hosts: AppHosts
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
        proxy = RunningProxy(app_hosts.borrow(app), app.state.services)
        running.append(proxy)
        return proxy

    yield make
    fake.release()  # a held reply would keep the proxy's shutdown waiting
    for proxy in running:
        proxy.close_clients()
        app_hosts.give_back(proxy.server)


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
