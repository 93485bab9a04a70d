"""Verification by trusted key, on the real registry (127.0.0.1:5000, one repository per test): others'
envelopes (a third party, an attacker's tampered copy, a replay) never break `builder verify`; several keys;
publish is idempotent per key; three publishers of one digest each verify and name the other two."""
import base64
import copy
import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.core.constants import LABEL_PREFIX
from builder.core.records import Report
from builder.engine.registry import Registry, push_blob, put_manifest
from builder.lock import record as lock_record
from builder.pins.model import Pins
from builder.release import attest, dsse, referrers
from tests.fixture_types import MakeReportInputs

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "pins" / "demo.yaml"
HOST = "127.0.0.1:5000"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
pytestmark = pytest.mark.docker
Keys = dict[str, tuple[dsse.PrivateKey, dsse.PublicKey, Path]]  # name -> (private, public, public key path)
Image = tuple[Registry, str, str]  # (registry, repository name, digest)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "BUILDER_SIGNING_KEY"})


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """Publishers a, b, c and an attacker x: {name: (private, public, public key path)}."""
    d = tmp_path_factory.mktemp("trust-keys")
    out: Keys = {}
    for k in "abcx":
        dsse.keygen(d / f"{k}.pem", d / f"{k}.pub")
        out[k] = (dsse.load_private(d / f"{k}.pem"), dsse.load_public(d / f"{k}.pub"), d / f"{k}.pub")
    return out


def kid(keys: Keys, k: str) -> str:
    return dsse.key_id(keys[k][1])[:16]


@pytest.fixture(scope="module")
def report(report_inputs: MakeReportInputs) -> Report:
    """An ACCEPTED report of pins/demo.yaml whose recorded sha256 is the file's (as a real run records it)."""
    from builder.report import document as report_mod

    pins, sources, built, result = report_inputs()
    pins._path = PINS
    sources = sources.model_copy(update={"pins_path": str(PINS),
                                         "pins_sha256": hashlib.sha256(PINS.read_bytes()).hexdigest()})
    return report_mod.make_report(pins, lock_record.of(pins), sources, built, result)


def delivery_manifest(report: Report) -> dict[str, Any]:
    comps = {name: {"distribution": f"dist-{name}", "version": "1.0", "commit": c.commit, "tree": c.tree,
                    "url": c.url} for name, c in report.sources.components.items()}
    dists = {f"dist-{name}": "1.0" for name in comps} | {"torch": "2.13.0+cpu"}
    return {"components": comps, "distributions": dists}


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(data), 946684800
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def image(report: Report, request: pytest.FixtureRequest) -> Iterator[Image]:
    """A small image pushed by hand to a repository of its own: labels and /opt/delivery/manifest.json as a
    build writes them.  (registry, repository name, digest)."""
    reg = Registry(HOST)
    name = f"test/trust-{request.node.name[5:30].replace('_', '-').strip('-')}-{secrets.token_hex(4)}".lower()
    manifest = delivery_manifest(report)
    labels = {f"{LABEL_PREFIX}.{n}.commit": c["commit"] for n, c in manifest["components"].items()}
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layer = layer_tar({"opt/delivery/manifest.json": json.dumps(manifest).encode()})
    body: dict[str, Any] = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": push_blob(reg, name, config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": push_blob(reg, name, layer), "size": len(layer)}]}
    data = json.dumps(body).encode()
    put_manifest(reg, name, "demo", data, body["mediaType"])
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    yield reg, name, digest
    for desc in referrers.discover(reg, name, digest):
        reg.delete_manifest(name, desc["digest"])
    index = reg.tag_digest(name, referrers.fallback_tag(digest))
    if index:
        reg.delete_manifest(name, index)
    reg.delete_manifest(name, digest)


def publish(report: Report, image: Image, key: dsse.PrivateKey, once: bool = False) -> list[dict[str, Any]]:
    """What `builder publish` does after the tags verify: attach the three signed statements."""
    reg, name, digest = image
    pins = report_pins()
    return attest.attach_all(report, pins, lock_record.of(pins), f"{HOST}/{name}", digest, delivery_manifest(report),
                             key, reg, once=once)


def attach(image: Image, envelope: str | bytes | dict[str, Any], kind: str) -> None:
    """Attach an envelope as anyone with push rights can."""
    reg, name, digest = image
    served = reg.manifest(name, digest)
    subject = {"mediaType": served["media_type"], "digest": digest, "size": len(served["content"])}
    data = envelope if isinstance(envelope, bytes) else json.dumps(envelope).encode()
    referrers.attach(reg, name, subject, data, kind)


def envelopes(image: Image) -> list[dict[str, Any]]:
    reg, name, digest = image
    return [referrers.fetch_envelope(reg, name, d)[1] for d in referrers.discover(reg, name, digest)]


def statement_of(envelope: dict[str, Any]) -> dict[str, Any]:
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    return statement


def verify(image: Image, keys: Keys, *names: str, all_keys: bool = False) -> subprocess.CompletedProcess[str]:
    reg, name, digest = image
    args = ["verify", f"{HOST}/{name}@{digest}"]
    for k in names:
        args += ["--key", str(keys[k][2])]
    return cli(*args, *(["--require-all-keys"] if all_keys else []))


def test_third_party_attestations_are_listed_not_fatal(report: Report, image: Image, keys: Keys) -> None:
    publish(report, image, keys["a"][0])
    publish(report, image, keys["x"][0])  # someone else's key signs the same digest
    done = verify(image, keys, "a")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok  signature: 3 envelopes verify with key " + kid(keys, "a") in done.stdout
    assert f"untrusted: 3 envelopes (key IDs {kid(keys, 'x')})" in done.stdout
    assert done.stdout.strip().endswith("VERIFIED " + f"{HOST}/{image[1]}@{image[2]}")


def test_only_untrusted_envelopes_fail_naming_them(report: Report, image: Image, keys: Keys) -> None:
    publish(report, image, keys["x"][0])
    done = verify(image, keys, "a")
    assert done.returncode == 1
    assert done.stdout.startswith(f"FAILED signature: none of the 3 envelopes verifies with key {kid(keys, 'a')} for"
                                  f" this digest; untrusted: 3 envelopes (key IDs {kid(keys, 'x')})"), done.stdout


def test_tampered_copy_and_replay_are_set_aside(report: Report, image: Image, keys: Keys, tmp_path: Path) -> None:
    publish(report, image, keys["a"][0])
    prov = next(e for e in envelopes(image) if statement_of(e)["predicateType"] == attest.PROVENANCE_TYPE)
    stmt = statement_of(prov)  # the attacker's copy: an edited commit under a's key ID and signature
    stmt["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]["gitCommit"] = "0" * 40
    attach(image, dict(prov, payload=base64.b64encode(json.dumps(stmt).encode()).decode()), attest.PROVENANCE_TYPE)
    replay = copy.deepcopy(statement_of(prov))  # a's genuine envelope for another image, attached to this one
    replay["subject"][0]["digest"]["sha256"] = "0" * 64
    attach(image, dsse.sign(replay, keys["a"][0]), attest.PROVENANCE_TYPE)
    attach(image, "not an envelope", attest.SBOM_TYPE)  # junk is set aside as well
    attach(image, b"\xff not JSON", attest.SBOM_TYPE)
    done = verify(image, keys, "a")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"untrusted: 3 envelopes (key IDs {kid(keys, 'a')} (bad signature), none, unreadable)" in done.stdout
    assert "ignored: 1 envelopes signed by a trusted key for another subject (sha256:000000000000)" in done.stdout


def test_a_trusted_envelope_still_gets_every_check(report: Report, image: Image, keys: Keys) -> None:
    publish(report, image, keys["a"][0])
    result = next(e for e in envelopes(image) if statement_of(e)["predicateType"] == attest.TEST_RESULT_TYPE)
    stmt = statement_of(result)
    stmt["predicate"]["result"], stmt["predicate"]["failedTests"] = "FAILED", ["rl_step"]
    attach(image, dsse.sign(stmt, keys["a"][0]), attest.TEST_RESULT_TYPE)
    done = verify(image, keys, "a")
    assert done.returncode == 1 and done.stdout.startswith("FAILED test result: result is 'FAILED'"), done.stdout


def test_two_legitimate_keys(report: Report, image: Image, keys: Keys) -> None:
    publish(report, image, keys["a"][0])
    done = verify(image, keys, "a", "b")  # any of them trusted
    assert done.returncode == 0, done.stdout + done.stderr
    done = verify(image, keys, "a", "b", all_keys=True)
    assert done.returncode == 1
    assert done.stdout.startswith(f"FAILED predicates: missing {', '.join(attest.PREDICATE_TYPES)} (key "
                                  f"{kid(keys, 'b')} signed for {image[2]})"), done.stdout
    publish(report, image, keys["b"][0])
    done = verify(image, keys, "a", "b", all_keys=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok  predicates: each of the 2 keys signed all three" in done.stdout
    assert "ok  signature: 6 envelopes verify with key " + ", ".join(sorted([kid(keys, "a"), kid(keys, "b")])) \
        in done.stdout and "untrusted" not in done.stdout


def test_republish_by_the_same_key_attaches_nothing_new(report: Report, image: Image, keys: Keys) -> None:
    reg, name, digest = image
    first = publish(report, image, keys["a"][0])
    later = report.model_copy(update={"created": "2027-01-01T00:00:00Z"})  # a later run: new times, new SBOM serial
    again = publish(later, image, keys["a"][0])
    assert len(referrers.discover(reg, name, digest)) == 3
    assert sorted(d["digest"] for d in again) == sorted(d["digest"] for d in first)
    # another key is another publisher: it attaches its own
    publish(report, image, keys["b"][0])
    assert len(referrers.discover(reg, name, digest)) == 6
    # a changed claim is new: the test result with one gate warned is attached, once=True (nightly) attaches nothing
    warned = report.model_copy(update={"gates": [g.model_copy(update={"status": "inconclusive"})
                                                 if g.name == "control" else g for g in report.gates]})
    assert len(publish(warned, image, keys["a"][0], once=True)) == 3
    assert len(referrers.discover(reg, name, digest)) == 6
    publish(warned, image, keys["a"][0])
    assert len(referrers.discover(reg, name, digest)) == 7


def test_three_publishers_each_verify_and_name_the_other_two(report: Report, image: Image, keys: Keys) -> None:
    for k in "abc":
        publish(report, image, keys[k][0])
    for k in "abc":
        done = verify(image, keys, k)
        print(f"$ builder verify {HOST}/{image[1]}@{image[2]} --key {k}.pub\n{done.stdout}")
        assert done.returncode == 0, done.stdout + done.stderr
        others = sorted(kid(keys, o) for o in "abc" if o != k)
        assert f"untrusted: 6 envelopes (key IDs {', '.join(others)})" in done.stdout
        assert f"verify with key {kid(keys, k)}" in done.stdout


def test_stable_statement_ignores_only_the_volatile_fields(report: Report) -> None:
    from builder.release import sbom

    manifest = delivery_manifest(report)
    one = attest.statements(report, report_pins(), lock_record.of(report_pins()), manifest, f"{HOST}/x", "sha256:" + "1" * 64)
    later = report.model_copy(update={"created": "2027-01-01T00:00:00Z"})
    two = attest.statements(later, report_pins(), lock_record.of(report_pins()), manifest, f"{HOST}/x", "sha256:" + "1" * 64)
    assert [attest.stable(s) for s in one] == [attest.stable(s) for s in two]
    assert one[0] != two[0] and one[1]["predicate"]["serialNumber"] != two[1]["predicate"]["serialNumber"]
    other = attest.statements(report, report_pins(), lock_record.of(report_pins()),
                              {**manifest, "distributions": {"torch": "2.0"}}, f"{HOST}/x", "sha256:" + "1" * 64)
    assert attest.stable(other[1]) != attest.stable(one[1]) and sbom.PREDICATE_TYPE == other[1]["predicateType"]


def report_pins() -> Pins:
    from builder.pins import model as pins_mod

    return pins_mod.load(PINS)
