"""An Anthropic Messages request read into the records' chat form (pure).

``parse_request(body)`` checks what the proxy reads and turns ``system`` and ``messages``
into chat messages, the form every stored record has (strategies/records.py):

- ``system`` (a string or text blocks) -> one leading ``system`` message;
- a ``user`` message's ``tool_result`` blocks -> one ``tool`` message each, before the
  user message holding the rest of its blocks (Anthropic puts results first);
- ``text`` -> text parts; ``image`` (base64, URL) -> ``image_url`` parts; ``document``
  (base64 PDF, plain text) -> ``file`` parts: media parts, stored once like a chat
  client's; the block's other fields (``title``, ``citations``, ...) ride along under
  ``anthropic``;
- an ``assistant`` message's ``tool_use`` blocks -> ``tool_calls`` (``input`` as compact
  JSON, the form a streamed reply is stored in, so a resent history matches);
- anything chat has no form for (``thinking``, ``redacted_thinking``, server-tool blocks,
  documents by URL or file id, search results, a ``tool_result``'s ``is_error``) -> a
  native part (strategies/native.py), kept byte-exact with its message;
- a ``system``-role message inside ``messages`` (sent by some clients under betas) is
  accepted as a mid-conversation system record: it reaches the model as a user note.

``cache_control`` marks are not stored (a mark moves from turn to turn while the block it
was on stays): they are kept aside (``CacheMark``), by the message they were on, and put
back when the window is rendered (proxy/surfaces/messages_render.py).

Errors are ``BadRequest`` naming the field as Anthropic does (``messages.1.content.0``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.errors import BadRequest
from proxy.turn.history_sync import fingerprint
from strategies import native

ROLES = ("user", "assistant", "system")
# a native part marking where a tool use stood among its message's blocks (its block is
# rebuilt there from the record's tool_calls)
TOOL_USE_AT = "tool_use_at"
# block types chat has a form for; everything else is a native part
_USER_BLOCKS = ("text", "image", "document", "tool_result")
_RESULT_BLOCKS = ("text", "image", "document")


@dataclass(frozen=True, slots=True)
class CacheMark:
    """A client's ``cache_control`` on a block: the record it belongs to (its fingerprint),
    the block's place counted from the end of that message's blocks (-1: the last), the
    mark itself."""

    fingerprint: str
    from_end: int
    value: dict[str, Any]


@dataclass(slots=True)
class MessagesRequest:
    """A parsed request: ``system`` and ``conversation`` in chat form, the client's cache
    marks on them, and the request fields as sent."""

    body: dict[str, Any]
    model: str
    stream: bool
    system: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    marks: list[CacheMark] = field(default_factory=list)
    # the client marked the system prompt, a tool or a message
    client_marks: bool = False

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        tools = self.body.get("tools")
        return tools if isinstance(tools, list) and tools else None


def parse_request(body: dict[str, Any], *, count_only: bool = False) -> MessagesRequest:
    """``body`` of ``POST /v1/messages`` (``count_only``: of ``/v1/messages/count_tokens``,
    which has no ``max_tokens`` nor ``stream``)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required (a model id string)", param="model")
    if not count_only:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest("max_tokens: Field required (an integer of at least 1)",
                             param="max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: Input should be a valid boolean", param="stream")
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise BadRequest("tools: Input should be a list of objects", param="tools")
    reader = _Reader()
    system = reader.system(body.get("system"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: Field required (a non-empty list)", param="messages")
    conversation: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        conversation.extend(reader.message(message, f"messages.{index}"))
    client_marks = bool(reader.marks or reader.system_marked) or any(
        isinstance(t, dict) and "cache_control" in t for t in tools or ()
    )
    return MessagesRequest(
        body=body,
        model=model,
        stream=stream and not count_only,
        system=system,
        conversation=conversation,
        marks=reader.marks,
        client_marks=client_marks,
    )


def assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant message's content blocks in the stored (chat) form."""
    return _Reader()._assistant(blocks, "content")


def arguments_of(value: Any) -> str:
    """A ``tool_use`` input as stored in ``tool_calls``: compact JSON (the same for the
    input a client resends and the one a streamed reply assembled)."""
    return orjson.dumps(value if value is not None else {}).decode()


class _Reader:
    def __init__(self) -> None:
        self.marks: list[CacheMark] = []
        self.system_marked = False

    def system(self, value: Any) -> list[dict[str, Any]]:
        if value is None or value == "" or value == []:
            return []
        if isinstance(value, str):
            return [{"role": "system", "content": value}]
        if not isinstance(value, list):
            raise BadRequest("system: Input should be a string or a list of text blocks",
                             param="system")
        parts = []
        for index, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(
                block.get("text"), str
            ):
                raise BadRequest(f"system.{index}: Input should be a text block",
                                 param=f"system.{index}")
            self.system_marked = self.system_marked or "cache_control" in block
            parts.append(dict(block))
        return [{"role": "system", "content": parts}]

    def message(self, message: Any, where: str) -> list[dict[str, Any]]:
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: Input should be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(
                f"{where}.role: Input should be 'user' or 'assistant'; got {role!r}",
                param=f"{where}.role",
            )
        content = message.get("content")
        if isinstance(content, str):
            return [{"role": role, "content": content}]
        if not isinstance(content, list):
            raise BadRequest(f"{where}.content: Input should be a string or a list of blocks",
                             param=f"{where}.content")
        blocks = []
        for index, block in enumerate(content):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise BadRequest(f"{where}.content.{index}: Input should be a block object "
                                 "with a string type", param=f"{where}.content.{index}")
            blocks.append(block)
        if role == "assistant":
            return [self._assistant(blocks, f"{where}.content")]
        if role == "system":
            parts, marks = self._parts(blocks, f"{where}.content", _RESULT_BLOCKS)
            return [self._marked({"role": "system", "content": _compact(parts)}, marks)]
        return self._user(blocks, f"{where}.content")

    def _marked(self, message: dict[str, Any], marks: list[tuple[int, dict[str, Any]]]
                ) -> dict[str, Any]:
        if marks:
            fp = fingerprint(message)
            self.marks.extend(CacheMark(fp, from_end, value) for from_end, value in marks)
        return message

    def _user(self, blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        rest: list[tuple[int, dict[str, Any]]] = []
        for index, block in enumerate(blocks):
            if block["type"] == "tool_result":
                out.append(self._tool_result(block, f"{where}.{index}"))
            else:
                rest.append((index, block))
        if rest or not out:
            parts, marks = self._parts([b for _, b in rest], where, _USER_BLOCKS,
                                       [i for i, _ in rest])
            out.append(self._marked({"role": "user", "content": _compact(parts)}, marks))
        return out

    def _tool_result(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest(f"{where}.tool_use_id: Field required", param=f"{where}.tool_use_id")
        content = block.get("content")
        parts: list[Any]
        if content is None or isinstance(content, str):
            parts = [] if not content else [{"type": "text", "text": content}]
        elif isinstance(content, list):
            for index, inner in enumerate(content):
                if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
                    raise BadRequest(f"{where}.content.{index}: Input should be a block object",
                                     param=f"{where}.content.{index}")
            parts, _ = self._parts(content, f"{where}.content", _RESULT_BLOCKS)
        else:
            raise BadRequest(f"{where}.content: Input should be a string or a list of blocks",
                             param=f"{where}.content")
        extra = {k: v for k, v in block.items()
                 if k not in ("type", "tool_use_id", "content", "cache_control")}
        if extra:
            parts.insert(0, native.part(native.MESSAGES, {"type": "tool_result", **extra}))
        message = {"role": "tool", "tool_call_id": call_id,
                   "content": content if isinstance(content, str) and not extra
                   else _compact(parts)}
        marks = [(-1, block["cache_control"])] if isinstance(
            block.get("cache_control"), dict) else []
        return self._marked(message, marks)

    def _assistant(self, blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
        parts: list[Any] = []
        calls: list[dict[str, Any]] = []
        marks: list[tuple[int, dict[str, Any]]] = []
        count = len(blocks)
        kinds = [b["type"] for b in blocks]
        # a tool use followed by another block (interleaved thinking) keeps its place
        placed = "tool_use" in kinds and any(
            k != "tool_use" for k in kinds[kinds.index("tool_use"):])
        for index, block in enumerate(blocks):
            kind = block["type"]
            at = f"{where}.{index}"
            if isinstance(block.get("cache_control"), dict):
                marks.append((index - count, block["cache_control"]))
            if kind == "tool_use":
                call_id, name = block.get("id"), block.get("name")
                if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
                    raise BadRequest(f"{at}: a tool_use block needs a string id and name",
                                     param=at)
                call: dict[str, Any] = {
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments_of(block.get("input"))},
                }
                calls.append(call)
                if placed:
                    parts.append(native.part(native.MESSAGES, {"type": TOOL_USE_AT,
                                                               "id": call_id}))
            elif kind == "text":
                parts.append(_text_part(block, at))
            else:
                parts.append(native.part(native.MESSAGES, _without_mark(block)
                                         if "cache_control" in block else block))
        message: dict[str, Any] = {"role": "assistant", "content": _compact(parts)}
        if calls:
            message["tool_calls"] = calls
            if message["content"] == "":
                message["content"] = None
        return self._marked(message, marks)

    def _parts(
        self, blocks: list[dict[str, Any]], where: str, known: tuple[str, ...],
        indices: list[int] | None = None,
    ) -> tuple[list[Any], list[tuple[int, dict[str, Any]]]]:
        parts: list[Any] = []
        marks: list[tuple[int, dict[str, Any]]] = []
        count = len(blocks)
        for position, block in enumerate(blocks):
            at = f"{where}.{indices[position] if indices else position}"
            if isinstance(block.get("cache_control"), dict):
                marks.append((position - count, block["cache_control"]))
            kind = block["type"]
            if kind == "text":
                parts.append(_text_part(block, at))
            elif kind == "image" and kind in known:
                parts.append(_image_part(block, at))
            elif kind == "document" and kind in known:
                parts.append(_document_part(block, at))
            else:
                parts.append(native.part(native.MESSAGES, _without_mark(block)))
        return parts, marks


def _without_mark(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _extras(block: Mapping[str, Any], *used: str) -> dict[str, Any]:
    """The block's fields the chat part has no place for (kept under ``anthropic``)."""
    rest = {k: v for k, v in block.items() if k not in ("type", "cache_control", *used)}
    return {"anthropic": rest} if rest else {}


def _text_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text: Input should be a valid string", param=f"{where}.text")
    return {"type": "text", "text": text, **_extras(block, "text")}


def _source(block: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    source = block.get("source")
    if not isinstance(source, Mapping) or not isinstance(source.get("type"), str):
        raise BadRequest(f"{where}.source: Field required (an object with a type)",
                         param=f"{where}.source")
    return source


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = _source(block, where)
    kind = source["type"]
    if kind == "base64":
        data, media_type = source.get("data"), source.get("media_type")
        if not isinstance(data, str) or not isinstance(media_type, str):
            raise BadRequest(f"{where}.source: base64 images need data and media_type",
                             param=f"{where}.source")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        return native.part(native.MESSAGES, _without_mark(block))
    return {"type": "image_url", "image_url": {"url": url}, **_extras(block, "source")}


def _document_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = _source(block, where)
    kind = source["type"]
    name = block.get("title") if isinstance(block.get("title"), str) else None
    if kind == "base64" and isinstance(source.get("data"), str):
        media_type = str(source.get("media_type") or "application/pdf")
        data_url = f"data:{media_type};base64,{source['data']}"
    elif kind == "text" and isinstance(source.get("data"), str):
        encoded = base64.b64encode(source["data"].encode()).decode("ascii")
        data_url = f"data:text/plain;base64,{encoded}"
    else:
        # by URL, by file id, or made of content blocks: the provider's to read
        return native.part(native.MESSAGES, _without_mark(block))
    spec: dict[str, Any] = {"file_data": data_url}
    if name:
        spec["filename"] = name
    return {"type": "file", "file": spec, **_extras(block, "source")}


def _compact(parts: list[Any]) -> Any:
    """One plain text part is the string itself (as a chat client would send it)."""
    if not parts:
        return ""
    if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].keys() == {"type", "text"} \
            and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts
