"""The agent edit form: prefilled from the effective agent, read back into a partial definition."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.agents import ResolvedAgent, ToolRef

HISTORY_MODES = ("auto", "full", "delta")
MAX_MEMORY_CHARS = 64_000
# which input an error's field belongs to, so the form can mark it
FIELD_INPUTS = {
    "memoryConfig": "memory",
    "description": "description",
    "llm.model": "model",
    "llm.contextWindow": "context_window",
    "historyMode": "history_mode",
}


class FormError(ValueError):
    """Input the form cannot turn into a definition; ``field`` is the definition field."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def input_for(field: str | None) -> str | None:
    if not field:
        return None
    index, _, rest = field.removeprefix("tools.").partition(".")
    if field.startswith("tools.") and index.isdigit() and rest == "maxResultChars":
        return f"tool_max_{index}"
    for prefix, name in FIELD_INPUTS.items():
        if field == prefix or field.startswith(prefix + "."):
            return name
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


@dataclass(slots=True)
class ToolField:
    """One tool reference of the agent in the form: its name and "Max result chars"."""

    name: str
    max_result_chars: str = ""


@dataclass(slots=True)
class AgentForm:
    """The submitted (or prefilled) text of every input, kept as typed."""

    description: str = ""
    model: str = ""
    context_window: str = ""
    history_mode: str = "auto"
    memory: str = ""
    tools: list[ToolField] = field(default_factory=list)

    @classmethod
    def prefilled(cls, agent: ResolvedAgent) -> AgentForm:
        """The effective agent: an unconfigured one shows the defaults it runs with."""
        llm = agent.definition.llm
        return cls(
            description=agent.definition.description,
            model=llm.model or "",
            context_window=str(llm.contextWindow) if llm.contextWindow else "",
            history_mode=agent.definition.historyMode,
            memory=json.dumps(agent.config.to_dict(), indent=2),
            tools=[ToolField(ref.name, str(ref.maxResultChars or ""))
                   for ref in agent.definition.tools],
        )

    @classmethod
    def submitted(cls, form: Mapping[str, Any]) -> AgentForm:
        def text(name: str) -> str:
            value = form.get(name, "")
            return value if isinstance(value, str) else ""

        tools = []
        index = 0
        while f"tool_name_{index}" in form:
            tools.append(ToolField(text(f"tool_name_{index}"), text(f"tool_max_{index}")))
            index += 1
        return cls(
            description=text("description"),
            model=text("model"),
            context_window=text("context_window"),
            history_mode=text("history_mode") or "auto",
            memory=text("memory"),
            tools=tools,
        )

    def changes(self, current: list[ToolRef] | None = None) -> dict[str, Any]:
        """The partial definition this form asks for. A blank Memory field keeps the
        stored setting; a blank model or context window falls back to the model's info.
        ``current`` are the agent's tool references as stored: each keeps what the form
        does not show and takes its "Max result chars" from the form (blank: none)."""
        changes: dict[str, Any] = {
            "description": self.description.strip(),
            "llm": {"model": self.model.strip() or None,
                    "contextWindow": self._context_window()},
            "historyMode": self.history_mode,
        }
        if self.history_mode not in HISTORY_MODES:
            raise FormError(
                f"historyMode must be one of {', '.join(HISTORY_MODES)}", field="historyMode"
            )
        if self.memory.strip():
            changes["memoryConfig"] = self._memory_config()
        if current and self.tools:
            changes["tools"] = self._tools(current)
        return changes

    def _tools(self, current: list[ToolRef]) -> list[dict[str, Any]]:
        limits: dict[str, int | None] = {}
        for index, tool in enumerate(self.tools):
            raw = tool.max_result_chars.strip().replace("_", "").replace(",", "")
            if raw and (not raw.isdigit() or int(raw) <= 0):
                raise FormError(
                    f"Max result chars of {tool.name} must be a positive whole number of "
                    f"characters, or blank for no limit; got {raw!r}",
                    field=f"tools.{index}.maxResultChars",
                )
            limits[tool.name] = int(raw) if raw else None
        out = []
        for ref in current:
            data = ref.model_dump(exclude_none=True)
            if ref.name in limits:
                data.pop("maxResultChars", None)
                if limits[ref.name] is not None:
                    data["maxResultChars"] = limits[ref.name]
            out.append(data)
        return out

    def _context_window(self) -> int | None:
        raw = self.context_window.strip().replace("_", "").replace(",", "")
        if not raw:
            return None
        if not raw.isdigit() or int(raw) <= 0:
            raise FormError(
                f"llm.contextWindow must be a positive whole number of tokens, got {raw!r}",
                field="llm.contextWindow",
            )
        return int(raw)

    def _memory_config(self) -> Any:
        if len(self.memory) > MAX_MEMORY_CHARS:
            raise FormError(
                f"Memory (JSON) is longer than {MAX_MEMORY_CHARS} characters", field="memoryConfig"
            )
        try:
            return json.loads(self.memory, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise FormError(
                f"Memory (JSON) is not valid JSON: {exc.msg} at line {exc.lineno}, "
                f"column {exc.colno}",
                field="memoryConfig",
            ) from None
        except (ValueError, RecursionError) as exc:
            raise FormError(
                f"Memory (JSON) is not valid JSON: {exc}", field="memoryConfig"
            ) from None
