"""kill -9 under load: every acknowledged turn is in the store after the restart.

A turn is acknowledged when the client got the non-streaming 200 body or saw ``[DONE]``;
the proxy writes the turn (input and reply, one atomic write) before either. A turn in
flight at the kill may be stored or not, but only whole: never an input without its reply.

- The proxy (``python -m proxy.cli serve`` in a child process) is killed mid-load, with
  the SQLite store and with Redis, and started again on the same store.
- ``redis-server`` (AOF on) is killed mid-load and started again on the same data; the
  proxy recovers on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY
from ports import free_port
from redis_server import RedisServer
from reliability_support import ProxyProcess, report, scaled
from servers import ThreadedServer

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream, Reply, echo_reply
from proxy.turn.identity import namespace_for
from storage.registry import open_store
from strategies.records import LoadSpec, SessionKey, StoredMessage

WRITERS = 6
KILL_CYCLES = scaled(1, 5)
# turn numbers unique across loads, so a turn stored twice shows up
TURN_NUMBERS = itertools.count()


def slow_echo(body: dict) -> Reply:
    """The echo, a little slow, so that turns are in flight when the kill comes."""
    return Reply.text(echo_reply(body).content or "ok", first_token_delay=0.01,
                      delay_between_chunks=0.002)


@pytest.fixture
def fake(fake_upstream: FakeUpstream) -> FakeUpstream:
    fake_upstream.reset(default_reply=slow_echo)
    return fake_upstream


class Load:
    """Delta writers, one session each, sending numbered turns until stopped; half of
    them stream. ``acknowledged[w]`` holds the turns the client saw complete."""

    def __init__(self, base: Callable[[], str], *, keep_going: bool = False) -> None:
        self.base = base
        self.keep_going = keep_going  # on errors, retry later instead of stopping
        self.stop = threading.Event()
        self.acknowledged: dict[int, list[str]] = {w: [] for w in range(WRITERS)}
        self.errors = 0
        self.threads = [threading.Thread(target=self.write, args=(w,), daemon=True)
                        for w in range(WRITERS)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def total(self) -> int:
        return sum(len(turns) for turns in self.acknowledged.values())

    def wait_for(self, turns: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.total() < turns:
            assert time.monotonic() < deadline, f"only {self.total()} turns acknowledged"
            time.sleep(0.01)

    def write(self, writer: int) -> None:
        stream = writer % 2 == 1
        with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client:
            while not self.stop.is_set():
                text = f"w{writer}-n{next(TURN_NUMBERS)}"
                body = {"model": "gpt-4o", "stream": stream,
                        "messages": [{"role": "user", "content": text}]}
                url = f"{self.base()}/agents/crash/sessions/w{writer}/v1/chat/completions"
                try:
                    if self.turn(client, url, body, stream):
                        self.acknowledged[writer].append(text)
                        continue
                except httpx.TransportError:
                    pass
                self.errors += 1
                if not self.keep_going:
                    return
                time.sleep(0.05)

    @staticmethod
    def turn(client: httpx.Client, url: str, body: dict, stream: bool) -> bool:
        if not stream:
            response = client.post(url, json=body)
            return response.status_code == 200 and bool(response.json()["choices"])
        with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                return False
            return any(line == "data: [DONE]" for line in response.iter_lines())


def stored_sessions(store_url: str) -> dict[int, list[StoredMessage]]:
    async def read() -> dict[int, list[StoredMessage]]:
        store = open_store(store_url)
        await store.open()
        try:
            found = {}
            for writer in range(WRITERS):
                key = SessionKey(namespace_for(CLIENT_KEY), "crash", f"w{writer}")
                found[writer] = (await store.load(key, LoadSpec(limit=1_000_000))).messages
            return found
        finally:
            await store.close()

    return asyncio.run(read())


def check_nothing_acknowledged_was_lost(load: Load, store_url: str) -> int:
    """Every acknowledged turn stored once as [input, its reply]; returns the stored turns."""
    stored_turns = 0
    for writer, messages in stored_sessions(store_url).items():
        assert len(messages) % 2 == 0
        pairs = [(messages[i], messages[i + 1]) for i in range(0, len(messages), 2)]
        for user, reply in pairs:
            assert (user.role, reply.role) == ("user", "assistant")
            assert reply.content == f"ok: {user.content}"  # whole: never an orphan input
        inputs = [user.content for user, _ in pairs]
        assert len(inputs) == len(set(inputs))
        missing = [t for t in load.acknowledged[writer] if t not in inputs]
        assert not missing, f"acknowledged but lost: {missing}"
        stored_turns += len(pairs)
    return stored_turns


@pytest.mark.soak
def test_kill_9_of_the_proxy_under_load_loses_no_acknowledged_turn(
    store_url: str, fake: FakeUpstream, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    proxy = ProxyProcess(free_port(), {
        "MEMORY_PROXY_STORE_URL": store_url, "MEMORY_PROXY_UPSTREAM_URL": fake.url,
        "MEMORY_PROXY_AGENTS_DIR": str(agents), "MEMORY_PROXY_ADMIN_TOKEN": ADMIN_TOKEN,
        "MEMORY_PROXY_LOG_LEVEL": "warning",
    }, tmp_path / "proxy.log")
    acknowledged = stored = in_flight_stored = 0
    try:
        proxy.start()
        for _ in range(KILL_CYCLES):
            with Load(lambda: proxy.base) as load:
                load.wait_for(40)
                proxy.kill(signal.SIGKILL)
            proxy.start()
            stored_now = check_nothing_acknowledged_was_lost(load, store_url)
            acknowledged += load.total()
            in_flight_stored += stored_now - stored - load.total()
            stored = stored_now
        assert httpx.post(f"{proxy.base}/agents/crash/sessions/w0/v1/chat/completions", json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "still there?"}]},
            headers={"Authorization": f"Bearer {CLIENT_KEY}"}).status_code == 200
    finally:
        proxy.stop()
    report("kill -9 proxy", store=store_url.split(":")[0], cycles=KILL_CYCLES,
           acknowledged_turns=acknowledged, lost=0,
           unacknowledged_but_stored_whole=in_flight_stored)


class FsyncRedis(RedisServer):
    """A ``redis-server`` with the AOF on and the given ``appendfsync`` policy."""

    def __init__(self, fsync: str) -> None:
        super().__init__(appendonly=True)
        self.fsync = fsync

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--appendfsync") + 1] = self.fsync
        return command


@pytest.mark.soak
@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_kill_9_of_redis_with_the_aof_on_loses_no_acknowledged_turn(
    fake: FakeUpstream, fsync: str, tmp_path: Path
) -> None:
    redis = FsyncRedis(fsync).start()
    app = create_app(Settings(store_url=redis.url, upstream_url=fake.url,
                              agents_dir=tmp_path, admin_token=ADMIN_TOKEN))
    proxy = ThreadedServer(app).start()
    try:
        acknowledged = 0
        for _ in range(KILL_CYCLES):
            with Load(lambda: proxy.base, keep_going=True) as load:
                load.wait_for(40)
                redis.kill(signal.SIGKILL)
                time.sleep(0.3)  # requests fail meanwhile (503), nothing acknowledged
                before = load.total()
                redis.start()
                load.wait_for(before + 20)  # the proxy recovered on its own
            check_nothing_acknowledged_was_lost(load, redis.url)
            acknowledged += load.total()
        report("kill -9 redis", appendfsync=fsync, cycles=KILL_CYCLES,
               acknowledged_turns=acknowledged, lost=0)
    finally:
        proxy.stop()
        redis.close()
