"""A repository is parsed once where it enters (the pins, a report, an image's label) into a `Repository` value
(builder/core/imageref.py: host, and path as the registry's API names it) and passed down; nothing below splits the
text again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.errors import PublishError
from builder.core.imageref import ImageRef, Repository
from builder.core.records import PublishReceipt, Report
from builder.engine.registry import parse_repository, split_repository
from builder.pins import model as pins_mod
from builder.release import publish
from builder.report import document
from tests.unit.test_evidence_types import CURRENT, STORED

ROOT = Path(__file__).resolve().parents[2]


def test_a_repository_is_its_text_with_host_and_path() -> None:
    repo = Repository("127.0.0.1:5000/demo/unified")
    assert (str(repo), repo.host, repo.path) == ("127.0.0.1:5000/demo/unified", "127.0.0.1:5000", "demo/unified")
    assert Repository("docker.io/ubuntu").path == "library/ubuntu"  # Docker Hub's bare names
    assert Repository.of(ImageRef("127.0.0.1:5000/demo/unified:v1@sha256:" + "a" * 64)) == repo
    for bad, why in (("demo/unified", "registry host"), ("127.0.0.1:5000/demo/unified:v1", "no tag")):
        with pytest.raises(ValueError, match=why):
            Repository(bad)


def test_a_value_passes_down_without_being_parsed_again() -> None:
    repo = Repository("127.0.0.1:5000/demo/unified")
    assert parse_repository(repo) is repo  # the value itself, not a new parse of its text
    assert split_repository("127.0.0.1:5000/demo/unified") == ("127.0.0.1:5000", "demo/unified")
    with pytest.raises(PublishError, match="image.repository 'demo': expected host"):
        parse_repository("demo")


def test_the_pins_and_a_stored_report_hold_the_value() -> None:
    assert isinstance(pins_mod.load(ROOT / "pins" / "demo.yaml").image.repository, Repository)
    for stored in (STORED, CURRENT):
        report = document.load(stored)
        assert isinstance(report.repository, Repository) and report.repository.host == "127.0.0.1:5000"
        assert report.publish is None or isinstance(report.publish.repository, Repository)
        assert json.loads(report.model_dump_json())["repository"] == json.loads(stored.read_text())["repository"]


def test_a_report_naming_no_repository_loads_and_publish_refuses_it_in_one_line() -> None:
    report = Report.model_validate({**json.loads(CURRENT.read_text()), "repository": "unknown"})
    assert report.repository == "unknown"
    with pytest.raises(PublishError, match=r"^r\.json: the report names no repository or tags$"):
        publish.repository_of(report, "r.json")
    assert publish.repository_of(document.load(CURRENT), "r.json").path == "demo/unified"
    receipt = PublishReceipt.model_validate({"repository": "127.0.0.1:5000/demo/unified", "tags": [], "digest": "d",
                                             "config_digest": "c", "verified": True, "pushed_at": "t"})
    assert isinstance(receipt.repository, Repository)
