"""Media parts as the model receives them: content blocks or placeholder lines (pure).

An image, document or audio part travels as the provider's content block only when

- the message is a user message of the current turn (``seq >= current_turn_seq``), and
- the target model reads that kind (``MappingContext.capabilities``: ``image`` for
  ``image_url`` parts, ``document`` for ``file`` parts, ``audio`` for ``input_audio``), and
- for a stored part, its bytes were loaded (``MappingContext.parts``).

Otherwise it becomes one placeholder line naming the part::

    [image: photo.png — image/png, 1024x768, 88 KB, sha256:ab12cd34ef56 — not shown to the model]
    [document: report.pdf — application/pdf, 3 pages, 120 KB, sha256:… — not shown to the model]
    [image: https://example.com/cat.png — not shown to the model]

(``content unavailable`` instead when the part store no longer has the bytes). A remote
``http(s)`` image is passed through unchanged when shown: the provider fetches it, never
the proxy. Only user messages carry blocks (OpenAI accepts media in user messages only);
rendered for Anthropic's Messages API, tool results too (``BLOCK_ROLES``).

Attachment notice: a user message that holds media parts, or whose metadata announced
attachments (``meta["attachments"]``), starts with one line listing them, in every
rendering, so the model knows what was attached even when the blocks became placeholders::

    [Attachments: report.pdf (application/pdf, 3 pages, 120 KB),
                  sha256:ab12cd34ef56 (image/png, 1024x768, 88 KB)]   (one line)

When nothing but plain text parts remains, the content is one string (the parts joined by
newlines), which every provider accepts for every role; parts carrying more than text
(``cache_control``) keep the list form.

Token accounting: a stored message's ``tokens`` is its size rendered with placeholders
(how it is sent in every later turn). For the current turn, ``current_turn_deltas`` gives
what the blocks add; the proxy budgets it before the strategy selects and
``settle_window`` moves it onto the window items, so the counts match what is sent.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from strategies import native
from strategies.media_info import (
    base64_size,
    decode_base64,
    human_size,
    parse_data_url,
    pdf_pages,
    wav_seconds,
)
from strategies.media_tokens import image_size
from strategies.records import StoredMessage
from strategies.tokens import count_message

if TYPE_CHECKING:
    from strategies.base import Window, WindowItem
    from strategies.mapper import MappingContext

# content part type -> the capability a model needs to read it
MEDIA_KINDS = {"image_url": "image", "file": "document", "input_audio": "audio"}
# the field of each part type that holds its payload
PAYLOAD_FIELDS = {"image_url": "url", "file": "file_data", "input_audio": "data"}
NOT_SHOWN = "not shown to the model"
UNAVAILABLE = "content unavailable"
SHOWN = "sent to the model"
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav",
                  "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def is_media(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in MEDIA_KINDS


def media_kind(part: Mapping[str, Any]) -> str:
    return MEDIA_KINDS[str(part.get("type"))]


def reference(part: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The stored-part reference of a part (``part["part"]`` with a digest), if it is one."""
    ref = part.get("part")
    return ref if isinstance(ref, Mapping) and ref.get("digest") else None


def has_media(message: StoredMessage) -> bool:
    """True when the message holds media parts or announced attachments."""
    if message.meta.get("parts") or message.meta.get("attachments"):
        return True
    content = message.content
    return isinstance(content, list) and any(is_media(p) for p in content)


def part_meta(part: Mapping[str, Any], *, decode: bool = False) -> dict[str, Any]:
    """What is known of a media part: its stored reference, else what the part itself says
    (a remote URL, a file id, inline data measured from its header; with ``decode``, the
    inline data's digest, PDF pages and WAV duration too)."""
    ref = reference(part)
    if ref is not None:
        return dict(ref)
    kind = str(part.get("type"))
    spec = part.get(kind)
    spec = spec if isinstance(spec, Mapping) else {}
    meta: dict[str, Any] = {"kind": MEDIA_KINDS[kind]}
    if kind == "file":
        if spec.get("filename"):
            meta["name"] = spec["filename"]
        if spec.get("file_id"):
            meta["file_id"] = spec["file_id"]
    if kind == "input_audio" and spec.get("format"):
        meta["format"] = spec["format"]
    payload = spec.get(PAYLOAD_FIELDS[kind])
    if not isinstance(payload, str):
        return meta
    data_url = parse_data_url(payload)
    if data_url is None and kind == "image_url":
        meta["url"] = payload
        return meta
    if data_url is not None:
        meta["media_type"] = data_url.media_type
        meta["size"] = data_url.decoded_size()
    else:
        meta["size"] = base64_size(payload)
        if kind == "input_audio":
            meta["media_type"] = "audio/mpeg" if meta.get("format") == "mp3" else "audio/wav"
    if kind == "image_url":
        size = image_size(part)
        if size:
            meta["width"], meta["height"] = size
    if decode:
        try:
            data = data_url.decode() if data_url is not None else decode_base64(payload)
        except ValueError:
            return meta
        meta["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
        pages = pdf_pages(data) if kind == "file" else None
        seconds = wav_seconds(data) if kind == "input_audio" else None
        if pages:
            meta["pages"] = pages
        if seconds:
            meta["seconds"] = seconds
    return meta


def short_digest(digest: str) -> str:
    algorithm, _, value = digest.rpartition(":")
    return f"{algorithm or 'sha256'}:{value[:12]}"


def _short_url(url: str) -> str:
    # query strings often hold signatures: name the resource, not its credentials
    parts = urlsplit(url)
    shown = f"{parts.scheme}://{parts.netloc}{parts.path}" if parts.netloc else url
    return shown if len(shown) <= 120 else shown[:117] + "..."


def _label(meta: Mapping[str, Any]) -> str:
    if meta.get("name"):
        return str(meta["name"])
    if meta.get("url"):
        return _short_url(str(meta["url"]))
    if meta.get("file_id"):
        return str(meta["file_id"])
    if meta.get("digest"):
        return short_digest(str(meta["digest"]))
    return "unnamed"


def _details(meta: Mapping[str, Any], *, digest: bool) -> list[str]:
    details: list[str] = []
    if meta.get("media_type"):
        details.append(str(meta["media_type"]))
    if meta.get("width") and meta.get("height"):
        details.append(f"{meta['width']}x{meta['height']}")
    if meta.get("pages"):
        details.append(f"{meta['pages']} page" + ("s" if meta["pages"] != 1 else ""))
    if meta.get("seconds"):
        details.append(f"{meta['seconds']:.1f} s")
    if isinstance(meta.get("size"), int):
        details.append(human_size(meta["size"]))
    if digest and meta.get("digest") and meta.get("name"):
        details.append(short_digest(str(meta["digest"])))
    return details


def describe(meta: Mapping[str, Any]) -> str:
    """``photo.png — image/png, 1024x768, 88 KB, sha256:ab12cd34ef56``"""
    details = _details(meta, digest=True)
    return _label(meta) + (" — " + ", ".join(details) if details else "")


def placeholder(part: Mapping[str, Any], reason: str = NOT_SHOWN) -> str:
    meta = part_meta(part)
    return f"[{meta['kind']}: {describe(meta)} — {reason}]"


def attachment_notice(message: StoredMessage) -> str | None:
    """The line listing a user message's attachments, or None when it announced none."""
    if message.role != "user":
        return None
    content = message.content
    metas = [part_meta(p) for p in content if is_media(p)] if isinstance(content, list) else []
    names = {m.get("name") for m in metas if m.get("name")}
    for announced in message.meta.get("attachments") or ():
        if isinstance(announced, Mapping) and announced.get("name") not in names:
            metas.append(dict(announced))
    if not metas:
        return None
    entries = []
    for meta in metas:
        details = _details(meta, digest=False)
        entries.append(_label(meta) + (f" ({', '.join(details)})" if details else ""))
    return "[Attachments: " + ", ".join(entries) + "]"


# the roles whose messages may carry media blocks, by the API rendered for (OpenAI's chat
# takes media in user messages only; Anthropic's tool results hold images and documents)
BLOCK_ROLES = {"messages": ("user", "tool")}


def shown_kinds(message: StoredMessage, context: MappingContext) -> frozenset[str]:
    """The media kinds this message may carry as blocks in ``context``."""
    if message.seq < context.current_turn_seq or message.role not in BLOCK_ROLES.get(
        context.api, ("user",)
    ):
        return frozenset()
    return context.capabilities


def render_parts(item: WindowItem, content: Any, context: MappingContext) -> list[Any] | str:
    """The content the model receives for ``item`` (``content`` is the stored content or
    the strategy's replacement text)."""
    message = item.message
    if keeps_media(item) and isinstance(content, str):
        content = truncated_with_media(content, message.content)
    return render_content(message, content, shown_kinds(message, context), context.parts)


def keeps_media(item: WindowItem) -> bool:
    """A message cut by the message cap (``truncated``) keeps its media parts: the cut
    shortens its text, and each part still goes as its block or its placeholder."""
    content = item.message.content
    return item.marker == "truncated" and isinstance(content, list) and any(
        is_media(part) for part in content
    )


def truncated_with_media(text: str, original: list[Any]) -> list[Any]:
    """The cut text as one text part, then the original's media parts. The cut was made
    of the content's text (strategies.compression.content_text), where each part is a
    ``[type]`` line: those lines go, the parts themselves come back."""
    parts = [part for part in original if is_media(part)]
    marks = {f"[{part.get('type') or 'part'}]" for part in parts}
    kept = "\n".join(line for line in text.split("\n") if line not in marks)
    return [{"type": "text", "text": kept}, *parts]


def render_content(
    message: StoredMessage,
    content: Any,
    kinds: frozenset[str],
    parts: Mapping[str, tuple[bytes, str]],
    *,
    measure: bool = False,
) -> Any:
    """Render ``content`` showing media of ``kinds`` as blocks. With ``measure``, a block
    stays a stored reference (its measured size counts, no base64 is built)."""
    notice = attachment_notice(message)
    if not isinstance(content, list):
        if notice is None:
            return content
        text = content if isinstance(content, str) else ""
        return notice + ("\n" + text if text else "")
    if notice is None and not any(is_media(p) for p in content):
        return content
    out: list[Any] = [{"type": "text", "text": notice}] if notice else []
    for part in content:
        if not is_media(part):
            out.append(part)
            continue
        reason = NOT_SHOWN
        if media_kind(part) in kinds:
            block = _block(part, parts, measure)
            if block is not None:
                out.append(block)
                continue
            reason = UNAVAILABLE
        out.append({"type": "text", "text": placeholder(part, reason)})
    if all(isinstance(p, Mapping) and p.keys() == {"type", "text"} and p["type"] == "text"
           for p in out):
        return "\n".join(str(p.get("text") or "") for p in out)
    return out


def _block(
    part: Mapping[str, Any], parts: Mapping[str, tuple[bytes, str]], measure: bool
) -> Mapping[str, Any] | None:
    ref = reference(part)
    if ref is None:
        # a part as the client sent it: a remote URL or file id goes as is (the provider
        # fetches it), inline data too
        return part
    loaded = parts.get(str(ref["digest"]))
    if loaded is None:
        return None
    if measure:
        return part
    return build_block(part, *loaded)


def build_block(part: Mapping[str, Any], data: bytes, media_type: str) -> dict[str, Any]:
    """The provider's content block for a stored part reference and its bytes."""
    kind = str(part["type"])
    ref = reference(part) or {}
    spec = dict(part.get(kind) or {})
    encoded = base64.b64encode(data).decode("ascii")
    if kind == "image_url":
        spec["url"] = f"data:{media_type};base64,{encoded}"
    elif kind == "file":
        spec["file_data"] = f"data:{media_type};base64,{encoded}"
        spec.setdefault("filename", ref.get("name") or _default_filename(ref, media_type))
    else:
        spec["data"] = encoded
        spec.setdefault("format", ref.get("format") or _AUDIO_FORMATS.get(media_type, "wav"))
    rest = {k: v for k, v in part.items() if k not in ("part", kind, "type")}
    return {"type": kind, kind: spec, **rest}


def _default_filename(ref: Mapping[str, Any], media_type: str) -> str:
    extension = {"application/pdf": ".pdf", "text/plain": ".txt"}.get(media_type, "")
    return short_digest(str(ref.get("digest", ""))).replace(":", "-") + extension


def _as_dict(message: StoredMessage, content: Any) -> dict[str, Any]:
    return {"role": message.role, "content": content, "name": message.name,
            "tool_calls": message.tool_calls}


def stored_tokens(message: StoredMessage, model: str) -> int:
    """Tokens of a message as sent outside its current turn: media as placeholder lines.
    Equals ``count_message`` for a message without media."""
    if not has_media(message) or message.role not in ("user", "assistant", "tool"):
        return count_message(message, model)
    rendered = render_content(message, message.content, frozenset(), {}, measure=True)
    return count_message(_as_dict(message, rendered), model)


def sent_tokens(message: StoredMessage, context: MappingContext, model: str) -> int:
    """Tokens of a message as the default mapper renders it in ``context``."""
    kinds = shown_kinds(message, context)
    if not kinds or not has_media(message):
        return message.tokens
    rendered = render_content(message, message.content, kinds, context.parts, measure=True)
    return count_message(_as_dict(message, rendered), model)


def block_digests(messages: Iterable[StoredMessage], context: MappingContext) -> list[str]:
    """Digests of the stored parts that travel as blocks in ``context`` (to load first)."""
    digests: list[str] = []
    for message in messages:
        kinds = shown_kinds(message, context)
        if not kinds or not isinstance(message.content, list):
            continue
        for part in message.content:
            ref = reference(part) if is_media(part) else None
            if ref is not None and media_kind(part) in kinds and ref["digest"] not in digests:
                digests.append(str(ref["digest"]))
    return digests


def current_turn_deltas(
    messages: Sequence[StoredMessage], context: MappingContext, model: str
) -> dict[int, int]:
    """seq -> tokens the blocks of a current-turn message add to its stored size."""
    deltas: dict[int, int] = {}
    for message in messages:
        if shown_kinds(message, context) and has_media(message):
            delta = sent_tokens(message, context, model) - message.tokens
            if delta:
                deltas[message.seq] = delta
    return deltas


def settle_window(window: Window, deltas: Mapping[int, int]) -> None:
    """Move the current turn's block tokens (budgeted up front) onto the items that send
    their blocks: in full, or cut by the message cap (``keeps_media``); a delta whose
    message was compressed or left out is taken back from the total."""
    if not deltas:
        return
    applied = 0
    for item in window.items:
        delta = deltas.get(item.message.seq)
        if delta and (item.text is None or keeps_media(item)):
            item.tokens += delta
            applied += delta
    window.tokens += applied - sum(deltas.values())


def part_views(message: StoredMessage, context: MappingContext) -> list[dict[str, Any]]:
    """Each media part of a message as the working-memory view lists it: what is known of
    it, its one-line name, and whether it travels as a block."""
    content = message.content if isinstance(message.content, list) else []
    kinds = shown_kinds(message, context)
    views = []
    for part in content:
        if not is_media(part):
            continue
        meta = part_meta(part)
        ref = reference(part)
        block = media_kind(part) in kinds and (ref is None or str(ref["digest"]) in context.parts)
        views.append({**meta, "line": f"[{meta['kind']}: {describe(meta)}]",
                      "sent_as": "block" if block else "placeholder"})
    return views


def describe_sent_part(part: Mapping[str, Any]) -> str:
    """One line naming a content part as it was sent (the working-memory view)."""
    if native.is_native(part):
        return native.describe(part)
    if not is_media(part):
        return f"[{part.get('type', 'part')}]"
    meta = part_meta(part, decode=True)
    return f"[{meta['kind']}: {describe(meta)} — {SHOWN}]"
