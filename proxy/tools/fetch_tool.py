"""The built-in ``fetch_tool_result`` tool: the way back to an evicted tool result.

Offered when an agent lists ``{"name": "fetch_tool_result"}`` in its tools; answered by
the proxy from the session's store with the original content (never a stub), in hidden
rounds (``proxy/tools/builtin.py``, docs/ARCHITECTURE.md "Built-in tools").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.surfaces.tool_calls import arguments_of
from storage.base import Store
from strategies.compression import FETCH_TOOL, content_text

if TYPE_CHECKING:
    from proxy.tools.builtin import Offered

__all__ = ["FETCH_TOOL", "TOOL_DEFINITION", "answer"]

TOOL_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": FETCH_TOOL,
        "description": (
            "Reload the full output of an earlier tool call whose result was evicted from "
            "the conversation to save space. Pass the tool_call_id named in the eviction note."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "tool_call_id": {
                    "type": "string",
                    "description": "The id of the tool call whose result to reload.",
                }
            },
            "required": ["tool_call_id"],
            "additionalProperties": False,
        },
    },
}


async def answer(store: Store, offered: Offered, call: dict[str, Any]) -> str:
    """The stored original of the result a fetch call names, or why not."""
    wanted = arguments_of(call).get("tool_call_id")
    if not isinstance(wanted, str) or not wanted.strip():
        return (
            f'{FETCH_TOOL} needs {{"tool_call_id": "<id>"}}: the id named in the note of '
            "the evicted result."
        )
    wanted = wanted.strip()
    found = await store.find_tool_result(offered.key, wanted)
    if found is None:
        return f'No tool result with tool_call_id="{wanted}" is stored in this session.'
    return content_text(found.content)
