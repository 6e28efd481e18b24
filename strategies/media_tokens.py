"""Token costs of media parts, by the provider's rules (pure; see ``strategies/tokens.py``).

Images are measured from their own header (``strategies/media_info.py``), never decoded;
documents by PDF page count, else by size; audio by duration, else by size. A stored part
reference (``{"type": ..., "part": {...}}``) carries what was measured at persist time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from strategies.media_info import (
    HEADER_PREFIX_CHARS,
    base64_size,
    decode_base64,
    parse_data_url,
    pdf_pages,
    sniff_image,
    wav_seconds,
)

# OpenAI's image accounting: a base cost plus one per 512px tile (low detail: base only)
IMAGE_BASE_TOKENS = 85
IMAGE_TILE_TOKENS = 170
LOW_DETAIL_IMAGE_TOKENS = IMAGE_BASE_TOKENS
# an image whose size cannot be read costs as a 1024x1024 one at high detail
UNKNOWN_IMAGE_TOKENS = 765
# Anthropic: width * height / 750, the long edge first scaled down to 1568, at most ~1600
ANTHROPIC_PIXELS_PER_TOKEN = 750
ANTHROPIC_MAX_EDGE = 1568
ANTHROPIC_MAX_IMAGE_TOKENS = 1600
# a PDF page travels as its text and an image of the page
DOCUMENT_PAGE_TOKENS = 1_500
DOCUMENT_BYTES_PER_PAGE = 100_000
TEXT_BYTES_PER_TOKEN = 4
# a document known only by a file id (nothing to measure) counts as one page
FILE_PART_TOKENS = DOCUMENT_PAGE_TOKENS
AUDIO_TOKENS_PER_SECOND = 10
# audio without a readable WAV header: 128 kbit/s
AUDIO_BYTES_PER_SECOND = 16_000


def openai_image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """OpenAI's tile formula: fit in 2048x2048, shortest side down to 768, then 170 per
    512px tile plus 85. Detail ``low`` is 85 whatever the size."""
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    if width <= 0 or height <= 0:
        return UNKNOWN_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return IMAGE_TILE_TOKENS * tiles + IMAGE_BASE_TOKENS


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's rule: width * height / 750 after the long edge is scaled to 1568."""
    if width <= 0 or height <= 0:
        return UNKNOWN_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > ANTHROPIC_MAX_EDGE:
        scale = ANTHROPIC_MAX_EDGE / max(w, h)
        w, h = w * scale, h * scale
    return min(ANTHROPIC_MAX_IMAGE_TOKENS, max(1, math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN)))


def _is_anthropic(model: str) -> bool:
    name = (model or "").lower()
    return name.startswith(("anthropic/", "bedrock/anthropic", "vertex_ai/claude")) or (
        "claude" in name
    )


def _reference(part: Mapping[str, Any]) -> Mapping[str, Any]:
    """The measured metadata of a stored part reference (empty for a part as sent)."""
    meta = part.get("part")
    return meta if isinstance(meta, Mapping) else {}


def image_size(part: Mapping[str, Any]) -> tuple[int, int] | None:
    """Pixel size of an image part: from its stored reference, else from the header of its
    data URL (a prefix is decoded, never the whole image unless a JPEG needs it)."""
    meta = _reference(part)
    width, height = meta.get("width"), meta.get("height")
    if isinstance(width, int) and isinstance(height, int):
        return width, height
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    data_url = parse_data_url(url) if isinstance(url, str) else None
    if data_url is None:
        return None
    try:
        info = sniff_image(data_url.head())
        # a JPEG's frame header may sit after large EXIF or ICC segments
        head_is_jpeg = data_url.payload[:4] == "/9j/"
        if info is None and head_is_jpeg and len(data_url.payload) > HEADER_PREFIX_CHARS:
            info = sniff_image(data_url.decode())
    except ValueError:
        return None
    return (info.width, info.height) if info else None


def image_tokens(part: Mapping[str, Any], model: str = "") -> int:
    """Tokens of an image part by the provider's rules (see the module docstring)."""
    meta = _reference(part)
    spec = part.get("image_url")
    detail = meta.get("detail") or (spec.get("detail") if isinstance(spec, Mapping) else None)
    size = image_size(part)
    if _is_anthropic(model):
        return anthropic_image_tokens(*size) if size else UNKNOWN_IMAGE_TOKENS
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    return openai_image_tokens(*size, str(detail or "auto")) if size else UNKNOWN_IMAGE_TOKENS


def document_tokens(part: Mapping[str, Any]) -> int:
    """Tokens of a file part: per page of a PDF, else estimated from its size."""
    meta = _reference(part)
    if meta:
        pages, size, media_type = meta.get("pages"), meta.get("size"), meta.get("media_type")
    else:
        spec = part.get("file")
        spec = spec if isinstance(spec, Mapping) else {}
        data = spec.get("file_data")
        if not isinstance(data, str) or not data:
            return FILE_PART_TOKENS
        data_url = parse_data_url(data)
        try:
            raw = data_url.decode() if data_url else decode_base64(data)
        except ValueError:
            return FILE_PART_TOKENS
        pages, size = pdf_pages(raw), len(raw)
        media_type = data_url.media_type if data_url else None
    return estimate_document_tokens(pages, size, media_type)


def estimate_document_tokens(pages: Any, size: Any, media_type: Any) -> int:
    """Tokens of a document from what was measured of it."""
    if isinstance(pages, int) and pages > 0:
        return pages * DOCUMENT_PAGE_TOKENS
    if not isinstance(size, int) or size <= 0:
        return FILE_PART_TOKENS
    if isinstance(media_type, str) and (
        media_type.startswith("text/") or media_type in ("application/json", "application/xml")
    ):
        return max(1, math.ceil(size / TEXT_BYTES_PER_TOKEN))
    return math.ceil(size / DOCUMENT_BYTES_PER_PAGE) * DOCUMENT_PAGE_TOKENS


def audio_tokens(part: Mapping[str, Any]) -> int:
    """Tokens of an audio part: by duration (WAV header), else by size."""
    meta = _reference(part)
    if meta:
        seconds, size = meta.get("seconds"), meta.get("size")
    else:
        spec = part.get("input_audio")
        data = spec.get("data") if isinstance(spec, Mapping) else None
        if not isinstance(data, str) or not data:
            return 0
        try:
            seconds = wav_seconds(decode_base64(data[:4096]))
        except ValueError:
            seconds = None
        size = base64_size(data)
    return estimate_audio_tokens(seconds, size)


def estimate_audio_tokens(seconds: Any, size: Any) -> int:
    """Tokens of an audio clip from its duration, else from its size."""
    if not isinstance(seconds, int | float) or seconds <= 0:
        seconds = (size / AUDIO_BYTES_PER_SECOND) if isinstance(size, int) and size > 0 else 0
    return max(1, math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)) if seconds else 0
