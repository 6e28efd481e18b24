"""Responses API items and the chat-format records they are stored as, both ways.

A Responses conversation is a list of items; the store holds chat-format messages
(strategies/records.py), so every strategy, compression, eviction and the built-in tools
work on it unchanged:

- ``message`` items become messages of their role (``input_text``/``output_text`` as text
  parts, ``input_image`` as ``image_url``, ``input_file`` as ``file``).
- The items of one model reply (``reasoning``, assistant ``message``, ``function_call``,
  built-in tool calls) become one assistant message: text and native parts in order in
  its content, ``function_call`` items as its ``tool_calls``.
- ``function_call_output`` becomes a ``tool`` message.
- ``reasoning`` items (with their ``encrypted_content``), built-in tool call items and
  anything else the chat format has no place for are native parts
  (``{"type": "native", "api": "responses", "item": ...}``, ``strategies/native.py``):
  kept byte-exact with their turn and sent back only to a Responses upstream. The output
  item of a built-in call sent by the client (``computer_call_output``, ...) is a user
  message holding it as a native part.

``to_items`` renders a window (chat messages) back into input items.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from proxy.errors import BadRequest
from strategies import native

__all__ = [
    "API",
    "chat_tool_calls",
    "is_native",
    "native_part",
    "parse_input",
    "to_items",
]

API = native.RESPONSES
NATIVE = native.NATIVE
# what a model's reply holds besides text and function calls: kept as native parts
REPLY_ITEMS = frozenset({
    "reasoning", "web_search_call", "file_search_call", "computer_call",
    "code_interpreter_call", "image_generation_call", "local_shell_call", "mcp_call",
    "mcp_list_tools", "mcp_approval_request", "custom_tool_call", "shell_call",
    "apply_patch_call",
})
INPUT_ROLES = ("user", "system", "developer", "assistant")


def native_part(item: dict[str, Any]) -> dict[str, Any]:
    return native.part(native.RESPONSES, item)


is_native = native.is_native


# ---- request items -> chat-format messages ----


def _text_of(part: dict[str, Any], param: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{param}.text must be a string", param=param)
    return text


def _content_part(part: Any, param: str) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise BadRequest(f"{param} must be an object with a string type", param=param)
    kind = part["type"]
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": _text_of(part, param)}
    if kind == "refusal":
        refusal = part.get("refusal")
        return {"type": "text", "text": refusal if isinstance(refusal, str) else ""}
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, str) and url:
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str) and part["detail"] != "auto":
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
        if not isinstance(part.get("file_id"), str):
            raise BadRequest(f"{param}: input_image needs an image_url or a file_id", param=param)
        return native_part(part)  # a file the upstream holds: only it can read it
    if kind == "input_file":
        data = part.get("file_data")
        if isinstance(data, str) and data:
            file: dict[str, Any] = {"file_data": data}
            if isinstance(part.get("filename"), str):
                file["filename"] = part["filename"]
            return {"type": "file", "file": file}
        if isinstance(part.get("file_id"), str):
            return {"type": "file", "file": {"file_id": part["file_id"]}}
        if isinstance(part.get("file_url"), str):
            return native_part(part)
        raise BadRequest(
            f"{param}: input_file needs file_data, a file_id or a file_url", param=param
        )
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    return native_part(part)


def _content(content: Any, param: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{param} must be a string or an array", param=param)
    parts = [_content_part(p, f"{param}[{i}]") for i, p in enumerate(content)]
    if parts and all(p["type"] == "text" for p in parts) and len(parts) == 1:
        return parts[0]["text"]
    return parts


def _output_text(output: Any, param: str) -> Any:
    """A function call's output: a string, or a list of input content parts."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content(output, param)
    raise BadRequest(f"{param} must be a string or an array", param=param)


class _Reply:
    """The assistant message being built from one run of reply items."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []

    def message(self) -> dict[str, Any]:
        content: Any = self.content
        if not any(is_native(p) for p in content):
            texts = [p.get("text", "") for p in content if p.get("type") == "text"]
            content = "".join(texts) if texts else None
        elif not content:
            content = None
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.calls:
            message["tool_calls"] = self.calls
        elif content is None:
            message["content"] = ""
        return message


def parse_input(value: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The request's ``input`` as chat messages: ``(system, conversation)``, where
    ``system`` is the leading system/developer messages (the session's system prompt)."""
    if isinstance(value, str):
        return [], [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise BadRequest("'input' must be a string or an array of items", param="input")
    messages: list[dict[str, Any]] = []
    reply: _Reply | None = None

    def close() -> None:
        nonlocal reply
        if reply is not None:
            messages.append(reply.message())
            reply = None

    for index, item in enumerate(value):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{param} must be an object", param=param)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise BadRequest(
                    f"{param}.role must be one of {', '.join(INPUT_ROLES)}; got {role!r}",
                    param=f"{param}.role",
                )
            content = _content(item.get("content"), f"{param}.content")
            if role == "assistant":
                reply = reply or _Reply()
                if isinstance(content, str):
                    reply.content.append({"type": "text", "text": content})
                else:
                    reply.content.extend(content)
                continue
            close()
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            arguments = item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise BadRequest(f"{param}: function_call needs a call_id and a name", param=param)
            if not isinstance(arguments, str):
                raise BadRequest(f"{param}.arguments must be a string", param=param)
            reply = reply or _Reply()
            reply.calls.extend(chat_tool_calls([item]))
        elif kind == "function_call_output":
            close()
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{param}: function_call_output needs a call_id", param=param)
            messages.append({
                "role": "tool", "tool_call_id": call_id,
                "content": _output_text(item.get("output"), f"{param}.output"),
            })
        elif kind == "item_reference":
            raise BadRequest(
                f"{param}: item_reference is not supported; send the item itself",
                param=param, code="unsupported_item",
            )
        elif isinstance(kind, str) and "call_id" in item and not isinstance(
            item["call_id"], str
        ):
            raise BadRequest(f"{param}.call_id must be a string", param=f"{param}.call_id")
        elif isinstance(kind, str) and (kind in REPLY_ITEMS or not kind.endswith("_output")):
            reply = reply or _Reply()
            reply.content.append(native_part(item))
        elif isinstance(kind, str):
            close()  # a built-in call's output, sent by the client
            messages.append({"role": "user", "content": [native_part(item)]})
        else:
            raise BadRequest(f"{param}.type must be a string", param=f"{param}.type")
    close()
    cut = 0
    while cut < len(messages) and messages[cut]["role"] in ("system", "developer"):
        cut += 1
    return messages[:cut], messages[cut:]


def chat_tool_calls(calls: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``function_call`` items as chat tool calls."""
    out = []
    for call in calls:
        converted = {"id": call.get("call_id"), "type": "function",
                     "function": {"name": call.get("name", ""),
                                  "arguments": call.get("arguments", "")}}
        if isinstance(call.get("namespace"), str):
            converted["namespace"] = call["namespace"]  # a namespaced tool's (Responses only)
        out.append(converted)
    return out


# ---- chat-format messages -> input items ----


def _input_part(part: Any, role: str) -> dict[str, Any] | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text":
        text = part.get("text", "")
        if role == "assistant":
            return {"type": "output_text", "text": text, "annotations": []}
        return {"type": "input_text", "text": text}
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = image.get("url") if isinstance(image, dict) else image
        out = {"type": "input_image", "image_url": url, "detail": "auto"}
        if isinstance(image, dict) and image.get("detail"):
            out["detail"] = image["detail"]
        return out
    if kind == "file":
        file = part.get("file") or {}
        out = {"type": "input_file"}
        for name in ("file_data", "file_id", "filename"):
            if file.get(name):
                out[name] = file[name]
        return out
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    return {"type": "input_text", "text": str(part.get("text", ""))} if "text" in part else None


def _message_item(role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": parts}


def _content_items(role: str, content: Any) -> list[dict[str, Any]]:
    """A message's content as items: runs of parts as message items, native parts as
    their item."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        if role == "assistant":
            part = {"type": "output_text", "text": content, "annotations": []}
            return [_message_item(role, [part])]
        return [_message_item(role, [{"type": "input_text", "text": content}])]
    items: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    text_type = "output_text" if role == "assistant" else "input_text"
    for part in content if isinstance(content, list) else ():
        if type(part) is not dict:
            continue
        kind = part.get("type")
        if kind == "text":  # the common part, rendered here (a window has many)
            text = {"type": text_type, "text": part.get("text", "")}
            if role == "assistant":
                text["annotations"] = []
            run.append(text)
            continue
        if kind == NATIVE:
            if part.get("api") != API:
                continue  # another API's block: not for this upstream
            if run:
                items.append(_message_item(role, run))
                run = []
            item = part.get("item")
            if isinstance(item, dict) and item.get("type") in ("input_image", "input_file"):
                run.append(item)  # a content part the upstream holds (file_id, file_url)
            elif isinstance(item, dict):
                items.append(item)
            continue
        converted = _input_part(part, role)
        if converted is not None:
            run.append(converted)
    if run:
        items.append(_message_item(role, run))
    return items


def to_items(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat-format messages (a rendered window) as Responses input items."""
    items: list[dict[str, Any]] = []
    calls: set[Any] = set()  # call ids of the built-in calls sent so far
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if type(content) is str and role != "tool" and not message.get("tool_calls"):
            # the common case, a plain text message: an input message with string content
            if content:
                items.append({"type": "message", "role": role, "content": content})
            continue
        if role == "tool":
            content = message.get("content")
            if isinstance(content, list):
                parts = [_input_part(p, "user") for p in content if not is_native(p)]
                output: Any = [p for p in parts if p is not None]
            else:
                output = "" if content is None else content
            items.append(
                {"type": "function_call_output", "call_id": message.get("tool_call_id"),
                 "output": output}
            )
            continue
        reply = _content_items(str(role), message.get("content"))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            item = {"type": "function_call", "call_id": call.get("id"),
                    "name": function.get("name", ""), "arguments": function.get("arguments", "")}
            if call.get("namespace"):
                item["namespace"] = call["namespace"]
            reply.append(item)
        if role == "assistant":
            # reasoning goes with the item it preceded: a reply whose call the window left
            # out (never answered) sends none of that reasoning
            while reply and reply[-1].get("type") == "reasoning":
                reply.pop()
        for item in reply:
            kind = str(item.get("type", ""))
            if kind.endswith("_output") and kind != "function_call_output":
                # a built-in call's output whose call the window left out: not sent alone
                if item.get("call_id") not in calls:
                    continue
            elif item.get("call_id"):
                calls.add(item["call_id"])
            items.append(item)
    return items
