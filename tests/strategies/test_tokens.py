"""Token counting: offline, per-model encodings, OpenAI chat accounting, media not as text."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from strategies.compression import head_within
from strategies.media_tokens import DOCUMENT_PAGE_TOKENS, UNKNOWN_IMAGE_TOKENS
from strategies.records import StoredMessage
from strategies.tokens import (
    BIG_TEXT,
    Counter,
    cached_counter,
    count_message,
    count_text,
    encoding_for_model,
    get_encoding,
    image_tokens,
    make_counter,
    truncate_to_tokens,
)
from strategies.truncation import cut_text

ROOT = Path(__file__).resolve().parents[2]
MIXED = "你好世界, مرحبا بالعالم"


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        pytest.param("gpt-4o", "o200k_base", id="gpt-4o"),
        pytest.param("gpt-4o-mini-2024-07-18", "o200k_base", id="gpt-4o-mini"),
        pytest.param("chatgpt-4o-latest", "o200k_base", id="chatgpt-4o"),
        pytest.param("gpt-4.1-nano", "o200k_base", id="gpt-4.1"),
        pytest.param("gpt-5", "o200k_base", id="gpt-5"),
        pytest.param("o1-preview", "o200k_base", id="o1"),
        pytest.param("o3-mini", "o200k_base", id="o3"),
        pytest.param("o4-mini", "o200k_base", id="o4"),
        pytest.param("openai/gpt-4o", "o200k_base", id="openai-prefix"),
        pytest.param("azure/gpt-5-mini", "o200k_base", id="azure-prefix"),
        pytest.param("ft:gpt-4o-mini:acme::abc", "o200k_base", id="fine-tune"),
        pytest.param("GPT-4O", "o200k_base", id="upper-case"),
        pytest.param("gpt-4", "cl100k_base", id="gpt-4"),
        pytest.param("gpt-4-turbo", "cl100k_base", id="gpt-4-turbo"),
        pytest.param("gpt-3.5-turbo", "cl100k_base", id="gpt-3.5"),
        pytest.param("text-embedding-3-small", "cl100k_base", id="embedding"),
        pytest.param("anthropic/claude-3-5-sonnet", "cl100k_base", id="non-openai"),
        pytest.param("llama3", "cl100k_base", id="unknown"),
        pytest.param("", "cl100k_base", id="empty"),
    ],
)
def test_each_model_maps_to_its_encoding(model, encoding):
    assert encoding_for_model(model) == encoding


def test_known_strings_have_known_counts_in_both_encodings():
    assert count_text("hello world", "gpt-4o") == 2
    assert count_text("hello world", "gpt-4") == 2
    assert count_text(MIXED, "gpt-4o") == 7
    assert count_text(MIXED, "gpt-4") == 16
    assert count_text("", "gpt-4o") == 0


def test_special_token_text_counts_as_ordinary_text():
    assert count_text("<|endoftext|>", "gpt-4") > 1


def test_a_counter_counts_for_its_model():
    assert make_counter("gpt-4o")(MIXED) == 7
    assert make_counter("gpt-4")(MIXED) == 16
    assert make_counter("gpt-4")("") == 0


def test_a_message_costs_its_overhead_role_and_content():
    # 3 per message + "user" (1) + "hello world" (2)
    assert count_message({"role": "user", "content": "hello world"}, "gpt-4o") == 6
    assert count_message({"role": "assistant", "content": None}, "gpt-4o") == 4


def test_a_name_costs_its_tokens_plus_one():
    plain = count_message({"role": "user", "content": "hi"}, "gpt-4o")
    named = count_message({"role": "user", "content": "hi", "name": "alice"}, "gpt-4o")
    assert named == plain + count_text("alice", "gpt-4o") + 1


def test_tool_calls_cost_their_name_and_arguments():
    arguments = json.dumps({"query": "weather in Paris", "units": "metric"})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}
        ],
    }
    expected = 4 + 3 + count_text("search", "gpt-4o") + count_text(arguments, "gpt-4o")
    assert count_message(message, "gpt-4o") == expected


def test_a_stored_message_is_counted_like_its_dict():
    stored = StoredMessage(role="tool", content="42 degrees", tool_call_id="c1")
    assert count_message(stored, "gpt-4") == count_message(
        {"role": "tool", "content": "42 degrees", "tool_call_id": "c1"}, "gpt-4"
    )


def test_text_parts_count_as_text():
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": " world"}]
    assert count_message({"role": "user", "content": parts}, "gpt-4o") == 3 + 1 + 2


def test_an_image_is_not_counted_as_its_base64_text():
    data_url = "data:image/png;base64," + "iVBORw0KGgo" * (1_000_000 // 11)
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": data_url, "detail": "high"}},
        ],
    }
    tokens = count_message(message, "gpt-4o")
    assert tokens < 1000
    # not a readable image header: the estimate for an image of unknown size
    assert tokens == 3 + 1 + count_text("what is this?", "gpt-4o") + UNKNOWN_IMAGE_TOKENS
    assert image_tokens(message["content"][1]) == UNKNOWN_IMAGE_TOKENS


@pytest.mark.parametrize(
    ("part", "tokens"),
    [
        pytest.param(
            {"type": "input_audio", "input_audio": {"data": "UklGR" * 100_000, "format": "wav"}},
            235,  # no readable WAV header: 375,000 bytes at 16 KB/s, 10 tokens per second
            id="audio",
        ),
        pytest.param(
            {"type": "file", "file": {"file_data": "JVBERi0" * 100_000, "filename": "a.pdf"}},
            6 * DOCUMENT_PAGE_TOKENS,  # no page objects: one page per 100 KB of 525,000 bytes
            id="file",
        ),
        pytest.param({"type": "mystery", "blob": "x" * 100_000}, 0, id="unknown-part"),
    ],
)
def test_other_media_parts_cost_an_estimate_by_size_not_as_text(part, tokens):
    assert count_message({"role": "user", "content": [part]}, "gpt-4o") == 3 + 1 + tokens


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_truncation_keeps_a_prefix_of_at_most_the_budget(model):
    text = "The quick brown fox jumps over the lazy dog. " * 50
    cut = truncate_to_tokens(text, 10, model)
    assert text.startswith(cut)
    assert count_text(cut, model) <= 10
    assert count_text(cut, model) >= 9


def test_truncation_leaves_short_text_alone_and_empties_at_zero():
    assert truncate_to_tokens("hello world", 2, "gpt-4o") == "hello world"
    assert truncate_to_tokens("hello world", 0, "gpt-4o") == ""


def test_truncation_never_leaves_half_a_character():
    text = "🙂" * 20 + MIXED * 5
    for budget in range(1, 30):
        cut = truncate_to_tokens(text, budget, "gpt-4")
        assert "\ufffd" not in cut
        assert text.startswith(cut)


def words(count: int) -> str:
    return " ".join(f"w{i % 997}x{i % 13}" for i in range(count))


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_a_long_text_is_counted_as_ordinary_text_like_a_short_one(model):
    rng = random.Random(7)
    pieces = [words(50), "  double  spaces ", "it's don't WE'LL", "\n\n  indented\n",
              "3.14159 and 1,000,000", "<|endoftext|>", MIXED, "🙂🙂", "a" * 300, "x\r\ny"]
    text = " ".join(rng.choice(pieces) for _ in range(20_000))
    assert len(text) >= 4 * BIG_TEXT
    expected = len(get_encoding(encoding_for_model(model)).encode_ordinary(text))
    assert count_text(text, model) == expected
    assert count_text(text, model) == expected  # remembered: the same answer


def test_a_cut_by_tokens_is_at_most_a_token_short_of_the_longest_prefix():
    text = words(5_000) + MIXED * 20
    counter = cached_counter("gpt-4o")
    plain = make_counter("gpt-4o")  # no head(): the binary search over characters
    for budget in (1, 7, 100, 999, 3_000):
        fast, longest = head_within(text, budget, counter), head_within(text, budget, plain)
        assert text.startswith(fast) and plain(fast) <= budget
        assert len(fast) <= len(longest) and plain(fast) >= plain(longest) - 1


def test_cutting_a_long_text_tokenizes_its_head_not_the_whole_text_again(monkeypatch):
    text = words(400_000)  # about 3.6 MB
    counter = Counter("o200k_base")
    counter(text)  # counted once where it is stored
    seen: list[int] = []
    encoding = get_encoding("o200k_base")
    original = encoding.encode_ordinary

    def spy(piece: str) -> list[int]:
        seen.append(len(piece))
        return original(piece)

    monkeypatch.setattr(encoding, "encode_ordinary", spy)
    cut = cut_text(text, counter(text) + 4, 2_000, counter)

    assert cut is not None and cut[1] <= 2_000
    assert "truncated by memory-proxy" in cut[0]
    assert sum(seen) < 100_000  # the head and the marker, not 3.6 MB a few dozen times


_NO_NETWORK = """
import socket

def refuse(*args, **kwargs):
    raise OSError("network is off in this test")

socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
"""
_OFFLINE = _NO_NETWORK + """
import json, os
from strategies.tokens import count_text
counts = [count_text("hello world", "gpt-4"), count_text({mixed!r}, "gpt-4o")]
print(json.dumps({{"counts": counts, "cache": os.environ.get("TIKTOKEN_CACHE_DIR"),
                  "custom": os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR")}}))
"""


def _run_offline(env_overrides: dict[str, str], script: str | None = None) -> dict:
    """``script`` (by default: count two texts) in a fresh interpreter without network;
    the JSON object its last line prints."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TIKTOKEN_CACHE_DIR", "CUSTOM_TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(env_overrides)
    done = subprocess.run(
        [sys.executable, "-c", script or _OFFLINE.format(mixed=MIXED)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_encodings_load_offline_from_litellms_bundled_files():
    result = _run_offline({})
    assert result["counts"] == [2, 7]
    assert Path(result["cache"]).name == "tokenizers"
    assert result["custom"] == result["cache"]


def test_a_users_own_cache_dir_is_left_alone_and_an_unloadable_encoding_is_estimated(tmp_path):
    # an empty cache and no network: the BPE files cannot be had, so counting estimates
    result = _run_offline({"TIKTOKEN_CACHE_DIR": str(tmp_path)})
    assert result["cache"] == str(tmp_path)
    assert result["custom"] is None
    assert result["counts"] == [math.ceil(len("hello world") / 4), math.ceil(len(MIXED) / 4)]


_HEAP_AFTER_LOADING = _NO_NETWORK + """
import gc, json, tracemalloc
from strategies.tokens import get_encoding

tracemalloc.start()
encoding = get_encoding("o200k_base")
gc.collect()
print(json.dumps({"held": tracemalloc.get_traced_memory()[0], "loaded": encoding is not None}))
"""


def test_a_loaded_encoding_keeps_no_python_copy_of_its_ranks():
    # the Rust core holds the 200,000 ranks; tiktoken's Python dict of them is 24 MB
    result = _run_offline({}, _HEAP_AFTER_LOADING)
    assert result["loaded"]
    assert result["held"] < 2_000_000  # bytes of the Python heap allocated while loading


def test_loaded_encodings_still_count_and_pickle():
    import pickle

    encoding = get_encoding("o200k_base")
    assert encoding is not None
    assert count_text("hello world", "gpt-4o") == 2
    restored = pickle.loads(pickle.dumps(encoding))
    assert restored.encode_ordinary("hello world") == encoding.encode_ordinary("hello world")
