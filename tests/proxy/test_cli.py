"""``memory-proxy serve`` says what it serves before it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ports import free_port

from proxy.banner import startup_lines
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "agent-definitions"


def test_serve_prints_store_upstream_agents_and_admin_access_before_serving(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_PROXY_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port),
         "--store-url", "redis://:s3cret-pass@127.0.0.1:1/0",
         "--agents-dir", str(tmp_path / "missing")],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline() for _ in range(8)]
    finally:
        process.terminate()
        process.communicate(timeout=20)
    banner = "".join(lines)
    assert f"memory-proxy serving on http://127.0.0.1:{port}" in banner
    assert "redis://:***@127.0.0.1:1/0" in banner and "s3cret-pass" not in banner
    assert "https://api.openai.com/v1 (with each client's own key)" in banner
    assert "missing: not found" in banner and "warning   no agent definitions" in banner
    assert "open to this machine only (no admin token set)" in banner
    assert f"http://127.0.0.1:{port}/agents/<agent>/sessions/<session>/v1" in banner


def test_the_banner_counts_the_agents_it_loaded_and_names_a_rejected_file(tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    for path in BUNDLED.glob("*.json"):
        (agents / path.name).write_text(path.read_text())
    (agents / "broken.json").write_text("{not json")
    lines = startup_lines(Settings(agents_dir=agents, admin_token="t" * 32,
                                   upstream_api_key="sk-upstream-secret",
                                   upstream_url="https://user:pw@llm.internal/v1"))
    text = "\n".join(lines)
    assert "3 loaded (assistant-with-tools, planner, research-lead)" in text
    assert "broken.json rejected" in text
    assert "need the admin token" in text
    assert "https://user:***@llm.internal/v1 (with MEMORY_PROXY_UPSTREAM_API_KEY)" in text
    assert "sk-upstream-secret" not in text and "t" * 32 not in text


def test_a_proxy_bound_off_loopback_without_a_token_says_admin_is_closed():
    text = "\n".join(startup_lines(Settings(host="0.0.0.0")))
    assert "closed: set MEMORY_PROXY_ADMIN_TOKEN" in text
