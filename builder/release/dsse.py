"""DSSE envelopes (https://github.com/secure-systems-lab/dsse) signed with ed25519 or ECDSA P-256 keys
(`cryptography`).

Keys are PEM files: PKCS#8 private key (written mode 0600, never printed; `ENCRYPTED PRIVATE KEY` with a
passphrase from BUILDER_KEY_PASSPHRASE or its _FILE) and SubjectPublicKeyInfo public key. The key ID of an
ed25519 key is the sha256 of its raw 32-byte public key; of a P-256 key, the sha256 of its DER
SubjectPublicKeyInfo. P-256 signatures are ECDSA over SHA-256, DER-encoded (as cosign writes them).
Cosign's own encrypted key format is not read.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from builder.core.errors import BadInput

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PrivateKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = Ed25519PublicKey | ec.EllipticCurvePublicKey


class SignatureError(Exception):
    """An envelope whose signature does not verify with the given key."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: 'DSSEv1 <len> <type> <len> <body>'."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def key_id(public: PublicKey) -> str:
    if isinstance(public, Ed25519PublicKey):
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    else:
        raw = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(raw).hexdigest()


def keygen(private_path: Path, public_path: Path, kind: str = "ed25519", passphrase: str | None = None) -> str:
    """Write a new key pair (ed25519 or ecdsa-p256); the private key file is created mode 0600, encrypted
    (PKCS#8, best available cipher) when a passphrase is given. Returns the key ID."""
    if private_path.exists():
        raise BadInput(f"{private_path}: exists; refusing to overwrite a signing key")
    key: PrivateKey = Ed25519PrivateKey.generate() if kind == "ed25519" else ec.generate_private_key(ec.SECP256R1())
    crypt = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
             else serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, crypt)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.chmod(private_path, 0o600)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def _usable(key: object, path: Path, what: str) -> None:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise BadInput(f"{path}: expected an ed25519 or ECDSA P-256 {what}, got curve {key.curve.name}")
    elif not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
        raise BadInput(f"{path}: expected an ed25519 or ECDSA P-256 {what}, got {type(key).__name__}")


def load_private(path: Path, passphrase: str | None = None) -> PrivateKey:
    """A PEM private key; an ENCRYPTED PRIVATE KEY needs its passphrase (never from an argument: the settings')."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the signing key: {exc.strerror}") from None
    encrypted = b"ENCRYPTED PRIVATE KEY" in data
    if encrypted and not passphrase:
        raise BadInput(f"{path}: the signing key is encrypted; set BUILDER_KEY_PASSPHRASE or BUILDER_KEY_PASSPHRASE_FILE")
    try:
        key = serialization.load_pem_private_key(data, password=passphrase.encode() if encrypted and passphrase else None)
    except (ValueError, TypeError):
        raise BadInput(f"{path}: the passphrase does not open this encrypted signing key" if encrypted else
                       f"{path}: expected a PEM ed25519 or ECDSA P-256 private key") from None
    _usable(key, path, "private key")
    assert isinstance(key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey)
    return key


def load_public(path: Path) -> PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the public key: {exc.strerror}") from None
    except ValueError:
        raise BadInput(f"{path}: expected a PEM ed25519 or ECDSA P-256 public key") from None
    _usable(key, path, "public key")
    assert isinstance(key, Ed25519PublicKey | ec.EllipticCurvePublicKey)
    return key


def _sign_bytes(key: PrivateKey, data: bytes) -> bytes:
    return key.sign(data) if isinstance(key, Ed25519PrivateKey) else key.sign(data, ec.ECDSA(hashes.SHA256()))


def _verify_bytes(key: PublicKey, sig: bytes, data: bytes) -> None:
    if isinstance(key, Ed25519PublicKey):
        key.verify(sig, data)
    else:
        key.verify(sig, data, ec.ECDSA(hashes.SHA256()))


def sign(statement: dict[str, Any], key: PrivateKey) -> dict[str, Any]:
    """The DSSE envelope of a JSON statement."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    sig = _sign_bytes(key, pae(PAYLOAD_TYPE, payload))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key_id(key.public_key()), "sig": base64.b64encode(sig).decode()}]}


def open_envelope(envelope: dict[str, Any], key: PublicKey) -> dict[str, Any]:
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
            _verify_bytes(key, sig, pae(kind, payload))
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
