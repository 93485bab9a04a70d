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
from builder.lock import record as lock_record
from builder.pins import model as pins_model
from builder.report import document
from demo import baseimage, prepare
from demo.make_stack import make_stack

ARCH = "arm64"
PLATFORM = f"linux/{ARCH}"
REPOSITORY = "127.0.0.1:5000/demo/unified"  # pins/demo.yaml's image.repository
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


def member_edit(data: dict[str, Any], arch: str, base_ref: str) -> None:
    """The demo pins as one platform's member: `base_ref`, its platform, a lock path of its own; arm64 requires
    `provenance` only (emulated, the recipe gates read not_run)."""
    data["base"]["image"] = base_ref
    data["base"]["platform"] = f"linux/{arch}"
    data["build"]["lock"] = f"locks/demo-{arch}.lock"
    if arch == ARCH:
        data["acceptance"]["required_gates"] = ["provenance"]
        data["acceptance"].pop("performance", None)  # pins naming acceptance.performance require that gate


def member_pins(settings: Settings, arch: str, base_ref: str) -> Path:
    """<cache>/demo/<arch>/pins.yaml: member_edit's pins with a lock written by `builder lock` for that base."""
    return prepare.variant_pins(settings.cache("demo", arch), edit=lambda data: member_edit(data, arch, base_ref),
                                lock=True)


def demo_report(settings: Settings) -> Path | None:
    """The newest ACCEPTED report of `make demo`'s pins as they are now (pins/demo.local.yaml) whose lock was made
    for its base (an index member's must be), or None."""
    if not prepare.LOCAL_PINS.exists():
        return None
    pins = pins_model.load(prepare.LOCAL_PINS)
    if lock_record.of(pins).built_for.get("base") != pins.base.digest:
        log.info(f"demo-arm64: {pins.lock_path()} was made for another base than {pins.base.digest[:19]}; the amd64"
                 " member gets a lock of its own")
        return None
    return newest_report(settings, prepare.LOCAL_PINS, "linux/amd64", pins.sha256)


def newest_report(settings: Settings, pins: Path, platform: str, pins_sha256: str | None = None) -> Path | None:
    """The newest ACCEPTED report of these pins (as they are now, when `pins_sha256` is given) for `platform`."""
    for path in sorted(settings.cache("runs").glob("demo-true-on-policy-*/report.json"),
                       key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            report = document.load(path)
        except BuilderError:
            continue
        if report.verdict == "ACCEPTED" and report.platform == platform and report.sources.pins_path == str(pins) \
                and pins_sha256 in (None, report.sources.pins_sha256):
            return path
    return None


def run_member(settings: Settings, pins: Path, platform: str, key: Path) -> Path | None:
    """`builder run` of one member's pins (build, stage, accept, report; no publish): its ACCEPTED report or None."""
    with log.step(f"demo-arm64: builder run {platform}"):
        if cli.run(["run", str(pins), "--key", str(key)]) != 0:
            return None
    return newest_report(settings, pins, platform)


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
            pins = member_pins(settings, ARCH, base_ref)
        amd64_pins = None
        amd64 = demo_report(settings)
        if amd64 is None:
            with log.step("demo-arm64: amd64 pins and lock"):
                amd64_pins = member_pins(settings, "amd64", baseimage.ensure_base_image(settings))
        key = prepare.signing_key(settings)
    except BuilderError as err:
        print(fit(f"error: {err}"), file=sys.stderr)
        return err.exit_code
    arm64 = run_member(settings, pins, PLATFORM, key)
    if amd64_pins is not None and arm64 is not None:
        amd64 = run_member(settings, amd64_pins, "linux/amd64", key)
    if arm64 is None or amd64 is None:
        return 1
    with log.step("demo-arm64: builder publish"):
        rc = cli.run(["publish", str(amd64), str(arm64), "--key", str(key)])
    for platform in ("linux/amd64", PLATFORM) if rc == 0 else ():
        with log.step(f"demo-arm64: builder verify --platform {platform}"):
            rc = rc or cli.run(["verify", f"{REPOSITORY}:demo", "--platform", platform, "--key", f"{key}.pub"])
    log.info(f"demo-arm64: {time.monotonic() - started:.0f} s; amd64 {amd64}, arm64 {arm64}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
