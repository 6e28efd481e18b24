"""Claude Code (npm ``@anthropic-ai/claude-code``, installed by .ci/run into .ci/claude-code)
through the proxy, offline: ``claude -p`` over three prompts of one session (the later ones
``--resume`` it, resending the whole history), with a tool call and a signed thinking block,
against the fake Messages upstream. ``HTTPS_PROXY`` points at a local listener that refuses
every connection, so nothing it tries beyond the proxy leaves the machine.

Skipped when the CLI is not installed, unless ``REQUIRE_CLAUDE_CODE=1`` (.ci/run sets it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from proxy.surfaces.messages_render import check_messages
from proxy.testing.fake_messages import FakeMessages, thinking
from proxy.testing.fake_upstream import Reply
from strategies import native

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / ".ci" / "claude-code" / "node_modules" / ".bin" / "claude"
DUMMY_KEY = "sk-ant-dummy-claude-code-key"


def _claude() -> Path:
    if CLAUDE.exists():
        return CLAUDE
    if os.environ.get("REQUIRE_CLAUDE_CODE") == "1":
        pytest.fail(f"Claude Code is required but not installed at {CLAUDE} (run .ci/run)")
    pytest.skip("Claude Code not installed (.ci/run installs it into .ci/claude-code)")


@pytest.fixture
def refusing_proxy() -> Iterator[str]:
    """An HTTP proxy address that accepts and at once closes every connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()

    def refuse() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


@pytest.fixture
def fake() -> Iterator[FakeMessages]:
    with FakeMessages.running() as upstream:
        yield upstream


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/memory.db"


def test_claude_code_keeps_one_session_over_three_prompts(
    make_proxy, fake, tmp_path, refusing_proxy
):
    claude = _claude()
    proxy = make_proxy(anthropic_url=fake.base_url)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("The secret word is PAPAYA.\n")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy.base,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "HTTPS_PROXY": refusing_proxy,
        "HTTP_PROXY": refusing_proxy,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    session = str(uuid.uuid4())
    fake.queue(
        thinking(Reply.tool_calls([{"id": "call_read1", "name": "Read",
                                    "arguments": {"file_path": str(work / "notes.txt")}}]),
                 "I should read the notes first.", signature="SIG-CLAUDE-CODE-1"),
        Reply.text("The notes say PAPAYA."),
    )
    prompts = [
        ("Remember the code CODE-X1. Then read notes.txt.", ["--session-id", session]),
        ("What is the secret word?", ["--resume", session]),
        ("And what was the code?", ["--resume", session]),
    ]
    results = []
    for prompt, flags in prompts:
        done = subprocess.run(
            [str(claude), "-p", prompt, "--output-format", "json", "--allowedTools", "Read",
             *flags],
            env=env, cwd=work, capture_output=True, text=True, timeout=180, check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results.append(orjson.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0]["result"] == "The notes say PAPAYA."
    assert not any(r["is_error"] for r in results)

    requests = fake.message_requests
    assert len(requests) == 4  # the tool round, then one call per prompt
    # its query string and beta headers reach the upstream as it sent them
    assert all(r.query == "beta=true" for r in requests), [r.query for r in requests]
    assert all("anthropic-beta" in r.headers for r in requests)
    last = requests[-1].body
    sent = orjson.dumps(last["messages"]).decode()
    assert "CODE-X1" in sent and "PAPAYA" in sent
    thought = next(b for m in last["messages"] if m["role"] == "assistant"
                   for b in m["content"] if b["type"] == "thinking")
    assert thought == {"type": "thinking", "thinking": "I should read the notes first.",
                       "signature": "SIG-CLAUDE-CODE-1"}
    assert len(last.get("tools") or ()) > 5
    # its system-role message inside messages reached the model as a user note, and every
    # request was one Anthropic's API accepts
    assert "[system note]" in sent
    for request in requests:
        assert check_messages(request.body["messages"], tools_declared=True) == []
    # Claude Code's session id keys the session (its conversation under that id: the id
    # and the first user message's hash); its resent history is stored once
    sessions = [s.session for s in proxy.call(proxy.services.store.list_sessions("default"))]
    assert len(sessions) == 1 and sessions[0].startswith(session + ".")
    stored = proxy.stored("default", sessions[0], api_key=DUMMY_KEY)
    assert [m.role for m in stored if m.role != "system"] == [
        "user", "assistant", "tool", "assistant", "user", "assistant", "user", "assistant"]
    assert len({m.fingerprint for m in stored}) == len(stored)
    first_reply = next(m for m in stored if m.role == "assistant")
    assert native.items(first_reply.content, "messages")[0]["signature"] == "SIG-CLAUDE-CODE-1"


def test_the_claude_code_package_is_pinned_in_ci():
    script = (ROOT / ".ci" / "run").read_text()
    assert "@anthropic-ai/claude-code@" in script
