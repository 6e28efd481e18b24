"""What a model can take: its context window and the media it reads.

Read from the model map litellm ships in its wheel (a JSON file read directly: no
``import litellm``, no network). The agent definition's ``llm`` fields win over it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

from strategies.key_cache import short_key_cache

MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    context_window: int | None
    reads_images: bool
    reads_documents: bool


@functools.cache
def _model_map() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return {}
    path = os.path.join(os.path.dirname(spec.origin), MAP_FILE)
    try:
        with open(path, "rb") as handle:
            data: dict[str, Any] = json.load(handle)
    except OSError:
        return {}
    return data


def preload() -> None:
    """Read the model map now (call from a worker thread at startup)."""
    _model_map()


@short_key_cache(maxsize=1024)
def get_model_info(model: str) -> ModelInfo:
    """Info for ``model``, trying the id as given, then without its provider prefix."""
    data = _model_map()
    entry = data.get(model)
    if entry is None and "/" in model:
        entry = data.get(model.split("/", 1)[1])
    if entry is None:
        return ModelInfo(None, False, False)
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    return ModelInfo(
        context_window=int(window) if isinstance(window, int | float) else None,
        reads_images=bool(entry.get("supports_vision")),
        reads_documents=bool(entry.get("supports_pdf_input")),
    )
