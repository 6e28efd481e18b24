"""Which API a Responses turn reaches the upstream with (the agent's ``llm.api``, else
``MEMORY_PROXY_RESPONSES_API``; litellm's provider models always through chat), and media
through the Responses API under the media capability rules."""

from __future__ import annotations

import json

import pytest
from e2e import write_agent
from media_samples import data_url, png

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.surfaces.responses import pick_upstream
from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.upstreams.responses_http import ResponsesUpstream

MODEL = "gpt-4o"


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    with FakeResponsesUpstream(reasoning=True) as upstream:
        yield upstream


@pytest.fixture
def chat_agent(agents_dir):  # type: ignore[no-untyped-def]
    write_agent(agents_dir, "chatty", llm={"model": MODEL, "api": "chat"})


def paths(fake: FakeResponsesUpstream) -> list[str]:
    return [r.path.rsplit("/", 1)[-1] for r in fake.requests if r.method == "POST"]


def test_an_agent_whose_api_is_chat_is_served_through_chat_completions(
    chat_agent, proxy, fake
):
    reply = proxy.client("chatty", "s").responses.create(model=MODEL, input="Hello")
    assert reply.output_text == "ok: Hello"
    assert paths(fake) == ["completions"]


@pytest.mark.parametrize("choice, expected", [
    pytest.param("chat", ["completions"], id="chat"),
    pytest.param("responses", ["responses"], id="responses"),
    pytest.param("auto", ["responses"], id="auto"),
])
def test_the_setting_chooses_the_api(make_proxy, fake, choice, expected):
    proxy = make_proxy(responses_api=choice)
    proxy.client("a", "s").responses.create(model=MODEL, input="Hello")
    assert paths(fake) == expected


def test_litellm_provider_models_go_through_chat_completions(tmp_path):
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path}/m.db"))
    services = app.state.services
    assert pick_upstream(services, None, "anthropic/claude-sonnet-4") is services.upstream
    assert isinstance(pick_upstream(services, None, MODEL), ResponsesUpstream)
    assert pick_upstream(services, "chat", MODEL) is services.upstream


def test_an_image_reaches_a_responses_upstream_as_an_input_image(proxy, fake):
    image = data_url("image/png", png(64, 64))
    client = proxy.client("a", "media")
    client.responses.create(model=MODEL, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": image}]}])
    sent = fake.responses_requests[-1].body["input"]
    parts = sent[-1]["content"]
    # the attachment notice of the media rules, the text, the image
    assert [p["type"] for p in parts] == ["input_text", "input_text", "input_image"]
    assert parts[0]["text"].startswith("[Attachments:") and parts[2]["image_url"] == image
    stored = proxy.stored("a", "media")[0]
    assert image not in json.dumps(stored.content)  # stored once in the part store
