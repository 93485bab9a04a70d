"""Every setting read from the environment, read once into one frozen `Settings` (the pins file and
CLI flags are the rest). The CLI calls `Settings.from_env()` and passes the object down.

`VARIABLES` lists them; docs/settings.md is generated from it (`make docs`: tests/gendocs.py)
and a test checks that every variable read here is listed.
"""
from __future__ import annotations

import configparser
import os
import re
import shlex
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from builder.core import files as fs
from builder.core.errors import BadInput

PACKAGE = Path(__file__).resolve().parent
ENROOT_SQUASH_OPTIONS = "-comp lzo -noD"   # enroot's default (doc/configuration.md, doc/cmd/import.md)
# The shipped default: enroot's, with mksquashfs's fast LZO variant. Data blocks stay uncompressed (-noD); only
# metadata and fragments are LZO, which every reader decompresses alike (lzo1x_1 and mksquashfs's default
# lzo1x_999 share one format). Measured on the 1 GB demo image: 3.5 s instead of 73 s, 2.7% larger (docs/cluster.md).
SQUASH_OPTIONS = "-comp lzo -Xalgorithm lzo1x_1 -noD"


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    what: str


def pip_default_index() -> str:
    """The index pip uses when nothing configures one (pip's own constant: no host is written here)."""
    from pip._internal.models.index import PyPI  # lazy: pip's default, read only when no index is set

    return str(PyPI.simple_url)


VARIABLES: tuple[Variable, ...] = (
    Variable("BUILDER_CACHE", "`<checkout>/.cache`, installed: `~/.cache/rl-image-builder`",
             "cache root: mirrors, wheels, contexts, runs, logs, history, keys"),
    Variable("BUILDER_REGISTRY_USERNAME", "unset", "basic auth for push and verify (with the password: both or "
             "neither); never written to the image, report or logs"),
    Variable("BUILDER_REGISTRY_PASSWORD", "unset", "the password of `BUILDER_REGISTRY_USERNAME`"),
    Variable("BUILDER_REGISTRY_HOST", "the pins' `image.repository` host", "the one registry host that "
             "`BUILDER_REGISTRY_*` credentials are sent to; every other host gets Docker's or containers' "
             "credentials (registries.md)"),
    Variable("DOCKER_CONFIG", "`~/.docker`", "Docker's config directory: `config.json`'s `auths`, `credsStore` and "
             "`credHelpers` give a host's registry credentials"),
    Variable("REGISTRY_AUTH_FILE", "unset", "containers' `auth.json`, read after Docker's config"),
    Variable("BUILDER_REGISTRY_CERTS_D", "`/etc/docker/certs.d`", "per-host TLS: `<host[:port]>/*.crt` CAs, "
             "`*.cert`/`*.key` client certificates, as Docker reads them"),
    Variable("BUILDER_REGISTRY_CA_BUNDLE", "unset", "a PEM CA bundle trusted for every registry beside the default "
             "roots; else `REQUESTS_CA_BUNDLE`, else `SSL_CERT_FILE`"),
    Variable("REQUESTS_CA_BUNDLE", "unset", "a CA bundle for registries when `BUILDER_REGISTRY_CA_BUNDLE` is unset"),
    Variable("SSL_CERT_FILE", "unset", "a CA bundle for registries when neither of the above is set"),
    Variable("BUILDER_INSECURE_REGISTRIES", "unset", "space-separated `host[:port]`s spoken to as Docker's "
             "`insecure-registries`: HTTPS without verification, then plain HTTP; loopback hosts are plain HTTP"),
    Variable("BUILDER_KEY_PASSPHRASE", "unset", "the passphrase of an encrypted signing key (PKCS#8)"),
    Variable("BUILDER_KEY_PASSPHRASE_FILE", "unset", "a file holding that passphrase (its first line)"),
    Variable("BUILDER_INDEX_URL", "pip's own default index", "package index `builder lock` resolves and downloads "
             "from (the host's pip configuration never chooses it: lock.md)"),
    Variable("BUILDER_FIND_LINKS", "unset", "wheel folders (or pages), space-separated, that `builder lock` and "
             "the demo base resolve from beside that index (pip's and uv's `--find-links`); the lock header states them"),
    Variable("PIP_CERT", "unset", "a CA bundle for that index, kept for `builder lock`'s pip and uv runs, as are "
             "`PIP_PROXY`, `PIP_TIMEOUT`, `PIP_RETRIES`, `PIP_CLIENT_CERT`, `PIP_TRUSTED_HOST` and those keys of the "
             "host's pip config files; every other `PIP_*` / `UV_*` setting and pip config key is dropped (lock.md)"),
    Variable("PIP_CONFIG_FILE", "unset", "a pip config file; like pip's other config files (`XDG_CONFIG_DIRS`, "
             "`/etc/pip.conf`, `HOME`, `XDG_CONFIG_HOME`) only its transport keys reach the lock"),
    Variable("HOME", "the user's", "where pip's user config file is looked for (transport keys only)"),
    Variable("XDG_CONFIG_HOME", "`~/.config`", "where pip's user config file is looked for (transport keys only)"),
    Variable("XDG_CONFIG_DIRS", "`/etc/xdg`", "where pip's global config files are looked for (transport keys only)"),
    Variable("BUILDER_DEBIAN_MIRROR", "http://deb.debian.org/debian", "debootstrap mirror of the demo base image"),
    Variable("BUILDER_ENGINE_TIMEOUT", "90", "seconds to wait for a started dockerd to answer"),
    Variable("BUILDER_REGISTRY_TIMEOUT", "30", "seconds for a registry to answer (start-up and each HTTP call)"),
    Variable("BUILDER_BUILD_TIMEOUT", "3600", "HTTP read timeout of a build: a step may print nothing for minutes"),
    Variable("BUILDER_PROGRESS_EVERY", "30", "seconds between a long phase's progress lines on the console (a `--quiet` "
             "build's steps and `[n/m]` counts, the demo base's debootstrap, apt and compiles)"),
    Variable("BUILDER_GIT_CONFIG", "unset", "a git config file included in every fetch, e.g. `url.<base>.insteadOf` "
             "mirrors (submodules too); see sources.md"),
    Variable("BUILDER_SIGNING_KEY", "unset", "ed25519 or ECDSA P-256 private key (PKCS#8 PEM, encrypted with "
             "`BUILDER_KEY_PASSPHRASE` allowed) that signs the acceptance result and the "
             "attestations on publish (`--key` overrides it)"),
    Variable("BUILDER_NOTIFY_URL", "unset", "webhook that `builder nightly` POSTs a Slack-compatible JSON message to when "
             "the verdict flips or a regression flag goes up (nightly.md); `http://` or `https://`; a failure is "
             "logged in one line and never changes the exit code"),
    Variable("BUILDER_NOTIFY_COMMAND", "unset", "a command run on the same events with that JSON on its stdin (split "
             "like a shell line, run without one)"),
    Variable("BUILDER_CCACHE", "on", "`off`: build native code without the compiler cache (builder/image/ccache.py)"),
    Variable("BUILDER_SQUASH_OPTIONS", f"`{SQUASH_OPTIONS}`", "mksquashfs compression of `export-sqsh`: enroot's "
             f"`ENROOT_SQUASH_OPTIONS` default (`{ENROOT_SQUASH_OPTIONS}`) with the fast LZO variant (cluster.md); flags "
             "and plain values only"),
    Variable("BUILDER_RUN_ID", "random per process", "scopes this run's local names (image tags `builder-run/<id>:...`;"
             " a build untags other runs' ones older than a day); `[a-z0-9-]`, 1..32"),
    Variable("BUILDER_SLURM_SHARED_DIR", "`<cache>/cluster-images`", "the site's directory that the submit host and "
             "the compute nodes share, for the candidate `.sqsh` of `--slurm` (the pins' `acceptance.slurm.shared_dir` "
             "names another for their runs)"),
    Variable("DOCKER_HOST", "the local socket", "which Docker engine (`unix://`, `tcp://`, `ssh://`)"),
    Variable("DOCKER_TLS_VERIFY", "unset", "TLS for a `tcp://` engine, as the Docker CLI reads it"),
    Variable("DOCKER_CERT_PATH", "unset", "the client certificate directory for `DOCKER_TLS_VERIFY`"),
)


def markdown() -> str:
    """docs/settings.md: every variable in VARIABLES, with its default and what it sets."""
    rows = [f"| `{v.name}` | {v.default} | {v.what} |" for v in VARIABLES]
    return "\n".join([
        "# Settings", "",
        "<!-- generated by `make docs` (tests/gendocs.py); edit VARIABLES in"
        " builder/core/options.py -->", "",
        "Everything comes from the pins file and the command's flags, except these environment variables. Each",
        "command reads them once into one frozen `Settings` (`builder/core/options.py`) that the CLI passes down;",
        "no other module reads its settings from the environment. A bad value is one line naming the variable, exit 2.", "",
        "| variable | default | what |", "|---|---|---|", *rows, ""])


def _default_cache(package: Path = PACKAGE, home: Path | None = None) -> Path:
    """`<checkout>/.cache` when the package runs from a checkout (an editable install: builder/ beside
    pyproject.toml), else `~/.cache/rl-image-builder` (an installed wheel). `package` is builder/core."""
    checkout = package.parent.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "builder" / "cli.py").is_file():
        return checkout / ".cache"
    return (home or Path.home()) / ".cache" / "rl-image-builder"


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise BadInput(f"{name}: expected seconds in (0, 86400], got {text[:40]!r}")
    return value


def _abs_dir(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name)
    if not value:
        return None
    if not value.startswith("/"):
        raise BadInput(f"{name}: expected an absolute path, got {value[:80]!r}")
    return Path(value)


def _find_links(env: Mapping[str, str]) -> tuple[str, ...]:
    links = tuple(env.get("BUILDER_FIND_LINKS", "").split())
    for link in links:
        if "://" not in link and not Path(link).is_dir():
            raise BadInput(f"BUILDER_FIND_LINKS: expected folders or URLs, {link[:80]!r} is not a folder")
    return links


def _ca_bundle(env: Mapping[str, str]) -> Path | None:
    found = [(name, value) for name, value in (("BUILDER_REGISTRY_CA_BUNDLE", env.get("BUILDER_REGISTRY_CA_BUNDLE")),
                                               ("REQUESTS_CA_BUNDLE", env.get("REQUESTS_CA_BUNDLE")),
                                               ("SSL_CERT_FILE", env.get("SSL_CERT_FILE"))) if value]
    if not found:
        return None
    name, value = found[0]
    if not Path(value).is_file():
        raise BadInput(f"{name}: expected a PEM CA bundle file, {value[:80]!r} is not a file")
    return Path(value)


def _passphrase(env: Mapping[str, str]) -> str | None:
    """The signing key's passphrase: BUILDER_KEY_PASSPHRASE, else the first line of BUILDER_KEY_PASSPHRASE_FILE."""
    if env.get("BUILDER_KEY_PASSPHRASE"):
        return env["BUILDER_KEY_PASSPHRASE"]
    named = env.get("BUILDER_KEY_PASSPHRASE_FILE", "")
    if not named:
        return None
    try:
        lines = Path(named).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        raise BadInput(f"BUILDER_KEY_PASSPHRASE_FILE: cannot read {named[:80]!r} as a text file") from None
    if not lines or not lines[0]:
        raise BadInput(f"BUILDER_KEY_PASSPHRASE_FILE: {named[:80]!r} is empty; expected the passphrase on its first line")
    return lines[0]


def _on_off(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "") or "on"
    if text not in ("on", "off"):
        raise BadInput(f"{name}: expected on or off, got {text[:40]!r}")
    return text == "on"


def _notify_url(env: Mapping[str, str]) -> str | None:
    value = env.get("BUILDER_NOTIFY_URL", "")
    if value and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise BadInput("BUILDER_NOTIFY_URL: expected an http:// or https:// URL")  # the value may hold a secret
    return value or None


def _notify_command(env: Mapping[str, str]) -> str | None:
    value = env.get("BUILDER_NOTIFY_COMMAND", "")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise BadInput(f"BUILDER_NOTIFY_COMMAND: expected a command line, {exc}") from None
    return value if words else None


# pip settings that only say how to reach the index (kept for the lock's pip and uv runs); every other pip
# setting may change what is resolved (constraint, extra-index-url, find-links, no-index, ...) and is dropped
PIP_TRANSPORT = ("cert", "client-cert", "proxy", "timeout", "default-timeout", "retries", "trusted-host")
UV_TRANSPORT = ("UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_INSECURE_HOST")


def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """The pip configuration files pip itself would read, lowest precedence first (pip's global, user and
    PIP_CONFIG_FILE variants; a PIP_CONFIG_FILE that exists replaces the user files)."""
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in dirs if d] + [Path("/etc/pip.conf")]
    named = env.get("PIP_CONFIG_FILE", "")
    home = Path(env.get("HOME") or Path.home())
    if not (named and Path(named).exists()):
        files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    if named and named != os.devnull:
        files.append(Path(named))
    return files


def _pip_transport(env: Mapping[str, str]) -> dict[str, str]:
    """{PIP_<KEY>: value} of the transport settings (PIP_TRANSPORT) in the host's pip configuration files
    ([global], then [download]/[install]) and its PIP_* variables (which win, as pip reads them)."""
    found: dict[str, str] = {}
    for path in pip_config_files(env):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "download", "install"):
            for key in PIP_TRANSPORT:
                if parser.has_option(section, key):
                    found["PIP_" + key.upper().replace("-", "_")] = " ".join(parser.get(section, key).split())
    for key in PIP_TRANSPORT:
        name = "PIP_" + key.upper().replace("-", "_")
        if env.get(name):
            found[name] = env[name]
    if env.get("PIP_CERT"):  # the CA bundle (the one most sites need)
        found["PIP_CERT"] = env["PIP_CERT"]
    return found


def _resolver_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The environment of the lock's pip and uv runs: the host's, minus every pip/uv setting that changes
    what is resolved (no config file, no PIP_*/UV_* but the transport ones: CA bundle, proxy, timeout)."""
    out = {k: v for k, v in env.items() if not k.startswith(("PIP_", "UV_")) or k in UV_TRANSPORT}
    transport = _pip_transport(env)
    out.update(transport, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1")
    if transport.get("PIP_CERT"):  # uv and the JSON API downloads read the CA bundle from here
        out["SSL_CERT_FILE"] = transport["PIP_CERT"]
    if transport.get("PIP_PROXY"):
        for name in ("HTTPS_PROXY", "HTTP_PROXY"):
            out.setdefault(name, transport["PIP_PROXY"])
    timeout = transport.get("PIP_TIMEOUT") or transport.get("PIP_DEFAULT_TIMEOUT")
    if timeout:
        out.setdefault("UV_HTTP_TIMEOUT", timeout)
    return tuple(sorted(out.items()))
SQUASH_WORD = re.compile(r"-[a-zA-Z][a-zA-Z0-9-]*|[a-z0-9][a-z0-9._]*")
SQUASH_REFUSED = ("-noappend", "-root-becomes", "-pf", "-sort", "-ef", "-cpiostyle", "-tar")


def check_squash_options(value: str, where: str) -> str:
    """mksquashfs compression options: flags and plain values only (no paths, no shell)."""
    words = value.split()
    if not words or not all(SQUASH_WORD.fullmatch(w) for w in words) or any(w in SQUASH_REFUSED for w in words):
        raise BadInput(f"{where}: expected mksquashfs compression options like {SQUASH_OPTIONS!r}, got {value!r}")
    return " ".join(words)


def _git_config(env: Mapping[str, str]) -> Path | None:
    """BUILDER_GIT_CONFIG: an existing git config file, made absolute (git includes it by path)."""
    value = env.get("BUILDER_GIT_CONFIG", "")
    if not value:
        return None
    path = Path(value).resolve()
    if not path.is_file():
        raise BadInput(f"BUILDER_GIT_CONFIG: expected an existing git config file, got {value!r}")
    return path


def failpoint() -> tuple[str, str]:
    """BUILDER_FAILPOINT and BUILDER_FAILPOINT_HOLD, read at each fail point (tests only; builder/core/faults.py)."""
    return os.environ.get("BUILDER_FAILPOINT", ""), os.environ.get("BUILDER_FAILPOINT_HOLD", "")


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus `extra`, for a child `builder` process (builder/nightly/fleet.py)."""
    return {**os.environ, **extra}


RUN_ID = re.compile(r"(?=.{1,32}$)[a-z0-9]+(?:-[a-z0-9]+)*")


def new_run_id() -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


PROCESS_RUN_ID = new_run_id()  # one run per process unless BUILDER_RUN_ID says otherwise


def _run_id(env: Mapping[str, str]) -> str:
    value = env.get("BUILDER_RUN_ID", "")
    if not value:
        return PROCESS_RUN_ID
    if not RUN_ID.fullmatch(value):
        raise BadInput(f"BUILDER_RUN_ID: expected 1..32 of [a-z0-9] in words joined by single '-', got {value[:40]!r}")
    return value


@dataclass(frozen=True)
class Settings:
    cache_root: Path
    registry_auth: tuple[str, str] | None
    debian_mirror: str
    engine_timeout_s: float
    registry_timeout_s: float
    build_timeout_s: float
    docker_host: str | None
    docker_tls_verify: str | None = None
    docker_cert_path: str | None = None
    index_url: str = ""  # set by from_env: BUILDER_INDEX_URL, else pip's own default
    find_links: tuple[str, ...] = ()  # BUILDER_FIND_LINKS: wheel folders or pages resolved from beside the index
    # the environment of `builder lock`'s pip/uv runs: the host's, minus its pip/uv configuration
    resolver_env: tuple[tuple[str, str], ...] = ()
    git_config: Path | None = None
    # the environment of the git CLI fetches (ssh agent, proxies, HOME for credentials; no BUILDER_*)
    git_env: tuple[tuple[str, str], ...] = ()
    signing_key: Path | None = None
    squash_options: str = SQUASH_OPTIONS
    compiler_cache: bool = True
    notify_url: str | None = None  # nightly notifications (builder/nightly/notify.py)
    notify_command: str | None = None
    # this run's scope for local names: concurrent runs on one engine never share a mutable tag
    run_id: str = PROCESS_RUN_ID
    progress_every_s: float = 30.0  # a long phase's progress lines: at most one this often
    slurm_shared_dir: Path | None = None  # the site's shared directory for .sqsh files (pins may name another)
    registry_host: str | None = None  # the host BUILDER_REGISTRY_* belong to (else: the release's, for_release)
    docker_config: Path | None = None  # DOCKER_CONFIG, else ~/.docker
    registry_auth_file: Path | None = None  # REGISTRY_AUTH_FILE (containers' auth.json)
    certs_d: Path = Path("/etc/docker/certs.d")
    ca_bundle: Path | None = None  # BUILDER_REGISTRY_CA_BUNDLE, REQUESTS_CA_BUNDLE or SSL_CERT_FILE
    insecure_registries: tuple[str, ...] = ()
    key_passphrase: str | None = None  # BUILDER_KEY_PASSPHRASE or the first line of BUILDER_KEY_PASSPHRASE_FILE

    def for_release(self, repository: str) -> Settings:
        """These settings with the release repository's host owning BUILDER_REGISTRY_* (unless
        BUILDER_REGISTRY_HOST named one)."""
        if self.registry_host or "/" not in repository:
            return self
        return replace(self, registry_host=repository.split("/", 1)[0])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        user = env.get("BUILDER_REGISTRY_USERNAME", "")
        password = env.get("BUILDER_REGISTRY_PASSWORD", "")
        if bool(user) != bool(password):
            raise BadInput("BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD: expected both set or both unset")
        return cls(
            cache_root=Path(env.get("BUILDER_CACHE") or _default_cache()).absolute(),
            registry_auth=(user, password) if user else None,
            debian_mirror=env.get("BUILDER_DEBIAN_MIRROR") or "http://deb.debian.org/debian",
            engine_timeout_s=_seconds(env, "BUILDER_ENGINE_TIMEOUT", 90.0),
            registry_timeout_s=_seconds(env, "BUILDER_REGISTRY_TIMEOUT", 30.0),
            build_timeout_s=_seconds(env, "BUILDER_BUILD_TIMEOUT", 3600.0),
            docker_host=env.get("DOCKER_HOST") or None,
            docker_tls_verify=env.get("DOCKER_TLS_VERIFY") or None,
            docker_cert_path=env.get("DOCKER_CERT_PATH") or None,
            index_url=env.get("BUILDER_INDEX_URL") or pip_default_index(),
            find_links=_find_links(env),
            resolver_env=_resolver_env(env),
            git_config=_git_config(env),
            git_env=tuple(sorted((k, v) for k, v in env.items() if not k.startswith("BUILDER_"))),
            signing_key=Path(env["BUILDER_SIGNING_KEY"]) if env.get("BUILDER_SIGNING_KEY") else None,
            squash_options=check_squash_options(env.get("BUILDER_SQUASH_OPTIONS") or SQUASH_OPTIONS,
                                                "BUILDER_SQUASH_OPTIONS"),
            compiler_cache=_on_off(env, "BUILDER_CCACHE"),
            notify_url=_notify_url(env), notify_command=_notify_command(env),
            run_id=_run_id(env),
            progress_every_s=_seconds(env, "BUILDER_PROGRESS_EVERY", 30.0),
            slurm_shared_dir=_abs_dir(env, "BUILDER_SLURM_SHARED_DIR"),
            registry_host=env.get("BUILDER_REGISTRY_HOST") or None,
            docker_config=Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else None,
            registry_auth_file=Path(env["REGISTRY_AUTH_FILE"]) if env.get("REGISTRY_AUTH_FILE") else None,
            certs_d=Path(env.get("BUILDER_REGISTRY_CERTS_D") or "/etc/docker/certs.d"),
            ca_bundle=_ca_bundle(env),
            insecure_registries=tuple(env.get("BUILDER_INSECURE_REGISTRIES", "").split()),
            key_passphrase=_passphrase(env),
        )

    def index_args(self) -> list[str]:
        """pip's and uv's index options: the configured index and find-links, nothing from the host's pip config."""
        return ["--index-url", self.index_url, *(a for link in self.find_links for a in ("--find-links", link))]

    def docker_environment(self) -> dict[str, str]:
        """What the Docker SDK's from_env reads, from these settings only."""
        pairs = {"DOCKER_HOST": self.docker_host, "DOCKER_TLS_VERIFY": self.docker_tls_verify,
                 "DOCKER_CERT_PATH": self.docker_cert_path}
        return {k: v for k, v in pairs.items() if v}

    def cache(self, *parts: str) -> Path:
        """A directory under the cache root, created on first use; the first use makes this run live
        (`live_lock`, held until the process ends), so a command refused before it touches the cache leaves none."""
        path = self.cache_root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        if parts[:1] != ("live",):
            fs.hold(self.live_lock())
        return path

    def live_lock(self, run_id: str | None = None) -> Path:
        """`<cache>/live/<run id>.lock`: held (shared) by every process of a live run; `builder gc` spares its things."""
        return self.cache("live") / f"{run_id or self.run_id}.lock"

    def run_log(self, name: str) -> Path:
        """`<cache>/logs/<run id>/<name>.log`: every log a run writes is its own (concurrent runs never share one)."""
        return self.cache("logs", self.run_id) / f"{name}.log"

    def __repr__(self) -> str:  # never show the password
        auth = "set" if self.registry_auth else "unset"
        return f"Settings(cache_root={str(self.cache_root)!r}, registry_auth={auth}, docker_host={self.docker_host!r})"

