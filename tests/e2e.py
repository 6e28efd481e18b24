"""Helpers of the end-to-end tests: the proxy on loopback and a look into its store."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
from servers import AppHost

from proxy.services import Services
from strategies.records import LoadSpec, SessionKey, SessionSnapshot, StoredMessage

ADMIN_TOKEN = "admin-secret-token"
CLIENT_KEY = "sk-client-key-1"


class RunningProxy:
    """A proxy served on loopback (on a shared ``AppHost``), with helpers to look into its
    store."""

    def __init__(self, server: AppHost, services: Services) -> None:
        self.server = server
        self.services = services
        # closed at teardown: a client left to the cyclic GC may have its socket finalized
        # before its own close, which warns about an unclosed socket in a later test
        self.clients: list[openai.OpenAI] = []

    @property
    def base(self) -> str:
        return self.server.base

    def url(self, agent: str | None = None, session: str | None = None) -> str:
        if agent and session:
            return f"{self.base}/agents/{agent}/sessions/{session}/v1"
        if agent:
            return f"{self.base}/agents/{agent}/v1"
        return f"{self.base}/v1"

    def client(self, agent: str | None = None, session: str | None = None, *,
               api_key: str = CLIENT_KEY, **kwargs: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url(agent, session), api_key=api_key,
                               max_retries=0, timeout=20, **kwargs)
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()

    def call(self, coro: Any) -> Any:
        return self.server.call(coro)

    def key(self, agent: str, session: str, api_key: str = CLIENT_KEY) -> SessionKey:
        from proxy.turn.identity import namespace_for

        return SessionKey(namespace_for(api_key), agent, session)

    def snapshot(self, agent: str, session: str, api_key: str = CLIENT_KEY) -> SessionSnapshot:
        return self.call(self.services.store.load(self.key(agent, session, api_key),
                                                  LoadSpec(limit=100_000)))

    def stored(self, agent: str, session: str, api_key: str = CLIENT_KEY) -> list[StoredMessage]:
        return self.snapshot(agent, session, api_key).messages

    def drain(self) -> None:
        self.call(self.services.drain())


def write_agent(directory: Path, name: str, **definition: Any) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"name": name, **definition}))


def wait_for(condition: Callable[[], object], *, timeout: float = 10.0, fail: bool = True
             ) -> bool:
    """Wait until ``condition()`` holds, checking every 10 ms: True as soon as it does. At
    the deadline, an ``AssertionError`` (or False, with ``fail=False``: for "this does not
    happen within ``timeout``")."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            if fail:
                raise AssertionError(f"not within {timeout} s: {condition}")
            return False
        time.sleep(0.01)
    return True
