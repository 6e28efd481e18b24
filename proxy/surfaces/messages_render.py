"""The window as Anthropic's Messages API takes it (pure).

``render_window(messages, ...)`` turns the mapper's chat messages (rendered with
``MappingContext.api == "messages"``: native parts of this API kept) into Anthropic's
``system`` blocks and ``messages``, valid for its rules:

- one ``system`` (the leading system messages' text blocks);
- the first message is the user's; consecutive messages of one role are merged;
- each ``tool`` message becomes a ``tool_result`` block of a user message, results first
  in it; a result answers a ``tool_use`` of the assistant message just before it, else it
  is sent as text; a ``tool_use`` with no result after it gets one saying none was kept
  (the assistant message, its thinking signed with it, stays as it is);
- without tools declared in the request, tool use and results are sent as text (the API
  refuses ``tool_use`` blocks then);
- native parts go back as their blocks, byte-exact; media parts as ``image`` and
  ``document`` blocks.

Cache breakpoints: the client's ``cache_control`` marks go back on the blocks they were on
when those are in the window (``CacheMark``); when the client placed none, the proxy's go
at the end of each stable stretch (proxy/cache_hints.py): the system prompt, the summary
the window opens with, the message before the first one the proxy changed, the last
message; at most four, never on a thinking block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.surfaces.messages_request import TOOL_USE_AT, CacheMark
from proxy.turn.cache_hints import EPHEMERAL, MAX_BREAKPOINTS, anthropic_breakpoints
from strategies import native
from strategies.media_info import decode_base64, parse_data_url

NO_RESULT = "[no result of this tool call was kept]"
_UNMARKABLE = ("thinking", "redacted_thinking")


@dataclass(slots=True)
class Rendered:
    """What goes into the request body: ``system`` (None: none) and ``messages``."""

    system: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]


def render_window(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools_declared: bool,
    fingerprints: Sequence[str | None] = (),
    marks: Sequence[CacheMark] = (),
    client_marks: bool = False,
    changed_at: int | None = None,
    breakpoints: bool = True,
) -> Rendered:
    """``messages``: the mapper's output (system first). ``fingerprints``: the record
    fingerprint of each message (aligned with ``messages``; None where it is not a stored
    record), for the client's ``marks``. ``client_marks``: the client placed marks of its
    own (then the proxy places none). ``changed_at``: index in ``messages`` of the first
    one the proxy changed since the previous request. ``breakpoints``: place the proxy's."""
    system_end = 0
    while system_end < len(messages) and messages[system_end].get("role") in (
        "system", "developer"
    ):
        system_end += 1
    system = [block for m in messages[:system_end] for block in _text_blocks(m.get("content"))]
    by_fingerprint: dict[str, list[CacheMark]] = {}
    for mark in marks:
        by_fingerprint.setdefault(mark.fingerprint, []).append(mark)
    # a mark goes back once, on the last message it can be (two messages may be the same)
    marked_at = {fp: i for i, fp in enumerate(fingerprints) if fp in by_fingerprint}
    own = set()
    if breakpoints and not client_marks:
        own = set(anthropic_breakpoints(messages, changed_at))
    if system and (system_end - 1) in own:
        _mark_last(system, dict(EPHEMERAL))
    out: list[dict[str, Any]] = []
    open_calls: list[str] = []  # tool_use ids of the last assistant message, unanswered
    answered: set[str] = set()
    for index in range(system_end, len(messages)):
        message = messages[index]
        role = message.get("role")
        if role == "assistant":
            _close_calls(out, open_calls, answered)
            blocks = _assistant_blocks(message, tools_declared)
            role_out = "assistant"
            open_calls = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            answered = set()
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if tools_declared and call_id in open_calls and call_id not in answered:
                answered.add(call_id)
                blocks = [_tool_result(message)]
            else:
                blocks = [{"type": "text", "text": _result_as_text(message)}]
            role_out = "user"
        else:
            _close_calls(out, open_calls, answered)
            open_calls, answered = [], set()
            blocks = _user_blocks(message.get("content"))
            role_out = "user"
        if not blocks:
            continue
        fp = fingerprints[index] if index < len(fingerprints) else None
        for mark in by_fingerprint.get(fp, ()) if fp and marked_at.get(fp) == index else ():
            if -len(blocks) <= mark.from_end < 0:
                blocks[mark.from_end]["cache_control"] = mark.value
        if index in own:
            _mark_last(blocks, dict(EPHEMERAL))
        _append(out, role_out, blocks)
    _close_calls(out, open_calls, answered)
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [
            {"type": "text", "text": "[earlier conversation not shown]"}]})
    return Rendered(system or None, out)


def _append(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if out and out[-1]["role"] == role:
        previous = out[-1]["content"]
        if role == "user":
            # results first in their message
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if results:
                others = [b for b in previous if b.get("type") != "tool_result"]
                kept = [b for b in previous if b.get("type") == "tool_result"]
                previous[:] = [*kept, *results, *others,
                               *(b for b in blocks if b.get("type") != "tool_result")]
                return
        previous.extend(blocks)
        return
    out.append({"role": role, "content": blocks})


def _close_calls(out: list[dict[str, Any]], open_calls: list[str], answered: set[str]) -> None:
    """Answer the last assistant message's calls that got no result (the API refuses a
    ``tool_use`` without its ``tool_result`` in the next message)."""
    missing = [c for c in open_calls if c not in answered]
    if not missing:
        return
    blocks = [{"type": "tool_result", "tool_use_id": c, "content": NO_RESULT, "is_error": True}
              for c in missing]
    answered.update(missing)
    _append(out, "user", blocks)


def _mark_last(blocks: list[dict[str, Any]], mark: dict[str, Any]) -> None:
    for block in reversed(blocks):
        if block.get("type") not in _UNMARKABLE and block.get("text", True) != "":
            block["cache_control"] = mark
            return


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return []
    blocks = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text" and part.get("text"):
            blocks.append(_text_block(part))
    return blocks


def _text_block(part: Mapping[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": part.get("text") or ""}
    extras = part.get("anthropic")
    if isinstance(extras, Mapping):
        block.update(extras)
    if isinstance(part.get("cache_control"), Mapping):
        block["cache_control"] = dict(part["cache_control"])
    return block


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return []
    blocks: list[dict[str, Any]] = []
    for part in content:
        block = _content_block(part)
        if block is not None:
            blocks.append(block)
    return blocks


def _content_block(part: Any) -> dict[str, Any] | None:
    if isinstance(part, str):
        return {"type": "text", "text": part} if part else None
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind == "text":
        return _text_block(part) if part.get("text") else None
    if native.is_native(part):
        item = part.get("item")
        if part.get("api") != native.MESSAGES or not isinstance(item, Mapping):
            return None
        if item.get("type") in ("tool_result", TOOL_USE_AT):
            return None  # a result's own fields (merged into its block), a tool use's place
        return dict(item)
    if kind == "image_url":
        return _image_block(part)
    if kind == "file":
        return _document_block(part)
    # a part the API has no block for (audio): named, not sent
    return {"type": "text", "text": f"[{kind} part not sent: the Messages API has no block for it]"}


def _with_extras(block: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    extras = part.get("anthropic")
    if isinstance(extras, Mapping):
        block.update(extras)
    return block


def _image_block(part: Mapping[str, Any]) -> dict[str, Any] | None:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str):
        return None
    data_url = parse_data_url(url)
    if data_url is not None:
        source = {"type": "base64", "media_type": data_url.media_type,
                  "data": url.split(",", 1)[1]}
    else:
        source = {"type": "url", "url": url}
    return _with_extras({"type": "image", "source": source}, part)


def _document_block(part: Mapping[str, Any]) -> dict[str, Any] | None:
    spec = part.get("file")
    if not isinstance(spec, Mapping):
        return None
    payload = spec.get("file_data")
    source: dict[str, Any]
    if isinstance(payload, str):
        data_url = parse_data_url(payload)
        encoded = payload.split(",", 1)[1] if data_url is not None else payload
        media_type = data_url.media_type if data_url is not None else "application/pdf"
        if media_type.startswith("text/"):
            try:
                text = decode_base64(encoded).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                text = ""
            source = {"type": "text", "media_type": "text/plain", "data": text}
        else:
            source = {"type": "base64", "media_type": media_type, "data": encoded}
    elif isinstance(spec.get("file_id"), str):
        source = {"type": "file", "file_id": spec["file_id"]}
    else:
        return None
    block: dict[str, Any] = {"type": "document", "source": source}
    extras = part.get("anthropic")
    if isinstance(spec.get("filename"), str) and not (
        isinstance(extras, Mapping) and "title" in extras
    ):
        block["title"] = spec["filename"]
    return _with_extras(block, part)


def _assistant_blocks(message: Mapping[str, Any], tools_declared: bool) -> list[dict[str, Any]]:
    content = message.get("content")
    calls = {str(c.get("id") or ""): c for c in message.get("tool_calls") or ()
             if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)}
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for part in content:
            item = part.get("item") if native.is_native(part) else None
            if isinstance(item, Mapping) and item.get("type") == TOOL_USE_AT:
                call = calls.pop(str(item.get("id") or ""), None)
                if call is not None:  # the tool use in its place among the blocks
                    blocks.append(_tool_use(call, tools_declared))
                continue
            found = _content_block(part)
            if found is not None and found.get("type") not in ("image", "document"):
                blocks.append(found)
    blocks.extend(_tool_use(call, tools_declared) for call in calls.values())
    return blocks


def _tool_use(call: Mapping[str, Any], tools_declared: bool) -> dict[str, Any]:
    function = call["function"]
    name = str(function.get("name") or "")
    arguments = function.get("arguments")
    if not tools_declared:
        return {"type": "text", "text": f"[called tool {name} with {arguments}]"}
    block: dict[str, Any] = {"type": "tool_use", "id": str(call.get("id") or ""),
                             "name": name, "input": _input(arguments)}
    if isinstance(call.get("cache_control"), Mapping):
        block["cache_control"] = dict(call["cache_control"])
    return block


def _input(arguments: Any) -> Any:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str) and arguments:
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {"arguments": arguments}
        return value if isinstance(value, dict) else {"value": value}
    return {}


def _tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    if isinstance(content, str):
        block["content"] = content
    elif isinstance(content, list):
        inner = [b for b in (_content_block(p) for p in content) if b is not None]
        inner = [b for b in inner if b.get("type") in ("text", "image", "document",
                                                       "search_result")]
        block["content"] = inner
        for item in native.items(content, native.MESSAGES):
            if item.get("type") == "tool_result":
                block.update({k: v for k, v in item.items() if k != "type"})
    return block


def _result_as_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        texts = [str(p.get("text") or "") for p in content
                 if isinstance(p, Mapping) and p.get("type") == "text"]
        content = "\n".join(texts)
    return f"[result of tool call {message.get('tool_call_id')}]\n{content or ''}"


def check_messages(messages: Sequence[Mapping[str, Any]], *, tools_declared: bool) -> list[str]:
    """What Anthropic's API would refuse in ``messages`` (empty when valid): the rules
    ``render_window`` keeps."""
    problems: list[str] = []
    if not messages or messages[0].get("role") != "user":
        problems.append("the first message is not the user's")
    marks = 0
    for index, message in enumerate(messages):
        role, blocks = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            problems.append(f"{index}: role {role!r}")
        if index and messages[index - 1].get("role") == role:
            problems.append(f"{index}: two {role} messages in a row")
        if not isinstance(blocks, list) or not blocks:
            problems.append(f"{index}: no content blocks")
            continue
        kinds = [b.get("type") for b in blocks]
        marks += sum(1 for b in blocks if "cache_control" in b)
        for block in blocks:
            if "cache_control" in block and block.get("type") in _UNMARKABLE:
                problems.append(f"{index}: cache_control on a thinking block")
            if block.get("type") == "text" and not block.get("text"):
                problems.append(f"{index}: an empty text block")
        if not tools_declared and ("tool_use" in kinds or "tool_result" in kinds):
            problems.append(f"{index}: tool blocks without tools declared")
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if results:
            if kinds[: len(results)] != ["tool_result"] * len(results):
                problems.append(f"{index}: tool results are not first in their message")
            previous = messages[index - 1] if index else {}
            calls = [b.get("id") for b in previous.get("content") or ()
                     if isinstance(b, Mapping) and b.get("type") == "tool_use"]
            if previous.get("role") != "assistant" or set(results) - set(calls):
                problems.append(f"{index}: a tool result answers no tool_use just before it")
            if len(set(results)) != len(results):
                problems.append(f"{index}: a tool_use answered twice")
        calls = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        if calls and index + 1 < len(messages):
            following = {b.get("tool_use_id") for b in messages[index + 1].get("content") or ()
                         if isinstance(b, Mapping) and b.get("type") == "tool_result"}
            if set(calls) - following:
                problems.append(f"{index}: a tool_use without its result in the next message")
        if role == "assistant" and "thinking" in kinds and kinds[0] not in _UNMARKABLE:
            problems.append(f"{index}: thinking after other blocks")
    if marks > MAX_BREAKPOINTS:
        problems.append(f"{marks} cache_control marks (at most {MAX_BREAKPOINTS})")
    return problems
