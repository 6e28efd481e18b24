"""The API a turn's upstream speaks: how the forward step calls it and how the reply is
read back into the record the turn stores.

A surface picks one per request (``Surface.upstream_api``; chat completions when it has
no choice to make): chat completions (``CHAT``: the OpenAI-compatible upstream, or litellm
for ``provider/model`` ids) or Anthropic's Messages API (proxy/surfaces/messages_api.py).
The window is rendered for that API (``MappingContext.api``), the surface renders the
request body for it, and the reply's reader rebuilds the stored record from its replies
and stream events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Receive

from proxy.surfaces.chat_reply import ReplyAccumulator, add_stream_event, completion_of
from proxy.tools import builtin as builtin_tools
from proxy.turn import forward
from proxy.upstreams.base import UpstreamRequest, UpstreamResponse, UpstreamStream

if TYPE_CHECKING:
    from proxy.services import Services
    from proxy.turn.state import Turn, TurnRequest


class ReplyReader(Protocol):
    """Rebuilds the reply record (chat form) from an upstream's reply."""

    @property
    def complete(self) -> bool:
        """The reply came whole (a stream's final event was seen)."""

    @property
    def usage(self) -> dict[str, Any] | None:
        """The reply's usage in the form the turn's write reads (``prompt_tokens``...)."""

    def add(self, data: bytes) -> dict[str, Any]:
        """One stream event's data, parsed; junk or an error event raises a ProxyError."""

    def add_whole(self, body: bytes) -> None:
        """A whole reply's body; one that is not a reply raises ``UpstreamReplyError``."""

    def reply(self) -> dict[str, Any] | None:
        """The assistant message to store (chat form), or None when nothing came."""


class UpstreamApi(Protocol):
    name: str

    def request(
        self, services: Services, turn: Turn, body: dict[str, Any]
    ) -> tuple[UpstreamRequest, Any]:
        """The upstream call for ``body`` and the built-in tools offered with it."""

    async def call(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> tuple[UpstreamResponse, dict[str, Any] | None]:
        """A whole reply after any hidden built-in rounds, and the usage to store when
        those ran (None: the reply's own)."""

    async def open_stream(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> UpstreamStream:
        """A streamed reply (hidden built-in rounds inside it)."""

    def stream_usage(self, stream: UpstreamStream) -> dict[str, Any] | None:
        """The usage to store after a stream's hidden rounds (None: the reply's own)."""

    def reader(self) -> ReplyReader:
        """A reader for one reply."""


class ChatReader:
    """Chat completions: a completion or its chunks (proxy/surfaces/chat_reply.py)."""

    def __init__(self) -> None:
        self.accumulator = ReplyAccumulator()

    @property
    def complete(self) -> bool:
        return self.accumulator.complete

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.accumulator.usage

    def add(self, data: bytes) -> dict[str, Any]:
        return add_stream_event(self.accumulator, data)

    def add_whole(self, body: bytes) -> None:
        # a 200 that is not a completion is the upstream's error, and nothing is stored
        self.accumulator.add_response(completion_of(body))

    def reply(self) -> dict[str, Any] | None:
        return self.accumulator.message()


class ChatApi:
    name = "chat"

    def request(
        self, services: Services, turn: Turn, body: dict[str, Any]
    ) -> tuple[UpstreamRequest, builtin_tools.Offered | None]:
        return forward.chat_request(services, turn, body)

    async def call(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> tuple[UpstreamResponse, dict[str, Any] | None]:
        return await forward.call(services, request, offered, receive, turn_request.upstream)

    async def open_stream(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> UpstreamStream:
        return await forward.open_stream(services, request, offered, receive,
                                         turn_request.upstream)

    def stream_usage(self, stream: UpstreamStream) -> dict[str, Any] | None:
        return forward.stream_usage(stream)

    def reader(self) -> ReplyReader:
        return ChatReader()


CHAT = ChatApi()


def upstream_api_of(surface: Any, request: TurnRequest) -> UpstreamApi:
    """The API the surface sends ``request`` to (chat completions unless it says)."""
    choose = getattr(surface, "upstream_api", None)
    return choose(request) if choose is not None else CHAT
