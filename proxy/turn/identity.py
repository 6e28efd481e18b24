"""Which agent and session a request belongs to, and whose (the API key's namespace).

Priority (DESIGN.md, docs/MEMORY.md): the path form; the headers ``X-Session-Id``,
``X-Session-Affinity`` and the ids agents already send (``SESSION_HEADERS``); the body's
``metadata.session_id``, then OpenAI's ``prompt_cache_key``; the body's ``user`` only for
an agent that opts in (``userAsSession``: it names a person, not a conversation); then a
fingerprint of the agent, the system prompt and the first user message.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from proxy.agents import DEFAULT_AGENT
from proxy.errors import BadRequest
from proxy.turn.state import Turn, TurnRequest
from strategies.key_cache import short_key_cache
from strategies.records import SessionKey

if TYPE_CHECKING:
    from proxy.services import Services

SessionSource = Literal["path", "header", "metadata", "prompt_cache_key", "user", "fingerprint"]
# braces would break the Redis hash tag; slashes the path form
_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,128}$")
# ours first, then the session ids agents send of their own accord, in this order: Claude
# Code, Codex (both spellings), opencode
SESSION_HEADERS = (
    "x-session-id",
    "x-session-affinity",
    "x-claude-code-session-id",
    "session-id",
    "session_id",
    "x-opencode-session",
)
# the ones a client sets for memory-proxy: a malformed value is the client's error
OWN_SESSION_HEADERS = ("x-session-id", "x-session-affinity")


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str
    agent: str
    session: str
    source: SessionSource


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else authorization.strip()


def client_key(headers: Mapping[str, str]) -> str | None:
    """The key a client authenticates with: ``Authorization`` (Bearer), else the
    ``api-key`` (Azure) or ``x-api-key`` (Anthropic) header. Without it every such client
    would share the anonymous namespace."""
    return (
        bearer_key(headers.get("authorization"))
        or headers.get("api-key")
        or headers.get("x-api-key")
        or None
    )


@short_key_cache(maxsize=1024)  # a client sends the same key with every turn
def namespace_for(api_key: str | None) -> str:
    """A short, stable hash of the client's API key: the key itself is never stored."""
    if not api_key:
        return "anon"
    return hashlib.sha256(b"memory-proxy:" + api_key.encode()).hexdigest()[:20]


def _checked(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise BadRequest(
            f"invalid {what}: use 1-128 characters of letters, digits and . _ : @ + = -",
            param=what,
            code="invalid_identifier",
        )
    return value


def _text_of(message: Mapping[str, Any] | None) -> str:
    if not message:
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _foreign(value: str) -> str:
    """An id an agent sends for itself (not for memory-proxy): used as it is when it is a
    valid session id, else as a hash of it (never refused: the client did nothing wrong)."""
    if _ID.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:32]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def identify(
    *,
    path_params: Mapping[str, str],
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    api_key: str | None,
    system: list[dict[str, Any]],
    conversation: list[dict[str, Any]],
    user_as_session: Callable[[str], bool] = lambda agent: False,
) -> Identity:
    """Resolve agent and session; raises BadRequest for malformed identifiers.
    ``user_as_session(agent)``: the agent opted in to keying sessions by the body's
    ``user``."""
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)

    agent = (
        path_params.get("agent")
        or headers.get("x-agent-id")
        or metadata.get("agent_id")
        or DEFAULT_AGENT
    )
    agent = _checked(agent, "agent")

    session: Any
    source: SessionSource
    header = next((name for name in SESSION_HEADERS if headers.get(name)), None)
    if path_params.get("session"):
        session, source = path_params["session"], "path"
    elif header is not None:
        session, source = headers[header], "header"
        if header not in OWN_SESSION_HEADERS:
            session = _foreign(session)
    elif metadata.get("session_id"):
        session, source = metadata["session_id"], "metadata"
    elif _text(body.get("prompt_cache_key")):
        session, source = _foreign(body["prompt_cache_key"]), "prompt_cache_key"
    elif _text(body.get("user")) and user_as_session(agent):
        session, source = body["user"], "user"
    else:
        first_user = next((m for m in conversation if m.get("role") == "user"), None)
        material = "\x1f".join([agent, *(_text_of(m) for m in system), _text_of(first_user)])
        session = "fp-" + hashlib.sha256(material.encode()).hexdigest()[:24]
        source = "fingerprint"
    return Identity(namespace_for(api_key), agent, _checked(session, "session"), source)


def identify_turn(services: Services, request: TurnRequest) -> Turn:
    """The identify step: whose turn this is (agent, session, namespace), with the
    agent's config as last known here (the load step confirms it)."""

    def resolve(agent: str) -> Any:
        return services.agents.resolve(agent, services.overrides.get(agent))

    identity = request.identity or identify(
        path_params=request.path_params,
        headers=request.headers,
        body=request.options,
        api_key=client_key(request.headers),
        system=request.system,
        conversation=request.conversation,
        user_as_session=lambda agent: resolve(agent).definition.userAsSession,
    )
    agent = resolve(identity.agent)
    return Turn(
        request=request,
        identity=identity,
        key=SessionKey(identity.namespace, identity.agent, identity.session),
        agent=agent,
        model=str(request.model or agent.definition.llm.model or ""),
    )
