"""The HPC container runtimes a gate step runs in, behind one small interface: what goes on srun's
command line, what the node runs once before the first gate (version, the image's environment), and the
isolation the runtime really gives. `charliecloud` runs here; `enroot` (pyxis) is written from pyxis'
documented flags only and was never executed here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

WORK = "/tmp/acceptance"   # the gate's output directory inside the container (the only host bind)


@dataclass(frozen=True)
class GateSpec:
    """One gate step: the .sqsh, the host directory it may write, the environment file the node wrote
    (charliecloud), extra variables, the command."""

    sqsh: str
    out_dir: str
    env_file: str
    env: dict[str, str]
    command: list[str]


class Runtime(Protocol):
    name: str

    def srun_args(self, spec: GateSpec) -> list[str]: ...       # flags of srun itself (pyxis' are srun flags)

    def argv(self, spec: GateSpec) -> list[str]: ...            # the task srun starts

    def version_command(self) -> str: ...                       # a shell command printing the version

    def env_command(self, sqsh: str, dest: str) -> str | None: ...  # writes the image's environment to dest

    def isolation(self) -> dict[str, str]: ...


class Charliecloud:
    """`ch-run IMAGE.sqsh` (mounted with squashfuse, read-only): a fresh container per call, the
    environment emptied and set from the image's /etc/environment (ch-run does not read it itself), a
    private /tmp, the gate's output directory the only bind, no home."""

    name = "charliecloud"

    def srun_args(self, spec: GateSpec) -> list[str]:
        return []

    def argv(self, spec: GateSpec) -> list[str]:
        sets = [f"--set-env={k}={v}" for k, v in sorted(spec.env.items())]
        return ["ch-run", "--private-tmp", "--unset-env=*", f"--set-env={spec.env_file}", *sets, "--env-no-expand",
                f"--bind={spec.out_dir}:{WORK}", "--cd=/tmp", spec.sqsh, "--", *spec.command]

    def version_command(self) -> str:
        return "ch-run --version 2>&1"

    def env_command(self, sqsh: str, dest: str) -> str | None:
        return f"ch-run --unset-env='*' {q(sqsh)} -- /bin/cat /etc/environment > \"{dest}\""  # dest: $n is the node

    def isolation(self) -> dict[str, str]:
        return {"network": "host: ch-run shares the host's network namespace (no network isolation)",
                "home": "not mounted (no --home)",
                "host_mounts": f"the gate's output directory at {WORK} (read-write); /etc/passwd, /etc/group, "
                               "/etc/hosts, /etc/resolv.conf from the host (ch-run's defaults); /dev, /proc, /sys",
                "tmp": "private tmpfs (--private-tmp)", "image": "read-only SquashFS (squashfuse)",
                "user": "the submitting user in an unprivileged user namespace",
                "environment": "emptied (--unset-env='*'), then the image's /etc/environment and the cache variables"}


class Enroot:
    """pyxis over enroot: `srun --container-image=X.sqsh ...` (pyxis' documented flags). NOT EXECUTED HERE:
    pyxis and enroot are not packaged on the test hosts; only the command line is tested."""

    name = "enroot"

    def srun_args(self, spec: GateSpec) -> list[str]:
        exports = ",".join(f"{k}={v}" for k, v in sorted(spec.env.items()))
        return [f"--container-image={spec.sqsh}", f"--container-mounts={spec.out_dir}:{WORK}:rw+rprivate",
                "--no-container-mount-home", "--container-readonly", "--container-workdir=/tmp",
                f"--export=NONE,{exports}" if exports else "--export=NONE"]

    def argv(self, spec: GateSpec) -> list[str]:
        return list(spec.command)

    def version_command(self) -> str:
        return "enroot version 2>&1"

    def env_command(self, sqsh: str, dest: str) -> str | None:
        return None  # enroot applies the image's /etc/environment itself

    def isolation(self) -> dict[str, str]:
        return {"network": "host: enroot shares the host's network namespace (no network isolation)",
                "home": "not mounted (--no-container-mount-home)",
                "host_mounts": f"the gate's output directory at {WORK}; enroot.conf and hooks of the site",
                "image": "read-only (--container-readonly)", "executed": "no: not executed here (no pyxis/enroot)"}


RUNTIMES: dict[str, type[Charliecloud] | type[Enroot]] = {"charliecloud": Charliecloud, "enroot": Enroot}


def get(name: str) -> Runtime:
    return RUNTIMES[name]()


def q(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"
