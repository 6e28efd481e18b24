"""Token counting: pure functions, offline.

tiktoken downloads its BPE files on first use, which fails without network. litellm's
wheel bundles them (cl100k_base, o200k_base, p50k_base, named by tiktoken's cache key), so
before the first encoding is loaded ``TIKTOKEN_CACHE_DIR`` points at that directory, found
without importing litellm. A user's own ``TIKTOKEN_CACHE_DIR`` is left alone.

Message accounting follows OpenAI's chat format: a flat overhead per message plus its
role, text, name and tool calls. Media parts are never counted as text (a base64 image
would otherwise cost hundreds of thousands of tokens):

- images follow the provider's rules from the image's own size, read from its header:
  OpenAI's tile formula (detail ``low`` = 85; ``high``/``auto``/``original``: fit in
  2048x2048, shortest side down to 768, 170 per 512px tile + 85), Anthropic's
  width x height / 750 for ``claude`` models; an image whose size cannot be read (a
  remote URL) costs as a 1024x1024 one;
- documents: 1,500 tokens per PDF page (text plus page image), pages counted from the
  PDF; without a page count one page per 100 KB, text files at 4 bytes per token;
- audio: 10 tokens per second, the duration read from a WAV header, else from the size
  at 16 KB per second (128 kbit/s).

The media rules live in ``strategies/media_tokens.py``. A stored part reference
(``{"type": ..., "part": {...}}``, see ``proxy/turn/parts.py``) carries the measured size, pages
or duration, so counting it reads no bytes.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import tiktoken
import tiktoken.registry

from strategies import native
from strategies.key_cache import short_key_cache
from strategies.media_tokens import audio_tokens, document_tokens, image_tokens

log = logging.getLogger(__name__)

# texts remembered per model by cached_counter
COUNT_CACHE_SIZE = 16_384
# a text this long is tokenized in pieces, not into one list of Python ints (9 million of
# them for 20 MB hold the interpreter's lock for about a second, every thread stopped),
# and its count is remembered (an incoming message is counted where it is stored, then
# cut by the strategy)
BIG_TEXT = 100_000
BIG_COUNTS = 256

O200K = "o200k_base"
CL100K = "cl100k_base"
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "text-embedding")

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
# characters per token when no tokenizer could be loaded at all
_FALLBACK_CHARS_PER_TOKEN = 4


def bundled_tokenizer_dir() -> Path | None:
    """litellm's directory of bundled tiktoken BPE files, located without importing litellm."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or ())
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        candidate = Path(root) / "litellm_core_utils" / "tokenizers"
        if candidate.is_dir():
            return candidate
    return None


@functools.cache
def _use_bundled_bpe_files() -> None:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    directory = bundled_tokenizer_dir()
    if directory is None:
        return
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    # litellm's import sets TIKTOKEN_CACHE_DIR to this one unless told otherwise
    os.environ.setdefault("CUSTOM_TIKTOKEN_CACHE_DIR", str(directory))


@functools.cache
def get_encoding(name: str) -> tiktoken.Encoding | None:
    """The named encoding, loaded once; None when it cannot be loaded (offline, no bundle)."""
    _use_bundled_bpe_files()
    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as exc:  # tiktoken raises whatever its download raised
        log.warning("tokenizer %s unavailable (%s); estimating tokens from characters", name, exc)
        return None
    release_python_ranks(encoding)
    return encoding


def release_python_ranks(encoding: tiktoken.Encoding) -> None:
    """Drop the Python copy of the BPE ranks (28 MB for o200k_base, 17 MB for cl100k_base).
    The Rust core holds its own; tiktoken keeps this dict only to pickle an encoding that
    is not registered, and registered ones (all of ours) pickle by name."""
    if tiktoken.registry.ENCODINGS.get(encoding.name) is encoding:
        encoding._mergeable_ranks = {}


@short_key_cache(maxsize=1024)
def encoding_for_model(model: str) -> str:
    """The tiktoken encoding name for a model id; cl100k_base for anything unknown."""
    name = (model or "").strip().lower().rsplit("/", 1)[-1]
    name = name.removeprefix("ft:")
    if name.startswith(_O200K_PREFIXES):
        return O200K
    if name.startswith(_CL100K_PREFIXES):
        return CL100K
    return CL100K


def count_text(text: str, model: str) -> int:
    """Tokens of ``text`` for ``model`` (special-token strings count as ordinary text)."""
    return _count(encoding_for_model(model), text)


def make_counter(model: str) -> Callable[[str], int]:
    """A one-argument counter for ``WindowContext.count_tokens``."""
    return functools.partial(_count, encoding_for_model(model))


class Counter:
    """``count_tokens`` for one encoding that remembers the texts it has seen: stubs,
    summaries and truncations a strategy renders every turn are tokenized once per
    process, not once per request. ``head(text, max_tokens)`` cuts a text by tokens
    (``strategies.compression.head_within`` uses it).

    Keyed by (length, hash) so a huge text costs a few bytes of cache, not its own size;
    bounded.
    """

    __slots__ = ("encoding_name", "seen")

    def __init__(self, encoding_name: str) -> None:
        self.encoding_name = encoding_name
        self.seen: dict[tuple[int, int], int] = {}

    def __call__(self, text: str) -> int:
        key = (len(text), hash(text))
        seen = self.seen
        tokens = seen.get(key)
        if tokens is None:
            tokens = _count(self.encoding_name, text)
            if len(seen) >= COUNT_CACHE_SIZE:
                seen.clear()
            seen[key] = tokens
        return tokens

    def head(self, text: str, max_tokens: int) -> str:
        """A prefix of ``text`` of at most ``max_tokens`` tokens, at most a token short of
        the longest."""
        return _head(self.encoding_name, text, max_tokens)


@short_key_cache(maxsize=64)
def cached_counter(model: str) -> Counter:
    """The remembering counter of ``model``'s encoding (one per model string: the model
    comes from clients)."""
    return Counter(encoding_for_model(model))


_big_counts: dict[tuple[str, int, int], int] = {}


def _count(encoding_name: str, text: str) -> int:
    if not text:
        return 0
    encoding = get_encoding(encoding_name)
    if encoding is None:
        return -(-len(text) // _FALLBACK_CHARS_PER_TOKEN)
    if len(text) < BIG_TEXT:
        return len(encoding.encode_ordinary(text))
    key = (encoding_name, len(text), hash(text))
    tokens = _big_counts.get(key)
    if tokens is None:
        tokens = sum(len(encoding.encode_ordinary(piece)) for piece in _pieces(text))
        if len(_big_counts) >= BIG_COUNTS:
            _big_counts.clear()
        _big_counts[key] = tokens
    return tokens


# between two ASCII letters, a space starts a new pre-token in every encoding's pattern
# (a word's leading space is its own): text cut there tokenizes to the same tokens
_WORD_BOUNDARY = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")


def _pieces(text: str, size: int = BIG_TEXT) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, cut only where tokenizing the
    pieces apart gives the text's own tokens (a text without such a place is one piece).
    Each piece's tokens are a short list, made while the interpreter's lock is held."""
    start = 0
    while len(text) - start > size:
        boundary = _WORD_BOUNDARY.search(text, start + size)
        if boundary is None:
            break
        yield text[start : boundary.start()]
        start = boundary.start()
    yield text[start:]


def _head(encoding_name: str, text: str, max_tokens: int) -> str:
    """The first ``max_tokens`` tokens of ``text``, tokenizing only a prefix of it that
    holds them: O(max_tokens), whatever the length of the text."""
    if max_tokens <= 0 or not text:
        return ""
    encoding = get_encoding(encoding_name)
    if encoding is None:
        return text[: max_tokens * _FALLBACK_CHARS_PER_TOKEN]
    span = max_tokens * 8 + 64  # characters: tokens are rarely longer than 8 on average
    while True:
        tokens = encoding.encode_ordinary(text[:span])
        if len(tokens) > max_tokens:
            break
        if span >= len(text):
            return text
        span *= 2
    # the first tokens of a prefix are the text's own; a cut inside a multi-byte
    # character leaves a partial sequence at the end: dropped
    keep = max_tokens
    while True:
        kept = encoding.decode_bytes(tokens[:keep]).decode("utf-8", errors="ignore")
        # counted alone, the cut end may tokenize differently: a few tokens fewer then
        over = len(encoding.encode_ordinary(kept)) - max_tokens
        if over <= 0:
            return kept
        keep -= over


def truncate_to_tokens(text: str, max_tokens: int, model: str) -> str:
    """A prefix of ``text`` of at most ``max_tokens`` tokens (at most a token short of the
    longest)."""
    return _head(encoding_for_model(model), text, max_tokens)


def count_part(part: Any, model: str) -> int:
    """Tokens of one content part: text as text, media by estimate, never base64 as text."""
    if isinstance(part, str):
        return count_text(part, model)
    if not isinstance(part, Mapping):
        return 0
    kind = part.get("type")
    if kind == "text":
        return count_text(str(part.get("text") or ""), model)
    if kind == "refusal":
        return count_text(str(part.get("refusal") or ""), model)
    if kind in ("image_url", "image"):
        return image_tokens(part, model)
    if kind in ("input_audio", "audio"):
        return audio_tokens(part)
    if kind in ("file", "document"):
        return document_tokens(part)
    if kind == native.NATIVE:
        return native.count(part, lambda text: count_text(text, model))
    text = part.get("text")
    return count_text(text, model) if isinstance(text, str) else 0


def count_content(content: Any, model: str) -> int:
    """Tokens of an OpenAI ``content`` value: None, a string or a list of parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        return count_text(content, model)
    if isinstance(content, list):
        return sum(count_part(part, model) for part in content)
    return count_part(content, model)


def _field(message: Any, name: str) -> Any:
    if isinstance(message, Mapping):
        return message.get(name)
    return getattr(message, name, None)


@short_key_cache(maxsize=4096)
def _count_name(text: str, model: str) -> int:
    """Roles, names and tool names: a few short strings, each tokenized once."""
    return count_text(text, model)


def count_message(message: Any, model: str) -> int:
    """Tokens one chat message costs: a dict in OpenAI's shape or a StoredMessage-like object.

    3 per message, plus the role, the content, the name (+1) and each tool call's function
    name and arguments (+3 per call). Tool call ids are not counted.
    """
    tokens = TOKENS_PER_MESSAGE + _count_name(str(_field(message, "role") or ""), model)
    tokens += count_content(_field(message, "content"), model)
    name = _field(message, "name")
    if name:
        tokens += _count_name(str(name), model) + TOKENS_PER_NAME
    for call in _field(message, "tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        tokens += TOKENS_PER_TOOL_CALL
        tokens += _count_name(str(function.get("name") or ""), model)
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        tokens += count_text(arguments or "", model)
    return tokens
