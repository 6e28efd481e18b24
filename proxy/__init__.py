"""memory-proxy: an OpenAI-compatible HTTP proxy that gives any LLM agent memory."""

from proxy.settings import Settings

__all__ = ["Settings", "create_app"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # the app factory imports the web stack; keep ``import proxy`` cheap
    if name == "create_app":
        from proxy.http.app import create_app

        return create_app
    raise AttributeError(name)
