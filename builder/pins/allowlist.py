"""Allow-lists for what a pins file may hand to pip and to the environment of a build or a run.

pip_args: each entry is one argv word that pip parses with optparse, so it is read here the same way:
a long option may be abbreviated to any unique prefix (`--find=x` is `--find-links=x`), and short
options cluster (`-cfoo` is `-c foo`, `-qq` is `-q -q`). Whatever pip would read, it must be one of
PIP_FLAGS / PIP_VALUED, written out in full (no abbreviation), a value given with `=` in the same word.
The lock decides where packages come from and where they land, so index, find-links, constraint,
requirement, target, prefix, root, user, config and build-option words are never allowed.

Environment names (build.env, install.env, recipe env maps): the families that steer pip, the Python
interpreter, the dynamic linker, the shell or the network are refused (ENV_REFUSED_PREFIXES/NAMES); a
few harmless PYTHON* names are allowed (ENV_PYTHON_ALLOWED).
"""
from __future__ import annotations

import re

from builder.core.safetext import show

# what reaches the network in a Dockerfile line (the template lint refuses it; pins refuse it first in
# env values that become ENV lines, so the refusal names the pins field)
NETWORK_RX = re.compile(r"https?://|ftp://|\bgit (clone|fetch|pull)\b|\bcurl\b|\bwget\b|\bpip download\b")

# what `pip install` understands (pip 23-25, install and general options); used only to read words as
# pip reads them. A superset is the safe direction: more names make an abbreviation ambiguous, not another.
PIP_LONG_FLAGS = (
    "--break-system-packages", "--check-build-dependencies", "--compile", "--debug", "--disable-pip-version-check",
    "--dry-run", "--force-reinstall", "--help", "--ignore-installed", "--ignore-requires-python", "--isolated",
    "--no-build-isolation", "--no-cache-dir", "--no-clean", "--no-color", "--no-compile", "--no-dependencies",
    "--no-deps", "--no-index", "--no-input", "--no-python-version-warning", "--no-use-pep517", "--no-user",
    "--no-warn-conflicts", "--no-warn-script-location", "--pre", "--prefer-binary", "--quiet", "--require-hashes",
    "--require-venv", "--require-virtualenv", "--upgrade", "--use-pep517", "--user", "--verbose", "--version")
PIP_LONG_VALUED = (
    "--abi", "--all-releases", "--build-constraint", "--cache-dir", "--cert", "--client-cert", "--config-settings",
    "--constraint", "--default-timeout", "--editable", "--exists-action", "--extra-index-url", "--find-links",
    "--global-option", "--group", "--implementation", "--index-url", "--keyring-provider", "--local-log", "--log",
    "--log-file", "--no-binary", "--only-binary", "--only-final", "--platform", "--prefix", "--progress-bar",
    "--proxy", "--pypi-url", "--python", "--python-version", "--report", "--resume-retries", "--retries",
    "--root", "--root-user-action", "--source", "--source-dir", "--source-directory", "--src", "--target",
    "--timeout", "--trusted-host", "--upgrade-strategy", "--uploaded-prior-to", "--use-deprecated",
    "--use-feature", "--requirement")
PIP_SHORT = {"-C": True, "-I": False, "-U": False, "-V": False, "-c": True, "-e": True, "-f": True, "-h": False,
             "-i": True, "-q": False, "-r": True, "-t": True, "-v": False}  # option: takes a value

# the allowed words (documented in docs/pins.md, Rules); nothing else reaches pip
PIP_FLAGS = frozenset({
    "--no-deps", "--no-dependencies", "--no-build-isolation", "--no-cache-dir", "--no-compile", "--compile",
    "--no-clean", "--no-warn-script-location", "--no-warn-conflicts", "--force-reinstall", "--ignore-installed",
    "--no-index", "--prefer-binary", "--require-hashes", "--check-build-dependencies", "--use-pep517",
    "--no-use-pep517", "--disable-pip-version-check", "--no-color", "--no-input", "--quiet", "--verbose",
    "-q", "-v",
    "--ignore-requires-python",  # megatron-core says >=3.12 and imports on 3.11 (the demo base)
})
PIP_VALUED = {
    "--only-binary": r"(:all:|:none:|[A-Za-z0-9][A-Za-z0-9._-]*)(,[A-Za-z0-9][A-Za-z0-9._-]*)*",
    "--no-binary": r"(:all:|:none:|[A-Za-z0-9][A-Za-z0-9._-]*)(,[A-Za-z0-9][A-Za-z0-9._-]*)*",
    "--progress-bar": r"on|off|raw",
    "--root-user-action": r"warn|ignore",
}

ENV_PYTHON_ALLOWED = frozenset({"PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
                                "PYTHONFAULTHANDLER", "PYTHONIOENCODING", "PYTHONUTF8"})
ENV_REFUSED_PREFIXES = ("PIP_", "PYTHON", "_PYTHON", "LD_", "DYLD_", "UV_", "CONDA_", "VIRTUAL_ENV",
                        "SETUPTOOLS_", "DISTUTILS_", "PEP517_", "GIT_", "SSL_CERT_", "BASH_FUNC_")
ENV_REFUSED_NAMES = frozenset({
    "PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "IFS", "PS4", "PROMPT_COMMAND", "PERL5OPT", "NODE_OPTIONS",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "FTP_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "NETRC", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "TMPDIR", "USER", "LOGNAME", "CC_WRAPPER"})


def _long(word: str) -> tuple[str, bool]:
    """(the option pip reads, takes a value) for `--name[=...]`, resolving abbreviations as optparse does."""
    opt = word.split("=", 1)[0]
    names = PIP_LONG_FLAGS + PIP_LONG_VALUED
    if opt in names:
        return opt, opt in PIP_LONG_VALUED
    matches = [n for n in names if n.startswith(opt)]
    if len(matches) == 1:
        return matches[0], matches[0] in PIP_LONG_VALUED
    if matches:
        raise ValueError(f"{show(word)} is ambiguous to pip ({', '.join(sorted(matches)[:4])}...);"
                         " write an allowed option in full")
    raise ValueError(f"{show(word)} is not a pip option that pip install knows")


def _refuse(word: str, option: str) -> ValueError:
    as_read = "" if word.split("=", 1)[0] == option else f" (pip reads it as {show(option)})"
    return ValueError(f"{show(word)}{as_read} is not an allowed pip option; the lock decides sources and"
                      " install location (allowed: docs/pins.md, pip_args)")


def check_pip_arg(word: str) -> str:
    """Return `word` when every option pip would read from it is allowed; ValueError naming the option."""
    if not isinstance(word, str) or not word.startswith("-") or word in ("-", "--"):
        raise ValueError(f"expected one pip option like '--no-deps' (no positional words), got {show(word)}")
    if word.startswith("--"):
        option, valued = _long(word)
        if option != word.split("=", 1)[0]:
            if option in PIP_FLAGS or option in PIP_VALUED:
                raise ValueError(f"{show(word)} abbreviates {option}; write it in full")
            raise _refuse(word, option)
        if option not in PIP_FLAGS and option not in PIP_VALUED:
            raise _refuse(word, option)
        if not valued and "=" in word:
            raise ValueError(f"{show(word)}: {option} takes no value")
        if valued:
            value = word.split("=", 1)[1] if "=" in word else None
            if value is None:
                raise ValueError(f"{show(word)}: give the value in the same word, like {option}=VALUE")
            if not re.fullmatch(PIP_VALUED[option], value):
                raise ValueError(f"{show(word)}: value {show(value)} is not one of {PIP_VALUED[option]}")
        return word
    rest = word[1:]
    while rest:  # a short-option cluster, read left to right as optparse does
        option = "-" + rest[0]
        if option not in PIP_SHORT:
            raise ValueError(f"{show(word)}: {option} is not a pip option that pip install knows")
        if PIP_SHORT[option]:
            raise _refuse(word, f"{option} {rest[1:]}".strip())
        if option not in PIP_FLAGS:
            raise _refuse(word, option)
        rest = rest[1:]
    return word


def check_build_env_value(value: str) -> str:
    """An ENV value of the image build: nothing the lint would read as network access."""
    found = NETWORK_RX.search(value)
    if found:
        raise ValueError(f"expected a value without network access ({show(found.group(0))}), got {show(value)};"
                         " the build runs with network none")
    return value


def check_env_name(name: str) -> str:
    """Refuse names that steer pip, Python, the linker, the shell or the network (see the module doc)."""
    upper = name.upper()
    if upper in ENV_PYTHON_ALLOWED:
        return name
    if upper in ENV_REFUSED_NAMES or upper.startswith(ENV_REFUSED_PREFIXES) or upper.endswith("_PROXY"):
        raise ValueError(f"{show(name)} steers pip, the interpreter, the linker, the shell or the network;"
                         " not allowed (PYTHON* only: " + ", ".join(sorted(ENV_PYTHON_ALLOWED)) + ")")
    return name
