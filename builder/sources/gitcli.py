"""The git CLI for fetching into mirrors (pygit2 reads them; see builder/sources/mirror.py).

Every call runs with a fixed environment: no prompts, no auto-gc (mirror objects are never
removed), C locale. A git config file (the BUILDER_GIT_CONFIG setting) is included with
`-c include.path=FILE`, so its url.<base>.insteadOf rewrites apply to every fetch, submodules
too. A local repository (plain path or file://, after rewriting) that does not exist is bad
input (exit 2); a fetch that fails otherwise is an infrastructure error (exit 3).
"""
import shutil
import subprocess
from pathlib import Path

from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings

SETTINGS = ("-c", "gc.auto=0", "-c", "maintenance.auto=false", "-c", "fetch.writeCommitGraph=false",
            "-c", "core.askPass=", "-c", "credential.interactive=false")


def _run(settings: Settings, args: list[str], what: str) -> str:
    exe = shutil.which("git")
    if exe is None:
        raise InfraError("git: not found on PATH (install git; fetches use the git CLI)")
    include = ["-c", f"include.path={settings.git_config}"] if settings.git_config else []
    env = {**dict(settings.git_env), "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_ASKPASS": "", "SSH_ASKPASS": ""}
    proc = subprocess.run([exe, *include, *SETTINGS, *args], check=False, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise InfraError(f"{what}: {lines[-1] if lines else f'git exited {proc.returncode}'}")
    return proc.stdout


def effective_url(settings: Settings, url: str) -> str:
    """url after url.<base>.insteadOf rewrites (git's own rule: the longest matching base)."""
    return _run(settings, ["ls-remote", "--get-url", url], f"{url}: git config").strip() or url


def local_path(url: str) -> Path | None:
    """The directory a local URL names (/abs/path or file:///abs/path), else None."""
    if url.startswith("file://"):
        return Path(url[len("file://"):])
    return Path(url) if url.startswith("/") else None


def check_local(settings: Settings, url: str) -> str:
    """The effective URL; BadInput when it is a local path with no repository at it."""
    actual = effective_url(settings, url)
    path = local_path(actual)
    shown = url if actual == url else f"{url} (rewritten to {actual})"
    if path is not None and not path.exists():
        raise BadInput(f"{shown}: no such local repository {path}")
    if path is not None and not (path / "HEAD").exists() and not (path / ".git").exists():
        raise BadInput(f"{shown}: {path} is not a git repository")
    return actual


def ls_remote(settings: Settings, url: str, refs: list[str]) -> dict[str, str]:
    """{ref: sha} of the given exact ref names that the remote advertises."""
    check_local(settings, url)
    out = _run(settings, ["ls-remote", "--", url, *refs], f"{url}: fetch failed")
    found = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name in refs:
            found[name] = sha
    return found


def fetch(settings: Settings, git_dir: Path, url: str, refspecs: list[str]) -> None:
    """Fetch exactly refspecs (and tags pointing into them) from url into the bare repo git_dir."""
    check_local(settings, url)
    _run(settings, ["--git-dir", str(git_dir), "fetch", "--quiet", "--no-write-fetch-head", "--", url, *refspecs],
         f"{url}: fetch failed")
