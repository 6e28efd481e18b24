"""Provider-prefixed models (``anthropic/...``, ``gemini/...``, ``bedrock/...``) through
litellm, presented as an OpenAI-compatible upstream.

``import litellm`` takes seconds and, unless told otherwise, fetches a cost map from the
network and repoints ``TIKTOKEN_CACHE_DIR``: it is imported on first use only, in a worker
thread, after ``prepare_litellm_env()``.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from proxy.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTimeout
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse

__all__ = ["LitellmStream", "LitellmUpstream", "prepare_litellm_env"]

log = logging.getLogger(__name__)

_DONE = SSEEvent(raw=b"data: [DONE]\n\n", data=b"[DONE]")
_JSON_HEADERS = {"content-type": "application/json"}
_SSE_HEADERS = {"content-type": "text/event-stream"}
# providers authenticated by cloud credentials, never by the client's bearer token
_CLOUD_AUTH = frozenset({"bedrock", "sagemaker", "sagemaker_chat", "vertex_ai", "vertex_ai_beta"})
_READONLY_WARNING = r".*using the `ReadOnly` qualifier"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def prepare_litellm_env() -> None:
    """Environment litellm reads at import: the bundled cost map (no network), and the
    tiktoken cache dir this process already uses (litellm would overwrite it)."""
    from strategies.tokens import bundled_tokenizer_dir

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR"):
        return
    directory = os.environ.get("TIKTOKEN_CACHE_DIR") or bundled_tokenizer_dir()
    if directory:
        os.environ["CUSTOM_TIKTOKEN_CACHE_DIR"] = str(directory)


def import_litellm() -> Any:
    """Import litellm quietly: its import and first calls emit pydantic warnings."""
    prepare_litellm_env()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        litellm: Any = importlib.import_module("litellm")
    # litellm's TypedDicts build their pydantic schemas lazily, at first use
    warnings.filterwarnings("ignore", message=_READONLY_WARNING, category=UserWarning)
    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner per error
    return litellm


def client_without_cookies() -> Any:
    """litellm's own client for OpenAI-compatible providers (openai/, azure/, groq/...),
    with the jar litellm gives its other clients: one that keeps no cookie. The client
    litellm builds by itself is shared by every caller with the same key and keeps the
    cookies responses set, so a provider edge's cookie (Cloudflare's ``__cf_bm``) from one
    tenant's call would ride on every other tenant's. None, with a warning, when this
    litellm has no such client."""
    try:
        from litellm.llms.custom_httpx.http_handler import blocked_cookie_jar
        from litellm.llms.openai.common_utils import BaseOpenAILLM

        client: Any = BaseOpenAILLM._get_async_http_client()
        client.cookies = blocked_cookie_jar()
    except (ImportError, AttributeError) as exc:
        log.warning("litellm's OpenAI-compatible clients keep response cookies (%s)", exc)
        return None
    return client


def _error_body(exc: Exception, status: int) -> bytes:
    message = str(getattr(exc, "message", None) or exc)
    error = {"message": message, "type": _ERROR_TYPES.get(status, "api_error"),
             "param": None, "code": None}
    provider = getattr(exc, "body", None)
    if isinstance(provider, dict):
        for key in ("type", "param", "code"):
            if provider.get(key) is not None:
                error[key] = provider[key]
    return orjson.dumps({"error": error})


@contextmanager
def translate_errors(
    litellm: Any, model: str, secrets: tuple[str, ...] = ()
) -> Iterator[None]:
    """The one seam where litellm's exceptions become ``proxy.errors`` (``secrets``: the
    keys of the call, masked in an error body that echoes them)."""
    try:
        yield
    except litellm.Timeout as exc:
        raise UpstreamTimeout(f"{model}: {exc}") from exc
    except litellm.APIConnectionError as exc:
        raise UpstreamConnectError(f"{model}: {exc}") from exc
    except TimeoutError as exc:
        raise UpstreamTimeout(f"{model}: timed out") from exc
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if not isinstance(status, int) or not type(exc).__module__.startswith(
            ("litellm", "openai")
        ):
            raise
        raise UpstreamStatusError(
            f"{model}: upstream answered {status}", status_code=status,
            body=_error_body(exc, status), content_type="application/json", secrets=secrets,
        ) from exc


class LitellmStream:
    """litellm's chunk stream as OpenAI SSE events, ending with ``data: [DONE]``."""

    status_code = 200

    def __init__(
        self, wrapper: Any, litellm: Any, model: str, secrets: tuple[str, ...] = ()
    ) -> None:
        self.headers = dict(_SSE_HEADERS)
        self._wrapper = wrapper
        self._litellm = litellm
        self._model = model
        self._secrets = secrets
        self._done = False

    def __aiter__(self) -> LitellmStream:
        return self

    async def __anext__(self) -> SSEEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            with translate_errors(self._litellm, self._model, self._secrets):
                chunk = await self._wrapper.__anext__()
        except StopAsyncIteration:
            self._done = True
            return _DONE
        data = orjson.dumps(chunk.model_dump(exclude_none=True))
        return SSEEvent(raw=b"data: " + data + b"\n\n", data=data)

    async def aclose(self) -> None:
        self._done = True
        await self._wrapper.aclose()


class LitellmUpstream:
    """Calls ``litellm.acompletion`` for provider-prefixed model ids.

    The key used: ``api_key`` if configured; else litellm's own environment variable for the
    provider (``ANTHROPIC_API_KEY``...) when set; else the client's bearer token (except for
    providers with cloud credentials: bedrock, sagemaker, vertex_ai). litellm's retries are
    off (``max_retries=0``): the client decides whether to retry.

    ``models()`` answers the configured ``models`` list in OpenAI's shape, or a 404 error
    when none is configured (providers have no common listing endpoint).

    ``litellm`` is the module the calls go to, imported on first use when not given; an
    application (or a test) may pass one of its own: what is used of it is
    ``acompletion``, ``validate_environment`` and its exception classes
    (``translate_errors``).

    The module imported here gets, from ``start()`` to ``close()``, this upstream's client
    for its OpenAI-compatible providers (``litellm.aclient_session``, litellm's setting for
    it): one that keeps no cookies (``client_without_cookies``). ``close()`` closes it and
    drops the provider clients litellm cached on it.
    """

    def __init__(
        self,
        api_key: str | None = None,
        api_base: str | None = None,
        *,
        models: list[str] | None = None,
        timeout: float = 600,
        litellm: Any = None,
    ) -> None:
        self.api_key = api_key
        self.api_base = api_base
        self.model_ids = models
        self.timeout = timeout
        self._litellm: Any = litellm
        self._env_keys: dict[str, bool] = {}
        self._client: Any = None

    async def start(self) -> None:
        if self._litellm is not None:
            return
        litellm = await asyncio.to_thread(import_litellm)
        self._client = client_without_cookies()
        if self._client is not None:
            litellm.aclient_session = self._client
        self._litellm = litellm

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._litellm.aclient_session is client:
            self._litellm.aclient_session = None
        # litellm caches the provider clients it built on this one (an hour, by key)
        self._litellm.in_memory_llm_clients_cache.flush_cache()
        await client.aclose()

    def _kwargs(self, request: UpstreamRequest) -> dict[str, Any]:
        kwargs = {k: v for k, v in request.body.items() if k not in ("stream", "stream_options")}
        if "messages" in kwargs:
            # litellm reshapes messages in place for some providers; these are shared with
            # later turns (the mapper keeps each record's rendering), so it gets its own
            kwargs["messages"] = copy.deepcopy(kwargs["messages"])
        kwargs["max_retries"] = 0
        kwargs.setdefault("timeout", self.timeout)
        if self.api_base is not None:
            kwargs["api_base"] = self.api_base
        api_key = self.api_key or self._client_key(request)
        if api_key is not None:
            kwargs["api_key"] = api_key
        return kwargs

    def _client_key(self, request: UpstreamRequest) -> str | None:
        model = request.model
        provider = model.split("/", 1)[0]
        if provider in _CLOUD_AUTH:
            return None
        in_env = self._env_keys.get(provider)
        if in_env is None:
            check = self._litellm.validate_environment(model=model)
            in_env = self._env_keys[provider] = bool(check.get("keys_in_environment"))
        if in_env:
            return None
        for name, value in request.headers.items():
            if name.lower() == "authorization" and value[:7].lower() == "bearer ":
                return value[7:].strip() or None
        return None

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        await self.start()
        litellm = self._litellm
        kwargs = self._kwargs(request)
        with translate_errors(litellm, request.model, request.secrets(kwargs.get("api_key"))):
            response = await litellm.acompletion(**kwargs, stream=False)
        return UpstreamResponse(200, orjson.dumps(response.model_dump()), dict(_JSON_HEADERS))

    async def chat_stream(self, request: UpstreamRequest) -> LitellmStream:
        await self.start()
        litellm = self._litellm
        kwargs = self._kwargs(request)
        options = request.body.get("stream_options")
        if options:
            kwargs["stream_options"] = options
        secrets = request.secrets(kwargs.get("api_key"))
        with translate_errors(litellm, request.model, secrets):
            wrapper = await litellm.acompletion(**kwargs, stream=True)
        return LitellmStream(wrapper, litellm, request.model, secrets)

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        if self.model_ids is None:
            error = {"message": "model listing is not available for litellm providers",
                     "type": "not_found_error", "param": None, "code": None}
            return UpstreamResponse(404, orjson.dumps({"error": error}), dict(_JSON_HEADERS))
        data = [{"id": m, "object": "model", "created": 0, "owned_by": m.split("/", 1)[0]}
                for m in self.model_ids]
        return UpstreamResponse(200, orjson.dumps({"object": "list", "data": data}),
                                dict(_JSON_HEADERS))
