"""Replies both ways between a Responses ``response`` object and a chat completion.

``response_object`` renders the turn's reply (a chat completion, as every upstream path
delivers it to the turn) as the Responses object the client receives;
``completion_from_response`` reads a Responses upstream's reply as a chat completion
(reasoning and built-in call items as native parts of the message's content).
"""

from __future__ import annotations

import time
from typing import Any

from proxy.errors import UpstreamReplyError
from proxy.surfaces.responses_items import chat_tool_calls, is_native, native_part

__all__ = [
    "chat_usage",
    "completion_from_response",
    "output_items",
    "response_object",
    "responses_usage",
]

NOT_A_RESPONSE = "upstream sent a reply that is not a Responses API response"


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """Chat completion usage in the Responses shape."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": prompt_details.get("cached_tokens") or 0},
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": completion_details.get("reasoning_tokens") or 0
        },
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Responses usage in the chat completion shape (what calibration and the prompt-cache
    figures read)."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("input_tokens") or 0
    completion = usage.get("output_tokens") or 0
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def output_items(message: dict[str, Any], id_prefix: str) -> list[dict[str, Any]]:
    """An assistant message (chat format, native parts in its content) as output items."""
    items: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []

    def flush() -> None:
        if texts:
            items.append({
                "type": "message", "id": f"msg_{id_prefix}_{len(items)}", "status": "completed",
                "role": "assistant", "content": list(texts),
            })
            texts.clear()

    content = message.get("content")
    parts = content if isinstance(content, list) else (
        [{"type": "text", "text": content}] if content else []
    )
    for part in parts:
        if is_native(part):
            if part.get("api") == "responses" and isinstance(part.get("item"), dict):
                flush()
                items.append(part["item"])
        elif isinstance(part, dict) and part.get("type") == "text":
            texts.append(
                {"type": "output_text", "text": part.get("text", ""), "annotations": [],
                 "logprobs": []}
            )
    if message.get("refusal"):
        texts.append({"type": "refusal", "refusal": message["refusal"]})
    flush()
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        item = {
            "type": "function_call", "id": f"fc_{id_prefix}_{len(items)}",
            "call_id": call.get("id"), "name": function.get("name", ""),
            "arguments": function.get("arguments", ""), "status": "completed",
        }
        if call.get("namespace"):
            item["namespace"] = call["namespace"]
        items.append(item)
    return items


# request fields echoed on the response object, with OpenAI's defaults
ECHOED: dict[str, Any] = {
    "instructions": None, "max_output_tokens": None, "max_tool_calls": None,
    "metadata": {}, "parallel_tool_calls": True, "previous_response_id": None,
    "prompt_cache_key": None, "reasoning": {"effort": None, "summary": None},
    "service_tier": "default", "store": True, "temperature": 1.0,
    "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
    "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "user": None,
    "conversation": None,
}


def envelope(
    request: dict[str, Any], response_id: str, model: str, created_at: int, status: str
) -> dict[str, Any]:
    """The response object without output: what ``response.created`` carries."""
    out: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": None, "incomplete_details": None,
        "model": model, "output": [], "usage": None,
    }
    for name, default in ECHOED.items():
        value = request.get(name, default)
        out[name] = default if value is None and default is not None else value
    return out


def response_object(
    request: dict[str, Any],
    response_id: str,
    completion: dict[str, Any],
    *,
    created_at: int | None = None,
) -> dict[str, Any]:
    """The client's response object for a turn's chat completion."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {"role": "assistant", "content": ""}
    finish = choice.get("finish_reason")
    model = str(completion.get("model") or request.get("model") or "")
    out = envelope(
        request, response_id, model, created_at or int(time.time()),
        "incomplete" if finish == "length" else "completed",
    )
    if finish == "length":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    out["output"] = output_items(message, response_id.removeprefix("resp_")[-24:])
    out["usage"] = responses_usage(completion.get("usage"))
    return out


def reply_message(output: list[Any]) -> dict[str, Any]:
    """A Responses reply's output items as one assistant message (chat format)."""
    content: list[dict[str, Any]] = []
    text: list[str] = []
    refusal: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    text.append(part["text"])
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    refusal.append(part["refusal"])
        elif kind == "function_call":
            calls.append(item)
        else:
            content.append(native_part(item))
    joined = "".join(text)
    message: dict[str, Any] = {"role": "assistant"}
    if content:
        message["content"] = [*content, {"type": "text", "text": joined}] if joined else content
    else:
        message["content"] = joined if joined or not calls else None
    if calls:
        message["tool_calls"] = chat_tool_calls(calls)
    if refusal:
        message["refusal"] = "".join(refusal)
    return message


def finish_reason(response: dict[str, Any], message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        return "tool_calls"
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        return "length"
    if response.get("status") == "incomplete":
        return "content_filter"
    return "stop"


def completion_from_response(response: Any) -> dict[str, Any]:
    """A Responses upstream's reply as a chat completion; a failed response or anything
    that is not one raises ``UpstreamReplyError`` (nothing is stored)."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise UpstreamReplyError(NOT_A_RESPONSE)
    if response.get("status") == "failed" or response.get("error"):
        error = response.get("error") or {}
        raise UpstreamReplyError(
            f"upstream response failed: {error.get('message', 'no message')}"
        )
    message = reply_message(response["output"])
    completion: dict[str, Any] = {
        "id": response.get("id"), "object": "chat.completion",
        "created": response.get("created_at") or int(time.time()),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason(response, message)}],
    }
    usage = chat_usage(response.get("usage"))
    if usage is not None:
        completion["usage"] = usage
    return completion
