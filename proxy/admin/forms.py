"""The agent edit form: prefilled from the effective agent, read back into a partial definition."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.agents import ResolvedAgent

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
    for prefix, name in FIELD_INPUTS.items():
        if field == prefix or field.startswith(prefix + "."):
            return name
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


@dataclass(slots=True)
class AgentForm:
    """The submitted (or prefilled) text of every input, kept as typed."""

    description: str = ""
    model: str = ""
    context_window: str = ""
    history_mode: str = "auto"
    memory: str = ""

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
        )

    @classmethod
    def submitted(cls, form: Mapping[str, Any]) -> AgentForm:
        def text(name: str) -> str:
            value = form.get(name, "")
            return value if isinstance(value, str) else ""

        return cls(
            description=text("description"),
            model=text("model"),
            context_window=text("context_window"),
            history_mode=text("history_mode") or "auto",
            memory=text("memory"),
        )

    def changes(self) -> dict[str, Any]:
        """The partial definition this form asks for. A blank Memory field keeps the
        stored setting; a blank model or context window falls back to the model's info."""
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
        return changes

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
