"""Signing keys as release hosts keep them: PKCS#8 encrypted with a passphrase from the settings, ECDSA P-256
beside ed25519 (ed25519 key IDs unchanged), and `run`/`publish` refusing an unreadable key before any step."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from builder import cli
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.release import dsse

ROOT = Path(__file__).resolve().parents[2]
STATEMENT = {"_type": "https://in-toto.io/Statement/v1", "subject": []}


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa-p256"])
def test_encrypted_key_signs_and_verifies(tmp_path: Path, kind: str) -> None:
    kid = dsse.keygen(tmp_path / "k.pem", tmp_path / "k.pub", kind, passphrase="correct horse")
    assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / "k.pem").read_bytes()
    key = dsse.load_private(tmp_path / "k.pem", "correct horse")
    public = dsse.load_public(tmp_path / "k.pub")
    assert dsse.open_envelope(dsse.sign(STATEMENT, key), public) == STATEMENT and dsse.key_id(public) == kid
    with pytest.raises(BadInput, match=r"k.pem: the passphrase does not open this encrypted signing key$"):
        dsse.load_private(tmp_path / "k.pem", "wrong")
    with pytest.raises(BadInput, match="encrypted; set BUILDER_KEY_PASSPHRASE"):
        dsse.load_private(tmp_path / "k.pem")


def test_key_ids_ed25519_unchanged_and_p256_of_its_der(tmp_path: Path) -> None:
    dsse.keygen(tmp_path / "e.pem", tmp_path / "e.pub")
    ed = dsse.load_public(tmp_path / "e.pub")
    raw = ed.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert dsse.key_id(ed) == hashlib.sha256(raw).hexdigest()
    dsse.keygen(tmp_path / "p.pem", tmp_path / "p.pub", "ecdsa-p256")
    p256 = dsse.load_public(tmp_path / "p.pub")
    der = p256.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert dsse.key_id(p256) == hashlib.sha256(der).hexdigest()
    envelope = dsse.sign(STATEMENT, dsse.load_private(tmp_path / "p.pem"))
    with pytest.raises(dsse.SignatureError):  # planted: the other key does not verify it
        dsse.open_envelope(envelope, ed)


def test_passphrase_comes_from_env_or_file(tmp_path: Path) -> None:
    (tmp_path / "pass").write_text("from-file\n")
    assert Settings.from_env({"BUILDER_KEY_PASSPHRASE_FILE": str(tmp_path / "pass")}).key_passphrase == "from-file"
    assert Settings.from_env({"BUILDER_KEY_PASSPHRASE": "env"}).key_passphrase == "env"
    (tmp_path / "empty").write_text("")
    with pytest.raises(BadInput, match="BUILDER_KEY_PASSPHRASE_FILE: .*empty"):
        Settings.from_env({"BUILDER_KEY_PASSPHRASE_FILE": str(tmp_path / "empty")})


def test_run_with_a_wrong_passphrase_stops_before_any_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BUILDER_KEY_PASSPHRASE", "right")
    assert cli.run(["keygen", str(tmp_path / "k.pem"), "--encrypt", "--ecdsa"]) == 0
    monkeypatch.setenv("BUILDER_KEY_PASSPHRASE", "wrong")
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    code = cli.run(["run", str(ROOT / "pins" / "demo.yaml"), "--publish", "--key", str(tmp_path / "k.pem"),
                    "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].endswith("k.pem: the passphrase does not open this encrypted signing key")
    assert not (tmp_path / "out").exists()
