"""A Responses API request: checked, read into chat-format messages, and the options for
either kind of upstream.

The turn itself runs on chat-format messages. ``chat_body`` is the request as a chat
completion (for a chat-completions-only upstream and litellm); ``OPTIONS_KEY`` carries the
Responses-only options beside it, for ``proxy/upstreams/responses_http.py`` to send to a
Responses upstream as they came (built-in tools, ``include``, ``reasoning.summary``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequest
from proxy.surfaces.responses_items import parse_input

__all__ = ["OPTIONS_KEY", "ResponsesRequest", "chat_body", "chat_tools", "responses_tools"]

OPTIONS_KEY = "x-memory-responses"
# fields that name state or the turn, never sent upstream as they came
STATEFUL = ("input", "previous_response_id", "conversation", "instructions", "background")
# Responses options with the same name and meaning in chat completions
SAME_NAME = ("model", "temperature", "top_p", "user", "top_logprobs", "service_tier",
             "prompt_cache_key", "safety_identifier", "parallel_tool_calls")


@dataclass(slots=True)
class ResponsesRequest:
    body: dict[str, Any]
    system: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    stream: bool
    store: bool
    previous_response_id: str | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ResponsesRequest:
        if "input" not in body and not body.get("previous_response_id"):
            raise BadRequest("'input' is required", param="input")
        system, conversation = parse_input(body.get("input", []))
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise BadRequest("'instructions' must be a string", param="instructions")
            if instructions:
                system = [{"role": "system", "content": instructions}, *system]
        for name in ("stream", "store", "parallel_tool_calls"):
            if name in body and body[name] is not None and not isinstance(body[name], bool):
                raise BadRequest(f"'{name}' must be a boolean", param=name)
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise BadRequest("'previous_response_id' must be a string",
                             param="previous_response_id")
        if previous and body.get("conversation"):
            raise BadRequest(
                "'previous_response_id' and 'conversation' cannot be used together",
                param="conversation",
            )
        for name in ("tools", "include"):
            if body.get(name) is not None and not isinstance(body[name], list):
                raise BadRequest(f"'{name}' must be an array", param=name)
        for index, tool in enumerate(body.get("tools") or ()):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                raise BadRequest(
                    "each tool must be an object with a string 'type'", param=f"tools[{index}]"
                )
        for name in ("text", "reasoning", "metadata"):
            if body.get(name) is not None and not isinstance(body[name], dict):
                raise BadRequest(f"'{name}' must be an object", param=name)
        tokens = body.get("max_output_tokens")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
            raise BadRequest("'max_output_tokens' must be a positive integer",
                             param="max_output_tokens")
        if not conversation and not previous:
            raise BadRequest("'input' holds no conversation item", param="input")
        return cls(
            body=body, system=system, conversation=conversation,
            stream=body.get("stream") is True, store=body.get("store") is not False,
            previous_response_id=previous or None,
        )

    @property
    def session_name(self) -> str | None:
        """The ``conversation`` id, as a session name."""
        conversation = self.body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        return conversation if isinstance(conversation, str) and conversation else None

    def options(self) -> dict[str, Any]:
        """The Responses options sent to a Responses upstream (``OPTIONS_KEY``)."""
        return {k: v for k, v in self.body.items() if k not in STATEFUL}


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools in the chat shape; built-in tools (which only a Responses upstream
    runs) are left out."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out or None


def responses_tools(tools: Any) -> list[dict[str, Any]]:
    """Chat tool definitions in the Responses shape."""
    out = []
    for tool in tools or ():
        if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(
            tool.get("function"), dict
        ):
            out.append({"type": "function", **tool["function"]})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if choice in (None, "auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return "auto"


def responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


def chat_body(request: ResponsesRequest) -> dict[str, Any]:
    """The request's options as a chat completion body (without messages)."""
    body = request.body
    out: dict[str, Any] = {k: body[k] for k in SAME_NAME if body.get(k) is not None}
    out["stream"] = request.stream
    tools = chat_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = chat_tool_choice(body["tool_choice"])
    else:
        out.pop("parallel_tool_calls", None)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    fmt = response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    effort = (body.get("reasoning") or {}).get("effort")
    if isinstance(effort, str):
        out["reasoning_effort"] = effort
    if out.get("top_logprobs"):
        out["logprobs"] = True
    return out
