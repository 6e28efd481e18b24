"""The long-lived parts of a running proxy, built by ``create_app`` and opened in its lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from proxy.admin.auth import FailedAttempts
from proxy.agents import AgentRegistry
from proxy.settings import Settings
from proxy.upstreams.base import Upstream
from storage.base import Store
from storage.parts import PartContentReader
from strategies.mapper import LlmMessageMapper
from strategies.records import SessionKey

logger = logging.getLogger("memory_proxy")


@dataclass
class Services:
    settings: Settings
    store: Store
    upstream: Upstream
    agents: AgentRegistry
    mapper: LlmMessageMapper
    # where media bytes are read back (None: the store's own parts, see storage/parts.py)
    part_reader: PartContentReader | None = None
    # latest admin override seen per agent, so a turn resolves its config before loading
    overrides: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # sessions compacting in this process: turns wait (bounded) for the event
    compactions: dict[SessionKey, asyncio.Event] = field(default_factory=dict)
    # the last upstream headers per session, in memory only, for background summaries
    credentials: OrderedDict[SessionKey, dict[str, str]] = field(default_factory=OrderedDict)
    # sessions whose last turn went to the Messages upstream (their summaries go there too)
    messages_sessions: OrderedDict[SessionKey, bool] = field(default_factory=OrderedDict)
    summarizer_budget: Any = None
    started: bool = False
    # failed admin authentications per client address (proxy/admin/auth.py)
    admin_failures: FailedAttempts = field(default_factory=lambda: FailedAttempts(10))
    # the Messages API upstream (proxy/upstreams/anthropic_http.py), built on first use
    messages_upstream: Any = None
    # the Responses API adapters over the direct upstream by MEMORY_PROXY_RESPONSES_API
    # choice ("auto" remembers an upstream without one), made on first use
    # (proxy/surfaces/responses.py pick_upstream)
    responses_upstreams: dict[str, Any] = field(default_factory=dict)

    def remember_credentials(
        self, key: SessionKey, headers: dict[str, str], *, messages_api: bool = False
    ) -> None:
        self.credentials[key] = headers
        self.credentials.move_to_end(key)
        if len(self.credentials) > 10_000:
            self.credentials.popitem(last=False)
        if messages_api:
            self.messages_sessions[key] = True
            self.messages_sessions.move_to_end(key)
            if len(self.messages_sessions) > 10_000:
                self.messages_sessions.popitem(last=False)
        else:
            self.messages_sessions.pop(key, None)

    def summary_upstream(self, key: SessionKey) -> Any:
        """Where the proxy's own calls for a session go (chat form): the upstream its turns
        went to."""
        if key in self.messages_sessions:
            from proxy.surfaces.messages_chat import MessagesAsChat, messages_upstream

            return MessagesAsChat(messages_upstream(self))
        return self.upstream

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run after-turn work in the background; it never fails the request that queued it."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def drain(self, wait: float = 10.0) -> None:
        """Wait for background work (shutdown, tests)."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=wait)
