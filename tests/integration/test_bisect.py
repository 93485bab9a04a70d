"""`builder bisect` on the demo stack: tinyrl PR 42's series (s3 does not build, s5 plants the defect) named
exactly under Docker, after an interrupt (exit 130), a resume killed (SIGKILL) after one step and a second resume;
nothing it built is left tagged, the killed process's names included. Then GOOD as a report whose
commit no longer resolves: checked on its stored image, the force-push range said, --max-steps running out (exit
1). One series, builds of the verl layer and after only (the other layers cached), only the zero_update gate.
(BAD passing, exit 1: tests/unit/test_bisect_cases.py.)

Over 60 s (57 s to 131 s on this shared 2-core host, by its load): seven builds of the verl layer and after (BAD, GOOD, four
steps, BAD again: cached) and seven zero_update runs are the fewest that show a skipped build, the exact commit, a
resume and GOOD on its stored image."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pygit2
import pytest

from builder.core.options import Settings
from builder.engine import client as engine
from demo.prepare import variant_pins
from tests.fixture_types import DemoImage, DockerClient
from tests.shared import local_tags

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def bisect_argv(good: Path, bad: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "builder.cli", "bisect", str(good), str(bad), "--gate", "zero_update",
            "--out", str(out), "--json", str(out / "answer.json")]


def until_a_step(argv: list[str], log: Path, sig: signal.Signals) -> tuple[int, str]:
    """Run a bisect until it prints a search step's line, then send it `sig`: (its exit code, its output)."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                # SIGINT at its default in the child: a job started in the background (nohup,
                                # `cmd &` in a script, as CI runs) inherits it ignored, and Python then installs
                                # no handler: the interrupt would be lost and the bisect run to its end
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 300
        while "bisect: verl" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        proc.send_signal(sig)
        return proc.wait(120), log.read_text()


def series(bad: Path) -> dict[str, str]:
    """s1..s6 of demo PR 42 by their subjects' first word and position (oldest first)."""
    repo = pygit2.Repository(str(bad.parent / "demo-stack" / "tinyrl.git"))
    head = repo.references["refs/pull/42/head"].resolve().target
    shas = []
    for _ in range(6):
        shas.append(str(head))
        head = repo[head].parent_ids[0]
    return {f"s{6 - i}": sha for i, sha in enumerate(shas)}


def test_bisect_names_the_planted_commit_after_an_interrupt_and_resume(demo_pins: Path, demo_image: DemoImage,
                                                                      tmp_path: Path, docker_client: DockerClient
                                                                      ) -> None:
    good = variant_pins(tmp_path / "good", pins_path=demo_pins)
    bad = variant_pins(tmp_path / "bad", "verl", 42, pins_path=demo_pins)
    out = tmp_path / "out"
    first = until_a_step(bisect_argv(good, bad, out), tmp_path / "first.log", signal.SIGINT)
    assert first[0] == 130, first[1][-2000:]
    state = json.loads((out / "bisect-state.json").read_text())
    done = len(state["steps"])
    assert done >= 3 and [s["why"] for s in state["steps"][:2]] == ["BAD", "GOOD"]
    client = engine.connect(Settings.from_env())
    # resumed, then killed (SIGKILL: no clean-up) after its next step: its local names stay until the next run
    killed = until_a_step(bisect_argv(good, bad, out), tmp_path / "killed.log", signal.SIGKILL)
    if killed[0] == -signal.SIGKILL:  # (not when the search had ended before the kill)
        assert [t for t in local_tags(client) if state["run_id"] in t], killed[1][-2000:]
        assert len(json.loads((out / "bisect-state.json").read_text())["steps"]) > done

    again = subprocess.run(bisect_argv(good, bad, out), cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ))
    assert again.returncode == 0, again.stderr[-2000:]
    s = series(bad)
    answer = json.loads((out / "answer.json").read_text())
    assert answer["first_bad"]["commit"] == s["s5"] and answer["first_bad"]["component"] == "verl"
    assert answer["first_bad"]["pr"] == 42 and answer["first_bad"]["gate"] == "zero_update"
    assert answer["first_bad"]["subject"] == "main_ppo: old_log_prob from the plain forward (simpler)"
    assert answer["last_good"]["commit"] == s["s4"] and answer["skipped"] == [s["s3"]]
    assert answer["builds"] <= answer["bound"] == 6  # ceil(log2 6) + 1 skipped + GOOD and BAD
    assert f"first bad: verl {s['s5']}" in again.stdout
    assert "bisect: BAD" not in again.stderr  # resumed: the steps before the interrupt are not built again
    assert (out / "first-bad.yaml").is_file() and (Path(answer["replay"])).is_file()
    assert not [t for t in local_tags(client) if state["run_id"] in t]  # the killed process's names too

    # GOOD as a report whose verl commit no longer resolves (gone from the mirror): checked on its stored image;
    # the range is then BAD's PR commits since the merge-base, said; --max-steps 2 (BAD, GOOD) runs out: exit 1
    good_step = next(st for st in state["steps"] if st["why"] == "GOOD")
    report = json.loads((Path(good_step["run_dir"]) / "report.json").read_text())
    report["sources"]["components"]["verl"]["commit"] = "0" * 40
    report["image_id"] = demo_image[3].image_id  # GOOD's commits' image, kept (the step's went with its local name)
    gone = tmp_path / "gone" / "report.json"
    gone.parent.mkdir()
    gone.write_text(json.dumps(report))
    left = subprocess.run([*bisect_argv(gone, bad, tmp_path / "left")[:-2], "--max-steps", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert left.returncode == 1, left.stderr[-2000:]
    assert f"its stored image {report['image_id'][:19]}" in left.stderr
    assert "is not an ancestor of BAD's (a force-push?)" in left.stderr
    assert "--max-steps 2: ran out; left: verl: first bad commit among" in left.stderr
    steps = json.loads((tmp_path / "left" / "bisect-state.json").read_text())["steps"]
    assert [(st["why"], st["verdict"]) for st in steps] == [("BAD", "bad"), ("GOOD", "good")]
