"""What ``memory-proxy serve`` says it serves, before it starts: store (credentials
masked), upstream, agent definitions, admin access, and a base URL that keeps memory."""

from __future__ import annotations

from pathlib import Path

from proxy.agents import AgentRegistry
from proxy.settings import Settings
from storage.redact import mask_url


def startup_lines(settings: Settings) -> list[str]:
    base = f"http://{_host(settings.host)}:{settings.port}"
    lines = [
        f"memory-proxy serving on {base}",
        f"  store     {mask_url(settings.store_url)}",
        f"  upstream  {mask_url(settings.upstream_url)} ({_keys(settings)})",
        *_agents(settings.agents_dir),
        f"  admin     {_admin(settings)}",
        "  memory    point a client's base URL at",
        f"            {base}/agents/<agent>/sessions/<session>/v1",
    ]
    return lines


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _keys(settings: Settings) -> str:
    if settings.upstream_api_key is not None:
        return "with MEMORY_PROXY_UPSTREAM_API_KEY"
    return "with each client's own key"


def _agents(directory: Path | None) -> list[str]:
    if directory is None or not directory.is_dir():
        return [
            f"  agents    {directory}: not found",
            "  warning   no agent definitions: every agent runs summarizing_window with its "
            "defaults (set MEMORY_PROXY_AGENTS_DIR)",
        ]
    registry = AgentRegistry(directory)
    registry.load()
    names = registry.names()
    listed = f" ({', '.join(names)})" if names else ""
    lines = [f"  agents    {directory}: {len(names)} loaded{listed}"]
    lines += [f"  warning   {name} rejected: {error}" for name, error in registry.errors.items()]
    return lines


def _admin(settings: Settings) -> str:
    if settings.admin_secret() is not None:
        return "/admin and /memory need the admin token (MEMORY_PROXY_ADMIN_TOKEN)"
    if settings.loopback_only:
        return "/admin and /memory open to this machine only (no admin token set)"
    return "/admin and /memory closed: set MEMORY_PROXY_ADMIN_TOKEN to open them"
