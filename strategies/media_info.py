"""What a media part's bytes say about themselves, read from headers only (pure, no decoding).

Image dimensions come from the PNG, JPEG, GIF and WebP headers without decoding a pixel;
a PDF's page count from its ``/Type /Page`` objects (else the ``/Count`` of its page
tree); a WAV clip's duration from its ``fmt `` and ``data`` chunks. Every reader returns
None when the bytes do not say (truncated, another format, an encrypted or compressed
object layout): callers fall back to a size-based estimate.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import struct
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

# base64 characters decoded to find an image's header: covers PNG/GIF/WebP and most JPEGs
# (a JPEG's frame header may sit after large EXIF or ICC segments: then all is decoded)
HEADER_PREFIX_CHARS = 64 * 1024

_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PAGE_COUNT = re.compile(
    rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)|/Count\s+(\d+)[^>]*?/Type\s*/Pages\b"
)
# JPEG start-of-frame markers carry the dimensions (C4 DHT, C8 JPG, CC DAC do not)
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD,
                          0xCE, 0xCF})


@dataclass(frozen=True, slots=True)
class ImageInfo:
    media_type: str
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class DataUrl:
    """A parsed ``data:`` URL: its declared media type and its payload, still encoded."""

    media_type: str
    payload: str
    is_base64: bool

    def decode(self) -> bytes:
        """The payload's bytes; raises ``ValueError`` when it is not valid base64."""
        if not self.is_base64:
            return unquote_to_bytes(self.payload)
        return decode_base64(self.payload)

    def decoded_size(self) -> int:
        """The payload's size in bytes, computed from its length (nothing decoded)."""
        if not self.is_base64:
            return len(unquote_to_bytes(self.payload))
        return base64_size(self.payload)

    def head(self, chars: int = HEADER_PREFIX_CHARS) -> bytes:
        """The first bytes of the payload, decoding at most ``chars`` characters."""
        if not self.is_base64 or len(self.payload) <= chars:
            return self.decode()
        try:
            return base64.b64decode(self.payload[: chars - chars % 4])
        except (binascii.Error, ValueError):
            return self.decode()


def parse_data_url(url: str) -> DataUrl | None:
    """``data:[<media type>][;base64],<payload>`` -> DataUrl; None for any other URL."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url[5:].partition(",")
    if not sep:
        return None
    params = header.split(";")
    media_type = params[0].strip().lower() or "text/plain"
    is_base64 = any(p.strip().lower() == "base64" for p in params[1:])
    return DataUrl(media_type, payload, is_base64)


def decode_base64(text: str) -> bytes:
    """Standard or URL-safe base64, whitespace and missing padding tolerated."""
    urlsafe = "-" in text or "_" in text
    if not urlsafe:
        # the common case, decoded without copying the text first
        with contextlib.suppress(binascii.Error):
            return base64.b64decode(text, validate=True)
    compact = "".join(text.split())
    compact += "=" * (-len(compact) % 4)
    try:
        if urlsafe:
            return base64.urlsafe_b64decode(compact)
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"invalid base64 data: {exc}") from None


def base64_size(text: str) -> int:
    """Decoded size of a base64 string, from its length and padding."""
    stripped = text.strip()
    length = len(stripped)
    return max(0, length * 3 // 4 - stripped[-2:].count("="))


def sniff_image(data: bytes) -> ImageInfo | None:
    """Media type and pixel size of a PNG, JPEG, GIF or WebP image, from its header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return ImageInfo("image/png", width, height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return ImageInfo("image/gif", width, height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg(data)
    return None


def _webp(data: bytes) -> ImageInfo | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return ImageInfo("image/webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        b0, b1, b2, b3 = data[21:25]
        width = 1 + (b0 | (b1 & 0x3F) << 8)
        height = 1 + (b1 >> 6 | b2 << 2 | (b3 & 0x0F) << 10)
        return ImageInfo("image/webp", width, height)
    if chunk == b"VP8X" and len(data) >= 30:
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return ImageInfo("image/webp", width, height)
    return None


def _jpeg(data: bytes) -> ImageInfo | None:
    index = 2
    size = len(data)
    while index + 4 <= size:
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte before a marker
            index += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # standalone markers carry no length
            index += 2
            continue
        (length,) = struct.unpack(">H", data[index + 2 : index + 4])
        if marker in _SOF_MARKERS:
            if index + 9 > size:
                return None
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return ImageInfo("image/jpeg", width, height)
        if marker == 0xDA:  # start of scan: no frame header before the image data
            return None
        index += 2 + length
    return None


def pdf_pages(data: bytes) -> int | None:
    """Pages of a PDF: its page objects, else its page tree's ``/Count``; None if unknown."""
    if not data.startswith(b"%PDF"):
        return None
    pages = len(_PAGE.findall(data))
    if pages:
        return pages
    counts = [int(a or b) for a, b in _PAGE_COUNT.findall(data)]
    return max(counts) if counts else None


def wav_seconds(data: bytes) -> float | None:
    """Duration of a RIFF/WAVE clip from its header chunks (the data chunk's declared size)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    index, byte_rate = 12, 0
    while index + 8 <= len(data):
        chunk = data[index : index + 4]
        (length,) = struct.unpack("<I", data[index + 4 : index + 8])
        if chunk == b"fmt " and index + 20 <= len(data):
            (byte_rate,) = struct.unpack("<I", data[index + 16 : index + 20])
        elif chunk == b"data":
            return round(length / byte_rate, 3) if byte_rate else None
        index += 8 + length + (length & 1)
    return None


def sniff_media_type(data: bytes) -> str | None:
    """The media type the first bytes announce, for the formats the proxy measures."""
    if data[:2] == b"\xff\xd8":
        return "image/jpeg"
    image = sniff_image(data)
    if image is not None:
        return image.media_type
    if data[:5] == b"%PDF-":
        return "application/pdf"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[:3] == b"ID3" or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    return None


def human_size(size: int) -> str:
    """``88 KB``, ``1.4 MB``: 1024-based, as file managers show it."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"
