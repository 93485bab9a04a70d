"""The build's BUILD-ENV record (about 5 KB of mountinfo) goes to the build log and the report (build.isolation),
not the console: the console gets one line naming it and its size."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.engine import client as engine
from builder.image import build

RECORD = '{"net": ["lo"], "mountinfo": ["' + "m" * 5000 + '"]}'


def test_the_build_env_record_goes_to_the_log_not_the_console(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "build.log"
    with open(log_path, "w") as log_file:
        progress = engine._Progress(log_file, echo=True, records=(build.MARKER,))
        for chunk in ("Step 1/1 : RUN [\"smoke\"]\n", build.MARKER + RECORD + "\n", "done\n"):
            progress.chunk({"stream": chunk})
        progress.finish()
    err = capsys.readouterr().err
    assert "m" * 100 not in err and f"BUILD-ENV record ({len(build.MARKER + RECORD)} bytes): in the build log" in err
    assert "Step 1/1" in err and "done" in err
    assert build.MARKER + RECORD in log_path.read_text()
    assert build.build_env(progress.steps) == json.loads(RECORD)  # what the report's build.isolation is made from
