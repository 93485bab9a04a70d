"""The HPC container runtimes a gate step runs in, behind one small interface: what goes on srun's
command line, what the node runs once before the first gate (version, the image's environment), and the
isolation the runtime really gives. `charliecloud` runs here; `enroot` (pyxis) is written from pyxis'
documented flags only and was never executed here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

WORK = "/tmp/acceptance"   # the gate's output directory inside the container (the only host bind)
CACHE = "/tmp/cache"       # the compile caches inside the container's private /tmp


@dataclass(frozen=True)
class GateSpec:
    """One gate step's task on a node: the .sqsh, the host directory it may write, the environment file the node
    wrote (charliecloud), extra variables, the command; data mounts (source, target), always read-only; the names
    of the node's own variables that reach the container. `sqsh`, `out_dir` and `env_file` may name
    `$SLURMD_NODENAME` and `$SLURM_PROCID`: the task's shell expands them on its node."""

    sqsh: str
    out_dir: str
    env_file: str
    env: dict[str, str]
    command: list[str]
    mounts: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()
    scratch: tuple[str, str] | None = None   # the checkpoint scratch (source, target): the one writable data mount
    cache: str | None = None                 # the node-local JIT cache (a shell word on the node), at the cache dir


# Every task knows its rank and node inside the container, and the port its step reserved (--resv-ports).
RANK_ENV = ('--set-env=SLURM_PROCID="$SLURM_PROCID" --set-env=SLURM_NTASKS="$SLURM_NTASKS" '
            '--set-env=SLURM_JOB_ID="$SLURM_JOB_ID" --set-env=SLURMD_NODENAME="$SLURMD_NODENAME" '
            '--set-env=TRUEPOLICY_STEP_PORT="${SLURM_STEP_RESV_PORTS%%-*}"')


class Runtime(Protocol):
    name: str

    def srun_args(self, spec: GateSpec) -> list[str]: ...       # flags of srun itself (pyxis' are srun flags)

    def argv(self, spec: GateSpec) -> list[str]: ...            # the task srun starts

    def version_command(self) -> str: ...                       # a shell command printing the version

    def image_command(self, sqsh: str, command: str) -> str | None: ...  # a shell command run in the image, on a node

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
        """A shell on the node: the rank's output directory, the node's own variables that pass, then ch-run.
        Read-only data mounts: ch-run binds read-write, so the task first enters a user and mount namespace of
        its own (`unshare -rm`, no privilege needed), makes each source a read-only bind there, and ch-run binds
        that: a read-only flag set in a more privileged namespace is locked for ch-run's (mount(2), MNT_LOCK_READONLY)."""
        sets = " ".join(q(f"--set-env={k}={v}") for k, v in sorted(spec.env.items()))
        passes = " ".join(f'${{{k}+"--set-env={k}=${k}"}}' for k in spec.pass_env)
        if spec.pass_env:  # which of them the node's environment set (the rollout role lets them win)
            passes += ' --set-env="TRUEPOLICY_NODE_ENV=' + "".join(f"${{{k}+{k},}}" for k in spec.pass_env) + '"'
        binds = " ".join(q(f"--bind={src}:{dst}") for src, dst in (*spec.mounts, *([spec.scratch] if spec.scratch
                                                                                   else [])))
        if spec.cache:  # the node-local JIT cache at the container's cache directory (in its private /tmp)
            binds = f'--bind="$cache:{CACHE}" {binds}'
        targets = [dst for _, dst in (*spec.mounts, *([spec.scratch] if spec.scratch else []))]
        image = '"$w/root"' if targets else f'"{spec.sqsh}"'
        run = (f'ch-run --private-tmp --unset-env="*" --set-env="{spec.env_file}" {sets} {RANK_ENV} {passes} '
               f'--env-no-expand --bind="$out:{WORK}" {binds} --cd=/tmp {image} -- "$@"')
        if targets:  # the inner shell runs in the new namespaces: the root with mount points, read-only binds, ch-run
            ro = "".join(f" && mount --bind {q(src)} {q(src)} && mount -o remount,bind,ro {q(src)}"
                         for src, _ in spec.mounts)
            inner = (f"rc=3; {overlay_root(spec.sqsh, targets)}{ro} && "
                     f"{{ {run} & c=$!; {watch('squashfuse, pid $s')} & g=$!; wait $c; rc=$?; kill $g 2>/dev/null; "
                     f'[ -e "$w/fuse-gone" ] && rc={FUSE_GONE}; }}; {UNMOUNT}; exit $rc')
            run = f"exec unshare --user --map-root-user --mount /bin/sh -c {q(inner)} gate \"$@\""
        else:  # ch-run serves its own mount (libsquashfuse_ll): killed while its gate runs, it is the server gone
            run = f"{run} & c=$!; {CHRUN_FUSE}; wait $c; rc=$?; {chrun_ended()}; exit $rc"
        cache = f'cache="{spec.cache}"; mkdir -p "$cache" || exit 3; export cache; ' if spec.cache else ""
        script = f'out="{spec.out_dir}"; mkdir -p "$out" || exit 3; export out; {cache}{run}'
        return ["/bin/sh", "-c", script, "gate", *spec.command]

    def version_command(self) -> str:
        return "ch-run --version 2>&1"

    def image_command(self, sqsh: str, command: str) -> str | None:
        return f"ch-run --unset-env='*' {sqsh} -- {command}"  # sqsh, command: shell words of the node check

    def env_command(self, sqsh: str, dest: str) -> str | None:
        return f"{self.image_command(sqsh, '/bin/cat /etc/environment')} > {dest}"

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
        mounts = ",".join([f"{spec.out_dir}:{WORK}:rw+rprivate", *(f"{src}:{dst}:ro" for src, dst in spec.mounts),
                           *([f"{spec.scratch[0]}:{spec.scratch[1]}:rw"] if spec.scratch else [])])
        return [f"--container-image={spec.sqsh}", f"--container-mounts={mounts}",
                "--no-container-mount-home", "--container-readonly", "--container-workdir=/tmp",
                "--export=" + ",".join(["NONE", *([exports] if exports else []), *spec.pass_env])]

    def argv(self, spec: GateSpec) -> list[str]:
        return list(spec.command)

    def version_command(self) -> str:
        return "enroot version 2>&1"

    def image_command(self, sqsh: str, command: str) -> str | None:
        return None  # the node check runs no command in the image: enroot creates mount points itself

    def env_command(self, sqsh: str, dest: str) -> str | None:
        return None  # enroot applies the image's /etc/environment itself

    def isolation(self) -> dict[str, str]:
        return {"network": "host: enroot shares the host's network namespace (no network isolation)",
                "home": "not mounted (--no-container-mount-home)",
                "host_mounts": f"the gate's output directory at {WORK}; enroot.conf and hooks of the site",
                "image": "read-only (--container-readonly)", "executed": "no: not executed here (no pyxis/enroot)"}


# A gate's .sqsh mount whose FUSE server is gone must not hang its node: a process waiting on a request the server
# had read stays in D state (unkillable) for as long as any other process holds the connection's /dev/fuse. The task
# ends its own connection through fusectl (/sys/fs/fuse/connections/N/abort, writable by the mount's owner; the
# cluster's set-up mounts fusectl), says so on one line naming the node (the runner's inconclusive), and exits 75.
FUSE_GONE = 75
FUSE_LINE = "builder-fuse:"


def alive(pid: str) -> str:
    """Shell test: process `pid` (a shell word) runs (a zombie does not)."""
    return f'[ -d /proc/{pid} ] && [ "$(cut -d " " -f 3 /proc/{pid}/stat 2>/dev/null)" != Z ]'


# n: the connection (the mount's device minor) of ch-run's own mount, the last fuse mount of ch-run (pid $c), read
# once it has forked the container (so after mounting); empty when ch-run ends first
CHRUN_FUSE = (f'n=; i=0; while [ $i -lt 400 ] && {alive("$c")}; do '
              'if [ -n "$(cat /proc/$c/task/$c/children 2>/dev/null)" ]; then '
              'n=$(awk \'{ for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) ~ /^fuse(\\.|$)/) '
              '{ split($3, d, ":"); m = d[2] } break } } END { print m }\' /proc/$c/mountinfo); break; fi; '
              'i=$((i + 1)); sleep 0.05; done')
# the overlay route: the connection of the squashfuse mount at "$w/img" (empty until mounted)
IMG_DEV = 'awk -v m="$w/img" \'$5 == m { split($3, d, ":"); print d[2] }\' /proc/self/mountinfo'


def abort(server: str) -> str:
    """Shell: end FUSE connection $n, whose server (`server`, shell words) is gone, and say so on stderr."""
    where = "/sys/fs/fuse/connections/$n"
    return (f'if [ -e "{where}/abort" ]; then echo 1 > "{where}/abort"; how="FUSE connection $n aborted"; '
            'else how="FUSE connection $n left as it is: fusectl is not mounted at /sys/fs/fuse/connections"; fi; '
            f'echo "{FUSE_LINE} node $SLURMD_NODENAME: the FUSE server of the .sqsh mount ({server}) is gone while '
            'the gate ran; $how" >&2')


def chrun_ended() -> str:
    """Shell after `wait $c` (rc): ch-run ended by a signal while its mount lives on (a process of the container
    outlived its server): end the connection, exit 75. A ch-run that ended with its container leaves no connection."""
    return (f'if [ $rc -gt 128 ] && [ -n "$n" ] && [ -d "/sys/fs/fuse/connections/$n" ]; then '
            f'{abort("ch-run, pid $c, ended by signal $((rc - 128))")}; rc={FUSE_GONE}; fi')


def watch(server: str) -> str:
    """Shell (in the background beside ch-run, pid $c): once the server (pid $s) is gone while ch-run runs, end
    connection $n and leave "$w/fuse-gone"."""
    return (f"( while {alive('$s')}; do sleep 1; done; if {alive('$c')}; then {abort(server)}; "
            ': > "$w/fuse-gone"; fi )')


# the task's own mounts go before its namespace does: squashfuse exits once its mount is gone
UNMOUNT = 'umount "$w/root" && umount "$w/img" && rm -rf "$w"'


def overlay_root(sqsh: str, targets: list[str]) -> str:
    """Shell (in the task's user and mount namespace) making "$w/root": the .sqsh mounted with squashfuse under a
    read-only overlayfs (unprivileged from Linux 5.11, no upper layer) whose first lower layer holds only the mount targets as
    empty directories. ch-run binds only onto directories the image has; this way a data mount's target (a site's
    /models/...) exists without being added to the image, as pyxis/enroot create mount points.
    squashfuse stays in the foreground, a child of the task (pid $s): Slurm ends it with the step, where a daemon
    would outlive a killed task. $n: its FUSE connection (the mount's device minor), once mounted (10 s at most)."""
    points = " ".join(f'"$w/pts"{q(t)}' for t in targets)
    return (f'w=$(mktemp -d) && mkdir -p "$w/img" "$w/root" {points} && {{ squashfuse -f "{sqsh}" "$w/img" & s=$!; }} '
            f'&& i=0 && while n=$({IMG_DEV}); [ -z "$n" ] && [ $i -lt 100 ] && {alive("$s")}; do i=$((i + 1)); '
            'sleep 0.1; done && [ -n "$n" ] && mount -t overlay overlay -o "lowerdir=$w/pts:$w/img" "$w/root"')


RUNTIMES: dict[str, type[Charliecloud] | type[Enroot]] = {"charliecloud": Charliecloud, "enroot": Enroot}


def get(name: str) -> Runtime:
    return RUNTIMES[name]()


def q(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"
