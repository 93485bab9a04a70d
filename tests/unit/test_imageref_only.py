"""ImageRef everywhere: no hand-written image-reference split or regex, and no hand-built `sha256:` digest,
outside builder/core/imageref.py (the grammar and `digest_of` live there)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.core import imageref
from builder.core.imageref import ImageRef, by_digest, digest_of, split_digest
from builder.pins import model as pins_mod

ROOT = Path(__file__).resolve().parents[2]
PATTERNS = {
    "hand-built digest": r"[\"']sha256:[\"']\s*\+|f[\"']sha256:\{[^}]*hexdigest\(\)",
    "digest test by substring": r"[\"']@sha256:[\"']\s+in\b",
    "split on @": r"\.(?:r?partition|r?split)\(\s*[\"']@[\"']",
    "image reference regex": r"@sha256:\[0-9a-f\]",
    "digest split on ':'": r"(?:algo|hexpart)\w*\s*=\s*\w+\.(?:r?partition|r?split)\(\s*[\"']:[\"']",
}


def _sources() -> list[Path]:
    skip = {ROOT / "builder" / "core" / "imageref.py", ROOT / "builder" / "sources" / "mirror.py"}  # mirror: user@host
    return [p for p in sorted((ROOT / "builder").rglob("*.py")) if p not in skip and "scripts" not in p.parts]


@pytest.mark.parametrize("what", sorted(PATTERNS))
def test_no_hand_written_reference_handling(what: str) -> None:
    rx = re.compile(PATTERNS[what])
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _sources() for n, line in enumerate(p.read_text().splitlines(), 1)
             if rx.search(line)]
    assert found == [], f"{what}: use builder/core/imageref.py"


def test_the_patterns_catch_what_they_name() -> None:
    samples = {"hand-built digest": 'x = "sha256:" + h.hexdigest()', "digest test by substring": 'if "@sha256:" in ref:',
               "split on @": 'ref.partition("@")[2]', "image reference regex": 'r"[a-z]+@sha256:[0-9a-f]{64}"',
               "digest split on ':'": 'algo, _, hexpart = digest.partition(":")'}
    for what, line in samples.items():
        assert re.search(PATTERNS[what], line), what


def test_base_image_is_an_imageref() -> None:
    base = pins_mod.load(ROOT / "pins" / "demo.yaml").base
    assert isinstance(base.image, ImageRef)
    assert base.name == "127.0.0.1:5000/demo/base" and base.tag is None and base.digest.startswith("sha256:")


def test_digest_helpers() -> None:
    import hashlib

    assert digest_of(b"x") == digest_of(hashlib.sha256(b"x")) == "sha256:" + hashlib.sha256(b"x").hexdigest()
    assert split_digest("sha256:ab") == ("sha256", "ab") and split_digest("ab") == ("", "ab")
    ref = by_digest("127.0.0.1:5000/a/b@" + digest_of(b""))
    assert ref is not None and ref.name == "127.0.0.1:5000/a/b"
    assert by_digest("sha256:" + "a" * 64) is None and by_digest("a/b:tag") is None and by_digest("Bad Ref") is None
    assert imageref.hex_of(digest_of(b"")) == hashlib.sha256(b"").hexdigest()
