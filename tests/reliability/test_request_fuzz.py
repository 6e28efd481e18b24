"""Bad input never breaks the proxy: hypothesis fuzzes ``POST /v1/chat/completions``.

Every input gets a 200 or an OpenAI-shaped 4xx, never a 5xx; a refused request stores
nothing; a session that accepted a request stays usable (a follow-up turn and the
``/memory`` view both answer). The app runs in process (``httpx.ASGITransport``) against
the recording fake upstream on loopback. ``SOAK=1`` tries many more inputs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from e2e import ADMIN_TOKEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import is_openai_error, report, scaled

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_upstream import FakeUpstream, Reply
from proxy.turn.identity import namespace_for
from strategies.records import LoadSpec, SessionKey

FUZZ_KEY = "sk-fuzz-key"
BODY_LIMIT = 64 * 1024
EXAMPLES = scaled(400, 20_000)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
call_ids = st.sampled_from(["call_1", "call_2", ""]) | json_values
texts = st.text(max_size=40) | st.sampled_from(["", " ", "\u202e\u200b", "\x00", "🙂" * 3])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "file", "refusal", "x"])
     | json_values},
    optional={
        "text": texts | json_values,
        "image_url": st.fixed_dictionaries({}, optional={
            "url": st.sampled_from(["http://127.0.0.1:9/x.png", "data:image/png;base64,AAAA",
                                    "data:,", "file:///etc/passwd", ""]) | json_values,
            "detail": st.sampled_from(["low", "high", "auto"]) | json_values,
        }) | json_values,
        "input_audio": json_values,
        "file": json_values,
        "cache_control": json_values,
    },
)
contents = texts | st.none() | st.lists(parts | json_values, max_size=3) | json_values
functions = st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["lookup", ""]) | json_values,
                  "arguments": st.sampled_from(["{}", '{"q": 1}', "not json"]) | json_values},
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {"id": call_ids},
        optional={"type": st.just("function") | json_values, "function": functions | json_values},
    )
    | json_values,
    max_size=3,
)
roles = st.sampled_from(
    ["user", "assistant", "system", "developer", "tool", "function", "wizard", "", "USER"]
) | json_values
odd_messages = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": contents,
        "tool_calls": tool_calls | json_values,
        "tool_call_id": call_ids,
        "name": st.text(max_size=8) | json_values,
        "refusal": json_values,
    },
)
# mostly well-formed messages with one odd field, so input gets past the first checks
plain_texts = st.text(max_size=30) | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}), max_size=2)
good_calls = st.lists(st.fixed_dictionaries({
    "id": st.sampled_from(["call_1", "call_2"]), "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": st.just("lookup"),
                                       "arguments": st.sampled_from(["{}", '{"q": 1}'])}),
}), min_size=1, max_size=2)
good_messages = (
    st.fixed_dictionaries({"role": st.just("user"), "content": plain_texts | contents})
    | st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]),
                             "content": plain_texts})
    | st.fixed_dictionaries({"role": st.just("assistant")},
                            optional={"content": plain_texts | st.none(),
                                      "tool_calls": good_calls | tool_calls})
    | st.fixed_dictionaries({"role": st.just("tool"), "content": plain_texts | contents,
                             "tool_call_id": st.sampled_from(["call_1", "call_2"]) | call_ids})
)
messages = good_messages | good_messages | good_messages | odd_messages
bodies = st.fixed_dictionaries(
    {"messages": st.integers(0, 9).flatmap(
        lambda n: st.lists(messages, min_size=1, max_size=6) if n else json_values)},
    optional={
        "model": st.sampled_from(["gpt-4o", "gpt-4o-mini", ""]) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values})
        | json_values,
        "metadata": st.dictionaries(st.sampled_from(["agent_id", "session_id", "x"]),
                                    json_values, max_size=3) | json_values,
        "user": json_values,
        "tools": json_values,
        "n": json_values,
        "max_tokens": json_values,
    },
)


def nested(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":' + inner + b"}"


raw_oddities = st.sampled_from([
    b"", b"{", b"null", b"[]", b'"text"', b"\xff\xfe", b'{"messages": [}',
    b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
    b'{"model":"m","messages":[{"role":"user","content":1e400}]}',
    b'{"model":"m","messages":[{"role":"user","content":"x"}],"n":' + b"9" * 400 + b"}",
    b'{"model":"m","messages":[{"role":"user","content":"x"}],"n":-' + b"9" * 30 + b"}",
    nested(100), nested(254), nested(255), nested(600), nested(1100),
    b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (BODY_LIMIT + 10) + b'"}]}',
]) | st.binary(max_size=64)
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
headers = st.dictionaries(
    st.sampled_from(["x-memory", "x-memory-history", "x-session-id", "x-agent-id",
                     "x-stainless-retry-count", "idempotency-key", "content-type"]),
    header_text | st.sampled_from(["off", "full", "delta", "1", "-1", "{a}"]),
    max_size=3,
)
encoded_bodies = bodies.map(orjson.dumps)
# seven in ten inputs are request-shaped bodies; the rest any JSON, or not JSON at all
payloads = st.integers(0, 9).flatmap(
    lambda n: encoded_bodies if n < 7 else json_values.map(orjson.dumps) if n < 8 else raw_oddities
)


class InProcessProxy:
    """The app on its own event loop in this thread, for fast synchronous fuzzing."""

    def __init__(self, tmp: Path, fake: FakeUpstream) -> None:
        self.loop = asyncio.new_event_loop()
        agents = tmp / "agents"
        agents.mkdir()
        self.app = create_app(Settings(
            store_url=f"sqlite:///{tmp}/fuzz.db", upstream_url=fake.url, agents_dir=agents,
            admin_token=ADMIN_TOKEN, max_body_bytes=BODY_LIMIT,
        ))
        self.lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self.lifespan.__aenter__())
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://proxy.test",
                                        timeout=30)
        self.store = self.app.state.services.store

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.client.aclose())
        self.run(self.lifespan.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessProxy]:
    # an upstream that answers without reading the (possibly odd) body
    with FakeUpstream.running(default_reply=lambda body: Reply.text("fine")) as fake:
        proxy = InProcessProxy(tmp_path_factory.mktemp("fuzz"), fake)
        yield proxy
        proxy.close()


sessions = itertools.count(1)
statuses: Counter[int] = Counter()


def check_exchange(target: InProcessProxy, payload: bytes, extra: dict[str, str]) -> None:
    session = f"f{next(sessions)}"
    url = f"/agents/fuzz/sessions/{session}/v1/chat/completions"
    sent = {"content-type": "application/json", **extra, "authorization": f"Bearer {FUZZ_KEY}"}
    response = target.run(target.client.post(url, content=payload, headers=sent))
    statuses[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:300])
    key = SessionKey(namespace_for(FUZZ_KEY), "fuzz", session)
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        assert is_openai_error(response.json()), response.text[:300]
        stored = target.run(target.store.load(key, LoadSpec(limit=10)))
        assert not stored.exists, f"a refused request stored {stored.messages}"
        return
    # an accepted request leaves a session that still works
    follow_up = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "next"}]})
    again = target.run(target.client.post(url, content=follow_up, headers={
        "content-type": "application/json", "authorization": f"Bearer {FUZZ_KEY}"}))
    assert again.status_code == 200, again.text[:300]
    view = target.run(target.client.get(f"/memory/fuzz/{session}", headers={
        "authorization": f"Bearer {ADMIN_TOKEN}"}))
    assert view.status_code in (200, 404), view.text[:300]


@pytest.mark.soak
@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(payload=payloads, extra=headers)
def test_no_request_body_gets_a_server_error_or_stores_anything_when_refused(
    target: InProcessProxy, payload: bytes, extra: dict[str, str]
) -> None:
    check_exchange(target, payload, extra)


def test_the_fuzz_run_tried_many_inputs_and_refused_and_accepted_some() -> None:
    tried = sum(statuses.values())
    report("request fuzz", inputs=tried, statuses=json.dumps(dict(sorted(statuses.items()))))
    if tried:  # the fuzz test ran in this session (not deselected)
        assert tried >= EXAMPLES // 2
        assert statuses[200] > 0 and statuses[400] > 0
