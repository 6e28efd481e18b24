"""``/memory/{agent}/{session}/transcript``: a session's whole record (admin token).

``/memory`` shows what the model receives; the transcript shows what is stored: every
message in ``seq`` order with its original content, its compression stub, whether a
rewind superseded it, its token count and its turn's cached prompt tokens (when the
store has them), the summaries and compactions with the ranges they cover, and media
parts named. Paged by seq (``?after=SEQ&limit=N``, ``next_after`` the next cursor);
``?format=jsonl`` streams the whole session as JSON lines, page by page, for export.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.admin.auth import require_admin
from proxy.admin.inspect import requested_session
from proxy.errors import RENDERED, BadRequest, NotFound, proxy_error
from proxy.http.responses import json_response
from proxy.services import Services
from proxy.turn.prompt_cache import CACHE_META
from strategies import media, native
from strategies.compression import content_text
from strategies.records import LoadSpec, LogPage, SessionKey, StoredMessage, SummaryRecord

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# the JSON lines export reads the log in pages of this many messages
EXPORT_PAGE = 500


def cached_tokens(message: StoredMessage) -> int | None:
    """The prompt tokens the provider served from its cache for the turn this reply
    answered, when the store recorded them (None otherwise)."""
    cache = message.meta.get(CACHE_META)
    value = cache.get("cached") if isinstance(cache, dict) else None
    return value if isinstance(value, int) else None


def named_parts(message: StoredMessage) -> list[dict[str, Any]]:
    """The message's media parts: what is known of each and its one-line name."""
    content = message.content if isinstance(message.content, list) else []
    out = []
    for part in content:
        if media.is_media(part):
            meta = media.part_meta(part)
            out.append({**meta, "line": f"[{meta['kind']}: {media.describe(meta)}]"})
    return out


def record_text(message: StoredMessage, parts: list[dict[str, Any]]) -> str:
    """The original content as text, each media part as its named line, each native part
    (strategies/native.py) as the line naming it."""
    if not isinstance(message.content, list):
        return content_text(message.content)
    lines = iter(part["line"] for part in parts)
    return "\n".join(
        next(lines)
        if media.is_media(part)
        else native.describe(part)
        if native.is_native(part)
        else content_text([part])
        for part in message.content
    )


def covering(seq: int, summaries: list[SummaryRecord]) -> list[int]:
    return [s.id for s in summaries if s.from_seq <= seq <= s.to_seq]


def message_entry(
    message: StoredMessage, superseded: bool, summaries: list[SummaryRecord], boundary: int
) -> dict[str, Any]:
    parts = named_parts(message)
    entry: dict[str, Any] = {
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "text": record_text(message, parts),
        "compressed_content": message.compressed_content,
        "superseded": superseded,
        # before the latest compaction boundary: only its summary reaches the model
        "compacted": message.seq <= boundary,
        "tokens": message.tokens,
        "cached_tokens": cached_tokens(message),
        "created_at": message.created_at,
        "summarized_by": covering(message.seq, summaries),
    }
    if message.tool_calls:
        entry["tool_calls"] = message.tool_calls
    if message.tool_call_id:
        entry["tool_call_id"] = message.tool_call_id
    if message.name:
        entry["name"] = message.name
    if parts:
        entry["parts"] = parts
    if message.meta.get("attachments"):
        entry["attachments"] = message.meta["attachments"]
    return entry


def summary_entry(summary: SummaryRecord) -> dict[str, Any]:
    return {
        "id": summary.id, "kind": summary.kind, "from_seq": summary.from_seq,
        "to_seq": summary.to_seq, "tokens": summary.tokens, "model": summary.model,
        "text": summary.text, "created_at": summary.created_at,
    }  # fmt: skip


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be an integer from {low} to {high}", param=name)
    return value


class Record:
    """One session's stored record, read through the store a page at a time."""

    def __init__(self, services: Services, key: SessionKey) -> None:
        self.services = services
        self.key = key
        self.summaries: list[SummaryRecord] = []
        self.boundary = 0
        self.head_seq = 0
        self.active_count = 0

    async def open(self) -> None:
        """Read the session's meta and summaries (no messages); 404 when not stored."""
        snapshot = await self.services.store.load(self.key, LoadSpec(limit=0))
        if not snapshot.exists:
            raise NotFound(
                f"no session {self.key.session!r} for agent {self.key.agent!r}",
                code="session_not_found",
            )
        self.summaries = snapshot.summaries
        self.boundary = snapshot.meta.boundary_seq
        self.head_seq = snapshot.meta.head_seq
        self.active_count = snapshot.meta.active_count

    async def page(self, after: int, limit: int) -> LogPage:
        return await self.services.store.read_log(self.key, after=after, limit=limit)

    def entries(self, page: LogPage) -> list[dict[str, Any]]:
        return [
            message_entry(m, m.seq in page.superseded, self.summaries, self.boundary)
            for m in page.messages
        ]

    def header(self) -> dict[str, Any]:
        return {
            "agent": self.key.agent, "session": self.key.session,
            "namespace": self.key.namespace, "head_seq": self.head_seq,
            "messages_stored": self.active_count, "boundary_seq": self.boundary,
        }  # fmt: skip

    async def lines(self) -> AsyncIterator[bytes]:
        """The JSON lines export: a session line, then every message in seq order, each
        summary right after the message that ends its range (``type`` names each line).
        A store that fails halfway ends the export with an ``error`` line."""
        try:
            async for chunk in self._lines():
                yield chunk
        except RENDERED as exc:
            yield orjson.dumps({"type": "error", **proxy_error(exc).to_dict()}) + b"\n"

    async def _lines(self) -> AsyncIterator[bytes]:
        yield orjson.dumps({"type": "session", **self.header()}) + b"\n"
        pending = sorted(self.summaries, key=lambda s: (s.to_seq, s.id))
        after: int | None = 0
        while after is not None:
            page = await self.page(after, EXPORT_PAGE)
            out = []
            for entry in self.entries(page):
                out.append(orjson.dumps({"type": "message", **entry}))
                while pending and pending[0].to_seq <= entry["seq"]:
                    out.append(orjson.dumps({"type": "summary", **summary_entry(pending.pop(0))}))
            if out:
                yield b"\n".join(out) + b"\n"
            after = page.next_after
        for summary in pending:
            yield orjson.dumps({"type": "summary", **summary_entry(summary)}) + b"\n"


async def transcript_view(
    services: Services, key: SessionKey, after: int, limit: int
) -> dict[str, Any]:
    """One page of the transcript (also the admin page's JSON twin)."""
    record = Record(services, key)
    await record.open()
    page = await record.page(after, limit)
    return {
        **record.header(),
        "messages": record.entries(page),
        "summaries": [summary_entry(s) for s in record.summaries],
        "after": after,
        "limit": limit,
        "next_after": page.next_after,
    }


def page_params(request: Request) -> tuple[int, int]:
    """``after`` and ``limit`` of a transcript request (400 when out of range)."""
    return (
        int_param(request, "after", 0, 0, 2**62),
        int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
    )


async def transcript_response(services: Services, request: Request) -> Response:
    """A page of the transcript as JSON, or with ``format=jsonl`` the whole export
    (``/memory/…/transcript`` and the admin API's twin)."""
    form = request.query_params.get("format") or "json"
    if form not in ("json", "jsonl"):
        raise BadRequest("'format' must be json or jsonl", param="format")
    after, limit = page_params(request)
    key = await requested_session(services, request)
    if form == "json":
        return json_response(await transcript_view(services, key, after, limit))
    record = Record(services, key)
    await record.open()  # a missing session is a 404 before the stream starts
    filename = re.sub(r"[^A-Za-z0-9._-]", "_", f"{key.agent}-{key.session}") + ".jsonl"
    return StreamingResponse(
        record.lines(), media_type="application/x-ndjson",
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )  # fmt: skip


async def session_transcript(request: Request) -> Response:
    services: Services = request.app.state.services
    require_admin(request, services.settings, services.admin_failures)
    return await transcript_response(services, request)
