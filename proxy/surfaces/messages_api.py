"""The Messages API as a turn's upstream API (proxy/turn/upstream_api.py): the call to the
Messages upstream (``MEMORY_PROXY_ANTHROPIC_URL``) with the built-in tools' hidden rounds
(proxy/surfaces/messages_tools.py), and the reader that rebuilds the stored record from a
whole message or Anthropic's stream events. ``TRANSLATED`` is chat completions for the
Messages surface: its reader stores tool calls in the form a resent ``tool_use`` is
stored in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Receive

from proxy.errors import UpstreamStatusError
from proxy.http.disconnect import unless_disconnected
from proxy.surfaces import messages_tools
from proxy.surfaces.messages_chat import messages_upstream
from proxy.surfaces.messages_reply import MessageAccumulator, message_of, store_usage
from proxy.surfaces.messages_translate import normalized_reply
from proxy.turn.upstream_api import ChatApi, ChatReader, ReplyReader
from proxy.upstreams.base import UpstreamRequest, UpstreamResponse, UpstreamStream

if TYPE_CHECKING:
    from proxy.services import Services
    from proxy.turn.state import Turn, TurnRequest

# the status an error event's type stands for
ERROR_STATUSES = {"invalid_request_error": 400, "authentication_error": 401,
                  "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                  "rate_limit_error": 429, "overloaded_error": 529}


class MessagesReader:
    def __init__(self) -> None:
        self.accumulator = MessageAccumulator()

    @property
    def complete(self) -> bool:
        return self.accumulator.complete

    @property
    def usage(self) -> dict[str, Any] | None:
        return store_usage(self.accumulator.usage)

    def add(self, data: bytes) -> dict[str, Any]:
        event = self.accumulator.add_data(data)
        if event["type"] == "error":
            # the upstream's error event ends the stream: passed on as it came
            found = event.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            raise UpstreamStatusError(
                str(error.get("message") or "upstream stream error"),
                status_code=ERROR_STATUSES.get(str(error.get("type")), 500),
                body=orjson.dumps(event), content_type="application/json",
            )
        return event

    def add_whole(self, body: bytes) -> None:
        self.accumulator.add_message(message_of(body))

    def reply(self) -> dict[str, Any] | None:
        return self.accumulator.record()


class MessagesApi:
    name = "messages"

    def request(
        self, services: Services, turn: Turn, body: dict[str, Any]
    ) -> tuple[UpstreamRequest, Any]:
        assert turn.window is not None
        offered = messages_tools.offer(body, turn.agent, turn.key, turn.window)
        turn.tools = body.get("tools")  # the summarizer may send them again
        return UpstreamRequest(body, turn.request.forwarded), offered

    async def call(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> tuple[UpstreamResponse, dict[str, Any] | None]:
        upstream = messages_upstream(services)
        query = str(turn_request.extra.get("query") or "")
        response = await unless_disconnected(receive, upstream.messages(request, query))
        if offered is None:
            return response, None
        response, usage = await unless_disconnected(receive, messages_tools.complete(
            services, upstream, offered, request, response, query))
        return response, store_usage(usage)

    async def open_stream(
        self, services: Services, request: UpstreamRequest, offered: Any,
        receive: Receive | None, turn_request: TurnRequest,
    ) -> UpstreamStream:
        upstream = messages_upstream(services)
        query = str(turn_request.extra.get("query") or "")
        stream: Any = await unless_disconnected(receive, upstream.messages_stream(request, query))
        if offered is not None:
            stream = messages_tools.RoundsStream(services, upstream, offered, request, stream,
                                                 query)
        return stream  # type: ignore[no-any-return]

    def stream_usage(self, stream: UpstreamStream) -> dict[str, Any] | None:
        return None

    def reader(self) -> ReplyReader:
        return MessagesReader()


class NormalizedChatReader(ChatReader):
    def reply(self) -> dict[str, Any] | None:
        return normalized_reply(super().reply())


class TranslatedChatApi(ChatApi):
    """Chat completions serving the Messages surface."""

    def reader(self) -> ReplyReader:
        return NormalizedChatReader()


MESSAGES = MessagesApi()
TRANSLATED = TranslatedChatApi()
