"""Node identity: an Ed25519 key in `identity.key` (0600); node id = hex sha256(raw public key).

Loading is file I/O plus one key parse (well under a millisecond); `async_load_or_create_identity`
still runs it in an executor so the loop never touches the disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from node.datadir import cannot_read, keep_private, present, read_data_file, write_atomic
from node.errors import NodeError
from node.logs import kv

log = logging.getLogger(__name__)

IDENTITY_KEY_FILE = "identity.key"
SHORT_ID_LEN = 8


def node_id_for_public_key(raw_public_key: bytes) -> str:
    """Node id of a raw 32-byte Ed25519 public key: hex sha256."""
    return hashlib.sha256(raw_public_key).hexdigest()


def short_id(node_id: str) -> str:
    """The 8-hex short form used in logs, headers and tables."""
    return node_id[:SHORT_ID_LEN]


def is_node_id(value: object) -> bool:
    """True for a 64-char lowercase hex string."""
    if not isinstance(value, str) or len(value) != 64:
        return False
    return all(c in "0123456789abcdef" for c in value)


@dataclass(frozen=True)
class Identity:
    """This node's key pair and the ids derived from it."""

    private_key: ed25519.Ed25519PrivateKey = field(repr=False)
    public_key_raw: bytes
    node_id: str
    path: Path | None = None

    @property
    def short_id(self) -> str:
        """First 8 hex chars of the node id."""
        return short_id(self.node_id)

    @classmethod
    def from_private_key(cls, key: ed25519.Ed25519PrivateKey, path: Path | None = None) -> Identity:
        """Wrap an existing key."""
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(private_key=key, public_key_raw=raw, node_id=node_id_for_public_key(raw), path=path)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh in-memory identity (tests, throwaway peers)."""
        return cls.from_private_key(ed25519.Ed25519PrivateKey.generate())

    def private_pem(self) -> bytes:
        """PKCS#8 PEM of the private key (what `identity.key` holds)."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature of data."""
        return self.private_key.sign(data)


def verify_signature(raw_public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True when signature is a valid Ed25519 signature of data under the raw public key."""
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(raw_public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write a file created 0600 from the start (never briefly world-readable), whole or not at all."""
    write_atomic(path, data, private=True)


def load_or_create_identity(data_dir: Path) -> Identity:
    """Read `identity.key` from the data dir, creating it (0600) on first run. Blocking."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / IDENTITY_KEY_FILE
    if present(path):  # (a folder, a link to nothing there is said, not taken for no identity)
        try:
            data = read_data_file(path)
        except OSError as exc:  # not this user's to read: said as a read (it was "cannot write"), kept
            raise NodeError(cannot_read(path, exc), code="identity_unreadable") from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise NodeError(f"{path}: not a readable identity key ({exc}); move it away to start "
                            "with a new identity", code="identity_unreadable") from exc
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise NodeError(f"{path}: identity key is not Ed25519", code="identity_unreadable")
        keep_private(path)
        identity = Identity.from_private_key(key, path)
        log.info("DIAG: identity key loaded from disk %s", kv(path=path, node_id=identity.short_id))
        return identity
    identity = Identity.from_private_key(ed25519.Ed25519PrivateKey.generate(), path)
    write_private_bytes(path, identity.private_pem())
    log.info("DIAG: identity key created %s", kv(path=path, node_id=identity.short_id))
    return identity


async def async_load_or_create_identity(data_dir: Path) -> Identity:
    """`load_or_create_identity` off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, load_or_create_identity, data_dir)
