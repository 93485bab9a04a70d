"""Command line: parses arguments and calls the use cases in builder/pipeline/; nothing else (its only
other import is the pins loader, so that bad input is refused before the pipeline's libraries load).

Errors are caught once, in `main`: every exit code comes from the error hierarchy (builder/core/errors.py).
The pipeline (and the stage modules under it) are imported inside each command so that `--help` and a
refused argument stay fast; those imports are marked `lazy:`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from builder.core import files as fs
from builder.core.errors import BadInput, BuilderError, InfraError, Interrupted, NotAccepted
from builder.core.options import Settings
from builder.core.safetext import fit
from builder.core.usage import interrupted, run_app

if TYPE_CHECKING:
    from builder.gating.plan import Flags, Plan
    from builder.pins.model import Pins

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Resolve, build, accept, report and publish a unified RL-stack image.")

PinsArg = typer.Argument(..., help="pins file (YAML)")
Offline = typer.Option(False, "--offline", rich_help_panel="Sources",
                       help="use the mirror cache only; fetch nothing")
AllowMoved = typer.Option(False, "--allow-moved-pr", rich_help_panel="Sources",
                          help="accept a pinned commit the PR head moved past")
SigningKey = typer.Option(None, "--key", rich_help_panel="Output",
                          help="ed25519 or P-256 private key (PEM, maybe encrypted) that signs the attestations "
                               "(default: $BUILDER_SIGNING_KEY; none: publish without attestations)")
EngineOpt = typer.Option(None, "--engine", rich_help_panel="Where the gates run",
                         help="run the gates on this Docker engine (unix://, tcp://, ssh://); it pulls the image by "
                              "digest (default: the pins' acceptance.engine, else DOCKER_HOST)")

# The help groups options in panels: what to accept, where the gates run, sources, output.
WHAT, WHERE, SOURCES, OUTPUT = "What to accept", "Where the gates run", "Sources", "Output"
SlurmOpt = typer.Option(False, "--slurm", rich_help_panel=WHERE,
                        help="run the gates on the Slurm cluster (SLURM_CONF) from the candidate's .sqsh; the site's "
                             "options (partition, account, QoS, runtime, shared and node-local directories, the "
                             "allocation cap) are the pins' acceptance.slurm, read once")


def make_plan(pins: Pins, flags: Flags) -> Plan:
    """The command's acceptance plan, checked as a whole before the pipeline (and its libraries) load."""
    from builder.gating import plan  # lazy: start-up

    return plan.make(pins, flags, settings())


def _version(value: bool) -> None:
    if value:
        from builder import __version__  # lazy: start-up

        typer.echo(f"rl-image-builder {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="print the version and exit")) -> None:
    """Resolve, build, accept, report and publish a unified RL-stack image."""


def load_pins(path: Path) -> Pins:
    """The pins file, read and validated before the pipeline (and its heavy libraries) is imported, so that
    bad input is refused fast; the use cases take the `Pins` and never read the file again."""
    from builder.core import log  # lazy: start-up
    from builder.pins import model  # lazy: start-up (pydantic, yaml)

    with log.step("load pins"):
        return model.load(path)


def settings() -> Settings:
    """The environment, read once per command; the run is live (`builder gc` spares it) from its first use of
    the cache until the process ends (Settings.cache)."""
    return Settings.from_env()


@app.command()
def setup() -> None:
    """Start the Docker engine (network none) and the local registry, if not running."""
    from builder.pipeline import building  # lazy: start-up

    typer.echo(json.dumps(building.setup(settings()), indent=2))


@app.command("pins")
def pins_cmd(pins_path: Optional[Path] = typer.Argument(None, help="pins file (YAML) to validate"),
             schema: bool = typer.Option(False, "--schema", help="print the JSON Schema of pins files instead")) -> None:
    """Validate a pins file and print it as JSON (stdout); with --schema, print the pins JSON Schema."""
    if schema:
        from builder.pipeline import building  # lazy: start-up

        sys.stdout.write(building.pins_schema())
        return
    if pins_path is None:
        raise BadInput("PINS: expected a pins file (or --schema)")
    typer.echo(json.dumps(load_pins(pins_path).to_json_dict(), indent=2))


@app.command()
def resolve(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
            json_out: Optional[Path] = typer.Option(None, "--json", help="also write the record here")) -> None:
    """Resolve the three pinned PRs; print a table (stderr) and the JSON record (stdout)."""
    pins = load_pins(pins_path)  # bad input is refused before the pipeline is imported
    from builder.pipeline import building  # lazy: start-up

    config = settings()
    resolved = building.resolve(pins, config, offline, allow_moved_pr)
    text = resolved.model_dump_json(indent=2)
    if json_out:
        fs.write_atomic(json_out, text + "\n")
    typer.echo(text)


@app.command()
def render(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
           pins_only: bool = typer.Option(False, "--pins-only",
                                          help="render from the pins alone (no fetch, no context; trees unresolved)"),
           ) -> None:
    """Print the Dockerfile; build nothing (the context is assembled but not sent)."""
    pins = load_pins(pins_path)  # bad input is refused before the pipeline is imported
    from builder.core import log  # lazy: start-up
    from builder.pipeline import building  # lazy: start-up

    if pins_only:
        sys.stdout.write(building.render_pins_only(pins))
        return
    config = settings()
    resolved = building.resolve(pins, config, offline, allow_moved_pr)
    rendered = building.render(pins, building.checked_lock(pins, resolved, config, offline), resolved, config,
                               review=True)
    log.info(f"context {rendered.context_path} sha256:{rendered.context_sha256}")
    sys.stdout.write(rendered.dockerfile)


@app.command()
def build(pins_path: Path = PinsArg, offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
          nocache: bool = typer.Option(False, "--nocache", help="build every layer again"),
          quiet: bool = typer.Option(False, "--quiet", help="do not stream the build log")) -> None:
    """Resolve, render and build the image; print the build record as JSON."""
    pins = load_pins(pins_path)  # bad input is refused before the pipeline is imported
    from builder.pipeline import building  # lazy: start-up

    config = settings()
    resolved = building.resolve(pins, config, offline, allow_moved_pr)
    rendered = building.render(pins, building.checked_lock(pins, resolved, config, offline), resolved, config)
    built = building.build(rendered, config, nocache=nocache, quiet=quiet)
    typer.echo(built.model_dump_json(indent=2))


@app.command("accept")
def accept_command(pins_path: Path = PinsArg,
                           image: Optional[str] = typer.Option(None, "--image", rich_help_panel=WHAT,
                                                       help="image ID, or REPOSITORY@sha256:... to pull (default: build from "
                                                            "the pins)"),
                   gate: Optional[list[str]] = typer.Option(None, "--gate", rich_help_panel=WHAT,
                                                            help="run only these gates (default: the pins' required_gates)"),
                   timeout: Optional[int] = typer.Option(None, "--timeout", min=1, max=86_400, rich_help_panel=WHAT,
                                                         help="each gate's limit in seconds, 1..86400: its container or step "
                                                              "and the builder's cancel (default: acceptance.timeout_s)"),
                   engine: Optional[str] = EngineOpt, slurm: bool = SlurmOpt,
                   offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
                   out: Optional[Path] = typer.Option(None, "--out", rich_help_panel=OUTPUT, help="run directory for the report"),
                   ) -> None:
    """Run the acceptance suite in fresh containers and write the report; exit 1 unless ACCEPTED."""
    pins = load_pins(pins_path)  # bad input is refused before the pipeline is imported
    from builder.gating.plan import Flags  # lazy: start-up

    plan = make_plan(pins, Flags(image=image, gates=gate or (), timeout_s=timeout, engine_url=engine, slurm=slurm,
                                 offline=offline, allow_moved_pr=allow_moved_pr, out=out))
    from builder.pipeline import accepting  # lazy: start-up

    accepting.accept_pins(pins, plan, settings()).require_accepted(pins_path)


@app.command("lock")
def lock_cmd(pins_path: Path = PinsArg,
             check: bool = typer.Option(False, "--check", help="exit 1 when the lock no longer matches the pins"),
             build_sdists: bool = typer.Option(False, "--build-sdists",
                                               help="build sdist-only dependencies in a network-none base container"),
             resolver: str = typer.Option("uv", "--resolver", help="uv | pip"),
             upgrade: bool = typer.Option(False, "--upgrade",
                                          help="resolve again even when the inputs are unchanged (newer releases)"),
             offline: bool = Offline, allow_moved_pr: bool = AllowMoved) -> None:
    """Write the pins' lock (every wheel to build and run the three components offline, sha256-pinned)
    and fill the wheelhouse; with --check, only verify it."""
    from builder.pipeline import building  # lazy: start-up

    result = building.lock(pins_path, settings(), check=check, offline=offline, resolver=resolver,
                           build_sdists=build_sdists, allow_moved_pr=allow_moved_pr, upgrade=upgrade)
    typer.echo(json.dumps({"lock": str(result.path), "sha256": result.sha256, "inputs_sha256": result.inputs_sha256,
                           "wheels": result.wheels, "wheelhouse": str(result.wheelhouse or ""),
                           "check": "up to date" if check else None}, indent=2))


@app.command("report")
def report_cmd(report_json: Path = typer.Argument(..., help="report.json of a run"),
               fmt: str = typer.Option("md", "--format", help="md | json | junit | ctrf | html")) -> None:
    """Print a stored report as Markdown, JSON, JUnit XML, CTRF JSON or one self-contained HTML page."""
    from builder.pipeline import accepting  # lazy: start-up

    typer.echo(accepting.report_html(report_json) if fmt == "html" else accepting.report_text(report_json, fmt))


@app.command()
def publish(report_jsons: list[Path] = typer.Argument(..., help="report.json of an ACCEPTED run; several (one per "
                                                      "platform, same commits): one multi-arch index"),
            image: Optional[str] = typer.Option(None, "--image", help="local image (default: the SHA tag)"),
            key: Optional[Path] = SigningKey,
            sqsh_dir: Optional[Path] = typer.Option(
                None, "--sqsh-dir", help="a cluster-accepted report: where its .sqsh goes under the SHA tag "
                                         "(default: acceptance.slurm.publish_dir, else where it was accepted)")) -> None:
    """Tag and push an ACCEPTED image, verify the digest the registry serves, attach signed attestations;
    a cluster-accepted report's .sqsh (+ .sha256) is placed under the same SHA tag name."""
    from builder.pipeline import releasing  # lazy: start-up

    if len(report_jsons) > 1:  # one OCI index of the per-platform members (builder/release/multiarch.py)
        if image or sqsh_dir:
            raise BadInput(f"{'--image' if image else '--sqsh-dir'}: one report's option; publish them one at a time")
        typer.echo(json.dumps({"index": releasing.publish_index(report_jsons, settings(), key=key)}))
        return
    receipt = releasing.publish_report(report_jsons[0], settings(), image=image, key=key, sqsh_dir=sqsh_dir)
    typer.echo(receipt.model_dump_json(indent=2))


@app.command("export-sqsh")
def export_sqsh(report_json: Path = typer.Argument(..., help="report.json of an ACCEPTED run"),
                out: Optional[Path] = typer.Option(None, "--out", help="the .sqsh (default: next to the report)"),
                squash_options: Optional[str] = typer.Option(
                    None, "--squash-options", help="mksquashfs compression (default $BUILDER_SQUASH_OPTIONS "
                                                   "or '-comp lzo -Xalgorithm lzo1x_1 -noD')"),
                no_smoke: bool = typer.Option(False, "--no-smoke", help="skip the smoke (the provenance gate in a "
                                              "container of the unpacked copy); the file-by-file check still runs "
                                              "and the record says the smoke was not run")) -> None:
    """Write the accepted image as an enroot .sqsh, check it file by file, smoke it, record it in the report."""
    from builder.pipeline import releasing  # lazy: start-up

    record = releasing.export_sqsh(report_json, settings(), out=out, squash_options=squash_options, smoke=not no_smoke)
    typer.echo(record.model_dump_json(indent=2))


@app.command()
def replay(report_json: Path = typer.Argument(..., help="report.json of a run whose gate saved a replay bundle"),
           gate: Optional[str] = typer.Option(None, "--gate", help="zero_update | rl_step | control (default: the "
                                                                    "first that differed)"),
           image: Optional[str] = typer.Option(None, "--image", help="replay on this image (default: the report's)"),
           slurm: Optional[bool] = typer.Option(None, "--slurm/--docker", rich_help_panel=WHERE,
                                                help="where to replay (default: where the report's gates ran)")
           ) -> None:
    """Replay one gate's difference alone, through the same door as the gates. An ACCEPTED run: nothing failed
    (exit 0). A gate that must agree: exit 1 while the sides differ, 0 once they agree. `--gate control`: exit 0
    when the control arm's expected difference reproduces exactly. Exit 2 when the report has no bundle."""
    from builder.pipeline import accepting  # lazy: start-up

    lines, code = accepting.replay(report_json, settings(), gate=gate, image=image, slurm=slurm)
    for line in lines:
        typer.echo(line)
    if code:
        raise NotAccepted(f"replay: {lines[0]}")


@app.command()
def rebuild(check: Path = typer.Option(..., "--check", help="report.json whose image to reproduce")) -> None:
    """Rebuild from the pins alone with no cache; exit 0 when the digests are the same, 1 with a
    per-layer file diff (also written into the report) when not."""
    from builder.pipeline import releasing  # lazy: start-up

    typer.echo(json.dumps(releasing.rebuild_check(check, settings()), indent=2))


@app.command("run")
def run_command(pins_path: Path = PinsArg,
                publish: bool = typer.Option(False, "--publish", rich_help_panel=OUTPUT, help="publish if ACCEPTED"),
                sqsh: bool = typer.Option(False, "--sqsh", rich_help_panel=OUTPUT,
                                          help="after publish, export the enroot .sqsh (export-sqsh)"),
                offline: bool = Offline, allow_moved_pr: bool = AllowMoved,
                out: Optional[Path] = typer.Option(None, "--out", rich_help_panel=OUTPUT,
                                                   help="run directory for the report"),
                key: Optional[Path] = SigningKey, engine: Optional[str] = EngineOpt,
                nocache: bool = typer.Option(False, "--nocache", rich_help_panel=SOURCES,
                                             help="build every layer again"),
                slurm: bool = SlurmOpt) -> None:
    """Resolve, build, stage by digest, accept the pulled digest, report, and promote it when asked.
    Exit 0 accepted, 1 not, 2 bad input, 3 infra."""
    pins = load_pins(pins_path)  # bad input is refused before the pipeline is imported
    from builder.gating.plan import Flags  # lazy: start-up

    plan = make_plan(pins, Flags(engine_url=engine, slurm=slurm, stage=True, offline=offline,
                                 allow_moved_pr=allow_moved_pr, nocache=nocache, out=out, key=key, publish=publish,
                                 export=sqsh))
    from builder.pipeline import releasing  # lazy: start-up

    done = releasing.run(pins, plan, settings())
    if done.report.build is not None:
        typer.echo(f"manifest digest: {done.report.build.manifest_digest}")


@app.command()
def gc(older_than_days: float = typer.Option(7.0, "--older-than-days", min=0.0,
                                             help="age after which run dirs, builds, logs and run tags go (0: all)"),
       keep_runs: int = typer.Option(20, "--keep-runs", min=0, help="newest run directories kept per pins name"),
       ) -> None:
    """Free the cache, the engine and the local registry by the retention rule (docs/image.md); what a live run
    holds is never touched. Prints what was removed, and what was kept because a live run holds it."""
    from builder.pipeline import nightly_runs  # lazy: start-up

    freed = nightly_runs.gc(settings(), older_than_s=older_than_days * 86400, keep_runs=keep_runs)
    typer.echo(json.dumps({"removed": freed.removed, "kept_live": freed.kept_live, "bytes": freed.bytes,
                           "refused": freed.refused}, indent=2))


@app.command()
def keygen(private: Path = typer.Argument(..., help="private key file to write (mode 0600)"),
           public: Optional[Path] = typer.Option(None, "--public", help="public key file (default: PRIVATE.pub)"),
           encrypt: bool = typer.Option(False, "--encrypt", help="encrypt the private key (PKCS#8) with the "
                                        "passphrase of BUILDER_KEY_PASSPHRASE or BUILDER_KEY_PASSPHRASE_FILE"),
           ecdsa: bool = typer.Option(False, "--ecdsa", help="an ECDSA P-256 key (as cosign makes) instead of ed25519"),
           ) -> None:
    """Write an ed25519 (or P-256) key pair for signing attestations; prints the public key path and key ID."""
    from builder.pipeline import releasing  # lazy: start-up

    passphrase = Settings.from_env().key_passphrase if encrypt else None
    if encrypt and not passphrase:
        raise BadInput("--encrypt: set BUILDER_KEY_PASSPHRASE or BUILDER_KEY_PASSPHRASE_FILE (never an argument)")
    public, kid = releasing.keygen(private, public, "ecdsa-p256" if ecdsa else "ed25519", passphrase)
    typer.echo(f"public key {public} (key ID {kid})")


@app.command()
def verify(reference: str = typer.Argument(..., help="REPOSITORY@sha256:<digest>, or REPOSITORY:TAG (resolved once)"),
           key: list[Path] = typer.Option(..., "--key", help="trusted ed25519 or P-256 public key (PEM); repeat for "
                                          "several "
                                          "(any of them trusted)"),
           require_all_keys: bool = typer.Option(False, "--require-all-keys",
                                                 help="each --key must have signed all three attestations"),
           platform: Optional[str] = typer.Option(None, "--platform", help="REFERENCE is a multi-arch index: "
                                                  "verify its member for this os/arch (/variant) against that "
                                                  "member's own acceptance"),
           ) -> None:
    """Check the attestations a trusted key signed for a published image; others are listed as untrusted.
    Exit 0 all pass, 1 naming the first failed check."""
    from builder.pipeline import releasing  # lazy: start-up

    outcome = releasing.verify(reference, key, settings(), require_all_keys=require_all_keys, platform=platform)
    for line in outcome.passed:
        typer.echo(f"ok  {line}")
    for line in (outcome.untrusted, outcome.foreign):
        if line:
            typer.echo(fit(line))
    typer.echo(f"VERIFIED {outcome.reference}")


@app.command()
def nightly(pins_paths: list[Path] = typer.Argument(..., help="pins files (YAML); several run as a fleet"),
            follow_prs: bool = typer.Option(False, "--follow-prs", rich_help_panel=SOURCES,
                                            help="move each component to its PR's current head"),
            publish: bool = typer.Option(False, "--publish", rich_help_panel=OUTPUT,
                                         help="publish and move the nightly tags if ACCEPTED"),
            out: Optional[Path] = typer.Option(None, "--out", rich_help_panel=OUTPUT,
                                               help="run directory for the report (several pins files: one "
                                                    "<n>-<stem> directory each under it)"),
            key: Optional[Path] = SigningKey,
            jobs: Optional[int] = typer.Option(None, "--jobs", help="with several pins files: how many run at once "
                                               "(1..64; default 1, with --slurm all: the cluster schedules the gates)"),
            slurm: bool = SlurmOpt,
            bisect_red: bool = typer.Option(False, "--bisect", help="when a gate flips from pass to fail against "
                                            "the last accepted night: `builder bisect` it (docs/bisect.md)")) -> None:
    """Rebuild and accept, then diff with the last accepted run of the same pins name.
    Exit codes as `run`, plus 4 when accepted but a regression flag is up; several pins files run in
    parallel processes (at most --jobs at once) and the most severe exit code is the fleet's. With --slurm
    each run builds here and submits its gates to Slurm."""
    from builder.gating.plan import Flags  # lazy: start-up

    flags = Flags(slurm=slurm, stage=True, out=out, key=key, publish=publish, follow_prs=follow_prs)
    if len(pins_paths) > 1:
        from builder.pipeline import nightly_runs  # lazy: start-up

        raise typer.Exit(nightly_runs.nightly_fleet(pins_paths, flags, settings(), jobs))
    pins = load_pins(pins_paths[0])  # bad input is refused before the pipeline is imported
    plan = make_plan(pins, flags)
    from builder.pipeline import nightly_runs  # lazy: start-up

    nightly_runs.nightly(pins, plan, settings(), bisect_red=bisect_red)


@app.command()
def history(name: Optional[list[str]] = typer.Option(None, "--name", help="pins name (repeat; default: every name "
                                                     "in the history)"),
            html: Optional[Path] = typer.Option(None, "--html", help="the page to write (default: history.html "
                                                "beside the history's rows)"),
            last: int = typer.Option(365, "--last", min=1, max=100_000, help="nights per pins name")) -> None:
    """Write the nightly history as one self-contained HTML page (trends, failure classes, a failing night in red,
    the newest night against the last accepted one); prints its path."""
    from builder.pipeline import nightly_runs  # lazy: start-up

    typer.echo(str(nightly_runs.history_page(settings(), names=name or None, last=last, out=html)))


@app.command()
def compare(a: str = typer.Argument(..., help="report.json of the baseline, or last-accepted (the newest accepted "
                                    "run of B's pins name before B)"),
            b: str = typer.Argument(..., help="report.json of the candidate"),
            fmt: str = typer.Option("md", "--format", help="md | json | html")) -> None:
    """What moved from run A to run B: commits, lock lines, layers (digest, size), gate evidence, and whether the
    throughput moved beyond the performance gate's noise."""
    from builder.pipeline import nightly_runs  # lazy: start-up

    typer.echo(nightly_runs.compare(a, b, settings(), fmt=fmt))


@app.command("bisect")
def bisect_cmd(good: Optional[Path] = typer.Argument(None, help="GOOD: a pins file or a run's report.json"),
               bad: Optional[Path] = typer.Argument(None, help="BAD: a pins file or a run's report.json"),
               good_night: Optional[str] = typer.Option(None, "--good-night", help="GOOD from the nightly history: "
                                                        "a run id, or a date YYYY-MM-DD (that day's latest night)"),
               bad_night: Optional[str] = typer.Option(None, "--bad-night", help="BAD from the nightly history"),
               name: Optional[str] = typer.Option(None, "--name", help="with --*-night: the pins name"),
               gate: Optional[list[str]] = typer.Option(None, "--gate", rich_help_panel=WHAT,
                                                        help="run only these gates (default: those that fail in BAD)"),
               max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, max=10_000,
                                                       help="at most this many builds; then exit 1 naming the range "
                                                            "that is left (a rerun resumes)"),
               json_out: Optional[Path] = typer.Option(None, "--json", rich_help_panel=OUTPUT,
                                                       help="also write the answer as JSON here"),
               out: Optional[Path] = typer.Option(None, "--out", rich_help_panel=OUTPUT,
                                                  help="bisect directory: state file, steps' reports, answer (default: "
                                                       "one per GOOD and BAD under the cache, so a rerun resumes)"),
               slurm: bool = SlurmOpt, offline: bool = Offline) -> None:
    """The first bad commit between GOOD and BAD across the three repositories: which component, then a binary
    search over its commits (skipping what does not build); exit 0 when a commit or range is named, 1 when BAD
    passes, GOOD fails or --max-steps runs out, 2 bad input, 3 infrastructure, 130 interrupted (resumable)."""
    from builder.gating.plan import Flags  # lazy: start-up

    config = settings()
    if (good is None) == (good_night is None) or (bad is None) == (bad_night is None):
        raise BadInput("bisect: expected GOOD (or --good-night) and BAD (or --bad-night), one of each")
    from builder.pipeline import bisecting  # lazy: start-up

    good = good or bisecting.bisect_night(config, name, str(good_night), "--good-night")
    bad = bad or bisecting.bisect_night(config, name, str(bad_night), "--bad-night")

    answer = bisecting.bisect(good, bad, config, Flags(gates=gate or (), slurm=slurm, offline=offline, out=out),
                             json_path=json_out, max_steps=max_steps)
    first = answer.get("first_bad")
    typer.echo(f"first bad: {first['component']} {first['commit']} (PR #{first['pr']}) {first['subject']}; "
               f"{first['gate']}: {first['reason']}" if first else
               f"first bad: one of {', '.join(c[:12] for c in answer['range'])} (skipped commits border it)")


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code. The one place errors become exit codes: a BuilderError
    prints its one line (its details after it) and gives its code; a usage error is one `error:` line,
    exit 2; a full disk or a lost engine or registry is InfraError (3); SIGINT and SIGTERM end as
    Interrupted (130) after the stages' own clean-up ran."""
    from builder.core import faults  # lazy: start-up (requests, docker error types)

    try:
        return run_app(app, argv)
    except KeyboardInterrupt as err:
        interrupted(err)
        return Interrupted.exit_code
    except BuilderError as err:
        return _report(err)
    except Exception as err:
        if not faults.infrastructure(err):
            raise
        return _report(InfraError(f"infrastructure: {faults.describe(err)}"))


def main(argv: list[str] | None = None) -> None:
    from builder.core import faults  # lazy: start-up

    faults.interrupt_on_sigterm()
    sys.exit(run(argv))

def _report(err: BuilderError) -> int:
    stream = sys.stdout if err.headline().startswith("FAILED ") else sys.stderr
    print(fit(err.headline()), file=stream)
    for path in getattr(err, "logs", []):  # whole, on its own line: a path to paste
        print(f"log: {path}", file=sys.stderr)
    for line in err.details:
        print(f"  | {line}", file=sys.stderr)
    return err.exit_code


if __name__ == "__main__":
    main()
