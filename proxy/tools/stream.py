"""Built-in tools in a streaming reply: the hidden rounds inside one SSE stream.

``FetchStream`` wraps the upstream stream (it is an ``UpstreamStream`` itself, so the relay
in ``proxy/surfaces/chat.py`` stays unchanged). Text deltas go through as they arrive; tool-call
deltas are held only until their call's name is known (the first fragment of each index,
normally), and the built-in calls' (``fetch_tool_result``, ``search_history``) never
reach the client. When a round ends in built-in calls only, its finish and usage chunks
and its ``[DONE]`` are held back, the calls are answered from the store, and the next
round's chunks continue the same stream under the first round's ``id`` (without a second
role delta, after a blank line when both rounds wrote text), up to one ``[DONE]``. The
rules are those of ``proxy/tools/builtin.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from proxy.services import Services
from proxy.tools.builtin import (
    MAX_ROUNDS,
    Offered,
    add_usage,
    answer_all,
    hidden_call,
    memory_usage,
    next_body,
)
from proxy.upstreams.base import SSEEvent, Upstream, UpstreamRequest, UpstreamStream

__all__ = ["FetchStream"]

logger = logging.getLogger("memory_proxy.builtin_tools")


class _Call:
    __slots__ = ("arguments", "id", "name")

    def __init__(self, name: str) -> None:
        self.id: str | None = None
        self.name = name
        self.arguments: list[str] = []

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": "".join(self.arguments)}}


class _Round:
    """What one upstream stream carried: its text, its built-in calls ("fetch" calls
    here), how its tool-call indices map to the client's, and the deltas held until a
    call's name arrives."""

    def __init__(self, offered: Offered) -> None:
        self.offered = offered
        self.names: dict[int, str] = {}  # index -> a built-in call's name
        self.text: list[str] = []
        self.kinds: dict[int, bool] = {}  # index -> is a built-in call
        self.fetches: dict[int, _Call] = {}
        self.client: dict[int, int] = {}  # upstream index -> client index
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.last_index: int | None = None
        self.finish_reason: str | None = None
        self.usage: Any = None
        # native parts (a Responses upstream's reasoning items), held to the round's end:
        # those of a hidden round go with it (their call is never stored)
        self.natives: list[dict[str, Any]] = []

    @property
    def hidden(self) -> bool:
        """The round ended in fetch calls only: the client does not see its ending."""
        return bool(self.fetches) and not self.client and not self.held

    def index_of(self, delta: dict[str, Any]) -> int:
        index = delta.get("index")
        if isinstance(index, int):
            self.last_index = index
            return index
        # a few providers omit the index: a new id starts a new call
        known = [*self.kinds, *self.held]
        if delta.get("id") or self.last_index is None:
            self.last_index = max(known, default=-1) + 1
        return self.last_index

    def split(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The client's share of ``deltas``; fetch fragments are kept here."""
        out: list[dict[str, Any]] = []
        for delta in deltas:
            if not isinstance(delta, dict):
                continue
            index = self.index_of(delta)
            fetch = self.kinds.get(index)
            if fetch is None:
                name = (delta.get("function") or {}).get("name")
                if not name:
                    self.held.setdefault(index, []).append(delta)
                    continue
                fetch = self.kinds[index] = self.offered.answers(name)
                if fetch:
                    self.names[index] = name
                else:
                    self.client[index] = len(self.client)
                for fragment in [*self.held.pop(index, ()), delta]:
                    self.route(index, fetch, fragment, out)
            else:
                self.route(index, fetch, delta, out)
        return out

    def route(self, index: int, fetch: bool, delta: dict[str, Any], out: list[dict[str, Any]]
              ) -> None:
        if not fetch:
            out.append({**delta, "index": self.client[index]})
            return
        call = self.fetches.get(index)
        if call is None:
            call = self.fetches[index] = _Call(self.names[index])
        # the tool message must answer some id, even from a provider that sent none
        call.id = call.id or delta.get("id") or f"call_fetch_{index}"
        arguments = (delta.get("function") or {}).get("arguments")
        if arguments:
            call.arguments.append(arguments)

    def release_held(self) -> list[dict[str, Any]]:
        """Deltas whose call never named itself: the client's, as sent."""
        out: list[dict[str, Any]] = []
        for index in sorted(self.held):
            self.kinds[index] = False
            self.client[index] = len(self.client)
            for fragment in self.held[index]:
                self.route(index, False, fragment, out)
        self.held.clear()
        return out

    def calls(self) -> list[dict[str, Any]]:
        return [self.fetches[i].to_dict() for i in sorted(self.fetches)]


def _event(chunk: dict[str, Any]) -> SSEEvent:
    data = orjson.dumps(chunk)
    return SSEEvent(raw=b"data: " + data + b"\n\n", data=data)


class FetchStream:
    """An upstream stream with the hidden built-in rounds run inside it (an ``UpstreamStream``).

    ``memory_usage`` is the usage to store once hidden rounds ran (None otherwise).
    """

    def __init__(
        self,
        services: Services,
        offered: Offered,
        request: UpstreamRequest,
        first: UpstreamStream,
        upstream: Upstream | None = None,
    ) -> None:
        self.status_code = first.status_code
        self.headers = first.headers
        self.services = services
        self.offered = offered
        self.request = request
        self.stream = first
        self.upstream = upstream or services.upstream
        self.rounds = 0
        self.memory_usage: dict[str, Any] | None = None
        self._events: AsyncGenerator[SSEEvent, None] | None = None
        self._id: Any = None
        self._first_usage: Any = None
        self._total: dict[str, Any] | None = None
        self._text_tail = ""

    def __aiter__(self) -> AsyncIterator[SSEEvent]:
        if self._events is None:
            self._events = self._run()
        return self._events

    async def aclose(self) -> None:
        if self._events is not None:
            await self._events.aclose()
        await self.stream.aclose()

    def _continues(self, state: _Round) -> bool:
        """The round ended in fetch calls only and another round is allowed."""
        return state.hidden and state.finish_reason is not None and self.rounds < MAX_ROUNDS

    async def _run(self) -> AsyncGenerator[SSEEvent, None]:
        messages = list(self.request.body.get("messages") or ())
        while True:
            state = _Round(self.offered)
            done: SSEEvent | None = None
            async for event in self.stream:
                if event.done:
                    done = event
                    break
                if event.data[:1] != b"{":
                    yield event  # keep-alives and comments
                    continue
                try:
                    chunk = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    yield event
                    continue
                out, changed = self._filter(chunk, state)
                if out is not None:
                    yield _event(out) if changed or self.rounds else event
            if not self._continues(state):
                if done is not None:
                    yield done
                return
            if self.rounds == 0:
                self._first_usage = state.usage
            calls = state.calls()
            messages += [hidden_call("".join(state.text), calls)]
            messages += await answer_all(self.services.store, self.offered, calls)
            self.rounds += 1
            self.memory_usage = memory_usage(self._first_usage)
            logger.info("%s: hidden built-in tool round %d", self.offered.key.session,
                        self.rounds)
            body = next_body(self.request.body, messages, self.rounds, self.offered)
            await self.stream.aclose()
            self.stream = await self.upstream.chat_stream(
                UpstreamRequest(body, self.request.headers)
            )

    def _filter(self, chunk: dict[str, Any], state: _Round) -> tuple[dict[str, Any] | None, bool]:
        """The chunk to send the client, or None, and whether it was changed."""
        if self._id is None:
            self._id = chunk.get("id")
        elif self.rounds:
            chunk["id"] = self._id
        changed = False
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            choices = []
        choice = choices[0] if choices else None
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            changed = self._filter_choice(choice, state)
            if changed and len(choices) == 1 and not choice.get("delta") \
                    and not choice.get("finish_reason") and not chunk.get("usage"):
                return None, True
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage:
            state.usage = usage
            self._total = add_usage(self._total, usage)
            if self._continues(state):
                if not choices:
                    return None, True
                chunk["usage"] = None
                changed = True
            elif self.rounds:
                chunk["usage"] = self._total
                changed = True
        return chunk, changed

    def _filter_choice(self, choice: dict[str, Any], state: _Round) -> bool:
        changed = False
        delta = choice.get("delta")
        if isinstance(delta, dict):
            changed = self._filter_delta(delta, state)
        finish = choice.get("finish_reason")
        if finish:
            state.finish_reason = finish
            released = state.release_held()
            if released:
                delta = choice.setdefault("delta", {})
                delta["tool_calls"] = [*(delta.get("tool_calls") or ()), *released]
                changed = True
            if self._continues(state):
                choice["finish_reason"] = None
                changed = True
            elif state.natives:
                delta = choice.setdefault("delta", {})
                delta["native"] = state.natives
                changed = True
            if not self._continues(state) and state.hidden and finish == "tool_calls":
                choice["finish_reason"] = "stop"
                changed = True
        return changed

    def _filter_delta(self, delta: dict[str, Any], state: _Round) -> bool:
        changed = False
        natives = delta.pop("native", None)
        if natives:
            state.natives.extend(natives)
            changed = True
        if self.rounds:
            # the client already has the role: a later round's opening adds nothing
            for name in ("role", "refusal", "content"):
                if name in delta and (name == "role" or not delta[name]):
                    delta.pop(name)
                    changed = True
        content = delta.get("content")
        if isinstance(content, str) and content:
            state.text.append(content)
            tail = self._text_tail
            if self.rounds and len(state.text) == 1 and tail and not tail[-1].isspace() \
                    and not content[0].isspace():
                delta["content"] = "\n\n" + content
                changed = True
            self._text_tail = content
        calls = delta.get("tool_calls")
        if calls:
            forwarded = state.split(calls if isinstance(calls, list) else [])
            if forwarded != calls:
                changed = True
                if forwarded:
                    delta["tool_calls"] = forwarded
                else:
                    delta.pop("tool_calls")
        return changed
