"""Long phases on the console (issue 28, item 5): a phase that writes only to its log (debootstrap, apt, a
compile, a `--quiet` build) names that log and shows at most one progress line every N seconds, with the
last `[n/m]` step count and output line."""
import re
import shutil
from pathlib import Path

import pytest

from builder.core import commands, log
from builder.core.errors import BuildFailed
from builder.engine import client as engine

LINE = re.compile(r"^    (?P<what>.+?): (?P<secs>\d+) s(?P<rest>.*) \(log (?P<log>/\S+)\)$")


def progress_lines(err: str) -> list[re.Match[str]]:
    return [m for m in map(LINE.match, err.splitlines()) if m]


def test_a_silent_host_command_shows_its_steps_and_log_at_a_bounded_rate(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    logfile = tmp_path / "compile.log"
    script = "for i in $(seq 1 20); do echo \"[$i/20] Building CXX object unit$i.o\"; sleep 0.1; done"
    commands.run_logged(["sh", "-c", script], logfile, "compile", every=0.5)
    err = capsys.readouterr().err
    assert f"    compile: writing {logfile} (progress every 0.5 s)" in err.splitlines()
    lines = progress_lines(err)
    assert 2 <= len(lines) <= 2 / 0.5 + 2, err  # about 2 s of work: a line every 0.5 s, not one per output line
    assert all(m["log"] == str(logfile) and m["what"] == "compile" for m in lines)
    counts = [int(c) for m in lines for c in re.findall(r"\[(\d+)/20\]", m["rest"])]
    assert counts == sorted(counts) and counts[-1] > counts[0], err  # the count moves on
    assert "[20/20] Building CXX object unit20.o" in logfile.read_text()  # the log has every line


def test_a_command_with_no_output_still_says_it_is_alive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands.run_logged(["sleep", "1.3"], tmp_path / "quiet.log", "make", every=0.4)
    lines = progress_lines(capsys.readouterr().err)
    assert len(lines) >= 2 and all("no output yet" in m["rest"] for m in lines)


def test_a_failing_long_command_names_the_log_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path.joinpath(*["logs-" + "d" * 60] * 5)
    deep.mkdir(parents=True)
    logfile = deep / "debootstrap-jammy.log"
    with pytest.raises(BuildFailed) as info:
        commands.run_logged(["sh", "-c", "echo 'E: Unable to locate package g++-12'; exit 100"], logfile,
                            "apt-get install", BuildFailed, every=0.2)
    err = info.value
    assert str(logfile) in str(err) or str(logfile) in err.logs, (str(err), err.logs)
    assert err.details[-1] == "E: Unable to locate package g++-12"


def test_without_every_a_command_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands.run_logged(["sh", "-c", "echo '[1/2] a'; echo '[2/2] b'"], tmp_path / "x.log", "x")
    assert capsys.readouterr().err == ""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_quiet_build_stream_shows_the_step_and_ninja_count_once_per_interval(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine's build stream of a vLLM-like compile (499 ninja steps, 5 s apart on a fake clock) under
    --quiet: the step and the [n/499] count at most once every 30 s, never the raw lines."""
    clock = Clock()
    logfile = tmp_path / "build.log"
    with open(logfile, "w") as fh:
        quiet = log.Progress("build builder-run/x:tag", logfile, every=30.0, clock=clock)
        stream = engine._Progress(fh, echo=False, quiet=quiet)
        stream.chunk({"stream": "Step 1/3 : FROM base\n"})
        stream.chunk({"stream": "Step 2/3 : RUN python /opt/scripts/install.py vllm\n"})
        for i in range(1, 500):
            clock.now += 5.0
            stream.chunk({"stream": f"[{i}/499] Building CXX object csrc/cpu/unit{i}.cpp.o\n"})
        stream.chunk({"stream": "Step 3/3 : LABEL a=b\n"})
        stream.finish()
    err = capsys.readouterr().err
    lines = progress_lines(err)
    others = [line for line in err.splitlines() if not LINE.match(line)]
    assert others == [f"    build builder-run/x:tag: writing {logfile} (progress every 30 s)"]  # no raw lines
    assert len(lines) == 499 * 5 // 30, len(lines)  # 2495 s of compiling: one line per 30 s
    assert all(m["rest"].startswith(", step 2/3: [") and m["log"] == str(logfile) for m in lines)
    assert lines[0]["secs"] == "30" and "[6/499] Building CXX object csrc/cpu/unit6" in lines[0]["rest"]
    assert "[498/499]" in lines[-1]["rest"] and lines[-1]["secs"] == "2490"
    assert logfile.read_text().count("Building CXX object") == 499


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja")), reason="needs cmake and ninja")
def test_a_real_cmake_ninja_compile_shows_its_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A small CMake/Ninja project (16 C units, a few seconds) through run_logged: ninja's [n/m] lines reach
    the console as progress lines, bounded, naming the log."""
    src = tmp_path / "src"
    src.mkdir()
    units = [f"u{i}.c" for i in range(16)]
    for i, name in enumerate(units):
        body = "\n".join(f"double f{i}_{k}(double x) {{ return x * {k} + {i}; }}" for k in range(300))
        (src / name).write_text(body + "\n")
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(p C)\n"
                                        f"add_library(p STATIC {' '.join(units)})\n")
    logfile = tmp_path / "cmake.log"
    commands.run_logged(["cmake", "-G", "Ninja", "-S", str(src), "-B", str(tmp_path / "b")], logfile, "configure")
    commands.run_logged(["ninja", "-j1", "-C", str(tmp_path / "b")], logfile, "compile", every=0.3)
    err = capsys.readouterr().err
    lines = progress_lines(err)
    assert lines and all(m["log"] == str(logfile) for m in lines)
    assert any(re.search(r"\[\d+/17\]", m["rest"]) for m in lines), err
    assert "[17/17]" in logfile.read_text()


@pytest.mark.docker
def test_a_quiet_engine_build_shows_progress_lines_not_the_stream(base_image: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A real build (network none) of a step that prints ninja-like counts for about 3 s, with echo off:
    the console gets the log's path and a few progress lines with the step and the count; the log gets it all."""
    import io
    import tarfile
    import time

    from builder.core.options import Settings

    settings = Settings.from_env()
    client = engine.connect(settings)
    dockerfile = (f"FROM {base_image}\n"
                  f"RUN for i in $(seq 1 30); do echo \"[$i/30] Building CXX object unit$i.o ({time.time_ns()})\";"
                  " sleep 0.1; done\n")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    context.seek(0)
    tag = f"builder-test/progress:{settings.run_id}"
    logfile = tmp_path / "build.log"
    try:
        result = engine.build(client, context, tag, logfile, echo=False, every=0.5)
    finally:
        engine.untag(client, tag)
    err = capsys.readouterr().err
    lines = progress_lines(err)
    assert result.image_id and 2 <= len(lines) <= 30, err
    # under load the FROM step may outlast one interval: its line names step 1/2; the RUN's lines step 2/2
    # a line after the count may carry the last count along: ", step 2/2, [30/30]: Removing intermediate container"
    assert all(re.match(r", step [12]/2(, \[\d+/30\])?: ", m["rest"]) and m["log"] == str(logfile) for m in lines), err
    assert any(re.match(r", step 2/2: \[\d+/30\] Building CXX object", m["rest"]) for m in lines), err
    assert "Building CXX object" not in "\n".join(ln for ln in err.splitlines() if not LINE.match(ln))
    assert logfile.read_text().count("Building CXX object") >= 30
