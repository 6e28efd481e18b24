"""Agent definitions: ``agent-definitions/*.json``, overridden by admin edits in the store.

An agent with no definition runs with the default memory config.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.model_info import get_model_info
from strategies.config import MemoryConfig, MemoryConfigError, parse_memory_config

logger = logging.getLogger("memory_proxy.agents")

HistoryMode = Literal["auto", "full", "delta"]
DEFAULT_AGENT = "default"
MEDIA_KINDS = ("image", "document", "audio")


class LlmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    contextWindow: int | None = Field(default=None, gt=0)
    capabilities: list[Literal["image", "document", "audio"]] | None = None
    summarizerModel: str | None = None
    # the API the model is called through: chat completions, Anthropic's Messages or
    # OpenAI's Responses; None: detected from the surface and the model (docs/SURFACES.md)
    api: Literal["chat", "messages", "responses"] | None = None


class ToolRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    maxResultChars: int | None = Field(default=None, gt=0)
    description: str | None = None


class AgentDefinition(BaseModel):
    """The file schema of DESIGN.md. ``memoryConfig`` is validated separately so its
    errors name the field as the spec spells it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    llm: LlmSpec = Field(default_factory=LlmSpec)
    memoryConfig: dict[str, Any] | None = None
    tools: list[ToolRef] = Field(default_factory=list)
    historyMode: HistoryMode = "auto"
    # the body's ``user`` keys this agent's sessions (it names a person: every conversation
    # of one person becomes one session); off unless the agent opts in
    userAsSession: bool = False


class AgentDefinitionError(ValueError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def parse_definition(data: Mapping[str, Any]) -> tuple[AgentDefinition, MemoryConfig]:
    """Validate a definition and its memoryConfig; errors name the offending field."""
    try:
        definition = AgentDefinition.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or "definition"
        raise AgentDefinitionError(f"{field}: {error['msg']}", field=field) from None
    try:
        config = parse_memory_config(definition.memoryConfig)
    except MemoryConfigError as exc:
        raise AgentDefinitionError(str(exc), field=exc.field) from None
    return definition, config


@dataclass(frozen=True, slots=True)
class ResolvedAgent:
    """An agent as one turn runs it: definition (file, then store override) and config."""

    name: str
    definition: AgentDefinition
    config: MemoryConfig
    source: Literal["file", "store", "default"]
    configured: bool  # False when memoryConfig was not set anywhere (defaults apply)

    def context_window(self, model: str, default: int) -> int:
        if self.definition.llm.contextWindow:
            return self.definition.llm.contextWindow
        return get_model_info(model or self.definition.llm.model or "").context_window or default

    def capabilities(self, model: str) -> frozenset[str]:
        if self.definition.llm.capabilities is not None:
            return frozenset(self.definition.llm.capabilities)
        info = get_model_info(model or self.definition.llm.model or "")
        kinds = set()
        if info.reads_images:
            kinds.add("image")
        if info.reads_documents:
            kinds.add("document")
        return frozenset(kinds)

    def summarizer_model(self, model: str) -> str:
        return self.definition.llm.summarizerModel or model or self.definition.llm.model or ""

    def tool(self, name: str) -> ToolRef | None:
        for ref in self.definition.tools:
            if ref.name == name:
                return ref
        return None

    def has_tool(self, name: str) -> bool:
        return self.tool(name) is not None


class AgentRegistry:
    """Definitions loaded from a folder at startup; store overrides are applied per turn."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.files: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self._cache: dict[tuple[str, bytes | None], ResolvedAgent] = {}

    def load(self) -> None:
        self.files.clear()
        self.errors.clear()
        self._cache.clear()
        if self.directory is None or not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = orjson.loads(path.read_bytes())
                definition, _ = parse_definition(data)
            except (orjson.JSONDecodeError, AgentDefinitionError, OSError) as exc:
                # one broken file must not take the proxy down; it shows in admin
                self.errors[path.name] = str(exc)
                logger.error("agent definition %s rejected: %s", path.name, exc)
                continue
            self.files[definition.name] = data

    def names(self) -> list[str]:
        return sorted(self.files)

    def resolve(self, agent: str, override: dict[str, Any] | None = None) -> ResolvedAgent:
        """The effective agent: a store override wins over the file; unknown -> defaults."""
        cache_key = (agent, orjson.dumps(override) if override else None)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        if override is not None:
            data, source = {**override, "name": agent}, "store"
        elif agent in self.files:
            data, source = self.files[agent], "file"
        else:
            data, source = {"name": agent}, "default"
        try:
            definition, config = parse_definition(data)
        except AgentDefinitionError:
            # a stored override that no longer validates falls back to the file
            logger.error("stored definition of agent %s is invalid; using the file", agent)
            return self.resolve(agent, None) if override is not None else self._default(agent)
        resolved = ResolvedAgent(
            name=agent,
            definition=definition,
            config=config,
            source=source,  # type: ignore[arg-type]
            configured=definition.memoryConfig is not None,
        )
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[cache_key] = resolved
        return resolved

    def _default(self, agent: str) -> ResolvedAgent:
        definition, config = parse_definition({"name": agent})
        return ResolvedAgent(agent, definition, config, "default", False)
