"""``memory-proxy demo``: the product visibly working, with no API key and no network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from proxy.cli import main

ROOT = Path(__file__).resolve().parents[2]


def rows(output: str) -> dict[int, str]:
    """The table's turn rows by number (continuation lines joined to their turn)."""
    table: dict[int, str] = {}
    current = None
    for line in output.splitlines():
        match = re.match(r"\s*(\d+)\s{2}", line)
        if match:
            current = int(match.group(1))
            table[current] = line
        elif current is not None and line.startswith(" " * 60) and line.strip():
            table[current] += " | " + line.strip()
        else:
            current = None
    return table


def evicted_column(row: str) -> int:
    return int(re.search(r"\d+%\s+(\d+)\s", row).group(1))


def test_the_demo_shows_eviction_fetch_and_compaction_turn_by_turn(capsys):
    started = time.monotonic()
    assert main(["demo"]) == 0
    elapsed = time.monotonic() - started
    output = capsys.readouterr().out
    table = rows(output)
    assert sorted(table) == list(range(1, 9))
    assert elapsed < 20
    assert evicted_column(table[1]) == 0
    assert any(evicted_column(row) > 0 for row in table.values())
    assert "fetch_tool_result answered from the store" in output
    compacted = [n for n, row in table.items() if "compacted messages 1-" in row]
    assert len(compacted) == 1
    restarted = table[compacted[0] + 1]
    assert "window restarts from the summary, sent as USER_MESSAGE" in restarted
    # the window shrank when it restarted from the summary
    window = [int(re.search(r"\s([\d,]+)\s+\d+%", table[n]).group(1).replace(",", ""))
              for n in (compacted[0], compacted[0] + 1)]
    assert window[1] < window[0]
    assert "memory-proxy serve" in output
    # the hint names a base URL that keeps memory: the path form, with a session
    hint = re.search(r"http://127\.0\.0\.1:4000/\S+", output.split("Next:")[1]).group(0)
    assert re.fullmatch(r"http://127\.0\.0\.1:4000/agents/[\w-]+/sessions/[\w-]+/v1", hint)


def test_the_demo_runs_in_a_fresh_process_without_keys_or_litellm(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "MEMORY_PROXY_"))}
    script = ("import sys; from proxy.cli import main; code = main(['demo', '--turns', '2']); "
              "print('litellm imported:', 'litellm' in sys.modules); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={
        **env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(rows(result.stdout)) == [1, 2]
    assert "litellm imported: False" in result.stdout
    assert not (tmp_path / ".memory-proxy").exists()  # the demo's store is temporary
