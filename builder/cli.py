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

from builder import log
from builder.errors import BadInput, BuilderError, InfraError, NotAccepted
from builder.options import Settings
from builder.pins import Pins
from builder.records import BuiltImage, RenderedBuild, Report, ResolvedSources

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Resolve, build, accept, report and publish a unified RL-stack image.")

PinsArg = typer.Argument(..., help="pins file (YAML)")
Offline = typer.Option(False, "--offline", help="use the mirror cache only; fetch nothing")
AllowMoved = typer.Option(False, "--allow-moved-pr", help="accept a pinned commit the PR head moved past")
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
        from builder import engine

        try:
            return func(*args, **kwargs)
        except BuilderError as err:
            raise fail(err) from None
        except OSError as err:
            if not engine.unreachable(err):
                raise
            raise fail(InfraError(f"infrastructure: {err}")) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def settings() -> Settings:
    """The environment, read once per command."""
    return Settings.from_env()


def _load_and_resolve(pins_path: Path, config: Settings, offline: bool,
                      allow_moved_pr: bool) -> tuple[Pins, ResolvedSources]:
    from builder import pins as pins_mod
    from builder import sources

    with log.step("load pins"):
        pins = pins_mod.load(pins_path)
    with log.step("resolve sources"):
        resolved = sources.resolve(pins, config, offline=offline, allow_moved_pr=allow_moved_pr)
    log.info(sources.format_table(resolved))
    return pins, resolved


def _render(pins: Pins, resolved: ResolvedSources, config: Settings) -> RenderedBuild:
    from builder import render

    with log.step("render"):
        return render.render(pins, resolved, config)


def _build(rendered: RenderedBuild, config: Settings, nocache: bool = False, quiet: bool = False) -> BuiltImage:
    from builder import build

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
    from builder import infra

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
        json_out.write_text(text + "\n")
    typer.echo(text)


@app.command()
@handled
def render(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           pins_only: bool = typer.Option(False, "--pins-only",
                                          help="render from the pins alone (no fetch, no context; trees unresolved)"),
           ) -> None:
    """Print the Dockerfile; build nothing (the context is assembled but not sent)."""
    if pins_only:
        from builder import pins as pins_mod
        from builder import render as render_mod

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
           image: Optional[str] = typer.Option(None, "--image", help="image ID (default: build from the pins)"),
           gate: Optional[list[str]] = typer.Option(None, "--gate", help="run only these gates"),
           timeout: Optional[int] = typer.Option(None, "--timeout", help="seconds per gate (default: the pins')"),
           offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report")) -> None:
    """Run the acceptance suite in fresh containers and write the report; exit 1 unless ACCEPTED."""
    report, _ = _accept_and_report(settings(), pins_path, image, gate, offline, allow_moved_pr, out, timeout)
    if report.verdict != "ACCEPTED":
        raise typer.Exit(NotAccepted.exit_code)


def _accept_and_report(config: Settings, pins_path: Path, image: str | None, gates: list[str] | None,
                       offline: bool, allow_moved_pr: bool, out: Path | None,
                       timeout: int | None = None) -> tuple[Report, Path]:
    """Resolve, build unless an image is given, accept, write the report; the run directory is made
    only once there is a report to put in it. Returns (report, run directory)."""
    from builder import accept as accept_mod
    from builder import report as report_mod

    pins, resolved = _load_and_resolve(pins_path, config, offline, allow_moved_pr)
    built = None
    if image is None:
        built = _build(_render(pins, resolved, config), config)
        image = built.image_id
    with log.step("acceptance"):
        result = accept_mod.accept(image, pins, config, gates=gates or None, timeout_s=timeout)
    report = report_mod.make_report(pins, resolved, built, result, image_manifest=_image_manifest(config, image))
    run_dir = _run_dir(out, pins.name, config)
    paths = report_mod.write(report, run_dir)
    _print_verdict(report, paths)
    return report, run_dir


def _image_manifest(config: Settings, image_id: str) -> dict[str, Any] | None:
    """/opt/delivery/manifest.json of the image, for the report's run manifest."""
    from builder import engine
    from builder.constants import MANIFEST

    data = engine.read_file(engine.connect(config), image_id, MANIFEST)
    return json.loads(data) if data else None


def _print_verdict(report: Report, paths: dict[str, Path]) -> None:
    for gate in report.gates:
        log.info(f"  {gate.name:<12} {gate.status:<13} {gate.reason}")
    log.info(f"verdict: {report.verdict}")
    for kind, path in paths.items():
        log.info(f"report {kind}: {path}")


@app.command("report")
@handled
def report_cmd(report_json: Path = typer.Argument(..., help="report.json of a run"),
               fmt: str = typer.Option("md", "--format", help="md | json | junit")) -> None:
    """Print a stored report as Markdown, JSON or JUnit XML."""
    from builder import report as report_mod
    from builder.errors import BadInput

    report = report_mod.load(report_json)
    if fmt == "json":
        typer.echo(report.model_dump_json(indent=2))
    elif fmt == "junit":
        typer.echo(report_mod.to_junit(report))
    elif fmt == "md":
        typer.echo(report_mod.to_markdown(report))
    else:
        raise BadInput(f"--format: expected md, json or junit, got {fmt[:40]!r}")


@app.command()
@handled
def publish(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
            image: Optional[str] = typer.Option(None, "--image", help="local image (default: the SHA tag)")) -> None:
    """Tag and push an ACCEPTED image, then verify the digest the registry serves."""
    from builder import publish as publish_mod

    with log.step("publish"):
        receipt = publish_mod.publish(report_json, settings(), image=image)
    typer.echo(receipt.model_dump_json(indent=2))


@app.command("export-sqsh")
@handled
def export_sqsh(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
                out: Optional[Path] = typer.Option(None, "--out", help="the .sqsh (default: next to the report)"),
                squash_options: Optional[str] = typer.Option(
                    None, "--squash-options", help="mksquashfs compression (default $BUILDER_SQUASH_OPTIONS "
                                                   "or enroot's '-comp lzo -noD')")) -> None:
    """Write the accepted image as an enroot .sqsh, check it file by file, smoke it, record it in the report."""
    from builder import sqsh

    with log.step("export .sqsh"):
        record = sqsh.export(report_json, settings(), out=out, squash_options=squash_options)
    typer.echo(record.model_dump_json(indent=2))


@app.command()
@handled
def run(pins_path: Path = PinsArg, publish: bool = typer.Option(False, "--publish", help="publish if ACCEPTED"),
        sqsh: bool = typer.Option(False, "--sqsh", help="after publish, export the enroot .sqsh (export-sqsh)"),
        offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
        out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report")) -> None:
    """Resolve, build, accept, report, and publish when asked. Exit 0 accepted, 1 not, 2 bad input, 3 infra."""
    from builder import publish as publish_mod

    if sqsh and not publish:
        raise BadInput("--sqsh: expected --publish too (the .sqsh is recorded beside the registry digest)")
    config = settings()
    report, run_dir = _accept_and_report(config, pins_path, None, None, offline, allow_moved_pr, out)
    log.info("timings: " + json.dumps(log.timings))
    if report.verdict != "ACCEPTED":
        raise NotAccepted(f"{pins_path}: image {report.image_id} not accepted; see {run_dir / 'report.md'}")
    if publish:
        with log.step("publish"):
            receipt = publish_mod.publish(run_dir / "report.json", config)
        log.info(f"published {receipt.repository}@{receipt.digest}")
    if sqsh:
        from builder import sqsh as sqsh_mod

        with log.step("export .sqsh"):
            record = sqsh_mod.export(run_dir / "report.json", config)
        log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    log.info(f"report: {run_dir / 'report.md'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
