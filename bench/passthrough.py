"""The Python floor: a bare pass-through proxy on the same stack as memory-proxy.

uvicorn (httptools, uvloop) serving a pure ASGI app that forwards the request body as is
to the upstream over one pooled aiohttp session and streams the reply back chunk by
chunk. No parsing, no storage: whatever memory-proxy adds on top of this is its own cost.

    python bench/passthrough.py --port 8200 --upstream http://127.0.0.1:8100/v1
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# hop-by-hop or recomputed by the client library
DROPPED = {b"host", b"content-length", b"connection", b"transfer-encoding", b"accept-encoding"}


class PassThrough:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in DROPPED}
        url = self.upstream + path.removeprefix("/v1")
        assert self.session is not None
        async with self.session.request(scope["method"], url, data=body, headers=headers) as up:
            out = [(b"content-type", up.headers.get("content-type", "").encode())]
            await send({"type": "http.response.start", "status": up.status, "headers": out})
            async for chunk in up.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
                self.session = aiohttp.ClientSession(
                    connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                    auto_decompress=False,
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="OpenAI base URL, ending in /v1")
    args = parser.parse_args()
    uvicorn.run(PassThrough(args.upstream), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
