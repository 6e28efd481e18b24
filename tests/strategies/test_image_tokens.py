"""Media token counts follow the provider's rules, from headers; base64 is never text."""

from __future__ import annotations

import pytest
from media_samples import b64, data_url, gif, jpeg, pdf, png, wav, webp_vp8, webp_vp8l, webp_vp8x

from strategies import media_info
from strategies.media_tokens import (
    DOCUMENT_PAGE_TOKENS,
    FILE_PART_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    UNKNOWN_IMAGE_TOKENS,
    anthropic_image_tokens,
    image_size,
    openai_image_tokens,
)
from strategies.tokens import count_message, count_part, count_text


def image_part(data: bytes, media_type: str = "image/png", detail: str | None = None) -> dict:
    spec = {"url": data_url(media_type, data)}
    if detail:
        spec["detail"] = detail
    return {"type": "image_url", "image_url": spec}


@pytest.mark.parametrize(
    ("width", "height", "detail", "tokens"),
    [
        # OpenAI's worked examples: 1024x1024 -> 768x768, 4 tiles; 2048x4096 -> 768x1536, 6
        pytest.param(1024, 1024, "high", 765, id="square-1024"),
        pytest.param(2048, 4096, "high", 1105, id="tall-2048x4096"),
        pytest.param(4096, 8192, "auto", 1105, id="fit-into-2048-first"),
        pytest.param(100, 100, "high", 255, id="small-one-tile"),
        pytest.param(512, 512, "auto", 255, id="exactly-one-tile"),
        pytest.param(513, 512, "auto", 425, id="one-pixel-over-a-tile"),
        pytest.param(800, 600, "original", 765, id="original-counts-like-high"),
        pytest.param(4000, 3000, "low", 85, id="low-detail-is-flat"),
    ],
)
def test_openai_images_cost_their_tiles(width, height, detail, tokens):
    assert openai_image_tokens(width, height, detail) == tokens


def test_anthropic_images_cost_their_area_over_750():
    assert anthropic_image_tokens(1000, 1000) == 1334
    assert anthropic_image_tokens(200, 200) == 54
    # the long edge is scaled to 1568 first, and the cost stays under the cap
    assert anthropic_image_tokens(4000, 4000) == 1600


@pytest.mark.parametrize(
    ("data", "media_type", "size"),
    [
        pytest.param(png(640, 480), "image/png", (640, 480), id="png"),
        pytest.param(jpeg(1024, 768), "image/jpeg", (1024, 768), id="jpeg"),
        pytest.param(jpeg(300, 200, exif_bytes=150_000), "image/jpeg", (300, 200),
                     id="jpeg-behind-large-exif"),
        pytest.param(gif(33, 17), "image/gif", (33, 17), id="gif"),
        pytest.param(webp_vp8(800, 400), "image/webp", (800, 400), id="webp-lossy"),
        pytest.param(webp_vp8l(123, 456), "image/webp", (123, 456), id="webp-lossless"),
        pytest.param(webp_vp8x(5000, 20), "image/webp", (5000, 20), id="webp-extended"),
    ],
)
def test_image_size_is_read_from_the_header(data, media_type, size):
    info = media_info.sniff_image(data)
    assert info is not None and (info.media_type, info.width, info.height) == (media_type, *size)
    assert image_size(image_part(data, media_type)) == size


def test_a_truncated_or_foreign_header_has_no_size():
    assert media_info.sniff_image(png(10, 10)[:20]) is None
    assert media_info.sniff_image(jpeg(10, 10)[:12]) is None
    assert media_info.sniff_image(b"%PDF-1.4") is None


def test_a_large_image_costs_its_tiles_not_its_base64_length():
    # a 2048x4096 PNG with a megabyte of trailing data: the tile count decides
    data = png(2048, 4096) + b"\x00" * 1_000_000
    part = image_part(data, detail="high")
    message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}

    tokens = count_message(message, "gpt-4o")

    assert tokens == 3 + 1 + count_text("what is this?", "gpt-4o") + 1105
    assert len(part["image_url"]["url"]) > 1_300_000


def test_low_detail_images_cost_85_whatever_their_size():
    part = image_part(png(4096, 4096), detail="low")
    assert count_part(part, "gpt-4o") == LOW_DETAIL_IMAGE_TOKENS


def test_a_remote_image_costs_the_unknown_size_estimate_and_is_not_fetched():
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert count_part(part, "gpt-4o") == UNKNOWN_IMAGE_TOKENS


def test_claude_models_count_images_by_area():
    part = image_part(png(1000, 1000))
    assert count_part(part, "anthropic/claude-3-5-sonnet-latest") == 1334
    assert count_part(part, "gpt-4o") == 765


def test_a_stored_reference_is_counted_from_its_measurements():
    ref = {"type": "image_url", "image_url": {},
           "part": {"kind": "image", "digest": "sha256:ab", "width": 2048, "height": 4096}}
    assert count_part(ref, "gpt-4o") == 1105
    low = {**ref, "part": {**ref["part"], "detail": "low"}}
    assert count_part(low, "gpt-4o") == 85


def test_documents_cost_per_pdf_page():
    part = {"type": "file", "file": {"filename": "r.pdf",
                                     "file_data": data_url("application/pdf", pdf(3))}}
    assert count_part(part, "gpt-4o") == 3 * DOCUMENT_PAGE_TOKENS
    ref = {"type": "file", "file": {}, "part": {"kind": "document", "digest": "sha256:x",
                                                "pages": 7, "size": 10}}
    assert count_part(ref, "gpt-4o") == 7 * DOCUMENT_PAGE_TOKENS


def test_documents_without_pages_are_estimated_by_size():
    text_file = {"type": "file", "file": {"file_data": data_url("text/plain", b"x" * 4000)}}
    assert count_part(text_file, "gpt-4o") == 1000
    by_id = {"type": "file", "file": {"file_id": "file-abc"}}
    assert count_part(by_id, "gpt-4o") == FILE_PART_TOKENS


def test_pdf_pages_fall_back_to_the_page_tree_count():
    assert media_info.pdf_pages(pdf(4)) == 4
    compressed_objects = b"%PDF-1.5\n1 0 obj << /Type /Pages /Kids [] /Count 12 >> endobj"
    assert media_info.pdf_pages(compressed_objects) == 12
    assert media_info.pdf_pages(b"not a pdf") is None


def test_audio_costs_by_its_duration():
    part = {"type": "input_audio", "input_audio": {"data": b64(wav(2.5)), "format": "wav"}}
    assert media_info.wav_seconds(wav(2.5)) == 2.5
    assert count_part(part, "gpt-4o") == 25


def test_audio_without_a_wav_header_costs_by_size():
    mp3ish = b"ID3" + b"\x00" * 31_997  # 32,000 bytes: two seconds at 128 kbit/s
    part = {"type": "input_audio", "input_audio": {"data": b64(mp3ish), "format": "mp3"}}
    assert count_part(part, "gpt-4o") == 20
