"""Persist-time extraction: media parts leave the message record for the part store."""

from __future__ import annotations

import hashlib

import pytest
from media_samples import b64, data_url, jpeg, pdf, png, wav

from proxy.errors import BadRequest
from proxy.turn.parts import PartBlob, announced_attachments, extract_parts
from proxy.turn.sync import new_record
from strategies import media
from strategies.tokens import count_message

PNG = png(640, 480)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_an_inline_image_becomes_a_reference_and_its_bytes_a_blob():
    part = {"type": "image_url", "image_url": {"url": data_url("image/png", PNG), "detail": "high"},
            "prompt_cache_breakpoint": {"mode": "explicit"}}
    blobs: dict[str, PartBlob] = {}

    content, meta = extract_parts({"role": "user", "content": [{"type": "text", "text": "hi"},
                                                               part]}, blobs)

    expected = {"kind": "image", "digest": sha(PNG), "media_type": "image/png",
                "size": len(PNG), "width": 640, "height": 480, "detail": "high"}
    assert content == [{"type": "text", "text": "hi"},
                       {"type": "image_url", "image_url": {"detail": "high"},
                        "prompt_cache_breakpoint": {"mode": "explicit"}, "part": expected}]
    assert meta == {"parts": [expected]}
    assert blobs == {sha(PNG): PartBlob(sha(PNG), PNG, "image/png")}


def test_the_bytes_decide_an_images_media_type_over_the_declared_one():
    photo = jpeg(300, 200)
    content, _ = extract_parts({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url("image/png", photo)}}]}, {})
    assert content[0]["part"]["media_type"] == "image/jpeg"
    assert (content[0]["part"]["width"], content[0]["part"]["height"]) == (300, 200)


def test_the_same_image_twice_is_one_blob():
    part = {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}}
    blobs: dict[str, PartBlob] = {}
    extract_parts({"role": "user", "content": [part, part]}, blobs)
    extract_parts({"role": "user", "content": [part]}, blobs)
    assert list(blobs) == [sha(PNG)]


@pytest.mark.parametrize(
    ("part", "meta"),
    [
        pytest.param({"type": "image_url", "image_url": {"url": "https://x.example/a.png"}},
                     {"kind": "image", "url": "https://x.example/a.png"}, id="remote-image"),
        pytest.param({"type": "file", "file": {"file_id": "file-123", "filename": "a.pdf"}},
                     {"kind": "document", "name": "a.pdf", "file_id": "file-123"}, id="file-id"),
    ],
)
def test_references_the_provider_resolves_stay_as_sent(part, meta):
    blobs: dict[str, PartBlob] = {}
    content, found = extract_parts({"role": "user", "content": [part]}, blobs)
    assert content == [part]
    assert found == {"parts": [meta]}
    assert blobs == {}


def test_a_document_in_raw_base64_is_measured_from_its_bytes():
    document = pdf(3)
    content, _ = extract_parts({"role": "user", "content": [
        {"type": "file", "file": {"filename": "r.pdf", "file_data": b64(document)}}]}, {})
    assert content[0] == {"type": "file", "file": {"filename": "r.pdf"}, "part": {
        "kind": "document", "digest": sha(document), "media_type": "application/pdf",
        "size": len(document), "name": "r.pdf", "pages": 3}}


def test_audio_is_measured_by_its_wav_header():
    clip = wav(1.25)
    content, _ = extract_parts({"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": b64(clip), "format": "wav"}}]}, {})
    assert content[0]["input_audio"] == {"format": "wav"}
    assert content[0]["part"]["seconds"] == 1.25
    assert content[0]["part"]["media_type"] == "audio/wav"


def test_a_message_without_media_is_left_alone():
    message = {"role": "user", "content": [{"type": "text", "text": "plain"}]}
    content, meta = extract_parts(message, {})
    assert content is message["content"]
    assert meta == {}


def test_invalid_base64_is_a_bad_request():
    with pytest.raises(BadRequest, match=r"content part 1 \(file\)"):
        extract_parts({"role": "user", "content": [
            {"type": "text", "text": "x"},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,!!!"}}]}, {})


def test_announced_attachments_are_normalized():
    assert announced_attachments([
        "notes.txt", {"filename": "q3.xlsx", "mime_type": "application/vnd.ms-excel", "size": 9},
        {"size": 3}, 42,
    ]) == [{"name": "notes.txt"},
           {"name": "q3.xlsx", "media_type": "application/vnd.ms-excel", "size": 9}]
    assert announced_attachments("not a list") == []


def test_a_new_record_costs_its_placeholder_rendering_not_its_base64():
    message = {"role": "user", "attachments": ["brief.docx"], "content": [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", png(4000, 3000))}}]}
    blobs: dict[str, PartBlob] = {}

    record = new_record(message, "fp", "gpt-4o", 0.0, blobs)

    assert record.meta["attachments"] == [{"name": "brief.docx"}]
    assert len(blobs) == 1
    rendered = media.render_content(record, record.content, frozenset(), {})
    assert rendered.startswith("[Attachments: ")
    assert "brief.docx" in rendered
    assert record.tokens == count_message({"role": "user", "content": rendered}, "gpt-4o")
    assert record.tokens < 100
