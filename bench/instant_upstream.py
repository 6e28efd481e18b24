"""The benchmark's upstream: ``proxy.testing.fake_upstream``'s instant replies, served by a bare
asyncio protocol (uvloop, httptools), each response in one write.

Every request of the load phases ends at the upstream, and on this 2-core machine the
upstream's CPU is taken from the processes measured: the workers phase shares both cores
with it. ``proxy.testing.fake_upstream`` is built for the tests (uvicorn and ASGI, every request
recorded, replies scripted, streams paced, disconnects counted) and spends about twice as
much CPU per request as a server that only answers. This one only answers: the same bytes
(``instant_reply``, the same echo and usage), no recording, no scripting. The phases that
pace a stream keep ``proxy.testing.fake_upstream``.

    python bench/instant_upstream.py --port 8100
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httptools
import orjson
import uvloop

from proxy.testing.fake_upstream import count_tokens_roughly, echo_reply, error_json, instant_reply

MODELS = orjson.dumps({"object": "list", "data": [
    {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]})
_JSON = b"application/json"


def _error(status: int, message: str) -> bytes:
    return _response(status, _JSON, error_json(status, message))


def _response(status: int, content_type: bytes, body: bytes) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}[status]
    return b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (
        status, reason, content_type, len(body), body)


def _stream(events: bytes) -> bytes:
    """An SSE response, chunked as a streaming upstream sends it (here in one chunk)."""
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(events), events))


def answer(method: bytes, path: bytes, raw: bytes) -> bytes:
    """The whole HTTP response to one request."""
    if method == b"GET" and path.endswith(b"/models"):
        return _response(200, _JSON, MODELS)
    if method != b"POST" or not path.endswith(b"/chat/completions"):
        return _error(404, f"no route {method.decode()} {path.decode()}")
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return _error(400, "body is not a JSON object")
    stream, data = instant_reply(echo_reply(body), body, count_tokens_roughly(body))
    return _stream(data) if stream else _response(200, _JSON, data)


class UpstreamProtocol(asyncio.Protocol):
    """One connection: requests parsed as they arrive, each answered in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(_error(400, "malformed HTTP request"))
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = httptools.parse_url(self.url).path
        self.transport.write(answer(self.parser.get_method(), path, b"".join(self.body)))
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=1024)
    print(f"instant upstream on http://{host}:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
