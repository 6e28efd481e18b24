"""Bad input never breaks the Responses surface: hypothesis fuzzes ``POST /v1/responses``
(items of every kind with odd fields, odd options). Every input gets a 200 or an
OpenAI-shaped 4xx, never a 5xx; a refused request stores nothing; the stream of an
accepted one ends with its final event."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import RunningProxy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import ThreadedServer

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.testing.fake_upstream import Reply

KEY = "sk-fuzz-responses"
scalars = st.none() | st.booleans() | st.integers(-3, 2**40) | st.text(max_size=8)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
texts = st.text(max_size=20) | values
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "input_file",
                              "refusal", "input_audio", "x"]) | values},
    optional={"text": texts, "image_url": st.sampled_from(
        ["data:image/png;base64,AAAA", "http://127.0.0.1:9/x.png", ""]) | values,
              "file_data": texts, "file_id": texts, "file_url": texts, "refusal": texts},
)
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output",
                              "reasoning", "web_search_call", "computer_call_output",
                              "item_reference", "custom_tool_call"]) | values},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | values,
        "content": texts | st.lists(part, max_size=3),
        "call_id": st.sampled_from(["call_1", "call_2"]) | values,
        "name": st.sampled_from(["f", ""]) | values,
        "arguments": st.sampled_from(["{}", ""]) | values,
        "output": texts | st.lists(part, max_size=2),
        "encrypted_content": texts, "summary": values, "namespace": values,
    },
)
bodies = st.fixed_dictionaries(
    {"input": st.lists(item, max_size=5) | texts},
    optional={
        "model": st.sampled_from(["gpt-4o"]) | values,
        "instructions": texts,
        "stream": st.booleans() | values,
        "store": st.booleans() | values,
        "tools": st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "web_search", "namespace"]) | values},
            optional={"name": texts, "parameters": values, "tools": values}), max_size=2)
        | values,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | values,
        "text": values, "reasoning": values, "include": values, "metadata": values,
        "max_output_tokens": st.integers(-1, 100) | values,
        "previous_response_id": st.sampled_from(["resp_x", ""]) | values,
        "conversation": texts,
        "parallel_tool_calls": values, "truncation": values,
    },
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    path: Path = tmp_path_factory.mktemp("responses-fuzz")
    with FakeResponsesUpstream(reasoning=True,
                               default_reply=lambda body: Reply.text("fine")) as fake:
        fake.default_input_reply = lambda body: Reply.text("fine")
        app = create_app(Settings(store_url=f"sqlite:///{path}/m.db", upstream_url=fake.url,
                                  agents_dir=path))
        server = ThreadedServer(app).start()
        yield RunningProxy(server, app.state.services)
        server.stop()


sessions = itertools.count(1)
statuses: Counter[int] = Counter()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(body=bodies)
def test_no_responses_request_gets_a_server_error(target: RunningProxy, body: Any) -> None:
    session = f"f{next(sessions)}"
    response = httpx.post(
        f"{target.base}/agents/fuzz/sessions/{session}/v1/responses",
        content=json.dumps(body), timeout=20,
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
    )
    statuses[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert not target.stored("fuzz", session, api_key=KEY)
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        last = [line for line in response.text.splitlines() if line.startswith("event: ")][-1]
        assert last in ("event: response.completed", "event: response.failed"), last
    else:
        assert response.json()["object"] == "response"


def test_the_fuzz_run_was_both_refused_and_accepted() -> None:
    if sum(statuses.values()):  # the fuzz test ran in this session
        assert statuses[200] > 0 and statuses[400] > 0, statuses
