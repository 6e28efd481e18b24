"""Media parts of incoming messages, taken out at persist time and read back for the turn.

Media parts (``image_url`` with a ``data:`` URL, ``file`` with ``file_data``,
``input_audio``) are taken out of the message record and stored once, content-addressed
(``sha256:<hex>``), in the part store. The stored content keeps a reference in place of
each, the part as sent minus its payload plus what was measured::

    {"type": "image_url", "image_url": {"detail": "high"},
     "part": {"kind": "image", "digest": "sha256:…", "media_type": "image/png",
              "size": 90211, "width": 1024, "height": 768, "detail": "high"}}

``meta["parts"]`` lists the same metadata for the working-memory view. Remote ``http(s)``
image URLs and ``file_id`` references stay in the content as sent: the proxy never fetches
them (the provider does, when the part is shown). A message may also announce attachments
in a non-standard ``attachments`` field (a list of names or of ``{"name", "media_type",
"size"}``); they are kept in ``meta["attachments"]`` and named in the attachment notice.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequest
from proxy.services import Services
from storage.parts import StorePartReader
from strategies import media
from strategies.mapper import MappingContext
from strategies.media_info import (
    decode_base64,
    parse_data_url,
    pdf_pages,
    sniff_image,
    sniff_media_type,
    wav_seconds,
)
from strategies.records import SessionKey, StoredMessage

MAX_ANNOUNCED = 50
_AUDIO_TYPES = {"wav": "audio/wav", "mp3": "audio/mpeg"}
# declared types that say nothing: the bytes or the file name say more
_VAGUE_TYPES = (None, "application/octet-stream", "text/plain")


@dataclass(frozen=True, slots=True)
class PartBlob:
    """The bytes of one media part, to store under ``digest``."""

    digest: str
    data: bytes
    media_type: str


def extract_parts(
    message: Mapping[str, Any], blobs: dict[str, PartBlob]
) -> tuple[Any, dict[str, Any]]:
    """The content to store (media replaced by references) and the record's meta
    (``parts``, ``attachments``); the bytes of inline media are added to ``blobs``."""
    content = message.get("content")
    meta: dict[str, Any] = {}
    announced = announced_attachments(message.get("attachments"))
    if announced:
        meta["attachments"] = announced
    if not isinstance(content, list) or not any(media.is_media(p) for p in content):
        return content, meta
    stored: list[Any] = []
    found: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if not media.is_media(part):
            stored.append(part)
            continue
        ref, part_meta = _extract(part, index, blobs)
        stored.append(ref)
        found.append(part_meta)
    meta["parts"] = found
    return stored, meta


def _extract(
    part: Mapping[str, Any], index: int, blobs: dict[str, PartBlob]
) -> tuple[Mapping[str, Any], dict[str, Any]]:
    kind = str(part["type"])
    if "part" in part:
        # a stored-part reference is the proxy's own: one sent by a client could name
        # any digest, another key's media included
        raise BadRequest(f"messages: content part {index} ({kind}): 'part' is set by"
                         " memory-proxy, not by clients; send the media itself",
                         param="messages")
    spec = part.get(kind)
    if not isinstance(spec, Mapping):
        # not a shape the proxy reads: it passes through for the upstream to judge
        return part, media.part_meta(part)
    field = media.PAYLOAD_FIELDS[kind]
    payload = spec.get(field)
    if not isinstance(payload, str) or not payload:
        # a file id or another reference the provider resolves: kept as sent
        return part, media.part_meta(part)
    data_url = parse_data_url(payload)
    if data_url is None and kind == "image_url":
        # a remote image: the provider fetches it when it is shown; the proxy never does
        return part, media.part_meta(part)
    try:
        data = data_url.decode() if data_url is not None else decode_base64(payload)
    except ValueError as exc:
        raise BadRequest(f"messages: content part {index} ({kind}): {exc}",
                         param="messages") from None
    declared = data_url.media_type if data_url is not None else None
    meta = _measure(kind, spec, data, declared)
    blobs.setdefault(meta["digest"], PartBlob(meta["digest"], data, meta["media_type"]))
    ref = {k: v for k, v in part.items() if k != kind}
    ref[kind] = {k: v for k, v in spec.items() if k != field}
    ref["part"] = meta
    return ref, dict(meta)


def _measure(kind: str, spec: Mapping[str, Any], data: bytes, declared: str | None
             ) -> dict[str, Any]:
    meta: dict[str, Any] = {"kind": media.MEDIA_KINDS[kind],
                            "digest": "sha256:" + hashlib.sha256(data).hexdigest()}
    sniffed = sniff_media_type(data[:64])
    name = spec.get("filename") if kind == "file" else None
    if kind == "image_url":
        image = sniff_image(data)
        media_type = image.media_type if image else declared or sniffed or "image/png"
    elif kind == "input_audio":
        fmt = str(spec.get("format") or "")
        media_type = _AUDIO_TYPES.get(fmt) or sniffed or declared or "audio/wav"
    else:
        guessed = mimetypes.guess_type(name)[0] if isinstance(name, str) else None
        if declared in _VAGUE_TYPES:
            declared = None
        media_type = declared or sniffed or guessed or "application/octet-stream"
    meta["media_type"] = media_type
    meta["size"] = len(data)
    if isinstance(name, str) and name:
        meta["name"] = name
    if kind == "image_url":
        if image:
            meta["width"], meta["height"] = image.width, image.height
        if spec.get("detail"):
            meta["detail"] = spec["detail"]
    elif kind == "file" and media_type == "application/pdf":
        pages = pdf_pages(data)
        if pages:
            meta["pages"] = pages
    elif kind == "input_audio":
        meta["format"] = spec.get("format") or ("mp3" if media_type == "audio/mpeg" else "wav")
        seconds = wav_seconds(data)
        if seconds:
            meta["seconds"] = seconds
    return meta


def announced_attachments(value: Any) -> list[dict[str, Any]]:
    """A message's announced attachments, normalized to ``{"name", "media_type", "size"}``."""
    if not isinstance(value, list):
        return []
    found: list[dict[str, Any]] = []
    for entry in value[:MAX_ANNOUNCED]:
        if isinstance(entry, str) and entry:
            found.append({"name": entry[:200]})
        elif isinstance(entry, Mapping):
            name = entry.get("name") or entry.get("filename") or entry.get("file_name")
            if not isinstance(name, str) or not name:
                continue
            item: dict[str, Any] = {"name": name[:200]}
            media_type = entry.get("media_type") or entry.get("mime_type")
            if isinstance(media_type, str) and media_type:
                item["media_type"] = media_type[:100]
            if isinstance(entry.get("size"), int) and entry["size"] >= 0:
                item["size"] = entry["size"]
            found.append(item)
    return found


async def load_media(
    services: Services,
    key: SessionKey,
    current_turn: Sequence[StoredMessage],
    mapping: MappingContext,
    blobs: Mapping[str, PartBlob] | None = None,
) -> None:
    """The bytes of the parts that travel as blocks, into ``mapping.parts``: this turn's
    new parts from ``blobs``, stored ones read for the session ``key`` (one round trip;
    none without media). New parts are stored with the turn (``store_parts``)."""
    wanted = media.block_digests(current_turn, mapping)
    blobs = blobs or {}
    loaded = {d: (blobs[d].data, blobs[d].media_type) for d in wanted if d in blobs}
    missing = [d for d in wanted if d not in loaded]
    if missing:
        reader = services.part_reader or StorePartReader(services.store)
        found = await reader.read_parts(key, missing)
        loaded.update({d: v for d, v in found.items() if d in missing})
    mapping.parts = loaded


async def store_parts(
    services: Services, key: SessionKey, blobs: Mapping[str, PartBlob]
) -> None:
    """Store a turn's new parts for its session, before the turn's messages that refer to
    them (a turn that fails stores none)."""
    if not blobs:
        return
    rows = [(b.digest, b.data, b.media_type) for b in blobs.values()]
    await services.store.put_parts(key, rows)
