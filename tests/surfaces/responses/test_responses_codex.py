"""Codex CLI (npm ``@openai/codex``, installed by ``.ci/run`` into ``.ci/codex``) through
the proxy, offline: ``codex exec`` runs a turn with a shell tool call, then ``codex exec
resume`` asks about it. Codex speaks only the Responses API: ``store: false``, its
instructions as developer messages, built-in and namespaced tools, its whole history
again on resume. Skipped when Codex is not installed, unless ``REQUIRE_CODEX=1``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.testing.fake_upstream import FakeUpstream, Reply

CODEX = Path(__file__).resolve().parents[3] / ".ci" / "codex" / "node_modules" / ".bin" / "codex"
FACT = "Remember the code CODE-X1."
# Codex retries without end against an endpoint that is down: every run is bounded
RUN_SECONDS = 120

pytestmark = pytest.mark.skipif(
    not CODEX.exists() and os.environ.get("REQUIRE_CODEX") != "1",
    reason="Codex CLI not installed (.ci/run installs it into .ci/codex)",
)

CONFIG = """
model = "gpt-5-codex"
model_provider = "memory-proxy"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.memory-proxy]
name = "memory-proxy"
base_url = "{base_url}"
wire_api = "responses"
env_key = "MEMORY_PROXY_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 20000

[analytics]
enabled = false

# nothing that reaches the network
[features]
plugins = false
remote_plugin = false
plugin_sharing = false
apps = false
in_app_updates = false
tool_suggest = false
skill_mcp_dependency_install = false
shell_snapshot = false
"""


def run_codex(home: Path, work: Path, *args: str) -> list[dict[str, Any]]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))},
        "CODEX_HOME": str(home), "MEMORY_PROXY_TEST_KEY": "sk-codex-key", "RUST_LOG": "error",
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--json", *args],
        cwd=work, env=env, capture_output=True, text=True, timeout=RUN_SECONDS,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def messages_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["item"]["text"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"]


def test_codex_exec_and_resume_keep_one_history(proxy, fake: FakeUpstream, tmp_path):
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(CONFIG.format(base_url=proxy.url("codex")))
    fake.queue(
        Reply.tool_calls([{"id": "call_sh1", "name": "exec_command",
                           "arguments": {"cmd": "echo codex-tool-ok"}}]),
        Reply.text("Noted."),
        Reply.text("CODE-X1."),
    )
    assert messages_of(run_codex(home, work, FACT)) == ["Noted."]
    assert messages_of(run_codex(home, work, "resume", "--last", "Which code?")) == ["CODE-X1."]

    calls = [r for r in fake.requests if r.method == "POST"]
    native = isinstance(fake, FakeResponsesUpstream)
    last = calls[-1].body
    if native:
        sent = last["input"]
        assert last["store"] is False and "reasoning.encrypted_content" in last["include"]
        assert any(t.get("type") == "namespace" for t in last["tools"])
        texts = [json.dumps(i) for i in sent]
        # the reasoning of both earlier replies went back byte for byte, once each
        reasoning = [i["encrypted_content"] for i in sent if i.get("type") == "reasoning"]
        assert len(reasoning) == len(set(reasoning)) == 2
    else:
        assert calls[0].path.endswith("/responses")  # tried once: 404, chat from then on
        assert all(r.path.endswith("/chat/completions") for r in calls[1:])
        texts = [json.dumps(m) for m in last["messages"]]
    assert sum(FACT in t for t in texts) == 1
    assert sum('"call_sh1"' in t for t in texts) == 2  # the call and its output
    assert sum("Which code?" in t for t in texts) == 1

    [session] = proxy.call(proxy.services.store.list_sessions("codex"))
    stored = proxy.stored("codex", session.session, api_key="sk-codex-key")
    roles = [m.role for m in stored]
    # environment context, the fact, the call, its result, the reply; the question, the reply
    assert roles == ["user", "user", "assistant", "tool", "assistant", "user", "assistant"]
    snapshot = proxy.snapshot("codex", session.session, api_key="sk-codex-key")
    assert [m["role"] for m in snapshot.meta.system_prompt] == ["developer", "developer"]
