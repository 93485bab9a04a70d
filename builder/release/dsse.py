"""DSSE envelopes (https://github.com/secure-systems-lab/dsse) signed with ed25519 keys (`cryptography`).

Keys are PEM files: PKCS#8 private key (written mode 0600, never printed) and SubjectPublicKeyInfo
public key.  The key ID is the sha256 of the raw 32-byte public key.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from builder.core.errors import BadInput

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class SignatureError(Exception):
    """An envelope whose signature does not verify with the given key."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: 'DSSEv1 <len> <type> <len> <body>'."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def keygen(private_path: Path, public_path: Path) -> str:
    """Write a new ed25519 key pair; the private key file is created mode 0600.  Returns the key ID."""
    if private_path.exists():
        raise BadInput(f"{private_path}: exists; refusing to overwrite a signing key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.chmod(private_path, 0o600)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the signing key: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise BadInput(f"{path}: expected an unencrypted PEM ed25519 private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadInput(f"{path}: expected an ed25519 private key, got {type(key).__name__}")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the public key: {exc.strerror}") from None
    except ValueError:
        raise BadInput(f"{path}: expected a PEM ed25519 public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadInput(f"{path}: expected an ed25519 public key, got {type(key).__name__}")
    return key


def sign(statement: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE envelope of a JSON statement."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key_id(key.public_key()), "sig": base64.b64encode(sig).decode()}]}


def open_envelope(envelope: dict[str, Any], key: Ed25519PublicKey) -> dict[str, Any]:
    """The statement inside an envelope, once one of its signatures verifies with `key`."""
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        kind = envelope["payloadType"]
        sigs = [base64.b64decode(s["sig"], validate=True) for s in envelope["signatures"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SignatureError(f"not a DSSE envelope ({type(exc).__name__}: {exc})") from None
    if kind != PAYLOAD_TYPE:
        raise SignatureError(f"payloadType {kind!r}, expected {PAYLOAD_TYPE}")
    for sig in sigs:
        try:
            key.verify(sig, pae(kind, payload))
        except InvalidSignature:
            continue
        try:
            statement = json.loads(payload)
        except ValueError:
            raise SignatureError("signed payload is not JSON") from None
        if not isinstance(statement, dict):
            raise SignatureError("signed payload is not a JSON object")
        return statement
    raise SignatureError(f"no signature verifies with key {key_id(key)[:16]}")
