"""Settings from ``MEMORY_PROXY_*`` environment variables (CLI flags override them)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMORY_PROXY_", extra="ignore")

    store_url: str = "sqlite:///.memory-proxy/memory.db"
    upstream_url: str = "https://api.openai.com/v1"
    upstream_api_key: SecretStr | None = None
    # Anthropic's Messages API (or any server that speaks it): a Messages request for a
    # Claude model goes there (docs/SURFACES.md); its key replaces the client's when set
    anthropic_url: str = "https://api.anthropic.com"
    anthropic_api_key: SecretStr | None = None
    agents_dir: Path = Path("agent-definitions")
    admin_token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = 4000
    workers: int = 1
    # dotted path ("module:attr" or "module.attr") of the LlmMessageMapper to use
    mapper: str = "strategies.mapper:MessageToLlmMessageMapper"
    # dotted path of a PartContentReader class or factory (called with the Store); None:
    # media bytes are read from the store's own part store (storage/parts.py)
    part_reader: str | None = None
    # send provider-prefixed model ids (anthropic/..., gemini/...) through litellm; turn off
    # when the upstream itself takes such ids (an OpenRouter-style gateway)
    litellm_routing: bool = True
    # how Responses API requests reach the direct upstream (an agent's ``llm.api`` wins):
    # "auto" sends them to its /responses and, once it answers 404/405 there, to its
    # /chat/completions translated; "responses" and "chat" choose one
    responses_api: Literal["auto", "responses", "chat"] = "auto"
    # send the session's prompt_cache_key (proxy/turn/cache_hints.py) with requests for OpenAI
    # models (no provider prefix, or openai/...) whose client sent none; turn off for an
    # OpenAI-compatible upstream that rejects unknown fields
    prompt_cache_key: bool = True
    # cache_control breakpoints (proxy/turn/cache_hints.py): auto (anthropic/... and claude
    # models), all (every model: a gateway that forwards them to Anthropic), off
    cache_breakpoints: Literal["auto", "all", "off"] = "auto"
    # the summarizer call on the session's cached prefix when the plan lines up with the
    # turn's request (proxy/background/summary_prefix.py); false: always the transcript call
    summarizer_cached_prefix: bool = True
    default_context_window: int = 128_000
    # the tokenizer loaded before serving (the family most traffic uses)
    default_model: str = "gpt-4o"
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    upstream_timeout: float = 600.0
    # the direct upstream's connection pool and TLS (HTTP(S)_PROXY / NO_PROXY are read from
    # the environment); a CA bundle replaces the system trust store, a client certificate
    # (with its key, unless the file holds both) is presented to the upstream
    upstream_max_connections: int = Field(default=100, ge=1)
    upstream_ca_bundle: str | None = None
    upstream_client_cert: str | None = None
    upstream_client_key: str | None = None
    upstream_tls_verify: bool = True
    # how long a turn waits for a running compaction of its session before going ahead
    compaction_wait_seconds: float = 15.0
    # summarizer calls allowed per session per hour (bounds cost and loops)
    summarizer_calls_per_hour: int = 30
    # memory for sessions kept decoded across turns, estimated (storage/cached.py);
    # 0 turns the cache off
    session_cache_mb: float = Field(default=16, ge=0)
    # failed admin authentications (wrong Bearer token or login) allowed per client address
    # per minute; past it the address gets 429s until its minute ends (0 turns it off)
    admin_auth_failures_per_minute: int = Field(default=10, ge=0)
    # optional bounds on one request (0 turns one off): its messages, and the bytes of the
    # headers forwarded upstream (authorization, api keys, provider headers)
    max_messages_per_request: int = Field(default=100_000, ge=0)
    max_forwarded_header_bytes: int = Field(default=16 * 1024, ge=0)
    # sessions one API key may create (0: no limit; sessions are never deleted on their own,
    # so a bound would in time refuse a long-lived key's new conversations)
    max_sessions_per_key: int = Field(default=0, ge=0)
    # set by `memory-proxy serve`: after start-up, freeze what exists (imports, tokenizers)
    # out of the cyclic GC's sight and collect the young generation less often (see app.py)
    tune_gc: bool = False
    log_level: str = "info"

    @property
    def loopback_only(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    def upstream_key(self) -> str | None:
        return self.upstream_api_key.get_secret_value() if self.upstream_api_key else None

    def anthropic_key(self) -> str | None:
        return self.anthropic_api_key.get_secret_value() if self.anthropic_api_key else None

    def admin_secret(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token else None
