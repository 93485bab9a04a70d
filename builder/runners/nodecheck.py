"""The check step on every node of an allocation, before the first gate: which .sqsh the node will mount and
its sha256, hashed on the node; the runtime's version, the node's GPUs and address, the image's environment.

Where the site stages images to node-local disk (acceptance.slurm.node_local_dir, `%n` the node's name), the
node's copy is content-addressed (`<dir>/<sha256>.sqsh`) and filled under a per-node lock (flock on
`<dir>/<sha256>.lock`): a part file, hashed, then renamed into place, so a concurrent job never sees a
half-written file. A copy already there is hashed before use; one that does not match is never mounted: it is
removed (a rerun fills it again) and the gate fails naming the node."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.runners.slurm_runtimes import UNMOUNT, Runtime, overlay_root, q

# OpenSSL's sha256 uses the CPU's SHA instructions (3.4x coreutils' sha256sum here); sha256sum where a node has none.
SCRIPT = r"""n=${SLURMD_NODENAME:-$(hostname -s)}; src=$1; want=$2; work=$3; dir=$4
hash() { if command -v openssl >/dev/null; then openssl dgst -sha256 -r "$1" | cut -c1-64; else sha256sum "$1" | cut -c1-64; fi; }
s=$(date +%s.%N); use=$src; staged=shared
if [ -n "$dir" ]; then
  dir=$(printf '%s' "$dir" | sed "s/%n/$n/g"); mkdir -p "$dir" || exit 3; use="$dir/$want.sqsh"
  case ",$(findmnt -no OPTIONS --target "$dir" 2>/dev/null)," in *,noexec,*) echo "node=$n"; echo "noexec=$dir"; exit 4;; esac
  exec 9>"$dir/$want.lock"; flock 9
  if [ -f "$use" ]; then
    h=$(hash "$use"); staged=hit
    if [ "$h" != "$want" ]; then staged="stale:$h"; rm -f "$use"; fi
  else
    part="$use.part.$$"; cp "$src" "$part" && h=$(hash "$part"); staged=filled
    if [ "$h" = "$want" ]; then mv "$part" "$use"; else rm -f "$part"; fi
  fi
  flock -u 9
else h=$(hash "$src"); fi
e=$(date +%s.%N)
echo "node=$n"; echo "path=$use"; echo "sha256=$h"; echo "staged=$staged"; echo "seconds=$(awk "BEGIN{print $e - $s}")"
echo "size=$(stat -c %s "$src")"; echo "address=$(scontrol show node "$n" 2>/dev/null | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')"
echo "version=$(VERSION | head -n1)"
q="--query-gpu=name,driver_version,memory.total --format=csv,noheader"
g=$( (nvidia-smi $q 2>/dev/null || echo none) | tr '\n' ';' | sed 's/;$//'); echo "gpus=$g"
a=$(printf '%s' "${g%%,*}" | tr -c 'A-Za-z0-9\n' '-' | sed 's/--*/-/g'); [ "$g" = none ] && a=cpu
echo "arch=$a"; printf '%s' "$a" > "$work/arch-$n"
if [ "$h" = "$want" ]; then ENV && echo "env=$work/environment-$n"; fi
"""


def script(runtime: Runtime, targets: list[str] | None = None) -> str:
    """The check step's shell; `targets`: the data mounts' targets, each of which must be a directory in the root the
    gates see: ch-run binds onto existing directories only, so the gate's task (runtimes.overlay_root) puts the
    .sqsh under a read-only overlayfs holding the targets as mount points; the check makes that root once."""
    env = runtime.env_command('"$use"', '"$work/environment-$n"') or "true"
    text = SCRIPT.replace("VERSION", runtime.version_command()).replace("ENV", env)
    checks = [runtime.image_command('"$w/root"', f"/bin/sh -c '[ -d {q(t)} ]'") for t in targets or []]
    if targets and all(checks):
        inner = f'rc=3; {overlay_root("$1", targets)} && {{ {" && ".join(str(c) for c in checks)}; rc=$?; }}; ' \
                f'{UNMOUNT}; exit $rc'
        text += (f'if [ "$h" = "$want" ]; then unshare --user --map-root-user --mount /bin/sh -c {q(inner)} check '
                 f'"$use" || echo "missing_mount={",".join(targets)}"; fi\n')
    return text


def local_path(pattern: str, sha256: str) -> str:
    """The node-local copy's name, `%n` left for the node's shell to expand (`$SLURMD_NODENAME`)."""
    return f"{pattern.replace('%n', '$SLURMD_NODENAME')}/{sha256}.sqsh"


@dataclass
class Node:
    name: str
    facts: dict[str, str] = field(default_factory=dict)
    step: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str | None:
        return self.facts.get("address") or None

    @property
    def runtime_version(self) -> str | None:
        return self.facts.get("version")

    def record(self) -> dict[str, Any]:
        f = self.facts
        seconds, size = float(f.get("seconds") or 0), int(f.get("size") or 0)
        return {"name": self.name, "sqsh_sha256": f.get("sha256"), "sqsh_path": f.get("path"),
                "staged": None if f.get("staged") == "shared" else f.get("staged"), "runtime_version": f.get("version"),
                "gpus": f.get("gpus"), "environment": f.get("env"), "address": f.get("address"),
                "cache_path": f"{f.get('path', '').rsplit('/', 1)[0]}/jit" if f.get("staged") not in (None, "shared")
                else None,
                "check": {"seconds": seconds, "bytes": size, "mb_per_s": round(size / 1e6 / seconds, 1) if seconds
                          else None, "step": self.step.get("JobID"), "state": self.step.get("State"),
                          "exit_code": self.step.get("ExitCode")}}


def parse(text: str, step: dict[str, str]) -> Node:
    facts = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    return Node(name=facts.get("node") or "unknown", facts=facts, step=step)


def verdict(nodes: list[Node], want: str, expected: int, rc: int, complaint: str,
            needs_env: bool) -> tuple[str | None, bool]:
    """(why no gate can run, whether that is the image's failure rather than the cluster's) or (None, False)."""
    for node in nodes:
        if node.facts.get("noexec"):
            return (f"node {node.name}: its node-local directory {node.facts['noexec']} is mounted noexec (JIT "
                    "caches there could not run)"), True
        got = node.facts.get("sha256") or ""
        staged = node.facts.get("staged") or ""
        if staged.startswith("stale:"):
            return (f"node {node.name}: its node-local copy {node.facts.get('path')} has sha256 {staged[6:22]}..., "
                    f"not the accepted {want[:16]}... (a stale or corrupt copy: removed, never mounted)"), True
        if got and got != want:
            return (f"node {node.name}: .sqsh sha256 on the node is {got[:16]}..., recorded {want[:16]}... "
                    f"({node.facts.get('path')})"), True
    if rc != 0 or len(nodes) < expected or not all(n.facts.get("sha256") for n in nodes):
        seen = ", ".join(n.name for n in nodes) or "none"
        return f"the .sqsh check step failed on the nodes (exit {rc}; answered: {seen}): {complaint or 'no output'}", False
    for node in nodes:
        if node.facts.get("missing_mount"):
            return (f"acceptance.mounts: could not make the mount points {node.facts['missing_mount']} on node "
                    f"{node.name} (ch-run binds only onto directories; the task mounts the .sqsh with squashfuse under a"
                    " read-only overlayfs in its own namespace: it needs squashfuse, /dev/fuse and Linux >= 5.11)"), False
        if needs_env and not node.facts.get("env"):
            return f"could not read the image's /etc/environment on node {node.name}", False
    return None, False
