"""The mapper's media path: blocks for the current turn of a capable model, placeholder
lines otherwise; the attachment notice; token counts of what is sent."""

from __future__ import annotations

import base64
import hashlib

import pytest
from media_samples import pdf, png, wav

from strategies import media
from strategies.base import Window, WindowItem
from strategies.mapper import MappingContext, MessageToLlmMessageMapper
from strategies.media_tokens import DOCUMENT_PAGE_TOKENS
from strategies.records import StoredMessage
from strategies.tokens import count_message

PNG = png(1024, 768)
PDF = pdf(3)
WAV = wav(2.0)
CURRENT_SEQ = 10


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_ref(data: bytes = PNG, **extra) -> dict:
    meta = {"kind": "image", "digest": digest(data), "media_type": "image/png",
            "size": len(data), "width": 1024, "height": 768, **extra}
    return {"type": "image_url", "image_url": {}, "part": meta}


def document_ref(data: bytes = PDF, name: str = "report.pdf") -> dict:
    meta = {"kind": "document", "digest": digest(data), "media_type": "application/pdf",
            "size": len(data), "pages": 3, "name": name}
    return {"type": "file", "file": {"filename": name}, "part": meta}


def audio_ref(data: bytes = WAV) -> dict:
    meta = {"kind": "audio", "digest": digest(data), "media_type": "audio/wav",
            "size": len(data), "seconds": 2.0, "format": "wav"}
    return {"type": "input_audio", "input_audio": {"format": "wav"}, "part": meta}


REFS = {"image": (image_ref, PNG, "image/png"), "document": (document_ref, PDF, "application/pdf"),
        "audio": (audio_ref, WAV, "audio/wav")}


def user(parts: list, seq: int, **meta) -> StoredMessage:
    message = StoredMessage(role="user", content=[{"type": "text", "text": "look"}, *parts],
                            seq=seq, meta=meta)
    message.tokens = media.stored_tokens(message, "gpt-4o")
    return message


def context(capabilities=(), parts=None) -> MappingContext:
    return MappingContext(model="gpt-4o", capabilities=frozenset(capabilities),
                          current_turn_seq=CURRENT_SEQ, parts=parts or {})


def render(message: StoredMessage, ctx: MappingContext) -> dict:
    window = Window(items=[WindowItem(message=message, tokens=message.tokens)])
    (sent,) = MessageToLlmMessageMapper().map(window, None, ctx)
    return sent


def everything_loaded() -> dict:
    return {digest(data): (data, mt) for _, data, mt in REFS.values()}


@pytest.mark.parametrize("kind", ["image", "document", "audio"])
@pytest.mark.parametrize(
    ("capable", "current", "as_block"),
    [
        pytest.param(True, True, True, id="reads-it-current-turn"),
        pytest.param(True, False, False, id="reads-it-older-turn"),
        pytest.param(False, True, False, id="cannot-read-it-current-turn"),
        pytest.param(False, False, False, id="cannot-read-it-older-turn"),
    ],
)
def test_a_part_is_a_block_only_in_the_current_turn_of_a_model_that_reads_it(
    kind, capable, current, as_block
):
    make, data, media_type = REFS[kind]
    message = user([make()], seq=CURRENT_SEQ if current else 3)
    ctx = context([kind] if capable else [], everything_loaded())

    content = render(message, ctx)["content"]

    if as_block:
        assert isinstance(content, list)
        block = content[-1]
        encoded = base64.b64encode(data).decode()
        if kind == "image":
            assert block == {"type": "image_url",
                             "image_url": {"url": f"data:{media_type};base64,{encoded}"}}
        elif kind == "document":
            assert block == {"type": "file", "file": {
                "filename": "report.pdf", "file_data": f"data:{media_type};base64,{encoded}"}}
        else:
            assert block == {"type": "input_audio",
                             "input_audio": {"format": "wav", "data": encoded}}
    else:
        assert isinstance(content, str)
        placeholder = content.splitlines()[-1]
        assert placeholder.startswith(f"[{kind}: ") and placeholder.endswith(
            "— not shown to the model]")
        assert digest(data)[:19] in placeholder  # sha256: + 12 hex digits
        assert "base64" not in content


def test_the_placeholder_names_kind_name_type_size_and_hash():
    message = user([image_ref(), document_ref()], seq=3)
    lines = render(message, context(["image", "document"]))["content"].splitlines()

    assert len(PNG) < 1024 and len(PDF) < 1024  # sizes below a KB are shown in bytes
    assert lines[-2] == (f"[image: {digest(PNG)[:19]} — image/png, 1024x768, {len(PNG)} B"
                         " — not shown to the model]")
    assert lines[-1] == (f"[document: report.pdf — application/pdf, 3 pages, {len(PDF)} B, "
                         f"{digest(PDF)[:19]} — not shown to the model]")


def test_the_attachment_notice_comes_first_in_every_rendering():
    notice = (f"[Attachments: report.pdf (application/pdf, 3 pages, {len(PDF)} B), "
              f"{digest(PNG)[:19]} (image/png, 1024x768, {len(PNG)} B)]")
    current = user([document_ref(), image_ref()], seq=CURRENT_SEQ)
    older = user([document_ref(), image_ref()], seq=3)
    ctx = context(["image", "document"], everything_loaded())

    shown = render(current, ctx)["content"]
    placeholders = render(older, ctx)["content"]

    assert shown[0] == {"type": "text", "text": notice}
    assert shown[1] == {"type": "text", "text": "look"}
    assert [p["type"] for p in shown[2:]] == ["file", "image_url"]
    assert placeholders.splitlines()[:2] == [notice, "look"]


def test_announced_attachments_are_named_even_without_parts():
    message = StoredMessage(role="user", content="see the attached files", seq=3, meta={
        "attachments": [{"name": "q3.xlsx", "media_type": "application/vnd.ms-excel",
                         "size": 120 * 1024}, {"name": "notes.txt"}]})

    assert render(message, context())["content"] == (
        "[Attachments: q3.xlsx (application/vnd.ms-excel, 120 KB), notes.txt]\n"
        "see the attached files")


def test_a_strategy_replacement_text_still_gets_the_notice():
    message = user([image_ref()], seq=3)
    window = Window(items=[WindowItem(message, tokens=5, text="cut short", marker="truncated")])
    (sent,) = MessageToLlmMessageMapper().map(window, None, context())
    assert sent["content"].startswith("[Attachments: ")
    # the cut shortens the text; the image is still named, by its placeholder
    lines = sent["content"].splitlines()
    assert lines[1] == "cut short"
    assert lines[2].startswith("[image: ") and lines[2].endswith("not shown to the model]")


def test_a_current_message_cut_by_the_cap_keeps_its_block():
    message = user([{"type": "text", "text": "long text"}, image_ref()], seq=CURRENT_SEQ)
    text = "long\n[image_url]\n[… truncated by memory-proxy: 1 of 2 tokens shown]"
    window = Window(items=[WindowItem(message, tokens=5, text=text, marker="truncated")])
    (sent,) = MessageToLlmMessageMapper().map(window, None,
                                             context(["image"], everything_loaded()))
    texts = [p["text"] for p in sent["content"] if p["type"] == "text"]
    assert "long\n[… truncated by memory-proxy: 1 of 2 tokens shown]" in texts
    assert [p["type"] for p in sent["content"]][-1] == "image_url"
    assert sent["content"][-1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_only_user_messages_carry_blocks():
    tool = StoredMessage(role="tool", tool_call_id="c1", seq=CURRENT_SEQ + 1,
                         content=[{"type": "text", "text": "chart:"}, image_ref()])
    sent = render(tool, context(["image"], everything_loaded()))
    assert sent["content"].startswith("chart:\n[image: ")
    assert sent["tool_call_id"] == "c1"


def test_a_part_whose_bytes_are_gone_is_named_as_unavailable():
    message = user([image_ref()], seq=CURRENT_SEQ)
    content = render(message, context(["image"], parts={}))["content"]
    assert content.splitlines()[-1].endswith("— content unavailable]")


def test_a_remote_image_passes_through_in_the_current_turn_and_is_a_placeholder_later():
    remote = {"type": "image_url", "image_url": {"url": "https://cdn.example.com/cat.png?sig=s3cr3t",
                                                 "detail": "low"}}
    current = user([remote], seq=CURRENT_SEQ)
    older = user([remote], seq=3)

    assert render(current, context(["image"]))["content"][-1] == remote
    line = render(older, context(["image"]))["content"].splitlines()[-1]
    assert line == "[image: https://cdn.example.com/cat.png — not shown to the model]"


def test_text_only_content_lists_are_left_as_they_are():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {}}]
    message = StoredMessage(role="user", content=parts, seq=3)
    assert render(message, context(["image"]))["content"] == parts


def test_the_stored_size_is_the_placeholder_rendering():
    message = user([image_ref(), document_ref()], seq=3)
    sent = render(message, context(["image", "document"]))
    assert message.tokens == count_message(sent, "gpt-4o")


def test_current_turn_blocks_add_their_cost_and_settle_on_the_items():
    older = user([image_ref()], seq=3)
    current = user([image_ref(), document_ref()], seq=CURRENT_SEQ)
    ctx = context(["image", "document"], everything_loaded())

    deltas = media.current_turn_deltas([older, current], ctx, "gpt-4o")
    sent = render(current, ctx)

    assert set(deltas) == {CURRENT_SEQ}
    assert current.tokens + deltas[CURRENT_SEQ] == count_message(sent, "gpt-4o")
    # the blocks cost their tiles and pages, not their base64
    assert count_message(sent, "gpt-4o") < current.tokens + 765 + 3 * DOCUMENT_PAGE_TOKENS

    window = Window(items=[WindowItem(older, older.tokens), WindowItem(current, current.tokens)],
                    tokens=1000 + deltas[CURRENT_SEQ])
    media.settle_window(window, deltas)
    assert window.items[1].tokens == count_message(sent, "gpt-4o")
    assert window.tokens == 1000 + deltas[CURRENT_SEQ]


def test_a_shrunk_current_message_gives_its_block_tokens_back():
    current = user([image_ref()], seq=CURRENT_SEQ)
    deltas = {CURRENT_SEQ: 700}
    window = Window(items=[WindowItem(current, 20, text="stub", marker="compressed")],
                    tokens=1720)
    media.settle_window(window, deltas)
    assert (window.items[0].tokens, window.tokens) == (20, 1020)


def test_a_current_message_cut_by_the_cap_keeps_its_block_tokens():
    current = user([image_ref()], seq=CURRENT_SEQ)
    window = Window(items=[WindowItem(current, 20, text="cut", marker="truncated")],
                    tokens=1720)
    media.settle_window(window, {CURRENT_SEQ: 700})
    assert (window.items[0].tokens, window.tokens) == (720, 1720)


def test_a_model_without_the_capability_adds_nothing():
    current = user([image_ref()], seq=CURRENT_SEQ)
    assert media.current_turn_deltas([current], context([], everything_loaded()), "gpt-4o") == {}


def test_only_shown_stored_parts_are_asked_for():
    current = user([image_ref(), document_ref(), audio_ref()], seq=CURRENT_SEQ)
    older = user([image_ref(png(5, 5))], seq=3)
    wanted = media.block_digests([older, current], context(["image", "audio"]))
    assert wanted == [digest(PNG), digest(WAV)]


def test_the_view_lists_each_part_with_how_it_is_sent():
    current = user([image_ref(), document_ref()], seq=CURRENT_SEQ)
    views = media.part_views(current, context(["image"], everything_loaded()))
    assert [(v["kind"], v["sent_as"]) for v in views] == [("image", "block"),
                                                          ("document", "placeholder")]
    assert views[1]["line"].startswith("[document: report.pdf — application/pdf, 3 pages")


def test_text_parts_with_cache_control_keep_the_list_form():
    marked = {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}}
    message = StoredMessage(role="user", content=[marked, image_ref()], seq=3)
    message.tokens = media.stored_tokens(message, "gpt-4o")

    content = render(message, context(["image"]))["content"]

    assert content[1] == marked
    assert content[2]["text"].endswith("— not shown to the model]")
    assert message.tokens == count_message({"role": "user", "content": content}, "gpt-4o")
