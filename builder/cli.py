"""Command line: composes the stages; each stage lives in its own module."""
import functools
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from . import log
from .errors import BadInput, BuilderError, InfraError, NotAccepted

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Resolve, build, accept, report and publish a unified RL-stack image.")

PinsArg = typer.Argument(..., help="pins file (YAML)")
Offline = typer.Option(False, "--offline", help="use the mirror cache only; fetch nothing")
AllowMoved = typer.Option(False, "--allow-moved-pr", help="accept a PR head that moved past the pinned commit")


def handled(func):
    """Turn a BuilderError into its one-line message and exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except BuilderError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(err.exit_code)
        except OSError as err:
            if not _is_infra(err):
                raise
            typer.echo(f"error: infrastructure: {err}", err=True)
            raise typer.Exit(InfraError.exit_code)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130)

    return wrapper


def _is_infra(err: Exception) -> bool:
    """Connection failures to the engine or registry (requests/urllib3 raise OSError subclasses)."""
    import requests

    return isinstance(err, (requests.ConnectionError, ConnectionError))


def _load_and_resolve(pins_path: Path, offline: bool, allow_moved_pr: bool):
    from . import pins as pins_mod, sources

    with log.step("load pins"):
        pins = pins_mod.load(pins_path)
    with log.step("resolve sources"):
        resolved = sources.resolve(pins, offline=offline, allow_moved_pr=allow_moved_pr)
    log.info(sources.format_table(resolved))
    return pins, resolved


def _render(pins, resolved):
    from . import render

    with log.step("render"):
        return render.render(pins, resolved)


def _build(pins, rendered, nocache=False, quiet=False):
    from . import build

    with log.step("build"):
        return build.build(rendered, pins, nocache=nocache, echo=not quiet)


def _run_dir(out: Optional[Path], name: str) -> Path:
    import time

    from .paths import cache_dir

    path = out or cache_dir("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    return path


@app.command()
@handled
def setup():
    """Start the Docker engine (network none) and the local registry, if not running."""
    from . import infra

    with log.step("setup engine and registry"):
        typer.echo(json.dumps(infra.ensure_all(), indent=2))


@app.command()
@handled
def resolve(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
            json_out: Optional[Path] = typer.Option(None, "--json", help="also write the record here")):
    """Resolve the three pinned PRs; print a table (stderr) and the JSON record (stdout)."""
    _, resolved = _load_and_resolve(pins_path, offline, allow_moved_pr)
    text = resolved.model_dump_json(indent=2)
    if json_out:
        json_out.write_text(text + "\n")
    typer.echo(text)


@app.command()
@handled
def render(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           pins_only: bool = typer.Option(False, "--pins-only",
                                          help="render from the pins alone (no fetch, no context; trees unresolved)")):
    """Print the Dockerfile; build nothing (the context is assembled but not sent)."""
    if pins_only:
        from . import pins as pins_mod, render as render_mod

        sys.stdout.write(render_mod.render_dockerfile(pins_mod.load(pins_path), None))
        return
    pins, resolved = _load_and_resolve(pins_path, offline, allow_moved_pr)
    rendered = _render(pins, resolved)
    log.info(f"context {rendered.context_path} sha256:{rendered.context_sha256}")
    sys.stdout.write(rendered.dockerfile)


@app.command()
@handled
def build(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
          nocache: bool = typer.Option(False, "--nocache", help="build every layer again"),
          quiet: bool = typer.Option(False, "--quiet", help="do not stream the build log")):
    """Resolve, render and build the image; print the build record as JSON."""
    pins, resolved = _load_and_resolve(pins_path, offline, allow_moved_pr)
    built = _build(pins, _render(pins, resolved), nocache=nocache, quiet=quiet)
    typer.echo(built.model_dump_json(indent=2))


@app.command()
@handled
def accept(pins_path: Path = PinsArg,
           image: Optional[str] = typer.Option(None, "--image", help="image ID (default: build from the pins)"),
           gate: Optional[list[str]] = typer.Option(None, "--gate", help="run only these gates"),
           timeout: Optional[int] = typer.Option(None, "--timeout", help="seconds per gate (default: the pins')"),
           offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report")):
    """Run the acceptance suite in fresh containers and write the report; exit 1 unless ACCEPTED."""
    report, _ = _accept_and_report(pins_path, image, gate, offline, allow_moved_pr, out, timeout)
    if report.verdict != "ACCEPTED":
        raise typer.Exit(NotAccepted.exit_code)


def _accept_and_report(pins_path, image, gates, offline, allow_moved_pr, out, timeout=None):
    """Resolve, build unless an image is given, accept, write the report; the run directory is made
    only once there is a report to put in it. Returns (report, run directory)."""
    from . import accept as accept_mod, report as report_mod

    pins, resolved = _load_and_resolve(pins_path, offline, allow_moved_pr)
    built = None
    if image is None:
        built = _build(pins, _render(pins, resolved))
        image = built.image_id
    with log.step("acceptance"):
        result = accept_mod.accept(image, pins, gates=gates or None, timeout_s=timeout)
    report = report_mod.make_report(pins, resolved, built, result, image_manifest=_image_manifest(image))
    run_dir = _run_dir(out, pins.name)
    paths = report_mod.write(report, run_dir)
    _print_verdict(report, paths)
    return report, run_dir


def _image_manifest(image_id: str) -> dict | None:
    """/opt/delivery/manifest.json of the image, for the report's run manifest."""
    from . import engine

    data = engine.read_file(engine.connect(), image_id, "/opt/delivery/manifest.json")
    return json.loads(data) if data else None


def _print_verdict(report, paths):
    for gate in report.gates:
        log.info(f"  {gate.name:<12} {gate.status:<13} {gate.reason}")
    log.info(f"verdict: {report.verdict}")
    for kind, path in paths.items():
        log.info(f"report {kind}: {path}")


@app.command("report")
@handled
def report_cmd(report_json: Path = typer.Argument(..., help="report.json of a run"),
               fmt: str = typer.Option("md", "--format", help="md | json | junit")):
    """Print a stored report as Markdown, JSON or JUnit XML."""
    from . import report as report_mod

    report = report_mod.load(report_json)
    if fmt == "json":
        typer.echo(report.model_dump_json(indent=2))
    elif fmt == "junit":
        typer.echo(report_mod.to_junit(report))
    elif fmt == "md":
        typer.echo(report_mod.to_markdown(report))
    else:
        raise BadInput(f"--format: expected md, json or junit, got {fmt!r}")


@app.command()
@handled
def publish(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
            image: Optional[str] = typer.Option(None, "--image", help="local image (default: the SHA tag)")):
    """Tag and push an ACCEPTED image, then verify the digest the registry serves."""
    from . import publish as publish_mod

    with log.step("publish"):
        receipt = publish_mod.publish(report_json, image=image)
    typer.echo(receipt.model_dump_json(indent=2))


@app.command("export-sqsh")
@handled
def export_sqsh(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
                out: Optional[Path] = typer.Option(None, "--out", help="the .sqsh (default: next to the report)"),
                squash_options: Optional[str] = typer.Option(
                    None, "--squash-options", help="mksquashfs compression (default $BUILDER_SQUASH_OPTIONS "
                                                   "or enroot's '-comp lzo -noD')")):
    """Write the accepted image as an enroot .sqsh, check it file by file, smoke it, record it in the report."""
    from . import sqsh

    with log.step("export .sqsh"):
        record = sqsh.export(report_json, out=out, squash_options=squash_options)
    typer.echo(record.model_dump_json(indent=2))


@app.command()
@handled
def run(pins_path: Path = PinsArg, publish: bool = typer.Option(False, "--publish", help="publish if ACCEPTED"),
        sqsh: bool = typer.Option(False, "--sqsh", help="after publish, export the enroot .sqsh (export-sqsh)"),
        offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
        out: Optional[Path] = typer.Option(None, "--out", help="run directory for the report")):
    """Resolve, build, accept, report, and publish when asked. Exit 0 accepted, 1 not, 2 bad input, 3 infra."""
    from . import publish as publish_mod

    if sqsh and not publish:
        raise BadInput("--sqsh: expected --publish too (the .sqsh is recorded beside the registry digest)")
    report, run_dir = _accept_and_report(pins_path, None, None, offline, allow_moved_pr, out)
    log.info("timings: " + json.dumps(log.timings))
    if report.verdict != "ACCEPTED":
        raise NotAccepted(f"{pins_path}: image {report.build.image_id if report.build else '?'} not accepted; "
                          f"see {run_dir / 'report.md'}")
    if publish:
        with log.step("publish"):
            receipt = publish_mod.publish(run_dir / "report.json")
        log.info(f"published {receipt.repository}@{receipt.digest}")
    if sqsh:
        from . import sqsh as sqsh_mod

        with log.step("export .sqsh"):
            record = sqsh_mod.export(run_dir / "report.json")
        log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    log.info(f"report: {run_dir / 'report.md'}")


@app.command()
@handled
def demo(publish: bool = typer.Option(True, "--publish/--no-publish", help="publish to the local registry")):
    """Set up the demo world (engine, registry, base image, demo repos) and run the whole flow on it."""
    from . import demo as demo_mod

    with log.step("prepare demo world"):
        pins_path = demo_mod.prepare_demo()
    run(pins_path, publish=publish, sqsh=False, offline=False, allow_moved_pr=False, out=None)


def main():
    app()


if __name__ == "__main__":
    main()
