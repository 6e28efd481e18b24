"""Route each call by its model id: provider-prefixed models to litellm, the rest to the
direct OpenAI-compatible upstream."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from proxy.upstreams.base import Upstream, UpstreamRequest, UpstreamResponse, UpstreamStream

__all__ = ["LITELLM_PREFIXES", "RoutedUpstream", "litellm_prefixes"]

# litellm providers that are reached through litellm. Generic OpenAI-compatible names
# (openai, openai_like, custom_openai, ...) are not here: they go to the direct upstream.
LITELLM_PREFIXES = frozenset({
    "ai21", "aleph_alpha", "anthropic", "anyscale", "azure", "azure_ai", "baseten",
    "bedrock", "cerebras", "cloudflare", "codestral", "cohere", "cohere_chat", "dashscope",
    "databricks", "deepinfra", "deepseek", "fireworks_ai", "friendliai", "gemini", "github",
    "groq", "huggingface", "lm_studio", "mistral", "moonshot", "nebius", "nlp_cloud",
    "novita", "nvidia_nim", "ollama", "ollama_chat", "openrouter", "perplexity", "predibase",
    "replicate", "sagemaker", "sagemaker_chat", "sambanova", "together_ai", "vertex_ai",
    "vertex_ai_beta", "volcengine", "watsonx", "xai",
})
_DIRECT = frozenset({"openai", "openai_like", "custom_openai", "text-completion-openai",
                     "litellm_proxy", "hosted_vllm", "vllm"})


def litellm_prefixes() -> frozenset[str]:
    """The static set, widened by litellm's own provider list when litellm is already
    imported (it is never imported just for this)."""
    litellm = sys.modules.get("litellm")
    providers = getattr(litellm, "provider_list", None) if litellm is not None else None
    if not providers:
        return LITELLM_PREFIXES
    names = {getattr(p, "value", p) for p in providers}
    return LITELLM_PREFIXES | frozenset(n for n in names if isinstance(n, str)) - _DIRECT


class RoutedUpstream:
    """An ``Upstream`` that sends ``prefix/model`` ids whose prefix is a litellm provider to
    the upstream built by ``litellm_factory`` (constructed and started on first use) and
    everything else, and ``GET /models``, to ``direct``.

    ``prefixes`` overrides the provider set: pass ``frozenset()`` to send everything direct
    (for example when the direct upstream is OpenRouter, whose ids look like
    ``anthropic/claude-...``).
    """

    def __init__(
        self,
        direct: Upstream,
        litellm_factory: Callable[[], Upstream],
        *,
        prefixes: frozenset[str] | None = None,
    ) -> None:
        self.direct = direct
        self._factory = litellm_factory
        self._prefixes = prefixes
        self._litellm: Upstream | None = None
        self._lock = asyncio.Lock()

    def uses_litellm(self, model: str) -> bool:
        prefix, slash, _ = model.partition("/")
        if not slash:
            return False
        prefixes = self._prefixes
        if prefixes is None:
            if prefix in LITELLM_PREFIXES:
                return True
            if "litellm" not in sys.modules:
                return False
            prefixes = self._prefixes = litellm_prefixes()
        return prefix in prefixes

    async def _pick(self, model: str) -> Upstream:
        if not self.uses_litellm(model):
            return self.direct
        if self._litellm is None:
            async with self._lock:
                if self._litellm is None:
                    upstream = self._factory()
                    await upstream.start()
                    self._litellm = upstream
        return self._litellm

    async def start(self) -> None:
        await self.direct.start()

    async def close(self) -> None:
        await self.direct.close()
        if self._litellm is not None:
            await self._litellm.close()

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        return await (await self._pick(request.model)).chat(request)

    async def chat_stream(self, request: UpstreamRequest) -> UpstreamStream:
        return await (await self._pick(request.model)).chat_stream(request)

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        return await self.direct.models(headers)
