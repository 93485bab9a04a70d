"""`make demo-arm64` (`python -m demo.arm64`): the demo image for linux/arm64, built and accepted under emulation, then
published with the amd64 demo image as one multi-arch index (docs/image.md "An arm64 demo member").

- binfmt: qemu-user-static's aarch64 entry registered with the kernel (flag F: the interpreter is opened once, so
  the engine's containers run arm64 programs too);
- the arm64 demo base (demo/baseimage.py with arch arm64: debootstrap --arch=arm64, torch 2.10.0, the newest aarch64
  CPU wheel, downloaded on the host and pinned by sha256);
- pins of their own in <cache>/demo/arm64/ (the demo pins with that base, base.platform linux/arm64, their own lock,
  and `provenance` the only required gate: the recipe gates need a native arm64 node and read not_run);
- `builder run` on them (build, stage, accept, report; no publish), then `builder publish` of the newest ACCEPTED
  amd64 demo report (`make demo`) and this one: one index of exactly those two digests, signed; `builder verify`
  of each platform.

Slow (tens of minutes on 2 cores) and outside `make demo` and the test budget.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from builder import cli
from builder.core import commands, log
from builder.core.errors import BuilderError, InfraError
from builder.core.options import Settings
from builder.core.safetext import fit
from builder.engine import infra
from builder.report import document
from demo import baseimage, prepare
from demo.make_stack import make_stack

ARCH = "arm64"
PLATFORM = f"linux/{ARCH}"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")  # qemu-user-static's entry (flags OPF)


def ensure_binfmt(settings: Settings) -> None:
    """The kernel runs aarch64 programs through qemu-user-static: installed (apt-get) and registered when missing."""
    if (BINFMT / "qemu-aarch64").exists():
        return
    logfile = settings.run_log("binfmt")
    if not BINFMT_CONF.exists():
        commands.apt_install(logfile, "qemu-user-static")
    if not (BINFMT / "register").exists():
        commands.run_logged(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], logfile,
                            "mount binfmt_misc", InfraError)
    try:
        (BINFMT / "register").write_text(BINFMT_CONF.read_text().strip())
    except OSError as exc:
        raise InfraError(f"{BINFMT}/register: cannot register {BINFMT_CONF} ({exc.strerror}); an arm64 build needs "
                         "binfmt (run as root, or register qemu-aarch64 on the host)") from None
    log.info(f"binfmt: registered qemu-aarch64 from {BINFMT_CONF}")


def arm64_pins(settings: Settings, base_ref: str) -> Path:
    """<cache>/demo/arm64/pins.yaml: the demo pins with the arm64 base, its platform, its own lock (written by
    `builder lock` when missing or stale) and `provenance` as the only required gate."""
    def edit(data: dict[str, Any]) -> None:
        data["base"]["image"] = base_ref
        data["base"]["platform"] = PLATFORM
        data["build"]["lock"] = "locks/demo-arm64.lock"
        data["acceptance"]["required_gates"] = ["provenance"]

    out = settings.cache("demo", ARCH)
    return prepare.variant_pins(out, edit=edit, lock=True)


def amd64_report(settings: Settings) -> Path | None:
    """The newest ACCEPTED report of `make demo`'s pins (pins/demo.local.yaml, accepted under Docker), or None."""
    for path in sorted(settings.cache("runs").glob("demo-true-on-policy-*/report.json"),
                       key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            report = document.load(path)
        except BuilderError:
            continue
        if report.verdict == "ACCEPTED" and report.platform == "linux/amd64" and \
                report.sources.pins_path == str(prepare.LOCAL_PINS):
            return path
    return None


def main(argv: list[str]) -> int:
    started = time.monotonic()
    only_base = argv[:1] == ["base"]
    try:
        settings = Settings.from_env()
        with log.step("demo-arm64: binfmt"):
            ensure_binfmt(settings)
        with log.step("demo: engine + registry"):
            infra.ensure_all(settings)
        with log.step("demo-arm64: base image"):
            base_ref = baseimage.ensure_base_image(settings, arch=ARCH)
        if only_base:
            print(base_ref)
            return 0
        with log.step("demo: stack repositories"):
            make_stack(prepare.STACK)
        with log.step("demo-arm64: pins and lock"):
            pins = arm64_pins(settings, base_ref)
        amd64 = amd64_report(settings)
        if amd64 is None:
            print("error: no ACCEPTED amd64 demo report in the cache; run `make demo` first", file=sys.stderr)
            return 2
    except BuilderError as err:
        print(fit(f"error: {err}"), file=sys.stderr)
        return err.exit_code
    key = prepare.signing_key(settings)
    with log.step("demo-arm64: builder run"):
        rc = cli.run(["run", str(pins), "--key", str(key)])
    if rc != 0:
        return rc
    arm64 = newest_report(settings, pins)
    with log.step("demo-arm64: builder publish"):
        rc = cli.run(["publish", str(amd64), str(arm64), "--key", str(key)])
    if rc == 0:
        for platform in ("linux/amd64", PLATFORM):
            with log.step(f"demo-arm64: builder verify --platform {platform}"):
                rc = rc or cli.run(["verify", "127.0.0.1:5000/demo/unified:demo", "--platform", platform,
                                    "--key", f"{key}.pub"])
    log.info(f"demo-arm64: {time.monotonic() - started:.0f} s; amd64 {amd64}, arm64 {arm64}")
    return rc


def newest_report(settings: Settings, pins: Path) -> Path:
    """The report `builder run` just wrote for the arm64 pins (the newest of its name for that platform)."""
    for path in sorted(settings.cache("runs").glob("demo-true-on-policy-*/report.json"),
                       key=lambda p: p.stat().st_mtime, reverse=True):
        if document.load(path).platform == PLATFORM:
            return path
    raise InfraError(f"{pins}: builder run wrote no {PLATFORM} report under {settings.cache('runs')}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
