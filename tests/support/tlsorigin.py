"""An HTTPS origin whose certificate no client trusts: self-signed, for `localhost`, served by aiohttp
on 127.0.0.1. `handshakes` counts the TLS handshakes clients began (the SNI each sent: a client that
gives up on the certificate never makes a request, so requests cannot be counted)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed_pem(directory: Path, host: str = "localhost") -> Path:
    """A self-signed certificate and its key for `host`, in one PEM file."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    cert = (x509.CertificateBuilder(subject_name=name, issuer_name=name, public_key=key.public_key(), serial_number=1,
                                    not_valid_before=now - datetime.timedelta(hours=1),
                                    not_valid_after=now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(key, hashes.SHA256()))
    path = directory / "origin.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return path


class UntrustedOrigin:
    """`await start()`, then `url(path)` is `https://localhost:PORT/path`; every path answers 404
    (no client that checks certificates gets that far)."""

    def __init__(self, directory: Path):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(self_signed_pem(directory))
        self.handshakes: list[str | None] = []
        self.ctx.sni_callback = lambda _sock, name, _ctx: self.handshakes.append(name)
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        async def nothing(_request: web.Request) -> web.Response:
            return web.Response(status=404)

        app.router.add_route("*", "/{path:.*}", nothing)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001

    def url(self, path: str) -> str:
        return f"https://localhost:{self.port}/{path.lstrip('/')}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
