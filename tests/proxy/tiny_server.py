"""Tiny scripted HTTP/1.1 servers on loopback and a throwaway TLS CA, for the tests of
the direct upstream's HTTP behaviour (tests/proxy/test_upstream_http.py)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
# a scripted answer to one request: False closes the connection afterwards
Handler = Callable[[Reader, Writer], Awaitable[bool]]


@dataclass
class Received:
    connection: int  # 1 for the server's first connection, 2 for its second...
    head: bytes
    body: bytes


class TinyServer:
    """An HTTP/1.1 server on loopback answering requests with the scripted handlers in
    order (then ``default``); counts connections and sees clients disconnect."""

    def __init__(self, *script: Handler, default: Handler | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.script: deque[Handler] = deque(script)
        self.default = default or respond(b"ok")
        self.tls = tls
        self.connections = 0
        self.disconnects = 0  # connections the client ended (EOF or reset)
        self.requests: list[Received] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = "localhost" if self.tls else "127.0.0.1"
        return f"{scheme}://{host}:{self.port}"

    async def __aenter__(self) -> TinyServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.disconnects += 1
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(Received(number, head, body))
                handler = self.script.popleft() if self.script else self.default
                if not await handler(reader, writer):
                    return
        except asyncio.CancelledError:
            pass  # shutting down (swallowed: 3.11's start_server logs cancelled handlers)
        finally:
            self._tasks.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, ssl.SSLError):
                pass


def respond(body: bytes, *, headers: tuple[str, ...] = (), version: str = "1.1",
            close: bool = False) -> Handler:
    """A Content-Length response; ``close`` ends the connection after it."""
    async def handler(reader: Reader, writer: Writer) -> bool:
        head = [f"HTTP/{version} 200 OK", f"Content-Length: {len(body)}", *headers]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return not close
    return handler


def send_raw(data: bytes, *, close: bool = False, then_wait: float = 0.0) -> Handler:
    async def handler(reader: Reader, writer: Writer) -> bool:
        writer.write(data)
        await writer.drain()
        if then_wait:
            await asyncio.sleep(then_wait)
        return not close
    return handler


def chunked(*parts: bytes, headers: tuple[str, ...] = ()) -> bytes:
    head = "\r\n".join(["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", *headers])
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
    return head.encode() + b"\r\n\r\n" + body


async def drop(reader: Reader, writer: Writer) -> bool:
    """Close the connection without answering."""
    return False


async def hang(reader: Reader, writer: Writer) -> bool:
    """Never answer; once the client goes away the server counts the disconnect."""
    await reader.read()
    return True


def redirect(status: int, location: str) -> Handler:
    answer = f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
    return send_raw(answer.encode())


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for localhost/127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, issuer: str, key: Any, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("test CA", "test CA", ca_key, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build("localhost", "test CA", key, ca_key, False)
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths
