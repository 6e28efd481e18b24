"""Reading OpenAI tool definitions and tool calls."""

from __future__ import annotations

from typing import Any

import orjson


def tool_name(tool: Any) -> str | None:
    """The function name of a tool definition or a tool call."""
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def arguments_of(call: dict[str, Any]) -> dict[str, Any]:
    """A call's parsed arguments ({} when they are not a JSON object)."""
    arguments = (call.get("function") or {}).get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
