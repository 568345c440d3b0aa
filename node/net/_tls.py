"""TLS 1.3 with mutual authentication by self-certifying identity (the libp2p-TLS idea).

Each node presents a self-signed X.509 certificate for its Ed25519 identity key. OpenSSL does all
the crypto; what it cannot do by itself is accept an arbitrary self-signed certificate, and the
stdlib `ssl` module offers no verify callback. So:

- Client side: `CERT_NONE`, then after the handshake the peer certificate's key must hash to the
  node id we dialled (`peer_node_id_from_der`). TLS 1.3's CertificateVerify has already proven the
  server holds that key.
- Server side: the dialler announces its certificate in the plaintext preamble; the server adds it
  as a trust anchor and requires a client certificate (`CERT_REQUIRED`), so OpenSSL checks that the
  client presents that exact certificate and proves possession of its key. Trusting more anchors
  never lets anyone impersonate another node: the identity is read from the leaf certificate's key
  afterwards, and only the holder of a key can present a certificate for it. The anchor store is
  rebuilt when it grows past `TLS_MAX_TRUST_ANCHORS` (junk certificates cannot grow it forever).

The certificate is rebuilt at every start (one Ed25519 signature); it is written next to the
key as `identity.crt` because `SSLContext.load_cert_chain` only reads files.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node import const
from node.datadir import write_atomic
from node.errors import PeerIdentityMismatch, ProtocolError

from ._identity import Identity, node_id_for_public_key, short_id, write_private_bytes

log = logging.getLogger(__name__)

CERT_FILE = "identity.crt"
# Fixed validity far on both sides: peers' clocks may be wrong and the cert is regenerated anyway.
_NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)


def build_certificate(identity: Identity) -> bytes:
    """DER of a self-signed certificate for the identity key (CN = node id)."""
    key = identity.private_key
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.node_id)])
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(_NOT_BEFORE)
        .not_valid_after(_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, None)
    )
    return cert.public_bytes(serialization.Encoding.DER)


def peer_node_id_from_der(der: bytes) -> str:
    """Node id proven by a peer certificate: hex sha256 of its raw Ed25519 public key."""
    try:
        cert = x509.load_der_x509_certificate(der)
        public = cert.public_key()
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"peer certificate is not readable: {exc}") from exc
    if not isinstance(public, ed25519.Ed25519PublicKey):
        raise ProtocolError("peer certificate key is not Ed25519")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return node_id_for_public_key(raw)


def _base_context(protocol: int, cert_path: Path, key_path: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(cert_path), str(key_path))
    return ctx


class TlsConfig:
    """The client context and the (anchor-accumulating) server context for one identity."""

    def __init__(self, identity: Identity, cert_dir: Path):
        self.identity = identity
        self.cert_der = build_certificate(identity)
        self.cert_path = cert_dir / CERT_FILE
        # An in-memory identity (tests, throwaway peers) gets its own key file, never identity.key.
        self.key_path = identity.path or cert_dir / f"ephemeral-{identity.short_id}.key"
        self._anchors: set[bytes] = set()
        self._server: ssl.SSLContext | None = None
        self._client: ssl.SSLContext | None = None

    def write_files(self) -> None:
        """Write identity.crt (and identity.key when the identity is in-memory only). Blocking.
        The certificate is the same bytes at every start (fixed dates, deterministic signature): a
        file that holds them is left alone; another (none, or one a crash cut short) is replaced
        whole (it was rewritten in place: a full disk or a crash mid-write left it cut short). A
        failed write is an OSError naming identity.crt: the start says it as any data-dir file's
        (datadir.data_dir_error)."""
        self.cert_path.parent.mkdir(parents=True, exist_ok=True)
        pem = x509.load_der_x509_certificate(self.cert_der).public_bytes(serialization.Encoding.PEM)
        try:
            same = self.cert_path.read_bytes() == pem
        except OSError:  # none, or unreadable (it is only made from the key: replaced; a folder there is said)
            same = False
        if not same:
            write_atomic(self.cert_path, pem)
        if self.identity.path is None:
            write_private_bytes(self.key_path, self.identity.private_pem())

    def prepare(self) -> None:
        """Write the files and build both contexts (blocking: ~ms; call from an executor)."""
        self.write_files()
        self.client_context()
        self._server = self._new_server_context()

    def _new_server_context(self) -> ssl.SSLContext:
        ctx = _base_context(ssl.PROTOCOL_TLS_SERVER, self.cert_path, self.key_path)
        ctx.verify_mode = ssl.CERT_REQUIRED
        self._anchors.clear()
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """Client context: presents our certificate; the server's is checked after the handshake."""
        if self._client is None:
            ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT, self.cert_path, self.key_path)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            self._client = ctx
        return self._client

    def server_context_for(self, peer_cert_der: bytes) -> ssl.SSLContext:
        """Server context that trusts the certificate the dialler announced (and requires it).
        Adding an anchor costs ~0.2 ms on the loop, once per certificate."""
        digest = hashlib.sha256(peer_cert_der).digest()
        if self._server is None or len(self._anchors) >= const.TLS_MAX_TRUST_ANCHORS:
            self._server = self._new_server_context()  # rare: ~2 ms on the loop
        if digest not in self._anchors:
            try:
                self._server.load_verify_locations(cadata=peer_cert_der)
            except (ssl.SSLError, ValueError) as exc:
                raise ProtocolError(f"announced certificate rejected: {exc}") from exc
            self._anchors.add(digest)
        return self._server


def verify_peer(ssl_object: ssl.SSLObject | None, expected_node_id: str | None,
                announced_cert: bytes | None = None) -> str:
    """Node id the peer proved in the handshake; raises if it is not the one expected."""
    if ssl_object is None:
        raise ProtocolError("link is not TLS")
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise ProtocolError("peer presented no certificate")
    if announced_cert is not None and der != announced_cert:
        raise ProtocolError("peer presented a different certificate than it announced")
    node_id = peer_node_id_from_der(der)
    if expected_node_id is not None and node_id != expected_node_id:
        raise PeerIdentityMismatch(
            f"peer proved node id {short_id(node_id)} but {short_id(expected_node_id)} was dialled"
        )
    return node_id
