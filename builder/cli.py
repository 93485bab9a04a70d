"""Command line: reads the settings once and composes the stages; each stage lives in its own module."""
from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from builder.core import faults, log
from builder.core import files as fs
from builder.core.errors import BadInput, BuilderError, InfraError, Interrupted, NotAccepted
from builder.core.options import Settings
from builder.core.records import BuiltImage, RenderedBuild, Report, ResolvedSources
from builder.pins.model import Pins

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Resolve, build, accept, report and publish a unified RL-stack image.")

PinsArg = typer.Argument(..., help="pins file (YAML)")
Offline = typer.Option(False, "--offline", help="use the mirror cache only; fetch nothing")
AllowMoved = typer.Option(False, "--allow-moved-pr", help="accept a pinned commit the PR head moved past")
SigningKey = typer.Option(None, "--key", help="ed25519 private key (PEM) that signs the attestations "
                          "(default: $BUILDER_SIGNING_KEY; none: publish without attestations)")
EngineOpt = typer.Option(None, "--engine", help="run the gates on this Docker engine (unix://, tcp://, ssh://); "
                         "it pulls the image by digest (default: the pins' acceptance.engine, else DOCKER_HOST)")
F = TypeVar("F", bound=Callable[..., Any])


def fail(err: BuilderError) -> typer.Exit:
    """The error's one line, then its details (e.g. a log tail) on their own lines."""
    typer.echo(f"error: {err}", err=True)
    for line in err.details:
        typer.echo(f"  | {line}", err=True)
    return typer.Exit(err.exit_code)


def handled(func: F) -> F:
    """Turn a BuilderError into its one-line message and exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from builder.engine import client as engine

        try:
            return func(*args, **kwargs)
        except BuilderError as err:
            raise fail(err) from None
        except OSError as err:
            if not (engine.unreachable(err) or faults.infrastructure(err)):
                raise
            raise fail(InfraError(f"infrastructure: {faults.describe(err)}")) from None
        except KeyboardInterrupt as err:
            typer.echo(f"error: interrupted{f' by {err}' if str(err) else ''}; nothing half-done was kept",
                       err=True)
            raise typer.Exit(Interrupted.exit_code) from None
        except Exception as err:
            if not faults.infrastructure(err):
                raise
            raise fail(InfraError(f"infrastructure: {faults.describe(err)}")) from None

    return wrapper  # type: ignore[return-value]


def settings() -> Settings:
    """The environment, read once per command."""
    return Settings.from_env()


def _load_and_resolve(pins_path: Path, config: Settings, offline: bool,
                      allow_moved_pr: bool) -> tuple[Pins, ResolvedSources]:
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    with log.step("load pins"):
        pins = pins_mod.load(pins_path)
    with log.step("resolve sources"):
        resolved = sources.resolve(pins, config, offline=offline, allow_moved_pr=allow_moved_pr)
    log.info(sources.format_table(resolved))
    return pins, resolved


def _render(pins: Pins, resolved: ResolvedSources, config: Settings) -> RenderedBuild:
    from builder.image import render

    with log.step("render"):
        return render.render(pins, resolved, config)


def _build(rendered: RenderedBuild, config: Settings, nocache: bool = False, quiet: bool = False) -> BuiltImage:
    from builder.image import build

    with log.step("build"):
        return build.build(rendered, config, nocache=nocache, echo=not quiet)


def _run_dir(out: Optional[Path], name: str, config: Settings) -> Path:
    path = out or config.cache("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    return path


@app.command()
@handled
def setup() -> None:
    """Start the Docker engine (network none) and the local registry, if not running."""
    from builder.engine import infra

    with log.step("setup engine and registry"):
        typer.echo(json.dumps(infra.ensure_all(settings()), indent=2))


@app.command()
@handled
def resolve(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
            json_out: Optional[Path] = typer.Option(None, "--json", help="also write the record here")) -> None:
    """Resolve the three pinned PRs; print a table (stderr) and the JSON record (stdout)."""
    _, resolved = _load_and_resolve(pins_path, settings(), offline, allow_moved_pr)
    text = resolved.model_dump_json(indent=2)
    if json_out:
        fs.write_atomic(json_out, text + "\n")
    typer.echo(text)


@app.command()
@handled
def render(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           pins_only: bool = typer.Option(False, "--pins-only",
                                          help="render from the pins alone (no fetch, no context; trees unresolved)"),
           ) -> None:
    """Print the Dockerfile; build nothing (the context is assembled but not sent)."""
    if pins_only:
        from builder.image import render as render_mod
        from builder.pins import model as pins_mod

        sys.stdout.write(render_mod.render_dockerfile(pins_mod.load(pins_path), None))
        return
    config = settings()
    pins, resolved = _load_and_resolve(pins_path, config, offline, allow_moved_pr)
    rendered = _render(pins, resolved, config)
    log.info(f"context {rendered.context_path} sha256:{rendered.context_sha256}")
    sys.stdout.write(rendered.dockerfile)


@app.command()
@handled
def build(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
          nocache: bool = typer.Option(False, "--nocache", help="build every layer again"),
          quiet: bool = typer.Option(False, "--quiet", help="do not stream the build log")) -> None:
    """Resolve, render and build the image; print the build record as JSON."""
    config = settings()
    pins, resolved = _load_and_resolve(pins_path, config, offline, allow_moved_pr)
    built = _build(_render(pins, resolved, config), config, nocache=nocache, quiet=quiet)
    typer.echo(built.model_dump_json(indent=2))


@app.command()
@handled
def accept(pins_path: Path = PinsArg,
           image: Optional[str] = typer.Option(None, "--image", help="image ID, or REPOSITORY@sha256:... to pull "
                                               "(default: build from the pins)"),
           engine: Optional[str] = EngineOpt,
           gate: Optional[list[str]] = typer.Option(None, "--gate", help="run only these gates"),
           timeout: Optional[int] = typer.Option(None, "--timeout", min=1, max=86_400,
                                                 help="seconds per gate, 1..86400 (default: the pins')"),
           offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report")) -> None:
    """Run the acceptance suite in fresh containers and write the report; exit 1 unless ACCEPTED."""
    report, _ = _accept_and_report(settings(), pins_path, image, gate, offline, allow_moved_pr, out, timeout, engine)
    if report.verdict != "ACCEPTED":
        raise typer.Exit(NotAccepted.exit_code)


def _accept_and_report(config: Settings, pins_path: Path, image: str | None, gates: list[str] | None,
                       offline: bool, allow_moved_pr: bool, out: Path | None,
                       timeout: int | None = None, engine_url: str | None = None,
                       stage: bool = False, nocache: bool = False,
                       key: Path | None = None) -> tuple[Report, Path]:
    """Resolve, build unless an image is given, accept, write the report; the run directory is made
    only once there is a report to put in it. With `stage` (or an engine URL) the build is pushed by
    digest to the staging repository and acceptance pulls that digest. Returns (report, run directory)."""
    from dataclasses import replace

    from builder.accept import gates as accept_mod
    from builder.core.errors import BadInput
    from builder.engine import staging
    from builder.release import attest, dsse
    from builder.report import document as report_mod

    pins, resolved = _load_and_resolve(pins_path, config, offline, allow_moved_pr)
    engine_url = engine_url or pins.acceptance.engine
    built = None
    if image is None:
        built = _build(_render(pins, resolved, config), config, nocache=nocache)
        image = built.image_id
        if stage or engine_url:
            repo = staging.staging_repository(pins.image.repository, pins.image.staging)
            built.staged = image = staging.push(built.manifest_digest, repo, pins.base.name, config)
    with log.step("acceptance"):
        if "@sha256:" in image:
            result = accept_mod.accept_staged(image, pins, built.image_id if built else None, engine_url,
                                           gates or None, timeout, config)
        elif engine_url:
            raise BadInput("--engine: expected --image REPOSITORY@sha256:<digest> (another engine pulls by digest)")
        else:
            result = accept_mod.accept(image, pins, config, gates=gates or None, timeout_s=timeout)
    there = replace(config, docker_host=engine_url) if engine_url else config
    report = report_mod.make_report(pins, resolved, built, result,
                                    image_manifest=_image_manifest(there, result.image_id))
    run_dir = _run_dir(out, pins.name, config)
    paths = report_mod.write(report, run_dir)
    key = key or config.signing_key
    if key is not None:  # publish requires this signature over the acceptance result
        attest.sign_acceptance(report, dsse.load_private(key), run_dir)
    _print_verdict(report, paths)
    return report, run_dir


def _image_manifest(config: Settings, image_id: str) -> dict[str, Any] | None:
    """/opt/delivery/manifest.json of the image, for the report's run manifest."""
    from builder.core.constants import MANIFEST
    from builder.engine import client as engine

    data = engine.read_file(engine.connect(config), image_id, MANIFEST)
    return json.loads(data) if data else None


def _print_verdict(report: Report, paths: dict[str, Path]) -> None:
    for gate in report.gates:
        log.info(f"  {gate.name:<12} {gate.status:<13} {gate.reason}")
    log.info(f"verdict: {report.verdict}")
    for kind, path in paths.items():
        log.info(f"report {kind}: {path}")


@app.command("lock")
@handled
def lock_cmd(pins_path: Path = PinsArg,
             check: bool = typer.Option(False, "--check", help="exit 1 when the lock no longer matches the pins"),
             build_sdists: bool = typer.Option(False, "--build-sdists",
                                               help="build sdist-only dependencies in a network-none base container"),
             resolver: str = typer.Option("uv", "--resolver", help="uv | pip"),
             offline: bool = Offline, allow_moved_pr: bool = AllowMoved) -> None:
    """Write the pins' lock (every wheel to build and run the three components offline, sha256-pinned)
    and fill the wheelhouse; with --check, only verify it."""
    from builder.lock import lockfile as lock_mod

    result = lock_mod.lock(pins_path, settings(), check=check, offline=offline, resolver_name=resolver,
                           build_sdists=build_sdists, allow_moved_pr=allow_moved_pr)
    typer.echo(json.dumps({"lock": str(result.path), "sha256": result.sha256, "inputs_sha256": result.inputs_sha256,
                           "wheels": result.wheels, "wheelhouse": str(result.wheelhouse or ""),
                           "check": "up to date" if check else None}, indent=2))


@app.command("report")
@handled
def report_cmd(report_json: Path = typer.Argument(..., help="report.json of a run"),
               fmt: str = typer.Option("md", "--format", help="md | json | junit | ctrf")) -> None:
    """Print a stored report as Markdown, JSON or JUnit XML."""
    from builder.core.errors import BadInput
    from builder.report import document as report_mod

    report = report_mod.load(report_json)
    if fmt == "json":
        typer.echo(report.model_dump_json(indent=2))
    elif fmt == "junit":
        typer.echo(report_mod.to_junit(report))
    elif fmt == "ctrf":
        from builder.report.ctrf import to_ctrf

        typer.echo(json.dumps(to_ctrf(report), indent=2))
    elif fmt == "md":
        typer.echo(report_mod.to_markdown(report))
    else:
        raise BadInput(f"--format: expected md, json, junit or ctrf, got {fmt[:40]!r}")


@app.command()
@handled
def publish(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
            image: Optional[str] = typer.Option(None, "--image", help="local image (default: the SHA tag)"),
            key: Optional[Path] = SigningKey) -> None:
    """Tag and push an ACCEPTED image, verify the digest the registry serves, attach signed attestations."""
    from builder.release import publish as publish_mod

    with log.step("publish"):
        receipt = publish_mod.publish(report_json, settings(), image=image, signing_key=key)
    typer.echo(receipt.model_dump_json(indent=2))


@app.command("export-sqsh")
@handled
def export_sqsh(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
                out: Optional[Path] = typer.Option(None, "--out", help="the .sqsh (default: next to the report)"),
                squash_options: Optional[str] = typer.Option(
                    None, "--squash-options", help="mksquashfs compression (default $BUILDER_SQUASH_OPTIONS "
                                                   "or enroot's '-comp lzo -noD')")) -> None:
    """Write the accepted image as an enroot .sqsh, check it file by file, smoke it, record it in the report."""
    from builder.release import sqsh

    with log.step("export .sqsh"):
        record = sqsh.export(report_json, settings(), out=out, squash_options=squash_options)
    typer.echo(record.model_dump_json(indent=2))


@app.command()
@handled
def rebuild(check: Path = typer.Option(..., "--check", help="report.json whose image to reproduce")) -> None:
    """Rebuild from the pins alone with no cache; exit 0 when the digests are the same, 1 with a
    per-layer file diff (also written into the report) when not."""
    from builder.release import rebuild as rebuild_mod

    result = rebuild_mod.check(check, settings())
    typer.echo(json.dumps(result, indent=2))
    if result["status"] != "same":
        raise NotAccepted(f"{check}: rebuild gives {result['rebuild']['manifest_digest']}, the report has "
                          f"{result['report']['manifest_digest']}; diff in {check}")
    log.info(f"reproduced {result['report']['manifest_digest']}")


@app.command()
@handled
def run(pins_path: Path = PinsArg, publish: bool = typer.Option(False, "--publish", help="publish if ACCEPTED"),
        sqsh: bool = typer.Option(False, "--sqsh", help="after publish, export the enroot .sqsh (export-sqsh)"),
        offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
        out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report"),
        key: Optional[Path] = SigningKey, engine: Optional[str] = EngineOpt,
        nocache: bool = typer.Option(False, "--nocache", help="build every layer again")) -> None:
    """Resolve, build, stage by digest, accept the pulled digest, report, and promote it when asked.
    Exit 0 accepted, 1 not, 2 bad input, 3 infra."""
    from builder.release import publish as publish_mod

    if sqsh and not publish:
        raise BadInput("--sqsh: expected --publish too (the .sqsh is recorded beside the registry digest)")
    config = settings()
    report, run_dir = _accept_and_report(config, pins_path, None, None, offline, allow_moved_pr, out,
                                         engine_url=engine, stage=True, nocache=nocache, key=key)
    log.info("timings: " + json.dumps(log.timings))
    if report.verdict != "ACCEPTED":
        raise NotAccepted(f"{pins_path}: image {report.image_id} not accepted; see {run_dir / 'report.md'}")
    if publish:
        with log.step("publish"):
            receipt = publish_mod.publish(run_dir / "report.json", config, signing_key=key)
        log.info(f"published {receipt.repository}@{receipt.digest}")
    if report.build is not None:
        typer.echo(f"manifest digest: {report.build.manifest_digest}")
    if sqsh:
        from builder.release import sqsh as sqsh_mod

        with log.step("export .sqsh"):
            record = sqsh_mod.export(run_dir / "report.json", config)
        log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    log.info(f"report: {run_dir / 'report.md'}")


@app.command()
@handled
def keygen(private: Path = typer.Argument(..., help="private key file to write (mode 0600)"),
           public: Optional[Path] = typer.Option(None, "--public", help="public key file (default: PRIVATE.pub)"),
           ) -> None:
    """Write an ed25519 key pair for signing attestations; prints the public key path and key ID."""
    from builder.release import dsse

    public = public or private.with_name(private.name + ".pub")
    kid = dsse.keygen(private, public)
    typer.echo(f"public key {public} (key ID {kid})")


@app.command()
@handled
def verify(reference: str = typer.Argument(..., help="REPOSITORY@sha256:<digest>"),
           key: Path = typer.Option(..., "--key", help="ed25519 public key (PEM) the attestations must be signed with"),
           ) -> None:
    """Check the signed attestations of a published image. Exit 0 all pass, 1 naming the first failed check."""
    from builder.release import attest, dsse
    from builder.release import verify as verify_mod

    public = dsse.load_public(key)
    try:
        outcome = verify_mod.verify(reference, public, settings())
    except attest.AttestationError as err:
        typer.echo(f"FAILED {err.check}: {err.detail}")
        raise typer.Exit(1) from None
    for line in outcome.passed:
        typer.echo(f"ok  {line}")
    typer.echo(f"VERIFIED {reference}")


@app.command()
@handled
def nightly(pins_paths: list[Path] = typer.Argument(..., help="pins files (YAML); several run as a fleet"),
            follow_prs: bool = typer.Option(False, "--follow-prs", help="move each component to its PR's current head"),
            publish: bool = typer.Option(False, "--publish", help="publish and move the nightly tags if ACCEPTED"),
            out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report (several pins "
                                               "files: one <n>-<stem> directory each under it)"),
            key: Optional[Path] = SigningKey,
            jobs: int = typer.Option(1, "--jobs", help="with several pins files: how many run at once (1..64)")) -> None:
    """Rebuild and accept, then diff with the last accepted run of the same pins name.
    Exit codes as `run`, plus 4 when accepted but a regression flag is up; several pins files run in
    parallel processes (at most --jobs at once) and the most severe exit code is the fleet's."""
    from builder.nightly import fleet
    from builder.nightly import follow as nightly_mod

    config = settings()
    if len(pins_paths) > 1:
        flags = [*(["--follow-prs"] if follow_prs else []), *(["--publish"] if publish else []),
                 *(["--key", str(key)] if key else [])]
        outcomes = fleet.run_fleet(fleet.plan(pins_paths, out, config), jobs, flags)
        raise typer.Exit(fleet.severest([o.code for o in outcomes]))

    def accept_and_report(path: Path, out_dir: Path | None) -> tuple[Report, Path]:
        return _accept_and_report(config, path, None, None, False, False, out_dir, stage=True, key=key)

    code = nightly_mod.nightly(pins_paths[0], config, follow_prs_=follow_prs, publish=publish, out=out,
                               signing_key=key, accept_and_report=accept_and_report)
    raise typer.Exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a usage error (unknown option, missing argument) is one `error:` line, exit 2."""
    from builder.core.usage import run_app

    faults.interrupt_on_sigterm()
    sys.exit(run_app(app, argv))


if __name__ == "__main__":
    main()
