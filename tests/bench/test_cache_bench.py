"""bench/cache.py in a tiny form: the session runs through the proxy for every strategy and
client kind, and the scorer applies each provider's rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cache  # noqa: E402  (bench/ is not a package)


def test_a_tiny_session_is_scored_for_every_strategy_and_client_kind(tmp_path):
    out = tmp_path / "cache.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cache.py"), "--turns", "3", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
        capture_output=True, timeout=300,
    )
    rows = json.loads(out.read_text())["rows"]
    names = {(r["name"], r["client"]) for r in rows}
    assert names == {(name, client) for name, _c, _h in cache.ROWS
                     for client in ("delta", "full-history")} | {(cache.NO_MEMORY, "full-history")}
    for row in rows:
        assert row["requests"] >= 3 and 0 < row["openai_hit"] < 1
        assert row["over_budget"] == 0
    plain = next(r for r in rows if r["name"] == cache.NO_MEMORY)
    assert plain["prefix_broken"] == 0  # a client resending its history never breaks it


def test_openai_caches_whole_blocks_from_1024_tokens_in_128_token_steps():
    scorer = cache.Scorer()
    text = "word " * 1200  # about 1,200 tokens per message
    first = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "a"}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": text},
                           {"role": "user", "content": "b"}]}
    assert scorer.score(first, False).openai_cached == 0  # nothing seen yet
    scored = scorer.score(second, False)
    prefix = sum(t for _raw, t in cache.blocks(first))
    assert prefix >= 1024
    assert scored.openai_cached == prefix - (prefix - 1024) % 128
    assert scored.prefix_kept
    # Anthropic reads the previous request's last breakpoint back (within 20 blocks)
    assert scored.anthropic_read == prefix


def test_a_changed_first_message_breaks_the_prefix():
    scorer = cache.Scorer()
    text = "word " * 1500
    scorer.score({"messages": [{"role": "system", "content": text}]}, False)
    scored = scorer.score({"messages": [{"role": "system", "content": text + "!"}]}, False)
    assert scored.openai_cached == 0 and scored.anthropic_read == 0 and not scored.prefix_kept
