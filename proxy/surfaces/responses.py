"""``POST /v1/responses``: the OpenAI Responses API, a surface adapter on the turn
pipeline (proxy/turn/pipeline.py, the port in proxy/surfaces/base.py), over the sessions
chat completions use.

The request is read into chat-format messages (``responses_request``); the pipeline does
the turn (load, sync, select, render, the upstream call with its built-in tool rounds,
the reply stored in one append, compaction after it); the reply goes back as a response
object or the Responses event stream (``responses_stream.EventWriter``, one per request:
a surface instance serves one request).

- ``previous_response_id`` names a response the proxy stored: the turn continues that
  response's session from that response (a delta client; an earlier response forks,
  a response of an abandoned branch brings its chain back: ``responses_chain``).
- Without it the session is identified as for chat completions (path, headers,
  ``metadata.session_id``, ``conversation``, ``prompt_cache_key``, fingerprint); a
  client that resends its whole input (Codex, ``store: false``) is synced as a
  full-history client.
- The upstream is called with the Responses API when the agent's ``llm.api`` or
  ``MEMORY_PROXY_RESPONSES_API`` says so (``auto``: until it answers 404/405 there), with
  chat completions otherwise and for litellm's provider models (``pick_upstream``).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import BadRequest, NotFound, ProxyError
from proxy.http import limits
from proxy.http.requests import parse_json_object, read_body
from proxy.http.responses import json_response
from proxy.services import Services
from proxy.surfaces.chat import forwarded_headers, upstream_body
from proxy.surfaces.responses_chain import branch_point
from proxy.surfaces.responses_reply import response_object, responses_usage
from proxy.surfaces.responses_request import OPTIONS_KEY, ResponsesRequest, chat_body
from proxy.surfaces.responses_state import RESPONSE_META, find, new_response_id
from proxy.surfaces.responses_stream import EventWriter
from proxy.turn import sync_plan
from proxy.turn.identity import Identity, client_key, identify, identify_turn, namespace_for
from proxy.turn.identity import _checked as checked_identifier
from proxy.turn.load import load, resolve_agent
from proxy.turn.pipeline import serve
from proxy.turn.render import render
from proxy.turn.select import select, tools_tokens
from proxy.turn.state import Turn, TurnRequest
from proxy.turn.sync import incoming, sync
from proxy.upstreams.base import SSEEvent, Upstream, UpstreamRequest, UpstreamResponse
from proxy.upstreams.openai_http import OpenAIUpstream
from proxy.upstreams.responses_http import ResponsesUpstream, chat_request
from strategies.tokens import count_message

__all__ = ["ResponsesSurface", "input_tokens", "pick_upstream", "responses_endpoint"]

# what the reply's record keeps of the response (GET /v1/responses/{id})
KEPT = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls",
        "previous_response_id", "reasoning", "store", "temperature", "text", "tool_choice",
        "top_p", "truncation", "user", "prompt_cache_key")


def pick_upstream(services: Services, api: str | None, model: str) -> Upstream:
    """The upstream a Responses turn calls: the Responses API adapter over the direct
    upstream, or the services' chat upstream (litellm's provider models, a ``chat``
    choice, an upstream that is not the direct OpenAI-compatible one)."""
    choice = api if api in ("chat", "responses") else services.settings.responses_api
    upstream = services.upstream
    if choice == "chat":
        return upstream
    uses_litellm = getattr(upstream, "uses_litellm", None)
    if uses_litellm is not None and uses_litellm(model):
        return upstream
    direct = getattr(upstream, "direct", upstream)
    if not isinstance(direct, OpenAIUpstream):
        return upstream
    adapters = services.responses_upstreams
    adapter = adapters.get(choice)
    if adapter is None:
        adapter = adapters[choice] = ResponsesUpstream(direct, detect=choice == "auto")
    return adapter if not adapter.chat_only else upstream


async def session_of(
    services: Services, request: ResponsesRequest, headers: dict[str, str],
    path_params: dict[str, str],
) -> tuple[Identity, int | None, list[dict[str, Any]]]:
    """The turn's session, where in it the turn continues (None: at its head, as for
    chat) and the messages of an abandoned branch to append again first."""
    if request.previous_response_id:
        try:
            key, ref = await find(services, headers, request.previous_response_id)
        except NotFound:
            raise BadRequest(
                f"Previous response with id '{request.previous_response_id[:200]}' not found.",
                param="previous_response_id", code="previous_response_not_found",
            ) from None
        branch_at, replay = await branch_point(services, key, ref)
        return Identity(key.namespace, key.agent, key.session, "header"), branch_at, replay
    identity = identify(
        path_params=path_params,
        headers=headers,
        body=request.body,
        api_key=client_key(headers),
        system=request.system,
        conversation=request.conversation,
        user_as_session=lambda agent: resolve_agent(services, agent).definition.userAsSession,
    )
    conversation = request.session_name
    if conversation and identity.source not in ("path", "header", "metadata"):
        identity = Identity(
            namespace_for(client_key(headers)), identity.agent,
            checked_identifier(conversation, "conversation"), "metadata",
        )
    return identity, None, []


def kept_meta(request: ResponsesRequest, created_at: int, model: str) -> dict[str, Any]:
    """What the reply's record keeps of the response, given the reply's usage."""
    kept = {k: request.body[k] for k in KEPT if request.body.get(k) is not None}
    kept["created_at"] = created_at
    kept["model"] = model

    def with_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
        return {**kept, "usage": responses_usage(usage)}

    return {RESPONSE_META: with_usage}


async def read_request(
    services: Services, request: Request
) -> tuple[ResponsesRequest, TurnRequest]:
    body = parse_json_object(await read_body(request, services.settings.max_body_bytes))
    parsed = ResponsesRequest.parse(body)
    limits.check_identifiers(body)
    headers = {k.lower(): v for k, v in reversed(request.headers.items())}
    forwarded = forwarded_headers(headers)
    limits.check_limits(services.settings, [*parsed.system, *parsed.conversation], forwarded)
    memory_off = headers.get("x-memory", "").lower() == "off"
    if memory_off and parsed.previous_response_id:
        raise BadRequest("'previous_response_id' needs memory (X-Memory: off was sent)",
                         param="previous_response_id")
    turn_request = TurnRequest(
        conversation=parsed.conversation,
        system=parsed.system,
        model=str(body["model"]) if body.get("model") else None,
        stream=parsed.stream,
        options=chat_body(parsed),
        # the tools as the client sent them share the context window (built-in and
        # namespaced ones too, which the chat body leaves out)
        tools=body.get("tools"),
        forwarded=forwarded,
        headers=headers,
        path_params=dict(request.path_params),
        memory_off=memory_off,
        history_header=headers.get("x-memory-history"),
        retry=sync_plan.RetryHint.from_headers(headers),
    )
    if not memory_off:
        identity, branch_at, replay = await session_of(
            services, parsed, headers, turn_request.path_params
        )
        turn_request.identity, turn_request.branch_at = identity, branch_at
        turn_request.conversation = [*replay, *parsed.conversation]
        if parsed.previous_response_id:
            turn_request.history_header = "delta"  # the chain supplies the rest
    return parsed, turn_request


class ResponsesSurface:
    """One Responses API request (an instance per request: it holds the stream's state)."""

    name = "responses"
    stream_media_type = "text/event-stream"

    def __init__(self) -> None:
        self.request: ResponsesRequest | None = None
        self.response_id = ""
        self.created_at = int(time.time())
        self.writer: EventWriter | None = None

    async def parse(self, request: Request, services: Services) -> TurnRequest:
        parsed, turn_request = await read_request(services, request)
        self.request = parsed
        identity = turn_request.identity
        agent = resolve_agent(services, identity.agent if identity else "default")
        model = str(parsed.body.get("model") or agent.definition.llm.model or "")
        upstream = pick_upstream(services, agent.definition.llm.api, model)
        native = isinstance(upstream, ResponsesUpstream)
        turn_request.upstream = upstream
        turn_request.api = "responses" if native else "chat"
        self.response_id = new_response_id(
            identity.agent if identity else "default", identity.session if identity else "off"
        )
        if parsed.store and identity is not None:
            turn_request.response_id = self.response_id
        turn_request.reply_meta = kept_meta(parsed, self.created_at, model)
        if native:
            turn_request.options[OPTIONS_KEY] = parsed.options()
        self.writer = EventWriter(parsed.body, self.response_id, model)
        return turn_request

    def error_body(self, exc: ProxyError) -> bytes:
        return exc.body()

    def upstream_body(
        self, request: TurnRequest, messages: list[dict[str, Any]] | None, api: str,
        turn: Turn | None = None,
    ) -> dict[str, Any]:
        if api != "chat":
            raise NotImplementedError(f"the Responses surface renders for chat, not {api}")
        window = messages if messages is not None else [*request.system, *request.conversation]
        body = upstream_body(request.options, window)
        if request.api == "responses":
            return body
        return chat_request(UpstreamRequest(body)).body  # native parts: Responses only

    def reply(
        self, turn: Turn | None, response: UpstreamResponse, headers: dict[str, str]
    ) -> Response:
        assert self.request is not None
        completion = orjson.loads(response.body)
        out = response_object(
            self.request.body, self.response_id, completion, created_at=self.created_at
        )
        return Response(orjson.dumps(out), response.status_code, headers,
                        media_type="application/json")

    def stream_event(
        self, turn: Turn | None, chunk: dict[str, Any] | None, event: SSEEvent
    ) -> bytes | None:
        assert self.writer is not None
        if chunk is None:  # memory off: the relay did not read it
            try:
                chunk = orjson.loads(event.data) if event.data[:1] == b"{" else None
            except orjson.JSONDecodeError:
                chunk = None
            if not isinstance(chunk, dict):
                return None
        return self.writer.feed(chunk) or None

    def stream_end(self, turn: Turn | None) -> bytes:
        assert self.writer is not None
        return self.writer.complete()

    def stream_error(self, exc: ProxyError) -> bytes:
        if self.writer is None:
            self.writer = EventWriter({}, self.response_id, "")
        return self.writer.fail(exc.code, exc.message)


async def responses_endpoint(request: Request) -> Response:
    return await serve(ResponsesSurface(), request)


async def input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: the tokens the request's input would take as
    the proxy sends it (the session's window, the system prompt and the tools): the
    pipeline's steps up to render, nothing stored and no upstream call."""
    services: Services = request.app.state.services
    surface = ResponsesSurface()
    request.state.surface = surface  # errors take the surface's shape
    parsed, turn_request = await read_request(services, request)
    model = str(parsed.body.get("model") or "")
    if turn_request.memory_off:
        messages = [*parsed.system, *parsed.conversation]
        extra = tools_tokens(turn_request.tools, model)
    else:
        turn = identify_turn(services, turn_request)
        history = incoming(turn)
        await load(services, turn, history)
        await sync(services, turn, history)
        await select(services, turn)
        render(services, turn)
        messages, extra, model = turn.messages, turn.extra_tokens, turn.model
    counted = sum(count_message(m, model) for m in messages) + extra
    return json_response({"object": "response.input_tokens", "input_tokens": counted})
