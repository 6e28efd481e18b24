"""What a turn carries from step to step (proxy/turn/pipeline.py).

``TurnRequest`` is what an API surface parsed from its HTTP request; ``Turn`` is filled
by the steps in order: identify sets ``identity`` and ``key``, load the agent, strategy
and ``snapshot``, sync the ``sync`` plan, the kept ``stored`` records and the
``new_messages``, select the ``context`` and ``window``, render ``messages`` (the window
as chat messages) and ``window_meta``, persist ``appended``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.turn import prompt_cache

if TYPE_CHECKING:
    from proxy.agents import ResolvedAgent
    from proxy.turn.identity import Identity
    from proxy.turn.parts import PartBlob
    from proxy.turn.sync_plan import RetryHint, SyncPlan
    from proxy.upstreams.base import Upstream
    from strategies.base import Strategy, Window, WindowContext
    from strategies.mapper import MappingContext
    from strategies.records import LoadSpec, SessionKey, SessionSnapshot, StoredMessage


@dataclass(slots=True)
class TurnRequest:
    """One API request as the pipeline sees it, whatever surface it came in on.

    ``conversation`` is the new or resent conversation in chat-format messages (the
    system prompt apart, in ``system``); ``options`` is the rest of the request, sent
    upstream as it came (a surface renders it for the upstream's API)."""

    conversation: list[dict[str, Any]]
    system: list[dict[str, Any]]
    model: str | None
    stream: bool
    options: dict[str, Any]
    # the tool definitions (they share the context window: their tokens are counted)
    tools: Any = None
    # headers forwarded upstream (credentials, provider headers)
    forwarded: dict[str, str] = field(default_factory=dict)
    # identity hints: the request's headers, path parameters and body
    headers: dict[str, str] = field(default_factory=dict)
    path_params: dict[str, str] = field(default_factory=dict)
    # ``X-Memory: off``: forwarded untouched, nothing loaded or stored
    memory_off: bool = False
    history_header: str | None = None
    retry: RetryHint | None = None
    # the surface's own per-request choices (e.g. whether the client asked for usage)
    extra: dict[str, Any] = field(default_factory=dict)
    # a session the surface already knows (a Responses API ``previous_response_id``
    # names its session): identify takes it as it is
    identity: Identity | None = None
    # the conversation continues after the stored message with this seq rather than the
    # session's head: the active messages after it are superseded (a Responses API
    # ``previous_response_id`` naming an earlier response forks there)
    branch_at: int | None = None
    # the API the window is rendered for: native parts of other APIs are left out
    # (strategies/native.py); the upstream it is sent to (None: the services' upstream)
    api: str = "chat"
    upstream: Upstream | None = None
    # a Responses API response id stored with the turn's write (Store.find_response), and
    # what the reply's record keeps in its meta besides (a callable value is given the
    # reply's usage)
    response_id: str | None = None
    reply_meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Turn:
    """A turn being served: the request, then what each step produced."""

    request: TurnRequest
    identity: Identity
    key: SessionKey
    agent: ResolvedAgent
    model: str
    # load
    strategy: Strategy | None = None
    spec: LoadSpec | None = None
    snapshot: SessionSnapshot | None = None
    # sync
    sync: SyncPlan | None = None
    stored: list[StoredMessage] = field(default_factory=list)
    new_messages: list[StoredMessage] = field(default_factory=list)
    system_prompt: list[dict[str, Any]] | None = None
    system_tokens: int = 0
    system_changed: bool = False
    # a large input (or a large stored message) is worked on a thread
    heavy: bool = False
    # the bytes of the new records' media parts, stored with the turn
    blobs: dict[str, PartBlob] = field(default_factory=dict)
    # select
    context_window: int = 0
    extra_tokens: int = 0
    mapping: MappingContext | None = None
    context: WindowContext | None = None
    window: Window | None = None
    # window.modified, computed once (it looks at every item)
    modified: bool = False
    # render: the window as chat messages, and as stored on the reply's record
    # (proxy/turn/prompt_cache.py) with where and why its prefix differs from the last
    messages: list[dict[str, Any]] = field(default_factory=list)
    window_meta: dict[str, Any] = field(default_factory=dict)
    # the tool definitions as sent upstream (the summarizer may send them again)
    tools: Any = None
    # persist: the records written, with their assigned seqs
    appended: list[StoredMessage] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def headers(self) -> dict[str, str]:
        """The memory headers of the reply."""
        assert self.window is not None and self.strategy is not None
        return {
            "x-memory-agent": self.identity.agent,
            "x-memory-session": self.identity.session,
            "x-memory-strategy": self.agent.config.kind,
            "x-memory-window-tokens": str(self.window.tokens),
            "x-memory-context-modified": "true" if self.modified else "false",
            "x-memory-prefix-change": prompt_cache.change_header(
                self.window_meta.get("changes", ())
            ),
        }
