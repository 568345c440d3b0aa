"""Identity on disk and the certificate-based identity check."""

from __future__ import annotations

import hashlib
import stat

import pytest

from node.errors import NodeError, PeerIdentityMismatch, ProtocolError
from node.net import Identity, load_or_create_identity, short_id
from node.net._identity import verify_signature
from node.net._tls import build_certificate, peer_node_id_from_der, verify_peer


def test_identity_is_created_0600_and_reloaded(data_dir):
    first = load_or_create_identity(data_dir)
    path = data_dir / "identity.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_identity(data_dir)
    assert again.node_id == first.node_id
    assert first.node_id == hashlib.sha256(first.public_key_raw).hexdigest()
    assert first.short_id == first.node_id[:8] == short_id(first.node_id)


def test_loose_permissions_are_tightened(data_dir):
    load_or_create_identity(data_dir)
    path = data_dir / "identity.key"
    path.chmod(0o644)
    load_or_create_identity(data_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_unreadable_key_is_a_clear_error(data_dir):
    (data_dir / "identity.key").write_text("garbage")
    with pytest.raises(NodeError, match="identity key"):
        load_or_create_identity(data_dir)


def test_identity_logs_loaded_from_disk(data_dir, caplog):
    load_or_create_identity(data_dir)
    with caplog.at_level("INFO"):
        load_or_create_identity(data_dir)
    assert "DIAG: identity key loaded from disk path=" in caplog.text


def test_signatures():
    ident = Identity.generate()
    sig = ident.sign(b"data")
    assert verify_signature(ident.public_key_raw, sig, b"data")
    assert not verify_signature(ident.public_key_raw, sig, b"other")


def test_certificate_proves_the_node_id():
    ident = Identity.generate()
    assert peer_node_id_from_der(build_certificate(ident)) == ident.node_id


def test_garbage_certificate_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        peer_node_id_from_der(b"not a certificate")


class _FakeSsl:
    def __init__(self, der):
        self.der = der

    def getpeercert(self, binary_form=False):
        return self.der


def test_verify_peer_checks_the_expected_id():
    ident, other = Identity.generate(), Identity.generate()
    der = build_certificate(ident)
    assert verify_peer(_FakeSsl(der), ident.node_id) == ident.node_id
    assert verify_peer(_FakeSsl(der), None) == ident.node_id
    with pytest.raises(PeerIdentityMismatch):
        verify_peer(_FakeSsl(der), other.node_id)
    with pytest.raises(ProtocolError, match="different certificate"):
        verify_peer(_FakeSsl(der), None, announced_cert=build_certificate(other))
